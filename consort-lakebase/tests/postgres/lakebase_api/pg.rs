//! A throw-away local PostgreSQL 15 cluster for these tests: initdb + postgres on
//! 127.0.0.1 and a free port, password (SCRAM) logins for everyone but the `postgres`
//! superuser, stopped (and its directory removed) on drop.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use consort_testkit::process::succeeded;
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, User, geteuid};

const BIN_DIRS: [&str; 1] = ["/usr/lib/postgresql/15/bin"];

fn bin(name: &str) -> PathBuf {
    for d in BIN_DIRS {
        let p = Path::new(d).join(name);
        if p.exists() {
            return p;
        }
    }
    PathBuf::from(name)
}

/// A running cluster. The superuser is `postgres` (trusted on 127.0.0.1).
pub(crate) struct LocalPg {
    child: Option<Child>,
    /// The TCP port on 127.0.0.1.
    pub port: u16,
    _dir: tempfile::TempDir,
}

/// Postgres refuses to run as root: when we are root, run it as the `postgres` user.
fn run_as() -> Option<(u32, u32)> {
    if !geteuid().is_root() {
        return None;
    }
    let u = User::from_name("postgres")
        .expect("look up the postgres user")
        .expect("a `postgres` system user (needed to run PostgreSQL as root)");
    Some((u.uid.as_raw(), u.gid.as_raw()))
}

fn command(program: PathBuf, ids: Option<(u32, u32)>) -> Command {
    let mut c = Command::new(program);
    if let Some((uid, gid)) = ids {
        c.uid(uid).gid(gid);
    }
    c.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C");
    c
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// How to start a [`LocalPg`] beyond the defaults.
#[derive(Debug, Default, Clone)]
pub(crate) struct PgOptions {
    /// TLS on, with this certificate and key (PEM files).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Databases every login to is refused by `pg_hba.conf` (a `reject` line).
    pub hba_reject: Vec<String>,
}

impl LocalPg {
    /// initdb + start; panics (it is a test fixture) when PostgreSQL cannot start.
    pub(crate) async fn start() -> LocalPg {
        Self::start_with(PgOptions::default()).await
    }

    /// [`LocalPg::start`] with `opts`.
    pub(crate) async fn start_with(opts: PgOptions) -> LocalPg {
        let ids = run_as();
        let dir = tempfile::Builder::new()
            .prefix("consort-lakebase-api-pg-")
            .tempdir()
            .expect("tempdir");
        // The tempdir is 0700 root; the server user must be able to traverse it.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
        let data = dir.path().join("data");
        fs::create_dir(&data).expect("mkdir data");
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::chown(&data, Some(uid), Some(gid)).expect("chown data");
        }
        succeeded(
            command(bin("initdb"), ids).args(["-D"]).arg(&data).args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ]),
            "initdb",
        );
        let mut hba = String::new();
        for db in &opts.hba_reject {
            hba.push_str(&format!("host {db} all 127.0.0.1/32 reject\n"));
        }
        hba.push_str(
            "host all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n",
        );
        fs::write(data.join("pg_hba.conf"), hba).expect("write pg_hba.conf");
        let mut tls_args: Vec<String> = Vec::new();
        if let Some((cert, key)) = &opts.tls {
            // The server reads its key only when its own user owns it, mode 0600.
            for (file, name) in [(cert, "server.crt"), (key, "server.key")] {
                let to = data.join(name);
                fs::copy(file, &to).expect("copy the TLS file");
                fs::set_permissions(&to, fs::Permissions::from_mode(0o600)).expect("chmod");
                if let Some((uid, gid)) = ids {
                    std::os::unix::fs::chown(&to, Some(uid), Some(gid)).expect("chown");
                }
            }
            tls_args = [
                "ssl=on",
                "ssl_cert_file=server.crt",
                "ssl_key_file=server.key",
            ]
            .iter()
            .flat_map(|s| ["-c".to_string(), s.to_string()])
            .collect();
        }

        let mut last_log = String::new();
        for _attempt in 0..3 {
            let port = free_port();
            let log = fs::File::create(dir.path().join("server.log")).expect("log file");
            let mut child = command(bin("postgres"), ids)
                .arg("-D")
                .arg(&data)
                .args(["-p", &port.to_string()])
                .args(["-c", "listen_addresses=127.0.0.1"])
                .args(["-c", "unix_socket_directories="])
                .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
                .args(["-c", "full_page_writes=off", "-c", "max_connections=60"])
                .args(["-c", "password_encryption=scram-sha-256"])
                .args(&tls_args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(log))
                .spawn()
                .expect("spawn postgres");
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if admin_connect(port, "postgres").await.is_ok() {
                    return LocalPg {
                        child: Some(child),
                        port,
                        _dir: dir,
                    };
                }
                let exited = child.try_wait().ok().flatten().is_some();
                if exited || Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Port taken or a slow start: stop it and try another port.
            stop_child(&mut child);
            last_log = fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
        }
        panic!("PostgreSQL did not start; last log:\n{last_log}")
    }

    /// A superuser connection to `db` (no password: trusted on 127.0.0.1).
    pub(crate) async fn admin_connect(
        &self,
        db: &str,
    ) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        admin_connect(self.port, db).await
    }
}

async fn admin_connect(
    port: u16,
    db: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::Config::new()
        .host("127.0.0.1")
        .port(port)
        .user("postgres")
        .dbname(db)
        .connect_timeout(Duration::from_secs(5))
        .connect(tokio_postgres::NoTls)
        .await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// SIGINT (fast shutdown), then SIGKILL after 10 s; always reaps the child.
fn stop_child(child: &mut Child) {
    let pid = Pid::from_raw(child.id() as i32);
    let _ = kill(pid, Signal::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = kill(pid, Signal::SIGKILL);
    let _ = child.wait();
}

impl Drop for LocalPg {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child);
        }
    }
}
