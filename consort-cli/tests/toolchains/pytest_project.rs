//! A small pytest project, end to end through the `consort` command: the project's own test
//! command (`python3 -m pytest` with a JUnit report), code in `app/`, one test per file, on the
//! embedded PostgreSQL, every run confined. A `__pycache__` left in the test directory by an
//! earlier pytest run and a `.pytest_cache` are caches, not test files; the JUnit report goes
//! to the run's report directory, never the tree; the run reaches done and `consort verify`
//! passes.
//!
//! Needs `python3` with `pytest` and `psycopg` (`.ci/run` installs them).

use crate::common::{ledger_text, toolchain};
use consort_testkit::process::text;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/pyservice/data");

fn consort(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_consort"))
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .expect("consort starts")
}

/// The project as a user would have it: configuration, request, agent script, and the
/// leftovers of an earlier pytest run.
fn project(dir: &Path) {
    let copy = |from: &str, to: &str| {
        let to = dir.join(to);
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::copy(Path::new(FIXTURE).join(from), &to).expect("copy the fixture");
    };
    copy("consort.toml", "consort.toml");
    copy("feature.md", "feature.md");
    copy("script.toml", ".consort/agents/script.toml");
    let stale = dir.join("tests/__pycache__/test_old.cpython-311-pytest-9.2.0.pyc");
    std::fs::create_dir_all(stale.parent().expect("parent")).expect("mkdir");
    std::fs::write(&stale, b"\x6f\x0d\x0d\x0a stale bytecode").expect("pyc");
    std::fs::create_dir_all(dir.join(".pytest_cache/v")).expect("pytest cache");
}

/// The project in a temporary directory (kept while the first value lives), once python3 with
/// pytest and psycopg is known to be there.
fn items_project() -> (tempfile::TempDir, std::path::PathBuf) {
    toolchain::python3_imports(
        "pytest, psycopg",
        "python3 with pytest and psycopg (pip install pytest 'psycopg[binary]')",
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("items");
    project(&dir);
    (tmp, dir)
}

#[test]
fn a_pytest_project_with_caches_and_a_junit_report_runs_to_done() {
    let (_tmp, dir) = items_project();

    let run = consort(&dir, &["run", "--approve-as", "ada"]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run));

    let verify = consort(&dir, &["verify"]);
    assert!(verify.status.success(), "{}", text(&verify));

    let code = std::fs::read_to_string(dir.join("app/items.py")).expect("the code was written");
    assert!(code.contains("def item_total"), "{code}");
    assert!(
        !dir.join("tests/__pycache__/test_t1_add_item.cpython-311-pytest-9.2.0.pyc")
            .exists(),
        "bytecode goes to the scratch directory, not the tree"
    );
    assert!(
        dir.join("tests/__pycache__/test_old.cpython-311-pytest-9.2.0.pyc")
            .exists(),
        "the stale cache is left alone"
    );
    assert!(
        !dir.join("junit.xml").exists(),
        "the JUnit report went to the run's report directory"
    );
    let ledger = ledger_text(&dir);
    let receipts = ledger.matches("\"verify-completed\"").count();
    let confined = ledger.matches("\"namespaced\"").count();
    assert!(
        receipts >= 5,
        "two REDs, two GREENs and the deploy verify: {receipts}"
    );
    assert_eq!(confined, receipts, "every receipt records its confinement");
}

/// The same project with a test of its own, its suites split from the first run and each step
/// limited to the feature's tests: the steps' receipts name the files they covered, the story's
/// last GREEN runs the whole suite split over branches, and the run still reaches done with
/// `consort verify` passing.
#[test]
fn a_pytest_project_split_over_branches_and_limited_per_step_runs_to_done() {
    let (_tmp, dir) = items_project();
    let config = std::fs::read_to_string(dir.join("consort.toml")).expect("config");
    let config = config.replace(
        "[runner]\n",
        "[runner]\nsplit_above_secs = 0\nper_step = \"feature\"\n",
    );
    std::fs::write(dir.join("consort.toml"), config).expect("config");
    std::fs::write(
        dir.join("tests/test_existing.py"),
        "import os\n\nimport psycopg\n\n\ndef test_the_branch_answers():\n    with psycopg.connect(os.environ[\"DATABASE_URL\"]) as conn:\n        assert conn.execute(\"SELECT 1\").fetchone()[0] == 1\n",
    )
    .expect("the project's own test");

    let run = consort(&dir, &["run", "--approve-as", "ada"]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run));
    let verify = consort(&dir, &["verify"]);
    assert!(verify.status.success(), "{}", text(&verify));

    let ledger = ledger_text(&dir);
    assert!(
        ledger.contains("\"per_step\":\"feature\""),
        "the start records the scope"
    );
    assert!(
        ledger.contains("\"selection\":[\"tests/test_t1_add_item.py\"]"),
        "T1's steps ran its file alone"
    );
    assert!(
        ledger.contains("\"shards\":["),
        "the story's last GREEN ran the whole suite split"
    );
    assert!(
        ledger.contains("tests.test_existing::test_the_branch_answers"),
        "the project's own test ran in the whole runs"
    );
}
