//! What a step pays as the project's own suite grows. A generated pytest project (the
//! pyservice example's configuration and request, its script made a five-entry feature whose
//! first GREEN fails once) and a generated vitest 3 project (the same design, five entries of
//! their own, the first GREEN failing once) whose own suites have about 50, 200 and 800 tests,
//! each opening a connection to the run's branch and querying it, are driven to done three
//! times each in the same run:
//! the suite run whole (`[runner] shards = 1`, as before suites were split), split from the
//! first run (`split_above_secs = 0`), and split with `per_step = "feature"`. Each size's figures: the feature's wall
//! time, its verifications, per verification the branch's acquire, its migrations and the run
//! (from the receipts), a passing full verification and the failing GREEN, and the baseline
//! (the project's whole suite run once before the design gate: branch, migrations and run, from
//! its receipt in the ledger) with its share of the feature; then each against whole, beside
//! the goals.
//!
//! Needs `python3` with `pytest` and `psycopg` (`.ci/run` installs them), and Node.js with
//! npm (vitest 3 and node-postgres are installed from npm on first use, as the runner matrix
//! installs them).
//!
//! `cargo bench --bench suite`

#[path = "../../benches/common/mod.rs"]
mod common;
#[allow(dead_code)] // the bench uses only the npm part
#[path = "../tests/common/toolchain.rs"]
mod toolchain;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::report_line;
use consort::actors::RunOutcome;
use consort::project::Project;
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

/// The test tool of a generated project.
#[derive(Clone, Copy, PartialEq)]
enum Stack {
    /// The pyservice example in Python, run by pytest.
    Pytest,
    /// The same design in JavaScript, run by vitest 3.
    Vitest,
}

impl Stack {
    fn name(self) -> &'static str {
        match self {
            Stack::Pytest => "pytest",
            Stack::Vitest => "vitest",
        }
    }

    /// A part of the name of the test whose first GREEN fails.
    fn failing_test(self) -> &'static str {
        match self {
            Stack::Pytest => "test_add_item_stores_exactly_that_item",
            Stack::Vitest => "answer 1",
        }
    }
}

/// A generated project with an own suite of `tests` tests (in files of ten), each querying the
/// run's branch, the five-entry feature's script, and `[runner]` set as `mode` says.
fn project(stack: Stack, tests: usize, mode: Mode) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    // Reachable by the server's user, so the cluster lives in the project (and goes with it).
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    std::fs::copy(
        Path::new(FIXTURE).join("feature.md"),
        dir.join("feature.md"),
    )
    .expect("the fixture");
    let (config, script) = match stack {
        Stack::Pytest => (
            std::fs::read_to_string(Path::new(FIXTURE).join("consort.toml")).expect("config"),
            script(),
        ),
        Stack::Vitest => {
            node_modules(dir);
            (VITEST_CONFIG.to_string(), vitest_script())
        }
    };
    let config = config.replace("[runner]\n", &format!("[runner]\n{}", mode.runner_lines()));
    std::fs::write(dir.join("consort.toml"), config).expect("config");
    std::fs::create_dir_all(dir.join(".consort/agents")).expect("mkdir");
    std::fs::write(dir.join(".consort/agents/script.toml"), script).expect("script");
    let tests_dir = dir.join(match stack {
        Stack::Pytest => "tests",
        Stack::Vitest => "test",
    });
    std::fs::create_dir_all(&tests_dir).expect("tests");
    for file in 0..tests.div_ceil(TESTS_PER_FILE) {
        let count = TESTS_PER_FILE.min(tests - file * TESTS_PER_FILE);
        let (name, text) = match stack {
            Stack::Pytest => (
                format!("test_existing_{file:03}.py"),
                pytest_file(file, count),
            ),
            Stack::Vitest => (
                format!("existing_{file:03}.test.js"),
                vitest_file(file, count),
            ),
        };
        std::fs::write(tests_dir.join(name), text).expect("a test file");
    }
    tmp
}

/// A pytest file of the project's own suite: `count` tests, each querying the branch.
fn pytest_file(file: usize, count: usize) -> String {
    common::file_of_tests(
        "import os\n\nimport psycopg\n\n\ndef _relations():\n    with psycopg.connect(os.environ[\"DATABASE_URL\"]) as conn:\n        return conn.execute(\"SELECT count(*) FROM pg_catalog.pg_class\").fetchone()[0]\n",
        count,
        |test| format!("\n\ndef test_existing_{file}_{test}():\n    assert _relations() > 0\n"),
        "",
    )
}

