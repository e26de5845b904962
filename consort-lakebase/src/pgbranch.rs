//! Template branching inside one PostgreSQL server, shared by the embedded and the URL
//! backends.
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
//!   branch, while database-level `CONNECT` keeps them out of every other database.
//! * **Markers**: every database and role Consort creates carries a JSON comment (creating
//!   process, boot, host, time, base). Nothing without that marker and the `consort_` prefix
//!   is ever altered or dropped.
//! * SQLSTATE 55006 (a source database in use) is retried with back-off.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use consort_actors::{ContentHash, Migration};
use serde::{Deserialize, Serialize};
use tokio_postgres::{Client, Config};
use tracing::{debug, info, warn};

use crate::error::{Error, Result};
use crate::migrate;
use crate::names::{
    BRANCH_PREFIX, branch_of_db, db_ident, quote_ident, quote_literal, random_password, random_tag,
    validate_branch_name,
};
use crate::pgconn::{connect_config, describe};
use crate::procinfo;
use crate::provider::{BaseRef, BaseSpec, Branch, ConnectInfo, PromoteOutcome, Secret, SslMode};

/// The name prefix of base templates.
pub const TEMPLATE_PREFIX: &str = "consorttpl_";
/// The advisory-lock key that serialises provider set-up on one server.
const INIT_LOCK_KEY: i64 = 0x0063_6f6e_736f_7269;
/// The name prefix of bases being built.
const BUILDING_PREFIX: &str = "consorttmp_";
/// Most administrator connections one provider opens (see `PgBrancher::admin`).
const ADMIN_CONNECTIONS: usize = 4;

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

/// Where the server is and how branches are reached.
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
}

/// The marker comment on everything Consort creates.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    consort: u8,
    #[serde(default)]
    base: Option<String>,
    #[serde(default)]
    key: Option<String>,
    created: u64,
    pid: u32,
    ticks: u64,
    boot: String,
    host: String,
    #[serde(default)]
    kept_until: Option<u64>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Meta {
    fn now(base: Option<&BaseRef>) -> Self {
        let (pid, ticks) = procinfo::me();
        Meta {
            consort: 1,
            base: base.map(|b| b.id.clone()),
            key: base.map(|b| b.key.to_hex()),
            created: unix_now(),
            pid,
            ticks,
            boot: procinfo::boot_id(),
            host: procinfo::hostname(),
            kept_until: None,
        }
    }

    fn parse(comment: Option<&str>) -> Option<Meta> {
        let m: Meta = serde_json::from_str(comment?).ok()?;
        (m.consort == 1).then_some(m)
    }

    fn text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether the creating process is known to be gone (same host: other boot or dead pid).
    fn owner_gone(&self) -> bool {
        self.host == procinfo::hostname()
            && (self.boot != procinfo::boot_id()
                || !procinfo::same_process_alive(self.pid, self.ticks))
    }

    fn created_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.created)
    }
}

/// Implements [`BranchProvider`](crate::provider::BranchProvider) for a type whose `inner` field
/// is a [`PgBrancher`]: every backend built on template branching behaves the same, and differs
/// only in how it reaches the server and its typical create time.
macro_rules! branch_provider_via_pg_brancher {
    ($ty:ty, typical_create_ms = $ms:expr) => {
        impl $crate::provider::BranchProvider for $ty {
            fn kind(&self) -> &'static str {
                self.inner.kind()
            }

            fn private_paths(&self) -> Vec<std::path::PathBuf> {
                self.private_dirs()
            }

            fn capabilities(&self) -> $crate::provider::Capabilities {
                $crate::provider::Capabilities {
                    point_in_time: false,
                    native_reset: false,
                    server_ttl: false,
                    max_live_branches: None,
                    typical_create_ms: $ms,
                }
            }

            fn prepare_base<'a>(
                &'a self,
                spec: &'a $crate::provider::BaseSpec,
            ) -> $crate::provider::BoxFuture<'a, $crate::Result<$crate::provider::BaseRef>> {
                Box::pin(self.inner.prepare_base(spec))
            }

            fn create<'a>(
                &'a self,
                name: &'a str,
                from: &'a $crate::provider::BaseRef,
            ) -> $crate::provider::BoxFuture<'a, $crate::Result<$crate::provider::Branch>> {
                Box::pin(self.inner.create(name, from))
            }

            fn connect_info<'a>(
                &'a self,
                branch: &'a $crate::provider::Branch,
            ) -> $crate::provider::BoxFuture<'a, $crate::Result<$crate::provider::ConnectInfo>>
            {
                Box::pin(self.inner.connect_info(branch))
            }

            fn reset<'a>(
                &'a self,
                branch: &'a $crate::provider::Branch,
            ) -> $crate::provider::BoxFuture<'a, $crate::Result<$crate::provider::Branch>> {
                Box::pin(self.inner.reset(branch))
            }

            fn delete<'a>(
                &'a self,
                name: &'a str,
            ) -> $crate::provider::BoxFuture<'a, $crate::Result<()>> {
                Box::pin(self.inner.delete(name))
            }

            fn list<'a>(
                &'a self,
                prefix: &'a str,
            ) -> $crate::provider::BoxFuture<'a, $crate::Result<Vec<$crate::provider::Branch>>>
            {
                Box::pin(self.inner.list(prefix))
            }

            fn sweep(
                &self,
                older_than: std::time::Duration,
            ) -> $crate::provider::BoxFuture<'_, $crate::Result<usize>> {
                Box::pin(self.inner.sweep(older_than))
            }

            fn sweep_orphans(&self) -> $crate::provider::BoxFuture<'_, $crate::Result<usize>> {
                Box::pin(self.inner.sweep_orphans())
            }

            fn keep_for_inspection<'a>(
                &'a self,
                branch: &'a $crate::provider::Branch,
                until: std::time::SystemTime,
            ) -> $crate::provider::BoxFuture<'a, $crate::Result<()>> {
                Box::pin(self.inner.keep_for_inspection(branch, until))
            }

            fn promote<'a>(
                &'a self,
                migrations: &'a [consort_actors::Migration],
            ) -> $crate::provider::BoxFuture<'a, $crate::Result<$crate::provider::PromoteOutcome>>
            {
                Box::pin(self.inner.promote(migrations))
            }
        }
    };
}
pub(crate) use branch_provider_via_pg_brancher;

