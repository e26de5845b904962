//! The Lakebase actor end to end: verify requests in, receipts out, on real branches.

use crate::common;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{migration, tree_of, write_tree};
use consort_actors::hash_dir;
use consort_actors::{
    InfraFault, LakebaseMsg, PromoteRequest, RequestId, TestRunReceipt, TestStatus, VerifyPurpose,
    VerifyRequest,
};
use consort_lakebase::{
    BranchProvider, EmbeddedConfig, EmbeddedPostgres, EmbeddedProvider, LakebaseActor,
    LakebaseArgs, PsqlRunner, PsqlRunnerConfig, TestRunner,
};
use consort_testkit::verify::{assert_contains, assert_fault, focused, request};
use ractor::{ActorRef, rpc::CallResult};

fn psql_runner() -> Arc<dyn TestRunner> {
    Arc::new(PsqlRunner::new(PsqlRunnerConfig::default()).expect("psql runner"))
}

fn args(provider: Arc<dyn BranchProvider>, runner: Arc<dyn TestRunner>) -> LakebaseArgs {
    LakebaseArgs {
        pool: consort_testkit::cluster::pool_config(2),
        max_concurrent: 4,
        ..LakebaseArgs::new(provider, runner)
    }
}

/// A Lakebase actor of `provider` and `runner`, with [`args`].
async fn spawn(
    provider: Arc<dyn BranchProvider>,
    runner: Arc<dyn TestRunner>,
) -> (ActorRef<LakebaseMsg>, ractor::concurrency::JoinHandle<()>) {
    LakebaseActor::spawn(args(provider, runner))
        .await
        .expect("spawn")
}

/// Stops `actor` and waits until it has stopped.
async fn stop(actor: ActorRef<LakebaseMsg>, join: ractor::concurrency::JoinHandle<()>) {
    actor.stop(None);
    join.await.expect("stopped");
}

/// A RED request with no migrations whose new test is `focus`.
fn red(id: u64, tree: &std::path::Path, focus: &str) -> VerifyRequest {
    focused(id, tree, vec![], VerifyPurpose::Red, focus)
}

async fn verify(
    actor: &ActorRef<LakebaseMsg>,
    req: VerifyRequest,
) -> Result<TestRunReceipt, consort_actors::InfraError> {
    consort_testkit::verify::verify(actor, req, Duration::from_secs(180)).await
}

fn stock_migrations() -> Vec<consort_actors::Migration> {
    vec![migration(
        "0001_stock",
        "CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL)",
    )]
}

#[tokio::test]
async fn a_verify_request_is_answered_with_a_receipt_of_the_real_run() {
    let tree = tree_of(&[
        (
            "src/stock.sql",
            "CREATE OR REPLACE FUNCTION total() RETURNS bigint LANGUAGE sql AS 'SELECT coalesce(sum(qty), 0) FROM stock';\n",
        ),
        (
            "tests/t1_empty.sql",
            "DO $$ BEGIN ASSERT total() = 0; END $$;\n",
        ),
        (
            "tests/t2_new.sql",
            "INSERT INTO stock VALUES ('A', 3);\nDO $$ BEGIN ASSERT total() = 4, 'total counts reservations'; END $$;\n",
        ),
    ]);
    let (actor, join) = spawn(common::dyn_provider().await, psql_runner()).await;
    let mut req = request(41, tree.path(), stock_migrations());
    req.purpose = VerifyPurpose::Red;
    req.tests = vec!["tests/t1_empty.sql".into()];
    req.focus = Some("tests/t2_new.sql".into());
    let receipt = verify(&actor, req.clone()).await.expect("receipt");
    assert_eq!(receipt.request_id, RequestId(41));
    assert_eq!(receipt.workspace_hash, hash_dir(tree.path()).expect("hash"));
    assert_ne!(receipt.workspace_hash, req.workspace_hash);
    assert_eq!(receipt.provider, "embedded");
    assert_eq!(receipt.runner, "psql");
    assert!(receipt.branch_id.starts_with("consort_"));
    assert_eq!(
        receipt.status_of("tests/t1_empty.sql"),
        Some(TestStatus::Passed)
    );
    assert_eq!(
        receipt.status_of("tests/t2_new.sql"),
        Some(TestStatus::Failed)
    );
    assert_eq!(receipt.not_passed(), vec!["tests/t2_new.sql"]);
    assert!(receipt.output_excerpt.contains("total counts reservations"));
    assert!(!receipt.exit.success());

    // GREEN after the fix: same request flow, all pass.
    write_tree(
        tree.path(),
        &[(
            "tests/t2_new.sql",
            "INSERT INTO stock VALUES ('A', 3);\nDO $$ BEGIN ASSERT total() = 3; END $$;\n",
        )],
    );
    let green = verify(&actor, request(42, tree.path(), stock_migrations()))
        .await
        .expect("receipt");
    assert_eq!(green.request_id, RequestId(42));
    assert!(green.exit.success());
    assert!(green.not_passed().is_empty());
    assert_ne!(green.workspace_hash, receipt.workspace_hash);
    assert_ne!(
        green.branch_id, receipt.branch_id,
        "every run gets a fresh branch"
    );

    // A failing migration means no test ran: never a receipt (a RED would count the tests
    // that never ran as failing), but an infrastructure error that names the migration and
    // the server's error.
    let mut bad = stock_migrations();
    bad.push(migration(
        "0002_bad",
        "ALTER TABLE nowhere ADD COLUMN x int",
    ));
    let mut req = request(43, tree.path(), bad);
    req.tests = vec!["tests/t1_empty.sql".into()];
    let failed = verify(&actor, req)
        .await
        .expect_err("no receipt without a run");
    assert_eq!(failed.fault, consort_actors::InfraFault::MigrationFailed);
    assert!(
        failed.detail.starts_with("no test ran"),
        "{}",
        failed.detail
    );
    assert_contains(&failed.detail, "0002_bad");
    assert!(
        failed.detail.contains("\"nowhere\" does not exist") && failed.detail.contains("42P01"),
        "the server's error: {}",
        failed.detail
    );

    actor.stop(None);
    join.await.expect("actor stopped");
}

