//! The embedded PostgreSQL cluster: `initdb`, start, reuse, stop, and the owner watchdog.
//!
//! Layout of a cluster directory `D`:
//!
//! | path | what |
//! |---|---|
//! | `D/data/` | the data directory (`PGDATA`) |
//! | `D/admin.pw` | the bootstrap superuser's random password (mode 0600) |
//! | `D/run/` | the Unix socket directory (or `/tmp/consort-sock-<hash>/` when `D` is long) |
//! | `D/postgres.log` | the server's output |
//! | `D/start.lock`, `D/owner` | one start at a time, and who owns the server (see `owner.rs`) |
//! | `D/requested` | in a fallback directory only: the directory it stands in for (see [`fallback_dir`]) |
//!
//! **No orphans.** The server is stopped when the last [`Arc<EmbeddedCluster>`] is dropped
//! (and by [`EmbeddedCluster::stop`]). Because a killed process runs no destructors (and
//! statics are never dropped), every started server also gets a *watchdog*: a tiny `sh`
//! process whose standard input is a pipe from this process. When this process ends for any
//! reason the pipe closes, and the watchdog stops the server (and deletes a temporary cluster
//! directory). Server and watchdog run in their own process groups, so a terminal's Ctrl-C
//! reaches only this process and the watchdog still cleans up.
//!
//! **Reuse.** Starting a cluster for a directory whose server is already running returns the
//! same handle within this process; a server started by another process that is alive is
//! attached to (and left running on drop: its owner stops it).
//!
//! **Resume.** A server whose owner has ended — killed during the server's start-up, during a
//! run, or before its watchdog was started — is stopped (or, when it is already going down,
//! waited for) before a new one starts, and a start that `postgres` refuses because the data
//! directory is still held (lock file, shared memory) is tried again, a bounded number of
//! times. Starts of one kept directory are one at a time across processes.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

use super::owner::{self, Holder, StartLock};
use super::runas::{RunAs, fallback_dir};
use crate::error::{ClusterError, Error, Result};
use crate::names::random_tag;
use crate::pgbin::{PgBinaries, PostgresSource};
use crate::procinfo;
use crate::provider::{ConnectInfo, Secret, SslMode};

/// How to get an embedded cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedConfig {
    /// The cluster directory; `None` makes a fresh temporary one, deleted when the cluster stops.
    /// When this process is root and the server user cannot reach the directory (a `0700`
    /// ancestor such as `/root`), the cluster lives in `/tmp/consort-pg-<hash of the path>`
    /// instead (see [`EmbeddedCluster::dir`]).
    pub dir: Option<PathBuf>,
    /// The unprivileged OS user the server runs as when this process is root.
    pub run_as: String,
    /// Which PostgreSQL runs it: an installed one, a directory, or Consort's own (fetched
    /// once per user).
    pub postgres: PostgresSource,
    /// The bootstrap superuser's name (its password is random and never leaves the provider).
    pub superuser: String,
    /// How long start-up may take.
    pub start_timeout: Duration,
    /// Extra server settings (`-c name=value`).
    pub settings: Vec<(String, String)>,
    /// Whether a kept cluster makes its branch databases in memory (a tablespace on a tmpfs,
    /// where the machine has one for it; see [`EmbeddedCluster::branch_space`]). Default
    /// `true`.
    pub branches_in_memory: bool,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        EmbeddedConfig {
            dir: None,
            run_as: "postgres".into(),
            postgres: PostgresSource::Auto,
            superuser: "consortadmin".into(),
            start_timeout: Duration::from_secs(60),
            settings: Vec::new(),
            branches_in_memory: true,
        }
    }
}

impl EmbeddedConfig {
    /// A throw-away cluster in a temporary directory.
    pub fn temporary() -> Self {
        Self::default()
    }

    /// The project's cluster, in `<project>/.consort/pg/`.
    pub fn for_project(project_dir: &Path) -> Self {
        Self::at(project_dir.join(".consort").join("pg"))
    }

    /// A cluster in `dir` (kept between runs).
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        EmbeddedConfig {
            dir: Some(dir.into()),
            ..Self::default()
        }
    }
}

/// Starts embedded clusters.
#[derive(Debug)]
pub struct EmbeddedPostgres;

/// Per-directory registry, so one process shares one running cluster per directory.
type Registry = Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<Weak<EmbeddedCluster>>>>>;
static REGISTRY: LazyLock<Registry> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The processes of a server this process started.
#[derive(Debug)]
struct Owned {
    postmaster: Child,
    watchdog: Child,
    /// Kept open: when it closes (this process ends) the watchdog stops the server.
    _lifeline: Option<ChildStdin>,
}

/// A running PostgreSQL cluster. Dropping the last `Arc` stops a server this process started.
#[derive(Debug)]
pub struct EmbeddedCluster {
    dir: PathBuf,
    requested: Option<PathBuf>,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    port: u16,
    superuser: String,
    password: Secret,
    bins: PgBinaries,
    run_as: Option<RunAs>,
    temporary: bool,
    pid: u32,
    owned: Mutex<Option<Owned>>,
    /// Where the cluster makes its branches in memory, when it does.
    branch_space: Option<PathBuf>,
}

