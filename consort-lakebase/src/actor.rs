//! The Lakebase actor: serves the conductor's [`LakebaseMsg`] requests.
//!
//! Each request is handled in its own task, so the mailbox never blocks: up to
//! [`LakebaseArgs::max_concurrent`] verifications run at once (more wait for a slot), and
//! promotions run one at a time. Replies go through the request's `RpcReplyPort`.
//! Infrastructure failures reply `Err(InfraError)`; red tests reply a receipt.
//!
//! The pool's orphan sweep runs after start-up and at stop. The arguments are cheap to clone,
//! so a supervisor can restart the actor with the same ones (the counters in
//! [`LakebaseArgs::stats`] carry over).

use std::sync::Arc;

use consort_actors::{LakebaseMsg, RequestId};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::pool::{BranchPool, PoolConfig, PoolStats, PoolStatsSnapshot};
use crate::provider::BranchProvider;
use crate::runner::TestRunner;
use crate::verify::Verifier;

/// What the Lakebase actor is built from.
#[derive(Debug, Clone)]
pub struct LakebaseArgs {
    /// The branch backend.
    pub provider: Arc<dyn BranchProvider>,
    /// The test runner.
    pub runner: Arc<dyn TestRunner>,
    /// The warm pool's settings.
    pub pool: PoolConfig,
    /// How many verifications may run at once (at least 1).
    pub max_concurrent: usize,
    /// Fixture SQL run into every base after its migrations.
    pub fixtures: Vec<String>,
    /// Counters: branches created, dropped, live (shared across restarts).
    pub stats: Arc<PoolStats>,
    /// How test runs are confined (Landlock unless the configuration says `sandbox = "off"`).
    pub sandbox: crate::runner::SandboxMode,
    /// How verifications split the suite over branches (whole unless changed).
    pub shards: crate::verify::Shards,
    /// The project's own migration tool, when it (not Consort) applies the migrations.
    pub migration_tool: Option<crate::migrate::MigrationTool>,
}

impl LakebaseArgs {
    /// Arguments with the default pool (4 ready branches) and 4 concurrent verifications.
    pub fn new(provider: Arc<dyn BranchProvider>, runner: Arc<dyn TestRunner>) -> Self {
        LakebaseArgs {
            provider,
            runner,
            pool: PoolConfig::default(),
            max_concurrent: 4,
            fixtures: Vec::new(),
            stats: Arc::new(PoolStats::default()),
            sandbox: crate::runner::SandboxMode::default(),
            shards: crate::verify::Shards::OFF,
            migration_tool: None,
        }
    }

    /// The counters now (for run summaries).
    pub fn stats(&self) -> PoolStatsSnapshot {
        self.stats.snapshot()
    }
}

/// The actor (stateless handler; its state is [`LakebaseState`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct LakebaseActor;

/// The actor's state.
#[derive(Debug)]
pub struct LakebaseState {
    verifier: Arc<Verifier>,
    slots: Arc<Semaphore>,
    promotions: Arc<tokio::sync::Mutex<()>>,
}

impl LakebaseActor {
    /// Spawns an unnamed, unsupervised Lakebase actor.
    pub async fn spawn(
        args: LakebaseArgs,
    ) -> Result<(ActorRef<LakebaseMsg>, ractor::concurrency::JoinHandle<()>), SpawnErr> {
        <LakebaseActor as Actor>::spawn(None, LakebaseActor, args).await
    }

    /// Spawns a Lakebase actor linked to `supervisor`.
    pub async fn spawn_linked(
        name: Option<String>,
        args: LakebaseArgs,
        supervisor: ActorCell,
    ) -> Result<(ActorRef<LakebaseMsg>, ractor::concurrency::JoinHandle<()>), SpawnErr> {
        <LakebaseActor as Actor>::spawn_linked(name, LakebaseActor, args, supervisor).await
    }
}

