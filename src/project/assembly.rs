//! Assembling a feature's ensemble from its project: the provider, the runner, an agent per
//! role, the event log (under the feature's lease, with the shared store), the git sync that
//! commits while the run goes. Here rather than in `project.rs`, which knows the project's
//! records and configuration, not how a run is put together.

use std::path::PathBuf;
use std::sync::Arc;

use consort_actors::Role;
use consort_agents::AgentConfig;
use consort_lakebase::{PoolConfig, Shards};

use super::git_sync::{self, LiveSync};
use super::{Project, ProjectError, RunOptions, lane, program_name, share};
use crate::ensemble::Ensemble;
use crate::records::LeaseKeeper;
use crate::runlock::RunLock;

impl Project {
    /// Builds the ensemble: provider, runner, one agent per role, approver. The run lock is
    /// taken first (named by `opts.command`) and held by the ensemble until it shuts down, so a
    /// second run of the same project is refused before it starts a database or writes a line.
    pub async fn ensemble(&self, opts: RunOptions) -> Result<Ensemble, ProjectError> {
        let command = opts.command.clone().unwrap_or_else(program_name);
        let lock = self.lock(&command)?;
        self.ensemble_locked(lock, opts).await
    }

    /// [`Project::ensemble`] with a run lock already taken: the project's ([`Project::lock`])
    /// or the feature's ([`Project::lock_feature`], what a lane holds). The feature's lock is
    /// taken too when `lock` is not it; the ensemble holds both until it shuts down.
    pub async fn ensemble_locked(
        &self,
        lock: RunLock,
        opts: RunOptions,
    ) -> Result<Ensemble, ProjectError> {
        // A lane promotes behind its merge check, which only the lanes' driver gives it.
        if self.in_lane() && opts.promotion.is_none() {
            return Err(lane::LaneError::DriveAsLane {
                feature: self.feature.id.clone(),
            }
            .into());
        }
        let mut locks = Vec::with_capacity(2);
        if lock.path() != self.dir.join(self.feature.lock_file()) {
            let command = opts.command.clone().unwrap_or_else(program_name);
            locks.push(self.lock_feature(&command)?);
        }
        locks.push(lock);
        let fresh = self.records.is_fresh(&self.feature)?;
        if !fresh {
            self.record_harness_change(&opts)?;
        }
        self.restore_design()?;
        let (driver, event_log, keeper) = self.driver(&opts)?;
        // A new feature is refused before anything starts when an earlier one is unfinished.
        let start = if fresh {
            let mut inherited = self.inherited()?;
            inherited.catalog = self.catalog_for_the_dba(&inherited).await;
            Some((self.feature()?, inherited))
        } else {
            None
        };
        // What killed runs left in the temporary directory goes before this one adds its own.
        for (dir, bytes) in consort_lakebase::sweep_abandoned_scratch() {
            tracing::info!(dir = %dir.display(), bytes, "removed a killed run's scratch directory");
        }
        let mut builder = Ensemble::builder(&self.work_tree)
            .harness(self.config.harness())
            .record_dir(self.dir.join(&self.feature.record_dir))
            .hidden(lane::hidden_from_lane(self))
            .machine(self.machine()?.config().clone())
            .runner_facts(crate::config::runner_facts::runner_facts(&self.config))
            .provider(match &opts.provider {
                Some(shared) => Arc::clone(shared),
                None => self.provider().await?,
            })
            .runner(self.runner()?)
            .pool(
                pool_for(&self.config.pool, opts.sharing),
                share(self.config.pool.max_concurrent, opts.sharing),
            )
            .timeouts(self.config.step_timeout(), self.config.verify_timeout())
            .budgets(self.budgets(&opts)?)
            .workbench(Some(self.config.workbench()))
            .sandbox(self.config.runner.sandbox())
            .migration_tool(self.migration_tool()?)
            .shards(shared_shards(
                self.config.runner.shards(self.config.pool.max_concurrent),
                opts.sharing,
            ));
        let live = driver.git_prepare(fresh, opts.allow_dirty)?.map(Arc::new);
        if !fresh && driver.restore_applied()? {
            tracing::info!(feature = %self.feature.id, "wrote what the run applied on the machine it was taken over from");
        }
        builder = with_observers(builder, live, opts.append_observer.clone());
        if let Some(promotion) = &opts.promotion {
            builder = builder.promotion(Arc::clone(promotion));
        }
        builder = builder.event_log(event_log);
        if let Some(keeper) = keeper {
            builder = builder.before_unlock(move || drop(keeper));
        }
        for lock in locks {
            builder = builder.run_lock(lock);
        }
        if let Some((feature, inherited)) = start {
            builder = builder.feature(feature).inherited(inherited);
        }
        for role in Role::ALL {
            builder = builder.agent_arc(role, self.agent(role, &opts)?);
        }
        if let Some(a) = opts.approver {
            builder = builder.approver(a);
        }
        Ok(builder.build().await?)
    }

