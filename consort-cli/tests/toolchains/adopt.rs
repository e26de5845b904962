//! Adopting existing repositories with `consort init`: generated repositories of each stack
//! Consort detects. The cargo, pytest and plain-SQL ones run to done through the `consort`
//! binary, on the embedded PostgreSQL, with their own test tools as runners and their
//! existing migrations applied first. The runner conformance matrix runs the same feature to
//! done with each supported major version of the test tools people use: vitest 1, 2 and 3,
//! jest 29 and 30, pytest 7 and 8 (and the newest, above), and `go test -json`, all under the
//! real confinement.
//!
//! Needs `cargo`, `python3` with `pytest` and `psycopg`, `psql`, Node.js with npm, and `go`;
//! the matrix's Node and Python tools are installed from npm and PyPI on first use
//! (`tests/common/toolchain.rs`).

use std::path::Path;

use crate::common::script::{Design, REFACTOR_AND_REVIEW, change_entry, write_change};
use crate::common::{
    assert_exit, assert_exit_saying, consort, dir_arg, doctor, feature_add, ledger_text, run,
    run_to_done_and_verify, says, toolchain, write,
};
use consort_testkit::process::text;
use consort_testkit::verify::assert_contains;

/// A Python project's pytest configuration.
pub(crate) const PYPROJECT: (&str, &str) = (
    "pyproject.toml",
    "[tool.pytest.ini_options]\ntestpaths = [\"tests\"]\n",
);

/// The script every adopted project runs: one story, one criterion, one migration that needs
/// the project's existing one (`ALTER TABLE counts`), one test (`test_name` in the stack's
/// runner), RED writing `test` and GREEN writing `code`.
pub(crate) fn script(
    test_path: &str,
    test_name: &str,
    test: &str,
    code_path: &str,
    code: &str,
) -> String {
    script_of(
        &Design {
            feature: "F1",
            story: "Total stock",
            migration: (
                "0002_count_notes",
                "ALTER TABLE counts ADD COLUMN note text;",
            ),
            test_path,
            test_name: Some(test_name),
        },
        test,
        (code_path, code),
    )
}

/// The script of `design`, RED writing `test` at its test path and GREEN writing `code`
/// (path, content).
pub(crate) fn script_of(design: &Design<'_>, test: &str, code: (&str, &str)) -> String {
    let (code_path, code) = code;
    let test_path = design.test_path;
    let mut s = design.toml();
    s.push_str(&change_entry(
        "red/T1",
        "T1: the total",
        &write_change(test_path, test),
    ));
    s.push_str(&change_entry(
        "green/T1",
        "the total",
        &write_change(code_path, code),
    ));
    s.push_str(REFACTOR_AND_REVIEW);
    s
}

/// `consort init` in `dir` (which already holds a project), then the script, a git
/// repository, `consort doctor` and a run to done; returns init's and doctor's output.
pub(crate) fn adopt_and_run(dir: &Path, script: &str) -> (String, String) {
    let (init, doctor, _) = adopt_and_run_with(dir, script, None);
    (init, doctor)
}

/// [`adopt_and_run`] with every `consort` command run with `path` as its `PATH` (a user's
/// activated virtual environment); returns what the run said too.
pub(crate) fn adopt_and_run_with(
    dir: &Path,
    script: &str,
    path: Option<&std::ffi::OsStr>,
) -> (String, String, String) {
    let consort = || {
        let mut c = consort();
        if let Some(path) = path {
            c.env("PATH", path);
        }
        c
    };
    // Doctor with the same PATH: the migration tool and the test tool may live in it.
    let doctor = |dir: &Path| {
        let o = run(consort().arg("doctor").args(dir_arg(dir)));
        let said = text(&o);
        (o, said)
    };
    let o = run(consort().arg("init").arg(dir));
    assert_exit(&o, 0, "init adopts the repository");
    let init = text(&o);
    split_from_the_first_run(dir);
    // The placeholder request init wrote fails doctor until someone describes the feature.
    let o = doctor(dir).0;
    says(&o, "is still the placeholder `consort init` wrote");
    write(
        dir,
        &[
            (".consort/agents/script.toml", script),
            ("feature.md", "# Stock\n\nKeep the stock of each SKU.\n"),
        ],
    );
    consort::git::GitRepo::init_with_commit(dir, "Test Author", "before Consort").expect("git");
    let (o, doctor) = doctor(dir);
    assert_exit(&o, 0, "doctor passes");
    // One test file ran as a verification runs it, confined, on a fresh branch.
    assert!(
        doctor.contains("ok    a trial run of ")
            && doctor.contains("on a fresh branch, confined (Landlock ABI"),
        "{doctor}"
    );
    // Where its branches live: in memory, as root (whose /dev/shm is a tmpfs).
    if nix::unistd::geteuid().is_root() {
        assert_contains(
            &doctor,
            "; branches are made in memory, in /dev/shm/consort-branches-",
        );
    }
    // Which PostgreSQL the project gets, and why: an installed one or Consort's own.
    assert!(
        doctor.contains("ok    PostgreSQL ")
            && (doctor.contains(", installed (") || doctor.contains("Consort's own")),
        "{doctor}"
    );
    let o = run(consort()
        .args(["run", "--approve-as", "ada"])
        .args(dir_arg(dir))
        .stdin(std::process::Stdio::null()));
    assert_exit(&o, 0, "the adopted project runs to done");
    let ran = text(&o);
    assert_exit(
        &run(consort().arg("verify").args(dir_arg(dir))),
        0,
        "verify passes",
    );
    (init, doctor, ran)
}

