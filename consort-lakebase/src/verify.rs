//! One verification: fresh branch of the right base, real test run, receipt. And promotion.
//!
//! This is the only place that builds [`TestRunReceipt`]s. The receipt's workspace hash is
//! computed here from the work tree as it is when the run starts (never copied from the
//! request), so a receipt always says what was really tested.

use std::sync::Arc;
use std::time::Instant;

use consort_actors::worktree::{TreeFilter, hash_dir_with};
use consort_actors::{
    ContentHash, ExitRecord, InfraError, InfraFault, PromoteReport, PromoteRequest, RunTimings,
    TestOutcome, TestRunReceipt, TestStatus, VerifyRequest,
};
use tracing::info;

use crate::error::Error;
use crate::pool::BranchPool;
use crate::provider::{BaseSpec, BranchProvider};
use crate::runner::{RunContext, RunReport, TestRunner};

/// Runs verifications and promotions over a pool and a runner.
#[derive(Debug, Clone)]
pub struct Verifier {
    pool: BranchPool,
    runner: Arc<dyn TestRunner>,
    fixtures: Vec<String>,
}

fn infra(fault: InfraFault, detail: impl Into<String>) -> InfraError {
    InfraError {
        fault,
        detail: detail.into(),
    }
}

/// Whether an error is the work's fault (a bad migration) rather than the infrastructure's.
fn is_work_fault(e: &Error) -> bool {
    matches!(
        e,
        Error::Migration { .. } | Error::ChecksumMismatch { .. } | Error::Config(_)
    )
}

impl Verifier {
    /// A verifier; `fixtures` are SQL run into every base after its migrations.
    pub fn new(pool: BranchPool, runner: Arc<dyn TestRunner>, fixtures: Vec<String>) -> Self {
        Verifier {
            pool,
            runner,
            fixtures,
        }
    }

    /// The pool.
    pub fn pool(&self) -> &BranchPool {
        &self.pool
    }

    /// The provider.
    pub fn provider(&self) -> &Arc<dyn BranchProvider> {
        self.pool.provider()
    }

    /// Runs the suite of `req.work_tree` on a fresh branch of the parent plus `req.migrations`.
    /// Red tests and a failing migration are receipts; a database or runner that cannot work
    /// is an [`InfraError`].
    pub async fn verify(&self, req: &VerifyRequest) -> Result<TestRunReceipt, InfraError> {
        let (tree, caches) = (req.work_tree.clone(), TreeFilter::new(&req.caches));
        let workspace_hash = tokio::task::spawn_blocking(move || hash_dir_with(&tree, &caches))
            .await
            .map_err(|e| {
                infra(
                    InfraFault::WorkTreeIo,
                    format!("hashing the work tree: {e}"),
                )
            })?
            .map_err(|e| {
                infra(
                    InfraFault::WorkTreeIo,
                    format!("hashing the work tree: {e}"),
                )
            })?;
        let spec = BaseSpec {
            migrations: req.migrations.clone(),
            fixtures: self.fixtures.clone(),
        };
        let started = Instant::now();
        let acquired = match self.pool.acquire(&spec).await {
            Ok(a) => a,
            Err(e) if is_work_fault(&e) => {
                let ms = started.elapsed().as_millis() as u64;
                return Ok(self.base_failed_receipt(req, workspace_hash, ms, &e));
            }
            Err(e) => {
                return Err(infra(e.infra_fault(), format!("getting a branch: {e}")));
            }
        };
        let branch = acquired.lease.branch().clone();
        let conn = match self.provider().connect_info(&branch).await {
            Ok(c) => c,
            Err(e) => {
                let _ = acquired.lease.release(false).await;
                return Err(infra(InfraFault::DatabaseDown, format!("connecting: {e}")));
            }
        };
        let ctx = RunContext {
            work_tree: req.work_tree.clone(),
            conn,
            tests: req.tests.clone(),
            focus: req.focus.clone(),
        };
        let t = Instant::now();
        let report = self.runner.run(&ctx).await;
        let run_ms = t.elapsed().as_millis() as u64;
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                let _ = acquired.lease.release(false).await;
                // A broken connection is the database's fault, a broken runner the runner's.
                let fault = match e {
                    Error::Connect(_) => InfraFault::DatabaseDown,
                    Error::Io { .. } => InfraFault::WorkTreeIo,
                    _ => InfraFault::RunnerFailed,
                };
                return Err(infra(fault, format!("running the tests: {e}")));
            }
        };
        let failed = !report.exit.success()
            || report
                .outcomes
                .iter()
                .any(|o| matches!(o.status, TestStatus::Failed | TestStatus::Errored));
        // The receipt does not wait for the branch to be dropped (the pool's shutdown does).
        acquired.lease.release_in_background(failed);
        let timings = RunTimings {
            acquire_ms: acquired.acquire_ms,
            migrate_ms: acquired.prepare_ms,
            run_ms,
        };
        info!(
            request = %req.id,
            branch = %branch.name,
            from_pool = acquired.from_pool,
            failed,
            "verification done"
        );
        Ok(self.receipt(req, workspace_hash, &branch.id, timings, report))
    }

    fn receipt(
        &self,
        req: &VerifyRequest,
        workspace_hash: ContentHash,
        branch_id: &str,
        timings: RunTimings,
        report: RunReport,
    ) -> TestRunReceipt {
        TestRunReceipt {
            request_id: req.id,
            workspace_hash,
            provider: self.provider().kind().to_string(),
            branch_id: branch_id.to_string(),
            runner: self.runner.name().to_string(),
            command: report.command,
            timings,
            outcomes: report.outcomes,
            exit: report.exit,
            output_digest: report.output_digest,
            output_excerpt: report.output_excerpt,
        }
    }

    /// The receipt of a run that could not start because the base's migrations failed.
    fn base_failed_receipt(
        &self,
        req: &VerifyRequest,
        workspace_hash: ContentHash,
        migrate_ms: u64,
        e: &Error,
    ) -> TestRunReceipt {
        let text = format!("no test ran: the base could not be built: {e}\n");
        let mut names: Vec<String> = req.tests.clone();
        if let Some(f) = &req.focus
            && !names.contains(f)
        {
            names.push(f.clone());
        }
        if names.is_empty() {
            names.push("(migrations)".into());
        }
        TestRunReceipt {
            request_id: req.id,
            workspace_hash,
            provider: self.provider().kind().to_string(),
            branch_id: String::new(),
            runner: self.runner.name().to_string(),
            command: "(not run: migrations failed)".into(),
            timings: RunTimings {
                acquire_ms: 0,
                migrate_ms,
                run_ms: 0,
            },
            outcomes: names
                .into_iter()
                .map(|name| TestOutcome {
                    name,
                    status: TestStatus::Errored,
                })
                .collect(),
            exit: ExitRecord {
                code: None,
                signal: None,
                timed_out: false,
            },
            output_digest: ContentHash::of_bytes(text.as_bytes()),
            output_excerpt: text,
        }
    }

    /// Applies the approved migrations to the parent and checks them there.
    pub async fn promote(&self, req: &PromoteRequest) -> Result<PromoteReport, InfraError> {
        match self.provider().promote(&req.migrations).await {
            Ok(o) => Ok(PromoteReport {
                request_id: req.id,
                target: o.target,
                applied: o.applied,
                already_applied: o.already_applied,
                verified: o.verified,
            }),
            Err(e) => Err(infra(e.infra_fault(), format!("promote: {e}"))),
        }
    }
}
