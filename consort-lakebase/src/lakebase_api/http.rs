//! The HTTP plumbing every control-plane adapter shares: base URL rules, bearer auth,
//! retries on 429/503 (honouring `Retry-After`), size-capped bodies and error mapping.
//!
//! Nothing here knows Lakebase's JSON shapes; a Neon adapter can use the same client
//! (its error bodies, `{code, message}`, are understood too).

use std::net::IpAddr;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::{ApiConfigError, ApiError};
use super::oauth::{Credentials, OAuthClient, TokenSource};
use super::retry::{RetryPolicy, parse_retry_after};
use crate::provider::Secret;

/// What every request says it is: `consort/<version>`.
pub(super) const USER_AGENT: &str = concat!("consort/", env!("CARGO_PKG_VERSION"));

/// The largest response body we read (bigger answers are refused, not buffered).
const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Server messages are cut to this many characters.
const MAX_MESSAGE_CHARS: usize = 2000;

/// Whether a host name or address is the loopback interface (`localhost`, `127.0.0.0/8`,
/// `::1`).
pub(super) fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    if h.eq_ignore_ascii_case("localhost") {
        return true;
    }
    h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Parses a workspace URL (`https://adb-1.2.azuredatabricks.net`; a bare host gets
/// `https://`). Plain `http` is accepted only for loopback hosts, because the bearer token
/// travels in every request.
pub(super) fn parse_base_url(raw: &str) -> Result<Url, ApiError> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Err(ApiConfigError::EmptyHost.into());
    }
    let with_scheme = if raw.contains("://") {
        raw.to_string()
    } else {
        format!("https://{raw}")
    };
    let url = Url::parse(&with_scheme).map_err(|source| ApiConfigError::HostNotUrl {
        host: raw.to_string(),
        source,
    })?;
    let host = url.host_str().ok_or_else(|| ApiConfigError::NoHost {
        host: raw.to_string(),
    })?;
    match url.scheme() {
        "https" => {}
        "http" if is_loopback_host(host) => {}
        "http" => {
            return Err(ApiConfigError::PlainHttp {
                host: host.to_string(),
            }
            .into());
        }
        other => {
            return Err(ApiConfigError::Scheme {
                scheme: other.to_string(),
            }
            .into());
        }
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ApiConfigError::CredentialsInUrl.into());
    }
    Ok(url)
}

/// An error answer as it came off the wire, before classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct WireError {
    /// HTTP status.
    pub status: u16,
    /// `error_code` (Databricks) or `code` (Neon), or `UNKNOWN`.
    pub code: String,
    /// The message (scrubbed, capped).
    pub message: String,
}

impl WireError {
    /// Whether the request should be sent again: 429 and 503, unless the code says the
    /// quota is gone for good.
    pub(super) fn is_retryable(&self) -> bool {
        matches!(self.status, 429 | 503)
            && !matches!(
                self.code.as_str(),
                "QUOTA_EXCEEDED" | "RESOURCE_LIMIT_EXCEEDED"
            )
    }
}

/// Maps a service error code to its typed error, when the code is one we know.
/// Google-style numeric codes (from long-running operations) are understood too.
pub(super) fn classify_code(code: &str, message: &str) -> Option<ApiError> {
    let c = || code.to_string();
    let m = || message.to_string();
    Some(match code {
        "QUOTA_EXCEEDED"
        | "RESOURCE_LIMIT_EXCEEDED"
        | "RESOURCE_EXHAUSTED"
        | "REQUEST_LIMIT_EXCEEDED"
        | "8" => ApiError::Quota {
            code: c(),
            message: m(),
        },
        "PERMISSION_DENIED" | "7" => ApiError::PermissionDenied {
            code: c(),
            message: m(),
        },
        "UNAUTHENTICATED" | "16" => ApiError::Unauthenticated {
            code: c(),
            message: m(),
        },
        "NOT_FOUND" | "RESOURCE_DOES_NOT_EXIST" | "5" => ApiError::NotFound {
            code: c(),
            message: m(),
        },
        "ALREADY_EXISTS" | "RESOURCE_ALREADY_EXISTS" | "6" => ApiError::AlreadyExists {
            code: c(),
            message: m(),
        },
        "INVALID_PARAMETER_VALUE"
        | "INVALID_ARGUMENT"
        | "BAD_REQUEST"
        | "MALFORMED_REQUEST"
        | "3" => ApiError::InvalidRequest {
            code: c(),
            message: m(),
        },
        _ => return None,
    })
}

