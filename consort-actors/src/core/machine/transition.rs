//! The transition function. Each event is first checked against what is pending — the
//! assignment it answers, the request a receipt is for, the work tree it was run on — and its
//! content against the rules; what finished is then handed to the lifecycle table
//! ([`super::next::next_after`]), the one place that says what comes next: idle → design lane →
//! design gate → build lane (RED, GREEN, repair, REFACTOR, REVIEW per test) → deploy gate →
//! deploy → promote gate → promote → done. Any step can halt for a human.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::core::artifact::{
    ArchitectureVerdict, Artifact, ChangeSet, Escalation, EscalationReason, FileHashes,
    GateApproval, GateDecision, GateKind, InfraFault, Migration, RequestId, ReviewVerdict,
    TestOutcome, TestRunReceipt, TestStatus, VerdictReason,
};
use crate::core::hash::ContentHash;
use crate::core::paths::PathPolicy;
use crate::core::protocol::{
    AgentFailure, AssignmentId, InfraError, PromoteReport, StepScope, VerifyPurpose,
};
use crate::core::role::ActorId;
use crate::core::step::Step;
use crate::core::test_outline::{Language, TestFileVerdicts};

use super::next::{
    Done, Next, agent, escalation, invariant, next_after, observe, resume_agent, revert,
};
use super::rules::{
    Remedy, RuleViolation, Writer, check_architecture, check_change_set, check_files_frozen_whole,
    check_review, check_schema, check_spec, check_stories, check_test_list, check_tests_on_disk,
    check_ux, joins_frozen_file, written_hashes,
};
use super::{
    Command, Event, Frozen, FrozenWrite, HumanDecision, MachineConfig, Pending, RunStatus, State,
};

type Outcome = Result<(State, Vec<Command>), RuleViolation>;

/// How an agent's feedback after a refused answer begins, and how its first line ends.
const REFUSED: &str = "Your previous answer was refused: ";
const TRY_AGAIN: &str = " Try again within the rules.";

/// The refusal a feedback text reports: its first line, without the words around the
/// violation when it is a refused answer's feedback (None: an empty feedback).
pub fn refusal_said(feedback: &str) -> Option<&str> {
    let line = feedback.lines().next().filter(|l| !l.trim().is_empty())?;
    let line = line.strip_prefix(REFUSED).unwrap_or(line);
    Some(line.strip_suffix(TRY_AGAIN).unwrap_or(line))
}

/// Longest receipt excerpt handed back to an agent as feedback.
const FEEDBACK_EXCERPT: usize = 2000;
/// Most characters of the failing tests' own messages an agent is told (before the output).
const FAILURES_SAID: usize = 3000;

pub(super) fn step(cfg: &MachineConfig, state: &State, event: &Event) -> Outcome {
    // A quarantine is taken whenever a run goes on or waits for a person.
    if let Event::Quarantined { quarantine: q } = event
        && matches!(state.status, RunStatus::Running | RunStatus::Halted { .. })
    {
        return quarantine(state, q);
    }
    if let Event::HarnessChanged { change } = event
        && matches!(state.status, RunStatus::Running | RunStatus::Halted { .. })
    {
        return harness_changed(state, change);
    }
    match &state.status {
        RunStatus::Done | RunStatus::Stopped => match event {
            Event::Refused { .. } => Ok((state.clone(), Vec::new())),
            _ => Err(RuleViolation::Finished),
        },
        RunStatus::Idle => idle(cfg, state, event),
        RunStatus::Halted { .. } => halted(state, event),
        // A redo needs a run no process drives and that waits for a person: a halted one.
        RunStatus::Running if matches!(event, Event::Redone { .. }) => {
            Err(RuleViolation::NotHalted)
        }
        RunStatus::Running => running(cfg, state, event),
    }
}

fn out_of_order(expected: &str, event: &Event) -> RuleViolation {
    RuleViolation::StepOutOfOrder {
        expected: expected.to_string(),
        got: event.name().to_string(),
    }
}

fn idle(cfg: &MachineConfig, state: &State, event: &Event) -> Outcome {
    match event {
        Event::Start {
            feature,
            inherited,
            per_step,
            harness,
        } => {
            if feature.id.trim().is_empty() || feature.title.trim().is_empty() {
                return Err(RuleViolation::InvalidArtifact {
                    detail: "the feature request needs an id and a title".into(),
                });
            }
            let mut s = state.clone();
            s.status = RunStatus::Running;
            s.feature = Some(Arc::new(feature.clone()));
            s.inherited = Arc::new(inherited.clone());
            s.per_step = *per_step;
            s.harness = harness.clone();
            advance(cfg, s, Done::Started)
        }
        Event::Refused { .. } => Ok((state.clone(), Vec::new())),
        _ => Err(out_of_order("a feature request", event)),
    }
}

fn halted(state: &State, event: &Event) -> Outcome {
    let RunStatus::Halted { escalation, resume } = &state.status else {
        return Err(RuleViolation::NotHalted);
    };
    match event {
        Event::Human {
            decision: HumanDecision::Stop,
            ..
        } => Ok(stopped(state)),
        Event::Human {
            decision: HumanDecision::Retry,
            ..
        } => {
            let mut s = state.clone();
            match &escalation.reason {
                EscalationReason::Verdict(VerdictReason::RepairBoundSpent) => s.build.repairs = 0,
                EscalationReason::Verdict(VerdictReason::ReviewBoundSpent) => {
                    s.build.review_rounds = 0
                }
                EscalationReason::Verdict(VerdictReason::RevisionBoundSpent) => s.revisions = 0,
                _ => {}
            }
            s.status = RunStatus::Running;
            let next = refresh(&mut s, (**resume).clone());
            Ok(go(s, next))
        }
        Event::Retired { retirement } => retire(state, retirement),
        Event::Redone { redo: r } => redo(state, r),
        Event::Refused { .. } => Ok((state.clone(), Vec::new())),
        _ => Err(out_of_order("a human decision on the halt", event)),
    }
}

/// A human ends a run that is not halted: one interrupted mid-step (its process killed, its
/// ledger still running) or one waiting at a gate; never an approved promotion, which may be
/// under way (its merge in the base, its migrations not yet in the parent) and is finished,
/// never cut in two.
fn stop_running(state: &State) -> Outcome {
    if state.phase() == super::Phase::Promote {
        return Err(RuleViolation::PromotionUnderWay);
    }
    Ok(stopped(state))
}

/// A human ended the run: nothing pending is performed any more.
fn stopped(state: &State) -> (State, Vec<Command>) {
    let mut s = state.clone();
    s.status = RunStatus::Stopped;
    s.pending = None;
    (s, vec![Command::Finish])
}

/// A human retired an earlier feature's test: it leaves the regression suite, and its file is
/// no longer frozen once no test in force shares it. Nothing else changes; the run goes on (or
/// stays halted) exactly where it was.
fn retire(state: &State, retirement: &crate::core::regression::Retirement) -> Outcome {
    let (feature, test) = (&retirement.feature, &retirement.test);
    let Some(earlier) = state.inherited.find(feature, test) else {
        return Err(RuleViolation::NotAnEarlierTest {
            feature: feature.clone(),
            test: test.clone(),
        });
    };
    if state.retired.iter().any(|r| r.retires(earlier)) {
        return Err(RuleViolation::AlreadyRetired {
            feature: feature.clone(),
            test: test.clone(),
        });
    }
    let mut s = state.clone();
    s.retired.push(retirement.clone());
    if s.inherited.released(&earlier.path, &s.retired) {
        s.build.frozen_tests.remove(&earlier.path);
    }
    Ok((s, Vec::new()))
}

/// A person quarantined a test: from now on its failures judge nothing. Nothing else changes;
/// the run goes on (or stays halted) where it was (a halt on the baseline is retried by a
/// person, and the baseline run again).
fn quarantine(state: &State, q: &crate::core::regression::Quarantine) -> Outcome {
    if q.test.trim().is_empty() {
        return Err(RuleViolation::InvalidArtifact {
            detail: "a quarantine names a test".into(),
        });
    }
    if state.is_quarantined(&q.test) {
        return Err(RuleViolation::AlreadyQuarantined {
            test: q.test.clone(),
        });
    }
    let mut s = state.clone();
    s.quarantined.push(q.clone());
    Ok((s, Vec::new()))
}

