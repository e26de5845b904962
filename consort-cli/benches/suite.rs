//! What a step pays as the project's own suite grows. A generated pytest project (the
//! pyservice example's configuration and request, its script made a five-entry feature whose
//! first GREEN fails once) whose own suite has about 50, 200 and 800 tests, each opening a
//! connection to the run's branch and querying it, is driven to done three times in the same run:
//! the suite run whole (`[runner] shards = 1`, as before suites were split), split from the
//! first run (`split_above_secs = 0`), and split with `per_step = "feature"`. Each size's figures: the feature's wall
//! time, its verifications, per verification the branch's acquire, its migrations and the run
//! (from the receipts), a passing full verification and the failing GREEN; then each against
//! whole, beside the goals.
//!
//! Needs `python3` with `pytest` and `psycopg` (`.ci/run` installs them).
//!
//! `cargo bench --bench suite`

#[path = "../../benches/common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::report_line;
use consort::actors::{ApproveAs, RunOutcome};
use consort::project::{Project, RunOptions};
use criterion::{Criterion, criterion_group, criterion_main};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/pyservice/data");

/// The project's own tests per generated file.
const TESTS_PER_FILE: usize = 10;

/// The entries the feature adds to pyservice's two, each a test of its own module.
const EXTRA: std::ops::RangeInclusive<usize> = 3..=5;

/// The pyservice script made a five-entry feature whose first GREEN fails once: T3–T5 each
/// test a module of their own (RED: the module is missing), and T1's first GREEN writes a
/// function that stores the wrong quantity, repaired by the next answer.
fn script() -> String {
    let base = std::fs::read_to_string(Path::new(FIXTURE).join("script.toml")).expect("script");
    let anchor = "test_name = \"tests.test_t2_item_total::test_the_total_sums_every_quantity\"\n";
    let mut list = String::from(anchor);
    let mut steps = String::new();
    for n in EXTRA {
        list.push_str(&format!(
            "[[entry.artifact.body.entries]]\nid = \"T{n}\"\nac_id = \"S1-AC2\"\ndescription = \"answer {n} is {n}\"\npath = \"tests/test_t{n}_answer.py\"\ntest_name = \"tests.test_t{n}_answer::test_answer_{n}\"\n"
        ));
        steps.push_str(&format!(
            "\n[[entry]]\nstep = \"red/T{n}\"\n[entry.artifact]\nkind = \"change-set\"\n[entry.artifact.body]\nsummary = \"T{n}\"\n[[entry.artifact.body.changes]]\nop = \"write\"\npath = \"tests/test_t{n}_answer.py\"\ncontent = \'\'\'\nimport os\n\nimport psycopg\n\n\ndef test_answer_{n}():\n    from app import answer_{n}\n\n    with psycopg.connect(os.environ[\"DATABASE_URL\"]) as conn:\n        assert answer_{n}.answer(conn) == {n}\n\'\'\'\n\n[[entry]]\nstep = \"green/T{n}\"\n[entry.artifact]\nkind = \"change-set\"\n[entry.artifact.body]\nsummary = \"answer {n}\"\n[[entry.artifact.body.changes]]\nop = \"write\"\npath = \"app/answer_{n}.py\"\ncontent = \'\'\'\ndef answer(conn):\n    return conn.execute(\"SELECT {n}\").fetchone()[0]\n\'\'\'\n"
        ));
    }
    let wrong_green = "[[entry]]\nstep = \"green/T1\"\n[entry.artifact]\nkind = \"change-set\"\n[entry.artifact.body]\nsummary = \"add_item, wrongly\"\n[[entry.artifact.body.changes]]\nop = \"write\"\npath = \"app/items.py\"\ncontent = \'\'\'\ndef add_item(conn, sku, qty):\n    conn.execute(\"INSERT INTO items (sku, qty) VALUES (%s, %s)\", (sku, qty + 1))\n\'\'\'\n\n[[entry]]\nstep = \"repair/T1/1\"\n";
    assert!(base.contains(anchor) && base.contains("[[entry]]\nstep = \"green/T1\"\n"));
    base.replace(anchor, &list)
        .replace("[[entry]]\nstep = \"green/T1\"\n", wrong_green)
        + &steps
}

/// How a run of the bench sets `[runner]`.
#[derive(Clone, Copy)]
enum Mode {
    /// `shards = 1`: every run whole, in one process on one branch (as before suites split).
    Whole,
    /// Suites split over branches from the first run (`split_above_secs = 0`; the default
    /// 4 s, which these suites stay under once a run starts in 0.5 s, would run them whole).
    Split,
    /// Split, and `per_step = "feature"`: a step runs the feature's own tests.
    Feature,
}

impl Mode {
    fn runner_lines(self) -> &'static str {
        match self {
            Mode::Whole => "shards = 1\n",
            Mode::Split => "split_above_secs = 0\n",
            Mode::Feature => "split_above_secs = 0\nper_step = \"feature\"\n",
        }
    }
}