impl EmbeddedPostgres {
    /// Starts (or reuses) a cluster as configured.
    pub async fn start(cfg: EmbeddedConfig) -> Result<Arc<EmbeddedCluster>> {
        let bins = cfg.postgres.binaries().await?;
        let run_as = RunAs::for_current_process(&cfg.run_as)?;
        let (dir, requested, temporary) = match &cfg.dir {
            None => (make_temp_dir(run_as.as_ref())?, None, true),
            Some(d) => {
                let abs = std::path::absolute(d)
                    .map_err(|e| Error::cluster_io(format!("resolve {}", d.display()), e))?;
                let dir = match &run_as {
                    Some(ra) if !ra.can_reach(&abs) => {
                        let fb = fallback_dir(&abs);
                        info!(
                            requested = %abs.display(),
                            used = %fb.display(),
                            user = %ra.name,
                            "the server user cannot reach the requested cluster directory; using a reachable one"
                        );
                        fb
                    }
                    _ => abs.clone(),
                };
                (dir, Some(abs), false)
            }
        };
        let slot = {
            let mut reg = REGISTRY.lock().map_err(|_| ClusterError::Poisoned {
                what: "cluster registry",
            })?;
            reg.entry(dir.clone()).or_default().clone()
        };
        let mut guard = slot.lock().await;
        if let Some(live) = guard.upgrade()
            && live.is_running()
        {
            debug!(dir = %dir.display(), "reusing the running cluster");
            return Ok(live);
        }
        let cluster = Arc::new(start_cluster(&cfg, bins, run_as, dir, requested, temporary).await?);
        *guard = Arc::downgrade(&cluster);
        Ok(cluster)
    }
}

impl EmbeddedPostgres {
    /// Stops every server this process started that is still running (as a program ending on
    /// a signal does before it exits; holders of their handles lose the servers too). Returns
    /// how many were stopped. A start under way (its registry slot busy) is left to finish or
    /// be dropped.
    pub fn stop_all_owned() -> usize {
        let slots: Vec<_> = match REGISTRY.lock() {
            Ok(reg) => reg.values().cloned().collect(),
            Err(p) => p.into_inner().values().cloned().collect(),
        };
        let mut stopped = 0;
        for slot in slots {
            let Ok(weak) = slot.try_lock() else { continue };
            if let Some(cluster) = weak.upgrade()
                && cluster.is_owned()
            {
                cluster.stop_inner(cluster.temporary);
                stopped += 1;
            }
        }
        stopped
    }
}

impl EmbeddedCluster {
    /// Where this cluster makes its branch databases in memory (a tablespace on a tmpfs), or
    /// `None`: on disk with the rest of the cluster. Only kept clusters do (see the module
    /// `branch_space`).
    pub fn branch_space(&self) -> Option<&Path> {
        self.branch_space.as_deref()
    }

    /// The cluster directory actually used (may differ from the requested one, see
    /// [`EmbeddedConfig::dir`]).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory that was asked for, when one was.
    pub fn requested_dir(&self) -> Option<&Path> {
        self.requested.as_deref()
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The Unix socket directory.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The loopback TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The bootstrap superuser's name.
    pub fn superuser(&self) -> &str {
        &self.superuser
    }

    /// The postmaster's pid.
    pub fn postmaster_pid(&self) -> u32 {
        self.pid
    }

    /// Whether this process started the server (and so stops it).
    pub fn is_owned(&self) -> bool {
        self.owned
            .lock()
            // Whether we own the server does not change because a panic held the lock.
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
    }

    /// Whether the server process is alive.
    pub fn is_running(&self) -> bool {
        procinfo::alive(self.pid)
    }

    /// Where the programs are.
    pub fn binaries(&self) -> &PgBinaries {
        &self.bins
    }

    /// The OS user the server runs as, when not the current one.
    pub fn run_as(&self) -> Option<&RunAs> {
        self.run_as.as_ref()
    }

    /// Superuser connection details over the Unix socket. Crate-private: the superuser's
    /// credentials never leave the providers.
    pub(crate) fn admin_info(&self, database: &str) -> ConnectInfo {
        ConnectInfo {
            host: self.socket_dir.display().to_string(),
            port: self.port,
            database: database.to_string(),
            user: self.superuser.clone(),
            secret: self.password.clone(),
            expires_at: None,
            sslmode: SslMode::Disable,
            ca_file: None,
        }
    }

    /// Stops a server this process started (idempotent; also done on drop). Other holders of
    /// the handle lose the server too.
    pub fn stop(&self) -> Result<()> {
        if self.owned.is_poisoned() {
            return Err(ClusterError::Poisoned {
                what: "cluster state",
            }
            .into());
        }
        self.stop_inner(self.temporary);
        Ok(())
    }

    fn stop_inner(&self, remove_dir: bool) {
        let owned = self
            .owned
            .lock()
            .map(|mut o| o.take())
            .unwrap_or_else(|p| p.into_inner().take());
        let Some(mut owned) = owned else {
            return;
        };
        // The watchdog first, so it can never signal a reused pid later.
        let _ = owned.watchdog.kill();
        let _ = owned.watchdog.wait();
        drop(owned._lifeline.take());
        let pid = Pid::from_raw(self.pid as i32);
        let (first, patience) = if self.temporary {
            (Signal::SIGQUIT, Duration::from_secs(5))
        } else {
            (Signal::SIGINT, Duration::from_secs(20))
        };
        let _ = kill(pid, first);
        if !wait_child(&mut owned.postmaster, patience) {
            warn!(
                pid = self.pid,
                "postmaster did not stop in time; killing it"
            );
            let _ = kill(pid, Signal::SIGQUIT);
            if !wait_child(&mut owned.postmaster, Duration::from_secs(5)) {
                let _ = owned.postmaster.kill();
                let _ = owned.postmaster.wait();
            }
        }
        if remove_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        if !self.socket_dir.starts_with(&self.dir) {
            let _ = std::fs::remove_dir_all(&self.socket_dir);
        }
        debug!(dir = %self.dir.display(), "embedded cluster stopped");
    }
}

impl Drop for EmbeddedCluster {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            warn!(error = %consort_actors::error_chain(&e), "stopping the embedded cluster");
        }
    }
}

