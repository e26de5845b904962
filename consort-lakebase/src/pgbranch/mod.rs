//! Template branching inside one PostgreSQL server, shared by the embedded and the URL
//! backends: one provider type, [`ServerProvider`], that both construct.
//!
//! * **Parent**: the database promote targets and bases are copied from.
//! * **Bases** ("golden templates"): `consorttpl_<key>` = a copy of the parent plus the base's
//!   migrations and fixtures, then `IS_TEMPLATE true, ALLOW_CONNECTIONS false` and no `CONNECT`
//!   for `PUBLIC`, so nothing can ever be connected to it when a branch is copied from it.
//!   Built under a temporary name and renamed, so a half-built base is never used.
//! * **Branches**: `CREATE DATABASE consort_<…> OWNER consort_<…> TEMPLATE consorttpl_<key>
//!   STRATEGY FILE_COPY`, with its own login role (random password, sent to the server only as
//!   a SCRAM verifier) that is the only one allowed to `CONNECT`. Test runs get only that
//!   role's credentials; the administrator's stay inside the provider.
//! * **Ownership of schema objects**: migrations run as the `NOLOGIN` role `consortowner`, and
//!   every branch role is a member of it, so tests may use (and alter) the tables of their own
//!   branch, while database-level `CONNECT` keeps them out of every other database. So no
//!   database Consort makes is ever open to `PUBLIC`, not even while it is made: each is
//!   created closed and opened only once `PUBLIC` has lost `CONNECT` (`catalog::open_private`).
//! * **Markers**: every database and role Consort creates carries a JSON comment (creating
//!   process, boot, host, time, base). Nothing without that marker and the `consort_` prefix
//!   is ever altered or dropped.
//! * SQLSTATE 55006 (a source database in use) is retried with back-off.
//!
//! The parts: `privileges` (what the administrator may do, the owner role, the parent),
//! `admin` (administrator connections, busy retries), `catalog` (look-ups and drops),
//! `meta` (markers), `base` (templates), `branch` (create, reset, delete), `secrets` (branch
//! passwords), `sweep` (list, sweeps, inspection), `promote`.

mod admin;
mod base;
mod branch;
mod catalog;
mod meta;
mod privileges;

pub use privileges::ParentPrivilege;
mod promote;
mod secrets;
mod sweep;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use consort_actors::Migration;
use tokio_postgres::Config;

use crate::embedded::EmbeddedCluster;
use crate::error::{Error, Result};
use crate::pgconn::{connect_config, describe};
use crate::provider::{
    BaseRef, BaseSpec, BoxFuture, Branch, BranchProvider, Capabilities, ConnectInfo,
    PromoteOutcome, SslMode,
};

use admin::AdminPool;
use secrets::SecretStore;

/// The name prefix of base templates.
pub const TEMPLATE_PREFIX: &str = "consorttpl_";
/// The advisory-lock key that serialises provider set-up on one server.
const INIT_LOCK_KEY: i64 = 0x0063_6f6e_736f_7269;
/// The name prefix of bases being built.
const BUILDING_PREFIX: &str = "consorttmp_";

/// Options of the server backends (embedded and URL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerOptions {
    /// The parent database. Embedded default: `consort` (created when missing). URL default:
    /// the URL's database (must exist).
    pub parent_database: Option<String>,
    /// The database the administrator connection uses for `CREATE DATABASE` and friends.
    pub maintenance_database: String,
    /// The `NOLOGIN` role that owns schema objects of bases and branches.
    pub owner_role: String,
    /// How many base templates to keep; older ones are dropped when a new one is built.
    pub max_templates: usize,
    /// Branches older than this are orphans whatever their owner (the age limit).
    pub orphan_max_age: Duration,
    /// How long to retry a busy source database (SQLSTATE 55006).
    pub busy_timeout: Duration,
    /// How long a new branch may take to accept logins.
    pub login_timeout: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            parent_database: None,
            maintenance_database: "postgres".into(),
            owner_role: "consortowner".into(),
            max_templates: 8,
            orphan_max_age: Duration::from_secs(24 * 3600),
            busy_timeout: Duration::from_secs(30),
            login_timeout: Duration::from_secs(10),
        }
    }
}