/// The typed error for a final (not retried) error answer: by code first, then by status.
pub(super) fn classify(wire: WireError) -> ApiError {
    if let Some(e) = classify_code(&wire.code, &wire.message) {
        return e;
    }
    let WireError {
        status,
        code,
        message,
    } = wire;
    match status {
        400 => ApiError::InvalidRequest { code, message },
        401 => ApiError::Unauthenticated { code, message },
        403 => ApiError::PermissionDenied { code, message },
        404 => ApiError::NotFound { code, message },
        409 => ApiError::AlreadyExists { code, message },
        _ => ApiError::Http {
            status,
            code,
            message,
        },
    }
}

/// A JSON REST client for one control plane: base URL, credentials (a bearer token, or an
/// OAuth client that buys access tokens), retry policy.
///
/// The token is sent as a sensitive header on each request (never as a default header, so
/// it is not part of the `reqwest::Client`'s `Debug`), and every secret is scrubbed from every
/// server message before that message becomes an error. A request refused with HTTP 401
/// under OAuth is sent once more with a freshly fetched token.
#[derive(Clone)]
pub struct RestClient {
    http: reqwest::Client,
    base: Url,
    auth: Credentials,
    retry: RetryPolicy,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl std::fmt::Debug for RestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestClient")
            .field("base", &self.base.as_str())
            .field(
                "auth",
                &match &self.auth {
                    Credentials::Bearer(_) => "bearer ***",
                    Credentials::OAuth(_) => "oauth ***",
                },
            )
            .field("retry", &self.retry)
            .finish()
    }
}

impl RestClient {
    /// A client for `base_url` (an `https://` URL; plain `http://` only on a loopback host) with a per-request timeout.
    pub fn new(
        base_url: &str,
        token: Secret,
        retry: RetryPolicy,
        timeout: Duration,
    ) -> Result<Self, ApiError> {
        if token.expose().trim().is_empty() {
            return Err(ApiConfigError::EmptyToken.into());
        }
        let (base, http) = Self::parts(base_url, timeout)?;
        Ok(Self::assemble(
            base,
            http,
            Credentials::Bearer(token),
            retry,
        ))
    }

    /// A client for `base_url` that authenticates as the OAuth `client` (a service
    /// principal): access tokens come from the workspace's OIDC token endpoint.
    pub fn with_oauth(
        base_url: &str,
        client: OAuthClient,
        retry: RetryPolicy,
        timeout: Duration,
    ) -> Result<Self, ApiError> {
        let (base, http) = Self::parts(base_url, timeout)?;
        let source = TokenSource::new(&base, client, http.clone())?;
        Ok(Self::assemble(
            base,
            http,
            Credentials::OAuth(std::sync::Arc::new(source)),
            retry,
        ))
    }

