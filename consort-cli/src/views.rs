//! What the read-only commands say, as text or data rather than printed: `consort status`,
//! `log`, `verify`, `branches`, the frozen design, what waits next, and recording a gate
//! decision. The CLI (`main.rs`) prints these; `consort mcp` returns them to its clients, so
//! both say exactly the same.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use chrono::Utc;
use consort_actors::{
    Command, ConductorError, ContentHash, Event, FileHashes, GateApproval, GateDecision, GateKind,
    HumanDecision, LedgerError, Pending, State, TestRunReceipt, TestStatus, WorkTree,
    WorkTreeError, design_hash_on_disk, record_gate_decision,
};

use crate::ui;
use consort::backlog::FeatureState;
use consort::project::{FeatureSummary, Project, ProjectError, StatusReport, status_of};

/// Why a view could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ViewError {
    /// The project could not be opened or read.
    #[error(transparent)]
    Project(#[from] ProjectError),
    /// The ledger could not be read.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The work tree could not be read.
    #[error(transparent)]
    Tree(#[from] WorkTreeError),
    /// The database provider failed.
    #[error("database")]
    Database(#[from] consort_lakebase::Error),
    /// A file could not be read.
    #[error("{path}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Why a gate decision was not recorded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecideError {
    /// No name was given.
    #[error("--by needs a name")]
    NoName,
    /// The hash is not 64 hex digits.
    #[error("refused: {0}")]
    BadHash(consort_actors::ParseHashError),
    /// The machine refused it (no such gate waiting, another hash, …).
    #[error("{0}")]
    Refused(String),
    /// The project or its ledger failed.
    #[error(transparent)]
    Project(#[from] ProjectError),
    /// The ledger failed.
    #[error(transparent)]
    Conductor(ConductorError),
}

/// The ledger's entries, none before the feature's first run.
fn entries(project: &Project) -> Result<Vec<consort_actors::Entry<Event>>, ViewError> {
    Ok(project.entries()?)
}

/// `consort status --json`: the status report of the project's feature.
pub fn status_report(project: &Project) -> Result<StatusReport, ViewError> {
    let state = project.state()?;
    let events = entries(project)?;
    let usage = consort_actors::usage_totals(events.iter().map(|e| &e.event));
    let mut report = status_of(&state, events.len(), &usage);
    report.git = project.git_tip();
    report.feature = Some(project.feature_id().to_string());
    for f in project.backlog()? {
        report.features.push(FeatureSummary {
            state: project.state_of(&f)?,
            id: f.id,
        });
    }
    report.lanes = project.lanes()?;
    report.flaky = consort::project::flaky_seen(events.iter().map(|e| &e.event));
    Ok(report)
}

/// `consort status`: the report as lines for people.
pub fn status_text(project: &Project, report: &StatusReport) -> Result<String, ViewError> {
    let dir = project.dir.as_path();
    let mut out = String::new();
    if report.features.len() > 1 {
        let all: Vec<String> = report
            .features
            .iter()
            .map(|f| format!("{} ({})", f.id, f.state))
            .collect();
        let _ = writeln!(out, "feature: {}", project.feature_id());
        let _ = writeln!(out, "backlog: {}", all.join(", "));
    }
    let _ = writeln!(out, "phase:   {}", report.phase);
    if let Some(step) = &report.step {
        let _ = writeln!(out, "step:    {step}");
    }
    if let Some(t) = &report.test {
        let _ = writeln!(out, "test:    {} ({} of {})", t.id, t.index, t.of);
    }
    if let Some(g) = &report.pending_gate {
        let _ = writeln!(out, "gate:    {} waits for {}", g.gate, g.hash);
        let _ = writeln!(
            out,
            "         {}",
            consort::project::approve_command(dir, g.gate, &g.hash)
        );
    }
    if let Some(h) = &report.halted {
        let _ = writeln!(
            out,
            "halted:  {} ({}) at {}: {}",
            h.reason, h.kind, h.step, h.detail
        );
        let _ = writeln!(
            out,
            "         consort retry --by <your-name> --dir {}",
            dir.display()
        );
    }
    if let Some(r) = &report.last_receipt {
        let _ = writeln!(
            out,
            "receipt: req-{} on {}: {} passed, {} not passed (ran {}; confined: {})",
            r.request, r.branch, r.passed, r.failed, r.covered, r.confinement
        );
    }
    if !report.flaky.is_empty() {
        let _ = writeln!(
            out,
            "flaky:   {} (failed once, passed on a fresh branch; no agent was charged)",
            report.flaky.join(", ")
        );
    }
    match &report.failing_before {
        Some(failing) if !failing.is_empty() => {
            let _ = writeln!(
                out,
                "baseline: {} failed before the feature (no agent is charged): {}",
                failing.len(),
                failing.join(", ")
            );
        }
        Some(_) => {
            let _ = writeln!(out, "baseline: every test of the project passed");
        }
        None => {}
    }
    for q in &report.quarantined {
        let _ = writeln!(
            out,
            "quarantined: {} by {}: {} (its failures judge nothing)",
            q.test, q.by, q.reason
        );
    }
    if let Some(g) = &report.git {
        let head = g.head.as_deref().unwrap_or("no commit yet");
        let _ = writeln!(out, "git:     {} at {head}", g.branch);
    }
    let _ = writeln!(out, "ledger:  {} events", report.ledger_entries);
    let usage = consort_actors::usage_totals(entries(project)?.iter().map(|e| &e.event));
    for line in ui::usage_lines(&usage) {
        let _ = writeln!(out, "usage:   {line}");
    }
    lanes_text(&mut out, dir, &report.lanes);
    Ok(out)
}

/// The lanes, a few lines each: where each stands and what it waits on.
fn lanes_text(out: &mut String, dir: &Path, lanes: &[consort::project::LaneStatus]) {
    if lanes.is_empty() {
        return;
    }
    let _ = writeln!(out, "lanes:");
    for lane in lanes {
        let step = lane
            .step
            .as_deref()
            .map(|s| format!(", {s}"))
            .unwrap_or_default();
        let place = match (&lane.work_tree, &lane.held_by, &lane.since) {
            (Some(tree), None, _) => format!("in {tree}"),
            (Some(tree), Some(who), Some(since)) => {
                format!("in {tree}, driven by {who} since {since}")
            }
            (_, Some(who), since) => format!(
                "driven by {who}{}",
                since
                    .as_ref()
                    .map(|s| format!(" since {s}"))
                    .unwrap_or_default()
            ),
            (None, None, _) => "on another machine".to_string(),
        };
        let _ = writeln!(
            out,
            "  {}: {}{step} {place} ({} tokens so far)",
            lane.feature,
            lane.phase,
            lane.usage.tokens()
        );
        if let Some(g) = &lane.pending_gate {
            let _ = writeln!(
                out,
                "    waits for a person at the {} gate: {} --feature {}",
                g.gate,
                consort::project::approve_command(dir, g.gate, &g.hash),
                lane.feature
            );
        }
        if let Some(h) = &lane.halted {
            let _ = writeln!(out, "    halted ({}) at {}: {}", h.reason, h.step, h.detail);
        }
        if let Some(r) = &lane.last_receipt {
            let _ = writeln!(
                out,
                "    last receipt: req-{} on {}: {} passed, {} not passed",
                r.request, r.branch, r.passed, r.failed
            );
        }
    }
}

/// `consort log`: one line per event (the last `last` when given), then the usage totals.
pub fn log_text(project: &Project, last: Option<usize>) -> Result<String, ViewError> {
    let entries = entries(project)?;
    let skip = last.map_or(0, |n| entries.len().saturating_sub(n));
    let mut out = String::new();
    for entry in &entries[skip..] {
        let _ = writeln!(
            out,
            "{:>5} {} {:<16} {}{}",
            entry.seq,
            entry.time.format("%H:%M:%S%.3f"),
            entry.event.name(),
            brief(&entry.event),
            usage_note(&entry.event)
        );
    }
    let totals = consort_actors::usage_totals(entries.iter().map(|e| &e.event));
    for line in ui::usage_lines(&totals) {
        let _ = writeln!(out, "usage: {line}");
    }
    Ok(out)
}

/// ` · 1200 tokens (…), 2 calls, 3.1 s` after an event that records usage.
fn usage_note(e: &Event) -> String {
    match e {
        Event::Produced { usage, .. } | Event::AgentFailed { usage, .. } if !usage.is_zero() => {
            let mut note = format!(" · {}", ui::usage_text(usage));
            if let Some(model) = &usage.model {
                note.push_str(&format!(" ({model})"));
            }
            note
        }
        _ => String::new(),
    }
}

/// One event, briefly.
fn brief(e: &Event) -> String {
    match e {
        Event::Start { feature, .. } => format!("{}: {}", feature.id, feature.title),
        Event::Produced {
            assignment,
            author,
            artifact,
            ..
        } => format!("{assignment} {author} → {}", artifact.kind()),
        Event::AgentFailed {
            assignment,
            failure,
            ..
        } => format!("{assignment}: {failure}"),
        Event::Refused { violation, .. } => violation.to_string(),
        Event::Observed { tests, .. } => format!("{} test files", tests.len()),
        Event::Applied { workspace_hash, .. } => format!("work tree {}", workspace_hash.short()),
        Event::ApplyRefused { reason } => reason.to_string(),
        Event::ApplyDenied {
            violation,
            resolved,
        } if resolved.is_empty() => violation.to_string(),
        Event::ApplyDenied {
            violation,
            resolved,
        } => {
            let links: Vec<String> = resolved.iter().map(|(a, b)| format!("{a} → {b}")).collect();
            format!("{violation} (through links: {})", links.join(", "))
        }
        Event::VerifyCompleted { receipt } => format!(
            "{} on {}: {} outcomes, {}",
            receipt.request_id,
            receipt.branch_id,
            receipt.outcomes.len(),
            receipt.exit
        ),
        Event::VerifyFailed { request, error } => format!("{request}: {error}"),
        Event::Gate { approval } => format!(
            "{} {} by {} for {}",
            approval.gate,
            match &approval.decision {
                GateDecision::Approve => "approved".to_string(),
                GateDecision::Reject { reason } => format!("rejected ({reason})"),
            },
            approval.approver,
            approval.hash.short()
        ),
        Event::Promoted { report } => match &report.merge_check {
            Some(check) => format!(
                "{}: {}, after the merge check with {} ({} on {}: {} outcomes, {})",
                report.target,
                report.applied_text(),
                check.merged_with.join(", "),
                check.receipt.request_id,
                check.receipt.branch_id,
                check.receipt.outcomes.len(),
                check.receipt.exit
            ),
            None => format!("{}: {}", report.target, report.applied_text()),
        },
        Event::PromoteFailed { request, error } => format!("{request}: {error}"),
        Event::Retired { retirement: r } => {
            format!("{}/{} retired by {}: {}", r.feature, r.test, r.by, r.reason)
        }
        Event::Quarantined { quarantine: q } => {
            format!("{} quarantined by {}: {}", q.test, q.by, q.reason)
        }
        Event::Redone { redo: r } => {
            format!(
                "{}'s test set aside by {}, to be written again: {}",
                r.test, r.by, r.reason
            )
        }
        Event::HarnessChanged { change } => {
            format!("by {}: {}", change.by, change.summary())
        }
        Event::Human { decision, by } => {
            let decision = match decision {
                HumanDecision::Retry => "retry",
                HumanDecision::Stop => "stop",
            };
            format!("{decision} by {by}")
        }
    }
}

/// How the receipts' runs were confined, counted: `confinement: Landlock ABI 7 (files and TCP) ×24`.
fn confinement_summary(receipts: &[Arc<TestRunReceipt>]) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in receipts {
        *counts.entry(r.confinement.to_string()).or_default() += 1;
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(how, n)| format!("{how} ×{n}"))
        .collect();
    if parts.is_empty() {
        "no runs yet".into()
    } else {
        format!("confinement: {}", parts.join(", "))
    }
}

/// `consort verify`: every started feature's checks (or `only`'s), a line each; whether all
/// held.
pub fn verify_text(dir: &Path, only: Option<&str>) -> Result<(bool, String), ViewError> {
    let project = Project::open_feature(dir, only)?;
    let mut started = Vec::new();
    for f in project.backlog()? {
        let is_it = only.is_none_or(|id| id == f.id);
        if is_it && project.state_of(&f)? != FeatureState::Waiting {
            started.push(Project::open_feature(dir, Some(&f.id))?);
        }
    }
    if started.is_empty() {
        return Ok((
            true,
            "nothing to verify yet: no feature has started\n".into(),
        ));
    }
    let released = released_tests(&project)?;
    let (mut ok, mut out) = (true, String::new());
    for feature in &started {
        if started.len() > 1 || project.backlog()?.len() > 1 {
            let _ = writeln!(out, "feature {}", feature.feature_id());
        }
        ok &= verify_feature(feature, &released, &mut out)?;
    }
    Ok((ok, out))
}

/// The files of earlier tests that a later feature retired (and so may have replaced), with
/// the decision, over the whole backlog.
fn released_tests(project: &Project) -> Result<BTreeMap<String, String>, ViewError> {
    let mut out = BTreeMap::new();
    for f in project.backlog()? {
        let later = Project::open_feature(&project.dir, Some(&f.id))?;
        let state = later.state()?;
        for r in &state.retired {
            if let Some(t) = state.inherited.find(&r.feature, &r.test)
                && state.inherited.released(&t.path, &state.retired)
            {
                let why = format!("retired by {} for {} ({})", r.by, f.id, r.reason);
                out.insert(t.path.clone(), why);
            }
        }
    }
    Ok(out)
}

/// Checks one feature's record; writes a line per check.
fn verify_feature(
    project: &Project,
    released: &BTreeMap<String, String>,
    out: &mut String,
) -> Result<bool, ViewError> {
    let mut ok = true;
    let mut check = |name: &str, result: Result<String, String>| match result {
        Ok(detail) => {
            let _ = writeln!(out, "ok    {name}: {detail}");
        }
        Err(detail) => {
            ok = false;
            let _ = writeln!(out, "FAIL  {name}: {detail}");
        }
    };
    project.restore_design()?;
    let chain = project.records().verify(project.feature_entry());
    check(
        "ledger chain",
        chain
            .as_ref()
            .map(|r| format!("{} entries, head {}", r.entries, r.head.short()))
            .map_err(|e| consort_actors::error_chain(e)),
    );
    if chain.is_err() {
        return Ok(false);
    }
    check_nothing_after_the_end(project, &mut check)?;
    let state = project.state()?;
    let work = WorkTree::open(project.work_tree())?;
    match &state.frozen {
        Some(frozen) => {
            let on_disk = design_hash_on_disk(&project.design_path());
            check(
                "frozen design",
                if on_disk == Some(frozen.hash) {
                    Ok(format!("{} matches the approved hash", frozen.hash.short()))
                } else {
                    Err(format!(
                        "approved {}, on disk {}",
                        frozen.hash,
                        on_disk.map_or("missing or unreadable".into(), |h| h.to_hex())
                    ))
                },
            );
        }
        None => check("frozen design", Ok("not frozen yet".into())),
    }
    if state.status == consort_actors::RunStatus::Stopped {
        // A stopped feature promoted nothing and no later feature inherits its tests: its
        // record must hold (the chain, the design, the receipts), its test files bind nothing.
        check(
            "stopped",
            Ok(format!(
                "the run was stopped; its {} frozen test files bind nothing and are not checked",
                state.build.frozen_tests.len()
            )),
        );
    } else {
        let hashes = work.file_hashes()?;
        check(
            "frozen tests",
            frozen_tests_check(&state, &hashes, released),
        );
    }
    for (name, result) in decisions_on_tests(&state) {
        check(name, Ok(result));
    }
    check("receipts", receipts_check(project, &state)?);
    if let Some(check_run) = state
        .promotion
        .as_ref()
        .and_then(|p| p.merge_check.as_ref())
    {
        check("merge check", merge_check_text(check_run));
    }
    Ok(ok)
}

/// What people decided about tests, and what the baseline found, a line each (`consort
/// verify` lists them: none is a fault).
fn decisions_on_tests(state: &State) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for r in &state.redone {
        out.push((
            "test written again",
            format!("{} by {}: {}", r.test, r.by, r.reason),
        ));
    }
    if let Some(b) = &state.baseline {
        out.push((
            "baseline",
            match b.failing.as_slice() {
                [] => format!("req-{}: every test of the project passed", b.request.0),
                failing => format!(
                    "req-{}: {} failed before the feature: {}",
                    b.request.0,
                    failing.len(),
                    failing.join(", ")
                ),
            },
        ));
    }
    for q in state.quarantines() {
        out.push((
            "quarantined test",
            format!(
                "{} by {}: {} (its failures judged nothing)",
                q.test, q.by, q.reason
            ),
        ));
    }
    for c in &state.harness_changes {
        out.push((
            "harness changed",
            format!(
                "by {}: {}; the receipts after it name harness {}",
                c.by,
                c.summary(),
                c.to.hash().short()
            ),
        ));
    }
    for r in &state.retired {
        out.push((
            "retired test",
            format!("{}/{} by {}: {}", r.feature, r.test, r.by, r.reason),
        ));
    }
    out
}

/// Every frozen test file as it was frozen, or replaced after a recorded retirement.
fn frozen_tests_check(
    state: &State,
    hashes: &FileHashes,
    released: &BTreeMap<String, String>,
) -> Result<String, String> {
    let (changed, bad): (Vec<&String>, Vec<&String>) = state
        .build
        .frozen_tests
        .iter()
        .filter(|(p, h)| hashes.get(*p) != Some(h))
        .map(|(p, _)| p)
        .partition(|p| released.contains_key(*p));
    if !bad.is_empty() {
        let names: Vec<&str> = bad.iter().map(|p| p.as_str()).collect();
        return Err(format!("changed or missing: {}", names.join(", ")));
    }
    let mut text = format!(
        "{} files unchanged",
        state.build.frozen_tests.len() - changed.len()
    );
    if !changed.is_empty() {
        let replaced: Vec<String> = changed
            .iter()
            .map(|p| format!("{p} {}", released[*p]))
            .collect();
        text.push_str(&format!(
            "; replaced after retirement: {}",
            replaced.join("; ")
        ));
    }
    Ok(text)
}

/// Every receipt answers a request the machine issued, and reports something.
fn receipts_check(project: &Project, state: &State) -> Result<Result<String, String>, ViewError> {
    let events = entries(project)?;
    let m = project.machine()?;
    let mut s = State::default();
    let mut issued = BTreeSet::new();
    for e in &events {
        if let Ok((next, cmds)) = m.step(&s, &e.event) {
            for c in cmds {
                if let Command::Verify { request, .. } = c {
                    issued.insert(request);
                }
            }
            s = next;
        }
    }
    let unissued = state
        .receipts
        .iter()
        .filter(|r| !issued.contains(&r.request_id) || r.outcomes.is_empty())
        .count();
    Ok(if unissued == 0 {
        Ok(format!(
            "{} receipts, each answering a request the machine issued; {}",
            state.receipts.len(),
            confinement_summary(&state.receipts)
        ))
    } else {
        Err(format!(
            "{unissued} receipts answer no issued request or report nothing"
        ))
    })
}

/// A lane's merge check as `consort verify` reads it from the promotion's record: every test
/// it ran passed, on a branch of its own, confined.
fn merge_check_text(run: &consort_actors::MergeCheckRun) -> Result<String, String> {
    let r = &run.receipt;
    let failing: Vec<&str> = r
        .outcomes
        .iter()
        .filter(|o| o.status != TestStatus::Passed)
        .map(|o| o.name.as_str())
        .collect();
    if r.outcomes.is_empty() || !failing.is_empty() {
        return Err(format!(
            "{} promoted though its merge check did not pass: {}",
            r.request_id,
            if failing.is_empty() {
                "it reported no test".to_string()
            } else {
                failing.join(", ")
            }
        ));
    }
    Ok(format!(
        "{} on branch {}, merged with {}: {} passed; confinement: {}",
        r.request_id,
        r.branch_id,
        run.merged_with.join(", "),
        r.outcomes.len(),
        r.confinement
    ))
}

/// `consort branches`: Consort's branches on the project's provider.
pub async fn branches_text(project: &Project) -> Result<String, ViewError> {
    branches_on(project.provider().await?.as_ref()).await
}

/// Consort's branches on `provider`, a line each, then their count.
pub async fn branches_on(
    provider: &dyn consort_lakebase::BranchProvider,
) -> Result<String, ViewError> {
    let list = provider.list("consort-").await?;
    let mut out = String::new();
    for b in &list {
        let _ = writeln!(out, "{}  ({})", b.name, b.id);
    }
    let _ = writeln!(
        out,
        "{} branch(es) with Consort's prefix on {}",
        list.len(),
        provider.kind()
    );
    if let Some(place) = provider.branches_in_memory() {
        let _ = writeln!(
            out,
            "branches are made in memory, in {} (a tmpfs, while it has room); `[database] branches_in_memory = false` keeps them on disk",
            place.display()
        );
    }
    Ok(out)
}

/// Verify's check that a run that ended (done or stopped) has nothing recorded after its end:
/// a row there is a process that went on driving a feature a person had stopped.
fn check_nothing_after_the_end(
    project: &Project,
    check: &mut impl FnMut(&str, Result<String, String>),
) -> Result<(), ViewError> {
    let events = project.events()?;
    let Some(end) = project.machine()?.ended_at(&events) else {
        return Ok(());
    };
    let after = &events[end + 1..];
    let ended = format!("entry {} ({})", end + 1, events[end].name());
    check(
        "run's end",
        match after.first() {
            None => Ok(format!("nothing recorded after the run ended at {ended}")),
            Some(first) => Err(format!(
                "the run ended at {ended}, but {} came after it (the first: entry {}, {}): a process went on after the run was over",
                consort_actors::counted(after.len() as u64, "entry", "entries"),
                end + 2,
                first.name()
            )),
        },
    );
    Ok(())
}

/// The design bundle written at the design gate (frozen once approved), with where it stands.
pub fn design_text(project: &Project) -> Result<String, ViewError> {
    let state = project.state()?;
    let path = project.design_path();
    let status = match (&state.frozen, state.pending_gate()) {
        (Some(f), _) => format!("frozen: approved hash {}", f.hash),
        (None, Some((GateKind::Design, hash))) => {
            format!("waiting at the design gate for approval of {hash}")
        }
        _ => "not written yet: the design lane has not reached its gate".into(),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => return Err(ViewError::Read { path, source }),
    };
    if text.is_empty() {
        return Ok(format!("design: {status}\n"));
    }
    Ok(format!("design ({status}), {}:\n{text}", path.display()))
}

/// What waits next, and the exact command a person runs for it (`by` names them, else
/// `<your-name>`).
pub fn next_text(project: &Project, by: Option<&str>) -> Result<String, ViewError> {
    let dir = project.dir.display();
    let who = by.unwrap_or("<your-name>");
    if !project.has_started()? {
        return Ok(format!(
            "feature {} has not started: start it with\n  consort run --dir {dir}\n",
            project.feature_id()
        ));
    }
    let state = project.state()?;
    if let Some((gate, hash)) = state.pending_gate() {
        return Ok(format!(
            "the {gate} gate waits for a person's approval of {hash}:\n  consort approve {gate} --hash {hash} --by {who} --dir {dir}\n(or reject it: consort reject {gate} --hash {hash} --by {who} --reason \"…\" --dir {dir})\n"
        ));
    }
    let report = status_report(project)?;
    if let Some(h) = &report.halted {
        return Ok(format!(
            "the run halted at {} ({}: {}): fix the cause, then\n  consort retry --by {who} --dir {dir}\nor end it:\n  consort stop --by {who} --dir {dir}\n",
            h.step, h.reason, h.detail
        ));
    }
    Ok(match &state.pending {
        None => format!(
            "feature {} is {}; nothing waits\n",
            project.feature_id(),
            report.phase
        ),
        Some(Pending::Agent { id, step, .. }) => {
            let role = step.role();
            let parked = project.mailbox().parked(id.0).ok().flatten().is_some();
            if parked {
                format!(
                    "the {role} step {step} waits for an MCP client: call `next_assignment` with role \"{role}\", then `submit`\n"
                )
            } else {
                format!(
                    "the {role} works on {step}; nothing waits for a person (if no run is going on: consort run --dir {dir})\n"
                )
            }
        }
        Some(_) => format!(
            "the run is at {}; nothing waits for a person (if no run is going on: consort run --dir {dir})\n",
            report.step.as_deref().unwrap_or("its next step")
        ),
    })
}

/// Records a gate decision exactly as `consort approve` / `consort reject` do: under the
/// project's run lock, for the exact hash; returns the line to print.
pub fn decide_gate(
    project: &Project,
    gate: GateKind,
    hash: &str,
    by: &str,
    decision: GateDecision,
    note: String,
) -> Result<String, DecideError> {
    if by.trim().is_empty() {
        return Err(DecideError::NoName);
    }
    let hash: ContentHash = hash.parse().map_err(DecideError::BadHash)?;
    let approval = GateApproval {
        gate,
        hash,
        approver: by.to_string(),
        at: Utc::now(),
        decision,
        note,
    };
    let command = match approval.decision {
        GateDecision::Approve => "consort approve",
        GateDecision::Reject { .. } => "consort reject",
    };
    let _locks = project.lock_ledger(command)?;
    match project
        .record_judged(|log, machine| record_gate_decision(log, machine, approval.clone()))?
    {
        Ok(()) => Ok(format!("recorded: {gate} gate decision by {by} for {hash}")),
        Err(ConductorError::Gate(msg)) => Err(DecideError::Refused(msg)),
        Err(e) => Err(DecideError::Conductor(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merge_check_verifies_only_when_every_test_it_ran_passed() {
        let receipt = |statuses: &[(&str, TestStatus)]| {
            consort_testkit::artifacts::receipt_with(
                consort_actors::RequestId(1_000_007),
                ContentHash::of_bytes(b"merged tree"),
                statuses,
                1,
                "",
            )
        };
        let run = |r: TestRunReceipt| consort_actors::MergeCheckRun {
            merged_with: vec!["f2-orders".into()],
            receipt: Box::new(r),
        };
        let passed = merge_check_text(&run(receipt(&[("t1", TestStatus::Passed)])));
        assert!(
            passed
                .as_ref()
                .is_ok_and(|t| t.contains("merged with f2-orders: 1 passed")),
            "{passed:?}"
        );
        let failed = merge_check_text(&run(receipt(&[
            ("t1", TestStatus::Passed),
            ("t2", TestStatus::Failed),
        ])));
        assert!(
            failed
                .as_ref()
                .is_err_and(|t| t.contains("did not pass: t2")),
            "{failed:?}"
        );
        assert!(merge_check_text(&run(receipt(&[]))).is_err());
    }
}
