//! The crate's error type.
//!
//! One `#[non_exhaustive]` enum for every backend, runner and the actor. No variant ever holds a
//! password, token or connection string with a secret: callers build the texts from redacted
//! parts.

use consort_actors::InfraFault;

/// Everything that can go wrong on the database side. Test failures are not errors: they are
/// outcomes in a receipt.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An HTTP API (Lakebase, Neon) answered with an error status.
    #[error("HTTP {status}{}: {detail}", code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default())]
    Http {
        /// The HTTP status.
        status: u16,
        /// The API's error code (`RESOURCE_EXHAUSTED`, …), when it gave one.
        code: Option<String>,
        /// The API's message.
        detail: String,
    },
    /// A quota or branch limit is exhausted (permanent until something is deleted).
    #[error("quota exceeded: {0}")]
    QuotaExceeded(String),
    /// The credentials lack a permission.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// A branch or database name breaks the naming rules.
    #[error("invalid name: {0}")]
    InvalidName(String),
    /// The thing asked for does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// Something with this name already exists (a branch name in use).
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// An operation did not finish in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A long-running backend operation ended in failure.
    #[error("operation failed: {0}")]
    OperationFailed(String),
    /// A transport problem talking to an API (connection refused, TLS, bad response body).
    #[error("transport: {0}")]
    Transport(String),
    /// The configuration is unusable (bad URL, bad glob, missing setting).
    #[error("configuration: {0}")]
    Config(String),
    /// No PostgreSQL server binaries were found.
    #[error(
        "no PostgreSQL server binaries found ({0}); install them, e.g. `apt-get install postgresql`, or set the binary directory"
    )]
    BinariesNotFound(String),
    /// The embedded cluster could not be created, started or stopped.
    #[error("embedded PostgreSQL: {0}")]
    Cluster(String),
    /// The database cannot be reached (down, refused, authentication failed).
    #[error("cannot connect to the database: {0}")]
    Connect(String),
    /// A statement failed on the server.
    #[error("database error while {context}: {detail}{}", code.as_deref().map(|c| format!(" (SQLSTATE {c})")).unwrap_or_default())]
    Database {
        /// What was being done.
        context: String,
        /// The SQLSTATE, when the server sent one.
        code: Option<String>,
        /// The server's message.
        detail: String,
    },
    /// A migration's SQL failed; the migration's transaction was rolled back.
    #[error("migration {version} failed: {detail}")]
    Migration {
        /// The migration version.
        version: String,
        /// The server's message.
        detail: String,
    },
    /// A migration version is already recorded with another checksum.
    #[error("migration {version} is recorded with checksum {recorded} but the plan has {planned}")]
    ChecksumMismatch {
        /// The migration version.
        version: String,
        /// The checksum recorded in `consort_migrations`.
        recorded: String,
        /// The checksum of the planned migration.
        planned: String,
    },
    /// A template database stayed busy (SQLSTATE 55006) through all retries.
    #[error("template database busy: {0}")]
    TemplateBusy(String),
    /// A test runner could not be started or broke down (not a failing test).
    #[error("test runner: {0}")]
    Runner(String),
    /// A file-system or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, and on which path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The backend does not support this operation.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Maps a `tokio_postgres` error: server errors keep their SQLSTATE and message, anything
    /// else (closed connection, refused, authentication) becomes [`Error::Connect`].
    pub fn from_pg(context: impl Into<String>, e: &tokio_postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) => Error::Database {
                context: context.into(),
                code: Some(db.code().code().to_string()),
                detail: db.message().to_string(),
            },
            None => Error::Connect(format!("{}: {e}", context.into())),
        }
    }

    /// The SQLSTATE of a [`Error::Database`] error.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::Database { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    /// Whether retrying the same call later may succeed (rate limits, busy templates,
    /// transient transport failures).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Http { status, .. } => matches!(status, 429 | 502 | 503 | 504),
            Error::Transport(_) | Error::TemplateBusy(_) | Error::Timeout(_) => true,
            Error::Database { code, .. } => code.as_deref() == Some("55006"),
            _ => false,
        }
    }

    /// The infrastructure fault this error means when it stops a verification.
    pub fn infra_fault(&self) -> InfraFault {
        match self {
            Error::Runner(_) => InfraFault::RunnerFailed,
            Error::Timeout(_) => InfraFault::Timeout,
            Error::Io { .. } => InfraFault::WorkTreeIo,
            _ => InfraFault::DatabaseDown,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_codes_and_retry_classes() {
        let e = Error::Http {
            status: 429,
            code: Some("REQUEST_LIMIT_EXCEEDED".into()),
            detail: "slow down".into(),
        };
        assert_eq!(
            e.to_string(),
            "HTTP 429 (REQUEST_LIMIT_EXCEEDED): slow down"
        );
        assert!(e.is_retryable());
        assert!(!Error::QuotaExceeded("10 branches".into()).is_retryable());
        let busy = Error::Database {
            context: "create".into(),
            code: Some("55006".into()),
            detail: "source database is being accessed".into(),
        };
        assert!(busy.is_retryable());
        assert_eq!(busy.sqlstate(), Some("55006"));
        assert_eq!(
            Error::Runner("no psql".into()).infra_fault(),
            InfraFault::RunnerFailed
        );
        assert_eq!(
            Error::Connect("refused".into()).infra_fault(),
            InfraFault::DatabaseDown
        );
    }
}
