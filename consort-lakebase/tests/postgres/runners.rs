//! The test runners on real processes and a real branch: outcomes from exit codes, TAP and
//! JUnit; time limit and output cap; scrubbed environment; psql on real `.sql` files.

use crate::common;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{base_of, migration, must_query, tree_of, write_tree};
use consort_actors::{ContentHash, TestStatus};
use consort_lakebase::procinfo;
use consort_lakebase::{
    BaseSpec, Branch, BranchProvider, CommandRunner, CommandRunnerConfig, EmbeddedProvider,
    EnvPolicy, Error, OutputLimits, PsqlRunner, PsqlRunnerConfig, RunContext, RunReport,
    TestCommandFault, TestRunner,
};

/// A fresh branch of `spec` and a confined run context for `tree`.
async fn branch_for(
    tree: &Path,
    spec: &BaseSpec,
    tests: &[&str],
    focus: Option<&str>,
) -> (Arc<EmbeddedProvider>, Branch, RunContext) {
    let (p, branch, mut ctx) = common::confined_branch(tree, spec, Vec::new()).await;
    ctx.tests = tests.iter().map(|s| s.to_string()).collect();
    ctx.focus = focus.map(str::to_string);
    (p, branch, ctx)
}

/// An empty work tree and a branch of the default base for a run in it.
async fn empty_tree_branch() -> (tempfile::TempDir, Arc<EmbeddedProvider>, Branch, RunContext) {
    let tree = tempfile::tempdir().expect("tree");
    let (p, b, ctx) = branch_for(tree.path(), &BaseSpec::default(), &[], None).await;
    (tree, p, b, ctx)
}

async fn run_command(cfg: CommandRunnerConfig, ctx: &RunContext) -> RunReport {
    CommandRunner::new(cfg)
        .run(ctx)
        .await
        .expect("the runner runs")
}

fn status(r: &RunReport, name: &str) -> Option<TestStatus> {
    r.outcomes.iter().find(|o| o.name == name).map(|o| o.status)
}

fn cmd(command: &str) -> CommandRunnerConfig {
    CommandRunnerConfig::new(command)
}

