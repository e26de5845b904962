//! A whole run recorded in the shared store: the StockFlow feature, built with the library's
//! builder on the test cluster, its events kept in PostgreSQL (`consort_lakebase::store`)
//! instead of the ledger file, replayed from the store to done.

use std::sync::Arc;

use consort::agents::{Role, Script};
use consort::lakebase::store::{PgEventLogOpener, PgStore, StoreHandle};
use consort::{ApproveAs, Ensemble, FeatureRequest, RunOutcome};
use consort_cli::init::{STOCKFLOW_FEATURE, STOCKFLOW_FEATURE_ID, STOCKFLOW_SCRIPT};

#[tokio::test]
async fn a_run_keeps_its_events_in_the_shared_store() {
    let provider = consort_testkit::cluster::provider().await;
    let info = consort_testkit::cluster::scratch_database().await;

    let project = tempfile::tempdir().expect("tempdir");
    let script = Script::from_toml_str(STOCKFLOW_SCRIPT).expect("script");
    let store = Arc::new(StoreHandle::connect(&info, "stockflow").expect("store"));
    let mut builder = Ensemble::builder(project.path())
        .feature(FeatureRequest {
            id: STOCKFLOW_FEATURE_ID.into(),
            title: "Warehouse stock visibility".into(),
            body: STOCKFLOW_FEATURE.into(),
        })
        .provider(provider.clone())
        .approver(Arc::new(ApproveAs { name: "ada".into() }))
        .event_log(Arc::new(PgEventLogOpener {
            store,
            feature: STOCKFLOW_FEATURE_ID.into(),
            lease: None,
        }));
    for role in Role::ALL {
        builder = builder.agent(role, script.agent(role));
    }
    let ensemble = builder.build().await.expect("ensemble");
    let report = ensemble.run().await.expect("the run");
    ensemble.shutdown().await;
    assert_eq!(report.outcome, RunOutcome::Done);

    // Every event is in the store, checked, and replays to done; no ledger file was written.
    let store = PgStore::connect(&info, "stockflow").await.expect("store");
    let entries = store.entries("F1-warehouse-stock").await.expect("entries");
    assert_eq!(entries.len(), report.events_appended);
    let machine = consort::actors::Machine::new(consort::actors::MachineConfig::default());
    let state = machine.replay(entries.iter().map(|e| &e.event));
    assert!(
        matches!(state.status, consort::actors::RunStatus::Done),
        "{:?}",
        state.phase()
    );
    assert!(!project.path().join(".consort/ledger.jsonl").exists());
}

/// The StockFlow example whose records are kept in a fresh store database, named by
/// `SHARED_STORE_URL`: the database, its URL, the project.
async fn stockflow_on_a_shared_store() -> (consort::lakebase::ConnectInfo, String, tempfile::TempDir)
{
    let info = consort_testkit::cluster::scratch_database().await;
    let url = format!(
        "postgres://{}:{}@{}:{}/{}",
        info.user,
        info.secret.expose(),
        info.host,
        info.port,
        info.database
    );
    let tmp = crate::common::stockflow_tempdir();
    let config = std::fs::read_to_string(tmp.path().join("consort.toml")).expect("config");
    std::fs::write(
        tmp.path().join("consort.toml"),
        format!("{config}\n[store]\nkind = \"postgres\"\nproject = \"stockflow\"\nurl_env = \"SHARED_STORE_URL\"\n"),
    )
    .expect("config");
    (info, url, tmp)
}

