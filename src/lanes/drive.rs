//! Driving lanes: up to N features of the backlog at once, each through its own ensemble in its
//! own worktree, sharing one branch provider.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use consort_actors::{Approver, Progress, RunOutcome, RunReport};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{LaneError, worktree};
use crate::backlog::Feature;
use crate::project::{Project, ProjectError, RunOptions};
use crate::records::{LeaseKeeper, RecordsError, holder_name};
use crate::runlock::{RunLock, RunLockError};

/// The longest a process waiting for features other processes hold sleeps between looks.
const WAIT_POLL: std::time::Duration = std::time::Duration::from_secs(1);

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
/// another process drives is passed over; with the shared store it is taken over once its
/// holder's lease runs out (the holder was killed or cut off), and this process waits for
/// that while such a feature is left. Returns every lane's report, in the order they ended; an
/// empty list when there was nothing to drive.
pub async fn run_lanes(dir: &Path, opts: LaneOptions) -> Result<Vec<LaneReport>, ProjectError> {
    let project = Project::open(dir)?;
    worktree::base_of(&project.dir)?;
    remove_finished(&project, &opts)?;
    let first = candidates(&project, &opts, &BTreeSet::new())?;
    if first.is_empty() {
        return Ok(Vec::new());
    }
    let parallel = opts.parallel.max(1);
    let provider = project.provider().await?;
    let sharing = parallel.min(first.len());
    // Features this process will not take again: each lane that ended here, each passed over.
    let mut passed = BTreeSet::new();
    let mut running = JoinSet::new();
    // Which feature each lane's task drives, for the report of a task that panicked.
    let mut tasks = BTreeMap::new();
    let mut reports = Vec::new();
    // How often a process that waits for features other processes hold looks again: often
    // enough that it ends soon after the last of them is done, and takes one over soon after
    // its holder's lease ran out.
    let poll = project
        .records()
        .lease_time()
        .map(|t| (t / 3).min(WAIT_POLL));
    loop {
        let mut left = Vec::new();
        while running.len() < parallel {
            let mut not_yet = passed.clone();
            not_yet.extend(tasks.values().cloned());
            left = candidates(&project, &opts, &not_yet)?;
            let Some(taken) = take(&project, &left, &opts, &mut passed)? else {
                break;
            };
            let feature = taken.lane.feature_id().to_string();
            let mut run = opts.run.clone();
            run.provider = Some(Arc::clone(&provider));
            run.sharing = sharing;
            run.promotion = Some(super::MergeCheck::new(taken.lane.clone()));
            if let Some(approver) = opts.approvers.get(&feature) {
                run.approver = Some(Arc::clone(approver));
            }
            let progress = opts.progress.clone().map(|tx| (feature.clone(), tx));
            // Each lane is a task of its own, so that a panic in it ends that lane only.
            let task = running.spawn(async move {
                let lane = taken.lane.clone();
                let outcome = drive(taken, run, progress).await;
                (lane, outcome)
            });
            tasks.insert(task.id(), feature);
        }
        let ended = match (running.is_empty(), poll) {
            (true, Some(poll)) if !left.is_empty() => {
                // Every feature left is held by another process: wait for one to be free.
                tokio::time::sleep(poll).await;
                continue;
            }
            (true, _) => break,
            (false, None) => running.join_next_with_id().await,
            (false, Some(poll)) => tokio::select! {
                ended = running.join_next_with_id() => ended,
                () = tokio::time::sleep(poll) => continue,
            },
        };
        let Some(ended) = ended else { break };
        let id = ended
            .as_ref()
            .map_or_else(|failed| failed.id(), |(id, _)| *id);
        let feature = tasks.remove(&id);
        let report = match ended {
            Ok((_, (lane, (outcome, lost)))) => finish(&lane, outcome, lost),
            Err(failed) => LaneReport {
                feature: feature.unwrap_or_else(|| format!("the lane of task {id}")),
                outcome: Err(ProjectError::Lanes(LaneError::Task {
                    detail: failed.to_string(),
                })),
                removed: false,
            },
        };
        passed.insert(report.feature.clone());
        reports.push(report);
    }
    // A lane that ended here unfinished (its hold lost) and was finished elsewhere.
    remove_finished(&project, &opts)?;
    Ok(reports)
}

/// Removes the worktree of each feature `opts` asks for that is finished: one a crash left,
/// or one another process finished after this one's lane ended.
fn remove_finished(project: &Project, opts: &LaneOptions) -> Result<(), ProjectError> {
    let features = project.backlog()?;
    for (feature, state) in features.iter().zip(project.states_of(&features)?) {
        if wanted(opts, feature) && !state.is_unfinished() {
            worktree::remove(&project.dir, feature)?;
        }
    }
    Ok(())
}

/// Whether `opts` asks for `feature` (all when it names none).
fn wanted(opts: &LaneOptions, feature: &Feature) -> bool {
    opts.features
        .as_ref()
        .is_none_or(|only| only.contains(&feature.id))
}

