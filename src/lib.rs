//! # Consort
//!
//! Spec-first, test-driven agentic development on real database branches. An ensemble of
//! eight role agents — Product Owner, Spec Author, Architect Reviewer, DBA, Test Strategist,
//! UX Designer, Navigator and Driver — each runs as a supervised actor and exchanges only typed
//! artifacts with a conductor. The conductor owns a pure state machine that walks a design
//! lane to a frozen, SHA-256-hashed design a human approves, then a build lane of RED → GREEN →
//! REFACTOR → REVIEW per test, where every RED and GREEN is a real test run on a fresh branch of
//! a real PostgreSQL database. Humans approve the design, the deploy and the promotion of the
//! migrations; gates fail closed.
//!
//! This crate is the facade: it re-exports the three library crates, and adds the
//! [`Ensemble`] builder, the `consort.toml` [`config`], the [`Project`] on disk, its
//! [`runlock`] (one run per project), its [`backlog`] of features and its [`git`] branches.
//! It has no command line, no terminal, no HTTP server and no MCP server: those are the
//! `consort` program's, in the `consort-cli` package, which is built on this library alone.
//!
//! * [`actors`] (`consort-actors`): artifacts, the state machine, the conductor, supervision,
//!   gates, the ledger. Knows no LLM and no database.
//! * [`agents`] (`consort-agents`): the role actors and the [`Agent`](agents::Agent) trait
//!   with its backends (OpenAI-compatible, scripted replay, external command).
//! * [`lakebase`] (`consort-lakebase`): branch providers (embedded PostgreSQL, an existing
//!   server, Lakebase), the warm pool, migrations, test runners and receipts.
//!
//! ## Embedding
//!
//! ```no_run
//! use std::sync::Arc;
//! use consort::agents::{Role, Script};
//! use consort::{ApproveAs, Ensemble, FeatureRequest, RunOutcome};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let script = Script::from_path("stockflow.toml")?;
//! let mut builder = Ensemble::builder("/tmp/my-project")
//!     .feature(FeatureRequest { id: "F1".into(), title: "Stock".into(), body: "…".into() })
//!     .approver(Arc::new(ApproveAs { name: "ada".into() }));
//! for role in Role::ALL {
//!     builder = builder.agent(role, script.agent(role));
//! }
//! let ensemble = builder.build().await?; // embedded PostgreSQL + psql runner by default
//! let report = ensemble.run().await?;
//! assert_eq!(report.outcome, RunOutcome::Done);
//! ensemble.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! ## A custom agent
//!
//! Swapping in your own agent for a role is one line on the builder; the agent itself is one
//! trait method. The conductor applies the same rules to it as to any other: a reviewer that
//! approves blindly still cannot write code, and its verdict is refused if it authored the code.
//!
//! ```
//! use consort::agents::{Agent, AgentOutput, AgentFailure, Assignment, BoxFuture, Role};
//! use consort::actors::{Artifact, ReviewVerdict};
//!
//! struct Reviewer;
//!
//! impl Agent for Reviewer {
//!     fn act<'a>(&'a self, a: &'a Assignment) -> BoxFuture<'a, Result<AgentOutput, AgentFailure>> {
//!         Box::pin(async move {
//!             let files = a.inputs.files.len();
//!             Ok(AgentOutput::new(Artifact::ReviewVerdict(ReviewVerdict::Approve {
//!                 notes: vec![format!("read {files} files")],
//!             })))
//!         })
//!     }
//! }
//!
//! # fn wire(b: consort::EnsembleBuilder) -> consort::EnsembleBuilder {
//! b.agent(Role::Navigator, Reviewer)
//! # }
//! ```

// The library holds no function over 100 lines (clippy.toml sets the threshold).
#![warn(clippy::too_many_lines)]

pub mod backlog;
pub mod config;
mod ensemble;
pub mod git;
pub mod lanes;
pub mod project;
pub mod records;
mod replace_file;
pub mod runlock;

pub use consort_actors as actors;
pub use consort_agents as agents;
pub use consort_lakebase as lakebase;

pub use consort_actors::{
    ApproveAs, Approver, FeatureRequest, GateKind, Progress, RunOutcome, RunReport, StopAtGates,
};
pub use ensemble::{EVENTS_CAPACITY, Ensemble, EnsembleBuilder, EnsembleError, Promotion};
pub use project::{Project, ProjectError, RunOptions, StatusReport, UsageReport};
pub use runlock::{RunLock, RunLockError};

use std::sync::Arc;

/// Builds the Lakebase provider from `[database] provider = "lakebase"` settings.
pub(crate) fn lakebase_provider(
    dir: &std::path::Path,
    l: &config::LakebaseSettings,
) -> Result<Arc<dyn lakebase::BranchProvider>, ProjectError> {
    use lakebase::lakebase_api::{LakebaseConfig, LakebaseProvider, OAuthClient};
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let host = var(&l.host_env).ok_or_else(|| ProjectError::MissingEnv(l.host_env.clone()))?;
    let oauth = match (var(&l.client_id_env), var(&l.client_secret_env)) {
        (Some(client_id), Some(secret)) => Some(OAuthClient {
            client_id: client_id.trim().to_string(),
            client_secret: lakebase::Secret::new(secret.trim()),
        }),
        _ => None,
    };
    let token = match (var(&l.token_env), &oauth) {
        (Some(t), _) => t.trim().to_string(),
        (None, Some(_)) => String::new(),
        (None, None) => return Err(ProjectError::MissingEnv(l.token_env.clone())),
    };
    let mut cfg = LakebaseConfig::new(host, lakebase::Secret::new(token), &l.project);
    cfg.oauth = oauth;
    cfg.source_branch = Some(l.source_branch.clone());
    cfg.user = l.user.clone();
    cfg.branch_ttl = std::time::Duration::from_secs(l.ttl_secs);
    cfg.ca_file = l.ca_file.as_ref().map(|p| dir.join(p));
    cfg.max_live_branches = l.max_live_branches;
    let provider = LakebaseProvider::new(cfg).map_err(ProjectError::Lakebase)?;
    Ok(Arc::new(provider))
}