/// Turns sharding on for every run of the project in `dir`, however short its suite: the
/// matrix runs with every full-suite verification split over branches where the runner can.
fn split_from_the_first_run(dir: &Path) {
    let path = dir.join("consort.toml");
    let config = std::fs::read_to_string(&path).expect("the configuration init wrote");
    let at = config.find("\n[runner]").expect("a [runner] table") + 1;
    let end = at + config[at..].find('\n').expect("a line");
    let config = format!("{}\nsplit_above_secs = 0{}", &config[..end], &config[end..]);
    std::fs::write(&path, config).expect("write the configuration");
}

/// A fresh temporary directory holding `files` (path, content): the repository to adopt.
pub(crate) fn repo_of(files: &[(&str, &str)]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    write(tmp.path(), files);
    tmp
}

/// The design's migration is a file next to the existing ones, and the promotion applied
/// exactly the existing migrations then the design's.
pub(crate) fn migrations_landed(dir: &Path, mdir: &str, existing: &str) {
    let file = dir.join(mdir).join("0002_S1_count_notes.sql");
    assert_eq!(
        std::fs::read_to_string(&file).expect("the design's migration file"),
        "ALTER TABLE counts ADD COLUMN note text;"
    );
    let events = consort_testkit::ledger::events(
        &consort::project::Project::open(dir)
            .expect("project")
            .ledger_path(),
    );
    let applied = events
        .iter()
        .find_map(|e| match e {
            consort::actors::Event::Promoted { report } => Some(report.applied.clone()),
            _ => None,
        })
        .expect("promoted");
    assert_eq!(
        applied,
        [existing.to_string(), "0002_count_notes".to_string()]
    );
}

#[test]
fn a_cargo_repository_is_adopted_and_runs_to_done() {
    let tmp = repo_of(&[
        (
            "Cargo.toml",
            r#"[package]
name = "shelf"
version = "0.1.0"
edition = "2021"
"#,
        ),
        (
            "Cargo.lock",
            r#"# This file is automatically @generated by Cargo.
# It is not intended for manual editing.
version = 4

[[package]]
name = "shelf"
version = "0.1.0"
"#,
        ),
        (
            "src/lib.rs",
            r#"/// The total of the quantities.
pub fn total(_quantities: &[i64]) -> i64 {
    todo!("not built yet")
}
"#,
        ),
        (
            "tests/existing.rs",
            r#"#[test]
fn the_crate_links() {
    let _ = shelf::total as fn(&[i64]) -> i64;
}
"#,
        ),
        (
            "migrations/0001_counts.sql",
            "CREATE TABLE counts (sku text PRIMARY KEY, qty int NOT NULL);",
        ),
    ]);
    let dir = tmp.path();
    // The test names a function the crate does not have yet: its target does not compile, so
    // nothing of the run runs — which is its RED.
    let test = r#"#[test]
fn the_total_sums_the_quantities() {
    // Every run gets its branch of the database in the environment.
    assert!(std::env::var("DATABASE_URL").is_ok_and(|u| u.starts_with("postgres")));
    assert_eq!(shelf::sum_of(&[3, 4]), 7);
}
"#;
    let code = "/// The total of the quantities.\npub fn total(quantities: &[i64]) -> i64 {\n    sum_of(quantities)\n}\n\n/// The sum of the quantities.\npub fn sum_of(quantities: &[i64]) -> i64 {\n    quantities.iter().sum()\n}\n";
    let (init, doctor) = adopt_and_run(
        dir,
        &script(
            "tests/t1_total.rs",
            "the_total_sums_the_quantities",
            test,
            "src/lib.rs",
            code,
        ),
    );
    assert!(init.contains("detected Rust (cargo test)"), "{init}");
    assert!(
        init.contains("found 1 migration file(s) in migrations/"),
        "{init}"
    );
    assert!(doctor.contains("collects 1 test ("), "{doctor}");
    migrations_landed(dir, "migrations", "0001_counts");
    let log = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["log", "--format=%s", "main..HEAD"])
        .output()
        .expect("git log");
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(
        log.contains("GREEN T1") && log.contains("RED T1") && log.contains("design approved"),
        "{log}"
    );
    // cargo runs whole, splitting on or not: each run builds the crate afresh.
    let ledger = ledger_text(dir);
    assert!(!ledger.contains("\"shards\":[{"));
    // The RED was the build's failure for the function not written yet.
    assert!(ledger.contains("cannot find function `sum_of`"), "{ledger}");
    assert!(ledger.contains("\"stops_every_test\":true"), "{ledger}");
}

