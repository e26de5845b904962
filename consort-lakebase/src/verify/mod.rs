//! One verification: fresh branch of the right base, real test run, receipt. And promotion.
//!
//! This is the only place that builds [`TestRunReceipt`]s. The receipt's workspace hash is
//! computed here from the work tree as it is when the run starts (never copied from the
//! request), so a receipt always says what was really tested.
//!
//! The tree is hashed before and after every run through a handle the verifier keeps per root
//! ([`KeptTrees`]), so each hash reads only the files whose stat changed (the work tree's stat
//! cache, exact: see `consort-actors/src/worktree/cache.rs`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use std::path::{Path, PathBuf};

use consort_actors::TreeFilter;
use consort_actors::{
    ContentHash, FileHashes, InfraError, InfraFault, PromoteReport, PromoteRequest, RunTimings,
    TestRunReceipt, TestStatus, VerifyPurpose, VerifyRequest, WorkTree, WorkTreeError,
};
use tracing::info;

mod sharded;
mod shards;
mod tool;

pub use shards::Shards;

use crate::error::Error;
use crate::pool::{Acquired, BranchPool};
use crate::provider::{BaseSpec, BranchProvider, ConnectInfo};
use crate::runner::{RunContext, RunReport, SandboxMode, SessionSettings, TestRunner};

/// Runs verifications and promotions over a pool and a runner.
#[derive(Debug, Clone)]
pub struct Verifier {
    pool: BranchPool,
    runner: Arc<dyn TestRunner>,
    fixtures: Vec<String>,
    sandbox: SandboxMode,
    trees: KeptTrees,
    shards: Shards,
    costs: Arc<Mutex<shards::Costs>>,
    tool: Option<Arc<crate::migrate::MigrationTool>>,
}

/// Most work trees whose hash caches a verifier keeps: the project's tree, and the last few
/// scratch copies (each a fresh temporary directory, hashed by one request and then gone).
const KEPT_TREES: usize = 4;

/// The work trees a verifier has hashed, the most recent first, each handle with its hash
/// cache; shared by the verifier's clones. At most [`KEPT_TREES`]; a root that no longer
/// exists is dropped.
#[derive(Debug, Clone, Default)]
struct KeptTrees(Arc<Mutex<VecDeque<WorkTree>>>);

impl KeptTrees {
    /// A handle on `root` with `filter`: the kept one (its cache warm) when a handle on the
    /// same canonical root is kept, otherwise a new one, kept from now on. Blocking: opens
    /// the tree as [`WorkTree::open`] does.
    fn open(&self, root: &Path, filter: TreeFilter) -> Result<WorkTree, WorkTreeError> {
        let fresh = WorkTree::open(root)?;
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.retain(|t| t.root().exists());
        let tree = match kept.iter().position(|t| t.root() == fresh.root()) {
            Some(i) => kept.remove(i).unwrap_or(fresh),
            None => fresh,
        };
        kept.push_front(tree.clone());
        kept.truncate(KEPT_TREES);
        Ok(tree.with_filter(filter))
    }
}

/// One verification's run as both ways of running it need it: the request, the tree before,
/// its hash, and when the run began.
struct Run<'a> {
    req: &'a VerifyRequest,
    before: &'a Snapshot,
    workspace_hash: ContentHash,
    started: Instant,
}

/// Whether a report holds a failure (a test failed or errored, or the command did not succeed).
fn is_failing(report: &RunReport) -> bool {
    !report.exit.success() || report.outcomes.iter().any(|o| o.is_failure())
}

/// The database stopped answering while these tests ran: its fault, not theirs.
fn lost_database(sessions: &[String]) -> InfraError {
    infra(
        InfraFault::DatabaseDown,
        format!(
            "the database stopped answering while {} ran",
            sessions.join(", ")
        ),
    )
}

/// A receipt, or one to repeat when sessions broke off with the database up.
fn attempt(receipt: TestRunReceipt, lost: Vec<String>) -> Attempt {
    if lost.is_empty() {
        Attempt::Receipt(Box::new(receipt))
    } else {
        Attempt::SessionsLost(Done {
            receipt: Box::new(receipt),
            lost,
        })
    }
}

/// What one run on one branch came to.
enum Attempt {
    /// A receipt to return.
    Receipt(Box<TestRunReceipt>),
    /// Sessions broke off while the database stayed up: repeat once, then it is the verdict.
    SessionsLost(Done),
}