/// Where the server is, how branches are reached, and what differs between the backends.
pub(crate) struct ServerTarget {
    pub kind: &'static str,
    /// Administrator connection (its dbname is replaced per use).
    pub admin: Config,
    pub admin_ssl: SslMode,
    pub parent: String,
    pub branch_host: String,
    pub branch_port: u16,
    pub branch_ssl: SslMode,
    /// Whether this provider owns the parent (creates it, restricts `CONNECT`).
    pub manage_parent: bool,
    /// The backend's typical create time ([`Capabilities::typical_create_ms`]).
    pub typical_create_ms: u64,
    /// The embedded cluster the provider branches in (kept alive as long as the provider),
    /// `None` for a server reached by URL.
    pub cluster: Option<Arc<EmbeddedCluster>>,
}

/// Template branching on one server: the provider behind both
/// [`EmbeddedProvider`](crate::EmbeddedProvider) (an embedded cluster) and
/// [`PostgresUrlProvider`](crate::PostgresUrlProvider) (an existing server), which are names
/// of this type. Construct it with `EmbeddedProvider::new(cluster)` or
/// `PostgresUrlProvider::connect(url, opts)`.
pub struct ServerProvider {
    target: ServerTarget,
    opts: ServerOptions,
    admin: AdminPool,
    base_lock: tokio::sync::Mutex<()>,
    secrets: SecretStore,
    is_super: bool,
    /// `clone` or `copy`: the server's `file_copy_method` (`copy` before PostgreSQL 18).
    branch_copy: &'static str,
    /// Where an embedded cluster makes branches in memory (its branch tablespace's place).
    branch_space: Option<PathBuf>,
    /// The size of each base a branch was copied from, in bytes (for the room in memory).
    base_sizes: std::sync::Mutex<std::collections::HashMap<String, u64>>,
}

impl fmt::Debug for ServerProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerProvider")
            .field("kind", &self.target.kind)
            .field("admin", &describe(&self.target.admin))
            .field("parent", &self.target.parent)
            .field("branch_host", &self.target.branch_host)
            .field("branch_port", &self.target.branch_port)
            .finish_non_exhaustive()
    }
}

impl ServerProvider {
    /// Connects, checks privileges, makes the owner role and (when managed) the parent.
    pub(crate) async fn init(target: ServerTarget, opts: ServerOptions) -> Result<Self> {
        let mut cfg = target.admin.clone();
        cfg.dbname(&opts.maintenance_database);
        let client = connect_config(&cfg, target.admin_ssl, None).await?;
        let is_super = privileges::check_admin(&client, &cfg).await?;
        // Providers starting at the same time would race on the same catalog rows
        // ("tuple concurrently updated"): set up one at a time.
        client
            .execute("SELECT pg_advisory_lock($1)", &[&INIT_LOCK_KEY])
            .await
            .map_err(|e| Error::from_pg("locking the provider set-up", e))?;
        let set_up = privileges::set_up(&client, &target, &opts, is_super).await;
        let branch_space = match (&set_up, &target.cluster) {
            (Ok(()), Some(cluster)) => {
                crate::embedded::branch_space::ensure(&client, cluster).await
            }
            _ => None,
        };
        // The lock also ends with this session; a failed unlock only delays another set-up.
        let _ = client
            .execute("SELECT pg_advisory_unlock($1)", &[&INIT_LOCK_KEY])
            .await;
        set_up?;
        let branch_copy = match client
            .query_one("SELECT current_setting('file_copy_method', true)", &[])
            .await
            .map_err(|e| Error::from_pg("reading file_copy_method", e))?
            .get::<_, Option<String>>(0)
            .as_deref()
        {
            Some("clone") => "clone",
            _ => "copy",
        };
        let live = rand::random::<u32>();
        meta::hold_live(&client, live).await?;
        let admin = AdminPool::new(
            target.admin.clone(),
            target.admin_ssl,
            opts.maintenance_database.clone(),
            client,
            opts.busy_timeout,
            live,
        );
        Ok(ServerProvider {
            target,
            opts,
            admin,
            base_lock: tokio::sync::Mutex::new(()),
            secrets: SecretStore::default(),
            is_super,
            branch_copy,
            branch_space,
            base_sizes: std::sync::Mutex::default(),
        })
    }

    /// The parent database's name.
    pub fn parent_database(&self) -> &str {
        &self.target.parent
    }

