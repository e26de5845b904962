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

#[test]
fn a_pytest_project_with_caches_and_a_junit_report_runs_to_done() {
    toolchain::python3_imports(
        "pytest, psycopg",
        "python3 with pytest and psycopg (pip install pytest 'psycopg[binary]')",
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("items");
    project(&dir);

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
    let confined = ledger.matches("\"landlock\"").count();
    assert!(
        receipts >= 5,
        "two REDs, two GREENs and the deploy verify: {receipts}"
    );
    assert_eq!(confined, receipts, "every receipt records its confinement");
}
