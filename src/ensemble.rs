//! The [`Ensemble`]: eight supervised role actors, a supervised Lakebase actor and a conductor,
//! wired together for one project.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use consort_actors::{
    ActorId, AppendObserver, Approver, Conductor, ConductorError, ConductorHandle, FeatureRequest,
    LakebaseMsg, MachineConfig, Role, RoleMsg, RunEvent, RunReport, RunnerFacts, StopAtGates,
    Wiring,
};
use consort_actors::{
    BoxFuture, ConductorConfig, InfraError, LakebaseEndpoint, PromoteReport, PromoteRequest,
    RoleEndpoint, SupervisedLakebase, SupervisedRole, TestRunReceipt, VerifyRequest,
};
use consort_actors::{ChildSpec, RestartPolicy, Supervised};
use consort_agents::{Agent, RoleArgs, spawn_role_linked};
use consort_lakebase::{
    BranchProvider, EmbeddedCluster, EmbeddedConfig, EmbeddedPostgres, EmbeddedProvider,
    LakebaseActor, LakebaseArgs, PoolConfig, PoolStats, PoolStatsSnapshot, PsqlRunner,
    PsqlRunnerConfig, SandboxMode, Shards, TestRunner,
};

use crate::runlock::RunLock;

/// How a run's promotion is made, given the Lakebase side to make it with: a lane checks its
/// merge first (see [`crate::lanes::MergeCheck`]). An error refuses the promotion; the run
/// halts with it.
pub trait Promotion: Send + Sync {
    /// Checks `request`, then applies it to the parent database through `lakebase`.
    fn promote<'a>(
        &'a self,
        request: PromoteRequest,
        lakebase: &'a dyn LakebaseEndpoint,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<PromoteReport, InfraError>>;
}

/// The Lakebase side as the conductor reaches it, promoting through a [`Promotion`].
struct PromotingLakebase {
    inner: Arc<dyn LakebaseEndpoint>,
    promotion: Arc<dyn Promotion>,
}

