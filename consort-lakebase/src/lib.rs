//! Database branches and real test runs for Consort.
//!
//! "Green" in Consort means: a real test runner passed against a live, freshly branched
//! PostgreSQL database. This crate is where that becomes true, and the only place that builds
//! [`TestRunReceipt`](consort_actors::TestRunReceipt)s.
//!
//! # The pieces and how they compose
//!
//! ```text
//!  EmbeddedPostgres::start(EmbeddedConfig) ─► Arc<EmbeddedCluster> ─► EmbeddedProvider ─┐
//!  PostgresUrlProvider::connect(url) ─────────────────────────────────────────────────────┤
//!  (Lakebase REST backend, module lakebase_api) ──────────────────────────────────────────┤
//!                                                                                          ▼
//!                                                              Arc<dyn BranchProvider>
//!                                                                        │
//!           BaseSpec (migrations + fixtures) ──► BranchPool (warm branches, Lease) ◄─┘
//!                                                        │
//!           Arc<dyn TestRunner> (PsqlRunner | CommandRunner) ──► Verifier ──► TestRunReceipt
//!                                                        │
//!                              LakebaseActor (ractor; serves LakebaseMsg::{Verify, Promote})
//! ```
//!
//! * [`BranchProvider`]: one async, object-safe trait per backend: bases ("golden"
//!   templates keyed by [`BaseSpec::key`]), branches that accept logins when `create` returns,
//!   [`ConnectInfo`] with a redacted [`Secret`], delete, list, sweep, promote.
//! * [`EmbeddedPostgres`] / [`EmbeddedCluster`] / [`EmbeddedProvider`]: the default backend, a
//!   private PostgreSQL cluster (`initdb` + `postgres` as the `postgres` user when root, fast
//!   test settings, owner watchdog so no server outlives this process). See [`embedded`].
//! * [`PostgresUrlProvider`]: the same template branching inside an existing server
//!   (`CONSORT_DATABASE_URL`). See [`url`]. Both are names of one type, [`ServerProvider`]
//!   (see [`pgbranch`]); only their constructors differ.
//! * [`BranchPool`]: N ready branches of the current base, [`Lease`]s that delete their
//!   branch on release, invalidation on a new base, orphan sweeps at start and shutdown.
//! * [`migrate`]: ordered migrations, each in its own transaction, recorded with their
//!   checksum in `consort_migrations`.
//! * [`runner`]: [`PsqlRunner`] and [`CommandRunner`] (scrubbed environment with only the
//!   branch's credentials, process-group time limit, output cap, JUnit/TAP outcomes).
//! * [`Verifier`]: acquire → run → receipt → release; and promote.
//! * [`LakebaseActor`]: the ractor actor the conductor talks to, spawned with
//!   [`LakebaseActor::spawn`]`(`[`LakebaseArgs`]`)`.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use consort_lakebase::*;
//!
//! let cluster = EmbeddedPostgres::start(EmbeddedConfig::temporary()).await?;
//! let provider: Arc<dyn BranchProvider> = Arc::new(EmbeddedProvider::new(cluster).await?);
//! let runner: Arc<dyn TestRunner> = Arc::new(PsqlRunner::new(PsqlRunnerConfig::default())?);
//! let (lakebase, _join) = LakebaseActor::spawn(LakebaseArgs::new(provider, runner)).await?;
//! // lakebase.call(|port| consort_actors::LakebaseMsg::Verify(request, port), None).await?
//! # drop(lakebase); Ok(()) }
//! ```

mod actor;
mod embedded;
mod error;
pub mod lakebase_api;
pub mod migrate;
pub mod names;
mod pgbin;
mod pgbranch;
mod pgconn;
mod pool;
pub mod procinfo;
mod provider;
mod runner;
mod scram;
mod url;
mod verify;

// One path per item: the namespaces above (the Lakebase REST backend, migrations, branch names,
// process inspection), everything else here at the root.
pub use actor::{LakebaseActor, LakebaseArgs, LakebaseState};
pub use embedded::{
    EmbeddedCluster, EmbeddedConfig, EmbeddedPostgres, EmbeddedProvider, RunAs, fallback_dir,
};
pub use error::{Error, Result, ServerText};
pub use pgbin::{PgBinaries, find_psql};
pub use pgbranch::{ServerOptions, ServerProvider, TEMPLATE_PREFIX};
pub use pgconn::connect;
pub use pool::{Acquired, BranchPool, Lease, PoolConfig, PoolStats, PoolStatsSnapshot, Released};
pub use provider::{
    BaseRef, BaseSpec, BoxFuture, Branch, BranchProvider, Capabilities, ConnectInfo,
    PromoteOutcome, Secret, SslMode,
};
pub use runner::{
    Capture, Captured, CommandRunner, CommandRunnerConfig, DEFAULT_ENV_ALLOW, EnvPolicy, Jail,
    JailSpec, OutputLimits, PINNED, PsqlRunner, PsqlRunnerConfig, RunContext, RunReport,
    SandboxMode, SandboxSupport, Scratch, SessionSettings, TestRunner, parse_junit, parse_tap,
    shell_quote,
};
pub use url::{DATABASE_URL_ENV, PostgresUrlProvider};
pub use verify::Verifier;
