//! Typed errors of the Lakebase REST backend.
//!
//! Every message that came from the server has had the bearer token scrubbed out before it
//! reaches one of these values, so formatting them (`Display` or `Debug`) never leaks it.

use std::time::Duration;

/// What went wrong talking to Lakebase (or to the branch's PostgreSQL endpoint).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// A branch name was refused locally, before any request was sent.
    #[error("invalid branch name `{name}`: {reason}")]
    InvalidName {
        /// The refused name (shortened when very long).
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// The configuration is missing something or is unsafe (for example plaintext to a
    /// non-loopback host); what, and the error underneath as its source, in the
    /// [`ApiConfigError`].
    #[error(transparent)]
    Config(#[from] ApiConfigError),
    /// The service refused the request for lack of quota (`QUOTA_EXCEEDED`,
    /// `RESOURCE_LIMIT_EXCEEDED`, or `RESOURCE_EXHAUSTED` when it is not a rate limit).
    #[error("quota exceeded ({code}): {message}")]
    Quota {
        /// The service's error code.
        code: String,
        /// The service's message.
        message: String,
    },
    /// The caller may not do this (`PERMISSION_DENIED`, HTTP 403).
    #[error("permission denied ({code}): {message}")]
    PermissionDenied {
        /// The service's error code.
        code: String,
        /// The service's message.
        message: String,
    },
    /// The token was refused (HTTP 401).
    #[error("not authenticated ({code}): {message}")]
    Unauthenticated {
        /// The service's error code.
        code: String,
        /// The service's message.
        message: String,
    },
    /// The resource does not exist (`NOT_FOUND`, `RESOURCE_DOES_NOT_EXIST`, HTTP 404).
    #[error("not found ({code}): {message}")]
    NotFound {
        /// The service's error code.
        code: String,
        /// The service's message.
        message: String,
    },
    /// The resource exists already (`ALREADY_EXISTS`, `RESOURCE_ALREADY_EXISTS`, HTTP 409).
    #[error("already exists ({code}): {message}")]
    AlreadyExists {
        /// The service's error code.
        code: String,
        /// The service's message.
        message: String,
    },
    /// A branch of this name exists but was forked from another source, so it is not ours to
    /// reuse.
    #[error(
        "branch {name} exists with source {}, expected `{expected}`",
        actual.as_deref().map_or_else(|| "none".to_string(), |a| format!("`{a}`"))
    )]
    Conflict {
        /// The branch id.
        name: String,
        /// The source we asked for.
        expected: String,
        /// The source it has.
        actual: Option<String>,
    },
    /// The service refused a branch's expiry: the TTL is longer than the workspace allows.
    #[error(
        "the branch TTL of {} is refused by the service ({code}: {message}); lower [database] ttl_secs",
        crate::error::duration_text(*ttl)
    )]
    TtlRefused {
        /// The TTL asked for.
        ttl: Duration,
        /// The service's error code.
        code: String,
        /// The service's message.
        message: String,
    },
    /// The service refused a branch's spec for another reason than its name or TTL.
    #[error("branch {name}: the service refused its spec ({code}): {message}")]
    SpecRefused {
        /// The branch id.
        name: String,
        /// The service's error code.
        code: String,
        /// The service's message.
        message: String,
    },
    /// The service rejected a parameter (`INVALID_PARAMETER_VALUE`, `BAD_REQUEST`, HTTP 400).
    #[error("invalid request ({code}): {message}")]
    InvalidRequest {
        /// The service's error code.
        code: String,
        /// The service's message.
        message: String,
    },
    /// A retryable failure (HTTP 429/503, or the connection failed) persisted through every
    /// attempt.
    #[error("gave up after {attempts} attempts: {message}")]
    RetriesExhausted {
        /// How many requests were sent.
        attempts: u32,
        /// The last HTTP status (`None` when the last failure was a transport error).
        status: Option<u16>,
        /// The last error code, when the server sent one.
        code: Option<String>,
        /// The last failure.
        message: String,
    },
    /// A long-running operation finished with an error.
    #[error("operation {operation} failed ({code}): {message}")]
    OperationFailed {
        /// The operation's name.
        operation: String,
        /// The error code it reported.
        code: String,
        /// The error message it reported.
        message: String,
    },
    /// A long-running operation was not done within the polling budget.
    #[error("operation {operation} not done after {}", crate::error::duration_text(*waited))]
    OperationTimeout {
        /// The operation's name.
        operation: String,
        /// How long we polled.
        waited: Duration,
    },
    /// Any other HTTP error answer.
    #[error("HTTP {status} ({code}): {message}")]
    Http {
        /// The status code.
        status: u16,
        /// The service's error code, or `UNKNOWN`.
        code: String,
        /// The service's message (capped).
        message: String,
    },
    /// The request could not be sent or the answer not read.
    #[error("transport error: {0}")]
    Transport(String),
    /// The answer was not what the documented API returns.
    #[error("unexpected answer from {what}: {message}")]
    Decode {
        /// Which call.
        what: String,
        /// What was wrong.
        message: String,
    },
    /// The branch's endpoint is missing or has no host.
    #[error("endpoint of branch {branch}: {message}")]
    Endpoint {
        /// The branch id.
        branch: String,
        /// What is wrong.
        message: String,
    },
    /// A new branch did not accept logins within the budget (the "External authorization
    /// failed" window did not close).
    #[error(
        "branch {branch} did not accept logins within {}: {last_error}",
        crate::error::duration_text(*waited)
    )]
    AuthNotReady {
        /// The branch id.
        branch: String,
        /// How long we tried.
        waited: Duration,
        /// The last connection error.
        last_error: String,
    },
    /// A PostgreSQL error while connecting, probing or building a base, with the server's
    /// words.
    #[error("postgres ({context}): {message}{}{}{}",
        code.as_ref().map(|c| format!(" (SQLSTATE {c})")).unwrap_or_default(),
        detail.as_ref().map(|d| format!("; detail: {d}")).unwrap_or_default(),
        hint.as_ref().map(|h| format!("; hint: {h}")).unwrap_or_default())]
    Postgres {
        /// What we were doing.
        context: String,
        /// The SQLSTATE, when the server sent one.
        code: Option<String>,
        /// The server's message (or, without one, the driver's, with its causes).
        message: String,
        /// The server's detail, when it sent one.
        detail: Option<String>,
        /// The server's hint, when it sent one.
        hint: Option<String>,
    },
    /// The TLS connection to a branch's endpoint failed (certificate, host name, protocol):
    /// not a login window, so not retried.
    #[error("TLS to {host}: {message}")]
    Tls {
        /// The endpoint host.
        host: String,
        /// What failed.
        message: String,
    },
}

