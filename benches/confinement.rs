//! What confinement costs a run: one process (`true`) through the command runner, unconfined
//! (`sandbox = "off"`), under Landlock alone (as on a kernel that refuses namespaces), and in
//! namespaces of its own (a user, network and mount namespace, its loopback brought up, a
//! devpts instance mounted, its branch's listener handed over and forwarded), each beside the
//! bare run in the same rounds; and what the forwarder adds to a query: a psql session of 500
//! `SELECT 1` through the forwarder beside the same session straight to the branch (Landlock
//! alone), per query. Goal: the namespaces add at most 10 ms to a run and the forwarder at most
//! 0.1 ms to a query.

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{interleave, report_line, report_ratio};
use consort::lakebase::{
    BaseSpec, BranchProvider, CommandRunner, CommandRunnerConfig, RunContext, SandboxMode,
    TestRunner,
};
use criterion::{Criterion, criterion_group, criterion_main};

/// How many queries the session of the round-trip figure makes.
const QUERIES: usize = 500;

struct Fixture {
    rt: tokio::runtime::Runtime,
    bare: RunContext,
    alone: RunContext,
    namespaced: RunContext,
    one_process: CommandRunner,
    session: CommandRunner,
}

impl Fixture {
    /// One process's run confined as `figure` says beside the same run as `floor` says
    /// (interleaved, 31 rounds), reported under their names.
    fn one_process_beside(
        &self,
        (figure_name, figure): (&str, &RunContext),
        (floor_name, floor): (&str, &RunContext),
    ) -> common::Pair {
        let pair = interleave(
            31,
            || self.time(&self.one_process, figure),
            || self.time(&self.one_process, floor),
        );
        report_ratio(figure_name, &pair, floor_name, None);
        pair
    }

    fn time(&self, runner: &CommandRunner, ctx: &RunContext) -> Duration {
        self.rt.block_on(async {
            let t = Instant::now();
            let r = runner.run(ctx).await.expect("the run is reported");
            let d = t.elapsed();
            assert!(r.exit.success(), "{}", r.output_excerpt);
            d
        })
    }
}

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let dir = tempfile::tempdir().expect("tree");
    let queries = "SELECT 1;\n".repeat(QUERIES);
    std::fs::write(dir.path().join("queries.sql"), queries).expect("queries");
    let (cluster, provider, branch, contexts) = rt.block_on(async {
        let cluster = consort_testkit::cluster::cluster().await;
        let provider = consort_testkit::cluster::provider().await;
        let (branch, conn) =
            consort_testkit::cluster::fresh_branch(&*provider, &BaseSpec::default()).await;
        let ctx = |mode| {
            RunContext::prepare(
                dir.path().to_path_buf(),
                conn.clone(),
                mode,
                provider.private_paths(),
                Vec::new(),
            )
            .expect("context")
        };
        let contexts = [
            ctx(SandboxMode::Off),
            ctx(SandboxMode::LandlockAlone),
            ctx(SandboxMode::Landlock),
        ];
        (cluster, provider, branch, contexts)
    });
    let [bare, alone, namespaced] = contexts;
    report_line(
        "confinements compared",
        &format!(
            "{} | {} | {}",
            bare.jail.confinement(),
            alone.jail.confinement(),
            namespaced.jail.confinement()
        ),
    );
    let fx = Fixture {
        rt,
        bare,
        alone,
        namespaced,
        one_process: CommandRunner::new(CommandRunnerConfig::new("true")),
        session: CommandRunner::new(CommandRunnerConfig::new(
            "psql -X -q -v ON_ERROR_STOP=1 -f queries.sql > /dev/null",
        )),
    };

    let mut g = common::group(c, "confinement", 200, 3);
    for (name, ctx) in [
        ("one process, unconfined", &fx.bare),
        ("one process, Landlock alone", &fx.alone),
        ("one process, in namespaces of its own", &fx.namespaced),
    ] {
        common::bench_timed(&mut g, name, || fx.time(&fx.one_process, ctx));
    }
    g.finish();
    if common::profiling() {
        return;
    }

    fx.one_process_beside(
        ("a run under Landlock alone", &fx.alone),
        ("the same run unconfined", &fx.bare),
    );
    fx.one_process_beside(
        ("a run in namespaces of its own", &fx.namespaced),
        ("the same run unconfined", &fx.bare),
    );
    let beside = fx.one_process_beside(
        ("a run in namespaces of its own", &fx.namespaced),
        ("the same run under Landlock alone", &fx.alone),
    );
    let added_ms = (beside.figure.as_secs_f64() - beside.floor.as_secs_f64()) * 1e3;
    report_line(
        "namespaces, forwarder and devpts per run",
        &format!(
            "{added_ms:+.2} ms at the median | goal ≤ +10 ms: {}",
            if added_ms <= 10.0 { "met" } else { "MISSED" }
        ),
    );
    let trip = interleave(
        15,
        || fx.time(&fx.session, &fx.namespaced),
        || fx.time(&fx.session, &fx.alone),
    );
    let per_query_us =
        (trip.figure.as_secs_f64() - trip.floor.as_secs_f64()) * 1e6 / QUERIES as f64;
    report_ratio(
        &format!("a session of {QUERIES} queries through the forwarder"),
        &trip,
        "the same session straight to the branch",
        None,
    );
    report_line(
        "the forwarder per query",
        &format!(
            "{per_query_us:+.1} µs at the median ({} vs {} per query) | goal ≤ +100 µs: {}",
            common::fmt(trip.figure / QUERIES as u32),
            common::fmt(trip.floor / QUERIES as u32),
            if per_query_us <= 100.0 {
                "met"
            } else {
                "MISSED"
            }
        ),
    );

    fx.rt.block_on(async {
        provider
            .delete(&branch.name)
            .await
            .expect("drop the branch");
    });
    drop(fx);
    cluster.stop().expect("stop the cluster");
}

criterion_group!(benches, bench);
criterion_main!(benches);
