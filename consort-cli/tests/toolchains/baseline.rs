//! The baseline on a pytest project one of whose own tests cannot pass on a branch (it needs a
//! superuser): `consort doctor --baseline` names it before any feature, the feature's baseline
//! names it before the design gate, no agent is charged, a person quarantines it, the gate shows
//! it, and the feature goes to done with `verify` showing the quarantine.

use crate::common::{
    approving_run, assert_exit, consort, consort_in, dir_arg, ledger_text, run, toolchain, write,
};
use crate::shared_file::{Entry, counts_project, feature_script};
use consort_testkit::process::text;
use consort_testkit::verify::assert_contains;

const NEEDS_A_SUPERUSER: &str = "tests.test_own::test_sets_a_server_setting";

#[test]
fn a_project_test_that_cannot_pass_on_a_branch_is_named_by_the_baseline_and_quarantined() {
    let bin = toolchain::pytest8();
    let path = toolchain::path_with(&bin);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    counts_project(
        dir,
        (
            "tests/test_own.py",
            "import os\n\nimport psycopg\n\n\ndef test_the_app_imports():\n    import app.counts  # noqa: F401\n\n\ndef test_sets_a_server_setting():\n    with psycopg.connect(os.environ[\"DATABASE_URL\"]) as c:\n        c.execute(\"ALTER SYSTEM SET work_mem = '8MB'\")\n",
        ),
    );
    let o = run(consort().env("PATH", &path).arg("init").arg(dir));
    assert_exit(&o, 0, "init adopts the repository");
    let test = "import os\n\nimport psycopg\n\nfrom app import counts\n\n\ndef test_total():\n    with psycopg.connect(os.environ[\"DATABASE_URL\"]) as c:\n        c.execute(\"INSERT INTO counts (sku, qty, note) VALUES ('A', 3, 'x'), ('B', 4, NULL)\")\n        assert counts.total(c) == 7\n";
    let code = "def total(conn):\n    return conn.execute(\"SELECT coalesce(sum(qty), 0) FROM counts\").fetchone()[0]\n";
    let script = feature_script(&[Entry {
        id: "T1",
        name: "tests.test_t1::test_total".into(),
        path: "tests/test_t1.py",
        reds: vec![vec![("tests/test_t1.py", test.into())]],
        green: vec![("app/counts.py", code.into())],
    }]);
    write(
        dir,
        &[
            (".consort/agents/script.toml", &script),
            ("feature.md", "# Stock\n\nKeep the stock of each SKU.\n"),
        ],
    );
    consort::git::GitRepo::init_with_commit(dir, "Test Author", "before Consort").expect("git");
    let consort = |args: &[&str]| {
        let mut c = consort();
        c.env("PATH", &path).args(args).args(dir_arg(dir));
        run(&mut c)
    };

    // Asked for, doctor runs the same baseline before any feature and names the test, with
    // what it said.
    let o = consort(&["doctor", "--baseline"]);
    let said = text(&o);
    assert_exit(&o, 1, "doctor's baseline finds a failing test");
    assert!(
        said.contains("FAIL  the baseline, the whole suite as a feature's baseline runs it")
            && said.contains(&format!("        {NEEDS_A_SUPERUSER}: "))
            && said.contains("consort test quarantine NAME"),
        "{said}"
    );

    // The baseline halts the run before the first RED, naming the test; nobody is charged.
    let o = run(approving_run(dir).env("PATH", &path));
    let said = text(&o);
    assert_exit(&o, 4, "the run halts on the baseline");
    assert!(said.contains("halted at baseline"), "{said}");
    assert!(said.contains(NEEDS_A_SUPERUSER), "{said}");
    assert!(
        !said.contains("navigator: red/T1"),
        "no agent acted: {said}"
    );
    let status = text(&consort(&["status"]));
    assert!(
        status.contains(&format!(
            "baseline: 1 failed before the feature (no agent is charged): {NEEDS_A_SUPERUSER}"
        )),
        "{status}"
    );

    // Quarantined by a person, the retried baseline judges it no more: the feature goes on.
    let o = consort(&[
        "test",
        "quarantine",
        NEEDS_A_SUPERUSER,
        "--by",
        "ada",
        "--reason",
        "ALTER SYSTEM needs a superuser",
    ]);
    assert_exit(&o, 0, "the quarantine is recorded");
    let o = consort(&["doctor", "--baseline"]);
    assert_contains(&text(&o), "1 quarantined failing (judging nothing)");
    assert_exit(&consort(&["retry", "--by", "ada"]), 0, "retry");
    let o = run(approving_run(dir).env("PATH", &path));
    assert_exit(&o, 0, "the run reaches done");
    // The summary counts the runs as the run judged them: every entry green, though the
    // quarantined test failed (and so the test command's exit) in each run.
    let said = text(&o);
    let tests = said
        .lines()
        .find(|l| l.starts_with("tests:"))
        .expect("the summary's tests");
    let words: Vec<&str> = tests.split_whitespace().collect();
    assert_eq!(words.get(1), words.get(3), "every entry green: {tests}");
    assert_contains(&said, "a quarantined test's failures count for nothing), ");
    // The design gate showed what fails before the feature, and who set it aside.
    assert_contains(
        &text(&o),
        &format!(
            "baseline: 1 test fails before the feature, judging nothing: {NEEDS_A_SUPERUSER} (quarantined by ada: ALTER SYSTEM needs a superuser)"
        ),
    );
    let verify = run(consort_in("verify", dir).env("PATH", &path));
    assert_exit(&verify, 0, "verify passes");
    assert_contains(
        &text(&verify),
        &format!("quarantined test: {NEEDS_A_SUPERUSER} by ada: ALTER SYSTEM needs a superuser"),
    );
    // Every later run failed on it, and none was charged: no repair was asked.
    let ledger = ledger_text(dir);
    assert!(!ledger.contains("\"repair\""), "{ledger}");
}
