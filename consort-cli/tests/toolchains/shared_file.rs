//! A feature whose test list puts every entry in one file, beside the project's own test in it
//! (the way real projects keep their tests): each RED adds its test to the file while the
//! accepted ones stay frozen test by test, judged on the file's syntax tree; a RED that slips a
//! file-wide hook in beside them is refused, and its honest retry goes on to done. A RED whose
//! test imports a module not written yet is a RED, in the shared file (its other tests do not
//! run because of it) and in a file of its own (every other file still runs).

use crate::adopt::{PYPROJECT, adopt_and_run_with};
use crate::common::script::{Design, REFACTOR_AND_REVIEW, change_entry, write_change};
use crate::common::{
    approving_run, assert_exit, consort, ledger_text, run, status_json, toolchain, write,
};
use consort_testkit::process::text;
use consort_testkit::verify::assert_contains;

/// The project's own test file, which the feature's three tests join.
const TESTS: &str = "tests/test_counts.py";

const EXISTING: &str = "from app import counts


def test_the_app_imports():
    assert counts is not None
";

/// The file after the RED of T1: imports and a fixture added at the top level, beside the
/// project's own test.
fn after_t1() -> String {
    format!(
        "import os

import psycopg
import pytest

{EXISTING}

@pytest.fixture
def conn():
    c = psycopg.connect(os.environ[\"DATABASE_URL\"])
    c.execute(\"INSERT INTO counts (sku, qty, note) VALUES ('A', 3, 'x'), ('B', 4, NULL)\")
    yield c
    c.rollback()
    c.close()


def test_total(conn):
    assert counts.total(conn) == 7
"
    )
}

fn after_t2() -> String {
    format!(
        "{}

def test_count_of(conn):
    assert counts.count_of(conn, 'B') == 4
",
        after_t1()
    )
}

/// T3's test imports a module not written yet at the top of the shared file: the whole file
/// fails to load, so its accepted tests are not run because of the RED, not broken by it.
fn after_t3() -> String {
    format!(
        "from app.listing import skus
{}

def test_skus(conn):
    assert skus(conn) == ['A', 'B']
",
        after_t2()
    )
}

/// T4 lives in a file of its own that imports a module not written yet: pytest still runs
/// every other file, so the accepted tests are judged in its RED.
const REPORT_TEST: &str = "from app.report import report


def test_report():
    assert report([3, 4]) == '7 units'
";

const TOTAL: &str = "def total(conn):
    return conn.execute(\"SELECT coalesce(sum(qty), 0) FROM counts\").fetchone()[0]
";
const COUNT_OF: &str = "

def count_of(conn, sku):
    return conn.execute(\"SELECT qty FROM counts WHERE sku = %s\", (sku,)).fetchone()[0]
";
const LISTING: &str = "def skus(conn):
    return [r[0] for r in conn.execute(\"SELECT sku FROM counts ORDER BY sku\")]
";
const REPORT: &str = "def report(quantities):
    return f'{sum(quantities)} units'
";

/// One entry of a shared-file feature: its id, runner name and file, what its RED writes
/// (attempt by attempt: every attempt but the last is a cheat the rules refuse) and what its
/// GREEN writes.
pub(crate) struct Entry<'a> {
    pub id: &'a str,
    pub name: String,
    pub path: &'a str,
    pub reds: Vec<Vec<(&'a str, String)>>,
    pub green: Vec<(&'a str, String)>,
}

/// The script of a one-story feature whose test list is `entries`, in order: the design of
/// [`Design`] with that list, then each entry's REDs and GREEN, then refactors and reviews
/// that change nothing.
pub(crate) fn feature_script(entries: &[Entry<'_>]) -> String {
    let first = entries.first().expect("an entry");
    let design = Design {
        feature: "F1",
        story: "Stock counts",
        migration: (
            "0002_count_notes",
            "ALTER TABLE counts ADD COLUMN note text;",
        ),
        test_path: first.path,
        test_name: Some(&first.name),
    }
    .toml();
    let list: Vec<String> = entries
        .iter()
        .map(|e| {
            format!(
                "{{ id = \"{}\", ac_id = \"S1-AC1\", description = \"{}\", path = \"{}\", test_name = \"{}\" }}",
                e.id, e.id, e.path, e.name
            )
        })
        .collect();
    let at = design.find("body.entries = [").expect("the test list");
    let end = at + design[at..].find('\n').expect("a line");
    let mut s = format!(
        "{}body.entries = [{}]{}",
        &design[..at],
        list.join(", "),
        &design[end..]
    );
    let writes = |files: &[(&str, String)]| {
        files
            .iter()
            .map(|(path, content)| write_change(path, content))
            .collect::<String>()
    };
    for e in entries {
        for red in &e.reds {
            s.push_str(&change_entry(&format!("red/{}", e.id), e.id, &writes(red)));
        }
        s.push_str(&change_entry(
            &format!("green/{}", e.id),
            e.id,
            &writes(&e.green),
        ));
    }
    s.push_str(REFACTOR_AND_REVIEW);
    s
}

fn script() -> String {
    let name = |n: &str| format!("tests.test_counts::{n}");
    let code = |c: String| vec![("app/counts.py", c)];
    // Attempt 0 of T2's RED slips an autouse fixture in beside the accepted tests: refused;
    // attempt 1 is honest.
    let hook = format!(
        "{}\n\n@pytest.fixture(autouse=True)\ndef no_database(monkeypatch):\n    monkeypatch.setenv('DATABASE_URL', 'postgresql://nowhere')\n",
        after_t2()
    );
    feature_script(&[
        Entry {
            id: "T1",
            name: name("test_total"),
            path: TESTS,
            reds: vec![vec![(TESTS, after_t1())]],
            green: code(TOTAL.into()),
        },
        Entry {
            id: "T2",
            name: name("test_count_of"),
            path: TESTS,
            reds: vec![vec![(TESTS, hook)], vec![(TESTS, after_t2())]],
            green: code(format!("{TOTAL}{COUNT_OF}")),
        },
        Entry {
            id: "T3",
            name: name("test_skus"),
            path: TESTS,
            reds: vec![vec![(TESTS, after_t3())]],
            green: vec![("app/listing.py", LISTING.into())],
        },
        Entry {
            id: "T4",
            name: "tests.test_report::test_report".into(),
            path: "tests/test_report.py",
            reds: vec![vec![("tests/test_report.py", REPORT_TEST.into())]],
            green: vec![("app/report.py", REPORT.into())],
        },
    ])
}

/// The project's own test of the counts project: it imports the app.
pub(crate) const IMPORTS_THE_APP: (&str, &str) = (
    "tests/test_existing.py",
    "def test_the_app_imports():\n    import app.counts  # noqa: F401\n",
);

/// The pytest project the shared-file and baseline cases start from: an `app` package whose
/// `total` is not built yet, one migration, and `own` (path, content), the project's own tests.
pub(crate) fn counts_project(dir: &std::path::Path, own: (&str, &str)) {
    write(
        dir,
        &[
            PYPROJECT,
            ("app/__init__.py", ""),
            (
                "app/counts.py",
                "def total(conn):\n    raise NotImplementedError\n",
            ),
            ("tests/__init__.py", ""),
            own,
            (
                "db/migrations/V1__counts.sql",
                "CREATE TABLE counts (sku text PRIMARY KEY, qty int NOT NULL);",
            ),
        ],
    );
}

/// The run refused one RED, a file-wide hook beside the accepted tests, and nothing else.
pub(crate) fn assert_hook_refused_once(dir: &std::path::Path) {
    let ledger = ledger_text(dir);
    assert_eq!(
        ledger.matches("\"rule\":\"frozen-test-changed\"").count(),
        1,
        "{ledger}"
    );
    assert_contains(&ledger, "would apply to the accepted tests");
}

#[test]
fn pytest_three_tests_in_the_projects_own_test_file_run_to_done() {
    let bin = toolchain::pytest8();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    counts_project(dir, (TESTS, EXISTING));
    let path = toolchain::path_with(&bin);
    adopt_and_run_with(dir, &script(), Some(&path));
    // The file holds the project's own test and the three, exactly as the last RED wrote it.
    let file = std::fs::read_to_string(dir.join(TESTS)).expect("the test file");
    assert_eq!(file, after_t3());
    // The hook was refused, once, as a change of what the accepted tests share.
    assert_hook_refused_once(dir);
    let ledger = ledger_text(dir);
    // Every RED was a real run in which the new test failed and the earlier ones passed; T3's
    // and T4's failed to load for a module not written yet, and neither was refused.
    for name in ["test_total", "test_count_of", "test_skus"] {
        assert!(
            ledger.contains(&format!("tests.test_counts::{name}")),
            "{name}"
        );
    }
    for module in ["app.listing", "app.report"] {
        assert!(
            ledger.contains(&format!("No module named '{module}'")),
            "{module}"
        );
    }
    assert!(!ledger.contains("red-broke-green-test"), "{ledger}");
}

/// A psql project's test list that puts two entries in one `.sql` file is refused at design,
/// saying why: no parser reads the file, so it is frozen whole at its first RED and the second
/// entry could never be written. No RED runs, and no agent is asked to build.
#[test]
fn a_psql_test_list_that_shares_a_file_is_refused_at_design() {
    let tmp = crate::adopt::repo_of(&[
        (
            "migrations/0001_counts.sql",
            "CREATE TABLE counts (sku text PRIMARY KEY, qty int NOT NULL);",
        ),
        ("tests/t0_counts.sql", "SELECT count(*) FROM counts;\n"),
    ]);
    let dir = tmp.path();
    let o = run(consort().arg("init").arg(dir));
    assert_exit(&o, 0, "init adopts the repository");
    let shared = "tests/t1_counts.sql";
    let entry = |id| Entry {
        id,
        name: shared.into(),
        path: shared,
        reds: vec![vec![(shared, "SELECT 1;\n".into())]],
        green: vec![("sql/counts.sql", "SELECT 1;\n".into())],
    };
    write(
        dir,
        &[
            (
                ".consort/agents/script.toml",
                &feature_script(&[entry("T1"), entry("T2")]),
            ),
            ("feature.md", "# Stock\n\nKeep the stock of each SKU.\n"),
        ],
    );
    consort::git::GitRepo::init_with_commit(dir, "Test Author", "before Consort").expect("git");
    let o = run(&mut approving_run(dir));
    let out = text(&o);
    assert_eq!(o.status.code(), Some(4), "halted at design: {out}");
    let why =
        "tests T1 and T2 would both live in `tests/t1_counts.sql`, a file Consort does not parse";
    assert_contains(&out, why);
    assert_contains(&out, "give each test a file of its own there");
    let ledger = ledger_text(dir);
    assert!(
        ledger.contains(why),
        "the ledger records the refusal: {ledger}"
    );
    assert_eq!(status_json(dir)["halted"]["step"], "test-list");
    assert!(
        !ledger.contains("\"verify-requested\""),
        "no RED ran: {ledger}"
    );
    assert!(!dir.join(shared).exists(), "nothing was written");
}