/// The URL parser's error (the `url` crate's, which `reqwest` uses).
pub type UrlParseError = <reqwest::Url as std::str::FromStr>::Err;

/// Why the Lakebase backend's configuration is missing something or is unsafe (see
/// [`ApiError::Config`]). No variant holds the token, the client secret or a database
/// credential.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiConfigError {
    /// A required environment variable is not set (or is empty).
    #[error("lakebase configuration: {var} is not set")]
    EnvUnset {
        /// The variable.
        var: &'static str,
    },
    /// Only one of a service principal's client id and client secret is set.
    #[error(
        "lakebase configuration: set both {} and {} for a service principal, or neither",
        super::provider::ENV_CLIENT_ID,
        super::provider::ENV_CLIENT_SECRET
    )]
    HalfServicePrincipal,
    /// Neither a token nor a service principal is set.
    #[error(
        "lakebase configuration: {} is not set (nor {} and {} for a service principal)",
        super::provider::ENV_TOKEN,
        super::provider::ENV_CLIENT_ID,
        super::provider::ENV_CLIENT_SECRET
    )]
    NoCredentials,
    /// A setting breaks its rule.
    #[error("lakebase configuration: {setting} {rule}")]
    Setting {
        /// The setting (`max_live_branches`, `the owner prefix`, …).
        setting: &'static str,
        /// The rule it breaks (`must be at least 2 (a base and one branch)`, …).
        rule: &'static str,
    },
    /// An id used as one path segment (project, endpoint) is not a valid resource id.
    #[error(
        "lakebase configuration: {kind} id \"{value}\" is not a valid resource id ([a-z0-9-], 1-63 characters)"
    )]
    InvalidId {
        /// What the id names (`project`, `endpoint`).
        kind: &'static str,
        /// The id (at most its first 80 characters).
        value: String,
    },
    /// No source branch is configured and the project has no default branch.
    #[error(
        "lakebase configuration: project {project} reports no default branch; set source_branch"
    )]
    NoDefaultBranch {
        /// The project id.
        project: String,
    },
    /// Plaintext to loopback hosts is allowed, but a branch's endpoint host is not loopback.
    #[error(
        "lakebase configuration: allow_plaintext_loopback is set but endpoint host {host} is not loopback; refusing to connect without TLS"
    )]
    PlaintextToRemoteEndpoint {
        /// The endpoint host.
        host: String,
    },
    /// A plaintext connection to a host that is not loopback was asked for.
    #[error(
        "lakebase configuration: refusing a plaintext connection to {host}: only loopback hosts may skip TLS"
    )]
    PlaintextConnection {
        /// The host.
        host: String,
    },
    /// The CA file (`ca_file`) cannot be used.
    #[error(transparent)]
    CaFile(#[from] crate::error::CaFileError),
    /// A request body could not be encoded.
    #[error("lakebase configuration: cannot encode the {what}")]
    Encode {
        /// Which body.
        what: &'static str,
        /// The encoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// The workspace host is empty.
    #[error("lakebase configuration: the workspace host is empty")]
    EmptyHost,
    /// The workspace host is not a URL.
    #[error("lakebase configuration: workspace host \"{host}\" is not a URL")]
    HostNotUrl {
        /// The host as configured.
        host: String,
        /// The URL parser's error.
        #[source]
        source: UrlParseError,
    },
    /// The workspace URL names no host.
    #[error("lakebase configuration: workspace host \"{host}\" has no host")]
    NoHost {
        /// The host as configured.
        host: String,
    },
    /// Plain `http` to a host that is not loopback: the bearer token would travel unencrypted.
    #[error(
        "lakebase configuration: refusing plain http to {host}: the bearer token would travel unencrypted (use https)"
    )]
    PlainHttp {
        /// The host.
        host: String,
    },
    /// The workspace URL's scheme is neither `https` nor `http`.
    #[error("lakebase configuration: workspace URL scheme \"{scheme}\" is not http(s)")]
    Scheme {
        /// The scheme.
        scheme: String,
    },
    /// The workspace URL carries a user name or password.
    #[error("lakebase configuration: the workspace URL must not carry credentials")]
    CredentialsInUrl,
    /// The workspace URL cannot be the base of other URLs.
    #[error("lakebase configuration: the workspace URL cannot be a base")]
    NotABase,
    /// The API token is empty.
    #[error("lakebase configuration: the API token is empty")]
    EmptyToken,
    /// An OAuth client lacks its client id or its client secret.
    #[error("lakebase configuration: an OAuth client needs a client id and a client secret")]
    IncompleteOAuthClient,
    /// The OIDC token URL cannot be made from the workspace URL.
    #[error("lakebase configuration: cannot make the OIDC token URL")]
    TokenUrl(#[source] UrlParseError),
    /// The HTTP client could not be built.
    #[error("lakebase configuration: cannot build the HTTP client")]
    HttpClient(#[source] reqwest::Error),
    /// A header sent with every request has a value HTTP does not allow.
    #[error("lakebase configuration: header {name} has an invalid value")]
    HeaderValue {
        /// The header's name.
        name: &'static str,
        /// Why the value is refused.
        #[source]
        source: reqwest::header::InvalidHeaderValue,
    },
}

impl ApiError {
    /// Whether this is a "not found" answer (deletes treat it as success).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ApiError::NotFound { .. })
    }

    /// Whether this is an "already exists" answer.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, ApiError::AlreadyExists { .. })
    }
}

