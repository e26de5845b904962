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
//!   test settings, owner watchdog so no server outlives this process).
//! * [`PostgresUrlProvider`]: the same template branching inside an existing server
//!   (`CONSORT_DATABASE_URL`). Both are names of one type, [`ServerProvider`]; only their
//!   constructors differ.
//! * [`lakebase_api`]: the Lakebase Autoscaling REST backend.
//! * [`BranchPool`]: N ready branches of the current base, [`Lease`]s that delete their
//!   branch on release, invalidation on a new base, orphan sweeps at start and shutdown.
//! * [`migrate`]: ordered migrations, each in its own transaction, recorded with their
//!   checksum in `consort_migrations`.
//! * [`PsqlRunner`] and [`CommandRunner`] ([`TestRunner`]s: scrubbed environment with only the
//!   branch's credentials, confined processes, process-group time limit, output cap,
//!   JUnit/TAP outcomes).
//! * [`Verifier`]: acquire → run → receipt → release; and promote.
//! * [`LakebaseActor`]: the ractor actor the conductor talks to, spawned with
//!   [`LakebaseActor::spawn`]`(`[`LakebaseArgs`]`)`.
//!
//! # Example
//!
//! A private cluster, a base with one migration, and a branch of it that already holds the
//! table (this starts a real PostgreSQL server from the binaries on `PATH`):
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use consort_actors::Migration;
//! use consort_lakebase::{
//!     BaseSpec, BranchProvider, EmbeddedConfig, EmbeddedPostgres, EmbeddedProvider, connect,
//! };
//!
//! let cluster = EmbeddedPostgres::start(EmbeddedConfig::temporary()).await?;
//! let provider = EmbeddedProvider::new(cluster.clone()).await?;
//! let spec = BaseSpec {
//!     migrations: vec![Migration {
//!         version: "0001_stock".into(),
//!         story_id: "S1".into(),
//!         description: "stock levels".into(),
//!         sql: "CREATE TABLE stock (sku text PRIMARY KEY, on_hand int NOT NULL);".into(),
//!     }],
//!     fixtures: vec!["INSERT INTO stock VALUES ('A-1', 3);".into()],
//!     promoted: Vec::new(),
//! };
//! let base = provider.prepare_base(&spec).await?;
//! let branch = provider.create("consort-doc-example", &base).await?;
//!
//! let client = connect(&provider.connect_info(&branch).await?).await?;
//! let row = client.query_one("SELECT on_hand FROM stock WHERE sku = 'A-1'", &[]).await?;
//! assert_eq!(row.get::<_, i32>(0), 3);
//!
//! drop(client);
//! provider.delete(&branch.name).await?;
//! cluster.stop()?;
//! # Ok(()) }
//! ```

// The library holds no function over 100 lines (clippy.toml sets the threshold).
#![warn(clippy::too_many_lines)]

mod actor;
mod branch_env;
mod embedded;
mod error;
pub mod lakebase_api;
pub mod migrate;
pub mod names;
mod pgbin;
mod pgbranch;
mod pgconn;
mod pgfetch;
mod pool;
pub mod procinfo;
mod provider;
mod runner;
mod schema_catalog;
mod scram;
pub mod store;
mod tls;
mod url;
mod verify;

// One path per item: the namespaces above (the Lakebase REST backend, migrations, branch names,
// process inspection, the shared store), everything else here at the root.
pub use actor::{LakebaseActor, LakebaseArgs, LakebaseState};
pub use branch_env::BranchEnv;
pub use embedded::{
    EmbeddedCluster, EmbeddedConfig, EmbeddedPostgres, EmbeddedProvider, PlacedCluster, Placement,
    RunAs, fallback_dir, placed_clusters, remove_orphan,
};
pub use error::{
    CaFileError, ClusterError, ConfigError, Error, PsqlFault, Refusal, Result, ServerText,
    TestCommandFault,
};
pub use pgbin::{OLDEST_MAJOR, PgBinaries, PostgresSource, ServerChoice, find_psql};
pub use pgbranch::{ParentPrivilege, ServerOptions, ServerProvider, TEMPLATE_PREFIX};
pub use pgconn::connect;
pub use pgfetch::{
    AARCH64_LINUX, FetchPolicy, PROGRESS_TARGET, PinnedServer, ServerCache, X86_64_LINUX,
    pinned_for_this_machine,
};
pub use pool::{Acquired, BranchPool, Lease, PoolConfig, PoolStats, PoolStatsSnapshot, Released};
pub use provider::{
    BRANCH_ENV, BaseRef, BaseSpec, BoxFuture, Branch, BranchProvider, Capabilities, ConnectInfo,
    ParentLogin, PromoteOutcome, Secret, SslMode,
};
pub use runner::{
    Capture, Captured, CommandRunner, CommandRunnerConfig, DEFAULT_ENV_ALLOW, EnvPolicy,
    JEST_FILE_CLASSNAME, Jail, JailSpec, NON_INTERACTIVE, OutputLimits, PINNED, PROJECT_PYTHON,
    PsqlRunner, PsqlRunnerConfig, RunContext, RunReport, SandboxMode, SandboxSupport, Scratch,
    Selector, SessionSettings, StdoutFormat, Suite, SuiteTest, TestRunner, parse_go_test_json,
    parse_junit, parse_libtest, parse_tap, python_lacks, python_lacks_advice, shell_quote,
    sweep_abandoned_scratch, unused_project_python,
};
pub use schema_catalog::read_catalog;
pub use url::{DATABASE_URL_ENV, PostgresUrlProvider, connect_info_of_url};
pub use verify::{Shards, Verifier};