/// The unfinished features of the backlog `opts` asks for, in order, less those in `not`.
fn candidates(
    project: &Project,
    opts: &LaneOptions,
    not: &BTreeSet<String>,
) -> Result<Vec<Feature>, ProjectError> {
    // Other machines' lanes' records first: a feature's state is replayed with its lane's.
    project.records().refresh()?;
    let features: Vec<Feature> = project
        .backlog()?
        .into_iter()
        .filter(|f| wanted(opts, f) && !not.contains(&f.id))
        .collect();
    let states = project.states_of(&features)?;
    Ok(features
        .into_iter()
        .zip(states)
        .filter(|(_, state)| state.is_unfinished())
        .map(|(feature, _)| feature)
        .collect())
}

/// A feature taken: its lane, its lock here, and its lease in the shared store (if kept
/// there), held until the lane's run ends.
struct Taken {
    lane: Project,
    lock: RunLock,
    lease: Option<LeaseKeeper>,
}

/// Takes the first of `candidates` no other process drives, and makes its lane; None when
/// every one is driven. With files, a feature whose lock another process holds is passed over
/// (added to `passed`); with the shared store, the store hands out the first feature no one
/// holds (or whose holder's time ran out), to one taker only.
fn take(
    project: &Project,
    candidates: &[Feature],
    opts: &LaneOptions,
    passed: &mut BTreeSet<String>,
) -> Result<Option<Taken>, ProjectError> {
    let command = opts
        .run
        .command
        .as_deref()
        .unwrap_or("consort run --parallel");
    let records = project.records();
    let (feature, lease) = match (records.store(), records.lease_time()) {
        (Some(store), Some(ttl)) => {
            let ids: Vec<String> = candidates.iter().map(|f| f.id.clone()).collect();
            let Some(lease) = store
                .take_next(&ids, &holder_name(), ttl)
                .map_err(RecordsError::from)?
            else {
                return Ok(None);
            };
            let Some(feature) = candidates.iter().find(|f| f.id == lease.feature) else {
                return Ok(None);
            };
            let lease = records.keep(lease);
            // What the feature's earlier holders recorded (its lane's record, which its state
            // is replayed with) comes first.
            records.refresh()?;
            // Finished between the look and the take (its holder ended and let it go): given
            // back, and not taken again.
            if !project.state_of(feature)?.is_unfinished() {
                passed.insert(feature.id.clone());
                return Ok(None);
            }
            (feature, lease)
        }
        _ => {
            let Some(feature) = candidates.first() else {
                return Ok(None);
            };
            (feature, None)
        }
    };
    let at = project.about(&feature.id)?;
    let lock = match at.lock_feature(command) {
        Ok(lock) => lock,
        Err(ProjectError::RunLock(
            held @ (RunLockError::Held { .. } | RunLockError::HeldByUnnamed { .. }),
        )) => {
            tracing::info!(feature = %feature.id, %held, "passed over: another process drives it");
            passed.insert(feature.id.clone());
            let rest: Vec<Feature> = candidates[1..].to_vec();
            return match lease {
                // Another process of this checkout drives it (not through the store).
                Some(_) => Ok(None),
                None => take(project, &rest, opts, passed),
            };
        }
        Err(e) => return Err(e),
    };
    worktree::ensure(&project.dir, feature, project.remote().as_ref())?;
    records.share_file(feature, "lane.json")?;
    let mut lane = project.about(&feature.id)?;
    if let Some(keeper) = &lease {
        lane = lane.with_lease(keeper.lease().clone());
    }
    Ok(Some(Taken { lane, lock, lease }))
}

/// One lane's run, from its ensemble's start to its shutdown, and whether its hold on the
/// feature was lost meanwhile (another process took it over); its lease (if any) is given up
/// after.
async fn drive(
    taken: Taken,
    run: RunOptions,
    progress: Option<(String, mpsc::UnboundedSender<(String, Progress)>)>,
) -> (Result<RunReport, ProjectError>, bool) {
    let Taken { lane, lock, lease } = taken;
    let outcome = async {
        let ensemble = lane.ensemble_locked(lock, run).await?;
        if let Some((feature, tx)) = progress {
            tokio::spawn(tagged(feature, ensemble.subscribe(), tx));
        }
        let report = ensemble.run().await;
        ensemble.shutdown().await;
        Ok(report?)
    }
    .await;
    let lost = lease.is_some() && !lane.still_holds();
    drop(lease);
    (outcome, lost)
}

/// A lane's report; its worktree removed when its feature is finished, or when another process
/// took the feature over (`lost`: the lane is that process's now, on its machine). A worktree
/// that cannot be removed stays (the next `run_lanes` removes it) and is logged: the lane's
/// outcome stands.
fn finish(lane: &Project, outcome: Result<RunReport, ProjectError>, lost: bool) -> LaneReport {
    let finished = matches!(
        &outcome,
        Ok(RunReport {
            outcome: RunOutcome::Done | RunOutcome::Stopped,
            ..
        })
    );
    let removed = (finished || lost)
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

/// A lane's progress, read from its ensemble's event stream (the one source every reader
/// shares), forwarded to `tx` with its feature's id until the stream or `tx` ends. A report the
/// forwarder fell behind on is skipped (the ledger has the entries).
async fn tagged(
    feature: String,
    mut events: tokio::sync::broadcast::Receiver<consort_actors::RunEvent>,
    tx: mpsc::UnboundedSender<(String, Progress)>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match events.recv().await {
            Ok(consort_actors::RunEvent::Progress(p)) => {
                if tx.send((feature.clone(), p)).is_err() {
                    break;
                }
            }
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => break,
        }
    }
}