impl ApiError {
    /// A PostgreSQL error with what we were doing: the SQLSTATE, message, detail and hint the
    /// server sent, or the driver's message with its causes.
    pub fn postgres(context: impl Into<String>, e: &tokio_postgres::Error) -> Self {
        let context = context.into();
        match e.as_db_error() {
            Some(db) => ApiError::Postgres {
                context,
                code: Some(db.code().code().to_string()),
                message: db.message().to_string(),
                detail: db.detail().map(str::to_string),
                hint: db.hint().map(str::to_string),
            },
            None => ApiError::Postgres {
                context,
                code: None,
                message: consort_actors::error_chain(e),
                detail: None,
                hint: None,
            },
        }
    }
}

/// The crate-wide error for a REST-backend error: quota, permission, names, not-found,
/// operation failures and timeouts keep their class, so pool and actor code can treat every
/// backend alike.
impl From<ApiError> for crate::error::Error {
    fn from(e: ApiError) -> Self {
        use crate::error::Error as E;
        let text = e.to_string();
        match e {
            ApiError::InvalidName { .. } => E::InvalidName(text),
            // The setting is the configuration's fault, whatever the service said.
            ApiError::Config(_) | ApiError::TtlRefused { .. } => {
                E::Misconfigured(crate::error::ConfigError::Lakebase(Box::new(e)))
            }
            ApiError::Quota { .. } => E::QuotaExceeded(text),
            ApiError::PermissionDenied { .. } | ApiError::Unauthenticated { .. } => {
                E::PermissionDenied(text)
            }
            ApiError::NotFound { .. } => E::NotFound(text),
            ApiError::AlreadyExists { code, message } => E::Http {
                status: 409,
                code: Some(code),
                detail: message,
            },
            ApiError::InvalidRequest { code, message }
            | ApiError::SpecRefused { code, message, .. } => E::Http {
                status: 400,
                code: Some(code),
                detail: message,
            },
            ApiError::Tls { .. } => E::Connect(text),
            ApiError::Http {
                status,
                code,
                message,
            } => E::Http {
                status,
                code: Some(code),
                detail: message,
            },
            ApiError::RetriesExhausted {
                status: Some(status),
                code,
                ..
            } => E::Http {
                status,
                code,
                detail: text,
            },
            ApiError::RetriesExhausted { status: None, .. }
            | ApiError::Transport(_)
            | ApiError::Decode { .. } => E::Transport(text),
            ApiError::OperationFailed { .. } => E::OperationFailed(text),
            ApiError::OperationTimeout { .. } => E::Timeout(text),
            ApiError::Endpoint { .. } | ApiError::AuthNotReady { .. } => E::Connect(text),
            ApiError::Postgres {
                context,
                code: Some(code),
                message,
                detail,
                hint,
            } => E::Database {
                context,
                code: tokio_postgres::error::SqlState::from_code(&code),
                server: Box::new(crate::error::ServerText {
                    message,
                    detail,
                    hint,
                }),
                driver: None,
            },
            ApiError::Postgres { code: None, .. } => E::Connect(text),
            // The name is taken by a branch of another lineage.
            ApiError::Conflict { .. } => E::AlreadyExists(text),
        }
    }
}
