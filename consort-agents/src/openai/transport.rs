//! The HTTP transport under async-openai: a bounded retry loop that honours `Retry-After`.
//!
//! async-openai's default client retries with its own layer; we install this service instead
//! (through the `middleware` feature) so the retry count, the backoff cap and the logging are
//! ours, and a test of an error path does not pay for retries it did not ask for.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use async_openai::error::OpenAIError;

use super::ApiKey;
use async_openai::middleware::HttpRequestFactory;
use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};

/// How the client retries failed HTTP calls: 429 (honouring `Retry-After`), 5xx and
/// connection errors or timeouts, with exponential backoff and a cap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpPolicy {
    /// Retries after the first request (so at most `max_retries + 1` requests). Default 3.
    pub max_retries: u32,
    /// The first backoff, doubled on each retry. Default 250 ms.
    pub initial_backoff_ms: u64,
    /// The longest wait between two requests, also for a `Retry-After`. Default 10 s.
    pub max_backoff_ms: u64,
    /// The time limit of one HTTP request. Default 300 s.
    pub request_timeout_secs: u64,
    /// The time limit for connecting. Default 10 s.
    pub connect_timeout_secs: u64,
}

impl Default for HttpPolicy {
    fn default() -> Self {
        HttpPolicy {
            max_retries: 3,
            initial_backoff_ms: 250,
            max_backoff_ms: 10_000,
            request_timeout_secs: 300,
            connect_timeout_secs: 10,
        }
    }
}

impl HttpPolicy {
    /// The wait before retry number `retry` (0-based), given the failed response's headers.
    pub fn delay(&self, retry: u32, headers: Option<&HeaderMap>) -> Duration {
        let cap = Duration::from_millis(self.max_backoff_ms);
        if let Some(d) = headers.and_then(retry_after) {
            return d.min(cap);
        }
        let factor = 1u64.checked_shl(retry.min(30)).unwrap_or(u64::MAX);
        Duration::from_millis(self.initial_backoff_ms.saturating_mul(factor)).min(cap)
    }
}

/// The delay a server asks for: `retry-after-ms` (milliseconds), or `Retry-After` as seconds or
/// an HTTP date.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = text("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = at.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(wait.to_std().unwrap_or(Duration::ZERO))
}

/// A tower service that sends requests with reqwest and retries per [`HttpPolicy`].
///
/// After the last retry it hands the failing response to async-openai, which turns it into an
/// `ApiError` carrying the status.
#[derive(Clone, Debug)]
pub struct RetryTransport {
    client: reqwest::Client,
    policy: HttpPolicy,
    /// The key scrubbed from failed responses (its `Debug` is redacted).
    secret: Option<ApiKey>,
}

impl RetryTransport {
    /// A transport over `client` with `policy`.
    pub fn new(client: reqwest::Client, policy: HttpPolicy) -> Self {
        RetryTransport {
            client,
            policy,
            secret: None,
        }
    }

    /// The same transport, scrubbing `secret` from the body of every failed response before
    /// async-openai reads (and may log) it: a server that echoes the key back cannot make it
    /// leak.
    pub fn scrubbing(mut self, secret: &ApiKey) -> Self {
        self.secret = Some(secret.clone());
        self
    }
}

/// Rebuilds a failed response with the secret replaced in its body.
async fn scrub_response(resp: reqwest::Response, secret: &ApiKey) -> reqwest::Response {
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = match resp.bytes().await {
        Ok(b) => secret.scrub(&String::from_utf8_lossy(&b)),
        Err(_) => String::new(),
    };
    let mut builder = http::Response::builder().status(status);
    for (k, v) in headers.iter() {
        if k != reqwest::header::CONTENT_LENGTH {
            builder = builder.header(k, v);
        }
    }
    match builder.body(body) {
        Ok(r) => reqwest::Response::from(r),
        Err(_) => {
            let mut r = http::Response::new(String::new());
            *r.status_mut() = status;
            reqwest::Response::from(r)
        }
    }
}

type HttpFuture = Pin<Box<dyn Future<Output = Result<reqwest::Response, OpenAIError>> + Send>>;

impl tower::Service<HttpRequestFactory> for RetryTransport {
    type Response = reqwest::Response;
    type Error = OpenAIError;
    type Future = HttpFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, factory: HttpRequestFactory) -> Self::Future {
        let client = self.client.clone();
        let policy = self.policy.clone();
        let secret = self.secret.clone();
        Box::pin(async move {
            let mut retry = 0u32;
            loop {
                let request = factory.build().await?;
                let result = client.execute(request).await;
                let retryable = match &result {
                    Ok(resp) => {
                        let s = resp.status();
                        s.as_u16() == 429 || s.is_server_error()
                    }
                    Err(e) => e.is_connect() || e.is_timeout(),
                };
                if !retryable || retry >= policy.max_retries {
                    if retryable {
                        tracing::warn!(
                            requests = retry + 1,
                            "model server still failing; giving up"
                        );
                    }
                    return match (result, secret) {
                        (Ok(resp), Some(secret)) if !resp.status().is_success() => {
                            Ok(scrub_response(resp, &secret).await)
                        }
                        (result, _) => result.map_err(OpenAIError::Reqwest),
                    };
                }
                let (delay, what) = match &result {
                    Ok(resp) => (
                        policy.delay(retry, Some(resp.headers())),
                        format!("HTTP {}", resp.status().as_u16()),
                    ),
                    Err(e) => (
                        policy.delay(retry, None),
                        if e.is_timeout() {
                            "request timed out".to_string()
                        } else {
                            "connection failed".to_string()
                        },
                    ),
                };
                let asked = match &result {
                    Ok(resp) => retry_after(resp.headers()).is_some(),
                    Err(_) => false,
                };
                tracing::warn!(
                    failure = %what,
                    retry = retry + 1,
                    max_retries = policy.max_retries,
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    retry_after = asked,
                    "model server call failed; retrying"
                );
                drop(result);
                tokio::time::sleep(delay).await;
                retry += 1;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_after_forms_are_understood() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(150)));
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO), "a date in the past");
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let p = HttpPolicy {
            initial_backoff_ms: 100,
            max_backoff_ms: 500,
            ..HttpPolicy::default()
        };
        assert_eq!(p.delay(0, None), Duration::from_millis(100));
        assert_eq!(p.delay(2, None), Duration::from_millis(400));
        assert_eq!(p.delay(3, None), Duration::from_millis(500));
        assert_eq!(p.delay(200, None), Duration::from_millis(500));
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("3600"));
        assert_eq!(p.delay(0, Some(&h)), Duration::from_millis(500));
    }
}
