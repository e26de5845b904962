//! A verification whose suite is split over database branches, in two phases:
//!
//! 1. The tests most likely to fail (the files of the request's focus and of the tests that
//!    failed in the last split run) run in a shard of their own, while the runner lists the
//!    whole suite in another process on another branch. A failure there that settles the
//!    verdict answers at once: the listing is stopped.
//! 2. The rest of the suite is balanced over shards (`shards.rs`) that run at once, each in
//!    its own process on its own fresh branch. Once a finished shard settles the verdict as a
//!    failure, the others are stopped (dropping a run kills its process group).
//!
//! The shards' reports become one receipt that names each shard; when every shard ran to its
//! end, their tests must add up to the listing (`shards.rs::union_fault`).

use std::pin::pin;
use std::sync::PoisonError;
use std::time::Instant;

use consort_actors::{
    ContentHash, ExitRecord, RunTimings, ShardRun, TestOutcome, TestRunReceipt, VerifyRequest,
};
use tokio::task::JoinSet;
use tracing::info;

use super::shards::{Ended, certain_failure, closed_over, files_of, plan, union};
use super::{
    Attempt, InfraError, InfraFault, Run, Verifier, attempt, changed_paths, hashes_after, infra,
    is_failing, lost_database, runner_fault,
};
use crate::error::Result as LakebaseResult;
use crate::pool::Acquired;
use crate::runner::{RunContext, RunReport, Suite};

/// One shard that ran to its end.
struct Finished {
    report: RunReport,
    run_ms: u64,
}

/// A shard: its branch and context, its files, and how it ended (`None`: stopped).
struct Shard {
    acquired: Acquired,
    ctx: RunContext,
    files: Vec<String>,
    finished: Option<Finished>,
}

/// What the first phase came to.
enum FirstPhase {
    /// The likely failures settled the verdict: the listing was stopped.
    Settled,
    /// The suite as listed (`None`: the runner could not list it).
    Listed(Option<Suite>),
}

impl Verifier {
    /// Runs `run`'s suite split, the first shard on `first` (acquired, its context `ctx`).
    pub(super) async fn run_split(
        &self,
        run: &Run<'_>,
        first: Acquired,
        ctx: RunContext,
    ) -> Result<Attempt, InfraError> {
        let files: Vec<String> = run.before.files.keys().cloned().collect();
        let focus_file = run
            .req
            .focus
            .as_ref()
            .and_then(|f| self.runner.file_of(f, &files, &run.req.work_tree));
        let likely = self.likely_files(focus_file.as_deref(), &files);
        let mut shards = vec![Shard {
            acquired: first,
            ctx,
            files: likely,
            finished: None,
        }];
        let listing = match self.shard(run).await {
            Ok(s) => s,
            Err(e) => {
                release(shards, false);
                return Err(e);
            }
        };
        let phase = self
            .first_phase(run.req, focus_file.as_deref(), &mut shards[0], &listing.ctx)
            .await;
        release(vec![listing], false);
        let suite = match phase {
            Err(e) => {
                release(shards, false);
                return Err(e);
            }
            Ok(FirstPhase::Settled) => return self.judge(run, shards, None).await,
            Ok(FirstPhase::Listed(Some(suite))) if worth_two(&suite, &shards[0]) => suite,
            // The runner could not list its suite, or it has one file: it runs whole. A tool
            // that cannot list on a tree whose whole run passes never will (vitest 1): its
            // suites run whole from then on. A listing that failed on a broken tree (a test
            // file that does not load) is tried again next time.
            Ok(FirstPhase::Listed(suite)) => {
                let attempt = self.whole_instead(run, shards).await?;
                if suite.is_none()
                    && let Attempt::Receipt(receipt) = &attempt
                    && receipt.exit.success()
                    && receipt.not_passed().is_empty()
                {
                    let mut costs = self.costs.lock().unwrap_or_else(PoisonError::into_inner);
                    costs.could_not_list();
                }
                return Ok(attempt);
            }
        };
        if let Err(e) = self
            .second_phase(run, &suite, focus_file.as_deref(), &mut shards)
            .await
        {
            release(shards, false);
            return Err(e);
        }
        self.judge(run, shards, Some(&suite)).await
    }

