//! Assertions for halts and refusals, and readings of a ledger's events: each event with what
//! the machine was waiting for when it arrived, and whether the machine accepted it.

use consort_actors::{
    ChangeSet, Escalation, EscalationReason, Event, Machine, MachineConfig, Pending, RuleViolation,
    RunOutcome, RunReport, State, TestRunReceipt, TestStatus, VerdictReason, VerifyPurpose,
};

/// The escalation a run halted with, if it halted.
pub fn halt_of(report: &RunReport) -> Option<&Escalation> {
    match &report.outcome {
        RunOutcome::Halted { escalation } => Some(escalation),
        _ => None,
    }
}

/// The escalation a run halted with; panics when it did not halt.
pub fn halted(report: &RunReport) -> Escalation {
    match halt_of(report) {
        Some(escalation) => escalation.clone(),
        None => panic!("expected a halt, the run ended {:?}", report.outcome),
    }
}

/// Whether an escalation is a halt for a broken rule.
pub fn is_rule_violation(e: &Escalation) -> bool {
    e.reason == EscalationReason::Verdict(VerdictReason::RuleViolated)
}

/// Asserts that the machine refuses `event` in `state`, and returns the violation.
pub fn refused(machine: &Machine, state: &State, event: &Event) -> RuleViolation {
    match machine.step(state, event) {
        Ok(_) => panic!("{} must be refused", event.name()),
        Err(v) => v,
    }
}

/// What `pick` reads from each event that has it, in order.
fn picked<T>(events: &[Event], pick: impl Fn(&Event) -> Option<T>) -> Vec<T> {
    events.iter().filter_map(pick).collect()
}

/// Every refusal recorded among `events`, in order.
pub fn refusals(events: &[Event]) -> Vec<RuleViolation> {
    picked(events, |e| match e {
        Event::Refused { violation, .. } => Some(violation.clone()),
        _ => None,
    })
}

/// Every change set the conductor did not apply (`ApplyDenied`), with its violation, in order.
pub fn denials(events: &[Event]) -> Vec<RuleViolation> {
    picked(events, |e| match e {
        Event::ApplyDenied { violation, .. } => Some(violation.clone()),
        _ => None,
    })
}

/// The undo of every change set the conductor applied (`Applied`), in order.
pub fn undos(events: &[Event]) -> Vec<ChangeSet> {
    picked(events, |e| match e {
        Event::Applied { inverse, .. } => Some(inverse.clone()),
        _ => None,
    })
}

/// The events alone rebuild `state`: the refusals and the halt are on record.
pub fn assert_replays(events: &[Event], cfg: &MachineConfig, state: &State) {
    assert_eq!(
        &Machine::new(cfg.clone()).replay(events),
        state,
        "replaying the ledger rebuilds the final state"
    );
}

/// One event of a run, read back.
#[derive(Debug, Clone)]
pub struct Seen {
    /// What the machine was waiting for when the event arrived.
    pub pending: Option<Pending>,
    /// The event.
    pub event: Event,
    /// Whether the machine accepted it.
    pub accepted: bool,
}

/// Replays `events` through a machine of `cfg`, noting for each what was pending and whether
/// it was accepted.
pub fn annotate(events: &[Event], cfg: &MachineConfig) -> Vec<Seen> {
    let machine = Machine::new(cfg.clone());
    let mut state = State::default();
    let mut out = Vec::with_capacity(events.len());
    for event in events {
        let pending = state.pending.clone();
        let accepted = match machine.step(&state, event) {
            Ok((next, _)) => {
                state = next;
                true
            }
            Err(_) => false,
        };
        out.push(Seen {
            pending,
            event: event.clone(),
            accepted,
        });
    }
    out
}

/// Every verification that came back, with its purpose and whether it was accepted.
fn receipts(seen: &[Seen]) -> impl Iterator<Item = (VerifyPurpose, TestRunReceipt, bool)> + '_ {
    seen.iter().filter_map(|s| match (&s.pending, &s.event) {
        (Some(Pending::Verify { purpose, .. }), Event::VerifyCompleted { receipt }) => {
            Some((*purpose, receipt.clone(), s.accepted))
        }
        _ => None,
    })
}

/// Receipts the machine accepted, with the purpose of the run.
pub fn accepted_receipts(seen: &[Seen]) -> Vec<(VerifyPurpose, TestRunReceipt)> {
    receipts(seen)
        .filter(|r| r.2)
        .map(|(p, r, _)| (p, r))
        .collect()
}

/// Every verification that came back, accepted or not, with its purpose.
pub fn verifications(seen: &[Seen]) -> Vec<(VerifyPurpose, TestRunReceipt)> {
    receipts(seen).map(|(p, r, _)| (p, r)).collect()
}

/// The steps agents answered, as keys, with whether the answer was accepted.
pub fn answered(seen: &[Seen]) -> Vec<(String, bool)> {
    seen.iter()
        .filter_map(|s| match (&s.pending, &s.event) {
            (Some(Pending::Agent { step, .. }), Event::Produced { .. }) => {
                Some((step.to_string(), s.accepted))
            }
            _ => None,
        })
        .collect()
}

/// The GREEN-side runs (GREEN, repair, refactor) that the machine accepted as all-passing.
pub fn accepted_greens(seen: &[Seen]) -> Vec<TestRunReceipt> {
    accepted_receipts(seen)
        .into_iter()
        .filter(|(p, r)| {
            matches!(p, VerifyPurpose::Green | VerifyPurpose::Refactor)
                && r.exit.success()
                && r.outcomes.iter().all(|o| o.status == TestStatus::Passed)
        })
        .map(|(_, r)| r)
        .collect()
}

/// A check of one text: what the text is (for the failure message), and what must hold of it.
pub type TextCheck<'a> = (&'a str, &'a dyn Fn(&str) -> bool);

/// Checks `texts` against `checks`, in order: as many texts as checks, each passing its own.
pub fn assert_each(texts: &[String], checks: &[TextCheck<'_>]) {
    assert_eq!(texts.len(), checks.len(), "{texts:#?}");
    for (text, (what, holds)) in texts.iter().zip(checks) {
        assert!(holds(text), "{what}: {text}");
    }
}
