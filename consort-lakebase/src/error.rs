//! The crate's error type.
//!
//! One `#[non_exhaustive]` enum for every backend, runner and the actor. No variant ever holds a
//! password, token or connection string with a secret: callers build the texts from redacted
//! parts.

use consort_actors::InfraFault;
use tokio_postgres::error::{DbError, SqlState};

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
    /// The driver lost or could not open its connection (refused, closed, authentication,
    /// TLS); the server's message, detail and hint are in the text when it sent them.
    #[error("database connection failed while {context}: {}", pg_text(source))]
    Connection {
        /// What was being done (and on which server, never with a password).
        context: String,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A statement failed on the server.
    #[error("database error while {context}: {server} (SQLSTATE {})", code.code())]
    Database {
        /// What was being done.
        context: String,
        /// The SQLSTATE the server sent.
        code: SqlState,
        /// The server's message, detail and hint.
        server: Box<ServerText>,
        /// The driver's error (absent when the error came through an HTTP API).
        #[source]
        source: Option<tokio_postgres::Error>,
    },
    /// A migration's SQL failed; the migration's transaction was rolled back.
    #[error("migration {version} failed: {detail}")]
    Migration {
        /// The migration version.
        version: String,
        /// The server's message.
        detail: String,
    },
    /// The migration plan itself is unusable (an empty or repeated version): the work's fault,
    /// unlike [`Error::Config`].
    #[error("invalid migration plan: {0}")]
    InvalidPlan(String),
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
    /// The test command did not test anything, by a fault of the configuration or the
    /// machine, never of the work: its program was not found, it wrote no report, or it
    /// collected no test while tests exist.
    #[error("the test command `{command}` {fault}. What it printed:\n{output}")]
    TestCommand {
        /// The command line (no secrets).
        command: String,
        /// What was wrong.
        fault: TestCommandFault,
        /// The start and end of its output (no secrets).
        output: String,
    },
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
    /// A server a process that ended had left running in the cluster's data directory did
    /// not stop, though signalled (fast, then immediate shutdown, then `SIGKILL`).
    #[error(
        "embedded PostgreSQL: the server (pid {pid}) that an ended process left running in {} did not stop within {waited}; stop it (`kill -QUIT {pid}`) and run again",
        data_dir.display()
    )]
    ServerWontStop {
        /// The server's pid.
        pid: u32,
        /// Its data directory.
        data_dir: std::path::PathBuf,
        /// How long it was waited for.
        waited: String,
    },
    /// Another server kept the data directory through every start attempt (`postgres`
    /// refused: lock file or shared memory still in use).
    #[error("embedded PostgreSQL: the data directory {} stayed in use by another server: {detail}", data_dir.display())]
    DataDirInUse {
        /// The data directory.
        data_dir: std::path::PathBuf,
        /// What the server said, last time.
        detail: String,
    },
    /// A file-system operation on the embedded cluster's own files or processes failed.
    #[error("embedded PostgreSQL: {context}: {source}")]
    ClusterIo {
        /// What was being done, and on which path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A value could not be encoded (a marker comment, a request body).
    #[error("cannot encode {what}: {source}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The encoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// The branch pool was shut down; no branch is handed out any more.
    #[error("the branch pool is shut down")]
    PoolShutDown,
    /// A lock around in-process state was poisoned by a panic on another task.
    #[error("{0} poisoned by a panic")]
    Poisoned(&'static str),
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Wraps an I/O error on the embedded cluster's files with what was being done.
    pub fn cluster_io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::ClusterIo {
            context: context.into(),
            source,
        }
    }

    /// Maps a `tokio_postgres` error, keeping it as the source: server errors keep their
    /// SQLSTATE, message, detail and hint ([`Error::Database`]); anything else (closed
    /// connection, refused, TLS) is [`Error::Connection`].
    pub fn from_pg(context: impl Into<String>, e: tokio_postgres::Error) -> Self {
        let context = context.into();
        match e.as_db_error() {
            Some(db) => Error::Database {
                context,
                code: db.code().clone(),
                server: Box::new(ServerText::of(db)),
                source: Some(e),
            },
            None => Error::Connection { context, source: e },
        }
    }

    /// The SQLSTATE of a [`Error::Database`] error.
    pub fn sqlstate(&self) -> Option<&SqlState> {
        match self {
            Error::Database { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether retrying the same call later may succeed (rate limits, busy templates,
    /// transient transport failures).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Http { status, .. } => matches!(status, 429 | 502 | 503 | 504),
            Error::Transport(_) | Error::TemplateBusy(_) | Error::Timeout(_) => true,
            Error::Database { code, .. } => *code == SqlState::OBJECT_IN_USE,
            _ => false,
        }
    }

    /// The infrastructure fault this error means when it stops a verification.
    ///
    /// Only an unreachable or failing backend is "the database is down": a configuration,
    /// permission, quota or migration problem keeps its own fault, so the human is told whose
    /// move it is. Every variant is listed: a new one must be placed here on purpose.
    pub fn infra_fault(&self) -> InfraFault {
        match self {
            Error::Runner(_) => InfraFault::RunnerFailed,
            Error::TestCommand { .. } => InfraFault::TestCommandBroken,
            Error::Timeout(_) | Error::TemplateBusy(_) => InfraFault::Timeout,
            Error::Io { .. } => InfraFault::WorkTreeIo,
            Error::Poisoned(_) => InfraFault::ActorCrashing,
            // The provider is unreachable, broken or refuses: the database side failed.
            Error::Http { .. }
            | Error::Transport(_)
            | Error::Connect(_)
            | Error::Connection { .. }
            | Error::Database { .. }
            | Error::OperationFailed(_)
            | Error::NotFound(_)
            | Error::AlreadyExists(_)
            | Error::Cluster(_)
            | Error::ClusterIo { .. }
            | Error::ServerWontStop { .. }
            | Error::DataDirInUse { .. }
            | Error::PoolShutDown => InfraFault::DatabaseDown,
            // Consort could not write its own marker: a bug, not the database.
            Error::Encode { .. } => InfraFault::InvariantBroken,
            Error::Config(_)
            | Error::InvalidName(_)
            | Error::BinariesNotFound(_)
            | Error::Unsupported(_) => InfraFault::ProviderMisconfigured,
            Error::PermissionDenied(_) => InfraFault::PermissionDenied,
            Error::QuotaExceeded(_) => InfraFault::QuotaExhausted,
            // A migration the provider could not apply (only reached here through promote).
            Error::Migration { .. } | Error::ChecksumMismatch { .. } | Error::InvalidPlan(_) => {
                InfraFault::MigrationFailed
            }
        }
    }
}

/// What the server said about an error: its message, and its detail and hint when it sent
/// them. Shown as `message; detail: …; hint: …`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerText {
    /// The server's message (`MESSAGE`).
    pub message: String,
    /// The server's detail (`DETAIL`), when it sent one.
    pub detail: Option<String>,
    /// The server's hint (`HINT`), when it sent one.
    pub hint: Option<String>,
}

impl ServerText {
    /// The message, detail and hint of a server error.
    pub fn of(db: &DbError) -> Self {
        ServerText {
            message: db.message().to_string(),
            detail: db.detail().map(str::to_string),
            hint: db.hint().map(str::to_string),
        }
    }

    /// A message without detail or hint.
    pub fn message(message: impl Into<String>) -> Self {
        ServerText {
            message: message.into(),
            detail: None,
            hint: None,
        }
    }
}

impl std::fmt::Display for ServerText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if let Some(d) = &self.detail {
            write!(f, "; detail: {d}")?;
        }
        if let Some(h) = &self.hint {
            write!(f, "; hint: {h}")?;
        }
        Ok(())
    }
}

