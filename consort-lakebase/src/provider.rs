//! The branch-provider abstraction every database backend implements.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A boxed, sendable future: keeps [`BranchProvider`] usable as `Arc<dyn BranchProvider>`. The
/// one alias of the workspace, `consort_actors::BoxFuture`, re-exported here.
pub use consort_actors::BoxFuture;

/// Static facts about a backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Branches can start at a past point in time.
    pub point_in_time: bool,
    /// The backend resets a branch natively (otherwise reset = delete + create).
    pub native_reset: bool,
    /// The server expires branches by itself (a TTL backstop).
    pub server_ttl: bool,
    /// How many branches may live at once, when limited.
    pub max_live_branches: Option<usize>,
    /// Typical time to create a branch, in milliseconds.
    pub typical_create_ms: u64,
}

/// What a base ("golden") database is built from: ordered migrations and fixtures.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BaseSpec {
    /// Migrations, in order (version, SQL).
    pub migrations: Vec<consort_actors::Migration>,
    /// Fixture SQL run after the migrations.
    pub fixtures: Vec<String>,
    /// The promotions the parent holds, as far as the caller knows (the features done, when a
    /// project's migration tool makes the schema and no migration names them): a base copied
    /// from the parent before a promotion is never taken for one copied after it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub promoted: Vec<String>,
}

impl BaseSpec {
    /// The content hash that keys the base: same migrations and fixtures, same base.
    pub fn key(&self) -> consort_actors::ContentHash {
        consort_actors::ContentHash::of(self)
    }
}

/// A prepared base that branches fork from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseRef {
    /// The backend's id for the base (a template database name, a parent branch id).
    pub id: String,
    /// The [`BaseSpec::key`] it was built from.
    pub key: consort_actors::ContentHash,
}

/// A live branch created by a provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Branch {
    /// The branch name (`^[a-z][a-z0-9-]{0,62}$`, with Consort's owner prefix).
    pub name: String,
    /// The backend's id for it (may equal the name).
    pub id: String,
    /// The base it was forked from.
    pub base: BaseRef,
    /// When it was created.
    pub created_at: SystemTime,
}

/// TLS requirement for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Plain connection (local sockets and loopback only).
    Disable,
    /// TLS required, certificate verified against the web PKI roots.
    Require,
}

/// A secret string: never shown by `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret itself; call only where it is handed to a connection or a child process.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// How to connect to a branch. The secret is redacted in `Debug` and `Display`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectInfo {
    /// Host name, IP address, or a Unix socket directory.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Database name.
    pub database: String,
    /// User name.
    pub user: String,
    /// Password or token.
    pub secret: Secret,
    /// When the secret stops working; call [`BranchProvider::connect_info`] again after it.
    pub expires_at: Option<SystemTime>,
    /// TLS requirement.
    pub sslmode: SslMode,
    /// A PEM file of CA certificates trusted beside the web roots for this connection's TLS
    /// (the certificate and host name are always verified). Test processes get it as
    /// `PGSSLROOTCERT`, with `PGSSLMODE=verify-full`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<std::path::PathBuf>,
}

/// The variables every test process gets for its branch, in the order [`ConnectInfo::env`]
/// sets them: what agents are told and what `[runner] env_set` may not override
/// (`PGSSLROOTCERT` only when the connection trusts a CA file).
pub const BRANCH_ENV: [&str; 8] = [
    "DATABASE_URL",
    "PGHOST",
    "PGPORT",
    "PGUSER",
    "PGPASSWORD",
    "PGDATABASE",
    "PGSSLMODE",
    "PGSSLROOTCERT",
];

