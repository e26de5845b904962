//! Scratch runs: a proposed change tried on a copy of the tree, judged as the real run of the
//! step would judge it, and told to the agent as advice.
//!
//! **Invariant:** nothing here touches the state. A plan is read from the state when the step
//! is assigned; its verdict goes back to the agent as text and never reaches the ledger, so a
//! scratch run can neither stand in for the step's real run nor change what that run decides.

use crate::core::artifact::{ChangeSet, FileHashes, Migration, TestRunReceipt};
use crate::core::paths::PathPolicy;
use crate::core::protocol::VerifyPurpose;
use crate::core::step::Step;

use super::State;
use super::rules::{RuleViolation, Writer, check_change_set};
use super::transition::{
    RedFocus, all_pass, excerpt, expected_names, failure_feedback, focus_of, frozen_for,
    migrations_for, names_in_file, red_fails_for, selection, writer,
};

/// What a scratch run of one step is: the request the step's real run would make, and the
/// rules its change set is checked by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScratchPlan {
    /// The step the advice is for.
    pub step: Step,
    /// How the real run of the step is judged.
    pub purpose: VerifyPurpose,
    /// The migrations applied to the branch before the tests.
    pub migrations: Vec<Migration>,
    /// The tests the run expects.
    pub tests: Vec<String>,
    /// The new test, in RED.
    pub focus: Option<String>,
    /// The tests the run is limited to (see [`crate::VerifyRequest::select`]); empty: all.
    pub select: Vec<String>,
    /// The entry's test file, which a RED change set must write.
    must_write: Option<String>,
    /// The tests frozen so far.
    frozen: FileHashes,
    /// The expected tests that live in the entry's test file, in RED.
    neighbours: Vec<String>,
    /// The tests a person quarantined.
    pub quarantined: Vec<String>,
}

/// What a scratch run would have meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScratchVerdict {
    /// Whether the step's real run, on the same tree, would be accepted.
    pub would_pass: bool,
    /// The machine's words: why it would be accepted, or what would be refused.
    pub verdict: String,
}

/// The plan of a scratch run for `step`, when the step may try its change: RED, GREEN,
/// repair and REFACTOR. A review writes nothing and gets none.
pub(super) fn plan(s: &State, step: &Step) -> Option<ScratchPlan> {
    let purpose = match step {
        Step::Red { .. } => VerifyPurpose::Red,
        Step::Green { .. } | Step::Repair { .. } => VerifyPurpose::Green,
        Step::Refactor { .. } => VerifyPurpose::Refactor,
        _ => return None,
    };
    let must_write = match writer(s, step).ok()? {
        Writer::Red { must_write } => Some(must_write.to_string()),
        Writer::Code => None,
    };
    Some(ScratchPlan {
        step: step.clone(),
        purpose,
        migrations: migrations_for(s, purpose),
        tests: expected_names(s, purpose),
        focus: focus_of(s, purpose),
        select: selection(s, purpose).unwrap_or_default(),
        neighbours: must_write
            .as_deref()
            .map(|file| names_in_file(s, file))
            .unwrap_or_default(),
        must_write,
        frozen: frozen_for(s, step),
        quarantined: s.quarantined_names(),
    })
}

impl ScratchPlan {
    /// Checks a proposed change set, its paths already resolved to the files they reach, by
    /// the rules the step's real change set is checked by; returns it normalised.
    pub fn check(
        &self,
        policy: &PathPolicy,
        resolved: &ChangeSet,
    ) -> Result<ChangeSet, RuleViolation> {
        let writer = match &self.must_write {
            Some(must_write) => Writer::Red { must_write },
            None => Writer::Code,
        };
        check_change_set(resolved, writer, policy, &self.frozen)
    }

    /// How the step's real run would judge this receipt, by the project's `policy`.
    pub fn judge(&self, policy: &PathPolicy, receipt: &TestRunReceipt) -> ScratchVerdict {
        let names = &self.tests;
        match self.purpose {
            VerifyPurpose::Red => {
                let focus = RedFocus {
                    name: self.focus.clone().unwrap_or_default(),
                    file: self.must_write.as_deref(),
                    neighbours: &self.neighbours,
                    quarantined: &self.quarantined,
                };
                match red_fails_for(focus, policy, receipt, names) {
                    Ok(focus) => ScratchVerdict {
                        would_pass: true,
                        verdict: format!(
                            "a real RED: {focus} fails and every earlier test passes.\n{}",
                            excerpt(receipt)
                        ),
                    },
                    Err(v) => ScratchVerdict {
                        would_pass: false,
                        verdict: format!("not a RED: {v}\n{}", excerpt(receipt)),
                    },
                }
            }
            _ if all_pass(receipt, names, &self.quarantined) => ScratchVerdict {
                would_pass: true,
                verdict: format!("every expected test passes ({}).", names.join(", ")),
            },
            _ => ScratchVerdict {
                would_pass: false,
                verdict: failure_feedback(receipt, names),
            },
        }
    }
}
