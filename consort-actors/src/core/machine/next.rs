//! What comes next: the lifecycle as one table.
//!
//! [`next_after`] is the only place that says what follows a finished piece of work. The
//! transition function (`transition.rs`) first checks that an event answers what is pending
//! (assignment id, request id, work-tree hash) and accepts its content; it then names what
//! finished as a [`Done`] and asks this table for the successor. "What follows GREEN?" is
//! answered here and nowhere else.

use crate::core::artifact::{
    ChangeSet, Escalation, EscalationReason, FileHashes, GateKind, VerdictReason,
};
use crate::core::hash::ContentHash;
use crate::core::protocol::{AssignmentId, VerifyPurpose};
use crate::core::step::Step;

use super::rules::RuleViolation;
use super::{MachineConfig, Pending, Phase, State};

/// A finished piece of work, as far as "what comes next" is concerned. Its content has been
/// checked and accepted into the state before it is named here.
pub(super) enum Done {
    /// A feature request started the run.
    Started,
    /// Stories accepted.
    Stories,
    /// A spec accepted at this revision.
    Spec {
        /// The revision.
        revision: u32,
    },
    /// The architect approved the spec.
    ArchitectureApproved,
    /// The architect asked for a revision, with these reasons.
    RevisionAsked {
        /// The architecture step that asked.
        step: Step,
        /// Why.
        reasons: Vec<String>,
    },
    /// Schema plan accepted.
    Schema,
    /// Test list accepted.
    TestList,
    /// UX design accepted.
    Ux,
    /// A human approved the design gate.
    DesignApproved,
    /// A change set for a build step passed the rules.
    ChangeAccepted {
        /// The build step.
        step: Step,
        /// The agent's attempt.
        attempt: u32,
        /// The normalised change set.
        change_set: ChangeSet,
    },
    /// The conductor applied a build step's change set.
    Applied {
        /// The build step.
        step: Step,
        /// The agent's attempt.
        attempt: u32,
        /// The work tree after applying.
        workspace_hash: ContentHash,
        /// Test files on disk after applying.
        tests: FileHashes,
        /// The change set that undoes it.
        inverse: ChangeSet,
    },
    /// The baseline ran; these tests failed there (before the feature).
    BaselineRan {
        /// Their runner names.
        failing: Vec<String>,
        /// What the run goes on with (None: the build lane's first RED).
        then: Option<Box<Pending>>,
    },
    /// RED: the new test fails as it should, nothing else broke.
    RedFails {
        /// The new test's runner name.
        focus: String,
        /// The run's output, for the Driver.
        excerpt: String,
    },
    /// GREEN (or a repair): everything passes.
    GreenPasses,
    /// GREEN (or a repair): something still fails.
    GreenFails {
        /// The step whose run failed.
        step: Option<Step>,
        /// What failed, for the Driver.
        feedback: String,
    },
    /// REFACTOR kept: an empty change set, or every test still passes.
    RefactorKept,
    /// REFACTOR broke something: it is dropped.
    RefactorBroke {
        /// How to undo it.
        inverse: Option<ChangeSet>,
        /// What the run said, for the Driver's next assignment.
        feedback: String,
    },
    /// The review approved the current entry.
    ReviewApproved,
    /// The review asked for changes.
    ChangesRequested {
        /// The review step that asked.
        step: Step,
        /// Why.
        reasons: Vec<String>,
    },
    /// A human approved the deploy gate.
    DeployApproved,
    /// The full-suite deploy run passed; the promote gate approves this hash.
    DeployPasses {
        /// The promote gate's hash.
        hash: ContentHash,
    },
    /// The full-suite deploy run failed.
    DeployFails {
        /// What failed.
        feedback: String,
    },
    /// A human approved the promote gate.
    PromoteApproved,
    /// The migrations were promoted and verified.
    Promoted,
}

/// The successor of a finished piece of work.
pub(super) enum Next {
    /// Wait for this.
    Go(Pending),
    /// Halt for a human; a retry re-issues the resume point.
    Halt(Escalation, Pending),
    /// The run is done.
    Finish,
}

