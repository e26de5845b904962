//! One psql test file through the whole verify path — `Verifier::verify`: hash the work tree,
//! acquire a branch of the base (migrations already built into it), run the file with the psql
//! runner, release the branch, write the receipt — beside the same psql command
//! (`psql -X -q -v ON_ERROR_STOP=1 -c BEGIN -f tests/t01.sql -c ROLLBACK`, same environment) on
//! a database that is already there. Goal: ≤ +30 ms at the median.
//!
//! Also shown: the confined verification beside the same one with `sandbox = "off"` (the
//! Landlock domain), and one snapshot of the tree (the after-run comparison's cost); goal: the
//! two together ≤ +5 ms at the median on a tree of StockFlow's size. Then the psql runner alone on the existing database (the runner's own overhead), and a
//! verification whose migrations changed (a new base is built first), for scale.
//!
//! `cargo bench --bench verify`

#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{interleave, report_line, report_ratio};
use consort::actors::{Migration, TestStatus, VerifyRequest};
use consort::lakebase::EnvPolicy;
use consort::lakebase::SandboxMode;
use consort::lakebase::{
    BranchPool, BranchProvider, ConnectInfo, PsqlRunner, PsqlRunnerConfig, RunContext, TestRunner,
    Verifier,
};
use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;

const TEST_FILE: &str = "tests/t01.sql";

fn migrations(extra: Option<u64>) -> Vec<Migration> {
    let mut m = vec![Migration {
        version: "0001".into(),
        story_id: "S1".into(),
        description: "stock records".into(),
        sql: "CREATE TABLE stock (id bigint PRIMARY KEY, sku text NOT NULL, qty int NOT NULL CHECK (qty >= 0))".into(),
    }];
    if let Some(n) = extra {
        m.push(Migration {
            version: "0002".into(),
            story_id: "S1".into(),
            description: "a changed migration".into(),
            sql: format!("CREATE TABLE extra_{n} (x int)"),
        });
    }
    m
}

/// The test file, plus 14 files of about 1.3 KB that no runner loads, so the tree is the size
/// of the finished StockFlow tree (15 files, about 20 KB) that every run snapshots twice.
fn work_tree(dir: &Path) {
    std::fs::create_dir_all(dir.join("tests")).expect("tests dir");
    std::fs::create_dir_all(dir.join("notes")).expect("notes dir");
    for n in 0..14 {
        std::fs::write(
            dir.join(format!("notes/n{n:02}.md")),
            format!(
                "# note {n}\n{}",
                "stock moves between locations. ".repeat(40)
            ),
        )
        .expect("note");
    }
    std::fs::write(
        dir.join(TEST_FILE),
        "INSERT INTO stock (id, sku, qty) VALUES (1, 'sku-1', 5);\n\
         DO $$ BEGIN\n\
           IF (SELECT qty FROM stock WHERE id = 1) <> 5 THEN RAISE EXCEPTION 'wrong quantity'; END IF;\n\
         END $$;\n",
    )
    .expect("test file");
}

struct Fixture {
    rt: Runtime,
    verifier: Verifier,
    /// The same verifier with `sandbox = "off"`: no Landlock domain (the after-run comparison
    /// still runs, so the pair isolates the confinement).
    unconfined: Verifier,
    runner: Arc<PsqlRunner>,
    dir: tempfile::TempDir,
    psql: std::path::PathBuf,
    standing: ConnectInfo,
    next: std::cell::Cell<u64>,
}

impl Fixture {
    fn request(&self, extra: Option<u64>) -> VerifyRequest {
        let n = self.next.get() + 1;
        self.next.set(n);
        common::bench_request(n, self.dir.path(), migrations(extra), TEST_FILE)
    }

    /// One confined verification with a warm pool.
    fn verify(&self) -> Duration {
        self.verify_with(&self.verifier)
    }

    /// One verification with a warm pool (waits, untimed, until the pool is full again).
    fn verify_with(&self, verifier: &Verifier) -> Duration {
        self.rt.block_on(async {
            let pool = verifier.pool();
            let deadline = Instant::now() + Duration::from_secs(30);
            while pool.ready() < 2 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let req = self.request(None);
            let t = Instant::now();
            let receipt = verifier.verify(&req).await.expect("verify");
            let d = t.elapsed();
            assert_eq!(receipt.outcomes.len(), 1);
            assert_eq!(
                receipt.outcomes[0].status,
                TestStatus::Passed,
                "{}",
                receipt.output_excerpt
            );
            d
        })
    }

    /// One verification whose migrations changed: the base is rebuilt first.
    fn verify_new_base(&self, n: u64) -> (Duration, u64, u64, u64) {
        self.rt.block_on(async {
            let req = self.request(Some(n));
            let t = Instant::now();
            let receipt = self.verifier.verify(&req).await.expect("verify");
            let d = t.elapsed();
            assert_eq!(receipt.outcomes[0].status, TestStatus::Passed);
            (
                d,
                receipt.timings.migrate_ms,
                receipt.timings.acquire_ms,
                receipt.timings.run_ms,
            )
        })
    }

    /// The same psql command, by hand, on the standing database.
    fn bare_psql(&self) -> Duration {
        self.rt.block_on(async {
            let env = EnvPolicy::default().build(&self.standing);
            let t = Instant::now();
            let out = common::bare_psql(&self.psql, TEST_FILE, self.dir.path(), env)
                .output()
                .await
                .expect("psql");
            let d = t.elapsed();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            d
        })
    }