impl LakebaseEndpoint for PromotingLakebase {
    fn verify(
        &self,
        request: VerifyRequest,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<TestRunReceipt, InfraError>> {
        self.inner.verify(request, timeout)
    }

    fn promote(
        &self,
        request: PromoteRequest,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<PromoteReport, InfraError>> {
        self.promotion
            .promote(request, self.inner.as_ref(), timeout)
    }
}

/// Why an ensemble could not be built or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnsembleError {
    /// No agent was given for a role.
    #[error("no agent plays the {0} role")]
    MissingAgent(Role),
    /// The same actor would write code and review it.
    #[error(
        "the Driver and the Navigator are the same actor ({0}); the author never reviews its own code"
    )]
    ReviewerIsAuthor(String),
    /// The database side failed to start.
    #[error("database")]
    Database(#[from] consort_lakebase::Error),
    /// An actor could not be started.
    #[error("could not start the {what} actor: {detail}")]
    Spawn {
        /// Which actor.
        what: String,
        /// Why.
        detail: String,
    },
    /// The conductor failed.
    #[error(transparent)]
    Conductor(#[from] ConductorError),
}

/// Work an ensemble runs at its shutdown, before its run locks go.
type BeforeUnlock = Box<dyn FnOnce() + Send + Sync>;

/// Builds an [`Ensemble`]. Every setting has a default except the agents.
pub struct EnsembleBuilder {
    work_tree: PathBuf,
    feature: Option<FeatureRequest>,
    inherited: consort_actors::Inherited,
    harness: Option<consort_actors::Harness>,
    record_dir: Option<PathBuf>,
    hidden: Vec<PathBuf>,
    promotion: Option<Arc<dyn Promotion>>,
    machine: MachineConfig,
    runner_facts: Option<Arc<RunnerFacts>>,
    agents: BTreeMap<Role, (Arc<dyn Agent>, String)>,
    provider: Option<Arc<dyn BranchProvider>>,
    runner: Option<Arc<dyn TestRunner>>,
    approver: Arc<dyn Approver>,
    pool: PoolConfig,
    max_concurrent: usize,
    sandbox: SandboxMode,
    shards: Shards,
    migration_tool: Option<consort_lakebase::migrate::MigrationTool>,
    step_timeout: Duration,
    verify_timeout: Duration,
    restart: RestartPolicy,
    append_observer: Option<Arc<dyn AppendObserver>>,
    event_log: Option<consort_actors::EventLogOpener>,
    before_unlock: Vec<BeforeUnlock>,
    run_locks: Vec<RunLock>,
    budgets: consort_actors::Budgets,
    workbench: Option<consort_actors::workbench::WorkbenchLimits>,
}

impl std::fmt::Debug for EnsembleBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnsembleBuilder")
            .field("work_tree", &self.work_tree)
            .field("agents", &self.agents.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl EnsembleBuilder {
    /// The feature request of a new run (a resumed run reads it from the ledger).
    pub fn feature(mut self, feature: FeatureRequest) -> Self {
        self.feature = Some(feature);
        self
    }

    /// The configuration that judges the runs, recorded in a new run's start (see
    /// [`consort_actors::Harness`]).
    pub fn harness(mut self, harness: consort_actors::Harness) -> Self {
        self.harness = Some(harness);
        self
    }

    /// What the project's earlier features leave to a new run: their tests, its regression
    /// suite, and their migrations (recorded in the run's start).
    pub fn inherited(mut self, inherited: consort_actors::Inherited) -> Self {
        self.inherited = inherited;
        self
    }

    /// Where the run's ledger, frozen design and apply journal are kept: a relative path is
    /// taken from the work tree and lies inside `.consort/` (default: `.consort` itself; a
    /// project's features each keep theirs in `.consort/features/<id>`); a lane's lies in
    /// its project, outside its work tree.
    pub fn record_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.record_dir = Some(dir.into());
        self
    }

    /// More paths no verification run may read (a lane's project records); see
    /// [`ConductorConfig::hidden`](consort_actors::ConductorConfig::hidden).
    pub fn hidden(mut self, paths: Vec<PathBuf>) -> Self {
        self.hidden = paths;
        self
    }

    /// Promotes through `promotion` (a lane's merge check) instead of directly.
    pub fn promotion(mut self, promotion: Arc<dyn Promotion>) -> Self {
        self.promotion = Some(promotion);
        self
    }

    /// Bounds and path rules.
    pub fn machine(mut self, machine: MachineConfig) -> Self {
        self.machine = machine;
        self
    }

    /// How the project's tests run, as the Test Strategist, the Navigator and the Driver are
    /// told (see [`crate::config::runner_facts`]).
    pub fn runner_facts(mut self, facts: RunnerFacts) -> Self {
        self.runner_facts = Some(Arc::new(facts));
        self
    }

    /// The agent that plays `role` — swapping in your own agent is this one line.
    pub fn agent(self, role: Role, agent: impl Agent) -> Self {
        self.agent_arc(role, Arc::new(agent))
    }

    /// The agent that plays `role`, shared.
    pub fn agent_arc(mut self, role: Role, agent: Arc<dyn Agent>) -> Self {
        self.agents.insert(role, (agent, role.as_str().to_string()));
        self
    }

    /// The agent that plays `role`, under an explicit actor name (the author identity).
    pub fn agent_named(
        mut self,
        role: Role,
        name: impl Into<String>,
        agent: Arc<dyn Agent>,
    ) -> Self {
        self.agents.insert(role, (agent, name.into()));
        self
    }

    /// The branch provider (default: an embedded PostgreSQL cluster in `.consort/pg`).
    pub fn provider(mut self, provider: Arc<dyn BranchProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// The test runner (default: the psql runner over `src/**/*.sql` and `tests/**/*.sql`,
    /// skipping the machine's cache directories).
    pub fn runner(mut self, runner: Arc<dyn TestRunner>) -> Self {
        self.runner = Some(runner);
        self
    }

    /// Who decides gates while the run is live (default: nobody — the run stops at each gate).
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approver = approver;
        self
    }

    /// The warm pool and how many verifications may run at once.
    pub fn pool(mut self, pool: PoolConfig, max_concurrent: usize) -> Self {
        self.pool = pool;
        self.max_concurrent = max_concurrent.max(1);
        self
    }

    /// How test runs are confined: Landlock (the default; verification refuses to run where
    /// the kernel lacks it) or [`SandboxMode::Off`], which every receipt then records.
    pub fn sandbox(mut self, mode: SandboxMode) -> Self {
        self.sandbox = mode;
        self
    }

    /// The project's own migration tool, which then applies the migrations on every branch
    /// and at promotion (None, the default: Consort applies plain SQL itself).
    pub fn migration_tool(
        mut self,
        tool: Option<consort_lakebase::migrate::MigrationTool>,
    ) -> Self {
        self.migration_tool = tool;
        self
    }

    /// How verifications split the suite over branches ([`Shards::OFF`], whole, unless
    /// changed; a project's ensemble takes `[runner] shards`).
    pub fn shards(mut self, shards: Shards) -> Self {
        self.shards = shards;
        self
    }

    /// Deadlines of an agent step and of a verification.
    pub fn timeouts(mut self, step: Duration, verify: Duration) -> Self {
        self.step_timeout = step;
        self.verify_timeout = verify;
        self
    }

    /// The restart intensity of every supervised actor (default: 3 in 60 s).
    pub fn restart_policy(mut self, policy: RestartPolicy) -> Self {
        self.restart = policy;
        self
    }

    /// Runs `work` (blocking is allowed) when the ensemble shuts down, after the conductor has
    /// stopped and before the run locks go: what the run started beside the ensemble ends in
    /// it, while no other run may start (the project's live git sync makes its last commit).
    pub(crate) fn before_unlock(mut self, work: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.before_unlock.push(Box::new(work));
        self
    }

    /// Holds a run lock (the project's, the feature's) until the ensemble shuts down; called
    /// again, it holds each. [`Project::ensemble`](crate::Project::ensemble) takes them
    /// before anything else.
    pub fn run_lock(mut self, lock: RunLock) -> Self {
        self.run_locks.push(lock);
        self
    }

    /// Tells `observer` of every durable ledger append; it may stop the conductor right after
    /// one, as a crash would (see [`AppendObserver`]).
    pub fn append_observer(mut self, observer: Arc<dyn AppendObserver>) -> Self {
        self.append_observer = Some(observer);
        self
    }

    /// Where the run's events are kept instead of the ledger file (a store machines share,
    /// such as `consort_lakebase::store::PgEventLogOpener`); default: the ledger file in the
    /// record directory.
    pub fn event_log(mut self, opener: consort_actors::EventLogOpener) -> Self {
        self.event_log = Some(opener);
        self
    }

    /// Budgets of the run and its roles, checked against the ledger before every step
    /// (default: none).
    pub fn budgets(mut self, budgets: consort_actors::Budgets) -> Self {
        self.budgets = budgets;
        self
    }

    /// The bounds of the tools build steps get (read, list, search, scratch runs; see
    /// [`consort_actors::workbench`]); `None` gives them none. Default: three scratch runs
    /// per step.
    pub fn workbench(mut self, limits: Option<consort_actors::workbench::WorkbenchLimits>) -> Self {
        self.workbench = limits;
        self
    }

    /// Starts the database side, the actors and the conductor.
    pub async fn build(mut self) -> Result<Ensemble, EnsembleError> {
        self.check_roles()?;
        let (provider, cluster) = self.start_provider().await?;
        let stats = Arc::new(PoolStats::default());
        let lakebase = self.start_lakebase(provider.clone(), stats.clone()).await?;
        let agents = std::mem::take(&mut self.agents);
        let (roles, role_handles) = self.start_roles(agents).await?;
        let (events, _) = tokio::sync::broadcast::channel(EVENTS_CAPACITY);
        let conductor = match self.start_conductor(roles, &lakebase, &events).await {
            Ok(c) => c,
            Err(e) => {
                for h in &role_handles {
                    h.shutdown().await;
                }
                lakebase.shutdown().await;
                return Err(e.into());
            }
        };
        Ok(Ensemble {
            work_tree: self.work_tree,
            conductor,
            events,
            roles: role_handles,
            lakebase,
            stats,
            provider,
            cluster,
            before_unlock: self.before_unlock,
            run_locks: self.run_locks,
        })
    }

    /// Every role has an agent, and the Driver never reviews its own code.
    fn check_roles(&self) -> Result<(), EnsembleError> {
        for role in Role::ALL {
            if !self.agents.contains_key(&role) {
                return Err(EnsembleError::MissingAgent(role));
            }
        }
        if let (Some((_, d)), Some((_, n))) = (
            self.agents.get(&Role::Driver),
            self.agents.get(&Role::Navigator),
        ) && d == n
        {
            return Err(EnsembleError::ReviewerIsAuthor(d.clone()));
        }
        Ok(())
    }

    /// The given branch provider, or an embedded cluster for the work tree (returned too, so
    /// the ensemble keeps it alive).
    async fn start_provider(
        &mut self,
    ) -> Result<(Arc<dyn BranchProvider>, Option<Arc<EmbeddedCluster>>), EnsembleError> {
        if let Some(p) = self.provider.take() {
            return Ok((p, None));
        }
        let c = EmbeddedPostgres::start(EmbeddedConfig::for_project(&self.work_tree)).await?;
        let provider = Arc::new(EmbeddedProvider::new(c.clone()).await?);
        Ok((provider, Some(c)))
    }

    /// The supervised Lakebase actor over `provider` and the test runner.
    async fn start_lakebase(
        &mut self,
        provider: Arc<dyn BranchProvider>,
        stats: Arc<PoolStats>,
    ) -> Result<Supervised<LakebaseMsg>, EnsembleError> {
        let runner: Arc<dyn TestRunner> = match self.runner.take() {
            Some(r) => r,
            None => Arc::new(PsqlRunner::new(PsqlRunnerConfig::default())?),
        };
        let mut args = LakebaseArgs::new(provider, runner);
        args.pool = self.pool.clone();
        args.max_concurrent = self.max_concurrent;
        args.stats = stats;
        args.sandbox = self.sandbox;
        args.shards = self.shards;
        args.migration_tool = self.migration_tool.clone();
        let spec = ChildSpec::new("lakebase", move |sup| {
            let args = args.clone();
            async move {
                LakebaseActor::spawn_linked(None, args, sup)
                    .await
                    .map(|(r, _)| r)
            }
        })
        .with_policy(self.restart);
        Supervised::<LakebaseMsg>::start(spec)
            .await
            .map_err(|e| EnsembleError::Spawn {
                what: "lakebase".into(),
                detail: e.to_string(),
            })
    }

    /// One supervised actor per role.
    async fn start_roles(
        &self,
        agents: BTreeMap<Role, (Arc<dyn Agent>, String)>,
    ) -> Result<RoleActors, EnsembleError> {
        let mut roles: BTreeMap<Role, Arc<dyn RoleEndpoint>> = BTreeMap::new();
        let mut role_handles = Vec::new();
        for (role, (agent, name)) in agents {
            let id = ActorId::new(role, name);
            // Role rules are enforced in one place, the state machine; the actor checks only the kind.
            let role_args = RoleArgs::new(id.clone(), agent)
                .with_timeout(self.step_timeout)
                .with_rule_check(false);
            let spec = ChildSpec::new(role.as_str(), move |sup| {
                let role_args = role_args.clone();
                async move { spawn_role_linked(role_args, sup).await.map(|(r, _)| r) }
            })
            .with_policy(self.restart);
            let handle =
                Supervised::<RoleMsg>::start(spec)
                    .await
                    .map_err(|e| EnsembleError::Spawn {
                        what: role.to_string(),
                        detail: e.to_string(),
                    })?;
            role_handles.push(handle.clone());
            roles.insert(role, Arc::new(SupervisedRole { id, handle }));
        }
        Ok((roles, role_handles))
    }

    /// The conductor, wired to the role actors and the Lakebase actor.
    async fn start_conductor(
        &mut self,
        roles: BTreeMap<Role, Arc<dyn RoleEndpoint>>,
        lakebase: &Supervised<LakebaseMsg>,
        events: &tokio::sync::broadcast::Sender<RunEvent>,
    ) -> Result<ConductorHandle, ConductorError> {
        let mut config = ConductorConfig::new(&self.work_tree);
        if let Some(dir) = &self.record_dir {
            config.record_dir = self.work_tree.join(dir);
            config.ledger_path = config.record_dir.join("ledger.jsonl");
        }
        config.hidden = self.hidden.clone();
        config.machine = self.machine.clone();
        config.runner = self.runner_facts.clone();
        config.step_timeout = self.step_timeout + Duration::from_secs(5);
        config.verify_timeout = self.verify_timeout;
        config.append_observer = self.append_observer.take();
        config.events = Some(events.clone());
        config.event_log = self.event_log.take();
        config.budgets = self.budgets.clone();
        config.workbench = self.workbench;
        let mut endpoint: Arc<dyn LakebaseEndpoint> = Arc::new(SupervisedLakebase {
            handle: lakebase.clone(),
        });
        if let Some(promotion) = self.promotion.clone() {
            endpoint = Arc::new(PromotingLakebase {
                inner: endpoint,
                promotion,
            });
        }
        let wiring = Wiring {
            config,
            feature: self.feature.take(),
            inherited: std::mem::take(&mut self.inherited),
            harness: self.harness.take(),
            roles,
            lakebase: endpoint,
            approver: self.approver.clone(),
        };
        Conductor::start(wiring).await
    }
}

/// The role actors as the conductor reaches them, and their supervisors.
type RoleActors = (
    BTreeMap<Role, Arc<dyn RoleEndpoint>>,
    Vec<Supervised<RoleMsg>>,
);

/// How many [`RunEvent`]s a subscriber may fall behind before it misses some
/// ([`Ensemble::subscribe`]).
pub const EVENTS_CAPACITY: usize = 4096;

/// A running ensemble for one work tree.
pub struct Ensemble {
    work_tree: PathBuf,
    conductor: ConductorHandle,
    /// Where the conductor publishes every [`RunEvent`].
    events: tokio::sync::broadcast::Sender<RunEvent>,
    roles: Vec<Supervised<RoleMsg>>,
    lakebase: Supervised<LakebaseMsg>,
    stats: Arc<PoolStats>,
    provider: Arc<dyn BranchProvider>,
    cluster: Option<Arc<consort_lakebase::EmbeddedCluster>>,
    before_unlock: Vec<BeforeUnlock>,
    run_locks: Vec<RunLock>,
}

impl std::fmt::Debug for Ensemble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ensemble")
            .field("work_tree", &self.work_tree)
            .finish_non_exhaustive()
    }
}

