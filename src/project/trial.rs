//! A trial run: one test file of the project's suite run as a verification runs it — on a
//! fresh branch of the parent, confined as configured, with the runner's environment
//! (`env_set`, the allowed variables) — so that a suite that cannot live in the confinement is
//! found before the first feature, not at its GREEN. `consort doctor` makes one; `consort
//! doctor --baseline` runs the whole suite so, on a base with the project's existing
//! migrations, as a feature's baseline will. With the project's own migration tool, the tool
//! applies them on the branch first, confined as the tests are, and the run says what it did.

use std::path::PathBuf;

use consort_actors::Confinement;
use consort_actors::Quarantine;
use consort_lakebase::names::BranchNamer;
use consort_lakebase::{BaseSpec, BranchProvider, RunContext, RunReport, TestRunner};

use super::{Project, ProjectError, lane};

/// What a trial run ran and how it went.
#[derive(Debug)]
pub struct TrialRun {
    /// The test file it ran, relative to the project; `None`: the runner cannot run one file
    /// alone, so the whole suite ran.
    pub file: Option<String>,
    /// The confinement the run had.
    pub confinement: Confinement,
    /// Where the provider makes branches in memory when it has room (see
    /// [`BranchProvider::branches_in_memory`]); None: on disk.
    pub branches_in_memory: Option<PathBuf>,
    /// Test files the runner collects that `[paths] tests` misses (at most 10): to Consort they
    /// are no tests, so an agent could change them.
    pub outside_test_paths: Vec<String>,
    /// The run's report: its outcomes, its exit, the end of its output.
    pub report: RunReport,
    /// What the project's migration tool did on the branch before the tests, when it applies
    /// the migrations (`[migrations] tool`).
    pub migrations: Option<ToolTrial>,
}

/// The project's migration tool, run on a trial's branch.
#[derive(Debug)]
pub struct ToolTrial {
    /// The tool (`knex`).
    pub tool: String,
    /// The folder it applies (`[migrations] dir`).
    pub dir: String,
    /// What it did.
    pub done: consort_lakebase::migrate::ToolApplied,
}

/// What the baseline on demand found (see [`Project::baseline_run`]).
#[derive(Debug)]
pub struct BaselineRun {
    /// The whole suite's run.
    pub run: TrialRun,
    /// The quarantines in force (the done features' and the open one's): their failures judge
    /// nothing, as in a feature's baseline.
    pub quarantined: Vec<Quarantine>,
}

impl Project {
    /// Runs one test file of the suite (the first the runner lists) as a verification would,
    /// on a fresh branch (of the base a feature starts from) removed afterwards. A run the confinement refused something is
    /// [`consort_lakebase::Error::TestCommand`] with a
    /// [`consort_lakebase::TestCommandFault::Refused`] fault, naming what and how to allow it.
    pub async fn trial_run(&self) -> Result<TrialRun, ProjectError> {
        let base = self.base_a_feature_starts_from(&self.inherited()?)?;
        self.run_on_a_fresh_branch(base, false).await
    }

    /// The baseline on demand: the project's whole suite run as a feature's baseline runs it
    /// (confined, on a fresh branch of a base holding the project's existing migrations), with
    /// the quarantines in force. Its failing tests are what a feature's baseline would halt
    /// on, before any agent acts.
    pub async fn baseline_run(&self) -> Result<BaselineRun, ProjectError> {
        let inherited = self.inherited()?;
        let base = self.base_a_feature_starts_from(&inherited)?;
        let run = self.run_on_a_fresh_branch(base, true).await?;
        let state = self.state()?;
        Ok(BaselineRun {
            run,
            quarantined: inherited
                .quarantined
                .iter()
                .chain(&state.quarantined)
                .cloned()
                .collect(),
        })
    }

    /// The base every run of the next feature starts from: the parent (everything promoted)
    /// with the project's existing migrations applied, as the conductor applies them.
    fn base_a_feature_starts_from(
        &self,
        inherited: &consort_actors::Inherited,
    ) -> Result<BaseSpec, ProjectError> {
        let machine = self.machine()?;
        let migrations = match machine.config().migration_files.as_ref() {
            Some(files) => {
                let work = consort_actors::WorkTree::open(self.work_tree())?;
                consort_actors::existing_migrations(&work, files, &inherited.migrations)?
            }
            None => Vec::new(),
        };
        Ok(BaseSpec {
            migrations,
            fixtures: Vec::new(),
            // The features whose promotions changed the parent, from what they left: no
            // ledger is read again.
            promoted: promoted_by(inherited),
        })
    }

    /// One test file (or, `whole`, the whole suite) run as a verification would, on a fresh
    /// branch of a base built from `spec`, removed afterwards.
    async fn run_on_a_fresh_branch(
        &self,
        spec: BaseSpec,
        whole: bool,
    ) -> Result<TrialRun, ProjectError> {
        let runner = self.runner()?;
        let (provider, branch) = self.fresh_branch(&spec).await?;
        let ran = self
            .trial_on(runner.as_ref(), provider.as_ref(), &branch, whole)
            .await;
        drop_branch(provider.as_ref(), &branch).await;
        ran
    }