    /// A resumed run whose configuration that judges the runs (`[runner]`, `[paths]`,
    /// `[migrations]`) changed since it was recorded: the change is a person's decision,
    /// recorded in the ledger before the run goes on (by the `--approve-as` name, else the
    /// user), and said. A run recorded before the harness was (an old ledger) records nothing.
    fn record_harness_change(&self, opts: &RunOptions) -> Result<(), ProjectError> {
        let state = self.state()?;
        let now = self.config.harness();
        let Some(before) = state.harness.clone().filter(|h| *h != now) else {
            return Ok(());
        };
        if !matches!(
            state.status,
            consort_actors::RunStatus::Running | consort_actors::RunStatus::Halted { .. }
        ) {
            return Ok(());
        }
        let change = consort_actors::HarnessChange {
            by: opts
                .person
                .clone()
                .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
                .unwrap_or_else(|| "an unnamed person".into()),
            from: before,
            to: now,
        };
        tracing::warn!(
            feature = %self.feature.id,
            by = %change.by,
            changed = %change.summary(),
            "consort.toml changed what judges the runs since the feature started; recorded in its ledger as a person's decision, and the runs from here on are judged under it"
        );
        self.record_judged(|log, machine| {
            consort_actors::record_decision(
                log,
                machine,
                consort_actors::OfflineDecision::ChangeHarness(change.clone()),
            )
        })??;
        Ok(())
    }

    /// Who drives the feature, and where its events go: this handle under the lease it holds
    /// (a lane's driver took it), or under one taken now (with the shared store, refused while
    /// another process holds the feature; kept while the returned keeper lives); the file
    /// ledger otherwise; or the run's own event log.
    fn driver(
        &self,
        opts: &RunOptions,
    ) -> Result<(Project, consort_actors::EventLogOpener, Option<LeaseKeeper>), ProjectError> {
        let mut driver = self.clone();
        Ok(match (&opts.event_log, &self.lease) {
            (Some(log), _) => (driver, Arc::clone(log), None),
            (None, Some(lease)) => {
                let log = self.records.opener(&self.feature, Some(lease.clone()));
                (driver, log, None)
            }
            (None, None) => {
                let keeper = self.records.hold(&self.feature)?;
                driver.lease = keeper.as_ref().map(|k| k.lease().clone());
                let log = self.records.opener(&self.feature, driver.lease.clone());
                (driver, log, keeper)
            }
        })
    }

    /// The agent `consort.toml` configures for `role`, as a run of this feature gets it: an
    /// embedder's own agent may stand in front of it (see [`RunOptions::with_agent`]).
    pub fn configured_agent(
        &self,
        role: Role,
    ) -> Result<Arc<dyn consort_agents::Agent>, ProjectError> {
        self.agent(role, &RunOptions::default())
    }