impl Attempt {
    fn receipt_mut(&mut self) -> &mut TestRunReceipt {
        match self {
            Attempt::Receipt(receipt) | Attempt::SessionsLost(Done { receipt, .. }) => receipt,
        }
    }
}

struct Done {
    receipt: Box<TestRunReceipt>,
    lost: Vec<String>,
}

/// The tree as a run can see it: every file's hash (caches left out) and the caches present.
struct Snapshot {
    files: FileHashes,
    cache_dirs: Vec<PathBuf>,
}

/// The tree before a run: the files' hashes and the caches the run may write.
async fn snapshot(
    trees: &KeptTrees,
    root: &Path,
    filter: TreeFilter,
) -> Result<Snapshot, InfraError> {
    in_tree(trees, root, filter, |tree| {
        Ok(Snapshot {
            files: tree.file_hashes()?,
            cache_dirs: tree.cache_dirs()?,
        })
    })
    .await
}

/// The files' hashes after a run.
async fn hashes_after(
    trees: &KeptTrees,
    root: &Path,
    filter: TreeFilter,
) -> Result<FileHashes, InfraError> {
    in_tree(trees, root, filter, |tree| tree.file_hashes()).await
}

/// Runs `read` on the work tree (the handle `trees` keeps for it) on a blocking thread.
async fn in_tree<T: Send + 'static>(
    trees: &KeptTrees,
    root: &Path,
    filter: TreeFilter,
    read: impl FnOnce(&WorkTree) -> Result<T, consort_actors::WorkTreeError> + Send + 'static,
) -> Result<T, InfraError> {
    let root = root.to_path_buf();
    let trees = trees.clone();
    let io = |e: String| {
        infra(
            InfraFault::WorkTreeIo,
            format!("reading the work tree: {e}"),
        )
    };
    tokio::task::spawn_blocking(move || {
        let tree = trees
            .open(&root, filter)
            .map_err(|e| consort_actors::error_chain(&e))?;
        read(&tree).map_err(|e| consort_actors::error_chain(&e))
    })
    .await
    .map_err(|e| io(e.to_string()))?
    .map_err(io)
}

/// The paths whose content differs between two snapshots (added, removed or changed).
fn changed_paths(before: &FileHashes, after: &FileHashes) -> Vec<String> {
    let mut out: Vec<String> = before
        .iter()
        .filter(|(p, h)| after.get(*p) != Some(h))
        .map(|(p, _)| p.clone())
        .collect();
    out.extend(after.keys().filter(|p| !before.contains_key(*p)).cloned());
    out.sort();
    out
}

/// The tests of `receipt` that failed though they were green before the request's step: every
/// failing test but the focus (the current entry's), leaving out the runner's stand-ins for
/// the whole run, such as `(exit)`.
fn earlier_green_failures(req: &VerifyRequest, receipt: &TestRunReceipt) -> Vec<String> {
    receipt
        .outcomes
        .iter()
        .filter(|o| o.is_failure() && Some(&o.name) != req.focus.as_ref())
        .filter(|o| !o.name.starts_with('('))
        .map(|o| o.name.clone())
        .collect()
}

/// A runner that could not run: the database's fault when it lost its connection, the work
/// tree's when it could not read it, the runner's otherwise.
fn runner_fault(e: &Error) -> InfraError {
    let fault = match e {
        Error::Connect(_) | Error::Connection { .. } => InfraFault::DatabaseDown,
        Error::Io { .. } => InfraFault::WorkTreeIo,
        Error::TestCommand { .. } => e.infra_fault(),
        _ => InfraFault::RunnerFailed,
    };
    infra(
        fault,
        format!("running the tests: {}", consort_actors::error_chain(e)),
    )
}

fn infra(fault: InfraFault, detail: impl Into<String>) -> InfraError {
    InfraError {
        fault,
        detail: detail.into(),
    }
}

/// Whether an error is a fault of the migrations a base is built from (a failing statement, a
/// version recorded with other SQL, an unusable plan) rather than of the database.
fn is_work_fault(e: &Error) -> bool {
    matches!(
        e,
        Error::Migration { .. }
            | Error::MigrationTool { .. }
            | Error::ChecksumMismatch { .. }
            | Error::InvalidPlan(_)
    )
}