    /// The psql runner alone on the standing database.
    fn runner_only(&self) -> Duration {
        self.rt.block_on(async {
            let mut ctx = RunContext::prepare(
                self.dir.path().to_path_buf(),
                self.standing.clone(),
                SandboxMode::Off,
                Vec::new(),
                Vec::new(),
            )
            .expect("a run context");
            ctx.tests = vec![TEST_FILE.into()];
            let t = Instant::now();
            let r = self.runner.run(&ctx).await.expect("run");
            let d = t.elapsed();
            assert!(r.exit.success(), "{}", r.output_excerpt);
            d
        })
    }
}

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let dir = tempfile::tempdir().expect("work tree");
    work_tree(dir.path());
    let runner = Arc::new(PsqlRunner::new(PsqlRunnerConfig::default()).expect("psql runner"));
    let (cluster, verifier, standing_lease, standing) = rt.block_on(async {
        let cluster = consort_testkit::cluster::cluster().await;
        let provider: Arc<dyn BranchProvider> = consort_testkit::cluster::provider().await;
        let pool = BranchPool::new(provider.clone(), consort_testkit::cluster::pool_config(2));
        let spec = consort_testkit::cluster::base_spec(migrations(None));
        pool.warm(&spec).await.expect("warm");
        // The database that is already there: a branch of the same base, held for the bench.
        let standing = pool.acquire(&spec).await.expect("standing branch");
        let info = provider
            .connect_info(standing.lease.branch())
            .await
            .expect("info");
        let verifier = Verifier::new(pool, runner.clone(), vec![]);
        (cluster, verifier, standing, info)
    });
    let unconfined = verifier.clone().with_sandbox(SandboxMode::Off);
    let fx = Fixture {
        rt,
        verifier,
        unconfined,
        runner,
        psql: consort::lakebase::find_psql().expect("psql"),
        dir,
        standing,
        next: std::cell::Cell::new(0),
    };

    let mut g = common::group(c, "verify", 200, 3);
    common::bench_timed(
        &mut g,
        "verify one psql file (warm pool, base reused)",
        || fx.verify(),
    );
    common::bench_timed(&mut g, "psql runner alone on an existing database", || {
        fx.runner_only()
    });
    common::bench_timed(
        &mut g,
        "floor: the same psql command on an existing database",
        || fx.bare_psql(),
    );
    g.finish();

    if common::profiling() {
        return;
    }
    // ---- side by side, interleaved
    let pair = interleave(21, || fx.verify(), || fx.bare_psql());
    let extra_ms = (pair.figure.as_secs_f64() - pair.floor.as_secs_f64()) * 1e3;
    report_ratio(
        "verify one psql file",
        &pair,
        "the same psql command on an existing database",
        None,
    );
    report_line(
        "verify overhead",
        &format!(
            "{extra_ms:+.1} ms at the median | goal ≤ +30 ms: {}",
            if extra_ms <= 30.0 { "met" } else { "MISSED" }
        ),
    );
    let jail = interleave(21, || fx.verify(), || fx.verify_with(&fx.unconfined));
    let jail_ms = (jail.figure.as_secs_f64() - jail.floor.as_secs_f64()) * 1e3;
    report_ratio(
        "verify, confined (Landlock)",
        &jail,
        "the same verification unconfined",
        None,
    );
    let snapshot_ms = common::median_of(21, || {
        let t = Instant::now();
        let tree = consort::actors::WorkTree::open(fx.dir.path()).expect("open");
        let files = tree.file_hashes().expect("hash");
        assert_eq!(files.len(), 15);
        t.elapsed()
    })
    .as_secs_f64()
        * 1e3;
    let total_ms = jail_ms + snapshot_ms;
    report_line(
        "confinement + after-run comparison",
        &format!(
            "{jail_ms:+.2} ms (Landlock) + {snapshot_ms:.2} ms (one snapshot of 15 files) = {total_ms:+.2} ms at the median | goal ≤ +5 ms: {}",
            if total_ms <= 5.0 { "met" } else { "MISSED" }
        ),
    );
    let runner = interleave(15, || fx.runner_only(), || fx.bare_psql());
    report_ratio(
        "psql runner alone",
        &runner,
        "the same psql command by hand",
        None,
    );
    let mut cold = Vec::new();
    for n in 0..5 {
        cold.push(fx.verify_new_base(n));
    }
    cold.sort();
    let (d, migrate, acquire, run) = cold[cold.len() / 2];
    report_line(
        "verify with changed migrations (new base)",
        &format!(
            "median {} (receipt timings: migrate {migrate} ms, acquire {acquire} ms, run {run} ms)",
            common::fmt(d)
        ),
    );

    // ---- clean up
    fx.rt.block_on(async {
        standing_lease.lease.release(false).await.expect("release");
        fx.verifier.pool().shutdown().await.expect("shutdown");
    });
    let stats = fx.verifier.pool().stats();
    report_line(
        "branches after the bench",
        &format!(
            "created {} dropped {} live {}",
            stats.created, stats.dropped, stats.live
        ),
    );
    drop(fx);
    cluster.stop().expect("stop the cluster");
}

criterion_group!(benches, bench);
criterion_main!(benches);