/// Every kind of [`Done`], without its content: the rows of the table [`next_after`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DoneKind {
    Started,
    Stories,
    Spec,
    ArchitectureApproved,
    RevisionAsked,
    Schema,
    TestList,
    Ux,
    DesignApproved,
    BaselineRan,
    ChangeAccepted,
    Applied,
    RedFails,
    GreenPasses,
    GreenFails,
    RefactorKept,
    RefactorBroke,
    ReviewApproved,
    ChangesRequested,
    DeployApproved,
    DeployPasses,
    DeployFails,
    PromoteApproved,
    Promoted,
}

impl DoneKind {
    /// Every row, in the order [`next_after`] lists them.
    pub(super) const ALL: [DoneKind; 24] = [
        DoneKind::Started,
        DoneKind::Stories,
        DoneKind::Spec,
        DoneKind::ArchitectureApproved,
        DoneKind::RevisionAsked,
        DoneKind::Schema,
        DoneKind::TestList,
        DoneKind::Ux,
        DoneKind::DesignApproved,
        DoneKind::BaselineRan,
        DoneKind::ChangeAccepted,
        DoneKind::Applied,
        DoneKind::RedFails,
        DoneKind::GreenPasses,
        DoneKind::GreenFails,
        DoneKind::RefactorKept,
        DoneKind::RefactorBroke,
        DoneKind::ReviewApproved,
        DoneKind::ChangesRequested,
        DoneKind::DeployApproved,
        DoneKind::DeployPasses,
        DoneKind::DeployFails,
        DoneKind::PromoteApproved,
        DoneKind::Promoted,
    ];
}

impl Done {
    /// The row of the table this finished work is.
    pub(super) fn kind(&self) -> DoneKind {
        match self {
            Done::Started => DoneKind::Started,
            Done::Stories => DoneKind::Stories,
            Done::Spec { .. } => DoneKind::Spec,
            Done::ArchitectureApproved => DoneKind::ArchitectureApproved,
            Done::RevisionAsked { .. } => DoneKind::RevisionAsked,
            Done::Schema => DoneKind::Schema,
            Done::TestList => DoneKind::TestList,
            Done::Ux => DoneKind::Ux,
            Done::DesignApproved => DoneKind::DesignApproved,
            Done::BaselineRan { .. } => DoneKind::BaselineRan,
            Done::ChangeAccepted { .. } => DoneKind::ChangeAccepted,
            Done::Applied { .. } => DoneKind::Applied,
            Done::RedFails { .. } => DoneKind::RedFails,
            Done::GreenPasses => DoneKind::GreenPasses,
            Done::GreenFails { .. } => DoneKind::GreenFails,
            Done::RefactorKept => DoneKind::RefactorKept,
            Done::RefactorBroke { .. } => DoneKind::RefactorBroke,
            Done::ReviewApproved => DoneKind::ReviewApproved,
            Done::ChangesRequested { .. } => DoneKind::ChangesRequested,
            Done::DeployApproved => DoneKind::DeployApproved,
            Done::DeployPasses { .. } => DoneKind::DeployPasses,
            Done::DeployFails { .. } => DoneKind::DeployFails,
            Done::PromoteApproved => DoneKind::PromoteApproved,
            Done::Promoted => DoneKind::Promoted,
        }
    }
}