    /// The embedded cluster this provider branches in (`None` for a server reached by URL).
    pub fn cluster(&self) -> Option<&Arc<EmbeddedCluster>> {
        self.target.cluster.as_ref()
    }

    /// Where psql applies a project's existing psql script to database `db`: as the
    /// administrator, then the owner role (as every migration is applied).
    fn psql_target(&self, db: &str) -> Option<crate::migrate::PsqlTarget> {
        Some(crate::migrate::PsqlTarget {
            conn: crate::pgconn::connect_info_of(&self.admin.cfg_for(db), self.target.admin_ssl)?,
            role: Some(self.opts.owner_role.clone()),
        })
    }

    /// What migrations need of the parent, and whether it holds: the owner role may create
    /// schemas there and objects in its `public` schema. A parent this provider manages is
    /// prepared so at set-up; one it did not create is prepared by a person (`consort
    /// doctor` shows the statements), since Consort changes no database it did not create.
    pub async fn parent_privileges(&self) -> Result<Vec<privileges::ParentPrivilege>> {
        let c = self.admin.connect(&self.target.parent).await?;
        privileges::parent_privileges(&c, &self.target.parent, &self.opts.owner_role).await
    }

    /// How often a busy source database (SQLSTATE 55006) was retried so far.
    pub fn busy_retries(&self) -> u64 {
        self.admin.busy_retries()
    }
}

impl BranchProvider for ServerProvider {
    fn kind(&self) -> &'static str {
        self.target.kind
    }

    fn branch_copy(&self) -> Option<&'static str> {
        Some(self.branch_copy)
    }

    fn branches_in_memory(&self) -> Option<&Path> {
        self.branch_space.as_deref()
    }

    /// The cluster's directory, socket directory and place of its branches in memory; a server
    /// reached by URL keeps no private state on this machine.
    fn private_paths(&self) -> Vec<PathBuf> {
        match &self.target.cluster {
            Some(c) => [c.dir(), c.socket_dir()]
                .into_iter()
                .chain(self.branch_space.as_deref())
                .map(Path::to_path_buf)
                .collect(),
            None => Vec::new(),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            point_in_time: false,
            native_reset: false,
            server_ttl: false,
            max_live_branches: None,
            typical_create_ms: self.target.typical_create_ms,
        }
    }

    fn prepare_base<'a>(&'a self, spec: &'a BaseSpec) -> BoxFuture<'a, Result<BaseRef>> {
        Box::pin(self.prepare_base_impl(spec))
    }

    fn create<'a>(&'a self, name: &'a str, from: &'a BaseRef) -> BoxFuture<'a, Result<Branch>> {
        Box::pin(self.create_impl(name, from))
    }

    fn connect_info<'a>(&'a self, branch: &'a Branch) -> BoxFuture<'a, Result<ConnectInfo>> {
        Box::pin(self.connect_info_impl(branch))
    }

    fn reset<'a>(&'a self, branch: &'a Branch) -> BoxFuture<'a, Result<Branch>> {
        Box::pin(self.reset_impl(branch))
    }

    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.delete_impl(name))
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Branch>>> {
        Box::pin(self.list_impl(prefix))
    }

    fn sweep(&self, older_than: Duration) -> BoxFuture<'_, Result<usize>> {
        Box::pin(self.sweep_impl(older_than))
    }

    fn sweep_orphans(&self) -> BoxFuture<'_, Result<usize>> {
        Box::pin(self.sweep_orphans_impl())
    }

    fn sweep_unheld(&self) -> BoxFuture<'_, Result<usize>> {
        Box::pin(self.sweep_unheld_impl())
    }

    fn keep_for_inspection<'a>(
        &'a self,
        branch: &'a Branch,
        until: SystemTime,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.keep_for_inspection_impl(branch, until))
    }

    fn promote<'a>(&'a self, migrations: &'a [Migration]) -> BoxFuture<'a, Result<PromoteOutcome>> {
        Box::pin(self.promote_impl(migrations))
    }

    fn parent_login(&self) -> BoxFuture<'_, Result<crate::provider::ParentLogin>> {
        Box::pin(self.parent_login_impl())
    }

    fn drop_parent_login<'a>(
        &'a self,
        login: &'a crate::provider::ParentLogin,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.drop_parent_login_impl(login))
    }
}