    /// The suite run whole after all: on the first shard's branch when nothing ran there yet,
    /// otherwise on a fresh one.
    async fn whole_instead(
        &self,
        run: &Run<'_>,
        mut shards: Vec<Shard>,
    ) -> Result<Attempt, InfraError> {
        if shards.len() == 1 && shards[0].finished.is_none() {
            let mut first = shards.remove(0);
            first.ctx.select = None;
            return self.run_whole(run, first.acquired, first.ctx).await;
        }
        release(shards, false);
        let acquired = self.acquire(run.req).await?;
        let ctx = match self
            .context(run.req, acquired.lease.branch(), run.before)
            .await
        {
            Ok(ctx) => ctx,
            Err(e) => {
                acquired.lease.release_in_background(false);
                return Err(e);
            }
        };
        self.run_whole(run, acquired, ctx).await
    }

    /// The test files likely to fail: the focus's and those of the last split run's failures
    /// that the tree (`files`) still holds, with the files their selection runs too.
    fn likely_files(&self, focus_file: Option<&str>, files: &[String]) -> Vec<String> {
        let costs = self.costs.lock().unwrap_or_else(PoisonError::into_inner);
        let likely: Vec<String> = focus_file
            .map(String::from)
            .into_iter()
            .chain(costs.recent_failures().iter().cloned())
            .filter(|f| files.contains(f))
            .collect();
        drop(costs);
        let runner = &self.runner;
        closed_over(likely, files, &|a, b| runner.selection_reaches(a, b))
    }

    /// Runs the likely failures' shard (when it has files) while the runner lists the suite in
    /// `listing`'s context; a settled failure there stops the listing.
    async fn first_phase(
        &self,
        req: &VerifyRequest,
        focus_file: Option<&str>,
        likely: &mut Shard,
        listing: &RunContext,
    ) -> Result<FirstPhase, InfraError> {
        let t = Instant::now();
        let mut listed = pin!(self.runner.collect(listing));
        if likely.files.is_empty() {
            let suite = listed.await.map_err(|e| runner_fault(&e))?;
            return Ok(FirstPhase::Listed(suite));
        }
        likely.ctx.select = Some(likely.files.clone());
        let mut first = pin!(self.runner.run(&likely.ctx));
        let mut suite = None;
        let mut report = None;
        while suite.is_none() || report.is_none() {
            tokio::select! {
                r = &mut first, if report.is_none() => {
                    let r = r.map_err(|e| runner_fault(&e))?;
                    let holds_focus = focus_file.is_none_or(|f| likely.files.iter().any(|x| x == f));
                    let settled = certain_failure((req.purpose, &req.quarantined), holds_focus, &r.outcomes);
                    let run_ms = t.elapsed().as_millis() as u64;
                    info!(request = %req.id, run_ms, settled, "the likely failures ran");
                    likely.finished = Some(Finished { report: r, run_ms });
                    if settled {
                        return Ok(FirstPhase::Settled);
                    }
                    report = Some(());
                }
                s = &mut listed, if suite.is_none() => {
                    suite = Some(s.map_err(|e| runner_fault(&e))?);
                }
            }
        }
        Ok(FirstPhase::Listed(suite.flatten()))
    }

    /// Balances the rest of `suite` over shards and runs them at once until all have ended or
    /// one's failure settles the verdict (the rest are then dropped, their process groups
    /// killed). Without likely failures the first shard, already acquired, takes the first
    /// share. In RED the new test is meant to fail, so only a failure in a shard without its
    /// file settles anything; when its file is not known, no RED stops early.
    async fn second_phase(
        &self,
        run: &Run<'_>,
        suite: &Suite,
        focus_file: Option<&str>,
        shards: &mut Vec<Shard>,
    ) -> Result<(), InfraError> {
        let files = {
            let costs = self.costs.lock().unwrap_or_else(PoisonError::into_inner);
            let runner = &self.runner;
            let reaches = |a: &str, b: &str| runner.selection_reaches(a, b);
            plan(suite, &shards[0].files, self.shards.max, &costs, &reaches)
        };
        let reuse_first = shards[0].files.is_empty();
        for (i, files) in files.into_iter().enumerate() {
            if i == 0 && reuse_first {
                shards[0].files = files;
            } else {
                let mut s = self.shard(run).await?;
                s.files = files;
                shards.push(s);
            }
        }
        let mut running = JoinSet::new();
        for (i, shard) in shards.iter_mut().enumerate() {
            if shard.finished.is_some() || shard.files.is_empty() {
                continue;
            }
            shard.ctx.select = Some(shard.files.clone());
            let (runner, ctx) = (self.runner.clone(), shard.ctx.clone());
            running.spawn(async move {
                let t = Instant::now();
                let report: LakebaseResult<RunReport> = runner.run(&ctx).await;
                (i, report, t.elapsed().as_millis() as u64)
            });
        }
        while let Some(done) = running.join_next().await {
            let (i, report, run_ms) = done.map_err(|e| {
                infra(
                    InfraFault::RunnerFailed,
                    format!("a shard's run ended abnormally: {e}"),
                )
            })?;
            let report = report.map_err(|e| runner_fault(&e))?;
            info!(request = %run.req.id, shard = i + 1, run_ms, tests = report.outcomes.len(), "shard ended");
            let holds_focus = focus_file.is_none_or(|f| shards[i].files.iter().any(|x| x == f));
            let settled = certain_failure(
                (run.req.purpose, &run.req.quarantined),
                holds_focus,
                &report.outcomes,
            );
            shards[i].finished = Some(Finished { report, run_ms });
            if settled && !running.is_empty() {
                info!(request = %run.req.id, shard = i + 1, "a shard failed: stopping the others");
                running.abort_all();
                while running.join_next().await.is_some() {}
            }
        }
        Ok(())
    }

