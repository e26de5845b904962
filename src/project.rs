//! A Consort project on disk: `consort.toml`, the feature request, `.consort/` (the ledger, the
//! frozen design, the embedded cluster), and the work tree around them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use consort_actors::{
    Approver, FeatureRequest, GateKind, Machine, Phase, Role, RunStatus, State, TestRunReceipt,
    TestStatus,
};
use consort_agents::AgentConfig;
use consort_lakebase::{
    BranchProvider, CommandRunner, CommandRunnerConfig, EmbeddedConfig, EmbeddedPostgres,
    EmbeddedProvider, PostgresUrlProvider, PsqlRunner, PsqlRunnerConfig, Secret, ServerOptions,
    TestRunner,
};
use serde::Serialize;

use crate::backlog::{BacklogError, Feature, FeatureState};
use crate::config::{ConfigError, ProjectConfig, ProviderConfig, RunnerConfig};
use crate::ensemble::EnsembleError;
use crate::runlock::{LockScope, RunLock, RunLockError};

mod assembly;
mod git_sync;
mod trial;
mod unverified;

pub use unverified::{Difference, UnverifiedWork};
pub(crate) mod lane;
pub use git_sync::LiveSync;
pub use trial::{BaselineRun, ToolTrial, TrialRun};

/// Why a project could not be opened or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProjectError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The feature request could not be read.
    #[error("feature request {path}: {detail}")]
    Feature {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// An agent backend could not be built.
    #[error("agent for {role}")]
    Agent {
        /// The role.
        role: Role,
        /// Why.
        #[source]
        source: consort_agents::Error,
    },
    /// The database side failed.
    #[error("database")]
    Database(#[from] consort_lakebase::Error),
    /// The work tree could not be read.
    #[error(transparent)]
    WorkTree(#[from] consort_actors::WorkTreeError),
    /// The Lakebase backend could not be configured; why is the source.
    #[error("lakebase")]
    Lakebase(#[source] consort_lakebase::lakebase_api::ApiError),
    /// A required environment variable is missing.
    #[error("environment variable {0} is not set")]
    MissingEnv(String),
    /// An environment variable holds a value Consort cannot use.
    #[error("environment variable {var} is \"{value}\": it must be {expected}")]
    BadEnv {
        /// The variable.
        var: String,
        /// What it holds.
        value: String,
        /// What it must hold.
        expected: &'static str,
    },
    /// The ensemble failed.
    #[error(transparent)]
    Ensemble(#[from] EnsembleError),
    /// The ledger failed.
    #[error(transparent)]
    Conductor(#[from] consort_actors::ConductorError),
    /// Another process drives the project, or its run lock is unusable.
    #[error(transparent)]
    RunLock(#[from] RunLockError),
    /// The project's git repository refused the run, or a commit could not be made.
    #[error("git")]
    Git(#[from] crate::git::GitError),
    /// The backlog is unusable, or names no such feature.
    #[error(transparent)]
    Backlog(#[from] BacklogError),
    /// A lane could not be made, found or removed.
    #[error(transparent)]
    Lanes(#[from] lane::LaneError),
    /// The project's records (its files or its shared store).
    #[error(transparent)]
    Records(#[from] crate::records::RecordsError),
    /// A later feature cannot start while an earlier one is unfinished: it builds on the
    /// earlier one's tests and migrations.
    #[error(
        "feature {feature} is {state}; finish it (or stop it with `consort stop`) before {later} starts"
    )]
    EarlierUnfinished {
        /// The earlier feature.
        feature: String,
        /// Where it stands.
        state: FeatureState,
        /// The feature that would start.
        later: String,
    },
    /// An earlier feature's tests are not in the work tree: its work was not merged into the
    /// commit this feature would start from.
    #[error(
        "feature {feature}'s tests are not in the work tree ({}); merge its branch {branch} (or check out a commit that holds it) before the next feature starts",
        missing.join(", ")
    )]
    EarlierWorkMissing {
        /// The earlier feature.
        feature: String,
        /// Its git branch.
        branch: String,
        /// Its test files that are missing.
        missing: Vec<String>,
    },
    /// The run was ended by a signal; it was stopped like a crash (the ledger as it stood, the
    /// database server shut down) and resumes with `consort run`.
    #[error("interrupted by {0}")]
    Interrupted(Interruption),
    /// The signal handlers a run listens on could not be installed.
    #[error("cannot listen for {signal}")]
    Signals {
        /// The signal.
        signal: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl ProjectError {
    /// Whether the error is the person's at the command line: the configuration, a missing or
    /// title-less feature request, a feature id that is not the backlog's (exit 2).
    pub fn is_usage(&self) -> bool {
        match self {
            ProjectError::Config(_) | ProjectError::Feature { .. } => true,
            ProjectError::Backlog(b) => b.is_usage(),
            ProjectError::Records(r) => r.is_usage(),
            _ => false,
        }
    }
}

/// How to drive a project.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Who decides gates while the run is live (default: nobody; the run stops at each gate).
    pub approver: Option<Arc<dyn Approver>>,
    /// Use this backend for every role instead of the configured ones.
    pub agents_override: Option<AgentConfig>,
    /// Agents of the embedder's own for some roles (see [`RunOptions::with_agent`]); every
    /// other role is played as configured (or by `agents_override`).
    pub agents: std::collections::HashMap<consort_actors::Role, Arc<dyn consort_agents::Agent>>,
    /// Told of every durable ledger append; it may stop the conductor right after one (see
    /// [`AppendObserver`](consort_actors::AppendObserver)).
    pub append_observer: Option<Arc<dyn consort_actors::AppendObserver>>,
    /// How the run lock names this run to a refused second one (default: this program's file
    /// name).
    pub command: Option<String>,
    /// The budgets to use when `consort.toml` sets none (`--agents openai` sets its defaults).
    pub default_budgets: Option<consort_actors::Budgets>,
    /// Start a new run in a git repository with uncommitted changes (Consort's commits hold
    /// only its own changes).
    pub allow_dirty: bool,
    /// The branch provider to use instead of starting the configured one: lanes share one.
    pub provider: Option<Arc<dyn BranchProvider>>,
    /// How many runs share the provider at once (0 and 1: this one alone): each gets its
    /// share of the warm pool and of the concurrent runs `[pool]` sets, at least one.
    pub sharing: usize,
    /// How the promotion is made instead of directly: a lane's merge check.
    pub promotion: Option<Arc<dyn crate::ensemble::Promotion>>,
    /// Where the run's events are kept instead of where `[store]` says (a lane's driver opens
    /// its feature's ledger under the lease it took).
    pub event_log: Option<consort_actors::EventLogOpener>,
    /// Who runs it (`--approve-as`), named in what the run records as a person's decision (a
    /// changed harness); default: the user.
    pub person: Option<String>,
}

impl RunOptions {
    /// Plays `role` with `agent`, an agent of your own, while the project's other roles stay
    /// as `consort.toml` configures them. The run is the project's in every other way: its
    /// records, git commits, migration files, lanes and store.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use consort::agents::{AgentFailure, AgentOutput, Assignment, AsyncAgent, Role};
    /// use consort::project::{Project, RunOptions};
    ///
    /// struct MyDriver;
    /// impl AsyncAgent for MyDriver {
    ///     async fn act(&self, a: &Assignment) -> Result<AgentOutput, AgentFailure> {
    ///         todo!("answer {}", a.step)
    ///     }
    /// }
    ///
    /// let project = Project::open("my-project")?;
    /// let ensemble = project
    ///     .ensemble(RunOptions::default().with_agent(Role::Driver, MyDriver))
    ///     .await?;
    /// let report = ensemble.run().await;
    /// ensemble.shutdown().await;
    /// println!("{}", report?.outcome);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_agent(
        mut self,
        role: consort_actors::Role,
        agent: impl consort_agents::Agent,
    ) -> Self {
        self.agents.insert(role, Arc::new(agent));
        self
    }
}

impl std::fmt::Debug for RunOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut own: Vec<String> = self.agents.keys().map(ToString::to_string).collect();
        own.sort();
        f.debug_struct("RunOptions")
            .field("agents_override", &self.agents_override)
            .field("agents", &own)
            .field("command", &self.command)
            .finish_non_exhaustive()
    }
}

/// A project directory with its configuration, and the feature of its backlog it is about.
#[derive(Debug, Clone)]
pub struct Project {
    /// The project root: `consort.toml`, the records in `.consort/`, and the work tree of a
    /// feature that runs in no lane.
    pub dir: PathBuf,
    /// Its `consort.toml`.
    pub config: ProjectConfig,
    /// Where its records are kept (`[store]`).
    records: crate::records::Records,
    /// The feature this handle reads and drives.
    feature: Feature,
    /// Where the feature's code is: its lane's worktree while it has one (see
    /// [`crate::lanes`]), else `dir`.
    work_tree: PathBuf,
    /// The feature's lease in the shared store, while this handle drives it.
    lease: Option<consort_lakebase::store::Lease>,
}

impl Project {
    /// Opens the project at `dir` (reads and checks `consort.toml`), about its current
    /// feature: the first of the backlog that is neither done nor stopped, or the last one
    /// when all are.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, ProjectError> {
        Self::open_feature(dir, None)
    }

    /// Opens the project at `dir` about the feature `id` (None: the current one, see
    /// [`Project::open`]).
    pub fn open_feature(dir: impl Into<PathBuf>, id: Option<&str>) -> Result<Self, ProjectError> {
        // Absolute: a lane's conductor, its git commands and its test runs work from the lane's
        // worktree, where a path relative to here would name another place.
        let dir = dir.into();
        let dir = std::path::absolute(&dir).map_err(|source| ConfigError::Read {
            path: dir.clone(),
            source,
        })?;
        let config = ProjectConfig::load(&dir)?;
        let records = crate::records::Records::open(&dir, &config)?;
        let features = records.backlog(&config)?;
        let mut project = Project {
            feature: features[0].clone(),
            work_tree: dir.clone(),
            dir,
            config,
            records,
            lease: None,
        };
        project.feature = match id {
            Some(id) => features
                .into_iter()
                .find(|f| f.id == id)
                .ok_or_else(|| BacklogError::Unknown { id: id.to_string() })?,
            None => project.current(features)?,
        };
        if let Some(lane) = lane::work_tree_of(&project.dir, &project.feature.id) {
            project.work_tree = lane;
        }
        Ok(project)
    }

    /// The first unfinished feature, or the last.
    fn current(&self, features: Vec<Feature>) -> Result<Feature, ProjectError> {
        let mut last = None;
        for f in features {
            if self.state_of(&f)?.is_unfinished() {
                return Ok(f);
            }
            last = Some(f);
        }
        last.ok_or_else(|| {
            ProjectError::from(BacklogError::Unknown {
                id: self.config.feature.id.clone(),
            })
        })
    }

    /// Where the feature's code is: its lane's worktree while it runs in one, else
    /// [`Project::dir`].
    pub fn work_tree(&self) -> &Path {
        &self.work_tree
    }

    /// Whether the feature runs in a lane of its own (a git worktree under `.consort/lanes/`).
    pub fn in_lane(&self) -> bool {
        self.work_tree != self.dir
    }

    /// The feature this handle is about.
    pub fn feature_entry(&self) -> &Feature {
        &self.feature
    }

    /// The id of the feature this handle is about.
    pub fn feature_id(&self) -> &str {
        &self.feature.id
    }

    /// The backlog, in order (`consort.toml`'s feature first).
    pub fn backlog(&self) -> Result<Vec<Feature>, ProjectError> {
        Ok(self.records.backlog(&self.config)?)
    }

    /// Where the project's records are kept.
    pub fn records(&self) -> &crate::records::Records {
        &self.records
    }

    /// This handle's project about another feature of its backlog (its records shared).
    pub fn about(&self, id: &str) -> Result<Project, ProjectError> {
        let feature = self
            .backlog()?
            .into_iter()
            .find(|f| f.id == id)
            .ok_or_else(|| BacklogError::Unknown { id: id.to_string() })?;
        let work_tree =
            lane::work_tree_of(&self.dir, &feature.id).unwrap_or_else(|| self.dir.clone());
        Ok(Project {
            feature,
            work_tree,
            lease: None,
            ..self.clone()
        })
    }

    /// This handle, driving its feature under `lease` (taken from the shared store).
    pub(crate) fn with_lease(mut self, lease: consort_lakebase::store::Lease) -> Project {
        self.lease = Some(lease);
        self
    }

    /// Whether this handle still drives its feature: with the shared store, whether its lease
    /// is still its own (renewed by the asking); always without one. Asked before anything
    /// that leaves the process and no store can fence, such as a push.
    pub fn still_holds(&self) -> bool {
        let (Some(lease), Some(store), Some(ttl)) =
            (&self.lease, self.records.store(), self.records.lease_time())
        else {
            return true;
        };
        store.renew(lease, ttl).unwrap_or_else(|e| {
            tracing::warn!(error = %consort_actors::error_chain(&e), "could not ask the store whether this process still holds the feature");
            false
        })
    }

    /// Where a feature of the backlog stands, from its ledger.
    pub fn state_of(&self, feature: &Feature) -> Result<FeatureState, ProjectError> {
        let end = self.records.heads(std::slice::from_ref(feature))?.pop();
        self.indexed_state(feature, end.flatten())
    }

    /// Where each of `features` stands, in their order: read from the index of states kept
    /// beside the chains, and replayed from a feature's whole ledger only when its chain
    /// moved since (see `records/state_index.rs`). What a scheduler asks at every look.
    pub fn states_of(&self, features: &[Feature]) -> Result<Vec<FeatureState>, ProjectError> {
        let heads = self.records.heads(features)?;
        features
            .iter()
            .zip(heads)
            .map(|(feature, head)| self.indexed_state(feature, head))
            .collect()
    }

    /// The state of `feature` whose chain ends at `end` (None: no entry yet).
    fn indexed_state(
        &self,
        feature: &Feature,
        end: Option<String>,
    ) -> Result<FeatureState, ProjectError> {
        let Some(end) = end else {
            return Ok(FeatureState::Waiting);
        };
        let head = crate::records::ChainHead {
            end,
            in_lane: lane::ran_in_a_lane(&self.dir, feature),
        };
        let index = self.records.index();
        if let Some(state) = index.get(&feature.id, &head) {
            return Ok(state);
        }
        let state = FeatureState::of(self.replay(feature)?.as_ref());
        index.put(&feature.id, head, state);
        Ok(state)
    }

    /// The features of the backlog that are done, so promoted, in order: what keys a base
    /// copied from the parent alone ([`consort_lakebase::BaseSpec::promoted`]).
    pub fn promoted_features(&self) -> Result<Vec<String>, ProjectError> {
        let mut done = Vec::new();
        for feature in self.backlog()? {
            if FeatureState::of(self.replay(&feature)?.as_ref()) == FeatureState::Done {
                done.push(feature.id);
            }
        }
        Ok(done)
    }

    /// The state a feature's ledger replays to (None: it has no entry yet).
    fn replay(&self, feature: &Feature) -> Result<Option<State>, ProjectError> {
        let entries = self.records.entries(feature)?;
        if entries.is_empty() {
            return Ok(None);
        }
        let machine = self.machine_of(feature)?;
        Ok(Some(machine.replay(entries.iter().map(|e| &e.event))))
    }

    /// The ledger file (with the file store; the shared store keeps it as rows).
    pub fn ledger_path(&self) -> PathBuf {
        self.dir.join(self.feature.ledger())
    }

    /// The feature's ledger entries, each checked, in order; none before its first run.
    pub fn entries(
        &self,
    ) -> Result<Vec<consort_actors::Entry<consort_actors::Event>>, ProjectError> {
        Ok(self.records.entries(&self.feature)?)
    }

    /// The feature's ledger events, in order; none before its first run.
    pub fn events(&self) -> Result<Vec<consort_actors::Event>, ProjectError> {
        Ok(self.entries()?.into_iter().map(|e| e.event).collect())
    }

    /// Whether the feature's run has begun (its ledger has an entry).
    pub fn has_started(&self) -> Result<bool, ProjectError> {
        Ok(!self.records.is_fresh(&self.feature)?)
    }

    /// With the shared store, a clone that lacks the frozen design file (another machine
    /// froze the design) gets it written from the ledger, whose replay holds the design the
    /// approval's hash covers; a file that is here is left as it is, for the machine to judge.
    pub fn restore_design(&self) -> Result<(), ProjectError> {
        let path = self.design_path();
        if self.records.store().is_none() || path.exists() {
            return Ok(());
        }
        let state = self.state()?;
        let (Some(_), Some(bundle)) = (&state.frozen, state.design_bundle()) else {
            return Ok(());
        };
        let failed = |source| crate::records::RecordsError::File {
            path: path.clone(),
            source,
        };
        let text =
            serde_json::to_string_pretty(&bundle).map_err(|e| failed(std::io::Error::other(e)))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(failed)?;
        }
        Ok(std::fs::write(&path, text).map_err(failed)?)
    }

    /// The feature's ledger opened for a person's decision; with the shared store its appends
    /// carry this handle's lease when it drives the feature (else they end the driver's lease).
    pub fn open_log(&self) -> Result<Box<dyn consort_actors::EventLog>, ProjectError> {
        Ok(self.records.open_log(&self.feature, self.lease.clone())?)
    }

    /// Records a person's decision with `record`, which judges it on the ledger it is given
    /// and appends it when the machine accepts it there. With the shared store, a ledger that
    /// moved on meanwhile (a worker appended after it was read) refuses the append; it is
    /// then read again and the decision judged anew, up to five times. The outer error: the
    /// ledger could not be opened; the inner result: the decision's own.
    pub fn record_judged(
        &self,
        mut record: impl FnMut(
            &mut dyn consort_actors::EventLog,
            &consort_actors::Machine,
        ) -> Result<(), consort_actors::ConductorError>,
    ) -> Result<Result<(), consort_actors::ConductorError>, ProjectError> {
        const ATTEMPTS: usize = 5;
        let machine = self.machine()?;
        let mut attempt = 1;
        loop {
            match record(&mut *self.open_log()?, &machine) {
                Err(consort_actors::ConductorError::MovedOn(moved)) if attempt < ATTEMPTS => {
                    tracing::info!(feature = %self.feature.id, seen = moved.seen, now = moved.now, "the ledger moved on while the decision was judged; judging it again");
                    attempt += 1;
                }
                done => return Ok(done),
            }
        }
    }

    /// The frozen design file.
    pub fn design_path(&self) -> PathBuf {
        self.dir.join(self.feature.design_file())
    }

    /// Where the agents' per-step transcripts are kept: an external command's run (stderr
    /// included, whether it succeeded or not) and an OpenAI model's tool calls with their
    /// results.
    pub fn transcript_dir(&self) -> PathBuf {
        self.dir.join(self.feature.transcript_dir())
    }

    /// The mailbox where the roles played through `consort mcp` park their assignments.
    pub fn mailbox(&self) -> consort_agents::mcp::Mailbox {
        consort_agents::mcp::Mailbox::new(self.dir.join(self.feature.mailbox_dir()))
    }

    /// The state machine with this project's bounds and path rules. A feature that runs (or
    /// ran) in a lane names its migration files with its id (see
    /// [`MigrationFiles::lane`](consort_actors::MigrationFiles::lane)).
    pub fn machine(&self) -> Result<Machine, ProjectError> {
        self.machine_of(&self.feature)
    }

    /// The state machine a feature of the backlog runs with: [`Project::machine`] for it.
    fn machine_of(&self, feature: &Feature) -> Result<Machine, ProjectError> {
        let mut cfg = self
            .config
            .machine_config()
            .map_err(|e| ConfigError::Invalid {
                path: self.dir.join(crate::config::CONFIG_FILE),
                key: "paths".into(),
                message: e.to_string(),
            })?;
        if let Some(files) = &mut cfg.migration_files
            && lane::ran_in_a_lane(&self.dir, feature)
        {
            files.lane = Some(feature.id.clone());
        }
        Ok(Machine::new(cfg))
    }

    /// The run's state as the ledger records it (idle when there is no entry yet).
    pub fn state(&self) -> Result<State, ProjectError> {
        Ok(self.replay(&self.feature)?.unwrap_or_default())
    }

    /// Reads the feature request: its first `# ` line is the title, the whole file the body.
    pub fn feature(&self) -> Result<FeatureRequest, ProjectError> {
        let path = self.dir.join(&self.feature.request);
        let body = std::fs::read_to_string(&path).map_err(|e| ProjectError::Feature {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        let title = crate::backlog::title_of(&body).ok_or_else(|| ProjectError::Feature {
            path: path.clone(),
            detail: "needs a `# Title` line".into(),
        })?;
        Ok(FeatureRequest {
            id: self.feature.id.clone(),
            title: title.to_string(),
            body,
        })
    }

    /// What the features before this one leave to it: the tests they accepted (less those a
    /// later one retired) and the migrations they promoted. Refused while an earlier feature
    /// is unfinished, and when an earlier feature's tests are not in the work tree.
    pub fn inherited(&self) -> Result<consort_actors::Inherited, ProjectError> {
        let mut inherited = consort_actors::Inherited::default();
        for earlier in self.backlog()? {
            if earlier.id == self.feature.id {
                break;
            }
            let Some(state) = self.replay(&earlier)? else {
                if self.in_lane() {
                    continue;
                }
                return Err(self.unfinished(&earlier, FeatureState::Waiting));
            };
            match FeatureState::of(Some(&state)) {
                FeatureState::Done => {}
                FeatureState::Stopped => continue,
                // A lane does not wait for the features before it: they meet in its merge
                // check.
                _ if self.in_lane() => continue,
                other => return Err(self.unfinished(&earlier, other)),
            }
            let machine = self.machine_of(&earlier)?;
            let files = machine.config().migration_files.as_ref();
            crate::backlog::inherit(&mut inherited, &earlier.id, &state, files);
        }
        self.check_inherited_in_tree(&inherited)?;
        // Mixed widths (which doctor names) leave the design's versions free, as before.
        inherited.numbering = self.migration_numbering().ok().flatten();
        Ok(inherited)
    }

    /// How the files in `[migrations] dir` are numbered (see
    /// [`consort_actors::MigrationNumbering::of`]): None when the directory is missing or
    /// holds no numbered file; an error saying why when a text sort cannot order them.
    pub fn migration_numbering(
        &self,
    ) -> Result<Option<consort_actors::MigrationNumbering>, String> {
        let tool = self.config.migrations.tool_format();
        // Alembic orders its files by the revisions they declare, never by name.
        if tool
            .as_ref()
            .is_some_and(|t| t.recorded == consort_actors::Recorded::Revision)
        {
            return Ok(None);
        }
        let extension = format!(".{}", tool.map_or("sql".into(), |t| t.extension));
        let dir = self.work_tree.join(&self.config.migrations.dir);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(None);
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.ends_with(&extension) && !n.ends_with(".down.sql"))
            .collect();
        names.sort();
        consort_actors::MigrationNumbering::of(&names)
    }

    fn unfinished(&self, earlier: &Feature, state: FeatureState) -> ProjectError {
        ProjectError::EarlierUnfinished {
            feature: earlier.id.clone(),
            state,
            later: self.feature.id.clone(),
        }
    }

    /// Every inherited test's file must be in the work tree.
    fn check_inherited_in_tree(
        &self,
        inherited: &consort_actors::Inherited,
    ) -> Result<(), ProjectError> {
        let mut missing: Vec<&consort_actors::EarlierTest> = inherited
            .tests
            .iter()
            .filter(|t| !self.work_tree.join(&t.path).is_file())
            .collect();
        missing.dedup_by(|a, b| a.path == b.path);
        match missing.first() {
            None => Ok(()),
            Some(first) => Err(ProjectError::EarlierWorkMissing {
                feature: first.feature.clone(),
                branch: crate::git::branch_name(&first.feature),
                missing: missing.iter().map(|t| t.path.clone()).collect(),
            }),
        }
    }

    /// The branch provider the configuration names.
    pub async fn provider(&self) -> Result<Arc<dyn BranchProvider>, ProjectError> {
        Ok(match &self.config.database {
            ProviderConfig::Embedded {
                data_dir,
                run_as,
                postgres,
                branches_in_memory,
            } => {
                let mut cfg = EmbeddedConfig::at(self.dir.join(data_dir));
                cfg.run_as = run_as.clone();
                cfg.branches_in_memory = *branches_in_memory;
                cfg.postgres = postgres.relative_to(&self.dir);
                let cluster = EmbeddedPostgres::start(cfg).await?;
                Arc::new(EmbeddedProvider::new(cluster).await?)
            }
            ProviderConfig::Url { url_env } => {
                let url = std::env::var(url_env)
                    .map_err(|_| ProjectError::MissingEnv(url_env.clone()))?;
                Arc::new(
                    PostgresUrlProvider::connect(&Secret::new(url), ServerOptions::default())
                        .await?,
                )
            }
            ProviderConfig::Lakebase(settings) => crate::lakebase_provider(&self.dir, settings)?,
        })
    }

    /// The branch under the project's own names (`[branch_env]`), for its test command and
    /// `consort exec`.
    pub fn branch_env(&self) -> Result<consort_lakebase::BranchEnv, ProjectError> {
        self.config.branch_env().map_err(|message| {
            ProjectError::Config(ConfigError::Invalid {
                path: self.dir.join(crate::config::CONFIG_FILE),
                key: "branch_env".into(),
                message,
            })
        })
    }

    /// The `psql` of the PostgreSQL the project's embedded cluster runs (Consort's own bundle
    /// when it fetched one), when it comes with one; `None`: the psql runner looks on `PATH`.
    fn server_psql(&self) -> Option<std::path::PathBuf> {
        let ProviderConfig::Embedded { postgres, .. } = &self.config.database else {
            return None;
        };
        postgres.relative_to(&self.dir).choice().ok()?.psql()
    }

    /// The environment the project's commands get (its test command, its migration tool):
    /// the default allow-list with `[runner] pass_env`, `[runner] env_set`, and the branch
    /// under the project's own names.
    fn command_env(&self) -> Result<consort_lakebase::EnvPolicy, ProjectError> {
        let mut env = consort_lakebase::EnvPolicy {
            branch: self.branch_env()?,
            ..consort_lakebase::EnvPolicy::default()
        };
        if let RunnerConfig::Command {
            pass_env, env_set, ..
        } = &self.config.runner
        {
            env.set
                .extend(env_set.iter().map(|(k, v)| (k.clone(), v.clone())));
            env.allow.extend(pass_env.iter().cloned());
        }
        Ok(env)
    }

    /// The project's own migration tool (`[migrations] tool`), when it applies the
    /// migrations; None for plain SQL, which Consort applies.
    pub fn migration_tool(
        &self,
    ) -> Result<Option<consort_lakebase::migrate::MigrationTool>, ProjectError> {
        self.config
            .migrations
            .migration_tool(self.command_env()?)
            .map_err(|message| {
                ProjectError::Config(ConfigError::Invalid {
                    path: self.dir.join(crate::config::CONFIG_FILE),
                    key: "migrations.tool".into(),
                    message,
                })
            })
    }

    /// The test runner the configuration names.
    pub fn runner(&self) -> Result<Arc<dyn TestRunner>, ProjectError> {
        Ok(match &self.config.runner {
            RunnerConfig::Psql {
                setup,
                tests,
                timeout_secs,
                ..
            } => Arc::new(PsqlRunner::new(PsqlRunnerConfig {
                psql: self.server_psql(),
                setup_globs: setup.clone(),
                test_globs: tests.clone(),
                timeout_per_file: Duration::from_secs(*timeout_secs),
                ..PsqlRunnerConfig::default()
            })?),
            RunnerConfig::Command {
                command,
                junit,
                tap,
                stdout,
                single_test,
                timeout_secs,
                ..
            } => {
                let mut cfg = CommandRunnerConfig::new(command.clone());
                cfg.env = self.command_env()?;
                cfg.junit_path = junit.clone();
                cfg.tap = *tap;
                cfg.stdout_format = *stdout;
                cfg.single_test_command = single_test.clone();
                cfg.timeout = Duration::from_secs(*timeout_secs);
                cfg.view = crate::config::runner_facts::runs_in_a_view(&self.config);
                cfg.select = crate::config::runner_facts::selector(&self.config);
                Arc::new(CommandRunner::new(cfg))
            }
        })
    }

    /// The budgets a run with `opts` gets: `consort.toml`'s, or `opts.default_budgets` when it
    /// sets none (its price table kept).
    pub fn budgets(&self, opts: &RunOptions) -> Result<consort_actors::Budgets, ProjectError> {
        let configured =
            self.config
                .budgets(opts.agents_override.as_ref())
                .map_err(|e| match e {
                    ConfigError::Invalid { key, message, .. } => ConfigError::Invalid {
                        path: self.dir.join(crate::config::CONFIG_FILE),
                        key,
                        message,
                    },
                    other => other,
                })?;
        match &opts.default_budgets {
            Some(defaults) if configured.is_unlimited() => Ok(consort_actors::Budgets {
                prices: configured.prices,
                ..defaults.clone()
            }),
            _ => Ok(configured),
        }
    }

    /// Takes the project's run lock for `command` (see [`RunLock`]): refused, before anything
    /// is written, while another process drives the project or writes its ledger.
    pub fn lock(&self, command: &str) -> Result<RunLock, ProjectError> {
        Ok(RunLock::acquire(&self.dir, command)?)
    }

    /// Takes what a person's write to the feature's ledger (a gate decision, a retry, a
    /// retirement) needs: the project's run lock and the feature's, so neither a run in the
    /// project's tree nor a lane that drives the feature writes beside it.
    pub fn lock_ledger(&self, command: &str) -> Result<[RunLock; 2], ProjectError> {
        Ok([self.lock(command)?, self.lock_feature(command)?])
    }

    /// Takes the lock of this handle's feature for `command`: refused while another process
    /// drives the feature (in a lane or in the project's own tree).
    pub fn lock_feature(&self, command: &str) -> Result<RunLock, ProjectError> {
        Ok(RunLock::acquire_at(
            self.dir.join(self.feature.lock_file()),
            LockScope::Feature(self.feature.id.clone()),
            command,
        )?)
    }
}

impl Project {
    /// The project's git remote (`[git] remote`) in the repository of its own tree; None
    /// without one, or outside a repository.
    pub(crate) fn remote(&self) -> Option<crate::git::Remote> {
        let name = self.config.git.remote.clone()?;
        let repo = crate::git::GitRepo::detect(&self.dir)?;
        Some(crate::git::Remote::new(repo, name))
    }

    /// The git repository the feature's work tree lies in, if any.
    pub fn git(&self) -> Option<crate::git::GitRepo> {
        crate::git::GitRepo::detect(&self.work_tree)
    }

    /// Every lane of the project, in backlog order: a feature with a worktree here, or (with
    /// the shared store) one a process on any machine holds, with who holds it since when.
    pub fn lanes(&self) -> Result<Vec<LaneStatus>, ProjectError> {
        let holdings = self.records.holdings()?;
        let mut lanes = Vec::new();
        for feature in self.backlog()? {
            let work_tree = lane::work_tree_of(&self.dir, &feature.id);
            let held = holdings.iter().find(|h| h.feature == feature.id && h.live);
            let lost = holdings
                .iter()
                .find(|h| h.feature == feature.id && h.halted_for_a_person());
            if work_tree.is_none() && held.is_none() && lost.is_none() {
                continue;
            }
            let lane = self.about(&feature.id)?;
            let events = lane.events()?;
            let usage = consort_actors::usage_totals(events.iter());
            let mut s = status_of(&lane.machine()?.replay(&events), events.len(), &usage);
            if let Some(lost) = lost {
                s.halted = Some(lost_workers_halt(lost, s.step.as_deref()));
            }
            lanes.push(LaneStatus {
                branch: crate::git::branch_name(&feature.id),
                feature: feature.id,
                work_tree: work_tree.map(|w| w.display().to_string()),
                held_by: held.map(|h| h.holder.clone()),
                since: held.map(|h| h.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
                phase: s.phase,
                step: s.step,
                pending_gate: s.pending_gate,
                halted: s.halted,
                usage: s.usage.total,
                last_receipt: s.last_receipt,
            });
        }
        Ok(lanes)
    }

    /// The run's branch and its tip; None outside a git repository.
    pub fn git_tip(&self) -> Option<GitTip> {
        let repo = self.git()?;
        Some(GitTip {
            branch: crate::git::branch_name(&self.feature.id),
            head: repo.tip(&self.feature.id),
        })
    }

    /// Makes the commits the ledger calls for that the branch lacks; None outside a git
    /// repository.
    pub fn git_sync(&self) -> Result<Option<crate::git::SyncReport>, ProjectError> {
        match self.git() {
            Some(repo) => Ok(Some(git_sync::sync_project(self, &repo, false)?)),
            None => Ok(None),
        }
    }
}

/// One run's share of `total` when `sharing` runs split it: an even split rounded up, never
/// below one.
fn share(total: usize, sharing: usize) -> usize {
    total.div_ceil(sharing.max(1)).max(1)
}

/// This program's file name, the default name of a run in its lock.
fn program_name() -> String {
    std::env::args_os()
        .next()
        .as_deref()
        .map(Path::new)
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "consort".into())
}

/// The stable JSON shape of `consort status --json` (documented in the guide).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusReport {
    /// `idle`, `design`, `design-gate`, `build`, `deploy-gate`, `deploy`, `promote-gate`,
    /// `promote`, `halted`, `done` or `stopped`.
    pub phase: Phase,
    /// The pending step, when one is pending (`red/T3`, `observe`, …).
    pub step: Option<String>,
    /// The current test in the build lane.
    pub test: Option<TestPosition>,
    /// The gate waiting for a decision.
    pub pending_gate: Option<PendingGate>,
    /// Why the run halted, when it did.
    pub halted: Option<HaltInfo>,
    /// The last receipt accepted.
    pub last_receipt: Option<ReceiptSummary>,
    /// Events in the ledger.
    pub ledger_entries: usize,
    /// The run's git branch and its tip, when the project lies in a git repository (the tip
    /// at the deploy gate is the commit the release is).
    pub git: Option<GitTip>,
    /// What the run spent, from the ledger: in total and per role.
    pub usage: UsageReport,
    /// The feature reported on.
    pub feature: Option<String>,
    /// Every feature of the backlog, in order, with where it stands.
    pub features: Vec<FeatureSummary>,
    /// Every lane (a feature with a worktree of its own), in backlog order.
    pub lanes: Vec<LaneStatus>,
    /// Tests this feature's runs found flaky (green before a step, failed in it, passed when
    /// run once more on a fresh branch), each once, in the order first seen.
    pub flaky: Vec<String>,
    /// The tests that failed in the baseline, before the feature (None: no baseline ran).
    pub failing_before: Option<Vec<String>>,
    /// The tests a person quarantined: their failures judge nothing.
    pub quarantined: Vec<QuarantineInfo>,
}

/// A quarantined test, as `consort status --json` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuarantineInfo {
    /// The test, by the name the runner reports it under.
    pub test: String,
    /// Who decided.
    pub by: String,
    /// Why.
    pub reason: String,
}

/// The tests the ledger's receipts record as flaky (see
/// [`consort_actors::TestRunReceipt::flaky`]), each once, in the order first seen: refused runs
/// count too.
pub fn flaky_seen<'a>(events: impl IntoIterator<Item = &'a consort_actors::Event>) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for e in events {
        if let consort_actors::Event::VerifyCompleted { receipt } = e {
            for t in &receipt.flaky {
                if !seen.contains(t) {
                    seen.push(t.clone());
                }
            }
        }
    }
    seen
}

