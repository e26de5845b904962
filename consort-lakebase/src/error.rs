//! The crate's error type.
//!
//! One `#[non_exhaustive]` enum for every backend, runner and the actor. No variant ever holds a
//! password, token or connection string with a secret: callers build the texts from redacted
//! parts.

use std::path::PathBuf;

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
    /// The configuration is unusable: the database URL, the CA file, a Lakebase setting. The
    /// error underneath, when there is one, is its source.
    #[error(transparent)]
    Misconfigured(#[from] ConfigError),
    /// No PostgreSQL server binaries were found.
    #[error(
        "no PostgreSQL server binaries found ({0}); install PostgreSQL 15 or newer (`apt-get install postgresql`), or set `[database] postgres` to the directory of its initdb and postgres"
    )]
    BinariesNotFound(String),
    /// Consort's own PostgreSQL could not be fetched, checked or unpacked (the message says
    /// why and the ways out).
    #[error("{0}")]
    FetchPostgres(String),
    /// The embedded cluster could not be created, started or stopped.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The database cannot be reached (down, refused, authentication failed).
    #[error("cannot connect to the database: {0}")]
    Connect(String),
    /// The driver lost or could not open its connection (refused, closed, authentication,
    /// TLS); the server's message, detail and hint are in the text when it sent them. The
    /// text says the driver's error and its causes, so the driver's error is kept but is not
    /// the source.
    #[error("database connection failed while {context}: {}", pg_text(driver))]
    Connection {
        /// What was being done (and on which server, never with a password).
        context: String,
        /// The driver's error.
        driver: tokio_postgres::Error,
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
        /// The driver's error (absent when the error came through an HTTP API), kept as the
        /// source for callers that inspect it.
        #[source]
        driver: Option<tokio_postgres::Error>,
    },
    /// A migration's SQL failed; the migration's transaction was rolled back.
    #[error("migration {version} failed: {detail}")]
    Migration {
        /// The migration version.
        version: String,
        /// The server's message.
        detail: String,
    },
    /// The project's migration tool failed, or ran without recording the design's migrations.
    #[error("the project's migration tool ({tool}) failed: {detail}")]
    MigrationTool {
        /// The tool (`knex`).
        tool: String,
        /// What failed, with the end of what the tool said.
        detail: String,
    },
    /// The migration plan itself is unusable (an empty or repeated version): the work's fault,
    /// unlike [`Error::Misconfigured`].
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
    #[error("{context}")]
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
    #[error("embedded PostgreSQL: {context}")]
    ClusterIo {
        /// What was being done, and on which path.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A value could not be encoded (a marker comment, a request body).
    #[error("cannot encode {what}")]
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

    /// Maps a `tokio_postgres` error, keeping it: server errors keep their
    /// SQLSTATE, message, detail and hint ([`Error::Database`]); anything else (closed
    /// connection, refused, TLS) is [`Error::Connection`].
    pub fn from_pg(context: impl Into<String>, e: tokio_postgres::Error) -> Self {
        let context = context.into();
        match e.as_db_error() {
            Some(db) => Error::Database {
                context,
                code: db.code().clone(),
                server: Box::new(ServerText::of(db)),
                driver: Some(e),
            },
            None => Error::Connection { context, driver: e },
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
            Error::TestCommand {
                fault: TestCommandFault::Refused { .. },
                ..
            } => InfraFault::SandboxRefused,
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
            Error::Misconfigured(_)
            | Error::InvalidName(_)
            | Error::BinariesNotFound(_)
            | Error::FetchPostgres(_)
            | Error::Unsupported(_) => InfraFault::ProviderMisconfigured,
            Error::PermissionDenied(_) => InfraFault::PermissionDenied,
            Error::QuotaExceeded(_) => InfraFault::QuotaExhausted,
            // A migration the provider could not apply (only reached here through promote).
            Error::Migration { .. }
            | Error::MigrationTool { .. }
            | Error::ChecksumMismatch { .. }
            | Error::InvalidPlan(_) => InfraFault::MigrationFailed,
        }
    }
}