    fn parts(base_url: &str, timeout: Duration) -> Result<(Url, reqwest::Client), ApiError> {
        let base = parse_base_url(base_url)?;
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(30)))
            .user_agent(USER_AGENT)
            .build()
            .map_err(ApiConfigError::HttpClient)?;
        Ok((base, http))
    }

    fn assemble(base: Url, http: reqwest::Client, auth: Credentials, retry: RetryPolicy) -> Self {
        RestClient {
            http,
            base,
            auth,
            retry: RetryPolicy {
                max_attempts: retry.max_attempts.max(1),
                ..retry
            },
            headers: Vec::new(),
        }
    }

    /// Adds a header sent with every request (e.g. `X-Databricks-Workspace-Id`).
    pub fn with_header(mut self, name: &'static str, value: &str) -> Result<Self, ApiError> {
        let v = HeaderValue::from_str(value)
            .map_err(|source| ApiConfigError::HeaderValue { name, source })?;
        self.headers.push((HeaderName::from_static(name), v));
        Ok(self)
    }

    /// The base URL.
    pub fn base(&self) -> &Url {
        &self.base
    }

    /// The URL of `segments` below the base path; each segment is percent-encoded, so a
    /// segment can never add path levels or a query.
    pub fn url<S: AsRef<str>>(&self, segments: &[S]) -> Result<Url, ApiError> {
        let mut url = self.base.clone();
        url.set_query(None);
        url.set_fragment(None);
        {
            let mut path = url
                .path_segments_mut()
                .map_err(|()| ApiConfigError::NotABase)?;
            path.pop_if_empty();
            for s in segments {
                path.push(s.as_ref());
            }
        }
        Ok(url)
    }

    /// Replaces every secret (the token, an OAuth client's secret and access token) wherever
    /// a server echoed it.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for secret in self.auth.secrets() {
            if secret.len() >= 4 {
                out = out.replace(&secret, "***");
            }
        }
        out.chars().take(MAX_MESSAGE_CHARS).collect()
    }

    /// Sends a request (retrying 429/503 and connection failures per the policy) and decodes
    /// the JSON answer. `what` names the call in errors and logs.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: Option<&Value>,
        what: &str,
    ) -> Result<T, ApiError> {
        let bytes = self.send(method, url, body, what).await?;
        decode(what, &bytes)
    }

    /// Like [`RestClient::call`] but returns the raw body.
    pub async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<&Value>,
        what: &str,
    ) -> Result<Vec<u8>, ApiError> {
        let max = self.retry.max_attempts;
        let mut attempt: u32 = 0;
        let mut token_refetched = false;
        loop {
            attempt += 1;
            let token = self.auth.token().await?;
            let (failure, retry_after) = match self.send_once(&method, &url, body, &token).await {
                Ok(Outcome::Success(bytes)) => return Ok(bytes),
                Ok(Outcome::Failure(wire, _))
                    if wire.status == 401 && !token_refetched && self.auth.refused(&token) =>
                {
                    // An access token the service no longer takes: one more try with a new one.
                    tracing::info!(
                        call = what,
                        "the access token was refused; fetching a new one"
                    );
                    token_refetched = true;
                    attempt -= 1;
                    continue;
                }
                Ok(Outcome::Failure(wire, retry_after)) => {
                    if !wire.is_retryable() {
                        tracing::debug!(call = what, status = wire.status, code = %wire.code, "request failed");
                        return Err(classify(wire));
                    }
                    (Failure::Http(wire), retry_after)
                }
                Err(transport) => (Failure::Transport(transport), None),
            };
            if attempt >= max {
                tracing::warn!(
                    call = what,
                    attempts = attempt,
                    "giving up: {}",
                    failure.text()
                );
                return Err(match failure {
                    Failure::Transport(m) if attempt == 1 => ApiError::Transport(m),
                    Failure::Transport(m) => ApiError::RetriesExhausted {
                        attempts: attempt,
                        status: None,
                        code: None,
                        message: m,
                    },
                    Failure::Http(w) => ApiError::RetriesExhausted {
                        attempts: attempt,
                        status: Some(w.status),
                        message: format!("HTTP {} ({}): {}", w.status, w.code, w.message),
                        code: Some(w.code),
                    },
                });
            }
            let wait = self.retry.delay(attempt - 1, retry_after);
            tracing::info!(
                call = what,
                attempt,
                wait_ms = wait.as_millis() as u64,
                "retrying: {}",
                failure.text()
            );
            tokio::time::sleep(wait).await;
        }
    }

    async fn send_once(
        &self,
        method: &Method,
        url: &Url,
        body: Option<&Value>,
        token: &Secret,
    ) -> Result<Outcome, String> {
        let mut req = self
            .http
            .request(method.clone(), url.clone())
            .bearer_auth(token.expose())
            .header(reqwest::header::ACCEPT, "application/json");
        for (k, v) in &self.headers {
            req = req.header(k.clone(), v.clone());
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| self.scrub(&format!("{method} {}: {e}", url.path())))?;
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let mut bytes = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if bytes.len() + chunk.len() > MAX_BODY_BYTES {
                        return Ok(Outcome::Failure(
                            WireError {
                                status: status.as_u16(),
                                code: "BODY_TOO_LARGE".into(),
                                message: format!("answer larger than {MAX_BODY_BYTES} bytes"),
                            },
                            None,
                        ));
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => return Err(self.scrub(&format!("reading the answer: {e}"))),
            }
        }
        if status.is_success() {
            return Ok(Outcome::Success(bytes));
        }
        Ok(Outcome::Failure(
            self.wire_error(status, &bytes),
            retry_after,
        ))
    }

    fn wire_error(&self, status: StatusCode, bytes: &[u8]) -> WireError {
        let parsed: Option<Value> = serde_json::from_slice(bytes).ok();
        let field = |name: &str| {
            parsed
                .as_ref()
                .and_then(|v| v.get(name))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let code = field("error_code")
            .or_else(|| field("code"))
            .unwrap_or_else(|| "UNKNOWN".to_string());
        let message = field("message").unwrap_or_else(|| {
            let text = String::from_utf8_lossy(bytes);
            if text.trim().is_empty() {
                status.canonical_reason().unwrap_or("").to_string()
            } else {
                text.into_owned()
            }
        });
        WireError {
            status: status.as_u16(),
            code: self.scrub(&code).chars().take(100).collect(),
            message: self.scrub(&message),
        }
    }
}