/// Template branching on one server.
pub(crate) struct PgBrancher {
    target: ServerTarget,
    opts: ServerOptions,
    /// Administrator connections, opened on first use. Several, so that branches are created
    /// and dropped concurrently: concurrent `CREATE DATABASE … STRATEGY FILE_COPY` share the
    /// checkpoints each of them must wait for, and a drop does not queue behind a create.
    admin: Vec<tokio::sync::Mutex<Option<Client>>>,
    /// Where the next wait for a busy administrator connection queues.
    next_admin: AtomicU64,
    base_lock: tokio::sync::Mutex<()>,
    secrets: Mutex<HashMap<String, Secret>>,
    is_super: bool,
    busy_retries: AtomicU64,
}

impl fmt::Debug for PgBrancher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgBrancher")
            .field("kind", &self.target.kind)
            .field("admin", &describe(&self.target.admin))
            .field("parent", &self.target.parent)
            .field("branch_host", &self.target.branch_host)
            .field("branch_port", &self.target.branch_port)
            .finish_non_exhaustive()
    }
}

fn is_dup(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .map(|d| matches!(d.code().code(), "42710" | "23505" | "42P04"))
        .unwrap_or(false)
}

impl PgBrancher {
    /// Connects, checks privileges, makes the owner role and (when managed) the parent.
    pub async fn init(target: ServerTarget, opts: ServerOptions) -> Result<Self> {
        let mut cfg = target.admin.clone();
        cfg.dbname(&opts.maintenance_database);
        let client = connect_config(&cfg, target.admin_ssl).await?;
        let row = client
            .query_one(
                "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = current_user",
                &[],
            )
            .await
            .map_err(|e| Error::from_pg("reading the administrator's privileges", &e))?;
        let (is_super, createdb, createrole): (bool, bool, bool) =
            (row.get(0), row.get(1), row.get(2));
        if !(is_super || (createdb && createrole)) {
            return Err(Error::PermissionDenied(format!(
                "{} needs SUPERUSER or CREATEDB and CREATEROLE to branch databases",
                describe(&cfg)
            )));
        }
        // Providers starting at the same time would race on the same catalog rows
        // ("tuple concurrently updated"): set up one at a time.
        client
            .execute("SELECT pg_advisory_lock($1)", &[&INIT_LOCK_KEY])
            .await
            .map_err(|e| Error::from_pg("locking the provider set-up", &e))?;
        let set_up = Self::set_up(&client, &target, &opts, is_super).await;
        let _ = client
            .execute("SELECT pg_advisory_unlock($1)", &[&INIT_LOCK_KEY])
            .await;
        set_up?;
        Ok(PgBrancher {
            target,
            opts,
            admin: std::iter::once(Some(client))
                .chain(std::iter::repeat_with(|| None))
                .take(ADMIN_CONNECTIONS)
                .map(tokio::sync::Mutex::new)
                .collect(),
            next_admin: AtomicU64::new(0),
            base_lock: tokio::sync::Mutex::new(()),
            secrets: Mutex::new(HashMap::new()),
            is_super,
            busy_retries: AtomicU64::new(0),
        })
    }