/// A person's change to the configuration that judges the runs: taken only from the harness
/// in force (a record made against another is refused), and only when something changed. The
/// baseline runs again before the next run is judged, except in an approved promotion: no run
/// is judged there any more, and a baseline that halted it could leave its merge in the base
/// and its migrations out of the parent.
fn harness_changed(state: &State, change: &crate::core::harness::HarnessChange) -> Outcome {
    let refuse = |detail: &str| {
        Err(RuleViolation::InvalidArtifact {
            detail: detail.into(),
        })
    };
    if change.by.trim().is_empty() {
        return refuse("a harness change names who made it");
    }
    if state.harness.as_ref().is_some_and(|h| *h != change.from) {
        return refuse("the harness change does not start from the harness in force");
    }
    if change.to.changed_from(&change.from).is_empty() {
        return refuse("the harness change changes nothing");
    }
    let mut s = state.clone();
    s.harness = Some(change.to.clone());
    s.harness_changes.push(change.clone());
    if state.phase() != super::Phase::Promote {
        baseline_again(&mut s);
    }
    Ok((s, Vec::new()))
}

/// After a harness change in a feature whose baseline ran, the baseline runs again before the
/// run goes on (a halted run's retry, a resumed run's next command): what the project's tests
/// do under the new harness is known before anyone is charged for it.
fn baseline_again(s: &mut State) {
    if s.baseline.is_none() {
        return;
    }
    let again = |s: &State, then: Box<Pending>| match *then {
        p @ Pending::Baseline { .. } => p,
        p => Pending::Baseline {
            request: RequestId(s.next_request + 1),
            then: Some(Box::new(p)),
        },
    };
    match std::mem::replace(&mut s.status, RunStatus::Running) {
        RunStatus::Halted { escalation, resume } => {
            let resume = Box::new(again(s, resume));
            s.status = RunStatus::Halted { escalation, resume };
        }
        status => {
            s.status = status;
            if let Some(p) = s.pending.take() {
                let p = again(s, Box::new(p));
                if matches!(p, Pending::Baseline { then: Some(_), .. }) {
                    s.next_request += 1;
                }
                s.pending = Some(p);
            }
        }
    }
}

/// A person set aside the running entry's accepted test: its file stays frozen for everyone
/// but the entry's next RED, which must write it again; the run goes on from that RED, with the
/// repair and review bounds fresh and the person's reason as the Navigator's feedback.
fn redo(state: &State, redo: &super::Redo) -> Outcome {
    let refuse = |why: &str| {
        Err(RuleViolation::NotARedoableTest {
            test: redo.test.clone(),
            why: why.into(),
        })
    };
    let Some(entry) = state
        .current_test()
        .filter(|e| state.frozen.is_some() && e.id == redo.test)
    else {
        return refuse("it is not the entry the build lane is on");
    };
    if !state.build.frozen_tests.contains_key(&entry.path) {
        return refuse("its RED was not accepted yet (retry the run instead)");
    }
    // In a parsed file only the test is set aside; a file frozen whole must be this test's own.
    let shared = state
        .test_list
        .iter()
        .flat_map(|l| l.entries.iter())
        .any(|e| e.id != entry.id && e.path == entry.path)
        || state.inherited.owner(&entry.path, &state.retired).is_some();
    if shared && Language::of(&entry.path).is_none() {
        return refuse(
            "its file holds other accepted tests too, and its language is not parsed, so the file is frozen whole",
        );
    }
    let (id, path) = (entry.id.clone(), entry.path.clone());
    let mut s = state.clone();
    s.status = RunStatus::Running;
    s.build.repairs = 0;
    s.build.review_rounds = 0;
    s.build.redo = Some(path.clone());
    s.redone.push(redo.clone());
    let feedback = format!(
        "A person ({}) set aside your accepted test of {id} ({path}) as wrong: {}. Write {id}'s test again in {path} (you may rewrite that file now, and only that test file): it must fail for the behaviour {id} asks for, and every other test must still pass. Code from the attempts to make the old test pass may be in the tree.",
        redo.by, redo.reason
    );
    let next = observe(agent(&mut s, Step::Red { test: id }, 0, vec![feedback]));
    Ok(go(s, next))
}

/// Gives a resumed pending item fresh ids (an agent retry is a new assignment, attempt 0).
fn refresh(s: &mut State, p: Pending) -> Pending {
    match p {
        Pending::Agent { step, feedback, .. } => agent(s, step, 0, feedback),
        Pending::Observe { then } => observe(refresh(s, *then)),
        Pending::Baseline { then, .. } => Pending::Baseline {
            request: super::next::next_request(s),
            then: then.map(|t| Box::new(refresh(s, *t))),
        },
        other => other,
    }
}

/// Steps on from `done` by the lifecycle table.
fn advance(cfg: &MachineConfig, mut s: State, done: Done) -> Outcome {
    let kind = done.kind();
    let before = s.phase();
    let (after, commands) = match next_after(cfg, &mut s, done)? {
        Next::Go(next) => go(s, next),
        Next::Halt(esc, resume) => halt(&mut s, esc, resume),
        Next::Finish => {
            s.status = RunStatus::Done;
            s.pending = None;
            (s, vec![Command::Finish])
        }
    };
    // Staying in its phase is no edge (a baseline run again after a harness change stays in
    // the phase of what it goes on with).
    debug_assert!(
        after.phase() == before || super::next::row(kind).2.contains(&after.phase()),
        "the lifecycle's edges name every phase its table leads to"
    );
    Ok((after, commands))
}

fn running(cfg: &MachineConfig, state: &State, event: &Event) -> Outcome {
    let Some(pending) = state.pending.clone() else {
        return Err(invariant("a running machine waits for something"));
    };
    match event {
        Event::Refused {
            violation,
            run_output,
        } => return refused(cfg, state, pending, violation, run_output.as_deref()),
        // A human may end a run that is not halted (see `stop_running`). A retry needs a halt.
        Event::Human {
            decision: HumanDecision::Stop,
            ..
        } => return stop_running(state),
        Event::Retired { retirement } => return retire(state, retirement),
        _ => {}
    }
    if let Pending::Gate { gate, hash } = &pending {
        return match event {
            Event::Gate { approval } => gate_decision(cfg, state, *gate, *hash, approval),
            Event::Human { .. } => Err(RuleViolation::NotHalted),
            _ => Err(RuleViolation::GateNotApproved { gate: *gate }),
        };
    }
    match (event, pending) {
        (
            Event::Produced {
                assignment,
                author,
                artifact,
                ..
            },
            Pending::Agent {
                id, step, attempt, ..
            },
        ) => {
            same_assignment(id, *assignment)?;
            produced(cfg, state, step, attempt, author, artifact)
        }
        (Event::Produced { assignment, .. }, _) => Err(RuleViolation::UnknownAssignment {
            expected: None,
            got: *assignment,
        }),
        (
            Event::AgentFailed {
                assignment,
                failure,
                ..
            },
            Pending::Agent {
                id, step, feedback, ..
            },
        ) => {
            same_assignment(id, *assignment)?;
            Ok(agent_failed(state, step, feedback, failure))
        }
        (
            Event::Observed {
                design_hash,
                tests,
                migrations,
            },
            Pending::Observe { then },
        ) => observed(cfg, state, (*design_hash, migrations), tests, *then),
        (Event::Applied { .. }, p @ (Pending::Apply { .. } | Pending::Revert { .. })) => {
            applied(cfg, state, event, p)
        }
        (Event::ApplyRefused { reason }, Pending::Apply { .. }) => {
            Err(RuleViolation::PathOutsideWorkTree {
                reason: reason.clone(),
            })
        }
        (
            Event::ApplyDenied {
                violation,
                resolved,
            },
            p @ (Pending::Apply { .. } | Pending::Revert { .. }),
        ) => apply_denied(cfg, state, p, violation, resolved),
        (Event::VerifyCompleted { receipt }, Pending::Baseline { request, then }) => {
            baseline_completed(cfg, state, receipt, request, then)
        }
        (Event::VerifyCompleted { receipt }, p) => verify_completed(cfg, state, receipt, p),
        (
            Event::VerifyFailed { request, error },
            p @ (Pending::Verify { .. } | Pending::Baseline { .. }),
        ) => infra_failed(state, *request, error, p),
        (Event::Promoted { report }, Pending::Promote { request }) => {
            promoted(cfg, state, request, report)
        }
        (Event::PromoteFailed { request, error }, p @ Pending::Promote { .. }) => {
            infra_failed(state, *request, error, p)
        }
        (Event::Gate { approval }, _) => Err(RuleViolation::GateNotPending {
            gate: approval.gate,
        }),
        (Event::Human { .. }, _) => Err(RuleViolation::NotHalted),
        (event, pending) => Err(out_of_order(&describe(&pending), event)),
    }
}