/// The pyservice project with an own suite of `tests` tests (in files of ten), each querying
/// the run's branch, the five-entry feature's script, and `[runner]` set as `mode` says.
fn project(tests: usize, mode: Mode) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    // Reachable by the server's user, so the cluster lives in the project (and goes with it).
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    for file in ["consort.toml", "feature.md"] {
        std::fs::copy(Path::new(FIXTURE).join(file), dir.join(file)).expect("the fixture");
    }
    let config = std::fs::read_to_string(dir.join("consort.toml")).expect("config");
    let config = config.replace("[runner]\n", &format!("[runner]\n{}", mode.runner_lines()));
    std::fs::write(dir.join("consort.toml"), config).expect("config");
    std::fs::create_dir_all(dir.join(".consort/agents")).expect("mkdir");
    std::fs::write(dir.join(".consort/agents/script.toml"), script()).expect("script");
    std::fs::create_dir_all(dir.join("tests")).expect("tests");
    for file in 0..tests.div_ceil(TESTS_PER_FILE) {
        let mut text = String::from(
            "import os\n\nimport psycopg\n\n\ndef _relations():\n    with psycopg.connect(os.environ[\"DATABASE_URL\"]) as conn:\n        return conn.execute(\"SELECT count(*) FROM pg_catalog.pg_class\").fetchone()[0]\n",
        );
        for test in 0..TESTS_PER_FILE.min(tests - file * TESTS_PER_FILE) {
            text.push_str(&format!(
                "\n\ndef test_existing_{file}_{test}():\n    assert _relations() > 0\n"
            ));
        }
        std::fs::write(dir.join(format!("tests/test_existing_{file:03}.py")), text)
            .expect("a test file");
    }
    tmp
}

/// One feature driven to done on a project with `tests` tests of its own.
struct Curve {
    wall: Duration,
    verifications: usize,
    acquire: Duration,
    migrate: Duration,
    run: Duration,
    /// The median run of a passing verification before the deploy run.
    full: Duration,
    /// The run of the failing GREEN (T1's first).
    failing_green: Duration,
}

fn drive(rt: &tokio::runtime::Runtime, tests: usize, mode: Mode) -> Curve {
    let tmp = project(tests, mode);
    let t = Instant::now();
    let report = rt.block_on(async {
        let project = Project::open(tmp.path()).expect("project");
        let ensemble = project
            .ensemble(RunOptions {
                approver: Some(Arc::new(ApproveAs {
                    name: "bench".into(),
                })),
                ..RunOptions::default()
            })
            .await
            .expect("ensemble");
        let report = ensemble.run().await.expect("run");
        ensemble.shutdown().await;
        report
    });
    let wall = t.elapsed();
    assert_eq!(report.outcome, RunOutcome::Done, "{tests} tests: done");
    let receipts = &report.state.receipts;
    let sum = |f: fn(&consort::actors::RunTimings) -> u64| {
        Duration::from_millis(receipts.iter().map(|r| f(&r.timings)).sum())
    };
    let ms = |r: &Arc<consort::actors::TestRunReceipt>| Duration::from_millis(r.timings.run_ms);
    let fails = |r: &consort::actors::TestRunReceipt, test: &str| {
        r.outcomes
            .iter()
            .any(|o| o.is_failure() && o.name.contains(test))
    };
    let mut passing: Vec<Duration> = receipts[..receipts.len().saturating_sub(1)]
        .iter()
        .filter(|r| !r.outcomes.iter().any(|o| o.is_failure()))
        .map(ms)
        .collect();
    let failing_green = receipts
        .iter()
        .filter(|r| fails(r, "test_add_item_stores_exactly_that_item"))
        .nth(1)
        .map(ms)
        .expect("T1's failing GREEN");
    Curve {
        wall,
        verifications: receipts.len(),
        acquire: sum(|t| t.acquire_ms),
        migrate: sum(|t| t.migrate_ms),
        run: sum(|t| t.run_ms),
        full: common::median(&mut passing),
        failing_green,
    }
}

fn describe(c: &Curve) -> String {
    let per = |d: Duration| common::fmt(d / c.verifications.max(1) as u32);
    format!(
        "feature {} over {} verifications; per verification: acquire {}, migrate {}, run {}; a full verification {}, the failing GREEN {}",
        common::fmt(c.wall),
        c.verifications,
        per(c.acquire),
        per(c.migrate),
        per(c.run),
        common::fmt(c.full),
        common::fmt(c.failing_green),
    )
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let mut g = common::group(c, "suite", 1, 1);
    common::bench_timed(
        &mut g,
        "the five-entry feature, 50 own tests, split",
        || drive(&rt, 50, Mode::Split).wall,
    );
    g.finish();
    if common::profiling() {
        return;
    }
    let goal = |r: f64, g: f64| {
        if r <= g {
            format!("goal ≤ {g}×: met")
        } else {
            format!("goal ≤ {g}×: MISSED")
        }
    };
    for tests in [50, 200, 800] {
        let whole = drive(&rt, tests, Mode::Whole);
        let split = drive(&rt, tests, Mode::Split);
        let feature = drive(&rt, tests, Mode::Feature);
        report_line(
            &format!("pytest, {tests} own tests, whole"),
            &describe(&whole),
        );
        report_line(
            &format!("pytest, {tests} own tests, split"),
            &describe(&split),
        );
        report_line(
            &format!("pytest, {tests} own tests, split, per_step = feature"),
            &describe(&feature),
        );
        let (full, failing, by_split, by_feature) = (
            ratio(split.full, whole.full),
            ratio(split.failing_green, whole.failing_green),
            ratio(split.wall, whole.wall),
            ratio(feature.wall, whole.wall),
        );
        report_line(
            &format!("pytest, {tests} own tests, against whole"),
            &format!(
                "split: full verification {full:.2}× ({}), failing GREEN {failing:.2}× ({}), the feature {by_split:.2}× ({}); per_step = feature: the feature {by_feature:.2}× ({})",
                goal(full, 0.5),
                goal(failing, 0.2),
                goal(by_split, 0.5),
                goal(by_feature, 0.5)
            ),
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