fn wait_child(child: &mut Child, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() >= deadline => return false,
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn make_temp_dir(run_as: Option<&RunAs>) -> Result<PathBuf> {
    let dir = PathBuf::from("/tmp").join(format!("consort-pg-tmp-{}", random_tag(12)));
    std::fs::create_dir(&dir)
        .map_err(|e| Error::cluster_io(format!("create {}", dir.display()), e))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| Error::cluster_io(format!("chmod {}", dir.display()), e))?;
    if let Some(ra) = run_as {
        ra.chown(&dir)?;
    }
    Ok(dir)
}

fn socket_dir_for(dir: &Path) -> PathBuf {
    let local = dir.join("run");
    // sun_path holds 107 bytes; the socket file is `.s.PGSQL.NNNNN` inside the directory.
    if local.as_os_str().len() + 16 < 100 {
        local
    } else {
        let digest = Sha256::digest(dir.to_string_lossy().as_bytes());
        PathBuf::from("/tmp").join(format!("consort-sock-{}", &hex::encode(digest)[..16]))
    }
}

fn ensure_dir(path: &Path, run_as: Option<&RunAs>, mode: u32) -> Result<()> {
    std::fs::create_dir_all(path)
        .map_err(|e| Error::cluster_io(format!("create {}", path.display()), e))?;
    refuse_planted(path, run_as)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::cluster_io(format!("chmod {}", path.display()), e))?;
    if let Some(ra) = run_as {
        ra.chown(path)?;
    }
    Ok(())
}

/// In a directory anyone may write to (`/tmp`, where fallback and socket directories live),
/// the name Consort uses may have been taken before it: by a link to elsewhere, which the chmod
/// and chown that follow would follow, or by a directory someone else owns. Either is refused.
/// Elsewhere (a project's own `data_dir`) a link is its owner's choice and is followed.
fn refuse_planted(path: &Path, run_as: Option<&RunAs>) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let open_to_all = path
        .parent()
        .and_then(|p| std::fs::metadata(p).ok())
        .is_some_and(|m| m.mode() & 0o002 != 0);
    if !open_to_all {
        return Ok(());
    }
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| Error::cluster_io(format!("inspect {}", path.display()), e))?;
    let ours = meta.uid() == nix::unistd::geteuid().as_raw()
        || run_as.is_some_and(|ra| meta.uid() == ra.uid);
    let what = if meta.file_type().is_symlink() {
        "a link"
    } else if !meta.is_dir() {
        "not a directory"
    } else if !ours {
        "a directory someone else owns"
    } else {
        return Ok(());
    };
    Err(Error::PermissionDenied(format!(
        "{} is {what}, made in a directory anyone may write to before Consort made it; Consort does not use it: remove it, or find who made it",
        path.display()
    )))
}

pub(super) fn write_private(path: &Path, content: &str, run_as: Option<&RunAs>) -> Result<()> {
    std::fs::write(path, content)
        .map_err(|e| Error::cluster_io(format!("write {}", path.display()), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::cluster_io(format!("chmod {}", path.display()), e))?;
    if let Some(ra) = run_as {
        ra.chown(path)?;
    }
    Ok(())
}

fn as_user(cmd: &mut Command, run_as: Option<&RunAs>) {
    if let Some(ra) = run_as {
        cmd.uid(ra.uid).gid(ra.gid);
    }
}

/// The last `max` bytes of the server log, for error messages, with SCRAM verifiers redacted.
fn log_tail(path: &Path, max: u64) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    // Only for an error message: a log whose length is unknown is read from its start.
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    // The cut may split a character; the log can quote a failed `CREATE ROLE … PASSWORD '…'`.
    crate::scram::redact_verifiers(String::from_utf8_lossy(&buf).trim())
}