// ---------- identity: does the event answer what is pending? ----------

/// The assignment an agent's answer (or failure) names must be the pending one.
fn same_assignment(pending: AssignmentId, got: AssignmentId) -> Result<(), RuleViolation> {
    if pending == got {
        return Ok(());
    }
    Err(RuleViolation::UnknownAssignment {
        expected: Some(pending),
        got,
    })
}

/// A receipt must answer the pending request, record a real run (a branch and a command: **no
/// receipt without a run**; the whole suite when the request asked for it, `whole`), leave the
/// tree as it was, and be for the work tree the request was issued for.
fn receipt_answers(
    pending: &Pending,
    receipt: &TestRunReceipt,
    whole: bool,
) -> Result<(), RuleViolation> {
    let Pending::Verify {
        request,
        workspace_hash,
        ..
    } = pending
    else {
        return Err(RuleViolation::ReceiptNotForRequest {
            expected: None,
            got: receipt.request_id,
        });
    };
    if receipt.request_id != *request {
        return Err(RuleViolation::ReceiptNotForRequest {
            expected: Some(*request),
            got: receipt.request_id,
        });
    }
    let missing = [
        ("branch", &receipt.branch_id),
        ("command", &receipt.command),
    ]
    .into_iter()
    .find(|(_, v)| v.trim().is_empty())
    .map(|(what, _)| what)
    .or((whole && !receipt.selection.is_empty()).then_some("the whole suite"));
    if let Some(missing) = missing {
        return Err(RuleViolation::ReceiptWithoutRun {
            request: receipt.request_id,
            missing: missing.into(),
        });
    }
    if !receipt.tree_changes.is_empty() {
        return Err(RuleViolation::RunChangedTree {
            paths: receipt.tree_changes.clone(),
        });
    }
    if receipt.workspace_hash != *workspace_hash {
        return Err(RuleViolation::ReceiptWorkspaceMismatch {
            expected: *workspace_hash,
            got: receipt.workspace_hash,
            paths: receipt.changed_since_request.clone(),
        });
    }
    Ok(())
}

// ---------- acceptance: check what arrived, keep it, name what finished ----------

/// An agent could not answer: halt; a retry assigns the step afresh.
fn agent_failed(
    state: &State,
    step: Step,
    feedback: Vec<String>,
    failure: &AgentFailure,
) -> (State, Vec<Command>) {
    let mut s = state.clone();
    let esc = escalation(
        &step.to_string(),
        failure.escalation_reason(),
        failure.to_string(),
    );
    let resume = resume_agent(&s, step, feedback);
    halt(&mut s, esc, resume)
}

fn observed(
    cfg: &MachineConfig,
    state: &State,
    (design_hash, migrations): (Option<ContentHash>, &BTreeMap<String, Option<ContentHash>>),
    tests: &FileHashes,
    then: Pending,
) -> Outcome {
    if let Some(frozen) = &state.frozen
        && design_hash != Some(frozen.hash)
    {
        return Err(RuleViolation::DesignHashMismatch {
            expected: frozen.hash,
            found: design_hash,
        });
    }
    check_migration_files(cfg, state, migrations)?;
    // Before the design gate nothing is frozen yet: the tree is looked at only to know whether
    // it holds a suite. A project with no test yet (no test file, no earlier feature's test)
    // has none to run before the feature: the design gate follows.
    if let Pending::Baseline {
        then: Some(gate), ..
    } = &then
        && state.frozen.is_none()
    {
        let nothing_to_run =
            tests.is_empty() && state.inherited.live(&state.retired).next().is_none();
        let next = if nothing_to_run {
            (**gate).clone()
        } else {
            then
        };
        return Ok(go(state.clone(), next));
    }
    if is_first_build_observation(state, &then) {
        inherited_as_frozen(state, tests)?;
        // The project's own tests, there before the run: frozen like an accepted RED's, so no
        // agent changes them and every later run must keep them passing.
        let mut s = state.clone();
        s.build.frozen_tests = tests
            .iter()
            .filter(|(path, _)| !s.inherited.released(path, &s.retired))
            .map(|(path, hash)| (path.clone(), *hash))
            .collect();
        // A project with no test yet (no test file, no earlier feature's test) has no suite
        // to run before the feature: its first RED follows (observed as every RED is).
        let nothing_to_run =
            s.build.frozen_tests.is_empty() && s.inherited.live(&s.retired).next().is_none();
        if matches!(then, Pending::Baseline { .. }) && nothing_to_run {
            let test = super::next::current_id(&s)?;
            let next = observe(agent(&mut s, Step::Red { test }, 0, Vec::new()));
            return Ok(go(s, next));
        }
        return Ok(go(s, then));
    }
    check_tests_on_disk(&state.build.frozen_tests, tests)?;
    Ok(go(state.clone(), then))
}

/// When the build lane opens, every earlier feature's test in force must be on disk exactly as
/// that feature froze it: changed by hand in between, it is refused as the earlier feature's.
fn inherited_as_frozen(state: &State, tests: &FileHashes) -> Result<(), RuleViolation> {
    for t in state.inherited.live(&state.retired) {
        if let Some(hash) = t.hash
            && tests.get(&t.path) != Some(&hash)
        {
            return Err(RuleViolation::EarlierTestFrozen {
                path: t.path.clone(),
                feature: t.feature.clone(),
                test: t.test.clone(),
            });
        }
    }
    Ok(())
}

/// Whether this observation opens the build lane: before the baseline or the first RED, with
/// no test frozen and no run made yet.
fn is_first_build_observation(state: &State, then: &Pending) -> bool {
    state.frozen.is_some()
        && state.build.current == 0
        && state.build.frozen_tests.is_empty()
        && state.receipts.is_empty()
        && matches!(
            then,
            Pending::Baseline { .. }
                | Pending::Agent {
                    step: Step::Red { .. },
                    attempt: 0,
                    ..
                }
        )
}

/// Once the design is frozen, every migration file it names must hold exactly its SQL. An
/// observation without migration files is one written before they existed (or by a conductor
/// that does not write them): nothing to compare.
fn check_migration_files(
    cfg: &MachineConfig,
    state: &State,
    found: &BTreeMap<String, Option<ContentHash>>,
) -> Result<(), RuleViolation> {
    let (Some(files), Some(_), Some(plan)) = (&cfg.migration_files, &state.frozen, &state.schema)
    else {
        return Ok(());
    };
    if found.is_empty() {
        return Ok(());
    }
    for (path, m) in files.planned(plan) {
        if found.get(&path).copied().flatten() != Some(m.checksum()) {
            return Err(RuleViolation::MigrationFileChanged { path });
        }
    }
    Ok(())
}