/// A lane, as `consort status --json` lists it: what it waits on, and on whom.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaneStatus {
    /// Its feature.
    pub feature: String,
    /// Its worktree here (None: it runs on another machine).
    pub work_tree: Option<String>,
    /// The process that drives it (with the shared store): its machine and PID.
    pub held_by: Option<String>,
    /// Since when that process drives it (RFC 3339).
    pub since: Option<String>,
    /// Its git branch.
    pub branch: String,
    /// Its phase.
    pub phase: Phase,
    /// The step it runs or waits on.
    pub step: Option<String>,
    /// The gate waiting for a person, with the hash to approve.
    pub pending_gate: Option<PendingGate>,
    /// Why it halted, when it did.
    pub halted: Option<HaltInfo>,
    /// What it spent so far.
    pub usage: consort_actors::Tally,
    /// Its last accepted receipt.
    pub last_receipt: Option<ReceiptSummary>,
}

/// A feature of the backlog, as `consort status --json` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FeatureSummary {
    /// Its id.
    pub id: String,
    /// Where it stands.
    pub state: FeatureState,
}

/// What a run spent, as `consort status --json` reports it (derived from the ledger by
/// [`consort_actors::usage_totals`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct UsageReport {
    /// The whole run.
    pub total: consort_actors::Tally,
    /// Per role that spent anything.
    pub roles: std::collections::BTreeMap<consort_actors::Role, consort_actors::Tally>,
}