impl Actor for LakebaseActor {
    type Msg = LakebaseMsg;
    type State = LakebaseState;
    type Arguments = LakebaseArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: LakebaseArgs,
    ) -> Result<LakebaseState, ActorProcessingErr> {
        let limit = args.provider.capabilities().max_live_branches;
        let (pool_cfg, concurrent) = fit_to_limit(args.pool.clone(), args.max_concurrent, limit);
        let pool = BranchPool::with_stats(args.provider.clone(), pool_cfg, args.stats);
        let mut verifier = Verifier::new(pool, args.runner, args.fixtures)
            .with_sandbox(args.sandbox)
            .with_shards(args.shards);
        if let Some(tool) = args.migration_tool {
            verifier = verifier.with_migration_tool(tool);
        }
        Ok(LakebaseState {
            verifier: Arc::new(verifier),
            slots: Arc::new(Semaphore::new(concurrent)),
            promotions: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    async fn post_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut LakebaseState,
    ) -> Result<(), ActorProcessingErr> {
        match state.verifier.pool().start().await {
            Ok(n) => debug!(swept = n, "start-up sweep done"),
            Err(e) => warn!(error = %consort_actors::error_chain(&e), "start-up sweep failed"),
        }
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: LakebaseMsg,
        state: &mut LakebaseState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            LakebaseMsg::Verify(req, reply) => {
                let verifier = state.verifier.clone();
                let turn = state.slots.clone().acquire_owned();
                answer(turn, req.id, "verify", reply, async move {
                    verifier.verify(&req).await
                });
            }
            LakebaseMsg::Promote(req, reply) => {
                let verifier = state.verifier.clone();
                let turn = state.promotions.clone().lock_owned();
                answer(turn, req.id, "promote", reply, async move {
                    verifier.promote(&req).await
                });
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut LakebaseState,
    ) -> Result<(), ActorProcessingErr> {
        if let Err(e) = state.verifier.pool().shutdown().await {
            warn!(error = %consort_actors::error_chain(&e), "pool shutdown");
        }
        Ok(())
    }
}

/// Answers request `id` in a task of its own: waits for `turn` (a verification slot or the
/// promotion lock) and holds it while `work` runs, then replies; a caller that went away is
/// only logged (`what` names the request kind).
fn answer<G, T>(
    turn: impl Future<Output = G> + Send + 'static,
    id: RequestId,
    what: &'static str,
    reply: RpcReplyPort<T>,
    work: impl Future<Output = T> + Send + 'static,
) where
    G: Send,
    T: Send + 'static,
{
    tokio::spawn(async move {
        let _turn = turn.await;
        let result = work.await;
        if reply.send(result).is_err() {
            debug!(request = %id, "{what} caller went away");
        }
    });
}

/// The warm branches and the concurrent runs a backend's branch limit leaves room for: one
/// branch is the base, each run holds one, and the warm ones take what is left (at least one
/// run always). Logged when the configuration asked for more.
pub(crate) fn fit_to_limit(
    mut pool: PoolConfig,
    max_concurrent: usize,
    limit: Option<usize>,
) -> (PoolConfig, usize) {
    let mut concurrent = max_concurrent.max(1);
    let Some(limit) = limit else {
        return (pool, concurrent);
    };
    let room = limit.saturating_sub(1).max(1);
    let (asked_runs, asked_warm) = (concurrent, pool.size);
    concurrent = concurrent.min(room);
    pool.size = pool.size.min(room - concurrent);
    if (concurrent, pool.size) != (asked_runs, asked_warm) {
        tracing::info!(
            limit,
            runs = concurrent,
            warm = pool.size,
            "the backend allows {limit} live branches: {concurrent} run(s) at once and {} warm branch(es) besides the base",
            pool.size
        );
    }
    (pool, concurrent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_branches_and_runs_fit_the_backends_limit() {
        let fit = |size, runs, limit| {
            let pool = PoolConfig {
                size,
                ..PoolConfig::default()
            };
            let (p, r) = fit_to_limit(pool, runs, limit);
            (p.size, r)
        };
        assert_eq!(fit(4, 4, None), (4, 4));
        assert_eq!(fit(4, 4, Some(10)), (4, 4), "1 base + 4 + 4 fit in 10");
        assert_eq!(fit(4, 4, Some(6)), (1, 4));
        assert_eq!(fit(4, 8, Some(6)), (0, 5));
        assert_eq!(fit(4, 4, Some(2)), (0, 1), "one run always");
        assert_eq!(fit(0, 0, Some(3)), (0, 1));
    }
}