/// Why the configuration is unusable (see [`Error::Misconfigured`]). No variant holds a
/// password or a token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A required environment variable is not set.
    #[error("configuration: {var} is not set")]
    EnvUnset {
        /// The variable.
        var: &'static str,
    },
    /// An environment variable holds bytes that are not Unicode (its value is not shown: it
    /// may hold a password).
    #[error("configuration: {var} is not valid Unicode")]
    EnvNotUnicode {
        /// The variable.
        var: &'static str,
    },
    /// The database URL does not parse. The parser's error is kept as text with the URL's
    /// password scrubbed out, not as a source: its own text may quote the password.
    #[error("configuration: not a valid PostgreSQL URL: {detail}")]
    DatabaseUrl {
        /// The parser's error, scrubbed.
        detail: String,
    },
    /// The database URL lacks a part a connection needs.
    #[error("configuration: the database URL names no {part}")]
    DatabaseUrlIncomplete {
        /// The missing part (`host`, `user`).
        part: &'static str,
    },
    /// The CA file (`ca_file`) cannot be used.
    #[error(transparent)]
    CaFile(#[from] CaFileError),
    /// A test runner's glob does not parse.
    #[error("configuration: bad glob `{glob}`")]
    BadGlob {
        /// The glob as configured.
        glob: String,
        /// Why it does not parse.
        #[source]
        source: globset::Error,
    },
    /// A test runner's globs cannot be combined into one set.
    #[error("configuration: the globs cannot be combined")]
    GlobSet(#[source] globset::Error),
    /// A path a runner setting names leaves the work tree.
    #[error("configuration: {} must be a path inside the work tree", path.display())]
    OutsideWorkTree {
        /// The path as configured.
        path: std::path::PathBuf,
    },
    /// The Lakebase backend's configuration is unusable
    /// ([`ApiError::Config`](crate::lakebase_api::ApiError::Config)), or the service refused a
    /// setting ([`ApiError::TtlRefused`](crate::lakebase_api::ApiError::TtlRefused)).
    #[error(transparent)]
    Lakebase(Box<crate::lakebase_api::ApiError>),
}

/// Why the CA file a configuration names (`ca_file`) cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaFileError {
    /// The file cannot be read.
    #[error("configuration: ca_file {}: cannot be read", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The read's error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a file of PEM certificates.
    #[error("configuration: ca_file {}: not PEM certificates", path.display())]
    NotPem {
        /// The file.
        path: PathBuf,
        /// The PEM parser's error.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The file holds no certificate.
    #[error("configuration: ca_file {}: holds no certificate", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A certificate of the file cannot be trusted as a root.
    #[error("configuration: ca_file {}: a certificate is unusable", path.display())]
    Unusable {
        /// The file.
        path: PathBuf,
        /// Why rustls refused it.
        #[source]
        source: rustls::Error,
    },
}

impl From<CaFileError> for Error {
    fn from(e: CaFileError) -> Self {
        Error::Misconfigured(ConfigError::CaFile(e))
    }
}

/// Why the embedded cluster could not be created, started or stopped (see
/// [`Error::Cluster`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// Running as root, the server's user could not be looked up.
    #[error("embedded PostgreSQL: looking up user \"{user}\"")]
    UserLookup {
        /// The user.
        user: String,
        /// The lookup's error.
        #[source]
        source: nix::errno::Errno,
    },
    /// Running as root, the user the server is to run as does not exist.
    #[error(
        "embedded PostgreSQL: running as root, PostgreSQL must run as an unprivileged user, but user \"{user}\" does not exist (install postgresql, or configure another user)"
    )]
    NoSuchUser {
        /// The user.
        user: String,
    },
    /// The user the server is to run as is root.
    #[error("embedded PostgreSQL: user \"{user}\" is root; PostgreSQL refuses to run as root")]
    RootUser {
        /// The user.
        user: String,
    },
    /// A directory asked to be removed as orphaned is not a fallback cluster directory.
    #[error("embedded PostgreSQL: {} is not a fallback cluster directory", dir.display())]
    NotFallbackDir {
        /// The directory.
        dir: PathBuf,
    },
    /// A fallback cluster directory is not orphaned (any more), so it is kept.
    #[error("embedded PostgreSQL: {} is kept: {state}", dir.display())]
    Kept {
        /// The directory.
        dir: PathBuf,
        /// Where it stands.
        state: crate::embedded::Placement,
    },
    /// The server of an orphaned directory was taken into use while it was being removed.
    #[error("embedded PostgreSQL: {} is kept: its server (pid {pid}) was taken into use", dir.display())]
    TakenIntoUse {
        /// The directory.
        dir: PathBuf,
        /// The server's pid.
        pid: u32,
    },
    /// A lock around the clusters' in-process state was poisoned by a panic.
    #[error("embedded PostgreSQL: {what} poisoned")]
    Poisoned {
        /// Which state (`cluster registry`, `cluster state`).
        what: &'static str,
    },
    /// The server did not start, and no attempt said why.
    #[error("embedded PostgreSQL: could not start the server")]
    NotStarted,
    /// The server another process started has no port in its `postmaster.pid`.
    #[error(
        "embedded PostgreSQL: the server another process started in {} (pid {pid}) has no port in its postmaster.pid",
        dir.display()
    )]
    NoPort {
        /// The cluster's directory.
        dir: PathBuf,
        /// The server's pid.
        pid: u32,
    },
    /// `initdb` failed.
    #[error("embedded PostgreSQL: initdb failed ({status}): {stderr}")]
    Initdb {
        /// How it exited.
        status: std::process::ExitStatus,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// The cluster's watchdog process was started without a stdin to watch.
    #[error("embedded PostgreSQL: watchdog has no stdin")]
    WatchdogNoStdin,
    /// The server another process started neither accepted connections nor exited in time;
    /// the last connection attempt's error is the source.
    #[error(
        "embedded PostgreSQL: the server another process started (pid {pid}) neither accepted connections nor exited within {}; log: {log}",
        duration_text(*waited)
    )]
    AttachTimeout {
        /// The server's pid.
        pid: u32,
        /// How long it was waited for.
        waited: std::time::Duration,
        /// The end of the server's log (password verifiers redacted).
        log: String,
        /// The last connection attempt's error.
        #[source]
        source: Box<Error>,
    },
    /// The server this process started exited during start-up.
    #[error("embedded PostgreSQL: the server exited during start-up: {log}")]
    ExitedDuringStartup {
        /// The end of the server's log (password verifiers redacted).
        log: String,
    },
    /// The server this process started did not accept connections in time; the last
    /// connection attempt's error is the source.
    #[error(
        "embedded PostgreSQL: the server did not accept connections within {}; log: {log}",
        duration_text(*waited)
    )]
    NotReady {
        /// How long it was waited for.
        waited: std::time::Duration,
        /// The end of the server's log (password verifiers redacted).
        log: String,
        /// The last connection attempt's error.
        #[source]
        source: Box<Error>,
    },
    /// Another process has held the cluster's start lock for too long.
    #[error(
        "embedded PostgreSQL: another process has been starting the server in {} for {}; it may be stuck (see {}): end it, or wait and run again",
        dir.display(),
        duration_text(*waited),
        dir.join("postgres.log").display()
    )]
    StartLockHeld {
        /// The cluster's directory.
        dir: PathBuf,
        /// How long this process waited for the lock.
        waited: std::time::Duration,
    },
    /// This process's start time cannot be read, so it cannot record itself as the server's
    /// owner.
    #[error(
        "embedded PostgreSQL: cannot read this process's start time from /proc/self/stat, so no other process could tell whether the server's owner is alive"
    )]
    NoStartTime,
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