impl UsageReport {
    /// The report of these totals.
    pub fn of(totals: &consort_actors::UsageTotals) -> Self {
        UsageReport {
            total: totals.run(),
            roles: totals.roles.iter().map(|(r, u)| (*r, u.total)).collect(),
        }
    }
}

/// Where the build lane is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TestPosition {
    /// 1-based index.
    pub index: usize,
    /// Number of tests.
    pub of: usize,
    /// The entry id.
    pub id: String,
}

/// A gate waiting for a decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingGate {
    /// Which gate.
    pub gate: GateKind,
    /// The hash to approve.
    pub hash: String,
}

/// Why a run halted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HaltInfo {
    /// `verdict`, `infrastructure`, `budget`, `changed-outside` or `integration` (a lane's merge
    /// check).
    pub kind: String,
    /// The typed reason, e.g. `repair-bound-spent`, `database-down` or `budget-spent`.
    pub reason: String,
    /// The budget that is spent (`run tokens`, `driver wall time`, …), for `budget-spent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// The step.
    pub step: String,
    /// Details.
    pub detail: String,
}

/// The halt of a feature the fleet stopped taking over: its workers were lost `lost.lost + 1`
/// times in a row ([`LOST_WORKERS_BOUND`](consort_lakebase::store::LOST_WORKERS_BOUND)).
fn lost_workers_halt(lost: &consort_lakebase::store::Holding, step: Option<&str>) -> HaltInfo {
    HaltInfo {
        kind: "infrastructure".into(),
        reason: "workers-lost".into(),
        budget: None,
        step: step.unwrap_or("its next step").to_string(),
        detail: format!(
            "{} workers in a row lost it (killed, out of memory or cut off; the last was {}): \
             no worker takes it over again until a person decides: `consort run --feature {f}` \
             on a machine you watch (the count starts again), or `consort stop --feature {f}`",
            lost.lost + 1,
            lost.holder,
            f = lost.feature
        ),
    }
}