impl Ensemble {
    /// A builder for the project in `work_tree`.
    pub fn builder(work_tree: impl Into<PathBuf>) -> EnsembleBuilder {
        EnsembleBuilder {
            work_tree: work_tree.into(),
            feature: None,
            inherited: Default::default(),
            harness: None,
            record_dir: None,
            hidden: Vec::new(),
            promotion: None,
            machine: MachineConfig::default(),
            runner_facts: None,
            agents: BTreeMap::new(),
            provider: None,
            runner: None,
            approver: Arc::new(StopAtGates),
            pool: PoolConfig::default(),
            max_concurrent: 4,
            sandbox: SandboxMode::default(),
            shards: Shards::OFF,
            migration_tool: None,
            step_timeout: Duration::from_secs(600),
            verify_timeout: Duration::from_secs(900),
            restart: RestartPolicy::default(),
            append_observer: None,
            event_log: None,
            before_unlock: Vec::new(),
            run_locks: Vec::new(),
            budgets: consort_actors::Budgets::default(),
            workbench: Some(consort_actors::workbench::WorkbenchLimits::default()),
        }
    }

    /// Drives the run until it is done, waits at a gate, halts or stops.
    pub async fn run(&self) -> Result<RunReport, EnsembleError> {
        Ok(self.conductor.run().await?)
    }