/// The conductor applied the pending change set or revert.
fn applied(cfg: &MachineConfig, state: &State, event: &Event, pending: Pending) -> Outcome {
    let Event::Applied {
        workspace_hash,
        tests,
        inverse,
    } = event
    else {
        return Err(invariant("only an applied event is applied"));
    };
    match pending {
        Pending::Apply {
            step,
            attempt,
            change_set,
        } => {
            let mut expected = state.build.frozen_tests.clone();
            if matches!(step, Step::Red { .. }) {
                expected.extend(written_hashes(&change_set));
            }
            check_tests_on_disk(&expected, tests)?;
            let mut s = state.clone();
            s.build.workspace_hash = Some(*workspace_hash);
            s.build.since_review.push(Arc::new(change_set));
            let done = Done::Applied {
                step,
                attempt,
                workspace_hash: *workspace_hash,
                tests: tests.clone(),
                inverse: inverse.clone(),
            };
            advance(cfg, s, done)
        }
        Pending::Revert { then, halt: h, .. } => {
            check_tests_on_disk(&state.build.frozen_tests, tests)?;
            let mut s = state.clone();
            s.build.workspace_hash = Some(*workspace_hash);
            Ok(match h {
                Some(esc) => halt(&mut s, esc, *then),
                None => go(s, *then),
            })
        }
        _ => Err(invariant("only an apply or a revert is applied")),
    }
}

fn verify_completed(
    cfg: &MachineConfig,
    state: &State,
    receipt: &TestRunReceipt,
    pending: Pending,
) -> Outcome {
    let whole = match &pending {
        Pending::Verify { purpose, .. } => selection(state, *purpose).is_none(),
        _ => true,
    };
    receipt_answers(&pending, receipt, whole)?;
    let Pending::Verify {
        step,
        purpose,
        inverse,
        tests_after,
        ..
    } = pending
    else {
        return Err(invariant("a receipt answers a pending verify run"));
    };
    let mut s = state.clone();
    let names = expected_names(&s, purpose);
    let quarantined = s.quarantined_names();
    let done = match purpose {
        VerifyPurpose::Red => {
            let focus = red_fails(cfg, &s, receipt, &names)?;
            s.build.frozen_tests = tests_after;
            s.build.redo = None;
            Done::RedFails {
                focus,
                excerpt: excerpt(receipt),
            }
        }
        VerifyPurpose::Green if all_pass(receipt, &names, &quarantined) => Done::GreenPasses,
        VerifyPurpose::Green => Done::GreenFails {
            step,
            feedback: failure_feedback(receipt, &names),
        },
        VerifyPurpose::Refactor if all_pass(receipt, &names, &quarantined) => Done::RefactorKept,
        VerifyPurpose::Refactor => Done::RefactorBroke {
            inverse,
            feedback: failure_feedback(receipt, &names),
        },
        VerifyPurpose::Deploy if all_pass(receipt, &names, &quarantined) => Done::DeployPasses {
            hash: ContentHash::of(&(
                s.schema.clone(),
                receipt.output_digest,
                receipt.workspace_hash,
            )),
        },
        VerifyPurpose::Deploy => Done::DeployFails {
            feedback: failure_feedback(receipt, &names),
        },
        VerifyPurpose::Baseline => {
            return Err(invariant(
                "the baseline is a pending baseline, not a verify run",
            ));
        }
    };
    s.receipts.push(Arc::new(receipt.clone()));
    advance(cfg, s, done)
}

/// A RED is real when the new test fails (or errors) and every earlier test still passes.
/// Returns the new test's runner name.
fn red_fails(
    cfg: &MachineConfig,
    s: &State,
    receipt: &TestRunReceipt,
    names: &[String],
) -> Result<String, RuleViolation> {
    let entry = s
        .current_test()
        .ok_or_else(|| invariant("a RED run has a current test entry"))?;
    let neighbours = names_in_file(s, &entry.path);
    let quarantined = s.quarantined_names();
    let focus = RedFocus {
        name: entry.runner_name().to_string(),
        file: Some(&entry.path),
        neighbours: &neighbours,
        quarantined: &quarantined,
    };
    red_fails_for(focus, &cfg.paths, receipt, names).map_err(|v| match v {
        RuleViolation::RedBrokeGreenTest { tests, .. } => RuleViolation::RedBrokeGreenTest {
            tests,
            migrations: migrations_new_at_current(s),
        },
        v => v,
    })
}

/// The versions of the design's migrations that the current entry's runs are the first to
/// apply: those of its story, at the story's first entry (the runs before had the earlier
/// stories' only; the baseline none).
fn migrations_new_at_current(s: &State) -> Vec<String> {
    let now = migrations_up_to(s, s.build.current);
    let before = match s.build.current.checked_sub(1) {
        Some(earlier) => migrations_up_to(s, earlier),
        None => Vec::new(),
    };
    now.into_iter()
        .filter(|m| !before.contains(m))
        .map(|m| m.version)
        .collect()
}

/// The runner names of the expected tests that live in `file` (the entries of this feature
/// and the earlier features' tests in force): what a file that fails to load keeps from
/// running. A Go test file loads with its package: every `_test.go` file of its directory.
pub(super) fn names_in_file(s: &State, file: &str) -> Vec<String> {
    let loads_with = |path: &str| path == file || same_go_package(path, file);
    let entries = s.test_list.iter().flat_map(|l| l.entries.iter());
    entries
        .filter(|e| loads_with(&e.path))
        .map(|e| e.runner_name().to_string())
        .chain(
            s.inherited
                .live(&s.retired)
                .filter(|t| loads_with(&t.path))
                .map(|t| t.runner_name.clone()),
        )
        .collect()
}

/// Whether `a` and `b` are test files of one Go package (one directory): one test binary,
/// built, or not, together.
fn same_go_package(a: &str, b: &str) -> bool {
    let dir = |p: &str| p.rsplit_once('/').map_or("", |(d, _)| d).to_string();
    a.ends_with("_test.go") && b.ends_with("_test.go") && dir(a) == dir(b)
}

/// The new test of a RED run: its runner name, and its file when known.
pub(super) struct RedFocus<'a> {
    /// The runner name.
    pub name: String,
    /// The test file.
    pub file: Option<&'a str>,
    /// The expected tests that live in the same file: when the file fails to load for a
    /// missing module of the project, they are not run because of the RED, not broken by it.
    pub neighbours: &'a [String],
    /// The tests a person quarantined: their failures judge nothing.
    pub quarantined: &'a [String],
}

/// [`red_fails`] for the new test `focus`.
///
/// **The first test of a new module is a RED**: a test file that failed to load because a
/// module of the project's code it imports is missing (the verifier's
/// [`TestRunReceipt::missing_modules`]; a code path by `paths`, never a test, the harness or
/// a dependency) fails because of what the test is about, so its new test counts as failed,
/// and the load failure's outcome is not an earlier test it broke. A syntax error, or a
/// missing package, leaves the test unreported: not a RED.
pub(super) fn red_fails_for(
    focus: RedFocus<'_>,
    paths: &PathPolicy,
    receipt: &TestRunReceipt,
    names: &[String],
) -> Result<String, RuleViolation> {
    let RedFocus {
        name: focus,
        file,
        neighbours,
        quarantined,
    } = focus;
    let mut load_failure = None;
    match receipt.status_of(&focus) {
        Some(TestStatus::Failed | TestStatus::Errored) => {}
        Some(TestStatus::Passed) => {
            return Err(RuleViolation::RedPassedWithoutCode { test: focus });
        }
        Some(TestStatus::Skipped) | None if receipt.exit.timed_out => {
            return Err(RuleViolation::RedRunTimedOut {
                test: focus,
                ran_ms: receipt.timings.run_ms,
            });
        }
        Some(TestStatus::Skipped) | None => {
            load_failure = receipt
                .missing_modules
                .iter()
                .find(|m| Some(m.test_file.as_str()) == file && paths.is_code(&m.module));
            if load_failure.is_none() {
                let failed_elsewhere = receipt
                    .outcomes
                    .iter()
                    .filter(|o| o.is_failure() && !names.contains(&o.name) && o.name != focus)
                    .map(|o| o.name.clone())
                    .collect();
                return Err(RuleViolation::RedTestNotRun {
                    test: focus,
                    failed_elsewhere,
                });
            }
        }
    }
    // Every other test must pass: each expected one, and any other the run reported (the
    // project's own tests, the earlier features' regression suite).
    // A file that did not load for a missing module of the project ran none of its tests:
    // those it holds beside the new one are not run because of the RED, not broken by it.
    let ours = |name: &str| {
        name == focus
            || quarantined.iter().any(|q| q == name)
            || load_failure.is_some_and(|m| {
                m.stops_every_test || m.outcome == name || neighbours.iter().any(|n| n == name)
            })
    };
    let mut broken: Vec<String> = names
        .iter()
        .filter(|n| !ours(n) && receipt.status_of(n) != Some(TestStatus::Passed))
        .cloned()
        .collect();
    for o in &receipt.outcomes {
        let failed = matches!(o.status, TestStatus::Failed | TestStatus::Errored);
        if failed && !ours(&o.name) && !broken.contains(&o.name) {
            broken.push(o.name.clone());
        }
    }
    if !broken.is_empty() {
        return Err(RuleViolation::RedBrokeGreenTest {
            tests: broken,
            migrations: Vec::new(),
        });
    }
    Ok(focus)
}

