//! What a step runs, end to end through the Lakebase actor on the shared cluster: a suite
//! split over branches (one receipt naming every shard, a failing GREEN answered before the
//! rest runs, a shard still running stopped once another shard's failure settles the verdict,
//! a test that failed last time run first, and what sharding opens, each caught: a
//! test that passes only when run alone, by the whole runs; a test that reaches for another
//! shard's branch; a test file that changes which tests exist; a shard that leaves tests out),
//! and a run limited to the selected tests.

use crate::common;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{migration, tree_of};
use consort_actors::{
    InfraFault, LakebaseMsg, TestRunReceipt, TestStatus, VerifyPurpose, VerifyRequest,
};
use consort_lakebase::{
    CommandRunner, CommandRunnerConfig, LakebaseActor, LakebaseArgs, PsqlRunner, PsqlRunnerConfig,
    Selector, Shards, TestRunner,
};
use consort_testkit::verify::{assert_contains, focused};
use ractor::ActorRef;

/// Split from the first run, over at most two shards besides the likely failures'.
const SPLIT: Shards = Shards {
    max: 2,
    split_above_ms: 0,
};

async fn actor(runner: Arc<dyn TestRunner>) -> ActorRef<LakebaseMsg> {
    let mut args = LakebaseArgs::new(common::dyn_provider().await, runner);
    args.pool = consort_testkit::cluster::pool_config(2);
    args.shards = SPLIT;
    LakebaseActor::spawn(args).await.expect("spawn").0
}

fn psql() -> Arc<dyn TestRunner> {
    Arc::new(PsqlRunner::new(PsqlRunnerConfig::default()).expect("psql runner"))
}

/// pytest with a JUnit report, told it can run a selection of files.
fn pytest() -> Arc<dyn TestRunner> {
    let mut cfg = CommandRunnerConfig::new(
        "python3 -m pytest -q -p no:cacheprovider --junitxml=\"$CONSORT_JUNIT\"",
    );
    cfg.junit_path = Some("junit.xml".into());
    cfg.tap = false;
    cfg.select = Some(Selector::Pytest);
    Arc::new(CommandRunner::new(cfg))
}

fn table() -> Vec<consort_actors::Migration> {
    vec![migration(
        "0001_items",
        "CREATE TABLE items (sku text PRIMARY KEY)",
    )]
}

/// A tree of test files and an actor to verify it with, each test's setup.
struct Suite {
    tree: tempfile::TempDir,
    actor: ActorRef<LakebaseMsg>,
}

impl Suite {
    /// `files` (path, content) in a fresh tree, verified with `runner`.
    async fn new(runner: Arc<dyn TestRunner>, files: &[(&str, &str)]) -> Self {
        let tree = tree_of(files);
        Suite {
            tree,
            actor: actor(runner).await,
        }
    }

    /// The same, of generated files.
    async fn of_owned(runner: Arc<dyn TestRunner>, files: &[(String, String)]) -> Self {
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, c)| (p.as_str(), c.as_str()))
            .collect();
        Self::new(runner, &refs).await
    }

    fn path(&self) -> &std::path::Path {
        self.tree.path()
    }

    /// A request for a run of `purpose` with `focus` on the tree.
    fn asks(&self, purpose: VerifyPurpose, focus: &str) -> VerifyRequest {
        focused(1, self.path(), table(), purpose, focus)
    }

    /// What the actor answers to `req`.
    async fn verify(
        &self,
        req: VerifyRequest,
    ) -> Result<TestRunReceipt, consort_actors::InfraError> {
        consort_testkit::verify::verify(&self.actor, req, Duration::from_secs(180)).await
    }

    /// The receipt of a GREEN run with `focus` on the tree.
    async fn green(&self, focus: &str) -> TestRunReceipt {
        self.receipt(VerifyPurpose::Green, focus).await
    }

    /// The receipt of a run of `purpose` with `focus` on the tree.
    async fn receipt(&self, purpose: VerifyPurpose, focus: &str) -> TestRunReceipt {
        self.verify(self.asks(purpose, focus))
            .await
            .expect("a receipt")
    }
}