    /// A new subscription to what the run does: each ledger entry once it is durable, and
    /// each progress report, in order ([`RunEvent`]). Subscribe before [`Ensemble::run`] to
    /// see everything; any number may follow. The run never waits for a subscriber: one that
    /// falls more than [`EVENTS_CAPACITY`] behind gets `RecvError::Lagged(n)` and goes on from
    /// the oldest kept (the ledger has what it missed).
    ///
    /// ```no_run
    /// # async fn follow(ensemble: &consort::Ensemble) {
    /// use consort::actors::RunEvent;
    /// let mut events = ensemble.subscribe();
    /// tokio::spawn(async move {
    ///     while let Ok(event) = events.recv().await {
    ///         if let RunEvent::Recorded(entry) = event {
    ///             println!("{}: {}", entry.seq, entry.event.name());
    ///         }
    ///     }
    /// });
    /// # }
    /// ```
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<RunEvent> {
        self.events.subscribe()
    }

    /// The work tree.
    pub fn work_tree(&self) -> &Path {
        &self.work_tree
    }

    /// Branches created, dropped and live so far.
    pub fn branch_stats(&self) -> PoolStatsSnapshot {
        self.stats.snapshot()
    }

    /// The branch provider in use.
    pub fn provider(&self) -> &Arc<dyn BranchProvider> {
        &self.provider
    }