/// What a row of the table does to the coarse [`Phase`]: the phase it is finished in, what
/// people call it, and each phase its successor can be in, as [`next_after`]'s arm decides
/// (a bound spent halts). Kept beside [`next_after`]; the machine's tests check that every
/// phase change a run makes is one of these (`lifecycle_edges`).
pub(super) fn row(kind: DoneKind) -> (Phase, &'static str, &'static [Phase]) {
    use Phase::{
        Build, Deploy, DeployGate, Design, DesignGate, Halted, Idle, Promote, PromoteGate,
    };
    match kind {
        DoneKind::Started => (Idle, "feature request", &[Design]),
        DoneKind::Stories => (Design, "stories accepted", &[Design]),
        DoneKind::Spec => (Design, "spec accepted", &[Design]),
        DoneKind::ArchitectureApproved => (Design, "architecture approved", &[Design]),
        DoneKind::RevisionAsked => (Design, "revision asked", &[Design, Halted]),
        DoneKind::Schema => (Design, "schema plan accepted", &[Design]),
        DoneKind::TestList => (Design, "test list accepted", &[Design, DesignGate]),
        DoneKind::Ux => (Design, "UX design accepted", &[DesignGate]),
        DoneKind::DesignApproved => (DesignGate, "design approved", &[Build]),
        // The baseline is in the phase of what it goes on with (`State::phase` looks through
        // it): the design gate, or after a harness change whatever was pending; only its halt
        // changes the phase.
        DoneKind::BaselineRan => (DesignGate, "baseline ran", &[DesignGate, Halted]),
        DoneKind::ChangeAccepted => (Build, "change set accepted", &[Build]),
        DoneKind::Applied => (Build, "change applied", &[Build]),
        DoneKind::RedFails => (Build, "RED fails as it should", &[Build]),
        DoneKind::GreenPasses => (Build, "GREEN passes", &[Build]),
        DoneKind::GreenFails => (Build, "GREEN fails: repair", &[Build, Halted]),
        DoneKind::RefactorKept => (Build, "REFACTOR kept", &[Build]),
        DoneKind::RefactorBroke => (Build, "REFACTOR reverted", &[Build]),
        DoneKind::ReviewApproved => (Build, "review approved", &[Build, DeployGate]),
        DoneKind::ChangesRequested => (Build, "changes requested", &[Build, Halted]),
        DoneKind::DeployApproved => (DeployGate, "deploy approved", &[Deploy]),
        DoneKind::DeployPasses => (Deploy, "full suite passes", &[PromoteGate]),
        DoneKind::DeployFails => (Deploy, "full suite fails", &[Halted]),
        DoneKind::PromoteApproved => (PromoteGate, "promote approved", &[Promote]),
        DoneKind::Promoted => (Promote, "migrations promoted", &[Phase::Done]),
    }
}

/// The lifecycle: what follows `done`. Allocates the ids of what it issues and keeps the
/// bounds (revisions, repairs, review rounds); nothing else decides a successor.
pub(super) fn next_after(
    cfg: &MachineConfig,
    s: &mut State,
    done: Done,
) -> Result<Next, RuleViolation> {
    use Next::Go;
    Ok(match done {
        // The design lane: stories → spec → architecture → schema → test list → (UX) → gate.
        Done::Started => Go(agent(s, Step::Stories, 0, Vec::new())),
        Done::Stories => {
            let revision = s.revisions;
            Go(agent(s, Step::Spec { revision }, 0, Vec::new()))
        }
        Done::Spec { revision } => Go(agent(s, Step::Architecture { revision }, 0, Vec::new())),
        Done::ArchitectureApproved => Go(agent(s, Step::Schema, 0, Vec::new())),
        Done::RevisionAsked { step, reasons } => revise_or_halt(cfg, s, &step, reasons),
        Done::Schema => Go(agent(s, Step::TestList, 0, Vec::new())),
        Done::TestList if user_facing(s) => Go(agent(s, Step::Ux, 0, Vec::new())),
        // The baseline before the gate: the project's suite as it stands (observed first), so
        // the person approving the design sees what fails before the feature, and no agent of
        // the build lane is ever charged for it.
        Done::TestList | Done::Ux => {
            let gate = design_gate(s)?;
            let request = next_request(s);
            Go(observe(Pending::Baseline {
                request,
                then: Some(Box::new(gate)),
            }))
        }
        // The build lane, per entry: RED → apply → verify → GREEN → apply → verify (repairs) →
        // REFACTOR → apply → verify (dropped if it breaks) → REVIEW (change requests loop back
        // to REFACTOR) → the next entry's RED, or the deploy gate after the last.
        // The baseline ran before the gate: the first RED, observed first (the design and the
        // test files as frozen).
        Done::DesignApproved => {
            s.build = Default::default();
            let test = current_id(s)?;
            Go(observe(agent(s, Step::Red { test }, 0, Vec::new())))
        }
        Done::BaselineRan { failing, then } => after_baseline(s, failing, then)?,
        Done::ChangeAccepted {
            step,
            attempt,
            change_set,
        } => Go(Pending::Apply {
            step,
            attempt,
            change_set,
        }),
        Done::Applied {
            step,
            attempt,
            workspace_hash,
            tests,
            inverse,
        } => Go(verify_change(
            s,
            step,
            attempt,
            workspace_hash,
            tests,
            inverse,
        )),
        Done::RedFails { focus, excerpt } => {
            let test = current_id(s)?;
            let feedback = vec![format!(
                "The new test {focus} fails as it should. Make it pass without touching any test.\n{excerpt}"
            )];
            Go(observe(agent(s, Step::Green { test }, 0, feedback)))
        }
        Done::GreenPasses => {
            s.build.repairs = 0;
            let refactor = Step::Refactor {
                test: current_id(s)?,
                round: s.build.review_rounds,
            };
            Go(observe(agent(s, refactor, 0, Vec::new())))
        }
        Done::GreenFails { step, feedback } => repair_or_halt(cfg, s, step, feedback)?,
        Done::RefactorKept => Go(review(s)?),
        Done::RefactorBroke { inverse, feedback } => Go(refactor_reverted(s, inverse, feedback)?),
        Done::ReviewApproved => Go(next_test(s)?),
        Done::ChangesRequested { step, reasons } => refactor_or_halt(cfg, s, &step, reasons)?,
        // Release: deploy gate → full-suite run → promote gate → promote → done.
        Done::DeployApproved => Go(observe(deploy_verify(s)?)),
        Done::DeployFails { feedback } => {
            let esc = escalation(
                "deploy",
                EscalationReason::Verdict(VerdictReason::TestsRed),
                feedback,
            );
            Next::Halt(esc, observe(deploy_verify(s)?))
        }
        Done::DeployPasses { hash } => Go(Pending::Gate {
            gate: GateKind::Promote,
            hash,
        }),
        Done::PromoteApproved => {
            let request = next_request(s);
            Go(observe(Pending::Promote { request }))
        }
        Done::Promoted => Next::Finish,
    })
}

