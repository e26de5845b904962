//! Embedding a project: opens a project from its `consort.toml` — as `consort run` does, with its
//! records, git commits, migration files and store — plays one role with an agent of your own,
//! and runs the feature to done. Every other role stays as the configuration says.
//!
//! ```text
//! cargo run --example embed_project             # StockFlow, in a directory removed at the end
//! cargo run --example embed_project -- DIR      # the project in DIR, or StockFlow written there
//!                                               # (every gate is approved as "ada")
//! ```
//!
//! The Driver here is your own: it counts the steps it is given and answers each with what
//! the project's configured Driver answers (StockFlow's script), so the run is the one
//! `consort run` makes, commit for commit. Put your own logic in `act`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use consort::agents::{Agent, AgentFailure, AgentOutput, Assignment, AsyncAgent, Role};
use consort::git::GitRepo;
use consort::{ApproveAs, Project, RunOptions, RunOutcome};

/// A Driver of your own, in front of the configured one.
struct MyDriver {
    configured: Arc<dyn Agent>,
    steps: Arc<AtomicUsize>,
}

impl AsyncAgent for MyDriver {
    async fn act(&self, a: &Assignment) -> Result<AgentOutput, AgentFailure> {
        self.steps.fetch_add(1, Ordering::Relaxed);
        println!("my driver: {}", a.step);
        self.configured.act(a).await
    }

    fn describe(&self) -> String {
        "my driver (in front of the configured one)".into()
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // A directory given: its project, or StockFlow written there when it has none.
    let (dir, _removed_at_exit) = match std::env::args_os().nth(1) {
        Some(dir) => (PathBuf::from(dir), None),
        None => {
            let fresh = tempfile::tempdir()?;
            (fresh.path().to_path_buf(), Some(fresh))
        }
    };
    if !dir.join("consort.toml").exists() {
        write_stockflow(&dir)?;
        println!("StockFlow written to {}", dir.display());
    }
    let project = Project::open(&dir)?;
    let configured = project.configured_agent(Role::Driver)?;
    let steps = Arc::new(AtomicUsize::new(0));
    let driver = MyDriver {
        configured,
        steps: Arc::clone(&steps),
    };
    let opts = RunOptions {
        approver: Some(Arc::new(ApproveAs { name: "ada".into() })),
        ..RunOptions::default()
    }
    .with_agent(Role::Driver, driver);
    let ensemble = project.ensemble(opts).await?;
    let outcome = ensemble.run().await.map(|report| report.outcome);
    ensemble.shutdown().await;
    let outcome = outcome?;
    println!("my driver took {} steps", steps.load(Ordering::Relaxed));
    println!("outcome: {outcome}");
    anyhow::ensure!(outcome == RunOutcome::Done, "the run did not reach done");
    Ok(())
}

/// The StockFlow project as `consort init --example stockflow` writes it, in a git repository.
fn write_stockflow(dir: &Path) -> anyhow::Result<()> {
    let files = [
        ("consort.toml", STOCKFLOW_CONFIG),
        (
            "feature.md",
            include_str!("../consort-cli/examples/stockflow/data/feature.md"),
        ),
        (
            ".consort/agents/stockflow.toml",
            include_str!("../consort-cli/examples/stockflow/data/script.toml"),
        ),
    ];
    for (path, text) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, text)?;
    }
    GitRepo::init_with_commit(dir, "StockFlow example", "StockFlow before the run")?;
    Ok(())
}

/// StockFlow's `consort.toml`: SQL tests run by psql, the design's migrations in
/// `migrations/`, every role played by the recorded script.
const STOCKFLOW_CONFIG: &str = r#"[feature]
id = "F1-warehouse-stock"
request = "feature.md"

[runner]
kind = "psql"
setup = ["src/**/*.sql"]
tests = ["tests/**/*.sql"]

[migrations]
dir = "migrations"

[agents.default]
backend = "script"
path = ".consort/agents/stockflow.toml"
"#;