/// The Lakebase side could not run the pending verify request or promotion: halt, and a retry
/// issues the same request again.
fn infra_failed(state: &State, request: RequestId, error: &InfraError, p: Pending) -> Outcome {
    let (pending_request, step) = match &p {
        Pending::Verify { request, .. } => (*request, describe(&p)),
        Pending::Baseline { request, .. } => (*request, "baseline".to_string()),
        Pending::Promote { request } => (*request, "promote".to_string()),
        _ => {
            return Err(invariant(
                "only a verify run, the baseline or a promotion fails so",
            ));
        }
    };
    if pending_request != request {
        return Err(RuleViolation::ReceiptNotForRequest {
            expected: None,
            got: request,
        });
    }
    let mut s = state.clone();
    let reason = match error.fault {
        InfraFault::MergeRefused => EscalationReason::Integration,
        ref fault => EscalationReason::Infrastructure(fault.clone()),
    };
    let esc = escalation(&step, reason, error.detail.clone());
    Ok(halt(&mut s, esc, p))
}

fn promoted(
    cfg: &MachineConfig,
    state: &State,
    request: RequestId,
    report: &PromoteReport,
) -> Outcome {
    if report.request_id != request {
        return Err(RuleViolation::ReceiptNotForRequest {
            expected: Some(request),
            got: report.request_id,
        });
    }
    let planned: Vec<&str> = state
        .schema
        .iter()
        .flat_map(|p| p.migrations.iter().map(|m| m.version.as_str()))
        .collect();
    let missing: Vec<&str> = planned
        .iter()
        .copied()
        .filter(|v| {
            !report
                .applied
                .iter()
                .chain(&report.already_applied)
                .any(|a| a == v)
        })
        .collect();
    if !report.verified || !missing.is_empty() {
        return Err(RuleViolation::PromoteUnverified {
            detail: if report.verified {
                format!("versions {} were not applied", missing.join(", "))
            } else {
                "the parent's migrations were not verified".into()
            },
        });
    }
    let mut s = state.clone();
    s.promotion = Some(report.clone());
    advance(cfg, s, Done::Promoted)
}

/// An agent answered the pending assignment: who answered and what kind of artifact, then its
/// content, are checked before it is kept.
fn produced(
    cfg: &MachineConfig,
    state: &State,
    step: Step,
    attempt: u32,
    author: &ActorId,
    artifact: &Artifact,
) -> Outcome {
    if let Artifact::TestRunReceipt(_) = artifact {
        return Err(RuleViolation::ForgedReceipt {
            author: author.clone(),
        });
    }
    if author.role != step.role() {
        return Err(RuleViolation::WrongRole {
            expected: step.role(),
            got: author.role,
        });
    }
    if artifact.kind() != step.output_kind() {
        return Err(RuleViolation::WrongArtifactKind {
            expected: step.output_kind(),
            got: artifact.kind(),
        });
    }
    let mut s = state.clone();
    let done = match artifact {
        Artifact::ChangeSet(set) => accept_change_set(cfg, &mut s, &step, attempt, author, set)?,
        Artifact::ReviewVerdict(verdict) => accept_review(&mut s, &step, author, verdict)?,
        _ => accept_design(cfg, &mut s, &step, artifact)?,
    };
    s.authors.push(Arc::new((step.to_string(), author.clone())));
    advance(cfg, s, done)
}

/// A design artifact, checked against the design so far and kept.
fn accept_design(
    cfg: &MachineConfig,
    s: &mut State,
    step: &Step,
    artifact: &Artifact,
) -> Result<Done, RuleViolation> {
    let stories = || {
        s.stories
            .clone()
            .ok_or_else(|| invariant("the stories are accepted before the rest of the design"))
    };
    Ok(match (step, artifact) {
        (Step::Stories, Artifact::Stories(stories)) => {
            let feature = s
                .feature
                .as_ref()
                .ok_or_else(|| invariant("a running machine has a feature request"))?;
            check_stories(stories, &feature.id)?;
            s.stories = Some(Arc::new(stories.clone()));
            Done::Stories
        }
        (Step::Spec { revision }, Artifact::Spec(spec)) => {
            check_spec(spec, stories()?.as_ref())?;
            s.spec = Some(Arc::new(spec.clone()));
            Done::Spec {
                revision: *revision,
            }
        }
        (Step::Architecture { .. }, Artifact::ArchitectureVerdict(verdict)) => match verdict {
            ArchitectureVerdict::Approve { .. } => {
                s.architecture = Some(Arc::new(verdict.clone()));
                Done::ArchitectureApproved
            }
            ArchitectureVerdict::Revise { reasons } => {
                check_architecture(verdict)?;
                Done::RevisionAsked {
                    step: step.clone(),
                    reasons: reasons.clone(),
                }
            }
        },
        (Step::Schema, Artifact::SchemaPlan(plan)) => {
            let tool = cfg.migration_files.as_ref().and_then(|f| f.tool.as_ref());
            check_schema(plan, stories()?.as_ref(), tool)?;
            super::rules::check_builds_on(
                plan,
                &s.inherited.migrations,
                cfg.migration_files.as_ref(),
            )?;
            if let Some(numbering) = &s.inherited.numbering {
                for m in &plan.migrations {
                    numbering
                        .check(&m.version)
                        .map_err(|detail| RuleViolation::InvalidArtifact { detail })?;
                }
            }
            s.schema = Some(Arc::new(plan.clone()));
            Done::Schema
        }
        (Step::TestList, Artifact::TestList(list)) => {
            check_test_list(list, stories()?.as_ref(), &cfg.paths)?;
            check_files_frozen_whole(list, &s.inherited, &s.retired)?;
            s.test_list = Some(Arc::new(list.clone()));
            Done::TestList
        }
        (Step::Ux, Artifact::UxDesign(ux)) => {
            check_ux(ux, stories()?.as_ref())?;
            s.ux = Some(Arc::new(ux.clone()));
            Done::Ux
        }
        _ => return Err(wrong_kind(step, artifact)),
    })
}

/// A change set for a build step: RED as the Navigator writing the entry's test, the rest as
/// code. An empty REFACTOR changes nothing and goes straight on.
fn accept_change_set(
    cfg: &MachineConfig,
    s: &mut State,
    step: &Step,
    attempt: u32,
    author: &ActorId,
    set: &ChangeSet,
) -> Result<Done, RuleViolation> {
    let change_set = checked_writes(cfg, s, step, set)?;
    if !matches!(step, Step::Red { .. }) && !s.build.code_authors.contains(author) {
        s.build.code_authors.push(author.clone());
    }
    if change_set.changes.is_empty() && matches!(step, Step::Refactor { .. }) {
        return Ok(Done::RefactorKept);
    }
    Ok(Done::ChangeAccepted {
        step: step.clone(),
        attempt,
        change_set,
    })
}