#[tokio::test]
async fn a_passing_and_a_failing_command() {
    let tree = tempfile::tempdir().expect("tree");
    let (p, b, ctx) = branch_for(tree.path(), &BaseSpec::default(), &["t1", "t2"], None).await;
    let ok = run_command(cmd("echo all good"), &ctx).await;
    assert!(ok.exit.success());
    assert_eq!(status(&ok, "t1"), Some(TestStatus::Passed));
    assert_eq!(status(&ok, "t2"), Some(TestStatus::Passed));
    assert!(ok.output_excerpt.contains("all good"));
    assert_eq!(ok.output_digest, ContentHash::of_bytes(b"all good\n"));

    let bad = run_command(cmd("echo boom >&2; exit 3"), &ctx).await;
    assert_eq!(bad.exit.code, Some(3));
    assert!(!bad.exit.success());
    assert_eq!(status(&bad, "(exit)"), Some(TestStatus::Errored));
    assert!(bad.output_excerpt.contains("boom"));
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn tap_printed_by_a_script_gives_per_test_outcomes_even_when_it_exits_zero() {
    let tree = tree_of(&[(
        "run-tests.sh",
        "#!/bin/sh\necho 'TAP version 13'\necho '1..3'\necho 'ok 1 - stock is visible'\necho 'not ok 2 - stock is reserved'\necho '# diagnostic line'\necho 'ok 3 - audit # SKIP later'\nexit 0\n",
    )]);
    let (p, b, ctx) = branch_for(tree.path(), &BaseSpec::default(), &[], None).await;
    let r = run_command(cmd("sh run-tests.sh"), &ctx).await;
    assert!(r.exit.success(), "the script itself exited 0");
    assert_eq!(status(&r, "stock is visible"), Some(TestStatus::Passed));
    assert_eq!(
        status(&r, "stock is reserved"),
        Some(TestStatus::Failed),
        "exit 0 with a failing TAP line is not a pass"
    );
    assert_eq!(status(&r, "audit"), Some(TestStatus::Skipped));
    assert_eq!(r.outcomes.len(), 3);
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn a_junit_report_written_to_the_report_directory_is_read_and_a_stale_one_is_not() {
    let tree = tempfile::tempdir().expect("tree");
    let junit = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="stock" tests="2" failures="1">
<testcase classname="tests.test_stock" name="test_visible" time="0.01"/>
<testcase classname="tests.test_stock" name="test_reserved"><failure message="assert 0 == 1">AssertionError</failure></testcase>
</testsuite></testsuites>"#;
    write_tree(tree.path(), &[("junit-template.xml", junit)]);
    let (p, b, ctx) = branch_for(tree.path(), &BaseSpec::default(), &[], None).await;
    let mut cfg = cmd("cp junit-template.xml \"$CONSORT_JUNIT\" && echo ran");
    cfg.junit_path = Some("junit.xml".into());
    let r = run_command(cfg.clone(), &ctx).await;
    assert!(r.exit.success());
    assert_eq!(
        status(&r, "tests.test_stock::test_visible"),
        Some(TestStatus::Passed)
    );
    assert_eq!(
        status(&r, "tests.test_stock::test_reserved"),
        Some(TestStatus::Failed),
        "exit 0 with a failing JUnit case is not a pass"
    );
    assert!(
        !tree.path().join("junit.xml").exists(),
        "the report went to the run's report directory, not the tree"
    );
    let said = r
        .outcomes
        .iter()
        .find_map(|o| o.message.as_deref())
        .expect("the failure's message is kept");
    assert_eq!(said, "assert 0 == 1\nAssertionError");
    // Next run (a fresh report directory): the command writes no report; the stale one is
    // not read, and a command that writes none is the test command's fault, not an outcome.
    let (p2, b2, ctx) = branch_for(tree.path(), &BaseSpec::default(), &[], None).await;
    cfg.command = "echo nothing to report".into();
    let r = CommandRunner::new(cfg).run(&ctx).await;
    p2.delete(&b2.name).await.expect("delete");
    assert!(
        matches!(
            &r,
            Err(Error::TestCommand {
                fault: TestCommandFault::NoReport { .. },
                ..
            })
        ),
        "{r:?}"
    );
    p.delete(&b.name).await.expect("delete");
}

/// The three faults that are the test command's (a program that is not there, no report, nothing
/// collected) are typed errors naming the command and what it printed, never outcomes an
/// agent is judged on; a command stopped at its time limit is still judged as before.
#[tokio::test]
async fn the_harness_s_faults_are_typed_errors_not_outcomes() {
    let tree = tree_of(&[("not-executable.sh", "echo hi\n")]);
    let (p, b, ctx) = branch_for(tree.path(), &BaseSpec::default(), &["t1"], None).await;
    let fault_of = |r: consort_lakebase::Result<RunReport>| match r {
        Err(Error::TestCommand {
            command,
            fault,
            output,
        }) => (command, fault, output),
        other => panic!("a test command fault, not {other:?}"),
    };
    let (command, fault, output) = fault_of(
        CommandRunner::new(cmd("vitset run --dir test"))
            .run(&ctx)
            .await,
    );
    assert_eq!(command, "vitset run --dir test");
    assert_eq!(fault, TestCommandFault::ProgramNotFound { code: 127 });
    assert!(output.contains("vitset"), "what the shell said: {output}");
    let (_, fault, _) = fault_of(
        CommandRunner::new(cmd("./not-executable.sh"))
            .run(&ctx)
            .await,
    );
    assert_eq!(fault, TestCommandFault::ProgramNotFound { code: 126 });

    // `npx` of a tool the workspace lacks asks no registry (a run works offline: npm says
    // ENOTCACHED instead of waiting on the network) and is named as not installed, whatever
    // the command's reporter.
    let (_, fault, output) = fault_of(
        CommandRunner::new(cmd("npx vitest run --reporter=tap"))
            .run(&ctx)
            .await,
    );
    assert_eq!(
        fault,
        TestCommandFault::NotInstalled {
            package: "vitest".into()
        },
        "{output}"
    );

    let mut junit = cmd("echo no report here; exit 1");
    junit.junit_path = Some("junit.xml".into());
    let (_, fault, output) = fault_of(CommandRunner::new(junit.clone()).run(&ctx).await);
    assert!(
        matches!(fault, TestCommandFault::NoReport { .. }),
        "{fault}"
    );
    assert!(output.contains("no report here"), "{output}");

    // A Python without the tool it is asked to run writes no report either: named with the
    // module it lacks, and, where the project keeps a `.venv/` the command does not start,
    // with that environment's Python.
    junit.command = "python3 -m no_such_tool_consort --junitxml=\"$CONSORT_JUNIT\"".into();
    let venv = tree.path().join(".venv/bin");
    for with_venv in [false, true] {
        if with_venv {
            std::fs::create_dir_all(&venv).expect("a .venv");
            std::fs::write(venv.join("python"), "").expect("its python");
        }
        let (_, fault, _) = fault_of(CommandRunner::new(junit.clone()).run(&ctx).await);
        assert!(
            matches!(fault, TestCommandFault::PythonLacks { .. }),
            "a Python without the module, not {fault}"
        );
        let said = fault.to_string();
        assert!(said.contains("has no `no_such_tool_consort`"), "{said}");
        assert_eq!(
            said.contains("start `[runner] command` with `.venv/bin/python`"),
            with_venv,
            "{said}"
        );
    }
    std::fs::remove_dir_all(tree.path().join(".venv")).expect("the .venv goes");

    junit.command =
        r#"echo '<testsuites><testsuite name="none" tests="0"/></testsuites>' > "$CONSORT_JUNIT""#
            .into();
    let (_, fault, _) = fault_of(CommandRunner::new(junit.clone()).run(&ctx).await);
    assert_eq!(fault, TestCommandFault::CollectedNothing { expected: 1 });
    let e = CommandRunner::new(junit.clone())
        .run(&ctx)
        .await
        .expect_err("fault");
    assert!(
        e.to_string()
            .contains("reported no test at all while 1 test is expected"),
        "{e}"
    );
    assert_eq!(
        e.infra_fault(),
        consort_actors::InfraFault::TestCommandBroken
    );

    // Stopped at its time limit before it wrote a report: the run's own verdict.
    junit.command = "sleep 5".into();
    junit.timeout = Duration::from_millis(300);
    let r = run_command(junit, &ctx).await;
    assert!(r.exit.timed_out);
    assert_eq!(status(&r, "(exit)"), Some(TestStatus::Errored));
    p.delete(&b.name).await.expect("delete");
}

/// Runs are non-interactive: `CI=true` (no watch mode) and `npm_config_yes=false` (npx never
/// tries a registry a run cannot reach), unless the configuration sets them.
#[tokio::test]
async fn a_project_that_lives_under_dev_shm_is_seen_by_its_runs() {
    // As root a run gets a /dev/shm of its own, mounted over the machine's: it must not hide
    // a tree that lives there.
    let tree = tempfile::Builder::new()
        .prefix("consort-tree-")
        .tempdir_in("/dev/shm")
        .expect("a tree in /dev/shm");
    write_tree(
        tree.path(),
        &[("marker.txt", "here\n"), ("tests/t1.sql", "SELECT 1;\n")],
    );
    let (p, b, ctx) = branch_for(tree.path(), &BaseSpec::default(), &["t1"], None).await;
    let r = run_command(cmd("grep -q here marker.txt"), &ctx).await;
    assert!(r.exit.success(), "the command read its tree: {r:?}");
    assert_eq!(status(&r, "t1"), Some(TestStatus::Passed));
    let psql = PsqlRunner::new(PsqlRunnerConfig::default())
        .expect("psql runner")
        .run(&ctx)
        .await
        .expect("psql starts in its tree and runs the test file");
    assert!(psql.exit.success(), "psql ran its tree's test: {psql:?}");
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn runs_are_non_interactive_unless_configured_otherwise() {
    let (_tree, p, b, ctx) = empty_tree_branch().await;
    let r = run_command(cmd("echo \"ci=$CI yes=$npm_config_yes\""), &ctx).await;
    consort_testkit::verify::assert_contains(&r.output_excerpt, "ci=true yes=false");
    let mut set = cmd("echo \"ci=$CI\"");
    set.env.set.push(("CI".into(), "".into()));
    let r = run_command(set, &ctx).await;
    consort_testkit::verify::assert_contains(&r.output_excerpt, "ci=\n");
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn without_tap_or_junit_the_single_test_command_decides_each_expected_test() {
    let tree = tempfile::tempdir().expect("tree");
    let (p, b, ctx) = branch_for(
        tree.path(),
        &BaseSpec::default(),
        &["old_test"],
        Some("new_test"),
    )
    .await;
    let mut cfg = cmd("echo 'suite failed somewhere'; exit 1");
    cfg.single_test_command = Some("echo running {test}; test {test} = old_test".into());
    let r = run_command(cfg, &ctx).await;
    assert!(!r.exit.success());
    assert_eq!(status(&r, "old_test"), Some(TestStatus::Passed));
    assert_eq!(status(&r, "new_test"), Some(TestStatus::Failed));
    assert!(r.output_excerpt.contains("running new_test"));
    assert!(r.command.contains("per test"));
    p.delete(&b.name).await.expect("delete");
}

/// No entry for a test is no evidence: a single-test command whose program the shell cannot
/// find fails every test by exit 127, which is the command's fault, never a failing test.
#[tokio::test]
async fn a_single_test_command_whose_program_is_missing_is_no_verdict() {
    let tree = tempfile::tempdir().expect("tree");
    let (p, b, ctx) = branch_for(tree.path(), &BaseSpec::default(), &[], Some("new_test")).await;
    let mut cfg = cmd("exit 1");
    cfg.single_test_command = Some("no-such-test-tool {test}".into());
    let e = CommandRunner::new(cfg)
        .run(&ctx)
        .await
        .expect_err("the command's fault, not a failing test");
    assert!(
        matches!(
            e,
            Error::TestCommand {
                fault: TestCommandFault::ProgramNotFound { code: 127 },
                ..
            }
        ),
        "{e}"
    );
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn the_time_limit_kills_the_whole_process_group_including_a_grandchild() {
    let (_tree, p, b, ctx) = empty_tree_branch().await;
    let mut cfg = cmd(
        "sh -c 'sleep 300 & echo $! > \"$TMPDIR/grandchild.pid\"; wait' & echo $! > \"$TMPDIR/child.pid\"; sleep 300",
    );
    cfg.timeout = Duration::from_secs(2);
    let r = run_command(cfg, &ctx).await;
    assert!(r.exit.timed_out);
    assert!(!r.exit.success());
    assert_eq!(r.exit.signal, Some(9));
    assert!(r.output_excerpt.contains("time limit"));
    for f in ["child.pid", "grandchild.pid"] {
        let pid: u32 = std::fs::read_to_string(ctx.scratch.writable().join("tmp").join(f))
            .expect("pid file")
            .trim()
            .parse()
            .expect("pid");
        assert!(!procinfo::alive(pid), "{f} ({pid}) must be dead");
    }
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn a_background_process_left_by_a_finished_command_is_killed() {
    let (_tree, p, b, ctx) = empty_tree_branch().await;
    let mut cfg = cmd("sleep 300 & echo $! > \"$TMPDIR/bg.pid\"; echo done");
    cfg.timeout = Duration::from_secs(120);
    let r = run_command(cfg, &ctx).await;
    assert!(r.exit.success(), "the command itself finished");
    assert!(!r.exit.timed_out);
    let pid: u32 = std::fs::read_to_string(ctx.scratch.writable().join("tmp/bg.pid"))
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        !procinfo::alive(pid),
        "the leftover sleep was killed: {stat}"
    );
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn large_output_is_digested_whole_and_capped_in_the_excerpt() {
    let (_tree, p, b, ctx) = empty_tree_branch().await;
    let r = run_command(cmd("head -c 3000000 /dev/zero | tr '\\0' x"), &ctx).await;
    assert!(r.exit.success());
    assert_eq!(r.output_bytes, 3_000_000);
    assert_eq!(
        r.output_digest,
        ContentHash::of_bytes(&vec![b'x'; 3_000_000])
    );
    let limits = OutputLimits::default();
    assert!(r.output_excerpt.len() <= limits.excerpt_head + limits.excerpt_tail + 100);
    assert!(r.output_excerpt.contains("bytes of output omitted"));

    // Past the hard cap the command is killed.
    let mut cfg = cmd("yes consort");
    cfg.limits.max_total = 1_000_000;
    cfg.timeout = Duration::from_secs(120);
    let r = run_command(cfg, &ctx).await;
    assert!(!r.exit.success());
    assert!(!r.exit.timed_out);
    assert_eq!(r.exit.signal, Some(9));
    assert!(r.output_excerpt.contains("output exceeded"));
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn the_command_sees_only_the_branch_credentials_and_allowed_variables() {
    assert!(
        std::env::var_os("CARGO_MANIFEST_DIR").is_some(),
        "cargo sets this in the test process"
    );
    let (_tree, p, b, ctx) = empty_tree_branch().await;
    let r = run_command(
        cmd("env | sort; psql \"$DATABASE_URL\" -XAtc 'select current_user, current_database()'"),
        &ctx,
    )
    .await;
    assert!(r.exit.success(), "{}", r.output_excerpt);
    let out = &r.output_excerpt;
    assert!(!out.contains("CARGO_MANIFEST_DIR"), "scrubbed: {out}");
    assert!(out.contains("DATABASE_URL=postgresql://"));
    assert!(out.contains(&format!("PGUSER={}", ctx.conn.user)));
    assert!(out.contains(&format!("PGDATABASE={}", ctx.conn.database)));
    assert!(
        out.contains("PGPASSWORD=***"),
        "the secret is redacted in the excerpt"
    );
    assert!(!out.contains(ctx.conn.secret.expose()));
    // A failing test that prints its connection in its failure's message (a TAP diagnostic)
    // leaves the secret out of the outcome too.
    let mut tap = cmd("echo 'not ok 1 - leaks'; echo \"  # $PGPASSWORD\"; echo '1..1'");
    tap.tap = true;
    let leaked = run_command(tap, &ctx).await;
    let message = leaked.outcomes[0].message.clone().unwrap_or_default();
    assert!(message.contains("***"), "{message}");
    assert!(!message.contains(ctx.conn.secret.expose()), "{message}");
    assert!(
        out.contains(&format!("{}|{}", ctx.conn.user, ctx.conn.database)),
        "the credentials work: {out}"
    );
    // An allow-listed variable passes through.
    // So do fixed values, and the branch under the project's own names (`[branch_env]`).
    let mut cfg = cmd(
        "echo \"dir=$CARGO_MANIFEST_DIR\"; echo \"fixed=$CONSORT_MODE\"; \
         echo \"db=$DB_NAME user=$DB_USER pw=$DB_PASSWORD\"; \
         PGPASSWORD=\"$DB_PASSWORD\" psql -XAtq \"postgresql://$DB_USER@$DB_HOST:$DB_PORT/$DB_NAME\" -c 'select 40 + 2'",
    );
    let mapped: Vec<(String, String)> = [
        ("DB_HOST", "{host}"),
        ("DB_PORT", "{port}"),
        ("DB_NAME", "{database}"),
        ("DB_USER", "{user}"),
        ("DB_PASSWORD", "{password}"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    cfg.env = EnvPolicy {
        allow: vec!["PATH".into(), "CARGO_MANIFEST_DIR".into()],
        set: vec![("CONSORT_MODE".into(), "ci".into())],
        branch: consort_lakebase::BranchEnv::parse(mapped.iter().map(|(k, v)| (k, v)))
            .expect("templates"),
    };
    let r = run_command(cfg, &ctx).await;
    assert!(
        r.output_excerpt.contains(&format!(
            "db={} user={} pw=***",
            ctx.conn.database, ctx.conn.user
        )),
        "the branch under the project's names, its password scrubbed: {}",
        r.output_excerpt
    );
    consort_testkit::verify::assert_contains(&r.output_excerpt, "\n42\n");
    assert!(r.output_excerpt.contains(&format!(
        "dir={}",
        std::env::var("CARGO_MANIFEST_DIR").expect("set")
    )));
    assert!(r.output_excerpt.contains("fixed=ci"));
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn a_runner_that_cannot_start_is_an_error_not_a_red_test() {
    let tree = tree_of(&[("tests/a.sql", "SELECT 1;")]);
    let (p, b, mut ctx) = branch_for(tree.path(), &BaseSpec::default(), &[], None).await;
    let psql = PsqlRunner::new(PsqlRunnerConfig {
        psql: Some("/nonexistent/psql".into()),
        ..PsqlRunnerConfig::default()
    })
    .expect("runner");
    assert!(matches!(psql.run(&ctx).await, Err(Error::Runner(_))));
    ctx.work_tree = tree.path().join("missing");
    assert!(matches!(
        CommandRunner::new(cmd("true")).run(&ctx).await,
        Err(Error::Runner(_))
    ));
    p.delete(&b.name).await.expect("delete");
}

fn stock_spec() -> BaseSpec {
    base_of(vec![migration(
        "0001_stock",
        "CREATE TABLE stock (sku text NOT NULL, location text NOT NULL, qty int NOT NULL CHECK (qty >= 0), PRIMARY KEY (sku, location))",
    )])
}

#[tokio::test]
async fn psql_runs_every_sql_test_file_in_its_own_rolled_back_transaction() {
    let tree = tree_of(&[
        (
            "src/stock.sql",
            "CREATE OR REPLACE FUNCTION receive(p_sku text, p_loc text, p_qty int) RETURNS void LANGUAGE sql AS $$\n  INSERT INTO stock VALUES (p_sku, p_loc, p_qty)\n  ON CONFLICT (sku, location) DO UPDATE SET qty = stock.qty + EXCLUDED.qty;\n$$;\n",
        ),
        (
            "tests/t1_receive.sql",
            "SELECT receive('A-1', 'dock', 5);\nSELECT receive('A-1', 'dock', 2);\nDO $$ BEGIN ASSERT (SELECT qty FROM stock WHERE sku = 'A-1') = 7, 'quantities add up'; END $$;\n",
        ),
        (
            "tests/t2_isolated.sql",
            "DO $$ BEGIN ASSERT (SELECT count(*) FROM stock) = 0, 'sees no other test''s rows'; END $$;\n",
        ),
        (
            "tests/t3_red.sql",
            "DO $$ BEGIN ASSERT (SELECT count(*) FROM stock WHERE qty < 0) = 1, 'negative stock must exist'; END $$;\n",
        ),
        (
            "tests/deeper/t4_check.sql",
            "DO $$ BEGIN\n  BEGIN\n    PERFORM receive('B-2', 'dock', -1);\n    RAISE EXCEPTION 'negative quantity accepted';\n  EXCEPTION WHEN check_violation THEN NULL;\n  END;\nEND $$;\n",
        ),
        ("tests/README.md", "not a test"),
    ]);
    let (p, b, ctx) = branch_for(tree.path(), &stock_spec(), &["tests/t1_receive.sql"], None).await;
    let runner = PsqlRunner::new(PsqlRunnerConfig::default()).expect("psql runner");
    assert_eq!(runner.name(), "psql");
    let r = runner.run(&ctx).await.expect("run");
    let names: Vec<&str> = r.outcomes.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "tests/deeper/t4_check.sql",
            "tests/t1_receive.sql",
            "tests/t2_isolated.sql",
            "tests/t3_red.sql"
        ],
        "every test file in the tree runs, not only the expected ones"
    );
    assert_eq!(status(&r, "tests/t1_receive.sql"), Some(TestStatus::Passed));
    assert_eq!(
        status(&r, "tests/t2_isolated.sql"),
        Some(TestStatus::Passed)
    );
    assert_eq!(
        status(&r, "tests/deeper/t4_check.sql"),
        Some(TestStatus::Passed)
    );
    assert_eq!(status(&r, "tests/t3_red.sql"), Some(TestStatus::Failed));
    assert!(r.output_excerpt.contains("negative stock must exist"));
    // What the server said is the failing test's own message; a passing test has none.
    let said = |name: &str| {
        r.outcomes
            .iter()
            .find(|o| o.name == name)
            .and_then(|o| o.message.clone())
    };
    let red = said("tests/t3_red.sql").expect("the failure's message");
    assert!(
        red.contains("ERROR:") && red.contains("negative stock must exist"),
        "{red}"
    );
    assert!(!red.contains("psql session opened"), "{red}");
    assert_eq!(said("tests/t1_receive.sql"), None);
    assert!(!r.exit.success());
    // Tests leave nothing behind; the loaded code stays.
    let left = must_query(&ctx.conn, "SELECT count(*) FROM stock").await;
    assert_eq!(left, vec!["0".to_string()]);
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn a_broken_setup_file_errors_every_test_and_says_why() {
    let tree = tree_of(&[
        ("src/a_ok.sql", "CREATE VIEW v AS SELECT 1 AS one;\n"),
        ("src/b_broken.sql", "CREATE FUNCTON oops() RETURNS int;\n"),
        ("tests/t1.sql", "SELECT 1;\n"),
        ("tests/t2.sql", "SELECT 2;\n"),
    ]);
    let (p, b, ctx) = branch_for(tree.path(), &BaseSpec::default(), &[], None).await;
    let r = PsqlRunner::new(PsqlRunnerConfig::default())
        .expect("psql runner")
        .run(&ctx)
        .await
        .expect("run");
    assert_eq!(status(&r, "tests/t1.sql"), Some(TestStatus::Errored));
    assert_eq!(status(&r, "tests/t2.sql"), Some(TestStatus::Errored));
    assert!(
        r.output_excerpt
            .starts_with("setup file src/b_broken.sql failed"),
        "{}",
        r.output_excerpt
    );
    assert!(r.output_excerpt.contains("syntax error"));
    assert!(!r.exit.success());
    p.delete(&b.name).await.expect("delete");
}

/// A session whose connection breaks mid-run (here the test's own backend is terminated) is
/// reported, not judged: the test is errored and named in `sessions_lost`, so the verifier
/// can decide whose fault it was (see `tests/postgres/sandbox.rs`).
#[tokio::test]
async fn a_connection_lost_mid_run_is_reported_as_a_lost_session() {
    let tree = tree_of(&[
        ("tests/a_fine.sql", "SELECT 1;\n"),
        (
            "tests/b_cut.sql",
            "SELECT pg_terminate_backend(pg_backend_pid());\nSELECT 2;\n",
        ),
    ]);
    let (p, b, ctx) = branch_for(tree.path(), &BaseSpec::default(), &[], None).await;
    let runner = PsqlRunner::new(PsqlRunnerConfig::default()).expect("psql runner");
    let r = runner.run(&ctx).await.expect("the run is reported");
    assert_eq!(r.sessions_lost, vec!["tests/b_cut.sql".to_string()]);
    assert_eq!(status(&r, "tests/a_fine.sql"), Some(TestStatus::Passed));
    assert_eq!(status(&r, "tests/b_cut.sql"), Some(TestStatus::Errored));
    // A setup file that ends its own session is the same.
    write_tree(
        tree.path(),
        &[(
            "src/setup.sql",
            "SELECT pg_terminate_backend(pg_backend_pid());\n",
        )],
    );
    let r = runner.run(&ctx).await.expect("the run is reported");
    assert_eq!(r.sessions_lost, vec!["src/setup.sql".to_string()]);
    assert!(r.outcomes.iter().all(|o| o.status == TestStatus::Errored));
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn psql_never_takes_a_file_in_a_cache_directory_for_code_or_a_test() {
    let tree = tempfile::tempdir().expect("tree");
    let broken = "THIS IS NOT SQL;\n";
    write_tree(
        tree.path(),
        &[
            ("tests/t1.sql", "SELECT 1;\n"),
            ("tests/__pycache__/t1.sql", broken),
            ("tests/deep/node_modules/t2.sql", broken),
            ("tests/build/t3.sql", broken),
            ("src/target/broken.sql", broken),
            ("src/.git/hook.sql", broken),
        ],
    );
    let (p, b, mut ctx) = branch_for(tree.path(), &BaseSpec::default(), &[], None).await;
    let runner = PsqlRunner::new(PsqlRunnerConfig::default()).expect("psql runner");
    let plain = ctx.clone();
    ctx.filter = consort_actors::TreeFilter::new(&["build"]);
    let r = runner.run(&ctx).await.expect("run");
    let names: Vec<&str> = r.outcomes.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(
        names,
        vec!["tests/t1.sql"],
        "caches at any depth are skipped"
    );
    assert!(
        r.exit.success(),
        "no broken file was loaded: {}",
        r.output_excerpt
    );
    // Without the extra name, `build` is an ordinary directory.
    let r = runner.run(&plain).await.expect("run");
    assert_eq!(status(&r, "tests/build/t3.sql"), Some(TestStatus::Failed));
    p.delete(&b.name).await.expect("delete");
}