/// The fields of `postmaster.pid`: pid, data dir, start time, port, socket dir, listen addr, …
fn read_pid_file(data_dir: &Path) -> Option<(u32, u16, PathBuf)> {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    let pid = lines.first()?.trim().parse().ok()?;
    let port = lines.get(3)?.trim().parse().ok()?;
    let sock = PathBuf::from(lines.get(4)?.trim());
    Some((pid, port, sock))
}

/// Whether `pid` runs the PostgreSQL server.
pub(super) fn is_postgres(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim() == "postgres")
        // A process whose name cannot be read is not known to be the server.
        .unwrap_or(false)
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::cluster_io("bind a loopback port", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::cluster_io("read the loopback port", e))
}

const HBA: &str = "\
# Written by Consort: password (SCRAM) authentication only.
local all all scram-sha-256
host  all all 127.0.0.1/32 scram-sha-256
";

/// The watchdog: waits for EOF on stdin (this process gone, or the lifeline closed), then stops
/// the server ($2 = signal), waits for it, and removes the temporary directories ($3, $4).
const WATCHDOG: &str = r#"
while read -r _; do :; done
P="$1"
alive() { s=$(cut -d' ' -f3 "/proc/$P/stat" 2>/dev/null); [ -n "$s" ] && [ "$s" != Z ] && [ "$s" != X ]; }
kill -s "$2" "$P" 2>/dev/null
i=0
while alive && [ "$i" -lt 400 ]; do sleep 0.05; i=$((i+1)); done
if alive; then kill -s QUIT "$P" 2>/dev/null; sleep 1; kill -s KILL "$P" 2>/dev/null; fi
if [ -n "$3" ]; then rm -rf -- "$3"; fi
if [ -n "$4" ]; then rm -rf -- "$4"; fi
"#;

/// Where one cluster lives and how it is started: what every step of the start shares.
struct Site<'a> {
    cfg: &'a EmbeddedConfig,
    bins: PgBinaries,
    run_as: Option<RunAs>,
    dir: PathBuf,
    requested: Option<PathBuf>,
    temporary: bool,
    data_dir: PathBuf,
    pw_file: PathBuf,
    log_file: PathBuf,
    /// PostgreSQL 18 or newer on a file system with reflinks: branches are clones.
    clones: bool,
    /// Where branches go in memory ([`EmbeddedCluster::branch_space`]).
    branch_space: Option<PathBuf>,
    /// A reboot took the branches in memory: the server starts with `ignore_invalid_pages`
    /// (see the module `branch_space`).
    branches_lost: bool,
}