#[tokio::test]
async fn concurrent_verifications_are_not_mixed_up() {
    let (actor, join) = spawn(common::dyn_provider().await, psql_runner()).await;
    let mut trees = Vec::new();
    for i in 0..10u64 {
        let tree = tempfile::tempdir().expect("tree");
        // Each tree's test records its own number and passes only for even numbers.
        let sql = format!(
            "INSERT INTO stock VALUES ('tree-{i}', {i});\nDO $$ BEGIN ASSERT (SELECT count(*) FROM stock) = 1; ASSERT {i} % 2 = 0, 'odd tree {i}'; END $$;\n"
        );
        write_tree(tree.path(), &[(&format!("tests/t_{i}.sql"), sql.as_str())]);
        trees.push(tree);
    }
    let mut calls = Vec::new();
    for (i, tree) in trees.iter().enumerate() {
        let actor = actor.clone();
        let req = request(100 + i as u64, tree.path(), stock_migrations());
        calls.push(tokio::spawn(async move { verify(&actor, req).await }));
    }
    for (i, call) in calls.into_iter().enumerate() {
        let r = call.await.expect("join").expect("receipt");
        assert_eq!(r.request_id, RequestId(100 + i as u64));
        assert_eq!(r.workspace_hash, hash_dir(trees[i].path()).expect("hash"));
        assert_eq!(r.outcomes.len(), 1, "{:?}", r.outcomes);
        let expected = if i % 2 == 0 {
            TestStatus::Passed
        } else {
            TestStatus::Failed
        };
        assert_eq!(r.status_of(&format!("tests/t_{i}.sql")), Some(expected));
    }
    actor.stop(None);
    join.await.expect("actor stopped");
}