enum Failure {
    Http(WireError),
    Transport(String),
}

impl Failure {
    fn text(&self) -> String {
        match self {
            Failure::Http(w) => format!("HTTP {} ({}): {}", w.status, w.code, w.message),
            Failure::Transport(m) => m.clone(),
        }
    }
}

enum Outcome {
    Success(Vec<u8>),
    Failure(WireError, Option<std::time::Duration>),
}

/// Decodes a JSON answer. The error names the position and kind only, never the input
/// text (an answer may hold a secret, such as a database token).
pub(super) fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| ApiError::Decode {
        what: what.to_string(),
        message: format!(
            "{} error at line {} column {}",
            match e.classify() {
                serde_json::error::Category::Io => "I/O",
                serde_json::error::Category::Syntax => "syntax",
                serde_json::error::Category::Data => "data",
                serde_json::error::Category::Eof => "end-of-input",
            },
            e.line(),
            e.column()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_need_https_unless_loopback() {
        assert_eq!(
            parse_base_url("adb-1.azuredatabricks.net")
                .map(|u| u.to_string())
                .ok(),
            Some("https://adb-1.azuredatabricks.net/".to_string())
        );
        assert!(parse_base_url("http://127.0.0.1:8080").is_ok());
        assert!(parse_base_url("http://localhost:8080").is_ok());
        assert!(parse_base_url("http://[::1]:8080").is_ok());
        assert!(matches!(
            parse_base_url("http://example.com"),
            Err(ApiError::Config(_))
        ));
        assert!(matches!(
            parse_base_url("ftp://x"),
            Err(ApiError::Config(_))
        ));
        assert!(matches!(
            parse_base_url("https://u:p@x.com"),
            Err(ApiError::Config(_))
        ));
        assert!(matches!(parse_base_url(""), Err(ApiError::Config(_))));
    }

    #[test]
    fn loopback_detection() {
        for host in ["127.0.0.1", "127.8.0.1", "::1", "LOCALHOST"] {
            assert!(is_loopback_host(host), "{host} is this machine");
        }
        for host in [
            "10.0.0.1",
            "ep-x.database.cloud.databricks.com",
            "localhost.evil.com",
        ] {
            assert!(!is_loopback_host(host), "{host} is not this machine");
        }
    }

    #[test]
    fn classification_by_code_then_status() {
        let w = |status, code: &str| WireError {
            status,
            code: code.into(),
            message: "m".into(),
        };
        // Status, code, the variant expected and a check for it.
        type Case = (u16, &'static str, &'static str, fn(&ApiError) -> bool);
        let cases: [Case; 6] = [
            (400, "QUOTA_EXCEEDED", "Quota", |e| {
                matches!(e, ApiError::Quota { .. })
            }),
            (400, "RESOURCE_EXHAUSTED", "Quota", |e| {
                matches!(e, ApiError::Quota { .. })
            }),
            (403, "UNKNOWN", "PermissionDenied", |e| {
                matches!(e, ApiError::PermissionDenied { .. })
            }),
            (400, "INVALID_PARAMETER_VALUE", "InvalidRequest", |e| {
                matches!(e, ApiError::InvalidRequest { .. })
            }),
            (404, "X", "NotFound", |e| {
                matches!(e, ApiError::NotFound { .. })
            }),
            (500, "INTERNAL_ERROR", "Http 500", |e| {
                matches!(e, ApiError::Http { status: 500, .. })
            }),
        ];
        for (status, code, want, is) in cases {
            let got = classify(w(status, code));
            assert!(is(&got), "{status} {code}: expected {want}, got {got}");
        }
        assert!(w(429, "RESOURCE_EXHAUSTED").is_retryable());
        assert!(w(503, "TEMPORARILY_UNAVAILABLE").is_retryable());
        assert!(!w(429, "QUOTA_EXCEEDED").is_retryable());
        assert!(!w(500, "INTERNAL_ERROR").is_retryable());
    }

    #[test]
    fn decode_errors_do_not_quote_the_input() {
        let r: Result<std::collections::BTreeMap<String, u32>, _> =
            decode("credential", br#"{"token": "supersecret-value"}"#);
        let e = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("credential"), "{e}");
        assert!(!e.contains("supersecret"), "{e}");
    }
}