/// A review verdict, from anyone but an author of the code under review.
fn accept_review(
    s: &mut State,
    step: &Step,
    author: &ActorId,
    verdict: &ReviewVerdict,
) -> Result<Done, RuleViolation> {
    if s.build.code_authors.iter().any(|a| a.name == author.name) {
        return Err(RuleViolation::ReviewerIsAuthor {
            reviewer: author.clone(),
        });
    }
    Ok(match verdict {
        ReviewVerdict::Approve { .. } => Done::ReviewApproved,
        ReviewVerdict::ChangesRequested { reasons } => {
            check_review(verdict)?;
            Done::ChangesRequested {
                step: step.clone(),
                reasons: reasons.clone(),
            }
        }
    })
}

fn wrong_kind(step: &Step, artifact: &Artifact) -> RuleViolation {
    RuleViolation::WrongArtifactKind {
        expected: step.output_kind(),
        got: artifact.kind(),
    }
}

fn refused(
    cfg: &MachineConfig,
    state: &State,
    pending: Pending,
    violation: &RuleViolation,
    run_output: Option<&str>,
) -> Outcome {
    let mut s = state.clone();
    let remedy = violation.remedy();
    if remedy == Remedy::Ignore {
        return Ok((s, Vec::new()));
    }
    let mut feedback = format!("{REFUSED}{violation}.{TRY_AGAIN}");
    if let Some(output) = run_output.filter(|o| !o.trim().is_empty()) {
        feedback.push_str("\nThe test run:\n");
        feedback.extend(output.chars().take(FEEDBACK_EXCERPT + FAILURES_SAID + 200));
    }
    let retry = |s: &mut State, step: Step, attempt: u32, revert: Option<ChangeSet>| {
        retry_agent(cfg, s, step, attempt, revert, violation, feedback.clone())
    };
    match (remedy, pending) {
        (Remedy::RetryAgent, Pending::Agent { step, attempt, .. }) => {
            Ok(retry(&mut s, step, attempt, None))
        }
        (Remedy::RetryAgent, Pending::Apply { step, attempt, .. })
            if matches!(violation, RuleViolation::PathOutsideWorkTree { .. }) =>
        {
            Ok(retry(&mut s, step, attempt, None))
        }
        (
            Remedy::RetryAgent,
            Pending::Verify {
                step: Some(step),
                purpose: VerifyPurpose::Red,
                inverse,
                attempt,
                ..
            },
        ) => {
            // The refused RED is undone, and so left out of what the review sees.
            s.build.since_review.pop();
            Ok(retry(&mut s, step, attempt, inverse))
        }
        (_, pending) => {
            let esc = escalation(
                &describe(&pending),
                halt_reason(violation),
                violation.to_string(),
            );
            Ok(halt(&mut s, esc, pending))
        }
    }
}

/// The agent of `step` tries again with `feedback` (attempt + 1), after `undo` is undone;
/// past the retry bound the run halts instead, with the violation as the reason.
fn retry_agent(
    cfg: &MachineConfig,
    s: &mut State,
    step: Step,
    attempt: u32,
    undo: Option<ChangeSet>,
    violation: &RuleViolation,
    feedback: String,
) -> (State, Vec<Command>) {
    let feedback = vec![feedback];
    let exhausted = attempt + 1 > cfg.max_agent_retries;
    let esc = escalation(
        &step.to_string(),
        EscalationReason::Verdict(VerdictReason::RuleViolated),
        format!("refused {} time(s); last: {violation}", attempt + 1),
    );
    let again = if exhausted {
        resume_agent(s, step.clone(), feedback)
    } else {
        agent(s, step.clone(), attempt + 1, feedback)
    };
    let mut s = s.clone();
    let again = if step.is_build() {
        observe(again)
    } else {
        again
    };
    match (undo, exhausted) {
        (Some(change_set), exhausted) => go(s, revert(change_set, again, exhausted.then_some(esc))),
        (None, true) => halt(&mut s, esc, again),
        (None, false) => go(s, again),
    }
}

/// The conductor did not apply the pending change set (see [`Event::ApplyDenied`]): the agent
/// retries with the violation, and the links its paths went through, as feedback (bounded).
/// A revert the file system refuses is refused in turn, and so halts: it is nobody's answer.
fn apply_denied(
    cfg: &MachineConfig,
    state: &State,
    pending: Pending,
    violation: &RuleViolation,
    resolved: &BTreeMap<String, String>,
) -> Outcome {
    let mut s = state.clone();
    let Pending::Apply { step, attempt, .. } = &pending else {
        return Err(violation.clone());
    };
    if violation.remedy() != Remedy::RetryAgent {
        let esc = escalation(
            &describe(&pending),
            halt_reason(violation),
            violation.to_string(),
        );
        return Ok(halt(&mut s, esc, pending));
    }
    let links: Vec<String> = resolved
        .iter()
        .map(|(a, b)| format!("{a} -> {b}"))
        .collect();
    let through = if links.is_empty() {
        String::new()
    } else {
        format!(
            " (your paths resolve through symbolic links: {})",
            links.join(", ")
        )
    };
    let feedback = format!(
        "Your previous answer was refused when it was applied: {violation}{through}. Nothing of it was written. Try again within the rules."
    );
    Ok(retry_agent(
        cfg,
        &mut s,
        step.clone(),
        *attempt,
        None,
        violation,
        feedback,
    ))
}

/// The writer a change set for `step` is checked as: the Navigator in RED (who must write the
/// current entry's test file), the Driver otherwise.
pub(super) fn writer<'a>(s: &'a State, step: &Step) -> Result<Writer<'a>, RuleViolation> {
    Ok(match step {
        Step::Red { .. } => Writer::Red {
            must_write: &s
                .current_test()
                .ok_or_else(|| invariant("a RED has a current test entry"))?
                .path,
        },
        _ => Writer::Code,
    })
}

/// [`check_change_set`] for the writer of `step`, with the frozen tests; a frozen file that an
/// earlier feature's test in force owns is refused as that test's (which halts: only a human
/// may retire it).
fn checked_writes(
    cfg: &MachineConfig,
    s: &State,
    step: &Step,
    set: &ChangeSet,
) -> Result<ChangeSet, RuleViolation> {
    check_change_set(set, writer(s, step)?, &cfg.paths, &frozen_for(s, step)).map_err(
        |v| match &v {
            RuleViolation::FrozenTestModified { path } => match s.inherited.owner(path, &s.retired)
            {
                Some(t) => RuleViolation::EarlierTestFrozen {
                    path: path.clone(),
                    feature: t.feature.clone(),
                    test: t.test.clone(),
                },
                None => v,
            },
            _ => v,
        },
    )
}

pub(super) fn check_resolved(
    cfg: &MachineConfig,
    state: &State,
    resolved: &ChangeSet,
    verdicts: &TestFileVerdicts,
) -> Result<ChangeSet, RuleViolation> {
    match &state.pending {
        Some(Pending::Apply { step, .. }) if state.status == RunStatus::Running => {
            let set = checked_writes(cfg, state, step, resolved)?;
            for write in frozen_written(state, step, &set) {
                match verdicts.get(&write.path) {
                    Some(Ok(())) => {}
                    Some(Err(change)) => {
                        return Err(RuleViolation::FrozenTestChanged {
                            path: write.path,
                            detail: change.to_string(),
                        });
                    }
                    None => {
                        return Err(invariant(
                            "a RED's write of a file holding accepted tests is judged on its syntax tree before it is applied",
                        ));
                    }
                }
            }
            Ok(set)
        }
        _ => Ok(resolved.clone()),
    }
}

/// The files holding frozen tests that `step`'s change set writes (a RED adding tests beside
/// them), each with the test a person's redo opens in it.
pub(super) fn frozen_written(s: &State, step: &Step, set: &ChangeSet) -> Vec<FrozenWrite> {
    let Ok(writer @ Writer::Red { .. }) = writer(s, step) else {
        return Vec::new();
    };
    let frozen = frozen_for(s, step);
    set.changes
        .iter()
        .filter(|c| frozen.contains_key(c.path()) && joins_frozen_file(writer, c))
        .map(|c| FrozenWrite {
            path: c.path().to_string(),
            open: (s.build.redo.as_deref() == Some(c.path()))
                .then(|| s.current_test().map(|e| e.runner_name().to_string()))
                .flatten(),
        })
        .collect()
}

