//! The run's history as version control should record it: one commit per approved design and
//! per accepted RED, GREEN and REFACTOR, read from the ledger alone.
//!
//! **Invariant:** the commits are a pure function of the ledger's events. What each commit
//! changes is the change sets the conductor applied since the previous one (reverts included,
//! in order), never the state of the disk, so the same ledger always gives the same commits: a
//! resumed run makes exactly the ones still missing, whatever the tree holds when it resumes.

use std::sync::Arc;

use crate::core::artifact::{FileChange, GateDecision, GateKind, TestRunReceipt};
use crate::core::hash::ContentHash;
use crate::core::machine::{Event, Machine, Pending, State};
use crate::core::role::Role;
use crate::core::step::Step;

/// What kind of step a commit records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitKind {
    /// The approved design: its migration files.
    Design,
    /// A failing test the run accepted.
    Red,
    /// Code that made every test pass.
    Green,
    /// A restructuring that kept every test passing.
    Refactor,
}

impl CommitKind {
    /// `design`, `RED`, `GREEN` or `REFACTOR`, as a commit's subject says it.
    pub fn label(self) -> &'static str {
        match self {
            CommitKind::Design => "design",
            CommitKind::Red => "RED",
            CommitKind::Green => "GREEN",
            CommitKind::Refactor => "REFACTOR",
        }
    }
}

/// One commit of the run, as the ledger records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepCommit {
    /// What it records.
    pub kind: CommitKind,
    /// The step key (`red/T1`, `repair/T2#1`, `design`).
    pub step: String,
    /// The role whose work it is.
    pub role: Role,
    /// The test-list entry, for build steps.
    pub test: Option<String>,
    /// The receipt of the run that accepted it (None for the design).
    pub receipt: Option<Arc<TestRunReceipt>>,
    /// The approved design's hash.
    pub design: ContentHash,
    /// The file changes since the previous commit, in the order they were applied (reverts
    /// included). Paths are relative to the work tree. Empty for the design, whose files come
    /// from the plan.
    pub changes: Vec<FileChange>,
    /// What the agents said their change sets do, in a line each (reverts left out).
    pub summaries: Vec<String>,
}

impl StepCommit {
    /// The identity a recorded commit is found by: the receipt's hash, or `design`.
    pub fn key(&self) -> String {
        match &self.receipt {
            Some(r) => ContentHash::of(r.as_ref()).to_hex(),
            None => "design".into(),
        }
    }
}

/// The paths a run's applied change sets wrote, each once, in the order first written: fed
/// each event with the state's pending command before it (a change set counts once it is
/// `Applied`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilesWritten {
    paths: Vec<String>,
}

impl FilesWritten {
    /// Notes `event`, which answered `pending`.
    pub fn note(&mut self, pending: Option<&Pending>, event: &Event) {
        if let (Event::Applied { .. }, Some(Pending::Apply { change_set, .. })) = (event, pending) {
            for change in &change_set.changes {
                if !self.paths.iter().any(|p| p == change.path()) {
                    self.paths.push(change.path().to_string());
                }
            }
        }
    }

    /// The paths noted so far.
    pub fn into_paths(self) -> Vec<String> {
        self.paths
    }

    /// The paths a ledger's events wrote (what the machine refused never took effect).
    pub fn of<'a>(machine: &Machine, events: impl IntoIterator<Item = &'a Event>) -> Vec<String> {
        let mut state = State::default();
        let mut files = FilesWritten::default();
        for event in events {
            let Ok((next, _)) = machine.step(&state, event) else {
                continue;
            };
            files.note(state.pending.as_ref(), event);
            state = next;
        }
        files.into_paths()
    }
}

/// The commits a ledger's events call for, in order.
pub fn step_commits<'a>(
    machine: &Machine,
    events: impl IntoIterator<Item = &'a Event>,
) -> Vec<StepCommit> {
    walk(machine, events).0
}

/// The work no run verified: what the conductor applied after the last commit the ledger calls
/// for (a GREEN that failed, the repairs a run halted after, a refused RED not yet reverted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unverified {
    /// The step of the last commit (`red/T2`, `design`), None before the first.
    pub last_verified: Option<String>,
    /// For each path written since, once, in the order first written: the change that puts
    /// back what the last verified step left there (a write or restore of its bytes, or a
    /// delete for a file that was not there). Empty when nothing was applied since.
    pub undo: Vec<FileChange>,
    /// What the conductor applied since, in order: replayed on a tree that holds what the last
    /// verified step left, it gives the tree the run stood on (another machine's, after a
    /// takeover).
    pub applied: Vec<FileChange>,
}