/// A receipt, briefly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReceiptSummary {
    /// The request it answered.
    pub request: u64,
    /// The branch it ran on.
    pub branch: String,
    /// Tests passed.
    pub passed: usize,
    /// Tests not passed.
    pub failed: usize,
    /// The command's exit code.
    pub exit_code: Option<i32>,
    /// How the run was confined, for people: `Landlock ABI 7 (files and TCP)`, `off …`.
    pub confinement: String,
    /// What the run covered, for people: `the whole suite`, `the whole suite, split over 3
    /// branches`, `2 of the feature's files` (see [`coverage`]).
    pub covered: String,
}

/// What a receipt's run covered, for people: the whole suite (split over how many branches,
/// and how many shards were stopped early), or the files of a run limited to the feature's
/// tests.
pub fn coverage(r: &TestRunReceipt) -> String {
    if !r.selection.is_empty() {
        return format!("{} of the feature's test files", r.selection.len());
    }
    match r.shards.len() {
        0 => "the whole suite".into(),
        n => match r.shards.iter().filter(|s| s.stopped()).count() {
            0 => format!("the whole suite, split over {n} branches"),
            stopped => format!(
                "the suite split over {n} branches, {stopped} stopped once a failure settled the verdict"
            ),
        },
    }
}

/// A run's branch and the commit at its tip.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GitTip {
    /// `consort/<feature-id>`.
    pub branch: String,
    /// The tip's commit id (None while the branch has no commit or does not exist yet).
    pub head: Option<String>,
}

