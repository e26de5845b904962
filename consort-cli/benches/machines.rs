//! Past one machine: worker processes (`consort run --parallel 1`, each in a clone of its own)
//! that share nothing but a store database, a bare git remote and one PostgreSQL server (an
//! embedded cluster of the bench's own), driving features of the same size: the scripted
//! StockFlow feature and two twins of it.
//!
//! - **Three workers against one**: the wall time of the three features on three workers,
//!   beside the same three on one worker and, as the floor, one feature alone on one worker, in
//!   the same run (goal: three workers ≤ 0.45× one worker).
//! - **Takeover**: with one feature and two workers, the holder is killed (SIGKILL) mid-step;
//!   the figure is the time from the kill until the other worker holds the feature (goal:
//!   within twice the lease time, whose floor is the time left on the killed worker's lease).
//!   Again with 99 more features waiting in the store behind it (100 in all; both workers
//!   given `--feature` so that they contend for the one), so that every look the taker makes
//!   reads a backlog of 100.
//!
//! `cargo bench --bench machines`

#[path = "../../benches/common/mod.rs"]
mod common;
mod twins;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{median, report_line};
use consort::lakebase::store::PgStore;
use consort::lakebase::{EmbeddedCluster, EmbeddedConfig, EmbeddedPostgres, Secret};
use consort_cli::init::{STOCKFLOW_FEATURE, STOCKFLOW_FEATURE_ID, STOCKFLOW_SCRIPT};
use criterion::{Criterion, criterion_group, criterion_main};

/// The lease time of the takeover figure.
const LEASE_SECONDS: u64 = 3;

/// The bench's server and how many projects it holds.
struct Server {
    cluster: std::sync::Arc<EmbeddedCluster>,
    password: String,
    next: std::cell::Cell<usize>,
}

impl Server {
    fn start(rt: &tokio::runtime::Runtime) -> Server {
        let cluster = rt
            .block_on(EmbeddedPostgres::start(EmbeddedConfig::temporary()))
            .expect("the bench's server");
        let password = consort_testkit::cluster::admin_info(&cluster, "postgres")
            .secret
            .expose()
            .to_string();
        Server {
            cluster,
            password,
            next: std::cell::Cell::new(0),
        }
    }

    fn url(&self, database: &str) -> String {
        consort_testkit::cluster::admin_url(&self.cluster, database)
    }