    async fn set_up(
        client: &Client,
        target: &ServerTarget,
        opts: &ServerOptions,
        is_super: bool,
    ) -> Result<()> {
        let owner = quote_ident(&opts.owner_role);
        if let Err(e) = client
            .batch_execute(&format!("CREATE ROLE {owner} NOLOGIN"))
            .await
            && !is_dup(&e)
        {
            return Err(Error::from_pg("creating the owner role", &e));
        }
        if !is_super {
            let _ = client
                .batch_execute(&format!("GRANT {owner} TO CURRENT_USER"))
                .await;
        }
        let parent = target.parent.clone();
        let exists = db_exists(client, &parent).await?;
        if target.manage_parent {
            if !exists {
                match client
                    .batch_execute(&format!("CREATE DATABASE {}", quote_ident(&parent)))
                    .await
                {
                    Ok(()) => info!(parent = %parent, "created the parent database"),
                    Err(e) if is_dup(&e) => {}
                    Err(e) => return Err(Error::from_pg("creating the parent database", &e)),
                }
            }
            for db in [parent.as_str(), "postgres", "template1"] {
                let open: bool = client
                    .query_one(
                        "SELECT has_database_privilege('public', $1, 'CONNECT')",
                        &[&db],
                    )
                    .await
                    .map_err(|e| Error::from_pg("reading database privileges", &e))?
                    .get(0);
                if open {
                    client
                        .batch_execute(&format!(
                            "REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC",
                            quote_ident(db)
                        ))
                        .await
                        .map_err(|e| Error::from_pg("restricting CONNECT", &e))?;
                }
            }
            let mut pcfg = target.admin.clone();
            pcfg.dbname(&parent);
            let pc = connect_config(&pcfg, target.admin_ssl).await?;
            let owned: bool = pc
                .query_one(
                    "SELECT pg_get_userbyid(nspowner) = $1 FROM pg_namespace WHERE nspname = 'public'",
                    &[&opts.owner_role],
                )
                .await
                .map_err(|e| Error::from_pg("reading the parent's schema owner", &e))?
                .get(0);
            if !owned {
                pc.batch_execute(&format!("ALTER SCHEMA public OWNER TO {owner}"))
                    .await
                    .map_err(|e| {
                        Error::from_pg("giving the parent's schema to the owner role", &e)
                    })?;
            }
        } else if !exists {
            return Err(Error::NotFound(format!(
                "the parent database {parent:?} does not exist"
            )));
        } else {
            let public_connect: bool = client
                .query_one(
                    "SELECT has_database_privilege('public', $1, 'CONNECT')",
                    &[&parent],
                )
                .await
                .map_err(|e| Error::from_pg("reading the parent's privileges", &e))?
                .get(0);
            if public_connect {
                warn!(
                    parent = %parent,
                    "PUBLIC may CONNECT to the parent database; branch roles could connect to it (Consort does not change a database it did not create)"
                );
            }
        }
        Ok(())
    }