/// Why the run halted, as `consort status` reports it (None: not halted).
fn halt_info(state: &State) -> Option<HaltInfo> {
    match &state.status {
        RunStatus::Halted { escalation, .. } => {
            let (kind, reason, budget) = match &escalation.reason {
                consort_actors::EscalationReason::Verdict(v) => {
                    ("verdict", serde_json::to_value(v), None)
                }
                consort_actors::EscalationReason::Infrastructure(f) => {
                    ("infrastructure", serde_json::to_value(f), None)
                }
                consort_actors::EscalationReason::BudgetSpent(b) => (
                    "budget",
                    Ok(serde_json::Value::from("budget-spent")),
                    Some(b.to_string()),
                ),
                consort_actors::EscalationReason::ChangedOutsideConsort => (
                    "changed-outside",
                    Ok(serde_json::Value::from("changed-outside-consort")),
                    None,
                ),
                consort_actors::EscalationReason::Integration => (
                    "integration",
                    Ok(serde_json::Value::from("merge-refused")),
                    None,
                ),
                consort_actors::EscalationReason::FailingBeforeTheFeature => (
                    "baseline",
                    Ok(serde_json::Value::from("failing-before-the-feature")),
                    None,
                ),
            };
            Some(HaltInfo {
                kind: kind.into(),
                reason: reason
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                budget,
                step: escalation.step.clone(),
                detail: escalation.detail.clone(),
            })
        }
        _ => None,
    }
}

