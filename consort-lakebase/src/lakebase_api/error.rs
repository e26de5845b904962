//! Typed errors of the Lakebase REST backend.
//!
//! Every message that came from the server has had the bearer token scrubbed out before it
//! reaches one of these values, so formatting them (`Display` or `Debug`) never leaks it.

use std::time::Duration;

/// What went wrong talking to Lakebase (or to the branch's PostgreSQL endpoint).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// A branch name was refused locally, before any request was sent.
    #[error("invalid branch name {name:?}: {reason}")]
    InvalidName {
        /// The refused name (shortened when very long).
        name: String,
        /// Why it was refused.
        reason: String,
    },
    /// The configuration is missing something or is unsafe (for example plaintext to a
    /// non-loopback host).
    #[error("lakebase configuration: {0}")]
    Config(String),
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
    #[error("branch {name} exists with source {actual:?}, expected {expected:?}")]
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
                message: crate::error::with_causes(e),
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
            ApiError::Config(m) => E::Config(m),
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
            ApiError::TtlRefused { .. } => E::Config(text),
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
                source: None,
            },
            ApiError::Postgres { code: None, .. } => E::Connect(text),
            // The name is taken by a branch of another lineage.
            ApiError::Conflict { .. } => E::AlreadyExists(text),
        }
    }
}
