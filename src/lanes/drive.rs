//! Driving lanes: up to N features of the backlog at once, each through its own ensemble in its
//! own worktree, sharing one branch provider.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

use consort_actors::{Approver, Progress, RunOutcome, RunReport};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{LaneError, worktree};
use crate::backlog::Feature;
use crate::project::{Project, ProjectError, RunOptions};
use crate::runlock::{RunLock, RunLockError};

/// How to drive lanes.
#[derive(Clone, Default)]
pub struct LaneOptions {
    /// At most this many features at once (0 counts as 1).
    pub parallel: usize,
    /// Only these features (None: every unfinished feature of the backlog, in order).
    pub features: Option<Vec<String>>,
    /// What every lane's run gets: the approver, the agents, budgets, the command its lock
    /// names. Its `progress`, `provider`, `sharing` and `promotion` are the lanes' own.
    pub run: RunOptions,
    /// A feature's own approver, instead of `run.approver`.
    pub approvers: BTreeMap<String, Arc<dyn Approver>>,
    /// Where every lane's progress goes, with its feature's id.
    pub progress: Option<mpsc::UnboundedSender<(String, Progress)>>,
}

impl std::fmt::Debug for LaneOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneOptions")
            .field("parallel", &self.parallel)
            .field("features", &self.features)
            .field("run", &self.run)
            .finish_non_exhaustive()
    }
}

/// How one lane ended in this process.
#[derive(Debug)]
pub struct LaneReport {
    /// Its feature.
    pub feature: String,
    /// The run's report, or why it could not run.
    pub outcome: Result<RunReport, ProjectError>,
    /// Whether its worktree was removed (its feature done or stopped).
    pub removed: bool,
}

/// Drives the project's unfinished features in lanes, up to `opts.parallel` at once: a lane
/// that ends (done, at a gate, halted, failed) frees its place for the next feature. A feature
/// another process drives is passed over. Returns every lane's report, in the order they
/// ended; an empty list when there was nothing to drive.
pub async fn run_lanes(dir: &Path, opts: LaneOptions) -> Result<Vec<LaneReport>, ProjectError> {
    let project = Project::open(dir)?;
    worktree::base_of(&project.dir)?;
    let mut queue: VecDeque<Feature> = VecDeque::new();
    for feature in project.backlog()? {
        if opts
            .features
            .as_ref()
            .is_some_and(|only| !only.contains(&feature.id))
        {
            continue;
        }
        if project.state_of(&feature)?.is_unfinished() {
            queue.push_back(feature);
        } else {
            // A lane a crash left after its feature finished.
            worktree::remove(&project.dir, &feature)?;
        }
    }
    let parallel = opts.parallel.max(1);
    if queue.is_empty() {
        return Ok(Vec::new());
    }
    let provider = project.provider().await?;
    let sharing = parallel.min(queue.len());
    let mut running = JoinSet::new();
    // Which feature each lane's task drives, for the report of a task that panicked.
    let mut tasks = BTreeMap::new();
    let mut reports = Vec::new();
    loop {
        while running.len() < parallel {
            let Some(feature) = queue.pop_front() else {
                break;
            };
            let Some((lane, lock)) = take(&project, &feature, &opts)? else {
                continue;
            };
            let mut run = opts.run.clone();
            run.provider = Some(Arc::clone(&provider));
            run.sharing = sharing;
            run.promotion = Some(super::MergeCheck::new(lane.clone()));
            if let Some(approver) = opts.approvers.get(&feature.id) {
                run.approver = Some(Arc::clone(approver));
            }
            run.progress = opts.progress.clone().map(|tx| tagged(&feature.id, tx));
            // Each lane is a task of its own, so that a panic in it ends that lane only.
            let task = running.spawn(async move {
                let outcome = drive(&lane, lock, run).await;
                (lane, outcome)
            });
            tasks.insert(task.id(), feature.id);
        }
        let Some(ended) = running.join_next_with_id().await else {
            break;
        };
        let id = ended
            .as_ref()
            .map_or_else(|failed| failed.id(), |(id, _)| *id);
        let feature = tasks.remove(&id);
        reports.push(match ended {
            Ok((_, (lane, outcome))) => finish(&lane, outcome),
            Err(failed) => LaneReport {
                feature: feature.unwrap_or_else(|| format!("the lane of task {id}")),
                outcome: Err(ProjectError::Lanes(LaneError::Task {
                    detail: failed.to_string(),
                })),
                removed: false,
            },
        });
    }
    Ok(reports)
}

/// Takes feature's lock and makes its lane; None when another process drives it.
fn take(
    project: &Project,
    feature: &Feature,
    opts: &LaneOptions,
) -> Result<Option<(Project, RunLock)>, ProjectError> {
    let command = opts
        .run
        .command
        .as_deref()
        .unwrap_or("consort run --parallel");
    let at = Project::open_feature(&project.dir, Some(&feature.id))?;
    let lock = match at.lock_feature(command) {
        Ok(lock) => lock,
        Err(ProjectError::RunLock(
            held @ (RunLockError::Held { .. } | RunLockError::HeldByUnnamed { .. }),
        )) => {
            tracing::info!(feature = %feature.id, %held, "passed over: another process drives it");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    worktree::ensure(&project.dir, feature)?;
    let lane = Project::open_feature(&project.dir, Some(&feature.id))?;
    Ok(Some((lane, lock)))
}

/// One lane's run, from its ensemble's start to its shutdown.
async fn drive(lane: &Project, lock: RunLock, run: RunOptions) -> Result<RunReport, ProjectError> {
    let ensemble = lane.ensemble_locked(lock, run).await?;
    let report = ensemble.run().await;
    ensemble.shutdown().await;
    Ok(report?)
}

/// A lane's report; its worktree removed when its feature is finished. A worktree that cannot
/// be removed stays (the next `run_lanes` removes it) and is logged: the lane's outcome stands.
fn finish(lane: &Project, outcome: Result<RunReport, ProjectError>) -> LaneReport {
    let finished = matches!(
        &outcome,
        Ok(RunReport {
            outcome: RunOutcome::Done | RunOutcome::Stopped,
            ..
        })
    );
    let removed = finished
        && worktree::remove(&lane.dir, lane.feature_entry()).unwrap_or_else(|e| {
            tracing::warn!(
                feature = %lane.feature_id(),
                error = %consort_actors::error_chain(&e),
                "the finished lane's worktree stays; the next run removes it"
            );
            false
        });
    LaneReport {
        feature: lane.feature_id().to_string(),
        outcome,
        removed,
    }
}

/// A lane's own progress channel, forwarded to `tx` with its feature's id.
fn tagged(
    feature: &str,
    tx: mpsc::UnboundedSender<(String, Progress)>,
) -> mpsc::UnboundedSender<Progress> {
    let (lane_tx, mut lane_rx) = mpsc::unbounded_channel();
    let feature = feature.to_string();
    tokio::spawn(async move {
        while let Some(p) = lane_rx.recv().await {
            if tx.send((feature.clone(), p)).is_err() {
                break;
            }
        }
    });
    lane_tx
}