/// A vitest file of the project's own suite: `count` tests, each querying the branch.
fn vitest_file(file: usize, count: usize) -> String {
    common::file_of_tests(
        "import { test, expect } from 'vitest';\nimport pg from 'pg';\n\nasync function relations() {\n  const client = new pg.Client({ connectionString: process.env.DATABASE_URL });\n  await client.connect();\n  try {\n    const r = await client.query('SELECT count(*)::int AS n FROM pg_catalog.pg_class');\n    return r.rows[0].n;\n  } finally {\n    await client.end();\n  }\n}\n",
        count,
        |test| {
            format!(
                "\ntest('existing {file} {test}', async () => {{\n  expect(await relations()).toBeGreaterThan(0);\n}});\n"
            )
        },
        "",
    )
}

/// The vitest project's configuration: `consort init`'s for vitest, scripted agents.
const VITEST_CONFIG: &str = r#"[feature]
id = "F-items"
request = "feature.md"

[paths]
tests = ["test/**"]

[runner]
kind = "command"
command = "npx vitest run --reporter=junit --outputFile=\"$CONSORT_JUNIT\""
junit = "junit.xml"
tap = false
timeout_secs = 120

[agents.default]
backend = "script"
path = ".consort/agents/script.toml"
"#;

/// vitest 3 and node-postgres in `dir` (installed from npm once per build directory).
fn node_modules(dir: &Path) {
    let modules = toolchain::npm("vitest3", &["vitest@3", "pg@8"], "vitest");
    toolchain::install_node_modules(&modules, dir);
    std::fs::write(
        dir.join("package.json"),
        r#"{"name":"shelf","version":"1.0.0","private":true,"type":"module","devDependencies":{"vitest":"^3","pg":"^8"}}"#,
    )
    .expect("package.json");
}

/// The pyservice design (stories to schema) with a vitest test list of five entries, each a
/// module of its own answering a query; T1's first GREEN answers wrongly, the repair right.
fn vitest_script() -> String {
    let base = std::fs::read_to_string(Path::new(FIXTURE).join("script.toml")).expect("script");
    let design = &base[..base
        .find("[[entry]]\nstep = \"test-list\"")
        .expect("a test list")];
    let mut list =
        String::from("[[entry]]\nstep = \"test-list\"\n[entry.artifact]\nkind = \"test-list\"\n");
    let mut steps = String::new();
    let change = |step: &str, path: &str, content: &str| {
        format!(
            "\n[[entry]]\nstep = \"{step}\"\n[entry.artifact]\nkind = \"change-set\"\n[entry.artifact.body]\nsummary = \"{step}\"\n[[entry.artifact.body.changes]]\nop = \"write\"\npath = \"{path}\"\ncontent = '''\n{content}'''\n"
        )
    };
    let answer = |n: usize| {
        format!(
            "export async function answer(client) {{\n  const r = await client.query('SELECT {n}::int AS n');\n  return r.rows[0].n;\n}}\n"
        )
    };
    for n in 1..=5 {
        let (test, code) = (
            format!("test/t{n}_answer.test.js"),
            format!("src/answer_{n}.js"),
        );
        let ac = if n == 1 { "S1-AC1" } else { "S1-AC2" };
        list.push_str(&format!(
            "[[entry.artifact.body.entries]]\nid = \"T{n}\"\nac_id = \"{ac}\"\ndescription = \"answer {n} is {n}\"\npath = \"{test}\"\ntest_name = \"{test}::answer {n}\"\n"
        ));
        steps.push_str(&change(
            &format!("red/T{n}"),
            &test,
            &format!("import {{ test, expect }} from 'vitest';\nimport pg from 'pg';\nimport {{ answer }} from '../src/answer_{n}.js';\n\ntest('answer {n}', async () => {{\n  const client = new pg.Client({{ connectionString: process.env.DATABASE_URL }});\n  await client.connect();\n  try {{\n    expect(await answer(client)).toBe({n});\n  }} finally {{\n    await client.end();\n  }}\n}});\n"),
        ));
        if n == 1 {
            steps.push_str(&change("green/T1", &code, &answer(0)));
            steps.push_str(&change("repair/T1/1", &code, &answer(1)));
        } else {
            steps.push_str(&change(&format!("green/T{n}"), &code, &answer(n)));
        }
    }
    let tail = &base[base
        .find("[[entry]]\nstep = \"refactor/*/*\"")
        .expect("refactor")..];
    format!("{design}{list}{steps}\n{tail}")
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
    /// The baseline's branch, migrations and run.
    baseline: Duration,
}