impl Site<'_> {
    /// The cluster handle for a server at `pid` (`owned`: started by us).
    fn cluster(
        &self,
        socket_dir: PathBuf,
        port: u16,
        password: &str,
        pid: u32,
        owned: Option<Owned>,
    ) -> EmbeddedCluster {
        EmbeddedCluster {
            dir: self.dir.clone(),
            requested: self.requested.clone(),
            data_dir: self.data_dir.clone(),
            socket_dir,
            port,
            superuser: self.cfg.superuser.clone(),
            password: Secret::new(password.trim()),
            bins: self.bins.clone(),
            run_as: self.run_as.clone(),
            temporary: self.temporary && owned.is_some(),
            pid,
            owned: Mutex::new(owned),
            branch_space: self.branch_space.clone(),
        }
    }

    fn read_password(&self) -> Result<String> {
        std::fs::read_to_string(&self.pw_file)
            .map_err(|e| Error::cluster_io(format!("read {}", self.pw_file.display()), e))
    }

    /// The environment of the server's programs: nothing but `PATH` (none when this process
    /// has none) and the C locale.
    fn clean_env<C: CommandEnv>(&self, cmd: &mut C) {
        cmd.clear_env();
        cmd.set_env("PATH", std::env::var_os("PATH").unwrap_or_default());
        cmd.set_env("LC_ALL", "C".into());
    }

    /// Removes a temporary cluster's directory after a failed start.
    fn discard(&self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The environment calls of both `Command` types.
trait CommandEnv {
    fn clear_env(&mut self);
    fn set_env(&mut self, key: &str, value: std::ffi::OsString);
}

impl CommandEnv for Command {
    fn clear_env(&mut self) {
        self.env_clear();
    }
    fn set_env(&mut self, key: &str, value: std::ffi::OsString) {
        self.env(key, value);
    }
}

impl CommandEnv for tokio::process::Command {
    fn clear_env(&mut self) {
        self.env_clear();
    }
    fn set_env(&mut self, key: &str, value: std::ffi::OsString) {
        self.env(key, value);
    }
}

/// How many times a start is tried again when `postgres` finds the data directory still held
/// by a server that is going down (its lock file or shared memory still in use).
const IN_USE_ROUNDS: u32 = 10;
/// The pause before such a retry.
const IN_USE_PAUSE: Duration = Duration::from_millis(200);

async fn start_cluster(
    cfg: &EmbeddedConfig,
    bins: PgBinaries,
    run_as: Option<RunAs>,
    dir: PathBuf,
    requested: Option<PathBuf>,
    temporary: bool,
) -> Result<EmbeddedCluster> {
    ensure_dir(&dir, run_as.as_ref(), 0o700)?;
    if let Some(req) = requested.as_deref().filter(|r| *r != dir) {
        // A fallback directory says whose it is, so a sweep can tell when its project is gone.
        owner::record_requested(&dir, req)?;
    }
    let clones = bins
        .major()
        .is_some_and(|m| m >= super::reflink::FIRST_CLONING_MAJOR)
        && super::reflink::clones_files(&dir);
    let mut site = Site {
        cfg,
        bins,
        run_as,
        clones,
        branch_space: None,
        branches_lost: false,
        data_dir: dir.join("data"),
        pw_file: dir.join("admin.pw"),
        log_file: dir.join("postgres.log"),
        dir,
        requested,
        temporary,
    };
    // One start at a time per kept directory; a fresh temporary one has no other starter.
    let _lock = if site.temporary {
        None
    } else {
        let patience = cfg.start_timeout.saturating_mul(2) + Duration::from_secs(30);
        Some(StartLock::take(&site.dir, patience).await?)
    };
    site.branches_lost = super::branch_space::restore(&site.dir, site.run_as.as_ref())?;
    site.branch_space = (cfg.branches_in_memory && !site.temporary && !site.clones)
        .then(|| match super::branch_space::recorded(&site.dir) {
            // A record of a place that is not this cluster's: a copied cluster (on disk).
            Some(_) => super::branch_space::ours(&site.dir),
            None => super::branch_space::place_for(&site.dir),
        })
        .flatten();
    let mut in_use = String::new();
    for _round in 0..IN_USE_ROUNDS {
        if let Some(cluster) = try_attach(&site).await? {
            return Ok(cluster);
        }
        let (password, socket_dir) = match prepare(&site).await {
            Ok(p) => p,
            Err(e) => {
                site.discard();
                return Err(e);
            }
        };
        match start_own(&site, &socket_dir, &password).await {
            Ok(cluster) => return Ok(cluster),
            Err(Refusal::InUse(said)) => {
                info!(dir = %site.dir.display(), said = %said, "the data directory is still held by a server going down; trying again");
                in_use = said;
                tokio::time::sleep(IN_USE_PAUSE).await;
            }
            Err(Refusal::Failed(e)) => {
                site.discard();
                return Err(e);
            }
        }
    }
    site.discard();
    Err(Error::DataDirInUse {
        data_dir: site.data_dir.clone(),
        detail: in_use,
    })
}

/// The data directory made (`initdb`) when missing, the authentication file written, the
/// password read and the socket directory made: what a start of our own needs.
async fn prepare(site: &Site<'_>) -> Result<(String, PathBuf)> {
    if !site.data_dir.join("PG_VERSION").exists() || !site.pw_file.exists() {
        init_data_dir(site).await?;
    }
    write_private(
        &site.data_dir.join("pg_hba.conf"),
        HBA,
        site.run_as.as_ref(),
    )?;
    let password = site.read_password()?;
    let socket_dir = socket_dir_for(&site.dir);
    ensure_dir(&socket_dir, site.run_as.as_ref(), 0o700)?;
    Ok((password, socket_dir))
}

/// Why a start of our own did not give a server.
enum Refusal {
    /// `postgres` found the data directory in use by another server (going down): try again.
    InUse(String),
    /// Anything else.
    Failed(Error),
}

impl From<Error> for Refusal {
    fn from(e: Error) -> Self {
        Refusal::Failed(e)
    }
}

/// Starts a server of our own, on another port when the chosen one was taken meanwhile.
async fn start_own(
    site: &Site<'_>,
    socket_dir: &Path,
    password: &str,
) -> std::result::Result<EmbeddedCluster, Refusal> {
    let mut last_err = None;
    for _attempt in 0..3 {
        let port = free_port()?;
        let log_start = std::fs::metadata(&site.log_file).map_or(0, |m| m.len());
        let cluster = spawn_server(site, socket_dir, port, password)?;
        let pid = cluster.pid;
        match wait_ready(&cluster, Some(pid), &site.log_file, site.cfg.start_timeout).await {
            Ok(()) => {
                info!(dir = %site.dir.display(), port, pid, "embedded PostgreSQL started");
                return Ok(cluster);
            }
            Err(e) => {
                // Stop what is left of the server, keeping the directory for the next attempt.
                cluster.stop_inner(false);
                drop(cluster);
                // What this attempt's server said (the log is appended to across starts).
                let said = log_since(&site.log_file, log_start);
                if data_dir_in_use(&said) {
                    return Err(Refusal::InUse(fatal_line(&said)));
                }
                if !said.contains("already in use") {
                    return Err(Refusal::Failed(e));
                }
                last_err = Some(e);
            }
        }
    }
    // Every attempt above either returned or recorded its error.
    Err(Refusal::Failed(
        last_err.unwrap_or(Error::Cluster(ClusterError::NotStarted)),
    ))
}

/// Whether the server's words say another server still holds the data directory, or may: a
/// lock file that is empty or names no pid is either another server's in its start-up (it
/// creates the file, then writes it) or the remnant of one killed there, which the next round
/// tells apart (see [`owner::Holder::Stale`]).
fn data_dir_in_use(said: &str) -> bool {
    said.contains("lock file \"postmaster.pid\" already exists")
        || said.contains("lock file \"postmaster.pid\" is empty")
        || said.contains("bogus data in lock file \"postmaster.pid\"")
        || said.contains("pre-existing shared memory block")
}

/// The first `FATAL` line (and the `HINT` after it) of what the server said, or its first line.
fn fatal_line(said: &str) -> String {
    let mut lines = said.lines().skip_while(|l| !l.contains("FATAL"));
    let fatal = lines.next().or_else(|| said.lines().next()).unwrap_or("");
    let hint = lines.next().filter(|l| l.contains("HINT")).unwrap_or("");
    format!("{} {}", fatal.trim(), hint.trim())
        .trim()
        .to_string()
}

/// What the server log gained after byte `from`, with SCRAM verifiers redacted.
fn log_since(path: &Path, from: u64) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let _ = f.seek(SeekFrom::Start(from));
    let mut buf = Vec::new();
    let _ = f.take(64 * 1024).read_to_end(&mut buf);
    crate::scram::redact_verifiers(String::from_utf8_lossy(&buf).trim())
}

