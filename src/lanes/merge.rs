//! A lane's merge check: before its migrations reach the parent database, its branch is merged
//! with what reached the base since the lane started, in a scratch worktree, and the tests of
//! every merged feature run there on a fresh branch; only then does the base advance and the
//! promotion go on.
//!
//! **Invariant:** the check and the promotion hold `.consort/merge.lock`, so lanes (of this
//! process or another) merge and promote one at a time, in one order for git and the parent
//! database. A refusal names both sides: the lane's feature and the merged one it meets.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use consort_actors::{
    BoxFuture, EarlierTest, InfraError, InfraFault, Inherited, LakebaseEndpoint, MergeCheckRun,
    PromoteReport, PromoteRequest, RequestId, TestStatus, VerifyPurpose, VerifyRequest, WorkTree,
};

use super::worktree::{LaneRecord, ScratchLane};
use crate::backlog::{Feature, FeatureState};
use crate::ensemble::Promotion;
use crate::git::{GitRepo, branch_name};
use crate::project::Project;
use crate::runlock::{LockScope, RunLock, RunLockError};

/// The merge lock, relative to the project.
const MERGE_LOCK: &str = ".consort/merge.lock";
/// How often a lane looks whether another lane's merge is over.
const LOCK_POLL: Duration = Duration::from_millis(25);
/// The request ids of merge checks (far from a run's own and from scratch runs').
const MERGE_IDS: u64 = 1 << 61;
/// How many times a merge check is made again when the remote's base moved meanwhile.
const MERGE_ATTEMPTS: usize = 5;

/// The promotion of a lane's feature, behind its merge check.
#[derive(Debug)]
pub struct MergeCheck {
    project: Project,
}

impl MergeCheck {
    /// The merge check of the lane `project` is about.
    pub fn new(project: Project) -> Arc<Self> {
        Arc::new(MergeCheck { project })
    }
}

impl Promotion for MergeCheck {
    fn promote<'a>(
        &'a self,
        request: PromoteRequest,
        lakebase: &'a dyn LakebaseEndpoint,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<PromoteReport, InfraError>> {
        Box::pin(async move {
            let locks = merge_lock(&self.project, timeout).await?;
            for _ in 0..MERGE_ATTEMPTS {
                let project = self.project.clone();
                let migrations = request.migrations.clone();
                let plan = blocking(move || integrate(&project, &migrations)).await?;
                let mut checked = None;
                if let Some(tree) = &plan.tree {
                    checked = Some(
                        regression(&self.project, tree, &plan, &request, lakebase, timeout).await?,
                    );
                }
                let project = self.project.clone();
                let (commit, base, seen) =
                    (plan.commit.clone(), plan.base.clone(), plan.seen.clone());
                locks.check().await?;
                if !blocking(move || advance(&project, &base, &commit, seen.as_ref())).await? {
                    tracing::info!(feature = %self.project.feature_id(), "the remote's base moved during the merge check; checking again");
                    continue;
                }
                drop(plan);
                locks.check().await?;
                let project = self.project.clone();
                if !blocking(move || Ok(project.still_holds())).await? {
                    return Err(refused(
                        "this process no longer holds the feature (a person's decision or another process ended its lease); nothing was promoted".into(),
                    ));
                }
                let mut report = lakebase.promote(request, timeout).await?;
                report.merge_check = checked;
                return Ok(report);
            }
            Err(refused(format!(
                "the remote's base {} moved during each of {MERGE_ATTEMPTS} merge checks; run again to check once more",
                base_name(&self.project)
            )))
        })
    }
}

/// The merge locks a lane holds while it merges and promotes: this checkout's, and with the
/// shared store the project's on every machine (given back when dropped).
struct MergeLocks {
    _here: RunLock,
    shared: Option<Arc<consort_lakebase::store::StoreHandle>>,
}

