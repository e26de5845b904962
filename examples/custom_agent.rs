//! Your own agent in one role: the StockFlow run with the Navigator swapped for an agent of
//! your own, which handles every step the Navigator gets — it writes RED's failing tests (here
//! by asking another agent, the recorded script) and does every review itself.
//!
//! ```text
//! cargo run --example custom_agent
//! ```
//!
//! The review is deliberately simple: it reads the change sets since the last review (which the
//! assignment carries), asks for changes when code still holds a `TODO`, and approves
//! otherwise, naming what it read. Whatever it answers is checked by the machine like any other
//! agent's answer: it may never review code it wrote, and RED is still a real failing run.

use std::sync::Arc;

use consort::actors::{Artifact, FileChange, ReviewVerdict, Step};
use consort::agents::{Agent, AgentFailure, AgentOutput, Assignment, AsyncAgent, Role, Script};
use consort::{ApproveAs, Ensemble, FeatureRequest, RunOutcome};

/// A Navigator: RED from another agent, reviews of its own.
struct MyNavigator {
    red: Arc<dyn Agent>,
}

impl MyNavigator {
    fn review(a: &Assignment) -> ReviewVerdict {
        let written: Vec<(&str, &str)> = a
            .inputs
            .changes
            .iter()
            .flat_map(|set| &set.changes)
            .filter_map(|c| match c {
                FileChange::Write { path, content } => Some((path.as_str(), content.as_str())),
                _ => None,
            })
            .collect();
        let unfinished: Vec<String> = written
            .iter()
            .filter(|(_, content)| content.contains("TODO"))
            .map(|(path, _)| format!("{path} still has a TODO: finish it or drop the note"))
            .collect();
        if unfinished.is_empty() {
            let files: std::collections::BTreeSet<&str> =
                written.iter().map(|(path, _)| *path).collect();
            let files: Vec<&str> = files.into_iter().collect();
            ReviewVerdict::Approve {
                notes: vec![format!("read {}", files.join(", "))],
            }
        } else {
            ReviewVerdict::ChangesRequested {
                reasons: unfinished,
            }
        }
    }
}

impl AsyncAgent for MyNavigator {
    async fn act(&self, a: &Assignment) -> Result<AgentOutput, AgentFailure> {
        match &a.step {
            Step::Red { .. } => self.red.act(a).await,
            Step::Review { .. } => {
                let verdict = Self::review(a);
                let said = match &verdict {
                    ReviewVerdict::Approve { notes } => {
                        format!("approve: {}", notes.join("; "))
                    }
                    ReviewVerdict::ChangesRequested { reasons } => {
                        format!("changes requested: {}", reasons.join("; "))
                    }
                };
                println!("{}: {said}", a.step);
                Ok(AgentOutput::new(Artifact::ReviewVerdict(verdict)))
            }
            other => Err(AgentFailure::WrongRole {
                role: Role::Navigator,
                step: other.to_string(),
            }),
        }
    }

    fn describe(&self) -> String {
        "my navigator (RED from the script, reviews of its own)".into()
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let script = Script::from_toml_str(include_str!(
        "../consort-cli/examples/stockflow/data/script.toml"
    ))?;
    let project = tempfile::tempdir()?;
    let mut builder = Ensemble::builder(project.path())
        .approver(Arc::new(ApproveAs { name: "ada".into() }))
        .feature(FeatureRequest {
            id: "F1-warehouse-stock".into(),
            title: "Warehouse stock visibility".into(),
            body: include_str!("../consort-cli/examples/stockflow/data/feature.md").into(),
        });
    for role in Role::ALL.into_iter().filter(|r| *r != Role::Navigator) {
        builder = builder.agent(role, script.agent(role));
    }
    // The swap: one line.
    let red: Arc<dyn Agent> = Arc::new(script.agent(Role::Navigator));
    builder = builder.agent(Role::Navigator, MyNavigator { red });
    let ensemble = builder.build().await?;
    let outcome = ensemble.run().await.map(|report| report.outcome);
    ensemble.shutdown().await;
    let outcome = outcome?;
    println!("outcome: {outcome}");
    anyhow::ensure!(outcome == RunOutcome::Done, "the run did not reach done");
    Ok(())
}