/// The halt for tests that failed in the baseline, before any agent acted: a person decides.
/// The baseline ran: a halt for a person while a test failing there is not quarantined;
/// otherwise what was pending when it was asked for again, or the build lane's first RED.
fn after_baseline(
    s: &mut State,
    failing: Vec<String>,
    then: Option<Box<Pending>>,
) -> Result<Next, RuleViolation> {
    let unjudged: Vec<String> = failing
        .into_iter()
        .filter(|t| !s.is_quarantined(t))
        .collect();
    Ok(match (unjudged.is_empty(), then) {
        (true, Some(then)) => Next::Go(*then),
        (true, None) => {
            let test = current_id(s)?;
            Next::Go(observe(agent(s, Step::Red { test }, 0, Vec::new())))
        }
        (false, then) => {
            let escalation = failing_before(&unjudged, then.is_some());
            let resume = Pending::Baseline {
                request: crate::RequestId(s.next_request + 1),
                then,
            };
            Next::Halt(escalation, resume)
        }
    })
}

fn failing_before(tests: &[String], after_a_harness_change: bool) -> Escalation {
    let shown: Vec<&str> = tests.iter().take(20).map(String::as_str).collect();
    let more = tests.len().saturating_sub(shown.len());
    let when = if after_a_harness_change {
        "run again because a person changed the harness (the feature's own tests set aside)"
    } else {
        "before the design gate, before any agent of the build lane acted"
    };
    escalation(
        "baseline",
        EscalationReason::FailingBeforeTheFeature,
        format!(
            "{} of the project's tests failed in the baseline, the project's whole suite run as every verification will run it, {when}: {}{}. No agent is charged for them. Quarantine each that cannot pass here (`consort test quarantine NAME --by <you> --reason <why>`: its failures then judge nothing), or fix the setup; then `consort retry --by <you>` runs the baseline again",
            tests.len(),
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ),
    )
}

/// A refactor that broke tests is undone and left out of what the review sees; the Driver
/// hears why in its next assignment; the review goes on with the code as it was.
fn refactor_reverted(
    s: &mut State,
    inverse: Option<ChangeSet>,
    feedback: String,
) -> Result<Pending, RuleViolation> {
    s.build.since_review.pop();
    s.build.driver_notes.push(format!(
        "Your last refactor was reverted, because it broke tests; the code is as it was before it.\n{feedback}"
    ));
    let review = review(s)?;
    Ok(match inverse {
        Some(change_set) => revert(change_set, review, None),
        None => review,
    })
}