#[tokio::test]
async fn infrastructure_failures_are_typed_errors_and_promote_reaches_the_parent() {
    let cluster = EmbeddedPostgres::start(EmbeddedConfig::temporary())
        .await
        .expect("cluster");
    let provider: Arc<dyn BranchProvider> = Arc::new(
        EmbeddedProvider::new(cluster.clone())
            .await
            .expect("provider"),
    );
    let tree = tree_of(&[("tests/t.sql", "SELECT 1;\n")]);

    // A runner that cannot start.
    let broken: Arc<dyn TestRunner> = Arc::new(
        PsqlRunner::new(PsqlRunnerConfig {
            psql: Some("/nonexistent/psql".into()),
            ..PsqlRunnerConfig::default()
        })
        .expect("runner"),
    );
    let a = args(provider.clone(), broken);
    let stats = a.stats.clone();
    let (actor, join) = LakebaseActor::spawn(a).await.expect("spawn");
    let err = verify(&actor, request(1, tree.path(), vec![]))
        .await
        .expect_err("runner failure");
    assert_eq!(err.fault, InfraFault::RunnerFailed);

    // Promote applies the migrations to the parent.
    let report = match actor
        .call(
            |port| {
                LakebaseMsg::Promote(
                    PromoteRequest {
                        id: RequestId(2),
                        migrations: stock_migrations(),
                        work_tree: None,
                        tool_records: Vec::new(),
                    },
                    port,
                )
            },
            Some(Duration::from_secs(120)),
        )
        .await
        .expect("alive")
    {
        CallResult::Success(r) => r.expect("promote"),
        other => panic!("no answer: {other:?}"),
    };
    assert_eq!(report.request_id, RequestId(2));
    assert_eq!(report.target, "consort");
    assert_eq!(report.applied, vec!["0001_stock"]);
    assert!(report.verified);

    stop(actor, join).await;
    let s = stats.snapshot();
    assert!(s.created >= 1);
    assert_eq!(
        s.live, 0,
        "every branch is gone after the actor stops: {s:?}"
    );

    // The database goes away: DatabaseDown.
    let (actor, join) = spawn(provider.clone(), psql_runner()).await;
    cluster.stop().expect("stop the cluster");
    let err = verify(&actor, request(3, tree.path(), stock_migrations()))
        .await
        .expect_err("database down");
    assert_eq!(err.fault, InfraFault::DatabaseDown);
    assert_contains(&err.detail, "getting a branch");
    stop(actor, join).await;
}

/// A test run whose session is ended by the code under test while the database stays up is
/// repeated once on a fresh branch, then judged: the receipt has the test errored and says
/// why. Both branches are dropped.
#[tokio::test]
async fn a_session_the_code_ends_is_judged_after_one_repeat_on_a_fresh_branch() {
    let provider = common::dyn_provider().await;
    let tree = tree_of(&[(
        "tests/cut.sql",
        "SELECT pg_terminate_backend(pg_backend_pid());\n",
    )]);
    let a = args(provider.clone(), psql_runner());
    let stats = a.stats.clone();
    let (actor, join) = LakebaseActor::spawn(a).await.expect("spawn");
    let receipt = verify(&actor, request(1, tree.path(), vec![]))
        .await
        .expect("a session the code ended is a verdict");
    assert_eq!(
        receipt.status_of("tests/cut.sql"),
        Some(TestStatus::Errored)
    );
    assert_contains(&receipt.output_excerpt, "on two fresh branches");
    stop(actor, join).await;
    let s = stats.snapshot();
    assert_eq!(s.live, 0, "both branches are dropped: {s:?}");
}

#[tokio::test]
async fn the_receipt_hashes_the_tree_without_the_requests_caches() {
    let tree = tree_of(&[
        ("tests/t1.sql", "SELECT 1;\n"),
        ("tests/__pycache__/t1.cpython-311.pyc", "bytecode"),
        ("out/build/t1.o", "object"),
    ]);
    let (actor, join) = spawn(common::dyn_provider().await, psql_runner()).await;
    let mut req = request(7, tree.path(), vec![]);
    req.caches = vec!["build".into()];
    let receipt = verify(&actor, req).await.expect("receipt");
    let filter = consort_actors::TreeFilter::new(&["build"]);
    assert_eq!(
        receipt.workspace_hash,
        consort_actors::WorkTree::open(tree.path())
            .expect("open")
            .with_filter(filter)
            .hash()
            .expect("hash"),
        "the conductor's hash, with the project's caches skipped"
    );
    assert_ne!(
        receipt.workspace_hash,
        hash_dir(tree.path()).expect("hash"),
        "out/build is hashed when `build` is not a cache"
    );
    // A request written before `caches` existed still reads, and skips the defaults only.
    let mut json = serde_json::to_value(request(8, tree.path(), vec![])).expect("json");
    json.as_object_mut().expect("object").remove("caches");
    let old: VerifyRequest = serde_json::from_value(json).expect("an old request reads");
    assert!(old.caches.is_empty());
    let receipt = verify(&actor, old).await.expect("receipt");
    assert_eq!(receipt.workspace_hash, hash_dir(tree.path()).expect("hash"));
    stop(actor, join).await;
}

/// A psql runner whose program is the script `body`, written into `dir`.
fn fake_psql(dir: &std::path::Path, name: &str, body: &str) -> Arc<dyn TestRunner> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).expect("write the script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let cfg = PsqlRunnerConfig {
        psql: Some(path),
        ..PsqlRunnerConfig::default()
    };
    Arc::new(PsqlRunner::new(cfg).expect("psql runner"))
}