/// The frozen files `step`'s change sets may not touch: all of them, but for the RED of a
/// redone entry, which writes its own file again (see [`super::Redo`]).
pub(super) fn frozen_for(s: &State, step: &Step) -> FileHashes {
    let mut frozen = s.build.frozen_tests.clone();
    // A parsed file stays frozen: its redone test alone is opened, by the syntax tree.
    if let (Some(path), Step::Red { .. }) = (&s.build.redo, step)
        && Language::of(path).is_none()
    {
        frozen.remove(path);
    }
    frozen
}

/// The test a verify run for `purpose` is about: the current entry's, in RED (the new test)
/// and GREEN (the test made to pass); none in REFACTOR and the deploy run, where every test
/// was green before.
pub(super) fn focus_of(s: &State, purpose: VerifyPurpose) -> Option<String> {
    matches!(purpose, VerifyPurpose::Red | VerifyPurpose::Green)
        .then(|| s.current_test().map(|e| e.runner_name().to_string()))
        .flatten()
}

/// Whose fault a halt on `violation` is: a broken invariant is Consort's own, a receipt without
/// a run the runner's, any other rule the work's.
fn halt_reason(violation: &RuleViolation) -> EscalationReason {
    match violation {
        RuleViolation::Invariant { .. } => {
            EscalationReason::Infrastructure(InfraFault::InvariantBroken)
        }
        RuleViolation::EarlierTestFrozen { .. } => {
            EscalationReason::Verdict(VerdictReason::EarlierTestContradicted)
        }
        RuleViolation::ChangedOutsideConsort { .. }
        | RuleViolation::ReceiptWorkspaceMismatch { .. } => EscalationReason::ChangedOutsideConsort,
        RuleViolation::ReceiptWithoutRun { .. } => {
            EscalationReason::Infrastructure(InfraFault::RunnerFailed)
        }
        _ => EscalationReason::Verdict(VerdictReason::RuleViolated),
    }
}

fn gate_decision(
    cfg: &MachineConfig,
    state: &State,
    gate: GateKind,
    hash: ContentHash,
    approval: &GateApproval,
) -> Outcome {
    if approval.gate != gate {
        return Err(RuleViolation::GateNotPending {
            gate: approval.gate,
        });
    }
    if approval.hash != hash {
        return Err(RuleViolation::GateHashMismatch {
            gate,
            expected: hash,
            got: approval.hash,
        });
    }
    let mut s = state.clone();
    if let GateDecision::Reject { reason } = &approval.decision {
        let esc = escalation(
            &format!("{gate}-gate"),
            EscalationReason::Verdict(VerdictReason::GateRejected),
            format!("{} rejected the {gate} gate: {reason}", approval.approver),
        );
        return Ok(halt(&mut s, esc, Pending::Gate { gate, hash }));
    }
    s.approvals.push(approval.clone());
    let done = match gate {
        GateKind::Design => {
            s.frozen = Some(Frozen { hash });
            Done::DesignApproved
        }
        GateKind::Deploy => Done::DeployApproved,
        GateKind::Promote => Done::PromoteApproved,
    };
    advance(cfg, s, done)
}

fn go(mut s: State, next: Pending) -> (State, Vec<Command>) {
    let cmd = command_for(&s, &next);
    s.pending = Some(next);
    (s, cmd.into_iter().collect())
}

fn halt(s: &mut State, escalation: Escalation, resume: Pending) -> (State, Vec<Command>) {
    s.pending = None;
    s.status = RunStatus::Halted {
        escalation: escalation.clone(),
        resume: Box::new(resume),
    };
    (s.clone(), vec![Command::Escalate { escalation }])
}