    /// The agent of `role` for this feature's run: the embedder's own when the options give
    /// one, else its configuration (or the run's override) with what the project adds: an external program's scratch copy skips the project's
    /// caches too, transcripts are kept with the run's files, an MCP role's mailbox is the
    /// project's, and `{feature}` in a script path is the feature's id (a script per feature
    /// of a backlog).
    fn agent(
        &self,
        role: Role,
        opts: &RunOptions,
    ) -> Result<Arc<dyn consort_agents::Agent>, ProjectError> {
        if let Some(own) = opts.agents.get(&role) {
            return Ok(Arc::clone(own));
        }
        let mut cfg = opts
            .agents_override
            .as_ref()
            .unwrap_or_else(|| self.config.agents.for_role(role))
            .clone();
        match &mut cfg {
            AgentConfig::Command(c) => {
                c.caches.extend(self.config.paths.caches.iter().cloned());
                c.transcript_dir = Some(self.transcript_dir());
            }
            AgentConfig::Openai(c) => c.transcript_dir = Some(self.transcript_dir()),
            AgentConfig::Mcp(c) => {
                c.mailbox = Some(self.mailbox().dir().to_path_buf());
                c.transcript_dir = Some(self.transcript_dir());
                c.max_refusals = self.config.bounds.max_agent_retries;
            }
            AgentConfig::Script { path, paths } => {
                for p in path.iter_mut().chain(paths.iter_mut()) {
                    let spelled = p.to_string_lossy();
                    if spelled.contains("{feature}") {
                        *p = PathBuf::from(spelled.replace("{feature}", &self.feature.id));
                    }
                }
            }
        }
        cfg.build(role, &self.dir)
            .map_err(|source| ProjectError::Agent { role, source })
    }

    /// In a git repository: a new run starts its branch (a dirty tree refused unless
    /// `allow_dirty`), a resumed one must be on it and first gets the commits a crash left
    /// unmade; returns the observer that commits while the run goes.
    fn git_prepare(
        &self,
        fresh: bool,
        allow_dirty: bool,
    ) -> Result<Option<LiveSync>, ProjectError> {
        let Some(repo) = self.git() else {
            return Ok(None);
        };
        let feature = &self.feature.id;
        if fresh {
            let policy = self.machine()?.config().paths.clone();
            repo.start(feature, allow_dirty, policy.tree_filter())?;
        } else {
            repo.check_resume(feature)?;
            git_sync::sync_project(self, &repo, true)?;
        }
        Ok(Some(LiveSync::start(self.clone(), repo)))
    }
}

/// The builder with the run's git sync (finished before the run lock goes) and the caller's
/// append observer, both told of every append.
fn with_observers(
    mut builder: crate::ensemble::EnsembleBuilder,
    live: Option<Arc<LiveSync>>,
    theirs: Option<Arc<dyn consort_actors::AppendObserver>>,
) -> crate::ensemble::EnsembleBuilder {
    let ours = live
        .clone()
        .map(|l| l as Arc<dyn consort_actors::AppendObserver>);
    let observer = match (ours, theirs) {
        (Some(ours), Some(theirs)) => Some(Arc::new(crate::git::BothObservers(theirs, ours))
            as Arc<dyn consort_actors::AppendObserver>),
        (ours, theirs) => ours.or(theirs),
    };
    if let Some(live) = live {
        builder = builder.before_unlock(move || live.finish());
    }
    if let Some(observer) = observer {
        builder = builder.append_observer(observer);
    }
    builder
}

/// The warm pool of one of `sharing` runs on this machine: its share of `[pool] size`, and
/// lean when lanes share the machine (a branch made ahead for nothing is another lane's CPU).
fn pool_for(settings: &crate::config::PoolSettings, sharing: usize) -> PoolConfig {
    PoolConfig {
        size: share(settings.size, sharing),
        as_leased: sharing > 1,
        keep_failed: settings.keep_failed,
        ..PoolConfig::default()
    }
}

/// `shards` for one of `sharing` lanes on this machine: its share of the shards.
fn shared_shards(shards: Shards, sharing: usize) -> Shards {
    Shards {
        max: share(shards.max, sharing),
        ..shards
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_keep_lean_pools_and_a_run_alone_keeps_its_full_pool() {
        let settings = crate::config::PoolSettings {
            size: 4,
            keep_failed: true,
            ..crate::config::PoolSettings::default()
        };
        let alone = pool_for(&settings, 1);
        assert_eq!(
            (alone.size, alone.as_leased, alone.keep_failed),
            (4, false, true)
        );
        let lane = pool_for(&settings, 2);
        assert_eq!(
            (lane.size, lane.as_leased, lane.keep_failed),
            (2, true, true)
        );
    }
}