/// A Python service tested by pytest through psycopg, with its own test and migration in
/// `dir`; returns the script of its feature.
pub(crate) fn pytest_project(dir: &Path) -> String {
    crate::shared_file::counts_project(dir, crate::shared_file::IMPORTS_THE_APP);
    let test = r#"import os

import psycopg


def test_the_total_sums_the_quantities():
    from app import counts

    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        conn.execute("INSERT INTO counts (sku, qty, note) VALUES ('A', 3, 'x'), ('B', 4, NULL)")
        assert counts.total(conn) == 7
"#;
    let code = "def total(conn):\n    return conn.execute(\"SELECT coalesce(sum(qty), 0) FROM counts\").fetchone()[0]\n";
    script(
        "tests/test_t1_total.py",
        "tests.test_t1_total::test_the_total_sums_the_quantities",
        test,
        "app/counts.py",
        code,
    )
}

#[test]
fn a_pytest_repository_is_adopted_and_runs_to_done() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let script = pytest_project(dir);
    let (init, doctor) = adopt_and_run(dir, &script);
    assert!(init.contains("detected Python (pytest)"), "{init}");
    assert!(init.contains("in db/migrations/"), "{init}");
    assert!(doctor.contains("collects 1 test ("), "{doctor}");
    migrations_landed(dir, "db/migrations", "V1__counts");
}

/// A plain-SQL repository tested by psql, whose existing migration is `migrations/<migration>`,
/// and the script of its feature.
fn plain_sql_repo(migration: &str) -> (tempfile::TempDir, String) {
    let tmp = repo_of(&[
        (
            "sql/version.sql",
            "CREATE FUNCTION shelf_version() RETURNS int LANGUAGE sql AS 'SELECT 1';\n",
        ),
        (
            "tests/t0_version.sql",
            "DO $$ BEGIN IF shelf_version() <> 1 THEN RAISE EXCEPTION 'wrong version'; END IF; END $$;\n",
        ),
        (
            &format!("migrations/{migration}"),
            "CREATE TABLE counts (sku text PRIMARY KEY, qty int NOT NULL);",
        ),
    ]);
    let test = "INSERT INTO counts (sku, qty, note) VALUES ('A', 3, 'x'), ('B', 4, NULL);\nDO $$ BEGIN IF count_total() <> 7 THEN RAISE EXCEPTION 'total is %', count_total(); END IF; END $$;\n";
    let code = "CREATE FUNCTION count_total() RETURNS bigint LANGUAGE sql AS $$ SELECT coalesce(sum(qty), 0) FROM counts $$;\n";
    let script = script(
        "tests/t1_total.sql",
        "tests/t1_total.sql",
        test,
        "sql/total.sql",
        code,
    );
    (tmp, script)
}

#[test]
fn a_plain_sql_repository_is_adopted_and_runs_to_done() {
    let (tmp, script) = plain_sql_repo("V1__counts.sql");
    let dir = tmp.path();
    let (init, doctor) = adopt_and_run(dir, &script);
    assert!(init.contains("detected plain SQL (psql)"), "{init}");
    assert!(doctor.contains("collects 1 test file ("), "{doctor}");
    migrations_landed(dir, "migrations", "V1__counts");
}