pub(crate) use consort_actors::duration_text;

/// The driver error's text, with the server's message, detail and hint when it sent them.
fn pg_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db_text(db),
        None => e.to_string(),
    }
}

/// An error's text followed by each cause the text does not already hold: a driver error
/// such as "error performing TLS handshake" says why only in its sources.
pub(crate) fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// A server error as one line: message, detail, hint and SQLSTATE.
pub(crate) fn db_text(db: &DbError) -> String {
    format!("{} (SQLSTATE {})", ServerText::of(db), db.code().code())
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a test command failed to test anything (see [`Error::TestCommand`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TestCommandFault {
    /// The shell could not find (127) or execute (126) its program.
    ProgramNotFound {
        /// The exit code.
        code: i32,
    },
    /// The command is configured to write a JUnit report and wrote none.
    NoReport {
        /// Where the report was expected (the run's private report directory).
        path: String,
    },
    /// The command's report holds no test at all while the run expects some.
    CollectedNothing {
        /// How many tests the run expected.
        expected: usize,
    },
}

impl std::fmt::Display for TestCommandFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TestCommandFault::ProgramNotFound { code: 126 } => f.write_str(
                "could not execute its program (exit 126): check the command and the program's permissions",
            ),
            TestCommandFault::ProgramNotFound { code } => write!(
                f,
                "could not find its program (exit {code}): check the command for a typo and that the tool is installed (`consort doctor` runs it)"
            ),
            TestCommandFault::NoReport { path } => write!(
                f,
                "wrote no JUnit report to $CONSORT_JUNIT ({path}): the command must pass that path to its reporter, and it did not get as far as writing it"
            ),
            TestCommandFault::CollectedNothing { expected } => write!(
                f,
                "reported no test at all while {} expected: its configuration finds no test file (check the tool's test globs against the project's test paths)",
                consort_actors::counted(*expected as u64, "test is", "tests are")
            ),
        }
    }
}

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
            code: SqlState::OBJECT_IN_USE,
            server: Box::new(ServerText {
                message: "source database is being accessed".into(),
                detail: Some("There is 1 other session using the database.".into()),
                hint: None,
            }),
            source: None,
        };
        assert!(busy.is_retryable());
        assert_eq!(busy.sqlstate(), Some(&SqlState::OBJECT_IN_USE));
        assert_eq!(
            busy.to_string(),
            "database error while create: source database is being accessed; detail: There is 1 other session using the database. (SQLSTATE 55006)"
        );
        assert_eq!(
            Error::Runner("no psql".into()).infra_fault(),
            InfraFault::RunnerFailed
        );
        assert_eq!(
            Error::Connect("refused".into()).infra_fault(),
            InfraFault::DatabaseDown
        );
        assert_eq!(
            Error::TemplateBusy("30 s".into()).infra_fault(),
            InfraFault::Timeout
        );
        assert_eq!(
            Error::Poisoned("the secret store").infra_fault(),
            InfraFault::ActorCrashing
        );
        for (error, fault) in [
            (
                Error::Config("no url".into()),
                InfraFault::ProviderMisconfigured,
            ),
            (
                Error::PermissionDenied("create".into()),
                InfraFault::PermissionDenied,
            ),
            (
                Error::QuotaExceeded("10 branches".into()),
                InfraFault::QuotaExhausted,
            ),
            (
                Error::InvalidPlan("no version".into()),
                InfraFault::MigrationFailed,
            ),
        ] {
            assert_eq!(error.infra_fault(), fault, "{error}");
        }
    }
}