/// A clone that names a shared store reads its records from there, and a row that is not
/// Consort's (a record file named to climb out of the record directory, a backlog entry that is
/// no feature id) is refused with what it is, before anything is written.
#[tokio::test]
async fn a_shared_stores_foreign_rows_are_refused_before_anything_is_written() {
    let (info, url, tmp) = stockflow_on_a_shared_store().await;
    let dir = tmp.path();
    let status = || {
        let o = crate::common::run(
            crate::common::consort_in("status", dir).env("SHARED_STORE_URL", &url),
        );
        (o.status.code(), consort_testkit::process::text(&o))
    };
    // `consort status` fails, saying `says`: what it said.
    let status_fails_saying = |says: &str| {
        let (code, said) = status();
        assert_ne!(code, Some(0), "{said}");
        assert!(said.contains(says), "{said}");
        said
    };
    // Unset, the store's URL is asked for by its variable's name.
    let o = crate::common::run(&mut crate::common::consort_in("status", dir));
    assert_ne!(o.status.code(), Some(0));
    assert!(
        consort_testkit::process::text(&o)
            .contains("set the environment variable SHARED_STORE_URL"),
        "{}",
        consort_testkit::process::text(&o)
    );
    let (code, said) = status();
    assert_eq!(code, Some(0), "{said}");

    let store = PgStore::connect(&info, "stockflow").await.expect("store");
    drop(store);
    let client = consort::lakebase::connect(&info).await.expect("client");
    client
        .execute(
            "INSERT INTO consort_store.documents (project, feature, name, body) \
             VALUES ('stockflow', 'f2', '../../../escape.md', 'x')",
            &[],
        )
        .await
        .expect("a foreign record file");
    status_fails_saying("not Consort's");
    assert!(
        !dir.join("escape.md").exists()
            && !dir.parent().expect("parent").join("escape.md").exists()
    );
    client
        .batch_execute(
            "DELETE FROM consort_store.documents; \
             INSERT INTO consort_store.backlog (project, position, feature) \
             VALUES ('stockflow', 1, '../f2')",
        )
        .await
        .expect("a foreign backlog entry");
    let said = status_fails_saying("a backlog entry \"../f2\"");
    assert!(
        !said.contains(info.secret.expose()),
        "the URL's password is in no message"
    );
}

/// A feature whose workers were lost as many times in a row as the fleet allows (issue 49,
/// item 7) is shown halted for a person by `consort status`, with what to do.
#[tokio::test]
async fn status_shows_a_feature_that_lost_its_workers_halted_for_a_person() {
    use consort::lakebase::store::LOST_WORKERS_BOUND;
    let (info, url, tmp) = stockflow_on_a_shared_store().await;
    let dir = tmp.path();
    // A worker took the feature and was lost; the ones before it too.
    let feature = "F1-warehouse-stock";
    let mut store = PgStore::connect(&info, "stockflow").await.expect("store");
    store
        .take_next(
            &[feature.to_string()],
            "worker on m9 (PID 1)",
            std::time::Duration::from_millis(1),
        )
        .await
        .expect("take")
        .expect("taken");
    let client = consort::lakebase::connect(&info).await.expect("client");
    client
        .execute(
            "UPDATE consort_store.leases SET lost = $1 WHERE project = 'stockflow'",
            &[&(LOST_WORKERS_BOUND - 1)],
        )
        .await
        .expect("workers lost before");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let o =
        crate::common::run(crate::common::consort_in("status", dir).env("SHARED_STORE_URL", &url));
    let said = consort_testkit::process::text(&o);
    assert_eq!(o.status.code(), Some(0), "{said}");
    assert!(said.contains("halted (workers-lost)"), "{said}");
    assert!(
        said.contains(&format!("{LOST_WORKERS_BOUND} workers in a row lost it")),
        "{said}"
    );
    assert!(
        said.contains(&format!("consort run --feature {feature}")),
        "{said}"
    );
}