    pub fn kind(&self) -> &'static str {
        self.target.kind
    }

    pub fn parent(&self) -> &str {
        &self.target.parent
    }

    /// How often a busy source database (55006) was retried.
    pub fn busy_retries(&self) -> u64 {
        self.busy_retries.load(Ordering::Relaxed)
    }

    fn admin_cfg(&self, db: &str) -> Config {
        let mut cfg = self.target.admin.clone();
        cfg.dbname(db);
        cfg
    }

    /// A free administrator connection slot, or (all busy) the next one in turn.
    async fn admin_slot(&self) -> tokio::sync::MutexGuard<'_, Option<Client>> {
        for slot in &self.admin {
            if let Ok(guard) = slot.try_lock() {
                return guard;
            }
        }
        let n = self.next_admin.fetch_add(1, Ordering::Relaxed) as usize;
        self.admin[n % self.admin.len()].lock().await
    }

    async fn admin_client<'g>(&self, slot: &'g mut Option<Client>) -> Result<&'g Client> {
        if slot.as_ref().is_none_or(|c| c.is_closed()) {
            let cfg = self.admin_cfg(&self.opts.maintenance_database);
            *slot = Some(connect_config(&cfg, self.target.admin_ssl).await?);
        }
        slot.as_ref()
            .ok_or_else(|| Error::Connect("no administrator connection".into()))
    }

    /// Runs `sql`, retrying while a source database is busy (55006).
    async fn exec_busy(&self, client: &Client, sql: &str, what: &str) -> Result<()> {
        let deadline = Instant::now() + self.opts.busy_timeout;
        let mut delay = Duration::from_millis(10);
        loop {
            match client.batch_execute(sql).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let err = Error::from_pg(what, &e);
                    if err.sqlstate() != Some("55006") {
                        return Err(err);
                    }
                    if Instant::now() >= deadline {
                        return Err(Error::TemplateBusy(format!(
                            "{what}: still busy after {:?}: {err}",
                            self.opts.busy_timeout
                        )));
                    }
                    debug!(what, "source database busy; retrying");
                    self.busy_retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    fn template_name(key: &ContentHash) -> String {
        format!("{TEMPLATE_PREFIX}{}", &key.to_hex()[..24])
    }

    pub async fn prepare_base(&self, spec: &BaseSpec) -> Result<BaseRef> {
        migrate::check_plan(&spec.migrations)?;
        let key = spec.key();
        let name = Self::template_name(&key);
        let base = BaseRef {
            id: name.clone(),
            key,
        };
        let _building = self.base_lock.lock().await;
        {
            let mut slot = self.admin_slot().await;
            let admin = self.admin_client(&mut slot).await?;
            if is_template(admin, &name).await? {
                return Ok(base);
            }
        }
        let tmp = format!("{BUILDING_PREFIX}{}", random_tag(16));
        let meta = Meta::now(Some(&base)).text();
        {
            let mut slot = self.admin_slot().await;
            let admin = self.admin_client(&mut slot).await?;
            self.exec_busy(
                admin,
                &format!(
                    "CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY",
                    quote_ident(&tmp),
                    quote_ident(&self.target.parent)
                ),
                "copying the parent into a new base",
            )
            .await?;
            comment_db(admin, &tmp, &meta).await?;
        }
        let built = self.fill_base(&tmp, spec).await;
        let mut slot = self.admin_slot().await;
        let admin = self.admin_client(&mut slot).await?;
        if let Err(e) = built {
            let _ = drop_db(admin, &tmp).await;
            return Err(e);
        }
        let renamed = self
            .exec_busy(
                admin,
                &format!(
                    "ALTER DATABASE {} RENAME TO {}",
                    quote_ident(&tmp),
                    quote_ident(&name)
                ),
                "renaming the new base",
            )
            .await;
        match renamed {
            Ok(()) => {}
            Err(e) if matches!(e.sqlstate(), Some("42P04" | "23505")) => {
                // Another provider built the same base first: use theirs once it is sealed.
                let _ = drop_db(admin, &tmp).await;
                let deadline = Instant::now() + self.opts.busy_timeout;
                while !is_template(admin, &name).await? {
                    if Instant::now() >= deadline {
                        return Err(Error::TemplateBusy(format!(
                            "base {name} was built elsewhere but never sealed"
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                return Ok(base);
            }
            Err(e) => {
                let _ = drop_db(admin, &tmp).await;
                return Err(e);
            }
        }
        let q = quote_ident(&name);
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {q} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false; \
                 REVOKE CONNECT, TEMPORARY ON DATABASE {q} FROM PUBLIC"
            ))
            .await
            .map_err(|e| Error::from_pg("sealing the base template", &e))?;
        info!(base = %name, migrations = spec.migrations.len(), "base template built");
        if let Err(e) = self.prune_templates(admin, &name).await {
            warn!(error = %e, "pruning old base templates");
        }
        Ok(base)
    }

    /// Applies the migrations and fixtures to the base being built (as the owner role).
    async fn fill_base(&self, db: &str, spec: &BaseSpec) -> Result<()> {
        let mut c = connect_config(&self.admin_cfg(db), self.target.admin_ssl).await?;
        let owner = quote_ident(&self.opts.owner_role);
        if !self.target.manage_parent {
            let sql = if self.is_super {
                format!("ALTER SCHEMA public OWNER TO {owner}")
            } else {
                format!("GRANT USAGE, CREATE ON SCHEMA public TO {owner}")
            };
            if let Err(e) = c.batch_execute(&sql).await {
                warn!(error = %e, "could not give the base's public schema to the owner role");
            }
        }
        c.batch_execute(&format!("SET ROLE {owner}"))
            .await
            .map_err(|e| Error::from_pg("switching to the owner role", &e))?;
        migrate::apply(&mut c, &spec.migrations).await?;
        for (i, fx) in spec.fixtures.iter().enumerate() {
            c.batch_execute(fx).await.map_err(|e| Error::Migration {
                version: format!("fixture #{}", i + 1),
                detail: e
                    .as_db_error()
                    .map(|d| d.message().to_string())
                    .unwrap_or_else(|| e.to_string()),
            })?;
        }
        Ok(())
    }

    async fn prune_templates(&self, admin: &Client, keep: &str) -> Result<()> {
        let rows = admin
            .query(
                "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database \
                 WHERE datistemplate AND datname LIKE 'consorttpl\\_%'",
                &[],
            )
            .await
            .map_err(|e| Error::from_pg("listing base templates", &e))?;
        let mut ours: Vec<(u64, String)> = rows
            .iter()
            .filter_map(|r| {
                let name: String = r.get(0);
                let meta = Meta::parse(r.get::<_, Option<&str>>(1))?;
                (name != keep).then_some((meta.created, name))
            })
            .collect();
        ours.sort_by_key(|o| std::cmp::Reverse(o.0));
        let recent = unix_now().saturating_sub(600);
        for (created, name) in ours
            .into_iter()
            .skip(self.opts.max_templates.saturating_sub(1))
        {
            if created > recent {
                continue;
            }
            let q = quote_ident(&name);
            let res = admin
                .batch_execute(&format!("ALTER DATABASE {q} WITH IS_TEMPLATE false"))
                .await;
            if res.is_ok() {
                let _ = drop_db(admin, &name).await;
                debug!(template = %name, "old base template dropped");
            }
        }
        Ok(())
    }

    pub async fn create(&self, name: &str, from: &BaseRef) -> Result<Branch> {
        validate_branch_name(name)?;
        if !from.id.starts_with(TEMPLATE_PREFIX) {
            return Err(Error::InvalidName(format!(
                "{:?} is not a base of this provider",
                from.id
            )));
        }
        let ident = db_ident(name);
        let q = quote_ident(&ident);
        let password = random_password();
        let verifier = crate::scram::verifier(password.as_bytes(), crate::scram::BRANCH_ITERATIONS);
        let meta = Meta::now(Some(from));
        let created_at = meta.created_at();
        {
            let mut slot = self.admin_slot().await;
            let admin = self.admin_client(&mut slot).await?;
            // A non-superuser administrator must be a member of the role to give it a database.
            let membership = if self.is_super {
                String::new()
            } else {
                format!(" GRANT {q} TO CURRENT_USER;")
            };
            let create_role = format!(
                "BEGIN; CREATE ROLE {q} LOGIN PASSWORD {} IN ROLE {}; COMMENT ON ROLE {q} IS {};{membership} COMMIT",
                quote_literal(&verifier),
                quote_ident(&self.opts.owner_role),
                quote_literal(&meta.text())
            );
            if let Err(e) = admin.batch_execute(&create_role).await {
                let _ = admin.batch_execute("ROLLBACK").await;
                return Err(if is_dup(&e) {
                    Error::AlreadyExists(format!("branch {name}"))
                } else {
                    Error::from_pg(format!("creating the role of {name}"), &e)
                });
            }
            let made = self
                .exec_busy(
                    admin,
                    &format!(
                        "CREATE DATABASE {q} OWNER {q} TEMPLATE {} STRATEGY FILE_COPY",
                        quote_ident(&from.id)
                    ),
                    "creating a branch",
                )
                .await;
            if let Err(e) = made {
                let _ = admin
                    .batch_execute(&format!("DROP ROLE IF EXISTS {q}"))
                    .await;
                return Err(match e.sqlstate() {
                    Some("42P04") => Error::AlreadyExists(format!("branch {name}")),
                    Some("3D000") => Error::NotFound(format!("base {}", from.id)),
                    _ => e,
                });
            }
            admin
                .batch_execute(&format!(
                    "REVOKE CONNECT, TEMPORARY ON DATABASE {q} FROM PUBLIC; COMMENT ON DATABASE {q} IS {}",
                    quote_literal(&meta.text())
                ))
                .await
                .map_err(|e| Error::from_pg("restricting the branch", &e))?;
        }
        let secret = Secret::new(password);
        self.secrets
            .lock()
            .map_err(|_| Error::Other("secret store poisoned".into()))?
            .insert(name.to_string(), secret.clone());
        let branch = Branch {
            name: name.to_string(),
            id: ident,
            base: from.clone(),
            created_at,
        };
        self.wait_login(&branch).await?;
        Ok(branch)
    }

    /// Returns when the branch role can log in over the branch endpoint.
    async fn wait_login(&self, branch: &Branch) -> Result<()> {
        let info = self.connect_info(branch).await?;
        let deadline = Instant::now() + self.opts.login_timeout;
        loop {
            match crate::pgconn::connect(&info).await {
                Ok(_c) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(Error::Timeout(format!(
                        "branch {} did not accept logins: {e}",
                        branch.name
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    pub async fn connect_info(&self, branch: &Branch) -> Result<ConnectInfo> {
        let known = self
            .secrets
            .lock()
            .map_err(|_| Error::Other("secret store poisoned".into()))?
            .get(&branch.name)
            .cloned();
        let secret = match known {
            Some(s) => s,
            None => {
                // A branch made by an earlier process: give its role a new password.
                validate_branch_name(&branch.name)?;
                let ident = db_ident(&branch.name);
                let password = random_password();
                let verifier =
                    crate::scram::verifier(password.as_bytes(), crate::scram::BRANCH_ITERATIONS);
                let mut slot = self.admin_slot().await;
                let admin = self.admin_client(&mut slot).await?;
                if role_meta(admin, &ident).await?.is_none() {
                    return Err(Error::NotFound(format!("branch {}", branch.name)));
                }
                admin
                    .batch_execute(&format!(
                        "ALTER ROLE {} PASSWORD {}",
                        quote_ident(&ident),
                        quote_literal(&verifier)
                    ))
                    .await
                    .map_err(|e| Error::from_pg("renewing a branch password", &e))?;
                let s = Secret::new(password);
                self.secrets
                    .lock()
                    .map_err(|_| Error::Other("secret store poisoned".into()))?
                    .insert(branch.name.clone(), s.clone());
                s
            }
        };
        let ident = db_ident(&branch.name);
        Ok(ConnectInfo {
            host: self.target.branch_host.clone(),
            port: self.target.branch_port,
            database: ident.clone(),
            user: ident,
            secret,
            expires_at: None,
            sslmode: self.target.branch_ssl,
        })
    }

    pub async fn reset(&self, branch: &Branch) -> Result<Branch> {
        validate_branch_name(&branch.name)?;
        let ident = db_ident(&branch.name);
        let q = quote_ident(&ident);
        let meta = Meta::now(Some(&branch.base));
        {
            let mut slot = self.admin_slot().await;
            let admin = self.admin_client(&mut slot).await?;
            if db_meta(admin, &ident).await?.is_none() {
                return Err(Error::NotFound(format!("branch {}", branch.name)));
            }
            drop_db(admin, &ident).await?;
            self.exec_busy(
                admin,
                &format!(
                    "CREATE DATABASE {q} OWNER {q} TEMPLATE {} STRATEGY FILE_COPY",
                    quote_ident(&branch.base.id)
                ),
                "re-creating a branch",
            )
            .await?;
            admin
                .batch_execute(&format!(
                    "REVOKE CONNECT, TEMPORARY ON DATABASE {q} FROM PUBLIC; COMMENT ON DATABASE {q} IS {}",
                    quote_literal(&meta.text())
                ))
                .await
                .map_err(|e| Error::from_pg("restricting the branch", &e))?;
        }
        let fresh = Branch {
            created_at: meta.created_at(),
            ..branch.clone()
        };
        self.wait_login(&fresh).await?;
        Ok(fresh)
    }

    pub async fn delete(&self, name: &str) -> Result<()> {
        validate_branch_name(name)?;
        let ident = db_ident(name);
        let mut slot = self.admin_slot().await;
        let admin = self.admin_client(&mut slot).await?;
        self.delete_ident(admin, &ident).await?;
        if let Ok(mut s) = self.secrets.lock() {
            s.remove(name);
        }
        Ok(())
    }

    async fn delete_ident(&self, admin: &Client, ident: &str) -> Result<()> {
        match db_lookup(admin, ident).await? {
            None => {}
            Some(None) => {
                return Err(Error::PermissionDenied(format!(
                    "database {ident} was not created by Consort; not touching it"
                )));
            }
            Some(Some(_)) => drop_db(admin, ident).await?,
        }
        if role_meta(admin, ident).await?.is_some() {
            admin
                .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(ident)))
                .await
                .map_err(|e| Error::from_pg(format!("dropping role {ident}"), &e))?;
        }
        Ok(())
    }

    async fn list_meta(&self, admin: &Client) -> Result<Vec<(Branch, Meta)>> {
        let rows = admin
            .query(
                "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database \
                 WHERE NOT datistemplate AND datname LIKE 'consort\\_%'",
                &[],
            )
            .await
            .map_err(|e| Error::from_pg("listing branches", &e))?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let db: String = r.get(0);
                let name = branch_of_db(&db)?;
                let meta = Meta::parse(r.get::<_, Option<&str>>(1))?;
                let key = meta.key.as_deref()?.parse().ok()?;
                let branch = Branch {
                    name,
                    id: db,
                    base: BaseRef {
                        id: meta.base.clone()?,
                        key,
                    },
                    created_at: meta.created_at(),
                };
                Some((branch, meta))
            })
            .collect())
    }

    pub async fn list(&self, prefix: &str) -> Result<Vec<Branch>> {
        let mut slot = self.admin_slot().await;
        let admin = self.admin_client(&mut slot).await?;
        let mut out: Vec<Branch> = self
            .list_meta(admin)
            .await?
            .into_iter()
            .map(|(b, _)| b)
            .filter(|b| b.name.starts_with(prefix))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub async fn sweep(&self, older_than: Duration) -> Result<usize> {
        let cutoff = SystemTime::now()
            .checked_sub(older_than)
            .unwrap_or(UNIX_EPOCH);
        self.sweep_where(|b, _| b.created_at <= cutoff).await
    }

    pub async fn sweep_orphans(&self) -> Result<usize> {
        let now = unix_now();
        let max_age = self.opts.orphan_max_age.as_secs();
        self.sweep_where(|_, m| match m.kept_until {
            Some(until) => until <= now,
            None => m.owner_gone() || now.saturating_sub(m.created) >= max_age,
        })
        .await
    }

    async fn sweep_where(&self, doomed: impl Fn(&Branch, &Meta) -> bool) -> Result<usize> {
        let mut slot = self.admin_slot().await;
        let admin = self.admin_client(&mut slot).await?;
        let mut n = 0;
        for (branch, meta) in self.list_meta(admin).await? {
            if branch.name.starts_with(BRANCH_PREFIX) && doomed(&branch, &meta) {
                match self.delete_ident(admin, &branch.id).await {
                    Ok(()) => n += 1,
                    Err(e) => warn!(branch = %branch.name, error = %e, "sweeping a branch"),
                }
            }
        }
        // Roles left without a database (a create interrupted), and bases never finished.
        let roles = admin
            .query(
                "SELECT r.rolname, shobj_description(r.oid, 'pg_authid') FROM pg_roles r \
                 WHERE r.rolname LIKE 'consort\\_%' \
                 AND NOT EXISTS (SELECT 1 FROM pg_database d WHERE d.datname = r.rolname)",
                &[],
            )
            .await
            .map_err(|e| Error::from_pg("listing branch roles", &e))?;
        for r in roles {
            let role: String = r.get(0);
            if let Some(meta) = Meta::parse(r.get::<_, Option<&str>>(1))
                && branch_of_db(&role).is_some()
                && meta.owner_gone()
            {
                let _ = admin
                    .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(&role)))
                    .await;
            }
        }
        let building = admin
            .query(
                "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database \
                 WHERE datname LIKE 'consorttmp\\_%'",
                &[],
            )
            .await
            .map_err(|e| Error::from_pg("listing unfinished bases", &e))?;
        for r in building {
            let db: String = r.get(0);
            if Meta::parse(r.get::<_, Option<&str>>(1)).is_some_and(|m| m.owner_gone()) {
                let _ = drop_db(admin, &db).await;
            }
        }
        if n > 0 {
            info!(swept = n, "swept branches");
        }
        Ok(n)
    }

    pub async fn keep_for_inspection(&self, branch: &Branch, until: SystemTime) -> Result<()> {
        validate_branch_name(&branch.name)?;
        let ident = db_ident(&branch.name);
        let mut slot = self.admin_slot().await;
        let admin = self.admin_client(&mut slot).await?;
        let mut meta = db_meta(admin, &ident)
            .await?
            .ok_or_else(|| Error::NotFound(format!("branch {}", branch.name)))?;
        meta.kept_until = Some(
            until
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        );
        comment_db(admin, &ident, &meta.text()).await
    }

    pub async fn promote(&self, migrations: &[Migration]) -> Result<PromoteOutcome> {
        migrate::check_plan(migrations)?;
        let parent = self.target.parent.clone();
        let mut c = connect_config(&self.admin_cfg(&parent), self.target.admin_ssl).await?;
        let owner = quote_ident(&self.opts.owner_role);
        if !self.target.manage_parent {
            // Promote is the one sanctioned change to a parent Consort did not create.
            let _ = c
                .batch_execute(&format!("GRANT USAGE, CREATE ON SCHEMA public TO {owner}"))
                .await;
        }
        c.batch_execute(&format!("SET ROLE {owner}"))
            .await
            .map_err(|e| Error::from_pg("switching to the owner role", &e))?;
        let (report, outcome) = migrate::apply_partial(&mut c, migrations).await;
        let failure = match outcome {
            Ok(()) => None,
            Err(e @ (Error::Migration { .. } | Error::ChecksumMismatch { .. })) => {
                warn!(parent = %parent, error = %e, "promote stopped");
                Some(e.to_string())
            }
            Err(e) => return Err(e),
        };
        let verified = failure.is_none() && migrate::verify(&c, migrations).await?;
        info!(parent = %parent, applied = report.applied.len(), verified, "promoted migrations");
        Ok(PromoteOutcome {
            target: parent,
            applied: report.applied,
            already_applied: report.already_applied,
            verified,
            failure,
        })
    }
}

async fn db_exists(admin: &Client, db: &str) -> Result<bool> {
    Ok(admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
        .await
        .map_err(|e| Error::from_pg("looking up a database", &e))?
        .is_some())
}

async fn is_template(admin: &Client, db: &str) -> Result<bool> {
    Ok(admin
        .query_opt(
            "SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate",
            &[&db],
        )
        .await
        .map_err(|e| Error::from_pg("looking up a base", &e))?
        .is_some())
}

async fn db_meta(admin: &Client, db: &str) -> Result<Option<Meta>> {
    Ok(db_lookup(admin, db).await?.flatten())
}

/// In one round trip: `None` when `db` does not exist, else its marker (`None` when it is not
/// one of ours).
async fn db_lookup(admin: &Client, db: &str) -> Result<Option<Option<Meta>>> {
    let row = admin
        .query_opt(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1",
            &[&db],
        )
        .await
        .map_err(|e| Error::from_pg("reading a database marker", &e))?;
    Ok(row.map(|r| Meta::parse(r.get::<_, Option<&str>>(0))))
}

async fn role_meta(admin: &Client, role: &str) -> Result<Option<Meta>> {
    let row = admin
        .query_opt(
            "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = $1",
            &[&role],
        )
        .await
        .map_err(|e| Error::from_pg("reading a role marker", &e))?;
    Ok(row.and_then(|r| Meta::parse(r.get::<_, Option<&str>>(0))))
}

async fn comment_db(admin: &Client, db: &str, text: &str) -> Result<()> {
    admin
        .batch_execute(&format!(
            "COMMENT ON DATABASE {} IS {}",
            quote_ident(db),
            quote_literal(text)
        ))
        .await
        .map_err(|e| Error::from_pg("marking a database", &e))
}

/// Ends every session on `db` and waits (briefly) until their backends are gone.
///
/// `DROP DATABASE … WITH (FORCE)` signals the sessions it finds and then re-checks every
/// **100 ms** until they have exited (PostgreSQL's `CountOtherDBBackends`). A session that
/// has just disconnected — the login probe of `create`, a test runner's `psql` that has just
/// exited — is usually still exiting when the branch is dropped, so every drop paid that
/// 100 ms sleep. Terminating first and polling at 1 ms gets the same result in a few
/// milliseconds; `FORCE` stays as the backstop.
async fn end_sessions(admin: &Client, db: &str) -> Result<()> {
    let signalled: i64 = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&db],
        )
        .await
        .map_err(|e| Error::from_pg(format!("ending the sessions on {db}"), &e))?
        .get(0);
    if signalled == 0 {
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                &[&db],
            )
            .await
            .map_err(|e| Error::from_pg(format!("ending the sessions on {db}"), &e))?
            .get(0);
        if left == 0 {
            break;
        }
    }
    Ok(())
}

async fn drop_db(admin: &Client, db: &str) -> Result<()> {
    end_sessions(admin, db).await?;
    admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quote_ident(db)
        ))
        .await
        .map_err(|e| Error::from_pg(format!("dropping database {db}"), &e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::{EmbeddedConfig, EmbeddedPostgres};
    use crate::names::BranchNamer;
    use crate::pgconn::config_of;

    async fn brancher() -> (std::sync::Arc<crate::EmbeddedCluster>, PgBrancher) {
        let cluster = EmbeddedPostgres::start(EmbeddedConfig::temporary())
            .await
            .expect("cluster");
        let target = ServerTarget {
            kind: "embedded",
            admin: config_of(&cluster.admin_info("postgres")),
            admin_ssl: SslMode::Disable,
            parent: "consort".into(),
            branch_host: "127.0.0.1".into(),
            branch_port: cluster.port(),
            branch_ssl: SslMode::Disable,
            manage_parent: true,
        };
        let b = PgBrancher::init(target, ServerOptions::default())
            .await
            .expect("init");
        (cluster, b)
    }

    #[tokio::test]
    async fn a_session_on_the_parent_is_waited_out() {
        let (cluster, b) = brancher().await;
        // Someone sits on the parent: copying it fails with 55006 until they leave.
        let holder = crate::pgconn::connect(&cluster.admin_info("consort"))
            .await
            .expect("hold the parent");
        let spec = BaseSpec {
            migrations: vec![Migration {
                version: "0001".into(),
                story_id: "S1".into(),
                description: String::new(),
                sql: "CREATE TABLE t (x int)".into(),
            }],
            fixtures: vec![],
        };
        let release = async {
            while b.busy_retries() == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            drop(holder);
        };
        let (base, ()) = tokio::join!(b.prepare_base(&spec), release);
        let base = base.expect("the base is built once the parent is free");
        assert!(b.busy_retries() > 0);
        let branch = b
            .create(&BranchNamer::new().next_name(), &base)
            .await
            .expect("branch");
        b.delete(&branch.name).await.expect("delete");
    }

    #[tokio::test]
    async fn a_branch_with_open_sessions_is_dropped_and_its_sessions_ended() {
        let (_cluster, b) = brancher().await;
        let base = b.prepare_base(&BaseSpec::default()).await.expect("base");
        let branch = b
            .create(&BranchNamer::new().next_name(), &base)
            .await
            .expect("branch");
        let info = b.connect_info(&branch).await.expect("info");
        let held = crate::pgconn::connect(&info).await.expect("a session");
        held.batch_execute("SELECT 1").await.expect("in use");
        b.delete(&branch.name)
            .await
            .expect("dropped although in use");
        assert!(
            held.batch_execute("SELECT 1").await.is_err(),
            "the session was ended"
        );
        let mut slot = b.admin_slot().await;
        let admin = b.admin_client(&mut slot).await.expect("admin");
        assert!(!db_exists(admin, &branch.id).await.expect("lookup"));
        let sessions: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                &[&branch.id],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(sessions, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn branches_are_created_and_dropped_concurrently_over_several_connections() {
        let (_cluster, b) = brancher().await;
        let b = std::sync::Arc::new(b);
        let base = b.prepare_base(&BaseSpec::default()).await.expect("base");
        let namer = std::sync::Arc::new(BranchNamer::new());
        let tasks: Vec<_> = (0..12)
            .map(|_| {
                let (b, base, namer) = (b.clone(), base.clone(), namer.clone());
                tokio::spawn(async move {
                    let branch = b.create(&namer.next_name(), &base).await?;
                    b.delete(&branch.name).await
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task").expect("create and delete");
        }
        assert!(b.list(BRANCH_PREFIX).await.expect("list").is_empty());
        let opened = {
            let mut n = 0;
            for slot in &b.admin {
                n += usize::from(slot.lock().await.is_some());
            }
            n
        };
        assert!(
            (1..=ADMIN_CONNECTIONS).contains(&opened),
            "{opened} administrator connections"
        );
    }

    #[tokio::test]
    async fn orphans_of_dead_processes_are_swept_and_others_are_kept() {
        let (cluster, b) = brancher().await;
        let base = b.prepare_base(&BaseSpec::default()).await.expect("base");
        let namer = BranchNamer::new();
        let mine = b.create(&namer.next_name(), &base).await.expect("mine");
        let dead = b.create(&namer.next_name(), &base).await.expect("dead");
        let kept = b.create(&namer.next_name(), &base).await.expect("kept");
        let expired = b.create(&namer.next_name(), &base).await.expect("expired");
        // Give `dead` the marker of a process that has exited.
        let mut gone = std::process::Command::new("true").spawn().expect("spawn");
        let gone_pid = gone.id();
        gone.wait().expect("reap");
        let admin = crate::pgconn::connect(&cluster.admin_info("postgres"))
            .await
            .expect("admin");
        let mut meta = db_meta(&admin, &dead.id)
            .await
            .expect("meta")
            .expect("marked");
        meta.pid = gone_pid;
        comment_db(&admin, &dead.id, &meta.text())
            .await
            .expect("re-mark");
        // `kept` is kept for an hour, `expired` was kept until a minute ago.
        b.keep_for_inspection(&kept, SystemTime::now() + Duration::from_secs(3600))
            .await
            .expect("keep");
        b.keep_for_inspection(&expired, SystemTime::now() - Duration::from_secs(60))
            .await
            .expect("keep");
        // A database with the prefix that Consort did not make is never touched.
        admin
            .batch_execute("CREATE DATABASE consort_foreign_1")
            .await
            .expect("foreign db");
        let swept = b.sweep_orphans().await.expect("sweep");
        assert_eq!(swept, 2);
        let left: Vec<String> = b
            .list(BRANCH_PREFIX)
            .await
            .expect("list")
            .into_iter()
            .map(|x| x.name)
            .collect();
        assert_eq!(left, vec![mine.name.clone(), kept.name.clone()]);
        assert!(
            db_exists(&admin, "consort_foreign_1")
                .await
                .expect("exists")
        );
        assert!(matches!(
            b.delete("consort-foreign-1").await,
            Err(Error::PermissionDenied(_))
        ));
        // sweep(older_than = 0) removes every Consort branch, still nothing foreign.
        assert_eq!(b.sweep(Duration::ZERO).await.expect("sweep all"), 2);
        assert!(b.list(BRANCH_PREFIX).await.expect("list").is_empty());
        assert!(
            db_exists(&admin, "consort_foreign_1")
                .await
                .expect("exists")
        );
        let roles: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'consort\\_%'",
                &[],
            )
            .await
            .expect("roles")
            .get(0);
        assert_eq!(roles, 0, "branch roles are dropped with their branches");
    }
}