    /// A fresh branch and its context for one more process of the run.
    async fn shard(&self, run: &Run<'_>) -> Result<Shard, InfraError> {
        let acquired = self.acquire(run.req).await?;
        match self
            .context(run.req, acquired.lease.branch(), run.before)
            .await
        {
            Ok(ctx) => Ok(Shard {
                acquired,
                ctx,
                files: Vec::new(),
                finished: None,
            }),
            Err(e) => {
                acquired.lease.release_in_background(false);
                Err(e)
            }
        }
    }

    /// The receipt of shards that ran: the union checked against `suite` when every shard
    /// ended (`None`: the first phase settled the verdict), the tests a failing shard did not
    /// report added as failures, the branches released, the costs learned.
    async fn judge(
        &self,
        run: &Run<'_>,
        shards: Vec<Shard>,
        suite: Option<&Suite>,
    ) -> Result<Attempt, InfraError> {
        let (mut shards, idle): (Vec<Shard>, Vec<Shard>) = shards
            .into_iter()
            .partition(|s| s.finished.is_some() || !s.files.is_empty());
        release(idle, false);
        let all_ended = shards.iter().all(|s| s.finished.is_some());
        if let (Some(suite), true) = (suite, all_ended)
            && let Err(fault) = add_up(suite, &mut shards)
        {
            release(shards, false);
            return Err(infra(
                InfraFault::TestCommandBroken,
                format!(
                    "the suite split over branches does not add up to what the runner lists for the whole suite: {fault}. Set `[runner] shards = 1` in consort.toml to run it whole"
                ),
            ));
        }
        let lost: Vec<String> = shards
            .iter()
            .filter_map(|s| s.finished.as_ref())
            .flat_map(|f| f.report.sessions_lost.iter().cloned())
            .collect();
        if !lost.is_empty() && !self.answers(&shards[0].ctx.conn).await {
            release(shards, false);
            return Err(lost_database(&lost));
        }
        let filter = shards[0].ctx.filter.clone();
        let after = hashes_after(&self.trees, &run.req.work_tree, filter).await?;
        self.learn(&shards, suite, all_ended);
        let mut receipt = self.shard_receipt(run, &shards);
        receipt.confinement = shards[0].ctx.jail.confinement();
        receipt.tree_changes = changed_paths(&run.before.files, &after);
        let failed = receipt.outcomes.iter().any(TestOutcome::is_failure);
        info!(request = %run.req.id, shards = shards.len(), failed, "verification done");
        release(shards, failed);
        Ok(attempt(receipt, lost))
    }

    /// What the shards that ended teach: the files' costs, the files of the failures (from
    /// the listing, with the files it could not load in a shard that failed), and what the
    /// whole suite took when every shard ended.
    fn learn(&self, shards: &[Shard], suite: Option<&Suite>, all_ended: bool) {
        let mut costs = self.costs.lock().unwrap_or_else(PoisonError::into_inner);
        let mut failures = Vec::new();
        let mut serial = 0;
        for s in shards {
            let Some(f) = &s.finished else { continue };
            serial += f.run_ms;
            costs.learn(&s.files, f.report.outcomes.len(), f.run_ms);
            let failed = f.report.outcomes.iter().filter(|o| o.is_failure());
            for o in failed {
                let file = suite
                    .and_then(|suite| {
                        suite
                            .tests
                            .iter()
                            .find(|t| t.name == o.name && s.files.contains(&t.file))
                    })
                    .map(|t| t.file.clone())
                    .or_else(|| self.runner.file_of(&o.name, &s.files, &s.ctx.work_tree));
                failures.extend(file);
            }
            // A file the listing could not load, in a shard that failed, fails again first.
            if is_failing(&f.report)
                && let Some(suite) = suite
            {
                let unloaded = s.files.iter().filter(|x| suite.unloaded.contains(x));
                failures.extend(unloaded.cloned());
            }
        }
        failures.sort();
        failures.dedup();
        costs.failed(failures);
        if all_ended && suite.is_some() {
            costs.timed(serial);
        }
    }

