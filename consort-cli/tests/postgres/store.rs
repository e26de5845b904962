//! A whole run recorded in the shared store: the StockFlow feature, built with the library's
//! builder on the test cluster, its events kept in PostgreSQL (`consort_lakebase::store`)
//! instead of the ledger file, replayed from the store to done.

use std::sync::Arc;

use consort::agents::{Role, Script};
use consort::lakebase::store::{PgEventLogOpener, PgStore, StoreHandle};
use consort::lakebase::{BaseSpec, BranchProvider, names::BranchNamer};
use consort::{ApproveAs, Ensemble, FeatureRequest, RunOutcome};

#[tokio::test]
async fn a_run_keeps_its_events_in_the_shared_store() {
    let provider = consort_testkit::cluster::provider().await;
    let base = provider
        .prepare_base(&BaseSpec::default())
        .await
        .expect("base");
    let branch = provider
        .create(&BranchNamer::new().next_name(), &base)
        .await
        .expect("a database for the store");
    let info = provider.connect_info(&branch).await.expect("info");

    let project = tempfile::tempdir().expect("tempdir");
    let script = Script::from_toml_str(include_str!("../../examples/stockflow/data/script.toml"))
        .expect("script");
    let feature = FeatureRequest {
        id: "F1-warehouse-stock".into(),
        title: "Warehouse stock visibility".into(),
        body: include_str!("../../examples/stockflow/data/feature.md").into(),
    };
    let mut builder = Ensemble::builder(project.path())
        .feature(feature)
        .provider(provider.clone())
        .approver(Arc::new(ApproveAs { name: "ada".into() }))
        .event_log(Arc::new(PgEventLogOpener {
            store: Arc::new(StoreHandle::connect(&info, "stockflow").expect("store")),
            feature: "F1-warehouse-stock".into(),
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