    /// The database's tables as the next feature starts from them (the base with the
    /// project's migrations, by its migration tool when it has one), read on a fresh branch
    /// removed afterwards: what the DBA is shown. None, said in the log, when they cannot be
    /// read: the feature's baseline then meets and names the same fault.
    pub async fn catalog_for_the_dba(
        &self,
        inherited: &consort_actors::Inherited,
    ) -> Option<consort_actors::SchemaCatalog> {
        match self.schema_catalog(inherited).await {
            Ok(catalog) => Some(catalog),
            Err(e) => {
                tracing::warn!(error = %consort_actors::error_chain(&e), "the database's tables could not be read for the DBA; its assignment goes without them");
                None
            }
        }
    }

    async fn schema_catalog(
        &self,
        inherited: &consort_actors::Inherited,
    ) -> Result<consort_actors::SchemaCatalog, ProjectError> {
        let spec = self.base_a_feature_starts_from(inherited)?;
        let (provider, branch) = self.fresh_branch(&spec).await?;
        let read = async {
            let conn = provider.connect_info(&branch).await?;
            if let Some(tool) = self.migration_tool()? {
                let ctx = self.run_context(provider.as_ref(), conn.clone())?;
                tool.apply(&ctx, &[]).await?;
            }
            Ok(consort_lakebase::read_catalog(&conn).await?)
        }
        .await;
        drop_branch(provider.as_ref(), &branch).await;
        read
    }

    /// A fresh branch of the base `spec` makes, on the project's provider.
    async fn fresh_branch(
        &self,
        spec: &BaseSpec,
    ) -> Result<(std::sync::Arc<dyn BranchProvider>, consort_lakebase::Branch), ProjectError> {
        let provider = self.provider().await?;
        let base = provider.prepare_base(spec).await?;
        let branch = provider
            .create(&BranchNamer::new().next_name(), &base)
            .await?;
        Ok((provider, branch))
    }

    /// A run's context on the branch `conn` reaches, confined as configured, Consort's state
    /// and the provider's private paths out of reach.
    fn run_context(
        &self,
        provider: &dyn BranchProvider,
        conn: consort_lakebase::ConnectInfo,
    ) -> Result<RunContext, ProjectError> {
        let tree = self.work_tree().to_path_buf();
        let mut hidden: Vec<PathBuf> = vec![tree.join(consort_actors::STATE_DIR)];
        hidden.extend(lane::hidden_from_lane(self));
        hidden.extend(provider.private_paths());
        let caches = consort_actors::WorkTree::open(&tree)?.cache_dirs()?;
        Ok(RunContext::prepare(
            tree,
            conn,
            self.config.runner.sandbox(),
            hidden,
            caches,
        )?)
    }

    async fn trial_on(
        &self,
        runner: &dyn TestRunner,
        provider: &dyn BranchProvider,
        branch: &consort_lakebase::Branch,
        whole: bool,
    ) -> Result<TrialRun, ProjectError> {
        let conn = provider.connect_info(branch).await?;
        let mut ctx = self.run_context(provider, conn)?;
        let migrations = match self.migration_tool()? {
            Some(tool) => Some(ToolTrial {
                done: tool.apply(&ctx, &[]).await?,
                tool: tool.name,
                dir: self.config.migrations.dir.clone(),
            }),
            None => None,
        };
        let suite = runner.collect(&ctx).await?;
        let policy = self.config.path_policy().map_err(|e| {
            ProjectError::Config(crate::config::ConfigError::Invalid {
                path: self.dir.join(crate::config::CONFIG_FILE),
                key: "paths.tests".into(),
                message: e.to_string(),
            })
        })?;
        let mut outside_test_paths: Vec<String> = Vec::new();
        for t in suite.iter().flat_map(|s| &s.tests) {
            if !policy.is_test(&t.file) && !outside_test_paths.contains(&t.file) {
                outside_test_paths.push(t.file.clone());
            }
        }
        outside_test_paths.truncate(10);
        let file = suite
            .and_then(|suite| suite.tests.into_iter().next())
            .map(|t| t.file)
            .filter(|_| !whole);
        ctx.select = file.clone().map(|f| vec![f]);
        let report = runner.run(&ctx).await?;
        Ok(TrialRun {
            file,
            confinement: ctx.jail.confinement(),
            outside_test_paths,
            report,
            migrations,
            branches_in_memory: provider.branches_in_memory().map(Into::into),
        })
    }
}

/// Removes a branch the project made for itself; one that stays is said, with how to remove it.
async fn drop_branch(provider: &dyn BranchProvider, branch: &consort_lakebase::Branch) {
    if let Err(e) = provider.delete(&branch.name).await {
        tracing::warn!(branch = %branch.name, error = %consort_actors::error_chain(&e), "a branch Consort made for itself could not be removed; `consort branches --sweep` removes it");
    }
}

/// The earlier features that promoted a migration, in order, without repeats.
fn promoted_by(inherited: &consort_actors::Inherited) -> Vec<String> {
    let mut features: Vec<String> = Vec::new();
    for m in &inherited.migrations {
        if !features.contains(&m.feature) {
            features.push(m.feature.clone());
        }
    }
    features
}