/// A RED fails for the right reason: a psql session that never ran the test's statements is
/// the run's fault (a halt naming the cause), never a test that did not pass — Debian's
/// `psql` wrapper with no client behind it (exit 1), a psql that cannot open a session while
/// the branch answers (exit 2), a wrapper that runs nothing (exit 0, no session), a program
/// that is not there. The test's own failing statement (exit 3) stays a failure.
#[tokio::test]
async fn a_psql_that_never_ran_the_test_is_a_harness_fault_never_a_red() {
    let tree = tree_of(&[(
        "tests/t1_new.sql",
        "DO $$ BEGIN ASSERT false, 'fails for the right reason'; END $$;\n",
    )]);
    let bin = tempfile::tempdir().expect("a directory for the programs");
    let real = consort_lakebase::find_psql().expect("psql is installed");
    let cases = [
        (
            fake_psql(
                bin.path(),
                "debian-wrapper",
                "echo 'Error: You must install at least one postgresql-client-<version> package' >&2\nexit 1\n",
            ),
            "own fatal error (exit 1)",
        ),
        (
            fake_psql(
                bin.path(),
                "refused",
                &format!("exec '{}' -h 127.0.0.1 -p 1 \"$@\"\n", real.display()),
            ),
            "could not open a session",
        ),
        (fake_psql(bin.path(), "nothing", "exit 0\n"), "ran nothing"),
        (
            Arc::new(
                PsqlRunner::new(PsqlRunnerConfig {
                    psql: Some(bin.path().join("not-there")),
                    ..PsqlRunnerConfig::default()
                })
                .expect("psql runner"),
            ),
            "not-there",
        ),
    ];
    let provider = common::dyn_provider().await;
    for (runner, cause) in cases {
        let (actor, join) = spawn(provider.clone(), runner).await;
        let req = red(45, tree.path(), "tests/t1_new.sql");
        let e = verify(&actor, req)
            .await
            .expect_err("a harness fault, never a receipt a RED could be accepted on");
        assert!(
            matches!(
                e.fault,
                InfraFault::TestCommandBroken | InfraFault::RunnerFailed
            ),
            "{cause}: {e}"
        );
        assert!(e.detail.contains(cause), "{cause}: {}", e.detail);
        stop(actor, join).await;
    }
    // The Debian wrapper's own words reach the person.
    let (actor, join) = spawn(
        provider.clone(),
        fake_psql(
            bin.path(),
            "debian-wrapper-2",
            "echo 'Error: You must install at least one postgresql-client-<version> package' >&2\nexit 1\n",
        ),
    )
    .await;
    let e = verify(&actor, request(46, tree.path(), vec![]))
        .await
        .expect_err("a harness fault");
    assert_fault(
        &e,
        InfraFault::TestCommandBroken,
        "postgresql-client-<version>",
    );
    stop(actor, join).await;
    // The real psql: the test's own failing statement is a failure, the RED's evidence.
    let (actor, join) = spawn(provider, psql_runner()).await;
    let req = red(47, tree.path(), "tests/t1_new.sql");
    let receipt = verify(&actor, req).await.expect("a receipt");
    assert_eq!(
        receipt.status_of("tests/t1_new.sql"),
        Some(TestStatus::Failed)
    );
    assert!(
        receipt
            .output_excerpt
            .contains("fails for the right reason"),
        "{}",
        receipt.output_excerpt
    );
    stop(actor, join).await;
}

/// A RED whose new test ends its own database session never reached a verdict: after the one
/// repeat it is a harness fault, never a RED (a GREEN's is still a verdict on the code, see
/// `a_session_the_code_ends_is_judged_after_one_repeat_on_a_fresh_branch`).
#[tokio::test]
async fn a_red_whose_test_ends_its_own_session_is_no_red() {
    let tree = tree_of(&[(
        "tests/cut.sql",
        "SELECT pg_terminate_backend(pg_backend_pid());\n",
    )]);
    let (actor, join) = spawn(common::dyn_provider().await, psql_runner()).await;
    let req = red(48, tree.path(), "tests/cut.sql");
    let e = verify(&actor, req)
        .await
        .expect_err("no receipt a RED could be accepted on");
    assert_fault(&e, InfraFault::TestCommandBroken, "tests/cut.sql");
    stop(actor, join).await;
}