#[test]
fn node_and_go_repositories_are_detected_and_a_dry_run_writes_nothing() {
    for (files, detected, command) in [
        (
            vec![
                ("package.json", r#"{"devDependencies":{"vitest":"^2.0.0"}}"#),
                ("src/sum.test.ts", ""),
            ],
            "detected Node (vitest)",
            r#"npx vitest run --reporter=junit --outputFile=\"$CONSORT_JUNIT\""#,
        ),
        (
            vec![
                ("package.json", r#"{"devDependencies":{"jest":"^29.0.0"}}"#),
                ("__tests__/sum.js", ""),
            ],
            "detected Node (jest)",
            "--reporters=jest-junit",
        ),
        (
            vec![
                ("go.mod", "module example.com/shelf\n"),
                ("shelf_test.go", "package shelf\n"),
            ],
            "detected Go (go test)",
            "go test -json ./...",
        ),
    ] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        write(dir, &files);
        let before = std::fs::read_dir(dir).expect("list").count();
        let o = run(consort().arg("init").arg(dir).arg("--dry-run"));
        assert_exit(&o, 0, "a dry run");
        let out = text(&o);
        assert!(out.contains(detected) && out.contains(command), "{out}");
        assert!(out.contains("nothing written"), "{out}");
        assert_eq!(
            std::fs::read_dir(dir).expect("list").count(),
            before,
            "{out}"
        );
        // What it would write is a configuration that loads.
        let o = run(consort().arg("init").arg(dir));
        assert_exit(&o, 0, "init");
        consort::config::ProjectConfig::load(dir).expect("the written consort.toml loads");
    }
}

#[test]
fn init_never_overwrites_a_file_the_project_has() {
    let tmp = repo_of(&[
        ("feature.md", "# Mine\n"),
        (".consort/agents/script.toml", "# mine\n"),
        ("tests/t.sql", "select 1;"),
    ]);
    let dir = tmp.path();
    let o = run(consort().arg("init").arg(dir));
    assert_exit(&o, 0, "init");
    says(&o, "kept");
    assert_eq!(
        std::fs::read_to_string(dir.join("feature.md")).expect("kept"),
        "# Mine\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join(".consort/agents/script.toml")).expect("kept"),
        "# mine\n"
    );
    let o = run(consort().arg("init").arg(dir));
    assert_exit(&o, 1, "consort.toml is not overwritten without --force");
}

/// Doctor's trial run finds a suite that cannot live in the confinement before the first
/// feature: a pytest test that reaches the network fails doctor, naming what was refused and
/// the setting that allows it; its sibling test, run alone, passes.
#[test]
fn doctor_s_trial_run_finds_a_suite_the_confinement_refuses() {
    let tmp = repo_of(&[
        PYPROJECT,
        ("tests/__init__.py", ""),
        (
            "tests/test_a_fetch.py",
            "import socket\n\n\ndef test_the_mirror_answers():\n    socket.create_connection((\"192.0.2.1\", 80), 3)\n",
        ),
        (
            "tests/test_b_local.py",
            "def test_one():\n    assert 1 + 1 == 2\n",
        ),
        ("feature.md", "# Stock\n\nKeep the stock of each SKU.\n"),
    ]);
    let dir = tmp.path();
    assert_exit(&run(consort().arg("init").arg(dir)), 0, "init");
    consort::git::GitRepo::init_with_commit(dir, "Test Author", "before Consort").expect("git");
    let (o, said) = doctor(dir);
    assert_exit(&o, 1, "doctor fails");
    assert!(
        said.contains("FAIL  a trial run, as a verification runs it: the test command")
            && said.contains("failed on what the confinement refused it")
            && said.contains("outside the run's own network")
            && said.contains("sandbox = \"off\""),
        "{said}"
    );
    // Allowed, the same trial runs and passes.
    let config = std::fs::read_to_string(dir.join("consort.toml")).expect("config");
    let config = config.replacen(
        "kind = \"command\"\n",
        "kind = \"command\"\nsandbox = \"off\"\n",
        1,
    );
    std::fs::write(dir.join("consort.toml"), config).expect("edit");
    std::fs::remove_file(dir.join("tests/test_a_fetch.py")).expect("rm");
    let said = doctor(dir).1;
    assert!(
        said.contains("ok    a trial run of the test file tests/test_b_local.py on a fresh branch, unconfined (sandbox = \"off\"): 1 passed"),
        "{said}"
    );
}

/// `consort init` writes test paths that cover every test file the tool finds, beside the
/// test directory too; doctor compares them with what the runner collects and fails naming a
/// collected file they miss.
#[test]
fn the_test_paths_cover_what_the_runner_collects_and_doctor_names_a_file_they_miss() {
    let tmp = repo_of(&[
        PYPROJECT,
        ("tests/__init__.py", ""),
        ("tests/test_a.py", "def test_a():\n    assert True\n"),
        ("app/__init__.py", ""),
        (
            "app/test_inline.py",
            "def test_inline():\n    assert True\n",
        ),
        ("feature.md", "# Stock\n\nKeep the stock of each SKU.\n"),
    ]);
    let dir = tmp.path();
    // pytest collects both files, from the rootdir, when testpaths does not narrow it.
    write(dir, &[("pyproject.toml", "[tool.pytest.ini_options]\n")]);
    assert_exit(&run(consort().arg("init").arg(dir)), 0, "init");
    let config = std::fs::read_to_string(dir.join("consort.toml")).expect("config");
    assert!(
        config.contains("\"tests/**\", \"**/test_*.py\", \"**/*_test.py\""),
        "{config}"
    );
    consort::git::GitRepo::init_with_commit(dir, "Test Author", "before Consort").expect("git");
    let said = doctor(dir).1;
    assert!(!said.contains("[paths] tests misses"), "{said}");
    let narrowed = config.replace(
        "\"tests/**\", \"**/test_*.py\", \"**/*_test.py\"",
        "\"tests/**\"",
    );
    doctor_fails_with(
        dir,
        &narrowed,
        "FAIL  the runner collects test files that [paths] tests misses: app/test_inline.py",
    );
}

#[test]
fn doctor_fails_when_the_runner_s_program_is_not_installed() {
    let tmp = repo_of(&[("tests/t1.sql", "select 1;")]);
    let dir = tmp.path();
    assert_exit(&run(consort().arg("init").arg(dir)), 0, "init");
    let config = std::fs::read_to_string(dir.join("consort.toml")).expect("config");
    let start = config.find("[runner]").expect("runner");
    let end = config.find("[migrations]").expect("migrations");
    let config = format!(
        "{}[runner]\nkind = \"command\"\ncommand = \"CONSORT_X=1 no-such-test-tool --run\"\n\n{}",
        &config[..start],
        &config[end..]
    );
    doctor_fails_with(
        dir,
        &config,
        "FAIL  the test command's program no-such-test-tool is installed",
    );
}

/// A Python project with no test yet (pytest exits 5, "no tests collected") is not a broken
/// one: doctor says the feature's tests will be the first, and that check passes.
#[test]
fn a_project_without_tests_yet_collects_none_and_doctor_says_so() {
    let tmp = repo_of(&[PYPROJECT, ("app/__init__.py", "")]);
    let dir = tmp.path();
    assert_exit(&run(consort().arg("init").arg(dir)), 0, "init");
    let doctor = doctor(dir).1;
    assert!(
        doctor.contains("finds no test yet")
            && doctor.contains("the feature's tests will be the first"),
        "{doctor}"
    );
    assert!(
        !doctor.contains("collect-only -q -p no:cacheprovider` failed"),
        "{doctor}"
    );
}

// ---------- the runner conformance matrix ----------

/// The feature every matrix project builds: `total(client)` over the `counts` table, tested
/// through the branch's `DATABASE_URL` with node-postgres, and the migration that needs the
/// project's own.
const NODE_TEST_NAME: &str = "the total sums the quantities";

/// A Node project whose tests reach the branch with node-postgres: ESM for vitest (with a
/// `vitest.config.js` when `config`, beside which vite writes its bundled copy), CommonJS
/// for jest; its `node_modules` is the toolchain's, as a real directory (a cache the runs may
/// write) of hard links.
fn node_project(dir: &Path, tool: &str, modules: &Path, config: bool) -> (String, String) {
    let script = node_files(dir, tool, modules, config);
    adopt_and_run(dir, &script)
}

/// The files of [`node_project`] in `dir`; returns the script of its feature.
pub(crate) fn node_files(dir: &Path, tool: &str, modules: &Path, config: bool) -> String {
    let esm = tool == "vitest";
    let package = format!(
        r#"{{"name":"shelf","version":"1.0.0","private":true{}"devDependencies":{{"{tool}":"*","pg":"^8"}}}}"#,
        if esm { r#","type":"module","# } else { "," }
    );
    let (import_pg, import_total, export, vitest) = if esm {
        (
            "import pg from 'pg';",
            "import { total } from '../src/counts.js';",
            "export async function total(client) {",
            "import { test, expect } from 'vitest';\n",
        )
    } else {
        (
            "const pg = require('pg');",
            "const { total } = require('../src/counts');",
            "exports.total = async function total(client) {",
            "",
        )
    };
    let mut files = vec![
        ("package.json", package.clone()),
        (
            "src/counts.js",
            format!("{export}\n  throw new Error('not built yet');\n}}\n"),
        ),
        (
            "test/existing.test.js",
            format!(
                "{vitest}{import_total}\ntest('the module loads', () => {{\n  expect(typeof total).toBe('function');\n}});\n"
            ),
        ),
        (
            "migrations/0001_counts.sql",
            "CREATE TABLE counts (sku text PRIMARY KEY, qty int NOT NULL);".to_string(),
        ),
    ];
    if config {
        files.push((
            "vitest.config.js",
            "export default { test: { include: ['test/**/*.test.js'] } };\n".to_string(),
        ));
    }
    let files: Vec<(&str, &str)> = files.iter().map(|(p, c)| (*p, c.as_str())).collect();
    write(dir, &files);
    toolchain::install_node_modules(modules, dir);
    let test = format!(
        "{vitest}{import_pg}\n{import_total}\n\ntest('{NODE_TEST_NAME}', async () => {{\n  const client = new pg.Client({{ connectionString: process.env.DATABASE_URL }});\n  await client.connect();\n  try {{\n    await client.query(\"INSERT INTO counts (sku, qty, note) VALUES ('A', 3, 'x'), ('B', 4, NULL)\");\n    expect(await total(client)).toBe(7);\n  }} finally {{\n    await client.end();\n  }}\n}});\n"
    );
    let code = format!(
        "{export}\n  const r = await client.query('SELECT coalesce(sum(qty), 0)::int AS t FROM counts');\n  return r.rows[0].t;\n}}\n"
    );
    let test_path = "test/t1_total.test.js";
    script(
        test_path,
        &format!("{test_path}::{NODE_TEST_NAME}"),
        &test,
        "src/counts.js",
        &code,
    )
}

/// One Node case of the matrix: the tool at `version`, run to done, its own tests collected
/// by doctor with the configured command.
fn node_case(tool: &str, version: &str, extra: &[&str], config: bool) {
    let spec = format!("{tool}@{version}");
    let mut packages = vec![spec.as_str(), "pg@8"];
    packages.extend(extra);
    let modules = toolchain::npm(&format!("{tool}{version}"), &packages, tool);
    let tmp = tempfile::tempdir().expect("tempdir");
    let (init, doctor) = node_project(tmp.path(), tool, &modules, config);
    assert!(init.contains(&format!("detected Node ({tool})")), "{init}");
    // The project's own test, found by the tool's own collection with the configured command.
    let collected = if tool == "jest" {
        "collects 1 test file ("
    } else {
        "collects 1 test ("
    };
    assert!(doctor.contains(collected), "{tool} {version}: {doctor}");
    migrations_landed(tmp.path(), "migrations", "0001_counts");
    // vitest 2 and 3 and jest list their suite: its full runs were split; vitest 1 runs whole.
    let split = ledger_text(tmp.path()).contains("\"shards\":[{");
    assert_eq!(
        split,
        tool == "jest" || version != "1",
        "{tool} {version}: split"
    );
}

#[test]
fn vitest_1_runs_to_done_with_a_config_vite_writes_beside() {
    node_case("vitest", "1", &[], true);
}

#[test]
fn vitest_2_runs_to_done() {
    node_case("vitest", "2", &[], false);
}

#[test]
fn vitest_3_runs_to_done_with_a_config() {
    node_case("vitest", "3", &[], true);
}

#[test]
fn jest_29_runs_to_done() {
    node_case("jest", "29", &["jest-junit@16"], false);
}

#[test]
fn jest_30_runs_to_done() {
    node_case("jest", "30", &["jest-junit@16"], false);
}

/// pytest at `major` in a virtual environment the user has activated.
fn pytest_case(major: &str) {
    let bin = toolchain::venv(
        &format!("pytest{major}"),
        &[&format!("pytest=={major}.*"), "psycopg[binary]"],
        "pytest, psycopg",
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let script = pytest_project(dir);
    let path = toolchain::path_with(&bin);
    let (init, doctor, _) = adopt_and_run_with(dir, &script, Some(&path));
    assert!(init.contains("detected Python (pytest)"), "{init}");
    assert!(
        doctor.contains("collects 1 test ("),
        "pytest {major}: {doctor}"
    );
    migrations_landed(dir, "db/migrations", "V1__counts");
    // Its own test file and the feature's: its full runs were split.
    assert!(
        ledger_text(dir).contains("\"shards\":[{"),
        "pytest {major}: split"
    );
}

#[test]
fn pytest_7_runs_to_done() {
    pytest_case("7");
}

#[test]
fn pytest_8_runs_to_done() {
    pytest_case("8");
}

/// The Go module the Go cases start from: `Total` not built yet, the project's own test that it
/// links, one migration.
pub(crate) const GO_SHELF: [(&str, &str); 4] = [
    ("go.mod", "module example.com/shelf\n\ngo 1.19\n"),
    (
        "shelf.go",
        "package shelf\n\n// Total is the sum of the quantities.\nfunc Total(quantities []int) int {\n\tpanic(\"not built yet\")\n}\n",
    ),
    (
        "shelf_existing_test.go",
        "package shelf\n\nimport \"testing\"\n\nfunc TestTheModuleBuilds(t *testing.T) {\n\t_ = Total\n}\n",
    ),
    (
        "migrations/0001_counts.sql",
        "CREATE TABLE counts (sku text PRIMARY KEY, qty int NOT NULL);",
    ),
];

/// `go test -json` on a Go module with only the standard library (the module proxy is out of
/// reach): its test reaches the branch through `psql` and the `PG*` variables every run gets.
/// Its two packages are the units its full runs are split into.
#[test]
fn go_test_runs_to_done() {
    let tmp = repo_of(&[
        (
            "stock/stock.go",
            "package stock\n\n// Level is what is left.\nfunc Level(in, out int) int {\n\treturn in - out\n}\n",
        ),
        (
            "stock/stock_test.go",
            "package stock\n\nimport \"testing\"\n\nfunc TestLevel(t *testing.T) {\n\tfor _, c := range []struct{ in, out, want int }{{3, 1, 2}, {1, 1, 0}} {\n\t\tt.Run(\"case\", func(t *testing.T) {\n\t\t\tif got := Level(c.in, c.out); got != c.want {\n\t\t\t\tt.Fatalf(\"Level = %d\", got)\n\t\t\t}\n\t\t})\n\t}\n}\n",
        ),
    ]
    .into_iter()
    .chain(GO_SHELF)
    .collect::<Vec<_>>());
    let dir = tmp.path();
    let test = r#"package shelf

import (
	"os/exec"
	"strings"
	"testing"
)

func TestTotal(t *testing.T) {
	sql := "INSERT INTO counts (sku, qty, note) VALUES ('A', 3, 'x'), ('B', 4, NULL); SELECT sum(qty) FROM counts"
	out, err := exec.Command("psql", "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql).CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v: %s", err, out)
	}
	if got, want := Total([]int{3, 4}), strings.TrimSpace(string(out)); want != "7" || got != 7 {
		t.Fatalf("Total = %d, the branch says %s", got, want)
	}
}
"#;
    let code = "package shelf\n\n// Total is the sum of the quantities.\nfunc Total(quantities []int) int {\n\tsum := 0\n\tfor _, q := range quantities {\n\t\tsum += q\n\t}\n\treturn sum\n}\n";
    let script = script("total_test.go", "TestTotal", test, "shelf.go", code);
    let (init, doctor) = adopt_and_run(dir, &script);
    assert!(init.contains("detected Go (go test)"), "{init}");
    assert!(doctor.contains("collects 2 tests ("), "{doctor}");
    migrations_landed(dir, "migrations", "0001_counts");
    // Its full runs were split by package, subtests and all.
    let ledger = ledger_text(dir);
    assert!(
        ledger.contains("\"shards\":[{") && ledger.contains("'./stock'"),
        "{ledger}"
    );
}

/// A task-queue broker shaped like a real one, for the matrix: its tables live in a schema of
/// their own made by a psql script (`\set`, `:"var"`), its existing tests start worker
/// processes with `multiprocessing` (POSIX semaphores in `/dev/shm`), and one of them passes
/// every other run (a marker in a cache directory flips).
fn broker_project(dir: &Path) {
    write(
        dir,
        &[
            PYPROJECT,
            ("broker/__init__.py", ""),
            (
                "broker/jobs.py",
                r#"def enqueue(conn, queue, payload):
    return conn.execute(
        "INSERT INTO broker.jobs (queue, payload) VALUES (%s, %s) RETURNING id", (queue, payload)
    ).fetchone()[0]
"#,
            ),
            (
                "db/migrations/0000_broker_schema.sql",
                "\\set schema broker\n\
                 CREATE SCHEMA :\"schema\";\n\
                 CREATE TABLE :\"schema\".jobs (\n\
                 \x20   id bigserial PRIMARY KEY,\n\
                 \x20   queue text NOT NULL,\n\
                 \x20   payload text NOT NULL,\n\
                 \x20   state text NOT NULL DEFAULT 'pending'\n\
                 );\n",
            ),
            ("tests/__init__.py", ""),
            (
                "tests/test_workers.py",
                r#"import multiprocessing as mp
import os

import psycopg


def work(ids, done):
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        for i in ids:
            conn.execute("UPDATE broker.jobs SET state = 'done' WHERE id = %s", (i,))
    done.put(len(ids))


def test_worker_processes_take_every_job():
    from broker.jobs import enqueue

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        ids = [enqueue(conn, "default", str(n)) for n in range(6)]
    ctx = mp.get_context("fork")
    done, lock = ctx.Queue(), ctx.Lock()
    workers = [ctx.Process(target=work, args=(ids[k::3], done)) for k in range(3)]
    for w in workers:
        w.start()
    with lock:
        taken = sum(done.get(timeout=30) for _ in workers)
    for w in workers:
        w.join(30)
    assert taken == 6
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        left = conn.execute(
            "SELECT count(*) FROM broker.jobs WHERE id = ANY(%s) AND state <> 'done'", (ids,)
        ).fetchone()[0]
    assert left == 0
"#,
            ),
            (
                "tests/test_racy.py",
                r#"import pathlib


def test_a_race_it_loses_every_other_run():
    marker = pathlib.Path(".hypothesis/flip")
    if marker.exists():
        marker.unlink()
        raise AssertionError("lost the race this time")
    marker.write_text("next time")
"#,
            ),
            (
                ".hypothesis/README",
                "a cache directory the racy test writes\n",
            ),
            (".gitignore", ".hypothesis/\n"),
        ],
    );
}

/// One broker feature's script: its migration on the broker's schema, its test and code.
fn broker_script(
    feature: &str,
    migration: (&str, &str),
    test: (&str, &str, &str),
    code: (&str, &str),
) -> String {
    let (test_path, test_name, test_body) = test;
    let mut s = Design {
        feature,
        story: "Queue reports",
        migration,
        test_path,
        test_name: Some(test_name),
    }
    .toml();
    s.push_str(&change_entry(
        "red/T1",
        "T1",
        &write_change(test_path, test_body),
    ));
    s.push_str(&change_entry(
        "green/T1",
        "the rule",
        &write_change(code.0, code.1),
    ));
    s.push_str(REFACTOR_AND_REVIEW);
    s
}

/// The matrix's real-library case: the broker runs two features to done on the embedded
/// default with the sandbox on and no hand step: its psql schema script is its base, its
/// workers run confined, the racy test is recorded as flaky and charges no agent, and each
/// feature's migration works on the broker's own schema (one adds an index and a column
/// there, the other a view in a schema of its own).
#[test]
fn a_task_queue_broker_with_a_psql_schema_workers_and_a_flaky_test_runs_two_features_to_done() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = &tmp.path().join("broker");
    broker_project(dir);
    let counts = broker_script(
        "F1",
        (
            "0001_jobs_by_queue",
            "ALTER TABLE broker.jobs ADD COLUMN attempts int NOT NULL DEFAULT 0; CREATE INDEX jobs_pending ON broker.jobs (queue) WHERE state = 'pending';",
        ),
        (
            "tests/test_t1_pending.py",
            "tests.test_t1_pending::test_pending_counts_per_queue",
            r#"import os

import psycopg


def test_pending_counts_per_queue():
    from broker import jobs, report

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        for q in ("default", "mail", "mail"):
            jobs.enqueue(conn, q, "x")
        assert report.pending(conn) == {"default": 1, "mail": 2}
"#,
        ),
        (
            "broker/report.py",
            "def pending(conn):\n    rows = conn.execute(\"SELECT queue, count(*) FROM broker.jobs WHERE state = 'pending' AND attempts = 0 GROUP BY queue\").fetchall()\n    return {q: n for q, n in rows}\n",
        ),
    );
    let (init, doctor) = adopt_and_run(dir, &counts);
    assert!(init.contains("detected Python (pytest)"), "{init}");
    assert!(doctor.contains("collects 2 tests ("), "{doctor}");
    let first = consort::project::Project::open(dir).expect("project");
    let flaky = consort::project::flaky_seen(&first.events().expect("events"));
    assert_eq!(
        flaky,
        ["tests.test_racy::test_a_race_it_loses_every_other_run"],
        "the racy test was seen flaky, and charged to no agent"
    );

    write(
        dir,
        &[(
            ".consort/agents/script.toml",
            &broker_script(
                "F2",
                (
                    "0002_queue_view",
                    "CREATE SCHEMA reporting; CREATE VIEW reporting.done_jobs AS SELECT queue, count(*) AS n FROM broker.jobs WHERE state = 'done' GROUP BY queue;",
                ),
                (
                    "tests/test_t2_done.py",
                    "tests.test_t2_done::test_done_jobs_per_queue",
                    r#"import os

import psycopg


def test_done_jobs_per_queue():
    from broker import jobs, report

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        done = jobs.enqueue(conn, "mail", "x")
        conn.execute("UPDATE broker.jobs SET state = 'done' WHERE id = %s", (done,))
        assert report.done(conn) == {"mail": 1}
"#,
                ),
                (
                    "broker/report.py",
                    "def pending(conn):\n    rows = conn.execute(\"SELECT queue, count(*) FROM broker.jobs WHERE state = 'pending' AND attempts = 0 GROUP BY queue\").fetchall()\n    return {q: n for q, n in rows}\n\n\ndef done(conn):\n    return {q: n for q, n in conn.execute(\"SELECT queue, n FROM reporting.done_jobs\").fetchall()}\n",
                ),
            ),
        )],
    );
    let request = tmp.path().join("f2.md");
    std::fs::write(
        &request,
        "# Done jobs\n\nShow how many jobs each queue has done.\n",
    )
    .expect("the second request");
    let o = run(&mut feature_add(&request, "F2", dir));
    assert_exit(&o, 0, "the second feature joins the backlog");
    // The second feature starts from where the first was merged, as a maintainer does.
    for args in [
        &["checkout", "-q", "main"][..],
        &["merge", "-q", "--ff-only", "consort/F1"],
    ] {
        let o = run(std::process::Command::new("git")
            .args(args)
            .current_dir(dir));
        assert_exit(&o, 0, "git");
    }
    run_to_done_and_verify(dir, "the second feature runs to done");
    let second = consort::project::Project::open_feature(dir, Some("F2")).expect("F2");
    let promoted = second
        .events()
        .expect("events")
        .into_iter()
        .find_map(|e| match e {
            consort::actors::Event::Promoted { report } => Some(report),
            _ => None,
        })
        .expect("F2 promoted");
    assert_eq!(promoted.applied, ["0002_queue_view"]);
}

/// A project that numbers its migrations with three digits (`001_counts.sql`, as a text-sorting
/// migration script wants them): doctor names the form, the design's version follows it, and
/// the design's file sorts after the project's by name too.
#[test]
fn the_designs_migration_files_follow_the_projects_numbering() {
    let (tmp, script) = plain_sql_repo("001_counts.sql");
    let dir = tmp.path();
    let script = script.replace("0002_count_notes", "002_count_notes");
    let (_, doctor) = adopt_and_run(dir, &script);
    assert!(
        doctor.contains("numbered with 3 digits (the last: 001_counts.sql)"),
        "{doctor}"
    );
    let mut names: Vec<String> = std::fs::read_dir(dir.join("migrations"))
        .expect("the migrations")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["001_counts.sql", "002_S1_count_notes.sql"]);
}

/// Doctor, run on `dir` configured by `config`, fails saying `says`.
fn doctor_fails_with(dir: &Path, config: &str, says: &str) {
    std::fs::write(dir.join("consort.toml"), config).expect("edit");
    assert_exit_saying(&doctor(dir).0, 1, "doctor fails", says);
}