/// The spec goes back to the Product Owner, unless the architect has used every revision.
fn revise_or_halt(cfg: &MachineConfig, s: &mut State, step: &Step, reasons: Vec<String>) -> Next {
    if s.revisions >= cfg.max_revisions {
        let esc = escalation(
            &step.to_string(),
            EscalationReason::Verdict(VerdictReason::RevisionBoundSpent),
            format!(
                "the architect asked for revisions {} times: {}",
                s.revisions + 1,
                reasons.join("; ")
            ),
        );
        let revision = s.revisions + 1;
        return Next::Halt(esc, resume_agent(s, Step::Spec { revision }, reasons));
    }
    s.revisions += 1;
    let revision = s.revisions;
    Next::Go(agent(s, Step::Spec { revision }, 0, reasons))
}

/// A failed GREEN gets a repair round, unless every round is used.
fn repair_or_halt(
    cfg: &MachineConfig,
    s: &mut State,
    step: Option<Step>,
    feedback: String,
) -> Result<Next, RuleViolation> {
    let step = step.ok_or_else(|| invariant("a GREEN run names its step"))?;
    s.build.repairs += 1;
    let feedback = vec![feedback];
    let repair = Step::Repair {
        test: current_id(s)?,
        round: s.build.repairs,
    };
    let spent = spent_bound(
        (s.build.repairs, cfg.max_repairs),
        &step,
        VerdictReason::RepairBoundSpent,
        || {
            format!(
                "GREEN still fails after {} repair rounds: {}",
                cfg.max_repairs,
                feedback.join(" ")
            )
        },
    );
    Ok(build_step_or_halt(s, repair, feedback, spent))
}

/// A change request sends the code back to REFACTOR, unless every review round is used.
fn refactor_or_halt(
    cfg: &MachineConfig,
    s: &mut State,
    step: &Step,
    reasons: Vec<String>,
) -> Result<Next, RuleViolation> {
    s.build.review_rounds += 1;
    let refactor = Step::Refactor {
        test: current_id(s)?,
        round: s.build.review_rounds,
    };
    let rounds = s.build.review_rounds;
    let spent = spent_bound(
        (rounds, cfg.max_review_rounds),
        step,
        VerdictReason::ReviewBoundSpent,
        || {
            format!(
                "the review asked for changes {rounds} times: {}",
                reasons.join("; ")
            )
        },
    );
    Ok(build_step_or_halt(s, refactor, reasons, spent))
}

/// The escalation of `step` for `reason`, saying `detail`, once the rounds `(used, max)` are
/// past their bound; none while they are within it.
fn spent_bound(
    (used, max): (u32, u32),
    step: &Step,
    reason: VerdictReason,
    detail: impl FnOnce() -> String,
) -> Option<Escalation> {
    (used > max).then(|| {
        escalation(
            &step.to_string(),
            EscalationReason::Verdict(reason),
            detail(),
        )
    })
}

/// The next build step with its feedback, after an observation of the disk; or, when its bound
/// is `spent`, a halt whose retry assigns exactly that step.
fn build_step_or_halt(
    s: &mut State,
    step: Step,
    feedback: Vec<String>,
    spent: Option<Escalation>,
) -> Next {
    match spent {
        Some(esc) => Next::Halt(esc, observe(resume_agent(s, step, feedback))),
        None => Next::Go(observe(agent(s, step, 0, feedback))),
    }
}

/// The run on a fresh branch that judges an applied change: RED and REFACTOR keep the undo
/// (either may be dropped), GREEN and repairs do not.
fn verify_change(
    s: &mut State,
    step: Step,
    attempt: u32,
    workspace_hash: ContentHash,
    tests: FileHashes,
    inverse: ChangeSet,
) -> Pending {
    let (purpose, droppable) = match step {
        Step::Red { .. } => (VerifyPurpose::Red, true),
        Step::Refactor { .. } => (VerifyPurpose::Refactor, true),
        _ => (VerifyPurpose::Green, false),
    };
    Pending::Verify {
        request: next_request(s),
        step: Some(step),
        purpose,
        workspace_hash,
        inverse: droppable.then_some(inverse),
        attempt,
        tests_after: tests,
    }
}

