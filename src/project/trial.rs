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
    /// Test files the runner collects that `[paths] tests` misses (at most 10): to Consort they
    /// are no tests, so an agent could change them.
    pub outside_test_paths: Vec<String>,
    /// The run's report: its outcomes, its exit, the end of its output.
    pub report: RunReport,
    /// What the project's migration tool did on the branch before the tests, when it applies
    /// the migrations (`[migrations] tool`).
    pub migrations: Option<consort_lakebase::migrate::ToolApplied>,
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
            promoted: self.promoted_features()?,
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
        let provider = self.provider().await?;
        let base = provider.prepare_base(&spec).await?;
        let branch = provider
            .create(&BranchNamer::new().next_name(), &base)
            .await?;
        let ran = self
            .trial_on(runner.as_ref(), provider.as_ref(), &branch, whole)
            .await;
        if let Err(e) = provider.delete(&branch.name).await {
            tracing::warn!(branch = %branch.name, error = %consort_actors::error_chain(&e), "the trial run's branch could not be removed; `consort branches --sweep` removes it");
        }
        ran
    }

    async fn trial_on(
        &self,
        runner: &dyn TestRunner,
        provider: &dyn BranchProvider,
        branch: &consort_lakebase::Branch,
        whole: bool,
    ) -> Result<TrialRun, ProjectError> {
        let tree = self.work_tree().to_path_buf();
        let mut hidden: Vec<PathBuf> = vec![tree.join(consort_actors::STATE_DIR)];
        hidden.extend(lane::hidden_from_lane(self));
        hidden.extend(provider.private_paths());
        let caches = consort_actors::WorkTree::open(&tree)?.cache_dirs()?;
        let conn = provider.connect_info(branch).await?;
        let mut ctx =
            RunContext::prepare(tree, conn, self.config.runner.sandbox(), hidden, caches)?;
        let migrations = match self.migration_tool()? {
            Some(tool) => Some(tool.apply(&ctx, &[]).await?),
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
        })
    }
}