/// A person's decision recorded from another clone reaches the driver's renewal thread: its
/// next renewal finds the lease ended, and it stops renewing (the driver's next append is
/// refused too: `a_person_s_decision_ends_the_driver_s_lease_at_once`).
#[tokio::test]
async fn the_renewal_thread_notices_a_person_s_decision() {
    use consort::actors::{Event, HumanDecision};
    use consort::records::LeaseKeeper;
    use std::time::Duration;

    let info = consort_testkit::cluster::scratch_database().await;
    tokio::task::spawn_blocking(move || {
        let worker = Arc::new(StoreHandle::connect(&info, "shop").expect("the worker's store"));
        let laptop = StoreHandle::connect(&info, "shop").expect("the laptop's store");
        let ttl = Duration::from_secs(3);
        let lease = worker
            .acquire("f1", "worker", ttl)
            .expect("acquire")
            .expect("free");
        let keeper = LeaseKeeper::keep(Arc::clone(&worker), lease, ttl);
        assert!(keeper.renewing(), "the lease is renewed");
        assert!(
            worker.renew(keeper.lease(), ttl).expect("renew"),
            "and still held"
        );
        let stop = Event::Human {
            decision: HumanDecision::Stop,
            by: "ada".into(),
        };
        laptop
            .append("f1", &stop, None, 0)
            .expect("the person's decision");
        assert!(
            consort_testkit::process::eventually(10, || !keeper.renewing()),
            "the renewal thread stops renewing a lease a person's decision ended"
        );
    })
    .await
    .expect("the test's thread");
}

/// A person's decision whose ledger moved on while it was judged (another process appended
/// between the read and the append) is refused by the store, judged again on the ledger as it
/// is, and recorded once. The body runs in a child process of this test binary: only there is
/// the store's URL in the environment.
#[test]
fn a_decision_whose_ledger_moved_on_is_judged_again_and_recorded_once() {
    use consort::actors::{Event, HumanDecision, Quarantine, RunStatus};
    const CHILD: &str = "CONSORT_TEST_JUDGED_AGAIN_IN";
    let Some(dir) = std::env::var_os(CHILD) else {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let (_info, url, tmp) = runtime.block_on(stockflow_on_a_shared_store());
        let o = crate::common::run(
            crate::common::consort_in("run", tmp.path()).env("SHARED_STORE_URL", &url),
        );
        crate::common::assert_exit(&o, 3, "the run waits at the design gate");
        let exe = std::env::current_exe().expect("this test binary");
        let o = crate::common::run(
            std::process::Command::new(exe)
                .args(["--exact", "--nocapture", "--test-threads=1"])
                .arg("store::a_decision_whose_ledger_moved_on_is_judged_again_and_recorded_once")
                .env(CHILD, tmp.path())
                .env("SHARED_STORE_URL", &url),
        );
        crate::common::assert_exit(&o, 0, "the child's test");
        crate::common::says(&o, "1 passed");
        return;
    };
    let project = consort::project::Project::open(std::path::Path::new(&dir)).expect("project");
    let store = Arc::clone(project.records().store().expect("the shared store"));
    let feature = project.feature_id().to_string();
    let mut judged = 0;
    let recorded = project
        .record_judged(|log, machine| {
            judged += 1;
            if judged == 1 {
                // Another person's decision lands between this read and this append.
                let quarantine = Event::Quarantined {
                    quarantine: Quarantine {
                        test: "tests/t1.sql".into(),
                        by: "bob".into(),
                        reason: "needs a device".into(),
                    },
                };
                let seen = log.entries().len() as u64;
                store
                    .append(&feature, &quarantine, None, seen)
                    .expect("bob's decision");
            }
            consort::actors::record_human_decision(log, machine, HumanDecision::Stop, "ada")
        })
        .expect("the ledger opens");
    recorded.expect("recorded once judged on the ledger as it is");
    assert_eq!(judged, 2, "judged again after the refusal");
    let events = project.events().expect("events");
    let stops = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::Human {
                    decision: HumanDecision::Stop,
                    ..
                }
            )
        })
        .count();
    assert_eq!(stops, 1, "recorded once");
    assert!(
        matches!(events.last(), Some(Event::Human { .. })),
        "after bob's"
    );
    assert_eq!(project.state().expect("state").status, RunStatus::Stopped);
}