/// [`Unverified`] of a ledger's events.
pub fn unverified<'a>(
    machine: &Machine,
    events: impl IntoIterator<Item = &'a Event>,
) -> Unverified {
    let (commits, unverified) = walk(machine, events);
    Unverified {
        last_verified: commits.last().map(|c| c.step.clone()),
        ..unverified
    }
}

/// The commits of a ledger's events, and the undo of what was applied after the last one.
fn walk<'a>(
    machine: &Machine,
    events: impl IntoIterator<Item = &'a Event>,
) -> (Vec<StepCommit>, Unverified) {
    let mut state = State::default();
    let mut applied = Applied::default();
    let mut since = Unverified::default();
    let mut out = Vec::new();
    for event in events {
        let Ok((next, _)) = machine.step(&state, event) else {
            continue;
        };
        if let Event::Applied { inverse, .. } = event {
            for undo in &inverse.changes {
                if !since.undo.iter().any(|u| u.path() == undo.path()) {
                    since.undo.push(undo.clone());
                }
            }
        }
        if let Event::Applied { .. } = event {
            match &state.pending {
                Some(Pending::Apply { change_set, .. }) => {
                    applied.changes.extend(change_set.changes.iter().cloned());
                    if !change_set.summary.trim().is_empty() {
                        applied
                            .summaries
                            .push(change_set.summary.trim().to_string());
                    }
                }
                Some(Pending::Revert { change_set, .. }) => {
                    applied.changes.extend(change_set.changes.iter().cloned());
                }
                _ => {}
            }
        }
        if let Some(commit) = accepted(&state, event, &next, &mut applied) {
            out.push(commit);
            since.undo.clear();
        }
        state = next;
    }
    since.applied = applied.changes;
    (out, since)
}

/// What was applied since the last commit.
#[derive(Default)]
struct Applied {
    changes: Vec<FileChange>,
    summaries: Vec<String>,
}

/// The commit `event` calls for, moving from `before` to `after`.
fn accepted(
    before: &State,
    event: &Event,
    after: &State,
    applied: &mut Applied,
) -> Option<StepCommit> {
    let design = after.frozen.as_ref()?.hash;
    match event {
        Event::Gate { approval }
            if approval.gate == GateKind::Design && approval.decision == GateDecision::Approve =>
        {
            Some(StepCommit {
                kind: CommitKind::Design,
                step: "design".into(),
                role: Role::Dba,
                test: None,
                receipt: None,
                design,
                changes: Vec::new(),
                summaries: Vec::new(),
            })
        }
        Event::VerifyCompleted { receipt } => {
            let Some(Pending::Verify {
                step: Some(step), ..
            }) = &before.pending
            else {
                return None;
            };
            let (kind, test) = kept(step, next_step(after)?)?;
            Some(StepCommit {
                kind,
                step: step.to_string(),
                role: step.role(),
                test: Some(test.to_string()),
                receipt: Some(Arc::new(receipt.clone())),
                design,
                changes: std::mem::take(&mut applied.changes),
                summaries: std::mem::take(&mut applied.summaries),
            })
        }
        _ => None,
    }
}

/// Whether the run moved past `verified` as a success (RED to GREEN, GREEN to REFACTOR,
/// REFACTOR to REVIEW), and the entry it was for.
fn kept<'s>(verified: &'s Step, next: &Step) -> Option<(CommitKind, &'s str)> {
    match (verified, next) {
        (Step::Red { test }, Step::Green { .. }) => Some((CommitKind::Red, test)),
        (Step::Green { test } | Step::Repair { test, .. }, Step::Refactor { .. }) => {
            Some((CommitKind::Green, test))
        }
        (Step::Refactor { test, .. }, Step::Review { .. }) => Some((CommitKind::Refactor, test)),
        _ => None,
    }
}

/// The agent step the state waits for, looking through an observation.
fn next_step(s: &State) -> Option<&Step> {
    let mut p = s.pending.as_ref()?;
    while let Pending::Observe { then } = p {
        p = then;
    }
    match p {
        Pending::Agent { step, .. } => Some(step),
        _ => None,
    }
}