/// The status of a state, as `consort status` reports it (without [`StatusReport::git`],
/// which [`Project::git_tip`] reads from the repository).
pub fn status_of(
    state: &State,
    ledger_entries: usize,
    usage: &consort_actors::UsageTotals,
) -> StatusReport {
    let step = state.pending.as_ref().map(|p| match p {
        consort_actors::Pending::Agent { step, .. } => step.to_string(),
        consort_actors::Pending::Observe { .. } => "observe".into(),
        consort_actors::Pending::Apply { step, .. } => format!("apply/{step}"),
        consort_actors::Pending::Revert { .. } => "revert".into(),
        consort_actors::Pending::Verify {
            step: Some(step), ..
        } => format!("verify/{step}"),
        consort_actors::Pending::Verify { step: None, .. } => "verify/deploy".into(),
        consort_actors::Pending::Gate { gate, .. } => format!("{gate}-gate"),
        consort_actors::Pending::Promote { .. } => "promote".into(),
        consort_actors::Pending::Baseline { .. } => "baseline".into(),
    });
    let test = state.test_list.as_ref().and_then(|l| {
        (state.frozen.is_some() && state.build.current < l.entries.len()).then(|| TestPosition {
            index: state.build.current + 1,
            of: l.entries.len(),
            id: l.entries[state.build.current].id.clone(),
        })
    });
    let halted = halt_info(state);
    let last_receipt = state.last_receipt().map(|r| {
        let passed = r
            .outcomes
            .iter()
            .filter(|o| o.status == TestStatus::Passed)
            .count();
        ReceiptSummary {
            request: r.request_id.0,
            branch: r.branch_id.clone(),
            passed,
            failed: r.outcomes.len() - passed,
            exit_code: r.exit.code,
            confinement: r.confinement.to_string(),
            covered: coverage(r),
        }
    });
    StatusReport {
        phase: state.phase(),
        step,
        test,
        pending_gate: state.pending_gate().map(|(gate, hash)| PendingGate {
            gate,
            hash: hash.to_hex(),
        }),
        halted,
        last_receipt,
        ledger_entries,
        git: None,
        usage: UsageReport::of(usage),
        feature: None,
        features: Vec::new(),
        lanes: Vec::new(),
        flaky: Vec::new(),
        failing_before: state.baseline.as_ref().map(|b| b.failing.clone()),
        quarantined: state
            .quarantines()
            .map(|q| QuarantineInfo {
                test: q.test.clone(),
                by: q.by.clone(),
                reason: q.reason.clone(),
            })
            .collect(),
    }
}