fn user_facing(s: &State) -> bool {
    s.stories
        .as_ref()
        .is_some_and(|st| st.stories.iter().any(|x| x.user_facing))
}

fn design_gate(s: &State) -> Result<Pending, RuleViolation> {
    let bundle = s
        .design_bundle()
        .ok_or_else(|| invariant("every part of the design is accepted before its gate"))?;
    Ok(Pending::Gate {
        gate: GateKind::Design,
        hash: bundle.hash(),
    })
}

fn review(s: &mut State) -> Result<Pending, RuleViolation> {
    let test = current_id(s)?;
    let round = s.build.review_rounds;
    Ok(observe(agent(
        s,
        Step::Review { test, round },
        0,
        Vec::new(),
    )))
}

/// The current entry is done: the next one's RED, or the deploy gate after the last.
fn next_test(s: &mut State) -> Result<Pending, RuleViolation> {
    s.build.completed += 1;
    s.build.current += 1;
    s.build.code_authors.clear();
    s.build.repairs = 0;
    s.build.review_rounds = 0;
    s.build.since_review.clear();
    if s.current_test().is_some() {
        let test = current_id(s)?;
        return Ok(observe(agent(s, Step::Red { test }, 0, Vec::new())));
    }
    let evidence = s
        .release_evidence()
        .ok_or_else(|| invariant("the design is frozen in the build lane"))?;
    Ok(Pending::Gate {
        gate: GateKind::Deploy,
        hash: ContentHash::of(&evidence),
    })
}

/// The full-suite run on a fresh branch, for the work tree the build lane left.
fn deploy_verify(s: &mut State) -> Result<Pending, RuleViolation> {
    let workspace_hash = s
        .build
        .workspace_hash
        .ok_or_else(|| invariant("the build lane applied its changes before the deploy run"))?;
    Ok(Pending::Verify {
        request: next_request(s),
        step: None,
        purpose: VerifyPurpose::Deploy,
        workspace_hash,
        inverse: None,
        attempt: 0,
        tests_after: s.build.frozen_tests.clone(),
    })
}

/// A new assignment of `step` (the next assignment id).
pub(super) fn agent(s: &mut State, step: Step, attempt: u32, mut feedback: Vec<String>) -> Pending {
    s.next_assignment += 1;
    if step.role() == crate::Role::Driver && !s.build.driver_notes.is_empty() {
        let notes = std::mem::take(&mut s.build.driver_notes);
        feedback.splice(0..0, notes);
    }
    Pending::Agent {
        id: AssignmentId(s.next_assignment),
        step,
        attempt,
        feedback,
    }
}

/// A resume point for a halt: the assignment of `step` a retry issues, with the id it will get
/// then. It allocates nothing now: nothing allocates an id while the run is halted, and the
/// retry ([`super::transition`]'s `refresh`) gives every resumed assignment the next id.
pub(super) fn resume_agent(s: &State, step: Step, feedback: Vec<String>) -> Pending {
    Pending::Agent {
        id: AssignmentId(s.next_assignment + 1),
        step,
        attempt: 0,
        feedback,
    }
}

pub(super) fn next_request(s: &mut State) -> crate::RequestId {
    s.next_request += 1;
    crate::RequestId(s.next_request)
}

pub(super) fn observe(then: Pending) -> Pending {
    Pending::Observe {
        then: Box::new(then),
    }
}

/// Undo `change_set`, then go on with `then` (or halt with `halt`, resuming at `then`).
pub(super) fn revert(change_set: ChangeSet, then: Pending, halt: Option<Escalation>) -> Pending {
    Pending::Revert {
        change_set,
        then: Box::new(then),
        halt,
    }
}

pub(super) fn escalation(step: &str, reason: EscalationReason, detail: String) -> Escalation {
    Escalation {
        step: step.to_string(),
        reason,
        detail,
    }
}

/// A state the lifecycle cannot reach: a bug, which halts the run.
pub(super) fn invariant(what: &str) -> RuleViolation {
    RuleViolation::Invariant {
        what: what.to_string(),
    }
}

pub(super) fn current_id(s: &State) -> Result<String, RuleViolation> {
    s.current_test()
        .map(|e| e.id.clone())
        .ok_or_else(|| invariant("the build lane has a current test entry"))
}
