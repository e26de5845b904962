//! The scripted StockFlow ensemble end to end (`consort init --example stockflow`, every gate
//! approved by `ApproveAs`): wall time of the run, and its share in orchestration, branch work
//! and test runs, derived from the receipts' timings (`acquire_ms + migrate_ms` = branch work,
//! `run_ms` = test runs; the rest of the run's wall time is orchestration: the conductor, the
//! ledger's fsyncs, the work tree, hashing, releasing branches). The floor is the test runs
//! themselves: the work no orchestration can avoid.
//!
//! Then 32 concurrent verifications through the Lakebase actor (each on its own fresh branch):
//! throughput beside the same 32 psql runs at once on one existing database, errors, and the
//! branches, roles and pool counters left afterwards (leaks).
//!
//! `cargo bench --bench ensemble`

#[path = "../../benches/common/mod.rs"]
mod common;

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{median, report_line, report_ratio};
use consort::RunOutcome;
use consort::actors::{DirectLakebase, LakebaseEndpoint};
use consort::actors::{Migration, TestStatus};
use consort::lakebase::EnvPolicy;
use consort::lakebase::{
    BranchPool, BranchProvider, ConnectInfo, EmbeddedCluster, LakebaseActor, LakebaseArgs,
    PsqlRunner, PsqlRunnerConfig, Secret, SslMode, connect,
};
use consort::project::Project;
use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;

/// What one StockFlow run measured.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    build: Duration,
    run: Duration,
    shutdown: Duration,
    receipts: usize,
    events: usize,
    acquire_ms: u64,
    migrate_ms: u64,
    run_ms: u64,
    branches_live_after: u64,
}

fn stockflow(rt: &Runtime) -> Run {
    let dir = tempfile::tempdir().expect("project dir");
    // Reachable by the server's user, so the cluster lives in the project (and goes with it).
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    consort_cli::init::init(
        dir.path(),
        Some(consort_cli::init::Example::Stockflow),
        false,
    )
    .expect("consort init --example stockflow");
    rt.block_on(async {
        let project = Project::open(dir.path()).expect("project");
        let t = Instant::now();
        let ensemble = project
            .ensemble(common::approving())
            .await
            .expect("ensemble");
        let build = t.elapsed();
        let t = Instant::now();
        let report = ensemble.run().await.expect("run");
        let run = t.elapsed();
        assert_eq!(report.outcome, RunOutcome::Done, "StockFlow runs to done");
        let t = Instant::now();
        let stats = ensemble.shutdown().await;
        let shutdown = t.elapsed();
        let r = &report.state.receipts;
        Run {
            build,
            run,
            shutdown,
            receipts: r.len(),
            events: report.events_appended,
            acquire_ms: r.iter().map(|x| x.timings.acquire_ms).sum(),
            migrate_ms: r.iter().map(|x| x.timings.migrate_ms).sum(),
            run_ms: r.iter().map(|x| x.timings.run_ms).sum(),
            branches_live_after: stats.live,
        }
    })
}

// ---------------------------------------------------------------- 32 concurrent verifications

const CONCURRENT: usize = 32;
const TEST_FILE: &str = "tests/t01.sql";

fn migrations() -> Vec<Migration> {
    vec![Migration {
        version: "0001".into(),
        story_id: "S1".into(),
        description: "stock records".into(),
        sql: "CREATE TABLE stock (id bigint PRIMARY KEY, sku text NOT NULL, qty int NOT NULL)"
            .into(),
    }]
}

fn admin_info(cluster: &EmbeddedCluster) -> ConnectInfo {
    let password = std::fs::read_to_string(cluster.dir().join("admin.pw")).expect("admin.pw");
    ConnectInfo {
        host: cluster.socket_dir().display().to_string(),
        port: cluster.port(),
        database: "postgres".into(),
        user: cluster.superuser().into(),
        secret: Secret::new(password.trim()),
        expires_at: None,
        sslmode: SslMode::Disable,
        ca_file: None,
    }
}