/// A server another process runs for this directory: attach to it (`None`: there is none, or
/// it has shut down). A server whose owner is gone — killed during start-up or during a run —
/// is stopped and waited for (see [`owner`]); a lock file naming a process that is not a
/// server of this directory (the pid was reused), or naming no pid while no server works in
/// the data directory (a server killed between creating and writing it), is stale (PostgreSQL
/// would refuse to start) and is removed.
async fn try_attach(site: &Site<'_>) -> Result<Option<EmbeddedCluster>> {
    let patience = site.cfg.start_timeout.min(Duration::from_secs(10));
    let dir = site.dir.display();
    match owner::holder(&site.dir, &site.data_dir) {
        Holder::Free => Ok(None),
        Holder::Stale => {
            owner::remove_stale_lock(&site.dir, &site.data_dir)?;
            Ok(None)
        }
        Holder::Foreign(pid) => {
            warn!(
                pid,
                "removing a stale postmaster.pid whose pid belongs to another program"
            );
            let _ = std::fs::remove_file(site.data_dir.join("postmaster.pid"));
            Ok(None)
        }
        Holder::Exiting(pid) => {
            owner::wait_exited(pid, &site.data_dir, patience).await?;
            Ok(None)
        }
        Holder::Abandoned(pid) => {
            info!(dir = %dir, pid, "the process that started this cluster's server has ended; stopping the server before starting a new one");
            owner::stop_abandoned(pid, &site.data_dir).await?;
            Ok(None)
        }
        Holder::Owned(pid) => attach(site, pid, patience).await,
    }
}

/// Attaches to the server `pid` of a live owner; `None` when it shuts down while we wait.
async fn attach(site: &Site<'_>, pid: u32, patience: Duration) -> Result<Option<EmbeddedCluster>> {
    let dir = site.dir.display();
    let Some((_, port, sock)) = read_pid_file(&site.data_dir).filter(|(p, _, _)| *p == pid) else {
        return Err(ClusterError::NoPort {
            dir: site.dir.clone(),
            pid,
        }
        .into());
    };
    let cluster = site.cluster(sock, port, &site.read_password()?, pid, None);
    // The server may be on its way out (its owner is stopping it): then wait for it to exit
    // and start our own.
    match wait_attach(&cluster, &site.log_file, patience).await? {
        Attach::Ready => {
            info!(dir = %dir, pid, "attached to a running cluster started by another process");
            Ok(Some(cluster))
        }
        Attach::Exited => {
            info!(
                dir = %dir,
                pid,
                "the running cluster shut down while we waited for it; starting a new server"
            );
            owner::wait_exited(pid, &site.data_dir, patience).await?;
            Ok(None)
        }
    }
}