    /// A parent database and a store database of their own for the next project.
    fn databases(&self) -> (String, String) {
        let n = self.next.get() + 1;
        self.next.set(n);
        let (parent, store) = (format!("shop_{n}"), format!("records_{n}"));
        for db in [&parent, &store] {
            let o = Command::new("psql")
                .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
                .args(["-U", self.cluster.superuser()])
                .args(["-p", &self.cluster.port().to_string(), "-d", "postgres"])
                .args(["-c", &format!("CREATE DATABASE {db}")])
                .env("PGPASSWORD", &self.password)
                .output()
                .expect("psql");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        (parent, store)
    }
}

/// A project pushed to a bare remote, its records in a store of their own: StockFlow first,
/// then the first `twins` twins.
struct Shared {
    root: tempfile::TempDir,
    remote: PathBuf,
    parent: String,
    store: String,
}

impl Shared {
    fn new(server: &Server, twins: &[&twins::Twin], lease_seconds: u64) -> Shared {
        let root = tempfile::tempdir().expect("root");
        let (parent, store) = server.databases();
        let origin = root.path().join("origin");
        // The template's embedded cluster gives way to the bench's server.
        let config = format!(
            "{}\n[store]\nkind = \"postgres\"\nproject = \"shop\"\nurl_env = \"BENCH_STORE_URL\"\nlease_seconds = {lease_seconds}\n\n[git]\nremote = \"origin\"\n",
            consort_cli::init::config_template(STOCKFLOW_FEATURE_ID, "agents/{feature}.toml")
                .replace(
                    "provider = \"embedded\"",
                    "provider = \"url\"\nurl_env = \"BENCH_DATABASE_URL\"",
                )
                .replace("data_dir = \".consort/pg\"\n", "")
                .replace("run_as = \"postgres\"", "")
        );
        let mut files = vec![
            ("consort.toml".to_string(), config),
            ("feature.md".into(), STOCKFLOW_FEATURE.into()),
            (
                format!("agents/{STOCKFLOW_FEATURE_ID}.toml"),
                STOCKFLOW_SCRIPT.into(),
            ),
        ];
        for t in twins {
            files.push((format!("{}.md", t.id), twins::twin(STOCKFLOW_FEATURE, t)));
            files.push((
                format!("agents/{}.toml", t.id),
                twins::twin(STOCKFLOW_SCRIPT, t),
            ));
        }
        for (rel, text) in files {
            let path = origin.join(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        }
        consort::git::GitRepo::init_with_commit(&origin, "Bench", "before Consort").expect("git");
        let remote = root.path().join("remote.git");
        common::git(
            root.path(),
            &["init", "-q", "--bare", "-b", "main", "remote.git"],
        );
        common::git(
            &origin,
            &["remote", "add", "origin", &remote.to_string_lossy()],
        );
        common::git(&origin, &["push", "-q", "origin", "main"]);
        let shared = Shared {
            root,
            remote,
            parent,
            store,
        };
        for t in twins {
            let o = shared
                .command(server, &origin)
                .args(["feature", "add"])
                .arg(origin.join(format!("{}.md", t.id)))
                .args(["--id", t.id, "--dir"])
                .arg(&origin)
                .output()
                .expect("feature add");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        shared
    }

    /// `consort` with this project's URLs, HOME and temporary directory under `home`.
    fn command(&self, server: &Server, home: &Path) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_consort"));
        cmd.env("BENCH_DATABASE_URL", server.url(&self.parent))
            .env("BENCH_STORE_URL", server.url(&self.store))
            .env("HOME", home)
            .env("TMPDIR", home)
            .stdin(Stdio::null());
        cmd
    }

    /// Adds `n` small features behind the backlog's, each with a request of its own.
    fn add_waiting(&self, server: &Server, n: usize) {
        let origin = self.root.path().join("origin");
        for i in 0..n {
            let request = origin.join(format!("waiting-{i}.md"));
            std::fs::write(
                &request,
                format!("# Waiting feature {i}\n\nNot driven here.\n"),
            )
            .expect("a request");
            let o = self
                .command(server, &origin)
                .args(["feature", "add"])
                .arg(&request)
                .args(["--id", &format!("waiting-{i}"), "--dir"])
                .arg(&origin)
                .output()
                .expect("feature add");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
    }

    /// A worker on a machine of its own: a fresh clone, `consort run --parallel 1`.
    fn worker(&self, server: &Server, name: &str) -> Child {
        self.worker_on(server, name, None)
    }

    /// [`Shared::worker`], kept to one feature when `feature` is given.
    fn worker_on(&self, server: &Server, name: &str, feature: Option<&str>) -> Child {
        let home = self.root.path().join(name);
        std::fs::create_dir_all(&home).expect("home");
        common::git(
            &home,
            &["clone", "-q", &self.remote.to_string_lossy(), "shop"],
        );
        let mut cmd = self.command(server, &home);
        cmd.args(["run", "--approve-as", "bench", "--parallel", "1", "--dir"])
            .arg(home.join("shop"));
        if let Some(feature) = feature {
            cmd.args(["--feature", feature]);
        }
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("a worker")
    }

    fn store_info(&self, server: &Server) -> consort::lakebase::ConnectInfo {
        consort::lakebase::connect_info_of_url(&Secret::new(server.url(&self.store))).expect("url")
    }
}

/// The wall time of `workers` workers driving the project to its end.
fn drive(server: &Server, twins: &[&twins::Twin], workers: usize) -> Duration {
    let shared = Shared::new(server, twins, 30);
    let t = Instant::now();
    let mut children: Vec<Child> = (0..workers)
        .map(|n| shared.worker(server, &format!("m{n}")))
        .collect();
    for c in &mut children {
        assert!(c.wait().expect("wait").success(), "a worker failed");
    }
    t.elapsed()
}

/// With one feature driven by two workers (and `waiting` more features in the store behind
/// it): the time from killing the holder mid-step until the other holds the feature, and the
/// time the killed holder's lease still had then.
fn takeover(rt: &tokio::runtime::Runtime, server: &Server, waiting: usize) -> (Duration, Duration) {
    let shared = Shared::new(server, &[], LEASE_SECONDS);
    shared.add_waiting(server, waiting);
    let only = (waiting > 0).then_some(STOCKFLOW_FEATURE_ID);
    let store = rt
        .block_on(PgStore::connect(&shared.store_info(server), "shop"))
        .expect("store");
    let mut children = [
        shared.worker_on(server, "a", only),
        shared.worker_on(server, "b", only),
    ];
    let holder = loop {
        let held = rt.block_on(store.holdings()).expect("holdings");
        let entries = rt
            .block_on(store.entries(STOCKFLOW_FEATURE_ID))
            .expect("entries")
            .len();
        if let Some(h) = held.into_iter().find(|h| h.live)
            && entries >= 12
        {
            break h;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let at = children
        .iter()
        .position(|c| holder.holder.ends_with(&format!("(PID {})", c.id())))
        .expect("a worker holds it");
    children[at].kill().expect("SIGKILL");
    let killed = Instant::now();
    let _ = children[at].wait();
    // What the killed holder's lease had left: renewed every third of the lease time.
    let left = rt.block_on(async {
        let client = consort::lakebase::connect(&shared.store_info(server))
            .await
            .expect("a connection");
        let row = client
            .query_one(
                "SELECT extract(epoch FROM expires_at - clock_timestamp())::float8 \
                 FROM consort_store.leases WHERE project = 'shop'",
                &[],
            )
            .await
            .expect("the lease's time left");
        Duration::from_secs_f64(row.get::<_, f64>(0).max(0.0))
    });
    loop {
        let held = rt.block_on(store.holdings()).expect("holdings");
        if held.iter().any(|h| h.live && h.holder != holder.holder) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let figure = killed.elapsed();
    for (n, c) in children.iter_mut().enumerate() {
        if n != at {
            assert!(c.wait().expect("wait").success(), "the taker finished");
        }
    }
    (figure, left)
}

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let server = Server::start(&rt);
    let three = [&twins::DEPOT, &twins::SHELF];
    let mut g = common::group(c, "machines", 1, 1);
    common::bench_timed(&mut g, "three features, three workers", || {
        drive(&server, &three, 3)
    });
    g.finish();
    if common::profiling() {
        return;
    }
    let (mut many, mut one, mut alone) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        many.push(drive(&server, &three, 3));
        one.push(drive(&server, &three, 1));
        alone.push(drive(&server, &[], 1));
    }
    let (many, one, alone) = (median(&mut many), median(&mut one), median(&mut alone));
    report_line(
        "three features on three workers beside one worker",
        &format!(
            "{} (goal ≤ 0.45×); one feature alone (the floor) {}: {:.2}× the floor",
            common::versus(many, one),
            common::fmt(alone),
            common::ratio(many, alone),
        ),
    );
    for waiting in [0, 99] {
        let mut taken = Vec::new();
        let mut left = Vec::new();
        for _ in 0..3 {
            let (t, l) = takeover(&rt, &server, waiting);
            taken.push(t);
            left.push(l);
        }
        let lease = Duration::from_secs(LEASE_SECONDS);
        let (taken, left) = (median(&mut taken), median(&mut left));
        report_line(
            &format!(
                "takeover after a kill, {} feature(s) in the store",
                waiting + 1
            ),
            &format!(
                "taken over against the lease: {} (goal ≤ 2×); the killed lease had {} left (the floor)",
                common::versus(taken, lease),
                common::fmt(left),
            ),
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