#[tokio::test]
async fn a_split_suite_is_one_receipt_that_names_every_shard_and_adds_up_to_the_whole() {
    let files: Vec<(String, String)> = (1..=5)
        .map(|i| {
            (
                format!("tests/t{i}.sql"),
                format!("INSERT INTO items VALUES ('s{i}');\nDO $$ BEGIN ASSERT (SELECT count(*) FROM items) = 1; END $$;\n"),
            )
        })
        .collect();
    let suite = Suite::of_owned(psql(), &files).await;
    let split = suite.green("tests/t3.sql").await;
    assert_eq!(
        split.shards.len(),
        3,
        "the likely failure's shard, then two"
    );
    assert_eq!(
        split.shards[0].files,
        vec!["tests/t3.sql"],
        "the focus first"
    );
    let mut files: Vec<&String> = split.shards.iter().flat_map(|s| &s.files).collect();
    files.sort();
    assert_eq!(files.len(), 5, "every file in exactly one shard");
    let mut branches: Vec<&String> = split.shards.iter().map(|s| &s.branch_id).collect();
    branches.sort();
    branches.dedup();
    assert_eq!(branches.len(), 3, "each shard on its own branch");
    assert_eq!(split.branch_id, split.shards[0].branch_id);
    assert!(
        matches!(split.branch_copy.as_deref(), Some("clone" | "copy")),
        "the receipt says how its branches were made: {:?}",
        split.branch_copy
    );
    assert!(
        split
            .shards
            .iter()
            .all(|s| s.exit.as_ref().is_some_and(|e| e.success()))
    );
    assert_eq!(
        split.shards.iter().map(|s| s.outcomes).sum::<usize>(),
        split.outcomes.len()
    );
    let whole = suite.receipt(VerifyPurpose::Deploy, "tests/t3.sql").await;
    assert!(whole.shards.is_empty(), "the deploy run is whole");
    let names = |r: &TestRunReceipt| {
        let mut v: Vec<(String, String)> = r
            .outcomes
            .iter()
            .map(|o| (o.name.clone(), o.status.to_string()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&split),
        names(&whole),
        "the same tests, the same outcomes"
    );
}

#[tokio::test]
async fn a_failing_green_answers_from_the_likely_failures_before_the_rest_runs() {
    let mut files = vec![(
        "tests/t0_focus.sql".to_string(),
        "DO $$ BEGIN ASSERT false, 'the focus still fails'; END $$;\n".to_string(),
    )];
    files.extend((1..=4).map(|i| (format!("tests/t{i}.sql"), "SELECT 1;\n".to_string())));
    let suite = Suite::of_owned(psql(), &files).await;
    let green = suite.green("tests/t0_focus.sql").await;
    assert_eq!(
        green.shards.len(),
        1,
        "nothing else ran: {:?}",
        green.shards
    );
    assert_eq!(
        green.status_of("tests/t0_focus.sql"),
        Some(TestStatus::Failed)
    );
    assert_eq!(green.outcomes.len(), 1);
    assert!(green.output_excerpt.contains("the focus still fails"));
    // In RED the new test is meant to fail: the rest runs (whole), and is judged.
    let red = suite
        .receipt(VerifyPurpose::Red, "tests/t0_focus.sql")
        .await;
    assert_eq!(red.outcomes.len(), 5);
}

#[tokio::test]
async fn a_test_that_failed_in_the_last_split_run_runs_first_in_the_next() {
    // The focus passes; of the rest, one file fails at once and one sleeps a while. The first
    // split run finds the failure (a test that was green, so the run is made once more); in
    // that second run the failed file runs first, beside the focus's, and settles the verdict:
    // the sleeping file never runs there.
    let suite = Suite::new(
        psql(),
        &[
            ("tests/t0_focus.sql", "SELECT 1;\n"),
            (
                "tests/a1_fails.sql",
                "DO $$ BEGIN ASSERT false, 'broken by the step'; END $$;\n",
            ),
            ("tests/b1_slow.sql", "SELECT pg_sleep(2);\n"),
        ],
    )
    .await;
    let green = suite.green("tests/t0_focus.sql").await;
    assert_contains(&green.output_excerpt, "once more");
    let files: Vec<&Vec<String>> = green.shards.iter().map(|s| &s.files).collect();
    assert_eq!(
        files,
        vec![&vec![
            "tests/a1_fails.sql".to_string(),
            "tests/t0_focus.sql".to_string()
        ]],
        "the likely failures alone"
    );
    assert_eq!(
        green.status_of("tests/a1_fails.sql"),
        Some(TestStatus::Failed)
    );
    assert_eq!(green.status_of("tests/b1_slow.sql"), None);
}

#[tokio::test]
async fn a_shard_still_running_is_stopped_once_another_shard_s_failure_settles_the_verdict() {
    // The focus passes alone in the first phase; the rest is split over two shards. The slow
    // file marks that it started, then sleeps; the failing one waits for that mark, then
    // fails, which settles the verdict: the slow file's shard is stopped before it finishes.
    let slow = "import time\n\n\ndef test_slow():\n    open('marks/started', 'w').close()\n    time.sleep(30)\n    open('marks/finished', 'w').close()\n";
    let fails = "import os\nimport time\n\n\ndef test_fails():\n    for _ in range(300):\n        if os.path.exists('marks/started'):\n            break\n        time.sleep(0.1)\n    assert False, 'broken by the step'\n";
    let suite = Suite::new(
        pytest(),
        &[
            ("marks/.keep", ""),
            ("tests/test_focus.py", "def test_focus():\n    pass\n"),
            ("tests/test_a_fails.py", fails),
            ("tests/test_b_slow.py", slow),
        ],
    )
    .await;
    let mut req = suite.asks(VerifyPurpose::Green, "tests.test_focus::test_focus");
    req.caches = vec!["marks".into()];
    let green = suite.verify(req).await.expect("a receipt");
    assert_eq!(
        green.status_of("tests.test_a_fails::test_fails"),
        Some(TestStatus::Failed)
    );
    assert_contains(&green.output_excerpt, "broken by the step");
    assert!(
        suite.path().join("marks/started").exists(),
        "the slow file ran"
    );
    assert!(
        !suite.path().join("marks/finished").exists(),
        "and was stopped before it finished"
    );
    // The failure was a test that was green, so the run was made once more: there it ran
    // first, among the likely failures, and the slow file did not run at all.
    assert_eq!(green.status_of("tests.test_b_slow::test_slow"), None);
}

#[tokio::test]
async fn a_listing_that_failed_on_a_broken_tree_is_tried_again_once_the_tree_is_mended() {
    // A conftest.py that does not load: pytest can neither list nor run the suite. (The focus
    // names no file of the tree, so no likely failure settles the verdict before the listing.)
    let suite = Suite::new(
        pytest(),
        &[
            ("conftest.py", "raise RuntimeError('half-written')\n"),
            ("tests/test_a.py", "def test_a():\n    pass\n"),
            ("tests/test_b.py", "def test_b():\n    pass\n"),
            ("tests/test_c.py", "def test_c():\n    pass\n"),
        ],
    )
    .await;
    let broken = suite
        .verify(suite.asks(VerifyPurpose::Green, "tests.test_new::test_new"))
        .await;
    match &broken {
        Err(e) => assert_eq!(e.fault, InfraFault::TestCommandBroken, "{e}"),
        Ok(r) => assert!(
            r.shards.is_empty() && !r.not_passed().is_empty(),
            "run whole, and not a pass: {r:?}"
        ),
    }
    std::fs::write(suite.path().join("conftest.py"), "").expect("mend the conftest");
    let mended = suite.green("tests.test_new::test_new").await;
    assert!(mended.not_passed().is_empty(), "{:?}", mended.outcomes);
    assert!(
        !mended.shards.is_empty(),
        "the suite is listed and split again"
    );
}

#[tokio::test]
async fn a_test_that_passes_only_when_run_alone_is_caught_by_the_whole_runs() {
    // a0 commits a row; t9 expects none. On one branch, in path order, t9 fails; split, they
    // are on two branches and both pass.
    let suite = Suite::new(psql(), &[
        (
            "tests/a0_seed.sql",
            "COMMIT;\nINSERT INTO items VALUES ('seed');\n",
        ),
        (
            "tests/t9_empty.sql",
            "DO $$ BEGIN ASSERT (SELECT count(*) FROM items) = 0, 'items left behind'; END $$;\n",
        ),
    ]).await;
    let split = suite.green("tests/t9_empty.sql").await;
    assert_eq!(split.shards.len(), 2);
    assert!(split.not_passed().is_empty(), "split, both pass");
    for purpose in [VerifyPurpose::Red, VerifyPurpose::Deploy] {
        let whole = suite.receipt(purpose, "tests/t9_empty.sql").await;
        assert!(whole.shards.is_empty());
        assert_eq!(
            whole.status_of("tests/t9_empty.sql"),
            Some(TestStatus::Failed),
            "{purpose:?} runs whole and sees it"
        );
    }
}

#[tokio::test]
async fn a_test_cannot_reach_another_shard_s_branch() {
    let reach = r#"import os

import psycopg


def test_no_other_database_takes_a_write():
    url = os.environ["DATABASE_URL"]
    with psycopg.connect(url) as conn:
        others = [r[0] for r in conn.execute(
            "SELECT datname FROM pg_database WHERE datname <> current_database() AND datallowconn"
        )]
    written = []
    for name in others:
        try:
            with psycopg.connect(url, dbname=name) as other:
                other.execute("CREATE TABLE planted (x int)")
                written.append(name)
        except psycopg.Error:
            pass
    assert others, "there are other branches to try"
    assert written == []
"#;
    let suite = Suite::new(
        pytest(),
        &[
            ("tests/test_reach.py", reach),
            ("tests/test_other.py", "def test_a():\n    pass\n"),
            ("tests/test_third.py", "def test_b():\n    pass\n"),
        ],
    )
    .await;
    let run = suite.green("tests.test_other::test_a").await;
    assert_eq!(
        run.status_of("tests.test_reach::test_no_other_database_takes_a_write"),
        Some(TestStatus::Passed),
        "{}",
        run.output_excerpt
    );
    assert!(run.shards.len() >= 2, "split: {:?}", run.shards);
}

#[tokio::test]
async fn shards_whose_tests_do_not_add_up_to_the_listing_are_a_runner_fault() {
    // A file whose tests depend on how pytest was started: listed, one test; run, another.
    let shifty = "import sys\n\nif \"--collect-only\" in sys.argv:\n    def test_listed():\n        pass\nelse:\n    def test_run():\n        pass\n";
    // A file with a test that only the listing has: no shard runs it.
    let hiding = "import sys\n\n\ndef test_kept():\n    pass\n\n\nif \"--collect-only\" in sys.argv:\n    def test_hidden():\n        pass\n";
    for (file, content, says) in [
        ("tests/test_shifty.py", shifty, "does not have"),
        ("tests/test_hiding.py", hiding, "no shard ran 1"),
    ] {
        let suite = Suite::new(
            pytest(),
            &[
                (file, content),
                ("tests/test_plain.py", "def test_plain():\n    pass\n"),
                ("tests/test_more.py", "def test_more():\n    pass\n"),
            ],
        )
        .await;
        let e = suite
            .verify(suite.asks(VerifyPurpose::Green, "tests.test_plain::test_plain"))
            .await
            .expect_err("a runner fault, never a pass");
        assert_eq!(e.fault, InfraFault::TestCommandBroken, "{e}");
        assert!(e.detail.contains(says), "{file}: {}", e.detail);
        consort_testkit::verify::assert_contains(&e.detail, "`[runner] shards = 1`");
    }
}

#[tokio::test]
async fn a_selected_run_runs_only_the_selected_files_and_says_so() {
    let suite = Suite::new(
        psql(),
        &[
            ("tests/t1.sql", "SELECT 1;\n"),
            ("tests/t2.sql", "SELECT 2;\n"),
            (
                "tests/t3.sql",
                "DO $$ BEGIN ASSERT false, 'not selected'; END $$;\n",
            ),
        ],
    )
    .await;
    let mut req = suite.asks(VerifyPurpose::Green, "tests/t2.sql");
    req.select = vec!["tests/t1.sql".into(), "tests/t2.sql".into()];
    let selected = suite.verify(req.clone()).await.expect("a receipt");
    assert_eq!(selected.selection, vec!["tests/t1.sql", "tests/t2.sql"]);
    assert!(selected.shards.is_empty(), "a selection runs on one branch");
    assert_eq!(selected.outcomes.len(), 2);
    assert!(selected.not_passed().is_empty());
    // A name the runner cannot place in a file: the whole suite runs, and says so.
    req.select.push("tests/t9_gone.sql".into());
    let whole = suite.verify(req).await.expect("a receipt");
    assert!(whole.selection.is_empty());
    assert_eq!(whole.status_of("tests/t3.sql"), Some(TestStatus::Failed));
}

#[tokio::test]
async fn a_step_that_breaks_the_import_of_a_project_test_file_fails_split_as_whole() {
    // The step removed `gone` from the code, which the project's own tests/test_c_own.py
    // imports: that file no longer loads, so the listing cannot name its tests. It still runs
    // in a shard (with test_a_own.py: the shard stops at the file that does not load), and
    // the run fails, split as whole.
    let suite = Suite::new(
        pytest(),
        &[
            ("app/__init__.py", "def kept():\n    return 1\n"),
            (
                "tests/test_focus.py",
                "from app import kept\n\n\ndef test_focus():\n    assert kept() == 1\n",
            ),
            (
                "tests/test_a_own.py",
                "def test_a1():\n    pass\n\n\ndef test_a2():\n    pass\n",
            ),
            ("tests/test_b_own.py", "def test_b():\n    pass\n"),
            (
                "tests/test_c_own.py",
                "from app import gone\n\n\ndef test_c():\n    assert gone() == 1\n",
            ),
        ],
    )
    .await;
    let focus = "tests.test_focus::test_focus";
    let split = suite.green(focus).await;
    let whole = suite.receipt(VerifyPurpose::Deploy, focus).await;
    assert!(whole.shards.is_empty(), "the deploy run is whole");
    assert!(!split.shards.is_empty(), "split: {}", split.output_excerpt);
    // Its failure is one of a test that was green, so the run was made once more: there the
    // file that did not load ran first, among the likely failures.
    assert_contains(&split.output_excerpt, "once more");
    assert!(
        split.shards[0]
            .files
            .iter()
            .any(|f| f == "tests/test_c_own.py"),
        "{:?}",
        split.shards
    );
    let ran_c = split
        .shards
        .iter()
        .any(|s| s.files.iter().any(|f| f == "tests/test_c_own.py"));
    assert!(ran_c, "the file that does not load ran: {:?}", split.shards);
    for (how, r) in [("split", &split), ("whole", &whole)] {
        assert!(
            r.not_passed().iter().any(|n| n.contains("test_c_own")),
            "{how}: the broken file fails: {:?}",
            r.outcomes
        );
        assert!(
            r.output_excerpt.contains("cannot import name 'gone'"),
            "{how}: {}",
            r.output_excerpt
        );
    }
    // Whichever shard ended last, no test of the shard that stopped at the broken file passed
    // unreported: each is a failure, or was never judged because that shard's failure settled
    // the verdict first.
    let with_c = split
        .shards
        .iter()
        .find(|s| s.files.iter().any(|f| f == "tests/test_c_own.py"))
        .expect("the shard of the broken file");
    let tests_of = |file: &str| -> Vec<&str> {
        match file {
            "tests/test_a_own.py" => vec!["tests.test_a_own::test_a1", "tests.test_a_own::test_a2"],
            "tests/test_b_own.py" => vec!["tests.test_b_own::test_b"],
            _ => Vec::new(),
        }
    };
    for name in with_c.files.iter().flat_map(|f| tests_of(f)) {
        assert_ne!(split.status_of(name), Some(TestStatus::Passed), "{name}");
    }
}