/// `initdb` with a fresh superuser password. The data directory is made aside and moved into
/// place (the password file first) once complete: a start killed in the middle — whose
/// `initdb` may still be running — leaves only staging files the next start removes.
async fn init_data_dir(site: &Site<'_>) -> Result<()> {
    let data_dir = &site.data_dir;
    remove_staging(&site.dir);
    if data_dir.exists() {
        // A cluster whose password file is missing: start over.
        std::fs::remove_dir_all(data_dir)
            .map_err(|e| Error::cluster_io(format!("remove {}", data_dir.display()), e))?;
    }
    let tag = random_tag(8);
    let staging = site.dir.join(format!("{STAGING}data-{tag}"));
    let pw_staging = site.dir.join(format!("{STAGING}pw-{tag}"));
    let password = crate::names::random_password();
    write_private(&pw_staging, &password, site.run_as.as_ref())?;
    let initdb = site.bins.initdb();
    let mut cmd = tokio::process::Command::new(&initdb);
    cmd.arg("-D")
        .arg(&staging)
        .arg("-U")
        .arg(&site.cfg.superuser)
        .arg("--pwfile")
        .arg(&pw_staging)
        .args([
            "-A",
            "scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ])
        .current_dir(&site.dir);
    site.clean_env(&mut cmd);
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    if let Some(ra) = &site.run_as {
        cmd.uid(ra.uid).gid(ra.gid);
    }
    let out = cmd
        .output()
        .await
        .map_err(|e| Error::cluster_io(format!("run {}", initdb.display()), e))?;
    if !out.status.success() {
        remove_staging(&site.dir);
        return Err(ClusterError::Initdb {
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }
        .into());
    }
    for (from, to) in [(&pw_staging, &site.pw_file), (&staging, data_dir)] {
        std::fs::rename(from, to).map_err(|e| {
            Error::cluster_io(format!("move {} to {}", from.display(), to.display()), e)
        })?;
    }
    debug!(dir = %site.dir.display(), "initdb done");
    Ok(())
}

/// The name prefix of `initdb`'s staging files in a cluster directory.
const STAGING: &str = "init-staging-";

/// Removes what an interrupted `initdb` left in `dir` (best effort).
fn remove_staging(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        if e.file_name().to_string_lossy().starts_with(STAGING) {
            let path = e.path();
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
    }
}

/// Starts the postmaster on `port` with its watchdog; the cluster it returns owns both.
fn spawn_server(
    site: &Site<'_>,
    socket_dir: &Path,
    port: u16,
    password: &str,
) -> Result<EmbeddedCluster> {
    let log_file = &site.log_file;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_file)
        .map_err(|e| Error::cluster_io(format!("open {}", log_file.display()), e))?;
    let log2 = log
        .try_clone()
        .map_err(|e| Error::cluster_io("clone the log handle", e))?;
    let mut cmd = Command::new(site.bins.postgres());
    cmd.arg("-D")
        .arg(&site.data_dir)
        .arg("-p")
        .arg(port.to_string())
        .arg("-k")
        .arg(socket_dir)
        .args(["-h", "127.0.0.1"])
        .args(["-c", "fsync=off"])
        .args(["-c", "synchronous_commit=off"])
        .args(["-c", "full_page_writes=off"])
        .args(["-c", "max_connections=200"])
        .args(["-c", "unix_socket_permissions=0700"])
        .args(["-c", "shared_buffers=32MB"])
        // Not POSIX shared memory: test runs may write /dev/shm (when they share the
        // machine's, a run could otherwise remove the server's segments).
        .args(["-c", "dynamic_shared_memory_type=sysv"]);
    if site.branches_lost {
        // Its log may name pages of branches the reboot took with the tmpfs.
        cmd.args(["-c", "ignore_invalid_pages=on"]);
    }
    if site.clones {
        // `CREATE DATABASE … STRATEGY FILE_COPY` clones the base's files (reflinks).
        cmd.args(["-c", "file_copy_method=clone"]);
    }
    // Given after, so a configured setting (`file_copy_method=copy`) wins.
    for (k, v) in &site.cfg.settings {
        cmd.arg("-c").arg(format!("{k}={v}"));
    }
    cmd.current_dir(&site.dir);
    site.clean_env(&mut cmd);
    cmd.stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .process_group(0);
    as_user(&mut cmd, site.run_as.as_ref());
    let postmaster = cmd
        .spawn()
        .map_err(|e| Error::cluster_io(format!("start {}", site.bins.postgres().display()), e))?;
    let pid = postmaster.id();
    // The owner record first: a start that finds this server once this process is gone (even
    // killed before the watchdog below exists) knows it is abandoned.
    let recorded = if site.temporary {
        Ok(())
    } else {
        owner::record_owner(&site.dir, pid)
    };
    let watchdog = recorded.and_then(|()| {
        spawn_watchdog(
            pid,
            site.temporary,
            site.temporary.then_some(site.dir.as_path()),
            (!socket_dir.starts_with(&site.dir)).then_some(socket_dir),
        )
    });
    let (watchdog, lifeline) = match watchdog {
        Ok(w) => w,
        Err(e) => {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGQUIT);
            let mut pm = postmaster;
            let _ = pm.wait();
            return Err(e);
        }
    };
    let owned = Owned {
        postmaster,
        watchdog,
        _lifeline: Some(lifeline),
    };
    Ok(site.cluster(socket_dir.to_path_buf(), port, password, pid, Some(owned)))
}