impl MergeLocks {
    /// Refuses to go on when the shared merge lock went with a lost connection to the store:
    /// another machine may be merging now, so this one pushes and promotes nothing.
    async fn check(&self) -> Result<(), InfraError> {
        let Some(store) = self.shared.clone() else {
            return Ok(());
        };
        let intact = blocking(move || {
            store
                .merge_lock_intact()
                .map_err(|e| infra(InfraFault::DatabaseDown, consort_actors::error_chain(&e)))
        })
        .await?;
        if intact {
            Ok(())
        } else {
            Err(refused(
                "the connection to the store that held the project's merge lock was lost, and the lock with it; nothing was pushed or promoted (run again to merge)".into(),
            ))
        }
    }
}

impl Drop for MergeLocks {
    fn drop(&mut self) {
        if let Some(store) = &self.shared
            && let Err(e) = store.merge_unlock()
        {
            tracing::warn!(error = %consort_actors::error_chain(&e), "the shared merge lock could not be given back; it goes with this process's connection");
        }
    }
}

/// Takes the merge locks, waiting for another lane's merge to end (at most `timeout`).
async fn merge_lock(project: &Project, timeout: Duration) -> Result<MergeLocks, InfraError> {
    let started = Instant::now();
    let path = project.dir.join(MERGE_LOCK);
    let here = loop {
        match RunLock::acquire_at(path.clone(), LockScope::Merges, "a lane's merge check") {
            Ok(lock) => break lock,
            Err(RunLockError::Held { .. } | RunLockError::HeldByUnnamed { .. })
                if started.elapsed() < timeout =>
            {
                tokio::time::sleep(LOCK_POLL).await;
            }
            Err(e) => return Err(infra(InfraFault::WorkTreeIo, e.to_string())),
        }
    };
    let Some(store) = project.records().store() else {
        return Ok(MergeLocks {
            _here: here,
            shared: None,
        });
    };
    loop {
        let store = Arc::clone(store);
        let taken = blocking({
            let store = Arc::clone(&store);
            move || {
                store
                    .try_merge_lock()
                    .map_err(|e| infra(InfraFault::DatabaseDown, consort_actors::error_chain(&e)))
            }
        })
        .await?;
        if taken {
            return Ok(MergeLocks {
                _here: here,
                shared: Some(store),
            });
        }
        if started.elapsed() >= timeout {
            return Err(infra(
                InfraFault::Timeout,
                "another machine's lane held the project's merge lock for longer than the step may take".into(),
            ));
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
}

/// What the check found to merge: the commit the base advances to, and the scratch worktree
/// that holds the merge when there is one to test (removed when dropped).
struct Integration {
    base: String,
    commit: String,
    tree: Option<ScratchLane>,
    /// Every accepted test of the merged features and the lane's, by feature.
    tests: Vec<EarlierTest>,
    /// The features whose work reached the base since the lane started, in backlog order.
    merged: Vec<String>,
    /// The merged features' promoted migrations: the parent holds them, and a run's base
    /// names them so that it is made from the parent as it is now, not as it was when a pool
    /// or a template of the lane's own migrations was made.
    merged_migrations: Vec<consort_actors::Migration>,
    /// With a remote: the remote's base as fetched (None: it had none), which the push of the
    /// merge expects to find still there.
    seen: Option<Option<String>>,
}

/// Merges the lane's branch with its base in a scratch worktree.
fn integrate(
    project: &Project,
    migrations: &[consort_actors::Migration],
) -> Result<Integration, InfraError> {
    let io = |e: &dyn std::fmt::Display| infra(InfraFault::WorkTreeIo, e.to_string());
    let record = LaneRecord::read(&project.dir, project.feature_entry())
        .map_err(|e| io(&consort_actors::error_chain(&e)))?
        .ok_or_else(|| io(&"the lane has no record (lane.json)"))?;
    let repo =
        GitRepo::detect(&project.dir).ok_or_else(|| io(&"the project left its git repository"))?;
    project
        .git_sync()
        .map_err(|e| io(&consort_actors::error_chain(&e)))?;
    let remote = project.remote();
    let seen = match &remote {
        Some(remote) => Some(fetched_base(project, remote, &record.base)?),
        None => None,
    };
    let rev = |r: &str| repo.rev(r).ok().flatten();
    let id = project.feature_id();
    let base_tip = rev(&format!("refs/heads/{}", record.base))
        .ok_or_else(|| refused(format!("its base branch {} is gone", record.base)))?;
    let lane_tip = rev(&format!("refs/heads/{}", branch_name(id)))
        .ok_or_else(|| io(&format!("branch {} is gone", branch_name(id))))?;
    let ancestor = |a: &str, b: &str| {
        repo.git(&["merge-base", "--is-ancestor", a, b], None)
            .is_ok()
    };
    let mut plan = Integration {
        base: record.base.clone(),
        commit: lane_tip.clone(),
        tree: None,
        tests: Vec::new(),
        merged: Vec::new(),
        merged_migrations: Vec::new(),
        seen,
    };
    if ancestor(&lane_tip, &base_tip) {
        // Merged already (a crash came between the merge and the promotion).
        plan.commit = base_tip;
        return Ok(plan);
    }
    if ancestor(&base_tip, &lane_tip) {
        return Ok(plan);
    }
    let merged = merged_features(project, &repo, remote.as_ref(), (&base_tip, &lane_tip))?;
    plan.merged_migrations = clashes_with_merged(project, &merged, migrations)?;
    let tree = scratch_tree(project, &base_tip)?;
    merge_in(&tree, project, &repo, &merged, (&base_tip, &lane_tip))?;
    plan.commit = head_of(&tree)?;
    plan.tests = tests_of(project, &merged)?;
    plan.merged = merged.iter().map(|p| p.feature_id().to_string()).collect();
    plan.tree = Some(tree);
    Ok(plan)
}

/// The features whose branches reached the base and not the lane, in backlog order, with where
/// each stands.
fn merged_features(
    project: &Project,
    repo: &GitRepo,
    remote: Option<&crate::git::Remote>,
    (base_tip, lane_tip): (&str, &str),
) -> Result<Vec<Project>, InfraError> {
    let io = |e: crate::project::ProjectError| {
        infra(InfraFault::WorkTreeIo, consort_actors::error_chain(&e))
    };
    let mut out = Vec::new();
    for feature in project.backlog().map_err(io)? {
        if feature.id == project.feature_id() {
            continue;
        }
        // A feature another machine drove has its branch here only as the remote's.
        let Some(tip) = repo
            .tip(&feature.id)
            .or_else(|| remote.and_then(|r| r.lane_tip(&feature.id)))
        else {
            continue;
        };
        let reached = |to: &str| {
            repo.git(&["merge-base", "--is-ancestor", &tip, to], None)
                .is_ok()
        };
        if reached(base_tip) && !reached(lane_tip) {
            let other = Project::open_feature(&project.dir, Some(&feature.id)).map_err(io)?;
            if other.state_of(&feature).map_err(io)? == FeatureState::Done {
                out.push(other);
            }
        }
    }
    Ok(out)
}

/// Refuses a lane whose migrations take a version of a merged feature's migrations (a
/// database records each version once), or create, alter or drop an object those migrations
/// touch; returns the merged features' migrations.
fn clashes_with_merged(
    project: &Project,
    merged: &[Project],
    migrations: &[consort_actors::Migration],
) -> Result<Vec<consort_actors::Migration>, InfraError> {
    // The lane's own are its design's: the project's existing migrations, which the promotion
    // carries too, are every lane's and were no feature's change.
    let design = ledger_state(project)?
        .schema
        .map(|plan| {
            plan.migrations
                .iter()
                .map(|m| m.version.clone())
                .collect::<BTreeSet<String>>()
        })
        .unwrap_or_default();
    let migrations: Vec<&consort_actors::Migration> = migrations
        .iter()
        .filter(|m| design.contains(&m.version))
        .collect();
    let mut all = Vec::new();
    let ours: BTreeSet<String> = migrations
        .iter()
        .flat_map(|m| super::objects::touched(&m.sql))
        .collect();
    for other in merged {
        let inherited = inheritance(other, other.feature_entry())?;
        for theirs in &inherited.migrations {
            let version = &theirs.migration.version;
            if migrations.iter().any(|m| &m.version == version) {
                return Err(refused(format!(
                    "its migration {version} has the version of feature {}'s migration {version} (merged since this lane started), and a database records each version once; stop this feature (`consort stop --feature {}`) and add its request again, for a design whose migrations take other versions",
                    other.feature_id(),
                    project.feature_id()
                )));
            }
            let meet: Vec<String> = super::objects::touched(&theirs.migration.sql)
                .intersection(&ours)
                .cloned()
                .collect();
            if !meet.is_empty() {
                return Err(refused(format!(
                    "its migrations and feature {}'s migration {} (merged since this lane started) both change {}; give the change to one feature, or retire one, then retry (`consort retry --feature {}`)",
                    other.feature_id(),
                    theirs.migration.version,
                    meet.join(", "),
                    project.feature_id()
                )));
            }
            all.push(theirs.migration.clone());
        }
    }
    Ok(all)
}

/// A project's records that could not be read, as the merge's infrastructure fault.
fn records_fault(e: crate::project::ProjectError) -> InfraError {
    infra(InfraFault::WorkTreeIo, consort_actors::error_chain(&e))
}

/// The state of `project`'s feature, as its ledger has it.
fn ledger_state(project: &Project) -> Result<consort_actors::State, InfraError> {
    project.state().map_err(records_fault)
}

/// What `feature`'s ledger says it accepted and promoted.
fn inheritance(project: &Project, feature: &Feature) -> Result<Inherited, InfraError> {
    let state = ledger_state(project)?;
    let machine = project.machine().map_err(records_fault)?;
    let mut inherited = Inherited::default();
    crate::backlog::inherit(
        &mut inherited,
        &feature.id,
        &state,
        machine.config().migration_files.as_ref(),
    );
    Ok(inherited)
}

/// The accepted tests of the merged features and of the lane.
fn tests_of(project: &Project, merged: &[Project]) -> Result<Vec<EarlierTest>, InfraError> {
    let mut tests = Vec::new();
    for p in merged.iter().chain(std::iter::once(project)) {
        tests.extend(inheritance(p, p.feature_entry())?.tests);
    }
    Ok(tests)
}

/// Merges the lane's branch into the scratch tree (at the base's tip); a conflict is refused
/// with the files and the merged features that changed them.
fn merge_in(
    tree: &ScratchLane,
    project: &Project,
    repo: &GitRepo,
    merged: &[Project],
    (base_tip, lane_tip): (&str, &str),
) -> Result<(), InfraError> {
    let id = project.feature_id();
    let in_tree = GitRepo::detect(tree.root()).ok_or_else(|| {
        infra(
            InfraFault::WorkTreeIo,
            "the merge worktree is not a repository".into(),
        )
    })?;
    let message = format!(
        "Merge feature {id} into {}\n\nConsort-Feature: {id}",
        base_name(project)
    );
    let ident = crate::git::conductor_identity();
    if in_tree
        .git_env(
            &["merge", "--no-ff", "-q", "-m", &message, lane_tip],
            &ident,
            None,
        )
        .is_ok()
    {
        return Ok(());
    }
    let files = in_tree
        .git(&["diff", "--name-only", "-z", "--diff-filter=U"], None)
        .unwrap_or_default();
    let files: Vec<&str> = files.split('\0').filter(|l| !l.is_empty()).collect();
    let _ = in_tree.git(&["merge", "--abort"], None);
    let mut args = vec![
        "log",
        "--format=%(trailers:key=Consort-Feature,valueonly=true)",
    ];
    let range = format!("{lane_tip}..{base_tip}");
    args.push(&range);
    args.push("--");
    args.extend(files.iter().copied());
    let others: BTreeSet<String> = repo
        .git(&args, None)
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != id)
        .map(str::to_string)
        .collect();
    let others = if others.is_empty() {
        merged
            .iter()
            .map(|p| p.feature_id().to_string())
            .collect::<Vec<_>>()
    } else {
        others.into_iter().collect()
    };
    Err(refused(format!(
        "its branch {} conflicts with {} (merged since this lane started) in {}; merge the base into the lane's worktree ({}) and resolve them, then retry (`consort retry --feature {id}`)",
        branch_name(id),
        if others.is_empty() {
            "the base".to_string()
        } else {
            format!("feature {}", others.join(", feature "))
        },
        files.join(", "),
        project.work_tree().display(),
    )))
}

/// Runs every merged feature's tests and the lane's on the merge, on a fresh branch with the
/// lane's migrations; any that does not pass refuses the lane, naming the test and its feature.
/// The run that passed is returned, for the promotion's record.
async fn regression(
    project: &Project,
    tree: &ScratchLane,
    plan: &Integration,
    request: &PromoteRequest,
    lakebase: &dyn LakebaseEndpoint,
    timeout: Duration,
) -> Result<MergeCheckRun, InfraError> {
    let io = |e: &dyn std::fmt::Display| infra(InfraFault::WorkTreeIo, e.to_string());
    let machine = project
        .machine()
        .map_err(|e| io(&consort_actors::error_chain(&e)))?;
    let filter = machine.config().paths.tree_filter().clone();
    let work_tree = tree.work_tree();
    let hash = {
        let work_tree = work_tree.clone();
        let filter = filter.clone();
        blocking(move || {
            WorkTree::open(&work_tree)
                .map(|w| w.with_filter(filter))
                .and_then(|w| w.hash())
                .map_err(|e| io(&consort_actors::error_chain(&e)))
        })
        .await?
    };
    let verify = VerifyRequest {
        id: RequestId(MERGE_IDS + request.id.0),
        purpose: VerifyPurpose::Deploy,
        work_tree,
        workspace_hash: hash,
        files: None,
        migrations: plan
            .merged_migrations
            .iter()
            .chain(&request.migrations)
            .cloned()
            .collect(),
        tests: plan.tests.iter().map(|t| t.runner_name.clone()).collect(),
        focus: None,
        caches: filter.extra().to_vec(),
        hidden: super::hidden_from_lane(project),
        select: Vec::new(),
        quarantined: Vec::new(),
        harness: Some(project.config.harness().hash()),
        tool_records: Vec::new(),
    };
    let merged_with = plan.merged.clone();
    tracing::info!(
        feature = %project.feature_id(),
        tests = plan.tests.len(),
        merged_with = %merged_with.join(", "),
        "merge check: running the accepted tests on the merged tree"
    );
    let receipt = lakebase.verify(verify, timeout).await?;
    let failing: Vec<String> = plan
        .tests
        .iter()
        .filter(|t| {
            !receipt
                .outcomes
                .iter()
                .any(|o| o.name == t.runner_name && o.status == TestStatus::Passed)
        })
        .map(|t| {
            let said = receipt
                .outcomes
                .iter()
                .find(|o| o.name == t.runner_name)
                .and_then(|o| o.message.as_deref())
                .map(|m| format!(": {}", m.chars().take(200).collect::<String>()))
                .unwrap_or_default();
            format!("{} ({}){said}", t.runner_name, t.feature)
        })
        .collect();
    if failing.is_empty() {
        tracing::info!(feature = %project.feature_id(), request = receipt.request_id.0, "merge check passed");
        return Ok(MergeCheckRun {
            merged_with,
            receipt: Box::new(receipt),
        });
    }
    Err(refused(format!(
        "merged with what reached the base since this lane started, {} of the accepted tests do not pass: {}; fix the lane (its worktree is {}) or retire the test, then retry (`consort retry --feature {}`)",
        failing.len(),
        failing.join("; "),
        project.work_tree().display(),
        project.feature_id()
    )))
}

/// Moves the base to `commit`: the project's tree follows when it is on the base (a
/// fast-forward), else the branch alone moves, from the tip the check saw.
/// Fetches the remote's base and every lane's branch; the base here is brought up to the
/// remote's when it is behind. Returns the remote's base tip (None: it has no such branch).
fn fetched_base(
    project: &Project,
    remote: &crate::git::Remote,
    base: &str,
) -> Result<Option<String>, InfraError> {
    let io =
        |e: crate::git::GitError| infra(InfraFault::WorkTreeIo, consort_actors::error_chain(&e));
    remote.fetch_lanes().map_err(io)?;
    let Some(tip) = remote.fetch(base).map_err(io)? else {
        return Ok(None);
    };
    let repo = GitRepo::detect(&project.dir)
        .ok_or_else(|| refused("the project left its git repository".into()))?;
    let behind = repo
        .git(
            &[
                "merge-base",
                "--is-ancestor",
                &format!("refs/heads/{base}"),
                &tip,
            ],
            None,
        )
        .is_ok();
    if behind {
        move_base(&repo, base, &tip)?;
    }
    Ok(Some(tip))
}

/// Moves the base to the merge's commit: with a remote, first there, and only if the
/// remote's base is still what the check fetched (`seen`); false when it moved meanwhile, and
/// nothing moved.
fn advance(
    project: &Project,
    base: &str,
    commit: &str,
    seen: Option<&Option<String>>,
) -> Result<bool, InfraError> {
    let repo = GitRepo::detect(&project.dir).ok_or_else(|| {
        infra(
            InfraFault::WorkTreeIo,
            "the project left its git repository".into(),
        )
    })?;
    if let (Some(remote), Some(seen)) = (project.remote(), seen) {
        if !project.still_holds() {
            return Err(refused(
                "this process no longer holds the feature (another took it over); nothing was pushed".into(),
            ));
        }
        // The lane's branch first, so the base never holds a commit the remote lacks a branch of.
        let pushed = remote
            .push_lane(project.feature_id(), || project.still_holds())
            .and_then(|()| remote.push_base(base, commit, seen.as_deref()))
            .map_err(|e| {
                refused(format!(
                    "the merge could not be pushed to the remote's {base}: {}",
                    consort_actors::error_chain(&e)
                ))
            })?;
        if !pushed {
            return Ok(false);
        }
    }
    move_base(&repo, base, commit)?;
    Ok(true)
}

/// Moves the branch `base` here to `commit` (a fast-forward when the project's tree is on it).
fn move_base(repo: &GitRepo, base: &str, commit: &str) -> Result<(), InfraError> {
    let on_base = repo.current_branch().is_ok_and(|b| b == base);
    let done = if on_base {
        repo.git(&["merge", "--ff-only", "-q", commit], None)
    } else {
        repo.git(&["branch", "-f", base, commit], None)
    };
    done.map(|_| ()).map_err(|e| {
        refused(format!(
            "the base {base} could not take the merge: {}",
            consort_actors::error_chain(&e)
        ))
    })
}

/// The merge's scratch tree: a throwaway lane at the base's tip, named after the feature.
fn scratch_tree(project: &Project, at: &str) -> Result<ScratchLane, InfraError> {
    // `+` is in no lane's name (see `backlog::lane_name`).
    let name = format!("{}+merge", crate::backlog::lane_name(project.feature_id()));
    ScratchLane::make(&project.dir, &name, at)
        .map_err(|e| infra(InfraFault::WorkTreeIo, consort_actors::error_chain(&e)))
}

/// The commit the merge made in its scratch tree.
fn head_of(tree: &ScratchLane) -> Result<String, InfraError> {
    GitRepo::detect(tree.root())
        .and_then(|r| r.rev("HEAD").ok().flatten())
        .ok_or_else(|| infra(InfraFault::WorkTreeIo, "the merge has no commit".into()))
}

/// The name of the branch the lane merges into, for people.
fn base_name(project: &Project) -> String {
    LaneRecord::read(&project.dir, project.feature_entry())
        .ok()
        .flatten()
        .map_or_else(|| "the base".into(), |r| r.base)
}

fn infra(fault: InfraFault, detail: String) -> InfraError {
    InfraError { fault, detail }
}

fn refused(detail: String) -> InfraError {
    infra(InfraFault::MergeRefused, format!("merge check: {detail}"))
}

/// Runs blocking git and file work off the runtime's workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, InfraError> + Send + 'static,
) -> Result<T, InfraError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        infra(
            InfraFault::InvariantBroken,
            format!("a merge task failed: {e}"),
        )
    })?
}
