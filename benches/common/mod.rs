//! Shared by the benches: the scripted lifecycle of `consort_testkit` (valid artifacts for
//! every step, a simulated conductor that answers the pure machine's commands), interleaved
//! side-by-side timing, and the one-line summaries every bench prints beside criterion's own
//! output.
//!
//! Each bench includes this file with `#[path = "common/mod.rs"] mod common;` and uses only
//! part of it.
#![allow(dead_code)]

use std::time::Duration;

#[allow(unused_imports)] // each bench uses part of it
pub(crate) use consort_testkit::artifacts::{feature, spec, stories};
#[allow(unused_imports)]
pub(crate) use consort_testkit::simulation::{Script, Simulation, artifact_for, machine_config};

// ---------------------------------------------------------------- side-by-side timing

/// The median of some durations.
pub(crate) fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[v.len() / 2]
}

/// A figure and its floor, measured alternately in the same run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pair {
    /// The median of the figure.
    pub figure: Duration,
    /// The median of the floor.
    pub floor: Duration,
    /// The median of the per-round ratios figure / floor (each round measures both back to
    /// back, so load that drifts during the run cancels out).
    pub round_ratio: f64,
}

impl Pair {
    /// The ratio of the medians.
    pub(crate) fn ratio(&self) -> f64 {
        ratio(self.figure, self.floor)
    }
}

/// Runs `figure` and `floor` alternately, `rounds` times each (so both see the same machine
/// noise). Each closure returns the time of one operation.
pub(crate) fn interleave(
    rounds: usize,
    mut figure: impl FnMut() -> Duration,
    mut floor: impl FnMut() -> Duration,
) -> Pair {
    let mut a = Vec::with_capacity(rounds);
    let mut b = Vec::with_capacity(rounds);
    let mut r = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let (x, y) = if i % 2 == 0 {
            let x = figure();
            (x, floor())
        } else {
            let y = floor();
            (figure(), y)
        };
        a.push(x);
        b.push(y);
        r.push(ratio(x, y));
    }
    Pair {
        figure: median(&mut a),
        floor: median(&mut b),
        round_ratio: median_ratio(r),
    }
}

/// `a / b`, a zero `b` counted as one nanosecond (the smallest duration there is).
pub(crate) fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

/// The median of some ratios (NaN when there are none).
pub(crate) fn median_ratio(mut r: Vec<f64>) -> f64 {
    r.sort_by(f64::total_cmp);
    r.get(r.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The median of `rounds` runs of `f`.
pub(crate) fn median_of(rounds: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let mut v: Vec<Duration> = (0..rounds).map(|_| f()).collect();
    median(&mut v)
}

/// A criterion group of 10 samples, warmed up for `warm_up_ms` milliseconds and measured for
/// `measure_secs` seconds.
pub(crate) fn group<'a>(
    c: &'a mut criterion::Criterion,
    name: &str,
    warm_up_ms: u64,
    measure_secs: u64,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(warm_up_ms))
        .measurement_time(Duration::from_secs(measure_secs));
    g
}

/// Benchmarks `id` in `g` as the sum of what `once` measures each time it runs.
pub(crate) fn bench_timed(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    id: impl Into<String>,
    mut once: impl FnMut() -> Duration,
) {
    g.bench_function(id.into(), |b| {
        b.iter_custom(|iters| (0..iters).map(|_| once()).sum())
    });
}

/// Whether criterion was asked to profile (`--profile-time`): then the benches skip their
/// side-by-side summaries, so that a profiler sees only the benchmark selected by the filter.
pub(crate) fn profiling() -> bool {
    std::env::args().any(|a| a == "--profile-time")
}

/// A duration in a readable unit.
pub(crate) fn fmt(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns < 1_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.2} µs", ns / 1e3)
    } else if ns < 1_000_000_000.0 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Prints one summary line: the figure beside its floor, their ratios, and the goal (judged
/// on the median of the per-round ratios).
pub(crate) fn report_ratio(name: &str, pair: &Pair, floor_name: &str, goal: Option<f64>) {
    let verdict = match goal {
        Some(g) if pair.round_ratio <= g => format!(" | goal ≤ {g}×: met"),
        Some(g) => format!(" | goal ≤ {g}×: MISSED"),
        None => String::new(),
    };
    println!(
        "SUMMARY {name}: {} | floor ({floor_name}): {} | ratio {:.2}× (per-round median {:.2}×){verdict}",
        fmt(pair.figure),
        fmt(pair.floor),
        pair.ratio(),
        pair.round_ratio
    );
}

/// A figure beside the one it is compared with: `8.00 s vs 16.00 s: 0.50×`.
pub(crate) fn versus(figure: Duration, against: Duration) -> String {
    format!(
        "{} vs {}: {:.2}×",
        fmt(figure),
        fmt(against),
        ratio(figure, against)
    )
}

/// Prints one summary line for an absolute or additive goal.
pub(crate) fn report_line(name: &str, text: &str) {
    println!("SUMMARY {name}: {text}");
}

/// The benches' multi-thread runtime: two workers, like the machine.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// What a bench's run of a project is given: every gate approved as "bench".
pub(crate) fn approving() -> consort::project::RunOptions {
    consort::project::RunOptions {
        approver: Some(std::sync::Arc::new(consort::actors::ApproveAs {
            name: "bench".into(),
        })),
        ..consort::project::RunOptions::default()
    }
}

/// Runs `project`'s current feature once, every gate approved ([`approving`]): build the
/// ensemble, run, shut down; the report.
pub(crate) fn run_once(
    rt: &tokio::runtime::Runtime,
    project: &consort::project::Project,
) -> consort::actors::RunReport {
    rt.block_on(async {
        let ensemble = project.ensemble(approving()).await.expect("ensemble");
        let report = ensemble.run().await.expect("run");
        ensemble.shutdown().await;
        report
    })
}

/// The psql command the runner issues for one test file, by hand: `-X -q -v ON_ERROR_STOP=1
/// -c BEGIN -f <file> -c ROLLBACK` in `dir`, with exactly the environment `env`.
pub(crate) fn bare_psql(
    psql: &std::path::Path,
    file: &str,
    dir: &std::path::Path,
    env: impl IntoIterator<Item = (String, String)>,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(psql);
    cmd.args([
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "-c",
        "BEGIN",
        "-f",
        file,
        "-c",
        "ROLLBACK",
    ])
    .current_dir(dir)
    .env_clear()
    .envs(env);
    cmd
}

/// A GREEN verification request for the one test file `test` of `tree`, with `migrations`.
pub(crate) fn bench_request(
    id: u64,
    tree: &std::path::Path,
    migrations: Vec<consort::actors::Migration>,
    test: &str,
) -> consort::actors::VerifyRequest {
    let mut req = consort_testkit::verify::request(id, tree, migrations);
    req.workspace_hash = consort::actors::ContentHash::of_bytes(b"bench");
    req.tests = vec![test.into()];
    req
}

/// Runs git with `args` in `dir`; panics, naming the arguments, when it fails.
pub(crate) fn git(dir: &std::path::Path, args: &[&str]) {
    let o = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert!(o.status.success(), "git {args:?}: {o:?}");
}

/// A generated test file: `head`, then `test(i)` for each of `count` tests, then `tail`.
pub(crate) fn file_of_tests(
    head: &str,
    count: usize,
    test: impl Fn(usize) -> String,
    tail: &str,
) -> String {
    let tests: String = (0..count).map(test).collect();
    format!("{head}{tests}{tail}")
}