/// The driver error's text, with the server's message, detail and hint when it sent them, or
/// with its causes (a driver error such as "error performing TLS handshake" says why only in
/// its sources).
fn pg_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db_text(db),
        None => consort_actors::error_chain(e),
    }
}

/// What a run's confinement refused it, as its output showed (see `runner/denial.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// A TCP connection, by Landlock's port rule (runs without a network of their own).
    Connection {
        /// The address, as the run's output named it.
        address: String,
    },
    /// An address outside the run's own network (which holds its loopback and its branch).
    Network {
        /// The address or host name, as the run's output named it.
        address: String,
    },
    /// A path: Consort's private state (`write` false), or a write outside the run's scratch
    /// and caches that the file's own modes allow (`write` true).
    Path {
        /// The path, as the run's output named it.
        path: String,
        /// Whether the run was refused writing it.
        write: bool,
    },
    /// A pseudo-terminal (runs without a devpts instance of their own).
    Pty,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const OFF: &str =
            "or set `sandbox = \"off\"` under [runner] in consort.toml to run unconfined";
        match self {
            Refusal::Connection { address } => write!(
                f,
                "a TCP connection to {address}: on this machine a run may connect only to its branch's port (the kernel gives runs no network of their own, where a test could serve on loopback); run Consort where user and network namespaces are allowed, {OFF}"
            ),
            Refusal::Network { address } => write!(
                f,
                "a connection to {address}, outside the run's own network: a run reaches its loopback and its branch, nothing else; start what the test needs inside the run (it may serve on any loopback port), {OFF}"
            ),
            Refusal::Path { path, write: false } => write!(
                f,
                "reading {path}: Consort's private state and other lanes are never readable to a run, and no setting changes that"
            ),
            Refusal::Path { path, write: true } => write!(
                f,
                "writing {path}: a run writes only in its scratch directory ($HOME, $TMPDIR), /dev/shm and the tree's cache directories; name the directory under [paths] caches in consort.toml and create it before the run, {OFF}"
            ),
            Refusal::Pty => write!(
                f,
                "a pseudo-terminal: the kernel gives runs no devpts instance of their own here; run Consort where user namespaces are allowed, {OFF}"
            ),
        }
    }
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
    /// The Python the command starts lacks a module it needs (`No module named pytest`), and
    /// wrote no report: the project's packages are not where that Python looks.
    PythonLacks {
        /// The module it lacks and what to do (see [`crate::python_lacks_advice`]): one text,
        /// which keeps the error small.
        advice: String,
    },
    /// The command's report holds no test at all while the run expects some.
    CollectedNothing {
        /// How many tests the run expected.
        expected: usize,
    },
    /// A package the command runs is not installed where the run starts: npm looked for it
    /// in the registry, which a run never reaches (it works offline there).
    NotInstalled {
        /// The package (`vitest`, `@scope/tool`).
        package: String,
    },
    /// The run failed on something its confinement refused it (see [`Refusal`]): no evidence
    /// about the code, never a RED, never a failed GREEN.
    Refused {
        /// What was refused (boxed: the error stays small).
        refusal: Box<Refusal>,
    },
    /// `psql` did not run a test file's statements: what it ended with is no evidence about
    /// the test (see [`PsqlFault`]).
    Psql {
        /// The test file it was to run.
        file: String,
        /// What went wrong (boxed: the error stays small).
        fault: Box<PsqlFault>,
    },
}