    /// Stops the conductor and every actor; the pool drops its branches and sweeps orphans
    /// (branches kept for inspection stay until their age limit); an embedded cluster stops
    /// when nothing else uses it; the run lock, if held, is released last. Returns the final
    /// branch counters.
    pub async fn shutdown(self) -> PoolStatsSnapshot {
        // The conductor first, and waited for: an answer from a role stopped below must not
        // reach it and be recorded (a stopped run resumes where it stood, like a crashed one).
        if let Err(e) = self.conductor.actor().stop_and_wait(None, None).await {
            tracing::debug!(error = %e, "the conductor had already stopped");
        }
        for h in &self.roles {
            h.shutdown().await;
        }
        // The Lakebase actor's shutdown drops the pool's branches and sweeps orphans.
        self.lakebase.shutdown().await;
        // The provider (and with it the embedded cluster, when nothing else uses it) before
        // the run lock, so a run that takes the lock next never finds this server going down.
        drop(self.provider);
        drop(self.cluster);
        for work in self.before_unlock {
            if let Err(e) = tokio::task::spawn_blocking(work).await {
                tracing::warn!(error = %e, "what the run ends at its shutdown failed");
            }
        }
        let stats = self.stats.snapshot();
        drop(self.run_locks);
        stats
    }

    /// Takes the run locks out of the ensemble, for a caller that must release them later
    /// than [`Ensemble::shutdown`] would (after stopping servers the ensemble does not own).
    pub fn take_run_locks(&mut self) -> Vec<RunLock> {
        std::mem::take(&mut self.run_locks)
    }
}