/// The base of a run could not be built from its migrations, so no test ran: never a receipt
/// (a RED would count a test that never ran as failing, a GREEN would charge the Driver for
/// SQL it cannot change), but a halt that names the migration and the server's error. The
/// design's migrations are frozen, so no agent can repair them: a person can (prepare the
/// database, or stop the feature and request it again with another design).
fn base_not_built(e: &Error) -> InfraError {
    infra(
        InfraFault::MigrationFailed,
        format!(
            "no test ran: the database branch could not be built: {}. No agent can change the approved design's migrations: if the database lacks a privilege, an extension or a schema the migration needs, prepare it and `consort retry`; if the migration itself is wrong, `consort stop` the feature and request it again",
            consort_actors::error_chain(e)
        ),
    )
}

impl Verifier {
    /// A verifier; `fixtures` are SQL run into every base after its migrations.
    pub fn new(pool: BranchPool, runner: Arc<dyn TestRunner>, fixtures: Vec<String>) -> Self {
        Verifier {
            pool,
            runner,
            fixtures,
            sandbox: SandboxMode::default(),
            trees: KeptTrees::default(),
            shards: Shards::OFF,
            costs: Arc::default(),
            tool: None,
        }
    }

    /// Has the project's migration `tool` apply the migrations on every branch (and at
    /// promotion, on the parent) instead of Consort: a base is then the parent and the
    /// fixtures only (see `verify/tool.rs`).
    pub fn with_migration_tool(mut self, tool: crate::migrate::MigrationTool) -> Self {
        self.tool = Some(Arc::new(tool));
        self
    }

    /// Splits suites over branches as `shards` says (whole, in one process, unless changed).
    pub fn with_shards(mut self, shards: Shards) -> Self {
        self.shards = shards;
        self
    }