/// Why a `psql` session is no evidence about the test it was to run: only an error the server
/// raised in the test's statements (exit 3 with `ON_ERROR_STOP`) fails a test.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PsqlFault {
    /// psql ended with its own fatal error (exit 1): it is no working client (Debian's
    /// `psql` wrapper with no `postgresql-client-<version>` behind it) or could not read its
    /// input.
    OwnError {
        /// The exit code.
        code: i32,
    },
    /// psql could not open a session (exit 2 before any command ran) while the branch
    /// answers: its connection settings or its wrapper are wrong.
    NoSession,
    /// The program ended without error but never opened a session: a wrapper that runs
    /// nothing, not psql.
    RanNothing,
    /// psql ended in a way it never ends on a test's error: another exit code or a signal.
    Ended {
        /// How it ended (`exit 127`, `signal 9`).
        how: String,
    },
}

impl std::fmt::Display for PsqlFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PsqlFault::OwnError { code } => write!(
                f,
                "psql ended with its own fatal error (exit {code}), not an error of the test's statements: check that the configured psql is a working client (`psql --version`; Debian's wrapper needs a postgresql-client-<version> package behind it)"
            ),
            PsqlFault::NoSession => f.write_str(
                "psql could not open a session with the branch (exit 2 before any statement ran) while the branch answers: check the psql program and what it is given to connect",
            ),
            PsqlFault::RanNothing => f.write_str(
                "the psql program ended without opening a session: it ran nothing (a wrapper, not psql)",
            ),
            PsqlFault::Ended { how } => write!(
                f,
                "psql ended with {how}, which no error of a test's statements causes"
            ),
        }
    }
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
            TestCommandFault::PythonLacks { advice } => write!(
                f,
                "could not run, and a test run reaches no package index: {advice}"
            ),
            TestCommandFault::NotInstalled { package } => write!(
                f,
                "could not run {package}: it is not installed in this workspace (npm found no {package} in node_modules, and a test run reaches no registry): install the project's dependencies where the run starts (`npm ci`), or fix the command"
            ),
            TestCommandFault::Refused { refusal } => write!(
                f,
                "failed on what the confinement refused it, so its outcome is no verdict on the code: {refusal}"
            ),
            TestCommandFault::Psql { file, fault } => {
                write!(f, "did not run the test file {file}: {fault}")
            }
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
            driver: None,
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
                Error::Misconfigured(ConfigError::EnvUnset {
                    var: "DATABASE_URL",
                }),
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
            (
                ConfigError::EnvUnset { var: "X" }.into(),
                InfraFault::ProviderMisconfigured,
            ),
            (ClusterError::NotStarted.into(), InfraFault::DatabaseDown),
        ] {
            assert_eq!(error.infra_fault(), fault, "{error}");
        }
    }

    #[test]
    fn typed_errors_leave_their_cause_to_the_chain_and_the_chain_says_it_once() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let cause = missing.to_string();
        let e = Error::from(CaFileError::Unreadable {
            path: "ca.pem".into(),
            source: missing,
        });
        assert_eq!(
            e.to_string(),
            "configuration: ca_file ca.pem: cannot be read"
        );
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(
            consort_actors::error_chain(&e),
            format!("configuration: ca_file ca.pem: cannot be read: {cause}")
        );
        assert_eq!(e.infra_fault(), InfraFault::ProviderMisconfigured);
        // A cause of this crate says its own cause its own way, once.
        let io = Error::io("read x", std::io::Error::other("disk gone"));
        let e = Error::from(ClusterError::NotReady {
            waited: std::time::Duration::from_secs(2),
            log: "starting".into(),
            source: Box::new(io),
        });
        assert_eq!(
            consort_actors::error_chain(&e),
            "embedded PostgreSQL: the server did not accept connections within 2 s; log: starting: read x: disk gone"
        );
        // An I/O error's cause is its source, not part of its own text: the chain says it once.
        let io = Error::io("read x", std::io::Error::other("disk gone"));
        assert_eq!(io.to_string(), "read x");
        assert_eq!(consort_actors::error_chain(&io), "read x: disk gone");
    }
}
