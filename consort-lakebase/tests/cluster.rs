//! The embedded cluster's life cycle: start (also as root), reuse, stop, no orphans.

use consort_testkit::process::eventually;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use consort_lakebase::procinfo;
use consort_lakebase::{
    BaseSpec, BranchProvider, EmbeddedCluster, EmbeddedConfig, EmbeddedPostgres, EmbeddedProvider,
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
    let holder = tempfile::Builder::new()
        .prefix("consort-reuse-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    // A 0700 directory of root: as root the server user cannot reach it, so the cluster must
    // be placed elsewhere; as an ordinary user it is used as is.
    std::fs::set_permissions(holder.path(), std::fs::Permissions::from_mode(0o700))
        .expect("chmod 0700");
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
    let spec = BaseSpec {
        migrations: vec![consort_actors::Migration {
            version: "0001".into(),
            story_id: "S1".into(),
            description: String::new(),
            sql: "CREATE TABLE kept (id int)".into(),
        }],
        fixtures: vec![],
    };
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
        bin_dir: Some(PathBuf::from("/nonexistent/pg/bin")),
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
    let holder = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("tempdir");
    std::fs::set_permissions(holder.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
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
    let base = provider
        .prepare_base(&BaseSpec::default())
        .await
        .expect("base");
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
