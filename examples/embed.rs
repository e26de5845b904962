//! Embedding Consort in your own program: the StockFlow feature, run with the library's
//! builder instead of the `consort` command — the guide's "Embedding" code, runnable as it
//! stands.
//!
//! ```text
//! cargo run --example embed
//! ```
//!
//! Every role replays the recorded StockFlow script; the run uses the embedded PostgreSQL and
//! the psql runner (the builder's defaults) in a fresh temporary work tree, approves every gate
//! as "ada", and ends with the run's outcome.

use std::sync::Arc;

use consort::actors::{Progress, RunEvent};
use consort::agents::{Role, Script};
use consort::{ApproveAs, Ensemble, FeatureRequest, RunOutcome};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Your project's work tree; Consort creates `.consort/` in it for its ledger.
    let project = tempfile::tempdir()?;
    // The answers of every role. `Script::from_path` reads one from a file.
    let script = Script::from_toml_str(include_str!(
        "../consort-cli/examples/stockflow/data/script.toml"
    ))?;
    // The feature the script was recorded for: its id must be the script's `feature_id`.
    let feature = FeatureRequest {
        id: "F1-warehouse-stock".into(),
        title: "Warehouse stock visibility".into(),
        body: include_str!("../consort-cli/examples/stockflow/data/feature.md").into(),
    };
    let mut builder = Ensemble::builder(project.path())
        .feature(feature)
        .approver(Arc::new(ApproveAs { name: "ada".into() }));
    for role in Role::ALL {
        builder = builder.agent(role, script.agent(role));
    }
    let ensemble = builder.build().await?; // embedded PostgreSQL + psql runner by default
    // Follow the run as it happens: each ledger entry once durable, and the progress.
    let mut events = ensemble.subscribe();
    let follower = tokio::spawn(async move {
        let mut recorded = 0;
        while let Ok(event) = events.recv().await {
            match event {
                RunEvent::Recorded(_) => recorded += 1,
                RunEvent::Progress(Progress::Stopped { .. }) => break,
                _ => {}
            }
        }
        recorded
    });
    let report = ensemble.run().await; // done, a gate, or an escalation
    ensemble.shutdown().await;
    let report = report?;
    println!(
        "followed {} ledger entries as they were recorded",
        follower.await?
    );
    println!("outcome: {}", report.outcome);
    anyhow::ensure!(
        report.outcome == RunOutcome::Done,
        "the run did not reach done"
    );
    Ok(())
}