struct Burst {
    wall: Duration,
    errors: usize,
    failed_tests: usize,
    databases_left: i64,
    roles_left: i64,
    created: u64,
    live: u64,
    from_pool: u64,
    on_demand: u64,
    bare_wall: Duration,
}

fn burst(rt: &Runtime) -> Burst {
    let dir = tempfile::tempdir().expect("work tree");
    std::fs::create_dir_all(dir.path().join("tests")).expect("tests");
    std::fs::write(
        dir.path().join(TEST_FILE),
        "INSERT INTO stock (id, sku, qty) VALUES (pg_backend_pid(), 'sku', 5);\n\
         DO $$ BEGIN\n\
           IF (SELECT qty FROM stock WHERE id = pg_backend_pid()) <> 5 THEN RAISE EXCEPTION 'wrong'; END IF;\n\
         END $$;\n",
    )
    .expect("test file");
    rt.block_on(async {
        let cluster = consort_testkit::cluster::cluster().await;
        let provider: Arc<dyn BranchProvider> = consort_testkit::cluster::provider().await;
        let runner = Arc::new(PsqlRunner::new(PsqlRunnerConfig::default()).expect("runner"));
        let mut args = LakebaseArgs::new(provider.clone(), runner);
        args.max_concurrent = CONCURRENT;
        let stats = args.stats.clone();
        let (actor, join) = LakebaseActor::spawn(args).await.expect("lakebase actor");
        let lakebase = Arc::new(DirectLakebase {
            actor: actor.clone(),
        });
        // Build the base once (as a run's first verification would), untimed.
        let req = |n: u64| common::bench_request(n, dir.path(), migrations(), TEST_FILE);
        lakebase
            .verify(req(0), Duration::from_secs(120))
            .await
            .expect("first verification");
        tokio::time::sleep(Duration::from_millis(500)).await; // let the pool refill
        let before = stats.snapshot();

        let t = Instant::now();
        let tasks: Vec<_> = (1..=CONCURRENT as u64)
            .map(|n| {
                let lb = lakebase.clone();
                let r = req(n);
                tokio::spawn(async move { lb.verify(r, Duration::from_secs(300)).await })
            })
            .collect();
        let mut errors = 0;
        let mut failed_tests = 0;
        for task in tasks {
            match task.await {
                Ok(Ok(receipt)) => {
                    if receipt
                        .outcomes
                        .iter()
                        .any(|o| o.status != TestStatus::Passed)
                    {
                        failed_tests += 1;
                    }
                }
                Ok(Err(e)) => {
                    eprintln!("verification error: {e:?}");
                    errors += 1;
                }
                Err(e) => {
                    eprintln!("task error: {e}");
                    errors += 1;
                }
            }
        }
        let wall = t.elapsed();
        let after = stats.snapshot();

        // The floor: the same 32 psql runs at once, on one database that is already there.
        let pool = BranchPool::new(provider.clone(), consort_testkit::cluster::pool_config(0));
        let spec = consort_testkit::cluster::base_spec(migrations());
        let standing = pool.acquire(&spec).await.expect("standing branch");
        let info = provider
            .connect_info(standing.lease.branch())
            .await
            .expect("info");
        let psql = consort::lakebase::find_psql().expect("psql");
        let env = EnvPolicy::default().build(&info);
        let t = Instant::now();
        let runs: Vec<_> = (0..CONCURRENT)
            .map(|_| common::bare_psql(&psql, TEST_FILE, dir.path(), env.clone()).output())
            .collect();
        for r in runs {
            let out = r.await.expect("psql");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let bare_wall = t.elapsed();
        standing.lease.release(false).await.expect("release");
        pool.shutdown().await.expect("pool shutdown");

        // Stop the actor: its pool drops the ready branches and sweeps; then count what is left.
        actor.stop(None);
        let _ = join.await;
        let admin = connect(&admin_info(&cluster)).await.expect("admin");
        let databases_left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_database WHERE datname LIKE 'consort\\_%'",
                &[],
            )
            .await
            .expect("count")
            .get(0);
        let roles_left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'consort\\_%'",
                &[],
            )
            .await
            .expect("count")
            .get(0);
        drop(admin);
        let end = stats.snapshot();
        drop(provider);
        cluster.stop().expect("stop");
        Burst {
            wall,
            errors,
            failed_tests,
            databases_left,
            roles_left,
            created: end.created,
            live: end.live,
            from_pool: after.served_from_pool - before.served_from_pool,
            on_demand: after.created_on_demand - before.created_on_demand,
            bare_wall,
        }
    })
}

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let runs: RefCell<Vec<Run>> = RefCell::new(Vec::new());

    let mut g = c.benchmark_group("ensemble");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));
    g.bench_function("StockFlow end to end (build + run + shutdown)", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let r = stockflow(&rt);
                total += r.build + r.run + r.shutdown;
                runs.borrow_mut().push(r);
            }
            total
        })
    });
    g.finish();

    if common::profiling() {
        return;
    }
    let runs = runs.into_inner();
    let n = runs.len();
    let med = |f: &dyn Fn(&Run) -> Duration| {
        let mut v: Vec<Duration> = runs.iter().map(f).collect();
        median(&mut v)
    };
    let ms = Duration::from_millis;
    let run = med(&|r| r.run);
    let build = med(&|r| r.build);
    let shutdown = med(&|r| r.shutdown);
    let tests = med(&|r| ms(r.run_ms));
    let branch = med(&|r| ms(r.acquire_ms + r.migrate_ms));
    let orchestration = med(&|r| {
        r.run
            .saturating_sub(ms(r.run_ms + r.acquire_ms + r.migrate_ms))
    });
    let first = runs.first().copied().unwrap_or_default();
    let pct = |d: Duration| 100.0 * common::ratio(d, run);
    let live_after = runs.iter().map(|r| r.branches_live_after).max();
    let (start, whole, stop) = (common::fmt(build), common::fmt(run), common::fmt(shutdown));
    report_line(
        "StockFlow",
        &format!(
            "{n} runs; median: start {start} + run {whole} + shutdown {stop}; {} receipts, {} ledger events; branches live after shutdown: {}",
            first.receipts,
            first.events,
            live_after.unwrap_or(0)
        ),
    );
    report_line(
        "StockFlow run shares (medians)",
        &format!(
            "test runs {} ({:.0} %) | branch work {} ({:.0} %) | orchestration and the rest {} ({:.0} %)",
            common::fmt(tests),
            pct(tests),
            common::fmt(branch),
            pct(branch),
            common::fmt(orchestration),
            pct(orchestration)
        ),
    );
    report_ratio(
        "StockFlow run",
        &common::Pair {
            figure: run,
            floor: tests,
            round_ratio: common::median_ratio(
                runs.iter()
                    .map(|x| x.run.as_secs_f64() / (x.run_ms.max(1) as f64 / 1000.0))
                    .collect(),
            ),
        },
        "its test runs alone (Σ run_ms)",
        None,
    );

    let b = burst(&rt);
    let per_s = CONCURRENT as f64 / b.wall.as_secs_f64();
    let bare_per_s = CONCURRENT as f64 / b.bare_wall.as_secs_f64();
    report_line(
        "32 concurrent verifications",
        &format!(
            "{per_s:.1} verifications/s, floor (32 psql runs at once on one existing database) {bare_per_s:.1}/s; wall {} | errors {} | failed tests {} | served warm {} / created on demand {}",
            common::versus(b.wall, b.bare_wall),
            b.errors,
            b.failed_tests,
            b.from_pool,
            b.on_demand
        ),
    );
    report_line(
        "leaks after the 32",
        &format!(
            "{} branch databases, {} branch roles left; pool created {} live {}",
            b.databases_left, b.roles_left, b.created, b.live
        ),
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