fn spawn_watchdog(
    pid: u32,
    temporary: bool,
    remove_dir: Option<&Path>,
    remove_socket_dir: Option<&Path>,
) -> Result<(Child, ChildStdin)> {
    let signal = if temporary { "QUIT" } else { "INT" };
    // An empty directory argument tells the watchdog script there is nothing to remove.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG)
        .arg("consort-pg-watchdog")
        .arg(pid.to_string())
        .arg(signal)
        .arg(remove_dir.map(|p| p.as_os_str()).unwrap_or_default())
        .arg(remove_socket_dir.map(|p| p.as_os_str()).unwrap_or_default())
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| Error::cluster_io("start the cluster watchdog (sh)", e))?;
    let stdin = child.stdin.take().ok_or(ClusterError::WatchdogNoStdin)?;
    Ok((child, stdin))
}

/// How waiting for a server another process started ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attach {
    /// It accepts connections: use it.
    Ready,
    /// It exited while we waited (it was shutting down): start our own.
    Exited,
}

/// Waits until another process's server accepts connections, or exits (a server whose owner
/// crashed is stopped by the owner's watchdog, and refuses connections while it shuts down).
async fn wait_attach(
    cluster: &EmbeddedCluster,
    log_file: &Path,
    timeout: Duration,
) -> Result<Attach> {
    let deadline = Instant::now() + timeout;
    let info = cluster.admin_info("postgres");
    loop {
        if !procinfo::alive(cluster.pid) {
            return Ok(Attach::Exited);
        }
        match crate::pgconn::connect(&info).await {
            Ok(client) => {
                drop(client);
                return Ok(Attach::Ready);
            }
            Err(e) if Instant::now() >= deadline => {
                return Err(ClusterError::AttachTimeout {
                    pid: cluster.pid,
                    waited: timeout,
                    log: log_tail(log_file, 2000),
                    source: Box::new(e),
                }
                .into());
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_ready(
    cluster: &EmbeddedCluster,
    own_pid: Option<u32>,
    log_file: &Path,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let info = cluster.admin_info("postgres");
    loop {
        if own_pid.is_some() {
            let exited = cluster
                .owned
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_mut()
                .map(|o| o.postmaster.try_wait())
                // No child any more (stopped) or one that cannot be waited for: exited.
                .is_none_or(|r| !matches!(r, Ok(None)));
            if exited {
                return Err(ClusterError::ExitedDuringStartup {
                    log: log_tail(log_file, 2000),
                }
                .into());
            }
        }
        match crate::pgconn::connect(&info).await {
            Ok(client) => {
                drop(client);
                return Ok(());
            }
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(ClusterError::NotReady {
                        waited: timeout,
                        log: log_tail(log_file, 2000),
                        source: Box::new(e),
                    }
                    .into());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mode bits of `path` (following links).
    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn a_name_taken_in_a_directory_anyone_may_write_to_is_refused_not_followed() {
        let open = tempfile::tempdir().expect("dir");
        std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o1777))
            .expect("open it to all, as /tmp is");
        let target = tempfile::tempdir().expect("target");
        std::fs::set_permissions(target.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let link = open.path().join("consort-sock-planted");
        std::os::unix::fs::symlink(target.path(), &link).expect("plant a link");
        let refused = ensure_dir(&link, None, 0o700).expect_err("a link is refused");
        assert!(
            matches!(&refused, Error::PermissionDenied(why) if why.contains("is a link")),
            "{refused}"
        );
        assert_eq!(mode_of(target.path()), 0o755, "the link was not followed");
        let fresh = open.path().join("consort-sock-fresh");
        ensure_dir(&fresh, None, 0o700).expect("a name nobody took is made");
        assert_eq!(mode_of(&fresh), 0o700);
        if nix::unistd::geteuid().is_root() {
            let theirs = open.path().join("consort-pg-theirs");
            std::fs::create_dir(&theirs).expect("mkdir");
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("give it away");
            let refused = ensure_dir(&theirs, None, 0o700).expect_err("another's is refused");
            assert!(
                refused.to_string().contains("someone else owns"),
                "{refused}"
            );
        }
        // In a directory of the project's owner, a link is that owner's choice.
        let private = tempfile::tempdir().expect("private");
        let chosen = private.path().join("pg");
        std::os::unix::fs::symlink(target.path(), &chosen).expect("link");
        ensure_dir(&chosen, None, 0o700).expect("followed");
        assert_eq!(mode_of(target.path()), 0o700);
    }

    #[test]
    fn the_log_tail_quoted_in_errors_carries_no_verifier() {
        let verifier = crate::scram::verifier(b"secret", crate::scram::BRANCH_ITERATIONS);
        let dir = tempfile::tempdir().expect("dir");
        let log = dir.path().join("postgres.log");
        let text = format!(
            "{}\nERROR:  role \"r\" already exists\nSTATEMENT:  CREATE ROLE r LOGIN PASSWORD '{verifier}'\n",
            "x".repeat(5000)
        );
        std::fs::write(&log, text).expect("write");
        let tail = log_tail(&log, 2000);
        assert!(
            tail.contains("PASSWORD 'SCRAM-SHA-256$<redacted>'"),
            "{tail}"
        );
        assert!(!tail.contains(&verifier[20..]), "{tail}");
        assert!(tail.len() <= 2000, "the tail is capped");
    }
}