fn drive(rt: &tokio::runtime::Runtime, stack: Stack, tests: usize, mode: Mode) -> Curve {
    let tmp = project(stack, tests, mode);
    let t = Instant::now();
    let project = Project::open(tmp.path()).expect("project");
    let report = common::run_once(rt, &project);
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
    // T1 fails in its RED and its first GREEN, then passes: the last failure is the GREEN's.
    let failing_green = receipts
        .iter()
        .rfind(|r| fails(r, stack.failing_test()))
        .map(ms)
        .expect("T1's failing GREEN");
    let baseline = report
        .state
        .baseline
        .as_ref()
        .expect("the suite ran before the gate");
    let baseline = consort_testkit::ledger::events(&project.ledger_path())
        .into_iter()
        .find_map(|e| match e {
            consort::actors::Event::VerifyCompleted { receipt }
                if receipt.request_id == baseline.request =>
            {
                let t = &receipt.timings;
                Some(Duration::from_millis(
                    t.acquire_ms + t.migrate_ms + t.run_ms,
                ))
            }
            _ => None,
        })
        .expect("the baseline's receipt");
    Curve {
        wall,
        verifications: receipts.len(),
        baseline,
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
        "feature {} over {} verifications; per verification: acquire {}, migrate {}, run {}; a full verification {}, the failing GREEN {}; the baseline {} ({:.0} % of the feature)",
        common::fmt(c.wall),
        c.verifications,
        per(c.acquire),
        per(c.migrate),
        per(c.run),
        common::fmt(c.full),
        common::fmt(c.failing_green),
        common::fmt(c.baseline),
        100.0 * common::ratio(c.baseline, c.wall),
    )
}

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let mut g = common::group(c, "suite", 1, 1);
    common::bench_timed(
        &mut g,
        "the five-entry feature, 50 own tests, split",
        || drive(&rt, Stack::Pytest, 50, Mode::Split).wall,
    );
    g.finish();
    if common::profiling() {
        return;
    }
    for stack in [Stack::Pytest, Stack::Vitest] {
        for tests in [50, 200, 800] {
            curve(&rt, stack, tests);
        }
    }
}

/// One size of one stack driven whole, split and with `per_step = "feature"`, and reported.
fn curve(rt: &tokio::runtime::Runtime, stack: Stack, tests: usize) {
    let goal = |r: f64, g: f64| {
        if r <= g {
            format!("goal ≤ {g}×: met")
        } else {
            format!("goal ≤ {g}×: MISSED")
        }
    };
    let name = format!("{}, {tests} own tests", stack.name());
    let whole = drive(rt, stack, tests, Mode::Whole);
    let split = drive(rt, stack, tests, Mode::Split);
    let feature = drive(rt, stack, tests, Mode::Feature);
    report_line(&format!("{name}, whole"), &describe(&whole));
    report_line(&format!("{name}, split"), &describe(&split));
    report_line(
        &format!("{name}, split, per_step = feature"),
        &describe(&feature),
    );
    let (full, failing, by_split, by_feature) = (
        common::ratio(split.full, whole.full),
        common::ratio(split.failing_green, whole.failing_green),
        common::ratio(split.wall, whole.wall),
        common::ratio(feature.wall, whole.wall),
    );
    report_line(
        &format!("{name}, against whole"),
        &format!(
            "split: full verification {full:.2}× ({}), failing GREEN {failing:.2}× ({}), the feature {by_split:.2}× ({}); per_step = feature: the feature {by_feature:.2}× ({})",
            goal(full, 0.5),
            goal(failing, 0.2),
            goal(by_split, 0.5),
            goal(by_feature, 0.5)
        ),
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