/// Runner names of the tests that must pass: all entries up to the current one (all for deploy).
/// The tests a run must report as passed (the focus of a RED aside): the regression suite the
/// earlier features left that is still in force, then this feature's entries so far.
pub(super) fn expected_names(s: &State, purpose: VerifyPurpose) -> Vec<String> {
    if let Some(selected) = selection(s, purpose) {
        return selected;
    }
    let mut names: Vec<String> = Vec::new();
    for t in s.inherited.live(&s.retired) {
        if !names.contains(&t.runner_name) {
            names.push(t.runner_name.clone());
        }
    }
    let Some(list) = &s.test_list else {
        return names;
    };
    let upto = match purpose {
        VerifyPurpose::Deploy => list.entries.len(),
        _ => (s.build.current + 1).min(list.entries.len()),
    };
    for e in &list.entries[..upto] {
        let name = e.runner_name().to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The tests a run of `purpose` is limited to: under [`StepScope::Feature`], the feature's
/// own tests up to the current entry, except in the GREEN and REFACTOR runs of a story's last
/// entry (and the deploy run), which are whole. `None`: the whole suite.
pub(super) fn selection(s: &State, purpose: VerifyPurpose) -> Option<Vec<String>> {
    if s.per_step == StepScope::Whole || purpose == VerifyPurpose::Deploy {
        return None;
    }
    if purpose != VerifyPurpose::Red && at_story_end(s) {
        return None;
    }
    let list = s.test_list.as_ref()?;
    let upto = (s.build.current + 1).min(list.entries.len());
    let mut names: Vec<String> = Vec::new();
    for e in &list.entries[..upto] {
        let name = e.runner_name().to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Some(names)
}

/// Whether the current entry is the last of its story (or of the list).
fn at_story_end(s: &State) -> bool {
    let (Some(list), Some(stories)) = (&s.test_list, &s.stories) else {
        return true;
    };
    let story = |i: usize| {
        list.entries
            .get(i)
            .and_then(|e| stories.story_of_ac(&e.ac_id))
            .map(|st| st.id.clone())
    };
    let now = story(s.build.current);
    now.is_none() || story(s.build.current + 1) != now
}

/// Green means: the run exited cleanly, reported every expected test as passed, and reported
/// nothing failed — an exit code of 0 with failures in the report is not a pass.
/// Whether every test of the run passed (a skipped one counts as passing, but not an expected
/// one), leaving out the tests in `quarantined`: a run whose only failures are theirs passes,
/// when it ended with an ordinary failing exit (not a time-out or a signal) and said which.
pub(super) fn all_pass(receipt: &TestRunReceipt, names: &[String], quarantined: &[String]) -> bool {
    let judged = |name: &str| !quarantined.iter().any(|q| q == name);
    let failures: Vec<&str> = receipt
        .outcomes
        .iter()
        .filter(|o| o.status != TestStatus::Passed && o.status != TestStatus::Skipped)
        .map(|o| o.name.as_str())
        .collect();
    let exit_ok = receipt.exit.success()
        || (!failures.is_empty()
            && failures.iter().all(|f| !judged(f))
            && receipt.exit.code.is_some()
            && !receipt.exit.timed_out);
    exit_ok
        && !receipt.outcomes.is_empty()
        && failures.iter().all(|f| !judged(f))
        && names
            .iter()
            .filter(|n| judged(n))
            .all(|n| receipt.status_of(n) == Some(TestStatus::Passed))
}

/// The baseline ran: what failed there fails before the feature. A test no person quarantined
/// halts the run for a person before any agent acts (quarantine it, or fix the setup and retry,
/// which runs the baseline again); otherwise the build lane's first RED follows.
fn baseline_completed(
    cfg: &MachineConfig,
    state: &State,
    receipt: &TestRunReceipt,
    request: RequestId,
    then: Option<Box<Pending>>,
) -> Outcome {
    if receipt.request_id != request {
        return Err(RuleViolation::ReceiptNotForRequest {
            expected: Some(request),
            got: receipt.request_id,
        });
    }
    if receipt.branch_id.is_empty() || receipt.command.is_empty() {
        return Err(RuleViolation::ReceiptWithoutRun {
            request,
            missing: if receipt.branch_id.is_empty() {
                "branch"
            } else {
                "command"
            }
            .into(),
        });
    }
    // A suite that reported no test at all (pytest's "no tests collected") failed nothing
    // before the feature: its whole-run failure judges no test.
    let reported_a_test = receipt
        .outcomes
        .iter()
        .any(|o| o.name != TestOutcome::WHOLE_RUN);
    // Run again after a harness change, mid-feature, the suite holds the feature's own tests
    // (the current one may be a RED waiting for its GREEN): the lane judges those, not the
    // baseline — nor a file of theirs that failed to load for a module not written yet.
    let entries: Vec<_> = state
        .test_list
        .iter()
        .flat_map(|l| l.entries.iter())
        .collect();
    let own = |name: &str| {
        entries.iter().any(|e| e.runner_name() == name)
            || receipt
                .missing_modules
                .iter()
                .any(|m| m.outcome == name && entries.iter().any(|e| e.path == m.test_file))
    };
    let mut failing: Vec<String> = Vec::new();
    for o in receipt.outcomes.iter().filter(|o| {
        o.is_failure() && (reported_a_test || o.name != TestOutcome::WHOLE_RUN) && !own(&o.name)
    }) {
        if !failing.contains(&o.name) {
            failing.push(o.name.clone());
        }
    }
    let mut s = state.clone();
    s.baseline = Some(super::Baseline {
        request,
        failing: failing.clone(),
    });
    advance(cfg, s, Done::BaselineRan { failing, then })
}

pub(super) fn failure_feedback(receipt: &TestRunReceipt, names: &[String]) -> String {
    let mut missing: Vec<&str> = names
        .iter()
        .filter(|n| receipt.status_of(n).is_none())
        .map(String::as_str)
        .collect();
    missing.truncate(20);
    let list = |names: &[&str]| match names {
        [] => "none".to_string(),
        names => names.join(", "),
    };
    let ended = if receipt.exit.timed_out {
        format!(
            "the test command ran {} and was stopped at its time limit (something in the run waits for what never comes); the end of what it printed is below",
            crate::core::text::whole_seconds(receipt.timings.run_ms)
        )
    } else {
        format!("the run ended with {}", receipt.exit)
    };
    format!(
        "Tests not passing: {}; not reported: {}; {ended}.\n{}",
        list(&receipt.not_passed()),
        list(&missing),
        excerpt(receipt)
    )
}

/// The part of a run's output an agent needs: the lines that name a passing test are left out
/// (and counted), and what remains is capped at [`FEEDBACK_EXCERPT`] characters, keeping its
/// beginning and its end (where runners print their summary), or only its end when the run
/// was stopped at its time limit.
pub(super) fn excerpt(receipt: &TestRunReceipt) -> String {
    let passed: Vec<&str> = receipt
        .outcomes
        .iter()
        .filter(|o| o.status == TestStatus::Passed)
        .map(|o| o.name.as_str())
        .collect();
    let mut kept = String::new();
    let mut left_out = 0usize;
    for line in receipt.output_excerpt.lines() {
        if passed.iter().any(|name| line.contains(name)) {
            left_out += 1;
        } else {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    if left_out > 0 {
        kept.push_str(&format!(
            "[{left_out} line(s) about passing tests left out]\n"
        ));
    }
    // A run stopped at its time limit said what it waited for last.
    let output = if receipt.exit.timed_out {
        crate::core::text::tail(&kept, FEEDBACK_EXCERPT)
    } else {
        crate::core::text::head_and_tail(&kept, FEEDBACK_EXCERPT)
    };
    match failures_said(receipt) {
        Some(said) => format!("{said}\nThe run's output:\n{output}"),
        None => output,
    }
}

/// What the runner said about each failed or errored test, from its report (JUnit, TAP,
/// libtest, `go test`), capped at [`FAILURES_SAID`] characters; None when it said nothing.
fn failures_said(receipt: &TestRunReceipt) -> Option<String> {
    let mut said = String::new();
    for o in receipt.outcomes.iter().filter(|o| o.is_failure()) {
        let Some(message) = &o.message else { continue };
        said.push_str(&format!("--- {} ({}) ---\n{message}\n", o.name, o.status));
    }
    (!said.is_empty()).then(|| {
        format!(
            "What the failing tests said:\n{}",
            crate::core::text::head_and_tail(&said, FAILURES_SAID)
        )
    })
}

fn describe(p: &Pending) -> String {
    match p {
        Pending::Agent { step, .. } => step.to_string(),
        Pending::Observe { then } => format!("observe before {}", describe(then)),
        Pending::Apply { step, .. } => format!("apply {step}"),
        Pending::Revert { then, .. } => format!("revert before {}", describe(then)),
        Pending::Verify {
            step: Some(step), ..
        } => format!("verify {step}"),
        Pending::Verify { step: None, .. } => "deploy verify".into(),
        Pending::Gate { gate, .. } => format!("{gate} gate"),
        Pending::Promote { .. } => "promote".into(),
        Pending::Baseline { .. } => "baseline".into(),
    }
}

/// The migrations a verify run needs: those of every story up to the current test's story
/// (all of them for the deploy run).
pub(super) fn migrations_for(s: &State, purpose: VerifyPurpose) -> Vec<Migration> {
    let (Some(plan), Some(_)) = (&s.schema, &s.stories) else {
        return Vec::new();
    };
    if purpose == VerifyPurpose::Deploy {
        return plan.migrations.clone();
    }
    migrations_up_to(s, s.build.current)
}

/// The migrations of every story up to the story of the test list's entry `entry` (all of
/// them past the list's end).
fn migrations_up_to(s: &State, entry: usize) -> Vec<Migration> {
    let (Some(plan), Some(stories)) = (&s.schema, &s.stories) else {
        return Vec::new();
    };
    let index_of = |story: &str| stories.stories.iter().position(|x| x.id == story);
    let upto = s
        .test_list
        .as_ref()
        .and_then(|l| l.entries.get(entry))
        .and_then(|e| stories.story_of_ac(&e.ac_id))
        .and_then(|story| index_of(&story.id))
        .unwrap_or(usize::MAX);
    plan.migrations
        .iter()
        .filter(|m| index_of(&m.story_id).is_some_and(|i| i <= upto))
        .cloned()
        .collect()
}

pub(super) fn command_for(s: &State, p: &Pending) -> Option<Command> {
    Some(match p {
        Pending::Agent {
            id,
            step,
            attempt,
            feedback,
        } => Command::Assign {
            id: *id,
            role: step.role(),
            step: step.clone(),
            attempt: *attempt,
            feedback: feedback.clone(),
        },
        Pending::Observe { .. } => Command::Observe,
        Pending::Apply { change_set, .. } | Pending::Revert { change_set, .. } => Command::Apply {
            change_set: change_set.clone(),
        },
        Pending::Verify {
            request,
            purpose,
            workspace_hash,
            ..
        } => Command::Verify {
            request: *request,
            purpose: *purpose,
            workspace_hash: *workspace_hash,
            migrations: migrations_for(s, *purpose),
            tests: expected_names(s, *purpose),
            focus: focus_of(s, *purpose),
            select: selection(s, *purpose).unwrap_or_default(),
        },
        Pending::Gate { gate, hash } => Command::AwaitGate {
            gate: *gate,
            hash: *hash,
        },
        // No schema plan at promotion is a state no lifecycle reaches: no command (the
        // conductor stops with `NoPendingCommand`) rather than promoting nothing.
        Pending::Baseline { request, .. } => Command::Baseline {
            request: *request,
            tests: s
                .inherited
                .live(&s.retired)
                .map(|t| t.runner_name.clone())
                .collect(),
        },
        Pending::Promote { request } => Command::Promote {
            request: *request,
            migrations: s.schema.as_ref()?.migrations.clone(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::same_go_package;

    #[test]
    fn go_test_files_of_one_directory_load_together() {
        assert!(same_go_package("a/a_test.go", "a/more_test.go"));
        assert!(same_go_package("x_test.go", "y_test.go"));
        assert!(!same_go_package("a/a_test.go", "b/a_test.go"));
        assert!(!same_go_package("a/a_test.go", "a/a.go"));
        assert!(!same_go_package("tests/a.py", "tests/b.py"));
    }
}
