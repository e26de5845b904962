//! How the REST client authenticates: a fixed bearer token, or OAuth machine-to-machine for a
//! service principal, whose client id and secret buy short-lived access tokens from the
//! workspace's OIDC token endpoint (`POST /oidc/v1/token`, `grant_type=client_credentials`,
//! scope `all-apis`).
//!
//! An access token is cached until `refresh_margin` before it expires, fetched by one request
//! at a time, and dropped when the service refuses it (HTTP 401), so that the next request
//! fetches a new one.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::Url;
use serde::Deserialize;

use super::error::{ApiConfigError, ApiError};
use crate::provider::Secret;

/// Where a workspace hands out OAuth tokens, below its URL.
const TOKEN_PATH: &str = "oidc/v1/token";
/// The access token is fetched again when it expires within this.
const REFRESH_MARGIN: Duration = Duration::from_secs(60);
/// The lifetime assumed when the endpoint does not say (`expires_in` missing).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);

/// A service principal's OAuth client: its id and secret.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuthClient {
    /// The client (application) id.
    pub client_id: String,
    /// The client secret (`Debug` and `Display` show `***`).
    pub client_secret: Secret,
}

/// How each request is authenticated.
#[derive(Clone)]
pub(super) enum Credentials {
    /// A fixed bearer token.
    Bearer(Secret),
    /// Access tokens from the OIDC token endpoint.
    OAuth(Arc<TokenSource>),
}

impl Credentials {
    /// The bearer token for the next request.
    pub(super) async fn token(&self) -> Result<Secret, ApiError> {
        match self {
            Credentials::Bearer(t) => Ok(t.clone()),
            Credentials::OAuth(source) => source.token().await,
        }
    }

    /// The service refused `used` (HTTP 401): forget it, so that the next call fetches a new
    /// one. Returns whether a new one can be fetched (only with OAuth).
    pub(super) fn refused(&self, used: &Secret) -> bool {
        match self {
            Credentials::Bearer(_) => false,
            Credentials::OAuth(source) => {
                source.forget(used);
                true
            }
        }
    }

    /// Every secret a server message might echo, for scrubbing.
    pub(super) fn secrets(&self) -> Vec<String> {
        match self {
            Credentials::Bearer(t) => vec![t.expose().to_string()],
            Credentials::OAuth(source) => source.secrets(),
        }
    }
}

#[derive(Clone)]
struct AccessToken {
    token: Secret,
    refresh_at: Instant,
}

/// Buys and caches access tokens for one OAuth client.
pub(super) struct TokenSource {
    url: Url,
    client: OAuthClient,
    http: reqwest::Client,
    cached: Mutex<Option<AccessToken>>,
    /// Serialises fetches: concurrent callers wait for one request instead of sending many.
    fetching: tokio::sync::Mutex<()>,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

impl TokenSource {
    /// A source for `client` at the workspace `base`.
    pub(super) fn new(
        base: &Url,
        client: OAuthClient,
        http: reqwest::Client,
    ) -> Result<Self, ApiError> {
        if client.client_id.trim().is_empty() || client.client_secret.expose().trim().is_empty() {
            return Err(ApiConfigError::IncompleteOAuthClient.into());
        }
        let url = base.join(TOKEN_PATH).map_err(ApiConfigError::TokenUrl)?;
        Ok(TokenSource {
            url,
            client,
            http,
            cached: Mutex::new(None),
            fetching: tokio::sync::Mutex::new(()),
        })
    }

    fn cached(&self) -> Option<AccessToken> {
        self.cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    async fn token(&self) -> Result<Secret, ApiError> {
        if let Some(t) = self.cached().filter(|t| Instant::now() < t.refresh_at) {
            return Ok(t.token);
        }
        let _one = self.fetching.lock().await;
        // Another caller may have fetched one while this one waited.
        if let Some(t) = self.cached().filter(|t| Instant::now() < t.refresh_at) {
            return Ok(t.token);
        }
        let fresh = self.fetch().await?;
        let token = fresh.token.clone();
        *self
            .cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(fresh);
        Ok(token)
    }

    fn forget(&self, used: &Secret) {
        let mut cached = self
            .cached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cached.as_ref().is_some_and(|t| t.token == *used) {
            *cached = None;
        }
    }

    fn secrets(&self) -> Vec<String> {
        let mut out = vec![self.client.client_secret.expose().to_string()];
        if let Some(t) = self.cached() {
            out.push(t.token.expose().to_string());
        }
        out
    }

    async fn fetch(&self) -> Result<AccessToken, ApiError> {
        let started = Instant::now();
        let answer = self
            .http
            .post(self.url.clone())
            .basic_auth(
                &self.client.client_id,
                Some(self.client.client_secret.expose()),
            )
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(reqwest::header::ACCEPT, "application/json")
            .body("grant_type=client_credentials&scope=all-apis")
            .send()
            .await
            .map_err(|e| {
                ApiError::Transport(self.scrub(&format!("the OIDC token endpoint: {e}")))
            })?;
        let status = answer.status();
        let body = answer
            .bytes()
            .await
            .map_err(|e| ApiError::Transport(self.scrub(&format!("the OIDC token answer: {e}"))))?;
        if !status.is_success() {
            return Err(self.refusal(status.as_u16(), &body));
        }
        let parsed: TokenAnswer = super::http::decode("the OIDC token endpoint", &body)?;
        if parsed.access_token.trim().is_empty() {
            return Err(ApiError::Decode {
                what: "the OIDC token endpoint".into(),
                message: "the access token is empty".into(),
            });
        }
        let lifetime = parsed
            .expires_in
            .map_or(DEFAULT_LIFETIME, Duration::from_secs);
        tracing::debug!(
            lifetime_s = lifetime.as_secs(),
            "fetched an OAuth access token"
        );
        Ok(AccessToken {
            token: Secret::new(parsed.access_token),
            refresh_at: started + lifetime.saturating_sub(REFRESH_MARGIN),
        })
    }

    /// The endpoint's refusal (`{"error": …, "error_description": …}`), typed by status.
    fn refusal(&self, status: u16, body: &[u8]) -> ApiError {
        let v: Option<serde_json::Value> = serde_json::from_slice(body).ok();
        let field = |k: &str| {
            v.as_ref()
                .and_then(|v| v.get(k))
                .and_then(serde_json::Value::as_str)
                .map(|s| self.scrub(s))
        };
        let code = field("error").unwrap_or_else(|| "UNKNOWN".into());
        let message = format!(
            "the OIDC token endpoint refused client {}: {}",
            self.client.client_id,
            field("error_description").unwrap_or_else(|| format!("HTTP {status}"))
        );
        match status {
            400 | 401 => ApiError::Unauthenticated { code, message },
            403 => ApiError::PermissionDenied { code, message },
            _ => ApiError::Http {
                status,
                code,
                message,
            },
        }
    }

    fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in self.secrets() {
            if s.len() >= 4 {
                out = out.replace(&s, "***");
            }
        }
        out
    }
}