    /// One receipt for all shards: their outcomes one shard after another, each shard named.
    fn shard_receipt(&self, run: &Run<'_>, shards: &[Shard]) -> TestRunReceipt {
        let mut outcomes = Vec::new();
        let mut records = Vec::new();
        let mut excerpt = String::new();
        let mut digests = Vec::new();
        let mut exit: Option<ExitRecord> = None;
        let mut bytes = 0;
        for (i, s) in shards.iter().enumerate() {
            let branch = s.acquired.lease.branch();
            let head = format!(
                "shard {} of {} on branch {}",
                i + 1,
                shards.len(),
                branch.name
            );
            let record = match &s.finished {
                Some(f) => {
                    outcomes.extend(f.report.outcomes.iter().cloned());
                    digests.push(f.report.output_digest);
                    bytes += f.report.output_bytes;
                    if exit.as_ref().is_none_or(ExitRecord::success) {
                        exit = Some(f.report.exit.clone());
                    }
                    excerpt.push_str(&format!(
                        "== consort: {head}, {} file(s) ==\n{}\n",
                        s.files.len(),
                        f.report.output_excerpt
                    ));
                    ShardRun {
                        branch_id: branch.id.clone(),
                        command: f.report.command.clone(),
                        files: s.files.clone(),
                        outcomes: f.report.outcomes.len(),
                        exit: Some(f.report.exit.clone()),
                        run_ms: f.run_ms,
                    }
                }
                None => {
                    excerpt.push_str(&format!(
                        "== consort: {head}, stopped: another shard's failure had settled the verdict ==\n"
                    ));
                    ShardRun {
                        branch_id: branch.id.clone(),
                        command: String::new(),
                        files: s.files.clone(),
                        outcomes: 0,
                        exit: None,
                        run_ms: 0,
                    }
                }
            };
            records.push(record);
        }
        let timings = RunTimings {
            acquire_ms: shards
                .iter()
                .map(|s| s.acquired.acquire_ms)
                .max()
                .unwrap_or(0),
            migrate_ms: shards
                .iter()
                .map(|s| s.acquired.prepare_ms)
                .max()
                .unwrap_or(0),
            run_ms: run.started.elapsed().as_millis() as u64,
        };
        let report = RunReport {
            command: format!(
                "the suite in {} shard(s), each in its own process on its own branch (each shard's command is in its record)",
                shards.len()
            ),
            outcomes,
            exit: exit.unwrap_or(ExitRecord {
                code: None,
                signal: None,
                timed_out: false,
            }),
            output_digest: ContentHash::of(&digests),
            output_excerpt: excerpt,
            output_bytes: bytes,
            sessions_lost: Vec::new(),
        };
        let first = shards[0].acquired.lease.branch().id.clone();
        let mut receipt = self.receipt(run.req, run.workspace_hash, &first, timings, report);
        receipt.shards = records;
        receipt
    }
}

/// Whether a split is worth it: the likely failures ran apart, or the suite has two files.
fn worth_two(suite: &Suite, first: &Shard) -> bool {
    first.finished.is_some() || files_of(suite).len() > 1
}

/// Checks that shards which all ended add up to `suite` (`shards.rs::union`), and adds to each
/// failing shard's report the tests it did not report, as failures; what is wrong otherwise.
fn add_up(suite: &Suite, shards: &mut [Shard]) -> Result<(), String> {
    let unreported = {
        let ended: Vec<Ended<'_>> = shards
            .iter()
            .filter_map(|s| {
                let f = s.finished.as_ref()?;
                Some(Ended {
                    files: &s.files,
                    outcomes: &f.report.outcomes,
                    exit_ok: f.report.exit.success(),
                })
            })
            .collect();
        union(suite, &ended)?
    };
    let mut finished: Vec<&mut Finished> = shards
        .iter_mut()
        .filter_map(|s| s.finished.as_mut())
        .collect();
    for (i, outcome) in unreported {
        if let Some(f) = finished.get_mut(i) {
            f.report.outcomes.push(outcome);
        }
    }
    Ok(())
}

/// Releases every shard's branch (in the background); a failing shard's branch is kept when
/// `failed` and the pool keeps failed branches.
fn release(shards: Vec<Shard>, failed: bool) {
    for s in shards {
        let failed = failed && s.finished.as_ref().is_some_and(|f| is_failing(&f.report));
        s.acquired.lease.release_in_background(failed);
    }
}