impl ConnectInfo {
    /// A `postgresql://` URL for this connection, secret included (so it is itself a
    /// [`Secret`]). A Unix-socket host goes into the `host` query parameter.
    pub fn database_url(&self) -> Secret {
        let auth = format!(
            "{}:{}",
            percent_encode(&self.user),
            percent_encode(self.secret.expose())
        );
        let sslmode = self.libpq_sslmode();
        let root = match &self.ca_file {
            Some(ca) => format!("&sslrootcert={}", percent_encode(&ca.display().to_string())),
            None => String::new(),
        };
        let db = percent_encode(&self.database);
        Secret::new(if self.host.starts_with('/') {
            format!(
                "postgresql://{auth}@/{db}?host={}&port={}&sslmode={sslmode}{root}",
                percent_encode(&self.host),
                self.port
            )
        } else {
            let host = if self.host.contains(':') {
                format!("[{}]", self.host)
            } else {
                self.host.clone()
            };
            format!(
                "postgresql://{auth}@{host}:{}/{db}?sslmode={sslmode}{root}",
                self.port
            )
        })
    }

    /// The environment a client program needs: the variables of [`BRANCH_ENV`]. Holds the
    /// secret: hand it only to a child process.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let values = [
            Some(self.database_url().expose().to_string()),
            Some(self.host.clone()),
            Some(self.port.to_string()),
            Some(self.user.clone()),
            Some(self.secret.expose().to_string()),
            Some(self.database.clone()),
            Some(self.libpq_sslmode().to_string()),
            self.ca_file.as_ref().map(|p| p.display().to_string()),
        ];
        BRANCH_ENV
            .into_iter()
            .zip(values)
            .filter_map(|(k, v)| Some((k, v?)))
            .collect()
    }

    /// libpq's `sslmode`: `disable`, `require`, or `verify-full` when a CA file is trusted.
    pub(crate) fn libpq_sslmode(&self) -> &'static str {
        match (self.sslmode, &self.ca_file) {
            (SslMode::Disable, _) => "disable",
            (SslMode::Require, None) => "require",
            (SslMode::Require, Some(_)) => "verify-full",
        }
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What applying migrations to the parent database did (see [`BranchProvider::promote`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromoteOutcome {
    /// The parent database's name (never a connection string).
    pub target: String,
    /// Versions applied now.
    pub applied: Vec<String>,
    /// Versions that were already recorded with the same checksum.
    pub already_applied: Vec<String>,
    /// Every planned version is recorded in the parent with the plan's checksum.
    pub verified: bool,
    /// Why the promotion stopped early (a failing migration, a checksum mismatch).
    pub failure: Option<String>,
}

/// A short-lived login to the parent database itself, acting as the owner role that every
/// branch's objects belong to: what the project's migration tool applies the promotion with.
/// Its `Debug` shows no secret (the connection redacts its own).
#[derive(Debug, Clone)]
pub struct ParentLogin {
    /// How to connect (the parent's name as the database).
    pub conn: ConnectInfo,
}

/// A database branch backend: embedded PostgreSQL, an existing server, or Lakebase.
///
/// Implementations are `Send + Sync` and used as `Arc<dyn BranchProvider>`.
pub trait BranchProvider: Send + Sync + fmt::Debug {
    /// A short name for receipts: `embedded`, `postgres-url`, `lakebase`.
    fn kind(&self) -> &'static str;

    /// Static facts about this backend.
    fn capabilities(&self) -> Capabilities;

    /// How a branch's files are made from its base's, for receipts: `clone` (PostgreSQL 18's
    /// `file_copy_method = clone` on a file system with reflinks) or `copy`; `None` when the
    /// backend does not say.
    fn branch_copy(&self) -> Option<&'static str> {
        None
    }

    /// Local paths that hold this backend's private state (a cluster's data directory and its
    /// administrator password): test runs may not read them.
    fn private_paths(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }

    /// Where the backend makes its branches in memory (a tmpfs on this machine), when it has
    /// room there; None: on the server's disk.
    fn branches_in_memory(&self) -> Option<&std::path::Path> {
        None
    }

    /// Makes or reuses the base that branches fork from (idempotent, keyed by `spec.key()`).
    fn prepare_base<'a>(&'a self, spec: &'a BaseSpec) -> BoxFuture<'a, Result<BaseRef>>;

    /// Creates a branch of `from`; returns only when it accepts logins.
    fn create<'a>(&'a self, name: &'a str, from: &'a BaseRef) -> BoxFuture<'a, Result<Branch>>;

    /// How to connect to a branch (call again after `expires_at`).
    fn connect_info<'a>(&'a self, branch: &'a Branch) -> BoxFuture<'a, Result<ConnectInfo>>;

    /// Forgets the credential cached for `branch` (the server refused it: revoked), so that
    /// the next [`BranchProvider::connect_info`] mints a new one. The default does nothing (a
    /// backend without minted credentials).
    fn invalidate_credential(&self, branch: &Branch) {
        let _ = branch;
    }

    /// Resets a branch to its base's current state, keeping the name.
    fn reset<'a>(&'a self, branch: &'a Branch) -> BoxFuture<'a, Result<Branch>>;

    /// Deletes a branch; a branch that does not exist is not an error.
    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<()>>;

    /// Lists live branches whose names start with `prefix`.
    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Branch>>>;

    /// Deletes this provider's own branches (Consort's prefix) older than `older_than`;
    /// returns how many were deleted.
    fn sweep(&self, older_than: Duration) -> BoxFuture<'_, Result<usize>>;

    /// Deletes this provider's orphans: branches whose creating process is gone (where the
    /// backend can tell), kept branches past their keep time, and anything older than a day.
    /// Run at start-up and shutdown. The default sweeps branches older than a day.
    fn sweep_orphans(&self) -> BoxFuture<'_, Result<usize>> {
        self.sweep(Duration::from_secs(24 * 3600))
    }

    /// Deletes what a person's clean-up may take (`consort branches --sweep`): every branch no
    /// live process holds, on any machine that shares the server — those whose creating process
    /// is gone and those kept for inspection, whatever their keep time — and the templates no
    /// branch uses. A live run's branches stay. The default, for backends that cannot tell
    /// who holds a branch: [`BranchProvider::sweep_orphans`].
    fn sweep_unheld(&self) -> BoxFuture<'_, Result<usize>> {
        self.sweep_orphans()
    }

    /// Marks a branch as kept for inspection until `until` (a failed run with `keep_failed`);
    /// the sweeper leaves it alone until then. The default does nothing (the backend's own
    /// expiry or the age limit of [`BranchProvider::sweep_orphans`] applies).
    fn keep_for_inspection<'a>(
        &'a self,
        branch: &'a Branch,
        until: SystemTime,
    ) -> BoxFuture<'a, Result<()>> {
        let _ = (branch, until);
        Box::pin(async { Ok(()) })
    }

    /// A login to the parent database for the project's migration tool at promotion (see
    /// [`ParentLogin`]); [`BranchProvider::drop_parent_login`] removes it. The default refuses.
    fn parent_login(&self) -> BoxFuture<'_, Result<ParentLogin>> {
        Box::pin(async move {
            Err(Error::Unsupported(format!(
                "the {} backend cannot let a project's migration tool apply a promotion",
                self.kind()
            )))
        })
    }

    /// Removes a login [`BranchProvider::parent_login`] made (the default has none to remove).
    fn drop_parent_login<'a>(&'a self, login: &'a ParentLogin) -> BoxFuture<'a, Result<()>> {
        let _ = login;
        Box::pin(async { Ok(()) })
    }

    /// Applies the pending migrations to the parent database itself, records them, and checks
    /// that every planned version is recorded with its checksum. The default refuses.
    fn promote<'a>(
        &'a self,
        migrations: &'a [consort_actors::Migration],
    ) -> BoxFuture<'a, Result<PromoteOutcome>> {
        let _ = migrations;
        Box::pin(async move {
            Err(Error::Unsupported(format!(
                "the {} backend cannot promote migrations",
                self.kind()
            )))
        })
    }
}