/// The `consort approve` command line that continues a run waiting at a gate.
pub fn approve_command(dir: &Path, gate: GateKind, hash: &str) -> String {
    format!(
        "consort approve {gate} --hash {hash} --by <your-name> --dir {}",
        dir.display()
    )
}

/// A signal that ended a run before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interruption {
    /// `SIGINT` (Ctrl-C).
    Interrupt,
    /// `SIGTERM` (`kill`, `timeout`).
    Terminate,
}

impl Interruption {
    /// The exit code of a program ended by this signal, as shells report it: 128 + its number.
    pub fn exit_code(self) -> i32 {
        match self {
            Interruption::Interrupt => 130,
            Interruption::Terminate => 143,
        }
    }
}

impl std::fmt::Display for Interruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Interruption::Interrupt => "SIGINT",
            Interruption::Terminate => "SIGTERM",
        })
    }
}

#[cfg(test)]
mod tests {
    use consort_actors::{ContentHash, ExitRecord, RequestId, ShardRun};
    use consort_testkit::artifacts::receipt_with;

    use super::*;

    fn shard(stopped: bool) -> ShardRun {
        ShardRun {
            branch_id: "b".into(),
            command: "pytest".into(),
            files: vec!["tests/test_a.py".into()],
            outcomes: 1,
            exit: (!stopped).then_some(ExitRecord {
                code: Some(0),
                signal: None,
                timed_out: false,
            }),
            run_ms: 5,
        }
    }

    #[test]
    fn what_a_run_covered_is_said_for_people() {
        let mut r = receipt_with(
            RequestId(1),
            ContentHash::of_bytes(b"t"),
            &[("t", TestStatus::Passed)],
            0,
            "",
        );
        assert_eq!(coverage(&r), "the whole suite");
        r.shards = vec![shard(false), shard(false), shard(false)];
        assert_eq!(coverage(&r), "the whole suite, split over 3 branches");
        r.shards[2] = shard(true);
        assert_eq!(
            coverage(&r),
            "the suite split over 3 branches, 1 stopped once a failure settled the verdict"
        );
        r.selection = vec!["tests/test_a.py".into(), "tests/test_b.py".into()];
        assert_eq!(coverage(&r), "2 of the feature's test files");
    }
}