    /// Confines runs as `mode` says ([`SandboxMode::Landlock`] unless changed).
    pub fn with_sandbox(mut self, mode: SandboxMode) -> Self {
        self.sandbox = mode;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &BranchPool {
        &self.pool
    }

    /// The provider.
    pub fn provider(&self) -> &Arc<dyn BranchProvider> {
        self.pool.provider()
    }

    /// Runs the suite of `req.work_tree` on a fresh branch of the parent plus `req.migrations`,
    /// confined (see [`crate::runner::Jail`]). Red tests and a run that changed the tree are
    /// receipts; a base whose migrations fail, and a database or runner that cannot work, are
    /// an [`InfraError`]: no receipt is ever made for a run that did not happen.
    ///
    /// **Whose fault a broken session is.** When a test's database session breaks off, the
    /// branch is probed: a database that does not answer is an infrastructure fault. One that
    /// answers means the session was ended from inside (the code under test can end its own
    /// session); the run is repeated once on a fresh branch, and a second break with the
    /// database up is the verdict (the tests errored), except in RED, where no code ran yet
    /// and a test that ended its own session never failed for a reason of its own: there it
    /// is `TestCommandBroken`.
    ///
    /// **A flaky test is told apart from a broken one.** When a test that was green before the
    /// step (any but the request's focus) fails, the whole run is made once more on a fresh
    /// branch, and that second run is the receipt: each such test that passes there is
    /// recorded in its `flaky`, and no agent is charged for it; one that fails again is the
    /// verdict, as before.
    pub async fn verify(&self, req: &VerifyRequest) -> Result<TestRunReceipt, InfraError> {
        let first = self.verify_judged(req).await?;
        let suspects = earlier_green_failures(req, &first);
        if suspects.is_empty() || !first.tree_changes.is_empty() {
            return Ok(first);
        }
        info!(request = %req.id, tests = %suspects.join(", "), "tests that were green failed; running once more on a fresh branch");
        let mut second = self.verify_judged(req).await?;
        second.flaky = suspects
            .iter()
            .filter(|t| second.status_of(t) == Some(TestStatus::Passed))
            .cloned()
            .collect();
        let again: Vec<&str> = suspects
            .iter()
            .filter(|t| !second.flaky.contains(t))
            .map(String::as_str)
            .collect();
        let mut said = Vec::new();
        if !second.flaky.is_empty() {
            said.push(format!(
                "flaky, not broken: {} passed on this fresh branch",
                second.flaky.join(", ")
            ));
        }
        if !again.is_empty() {
            said.push(format!("failed again here: {}", again.join(", ")));
        }
        second.output_excerpt = format!(
            "[consort: tests that were green failed on branch {}, so the whole run was made once more; {}]\n{}",
            first.branch_id,
            said.join("; "),
            second.output_excerpt
        );
        Ok(second)
    }

    /// One verification, a run on a fresh branch repeated once when a test's session broke off
    /// with the database up (see [`Verifier::verify`]). Broken off twice, it is a verdict on
    /// the code, except in RED: a test whose session broke off never reached a verdict of its
    /// own, and no code under test ran yet, so it is the run's fault, never a RED.
    async fn verify_judged(&self, req: &VerifyRequest) -> Result<TestRunReceipt, InfraError> {
        let first = match self.verify_once(req).await? {
            Attempt::Receipt(r) => return Ok(*r),
            Attempt::SessionsLost(done) => done,
        };
        info!(request = %req.id, sessions = %first.lost.join(", "), "a test session broke off with its database up; repeating on a fresh branch");
        let mut second = match self.verify_once(req).await? {
            Attempt::Receipt(r) => return Ok(*r),
            Attempt::SessionsLost(done) => done,
        };
        if req.purpose == VerifyPurpose::Red {
            return Err(infra(
                InfraFault::TestCommandBroken,
                format!(
                    "the database session of {} broke off while its database stayed up, on two fresh branches: the test never reached a verdict, so the run is no evidence for a RED (a test must fail by an error in its own statements or assertions, not end its session)",
                    second.lost.join(", ")
                ),
            ));
        }
        second.receipt.output_excerpt = format!(
            "the database session of {} broke off while its database stayed up, on two fresh branches (first: {}): the code under test ended it\n{}",
            second.lost.join(", "),
            first.lost.join(", "),
            second.receipt.output_excerpt
        );
        Ok(*second.receipt)
    }

    /// One run on fresh branches: the suite split over several when [`Shards`] allow it and
    /// the runner can (not for the deploy run, the reference run of the whole suite in one
    /// process), otherwise whole on one.
    ///
    /// A tree other than the one asked for still runs (the machine refuses its receipt), and
    /// the receipt names the paths that differ when the request named its files.
    async fn verify_once(&self, req: &VerifyRequest) -> Result<Attempt, InfraError> {
        let started = Instant::now();
        let before = snapshot(&self.trees, &req.work_tree, TreeFilter::new(&req.caches)).await?;
        let workspace_hash = ContentHash::of(&before.files);
        let changed = match &req.files {
            Some(asked) if workspace_hash != req.workspace_hash => {
                changed_paths(asked, &before.files)
            }
            _ => Vec::new(),
        };
        let run = Run {
            req,
            before: &before,
            workspace_hash,
            started,
        };
        let mut attempt = self.run_on(&run).await?;
        attempt.receipt_mut().changed_since_request = changed;
        Ok(attempt)
    }

    /// [`Self::verify_once`]'s run of the tree it took.
    async fn run_on(&self, run: &Run<'_>) -> Result<Attempt, InfraError> {
        let (req, before) = (run.req, run.before);
        let first = self.acquire(req).await?;
        let ctx = match self.context(req, first.lease.branch(), before).await {
            Ok(c) => c,
            Err(e) => {
                let _ = first.lease.release(false).await;
                return Err(e);
            }
        };
        if let Some(files) = self.selected_files(req, before) {
            let mut ctx = ctx;
            ctx.select = Some(files);
            return self.run_whole(run, first, ctx).await;
        }
        let worth = self
            .costs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .worth_splitting(self.shards);
        // RED adds a test file, whose effect on the others (data it commits, a name it
        // takes) only a run on one branch shows; the deploy run and the merge check are the
        // reference runs of the whole suite. The other steps split.
        let whole_run = matches!(req.purpose, VerifyPurpose::Red | VerifyPurpose::Deploy);
        if worth && !whole_run && self.runner.selects() {
            return self.run_split(run, first, ctx).await;
        }
        self.run_whole(run, first, ctx).await
    }

    /// The test files of the request's selected tests, when it selects some and the runner can
    /// run a selection and place every name in a file of the tree; otherwise the whole suite
    /// runs (`None`), which judges at least as much.
    fn selected_files(&self, req: &VerifyRequest, before: &Snapshot) -> Option<Vec<String>> {
        if req.select.is_empty() || !self.runner.selects() {
            return None;
        }
        let tree: Vec<String> = before.files.keys().cloned().collect();
        let mut files = req
            .select
            .iter()
            .map(|t| self.runner.file_of(t, &tree, &req.work_tree))
            .collect::<Option<Vec<String>>>()?;
        files.sort();
        files.dedup();
        Some(files)
    }

    /// A fresh branch of the request's base.
    async fn acquire(&self, req: &VerifyRequest) -> Result<Acquired, InfraError> {
        let spec = BaseSpec {
            migrations: match self.tool {
                Some(_) => Vec::new(),
                None => req.migrations.clone(),
            },
            fixtures: self.fixtures.clone(),
            promoted: Vec::new(),
        };
        match self.pool.acquire(&spec).await {
            Ok(a) => Ok(a),
            Err(e) if is_work_fault(&e) => Err(base_not_built(&e)),
            Err(e) => Err(infra(
                e.infra_fault(),
                format!("getting a branch: {}", consort_actors::error_chain(&e)),
            )),
        }
    }

    /// The whole suite in one process on one branch (or the selection `ctx` names).
    async fn run_whole(
        &self,
        run: &Run<'_>,
        acquired: Acquired,
        ctx: RunContext,
    ) -> Result<Attempt, InfraError> {
        let t = Instant::now();
        let report = self.runner.run(&ctx).await;
        let run_ms = t.elapsed().as_millis() as u64;
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                let _ = acquired.lease.release(false).await;
                return Err(runner_fault(&e));
            }
        };
        if !report.sessions_lost.is_empty() && !self.answers(&ctx.conn).await {
            let _ = acquired.lease.release(false).await;
            return Err(lost_database(&report.sessions_lost));
        }
        let after = hashes_after(&self.trees, &run.req.work_tree, ctx.filter.clone()).await?;
        let failed = is_failing(&report);
        if self.shards.on() && ctx.select.is_none() {
            let mut costs = self.costs.lock().unwrap_or_else(PoisonError::into_inner);
            costs.timed(run_ms);
        }
        let branch = acquired.lease.branch().clone();
        // The receipt does not wait for the branch to be dropped (the pool's shutdown does).
        acquired.lease.release_in_background(failed);
        let timings = RunTimings {
            acquire_ms: acquired.acquire_ms,
            migrate_ms: acquired.prepare_ms,
            run_ms,
        };
        info!(
            request = %run.req.id,
            branch = %branch.name,
            from_pool = acquired.from_pool,
            failed,
            confinement = %ctx.jail.confinement(),
            "verification done"
        );
        let lost = report.sessions_lost.clone();
        let mut receipt = self.receipt(run.req, run.workspace_hash, &branch.id, timings, report);
        receipt.confinement = ctx.jail.confinement();
        receipt.tree_changes = changed_paths(&run.before.files, &after);
        receipt.selection = ctx.select.clone().unwrap_or_default();
        Ok(attempt(receipt, lost))
    }

    /// The run's context: the branch's connection, the confinement, the pinned settings.
    async fn context(
        &self,
        req: &VerifyRequest,
        branch: &crate::provider::Branch,
        before: &Snapshot,
    ) -> Result<RunContext, InfraError> {
        let conn = self.login(branch).await?;
        let mut hidden = vec![req.work_tree.join(".consort")];
        hidden.extend(req.hidden.iter().cloned());
        hidden.extend(self.provider().private_paths());
        let mut ctx = RunContext::prepare(
            req.work_tree.clone(),
            conn,
            self.sandbox,
            hidden,
            before.cache_dirs.clone(),
        )
        .map_err(|e| runner_fault(&e))?;
        ctx.tests = req.tests.clone();
        ctx.focus = req.focus.clone();
        ctx.filter = TreeFilter::new(&req.caches);
        match &self.tool {
            Some(tool) => self.apply_tool(tool, req, &ctx).await?,
            None => ctx.pinned = SessionSettings::for_migrations(&req.migrations),
        }
        Ok(ctx)
    }

    /// How to connect to `branch`. A minted credential (one that expires, and that its server
    /// can revoke) is checked by one login first: one the server refuses (28P01) is forgotten
    /// and a new one asked for, once.
    async fn login(&self, branch: &crate::provider::Branch) -> Result<ConnectInfo, InfraError> {
        let ask = || async {
            self.provider().connect_info(branch).await.map_err(|e| {
                infra(
                    e.infra_fault(),
                    format!("connecting: {}", consort_actors::error_chain(&e)),
                )
            })
        };
        let conn = ask().await?;
        if conn.expires_at.is_none() {
            return Ok(conn);
        }
        match crate::pgconn::connect(&conn).await {
            Err(Error::Connection { driver, .. })
                if driver.code() == Some(&tokio_postgres::error::SqlState::INVALID_PASSWORD) =>
            {
                info!(branch = %branch.name, "the branch refused its credential; asking for a new one");
                self.provider().invalidate_credential(branch);
                ask().await
            }
            // Any other failure is the run's to meet, and to report as it does.
            _ => Ok(conn),
        }
    }

    /// Whether the branch still answers a query.
    async fn answers(&self, conn: &crate::provider::ConnectInfo) -> bool {
        match crate::pgconn::connect(conn).await {
            Ok(client) => client.simple_query("SELECT 1").await.is_ok(),
            Err(_) => false,
        }
    }

    fn receipt(
        &self,
        req: &VerifyRequest,
        workspace_hash: ContentHash,
        branch_id: &str,
        timings: RunTimings,
        report: RunReport,
    ) -> TestRunReceipt {
        let missing_modules = crate::runner::missing_module::read(
            &req.work_tree,
            &report.outcomes,
            &report.output_excerpt,
        );
        TestRunReceipt {
            request_id: req.id,
            workspace_hash,
            provider: self.provider().kind().to_string(),
            branch_copy: self.provider().branch_copy().map(String::from),
            branch_id: branch_id.to_string(),
            runner: self.runner.name().to_string(),
            command: report.command,
            timings,
            outcomes: report.outcomes,
            exit: report.exit,
            output_digest: report.output_digest,
            output_excerpt: report.output_excerpt,
            confinement: Default::default(),
            tree_changes: Vec::new(),
            changed_since_request: Vec::new(),
            flaky: Vec::new(),
            missing_modules,
            shards: Vec::new(),
            selection: Vec::new(),
            harness: req.harness,
        }
    }

    /// Applies the approved migrations to the parent and checks them there.
    pub async fn promote(&self, req: &PromoteRequest) -> Result<PromoteReport, InfraError> {
        if let Some(tool) = &self.tool {
            return self.promote_by_tool(tool, req).await;
        }
        match self.provider().promote(&req.migrations).await {
            Ok(o) => Ok(PromoteReport {
                request_id: req.id,
                target: o.target,
                applied: o.applied,
                already_applied: o.already_applied,
                verified: o.verified,
                merge_check: None,
            }),
            Err(e) => Err(infra(
                e.infra_fault(),
                format!("promote: {}", consort_actors::error_chain(&e)),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots(kept: &KeptTrees) -> Vec<PathBuf> {
        let kept = kept.0.lock().expect("kept trees");
        kept.iter().map(|t| t.root().to_path_buf()).collect()
    }

    #[test]
    fn kept_trees_are_bounded_most_recent_first_and_gone_roots_dropped() {
        let kept = KeptTrees::default();
        let dirs: Vec<_> = (0..KEPT_TREES + 2)
            .map(|_| tempfile::tempdir().expect("tempdir"))
            .collect();
        let canon = |i: usize| dirs[i].path().canonicalize().expect("canonical");
        for d in &dirs {
            kept.open(d.path(), TreeFilter::default()).expect("open");
        }
        let expected: Vec<PathBuf> = (2..KEPT_TREES + 2).rev().map(canon).collect();
        assert_eq!(roots(&kept), expected, "bounded, the most recent first");
        // The same root again, spelled differently: the kept handle, moved to the front.
        let spelled = dirs[3].path().join(".");
        kept.open(&spelled, TreeFilter::default()).expect("open");
        assert_eq!(roots(&kept)[0], canon(3));
        assert_eq!(roots(&kept).len(), KEPT_TREES);
        let gone = canon(4);
        let mut dirs = dirs;
        dirs.remove(4).close().expect("remove the root");
        kept.open(dirs[0].path(), TreeFilter::default())
            .expect("open");
        assert!(
            !roots(&kept).contains(&gone),
            "a root that is gone is dropped"
        );
        assert_eq!(roots(&kept).len(), KEPT_TREES);
    }
}
