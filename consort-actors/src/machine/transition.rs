//! The transition function. Reads like the lifecycle: idle → design lane → design gate → build
//! lane (RED, GREEN, repair, REFACTOR, REVIEW per test) → deploy gate → deploy → promote gate →
//! promote → done; any step can halt for a human.

use std::sync::Arc;

use crate::artifact::{
    ArchitectureVerdict, Artifact, ChangeSet, Escalation, EscalationReason, FileHashes,
    GateDecision, GateKind, Migration, ReviewVerdict, TestRunReceipt, TestStatus, VerdictReason,
};
use crate::hash::ContentHash;
use crate::protocol::{AssignmentId, VerifyPurpose};
use crate::role::ActorId;
use crate::step::Step;

use super::rules::{
    Remedy, RuleViolation, Writer, check_change_set, check_schema, check_spec, check_stories,
    check_test_list, check_tests_on_disk, check_ux, written_hashes,
};
use super::{Command, Event, Frozen, HumanDecision, MachineConfig, Pending, RunStatus, State};

type Outcome = Result<(State, Vec<Command>), RuleViolation>;

/// Longest receipt excerpt handed back to an agent as feedback.
const FEEDBACK_EXCERPT: usize = 2000;

pub(super) fn step(cfg: &MachineConfig, state: &State, event: &Event) -> Outcome {
    match &state.status {
        RunStatus::Done | RunStatus::Stopped => match event {
            Event::Refused { .. } => Ok((state.clone(), Vec::new())),
            _ => Err(RuleViolation::Finished),
        },
        RunStatus::Idle => idle(state, event),
        RunStatus::Halted { .. } => halted(state, event),
        RunStatus::Running => running(cfg, state, event),
    }
}

fn out_of_order(expected: &str, event: &Event) -> RuleViolation {
    RuleViolation::StepOutOfOrder {
        expected: expected.to_string(),
        got: event.name().to_string(),
    }
}

fn idle(state: &State, event: &Event) -> Outcome {
    match event {
        Event::Start { feature } => {
            if feature.id.trim().is_empty() || feature.title.trim().is_empty() {
                return Err(RuleViolation::InvalidArtifact {
                    detail: "the feature request needs an id and a title".into(),
                });
            }
            let mut s = state.clone();
            s.status = RunStatus::Running;
            s.feature = Some(Arc::new(feature.clone()));
            let next = agent(&mut s, Step::Stories, 0, Vec::new());
            Ok(go(s, next))
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
        Event::Refused { .. } => Ok((state.clone(), Vec::new())),
        _ => Err(out_of_order("a human decision on the halt", event)),
    }
}

/// A human ended the run: nothing pending is performed any more.
fn stopped(state: &State) -> (State, Vec<Command>) {
    let mut s = state.clone();
    s.status = RunStatus::Stopped;
    s.pending = None;
    (s, vec![Command::Finish])
}

/// Gives a resumed pending item fresh ids (an agent retry is a new assignment, attempt 0).
fn refresh(s: &mut State, p: Pending) -> Pending {
    match p {
        Pending::Agent { step, feedback, .. } => agent(s, step, 0, feedback),
        Pending::Observe { then } => Pending::Observe {
            then: Box::new(refresh(s, *then)),
        },
        Pending::Revert {
            change_set,
            then,
            halt,
        } => Pending::Revert {
            change_set,
            then,
            halt,
        },
        other => other,
    }
}

fn running(cfg: &MachineConfig, state: &State, event: &Event) -> Outcome {
    let Some(pending) = state.pending.clone() else {
        return Err(out_of_order("nothing (no pending step)", event));
    };
    if let Event::Refused { violation } = event {
        return refused(cfg, state, pending, violation);
    }
    // A human may end a run that is not halted: one interrupted mid-step (its process killed,
    // its ledger still running) or one waiting at a gate. A retry still needs a halt.
    if let Event::Human {
        decision: HumanDecision::Stop,
        ..
    } = event
    {
        return Ok(stopped(state));
    }
    if let Pending::Gate { gate, hash } = &pending {
        return match event {
            Event::Gate { approval } => gate_decision(state, *gate, *hash, approval),
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
            },
            Pending::Agent {
                id, step, attempt, ..
            },
        ) => {
            if *assignment != id {
                return Err(RuleViolation::UnknownAssignment {
                    expected: Some(id),
                    got: *assignment,
                });
            }
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
            },
            Pending::Agent {
                id, step, feedback, ..
            },
        ) => {
            if *assignment != id {
                return Err(RuleViolation::UnknownAssignment {
                    expected: Some(id),
                    got: *assignment,
                });
            }
            let mut s = state.clone();
            let resume = Pending::Agent {
                id,
                step: step.clone(),
                attempt: 0,
                feedback,
            };
            let esc = escalation(
                &step.to_string(),
                failure.escalation_reason(),
                failure.to_string(),
            );
            Ok(halt(&mut s, esc, resume))
        }
        (Event::Observed { design_hash, tests }, Pending::Observe { then }) => {
            if let Some(frozen) = &state.frozen
                && *design_hash != Some(frozen.hash)
            {
                return Err(RuleViolation::DesignHashMismatch {
                    expected: frozen.hash,
                    found: *design_hash,
                });
            }
            check_tests_on_disk(&state.build.frozen_tests, tests)?;
            let s = state.clone();
            Ok(go(s, *then))
        }
        (
            Event::Applied {
                workspace_hash,
                tests,
                inverse,
            },
            Pending::Apply {
                step,
                attempt,
                change_set,
            },
        ) => {
            let mut expected = state.build.frozen_tests.clone();
            if matches!(step, Step::Red { .. }) {
                expected.extend(written_hashes(&change_set));
            }
            check_tests_on_disk(&expected, tests)?;
            let mut s = state.clone();
            s.build.workspace_hash = Some(*workspace_hash);
            let droppable = matches!(step, Step::Red { .. } | Step::Refactor { .. });
            let purpose = match step {
                Step::Red { .. } => VerifyPurpose::Red,
                Step::Refactor { .. } => VerifyPurpose::Refactor,
                _ => VerifyPurpose::Green,
            };
            let next = Pending::Verify {
                request: next_request(&mut s),
                step: Some(step),
                purpose,
                workspace_hash: *workspace_hash,
                inverse: droppable.then(|| inverse.clone()),
                attempt,
                tests_after: tests.clone(),
            };
            Ok(go(s, next))
        }
        (
            Event::Applied {
                workspace_hash,
                tests,
                ..
            },
            Pending::Revert {
                then,
                halt: halting,
                ..
            },
        ) => {
            check_tests_on_disk(&state.build.frozen_tests, tests)?;
            let mut s = state.clone();
            s.build.workspace_hash = Some(*workspace_hash);
            match halting {
                Some(esc) => Ok(halt(&mut s, esc, *then)),
                None => Ok(go(s, *then)),
            }
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
        (
            Event::VerifyCompleted { receipt },
            Pending::Verify {
                request,
                step,
                purpose,
                workspace_hash,
                inverse,
                attempt,
                tests_after,
            },
        ) => {
            if receipt.request_id != request {
                return Err(RuleViolation::ReceiptNotForRequest {
                    expected: Some(request),
                    got: receipt.request_id,
                });
            }
            if !receipt.tree_changes.is_empty() {
                return Err(RuleViolation::RunChangedTree {
                    paths: receipt.tree_changes.clone(),
                });
            }
            if receipt.workspace_hash != workspace_hash {
                return Err(RuleViolation::ReceiptWorkspaceMismatch {
                    expected: workspace_hash,
                    got: receipt.workspace_hash,
                });
            }
            verified(
                cfg,
                state,
                step,
                purpose,
                inverse,
                attempt,
                tests_after,
                receipt,
            )
        }
        (Event::VerifyCompleted { receipt }, _) => Err(RuleViolation::ReceiptNotForRequest {
            expected: None,
            got: receipt.request_id,
        }),
        (Event::VerifyFailed { request, error }, p @ Pending::Verify { .. }) => {
            if !matches!(&p, Pending::Verify { request: r, .. } if r == request) {
                return Err(RuleViolation::ReceiptNotForRequest {
                    expected: None,
                    got: *request,
                });
            }
            let mut s = state.clone();
            let esc = escalation(
                &describe(&p),
                EscalationReason::Infrastructure(error.fault.clone()),
                error.detail.clone(),
            );
            Ok(halt(&mut s, esc, p))
        }
        (Event::Promoted { report }, Pending::Promote { request }) => {
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
                    detail: format!("verified={}, missing versions {missing:?}", report.verified),
                });
            }
            let mut s = state.clone();
            s.promotion = Some(report.clone());
            s.status = RunStatus::Done;
            s.pending = None;
            Ok((s, vec![Command::Finish]))
        }
        (Event::PromoteFailed { request, error }, p @ Pending::Promote { .. }) => {
            if !matches!(&p, Pending::Promote { request: r } if r == request) {
                return Err(RuleViolation::ReceiptNotForRequest {
                    expected: None,
                    got: *request,
                });
            }
            let mut s = state.clone();
            let esc = escalation(
                "promote",
                EscalationReason::Infrastructure(error.fault.clone()),
                error.detail.clone(),
            );
            Ok(halt(&mut s, esc, p))
        }
        (Event::Gate { approval }, _) => Err(RuleViolation::GateNotPending {
            gate: approval.gate,
        }),
        (Event::Human { .. }, _) => Err(RuleViolation::NotHalted),
        (event, pending) => Err(out_of_order(&describe(&pending), event)),
    }
}

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
    let key = step.to_string();
    let next = match (&step, artifact) {
        (Step::Stories, Artifact::Stories(stories)) => {
            let feature_id = s.feature.as_ref().map(|f| f.id.clone()).unwrap_or_default();
            check_stories(stories, &feature_id)?;
            s.stories = Some(Arc::new(stories.clone()));
            {
                let revision = s.revisions;
                agent(&mut s, Step::Spec { revision }, 0, Vec::new())
            }
        }
        (Step::Spec { revision }, Artifact::Spec(spec)) => {
            check_spec(spec, s.stories.as_ref().ok_or_else(|| missing("stories"))?)?;
            s.spec = Some(Arc::new(spec.clone()));
            agent(
                &mut s,
                Step::Architecture {
                    revision: *revision,
                },
                0,
                Vec::new(),
            )
        }
        (Step::Architecture { .. }, Artifact::ArchitectureVerdict(verdict)) => match verdict {
            ArchitectureVerdict::Approve { .. } => {
                s.architecture = Some(Arc::new(verdict.clone()));
                agent(&mut s, Step::Schema, 0, Vec::new())
            }
            ArchitectureVerdict::Revise { reasons } => {
                if reasons.iter().all(|r| r.trim().is_empty()) {
                    return Err(RuleViolation::InvalidArtifact {
                        detail: "a revise verdict needs reasons".into(),
                    });
                }
                s.authors.push(Arc::new((key, author.clone())));
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
                    let resume = Pending::Agent {
                        id: AssignmentId(0),
                        step: Step::Spec {
                            revision: s.revisions + 1,
                        },
                        attempt: 0,
                        feedback: reasons.clone(),
                    };
                    return Ok(halt(&mut s, esc, resume));
                }
                s.revisions += 1;
                let revision = s.revisions;
                let next = agent(&mut s, Step::Spec { revision }, 0, reasons.clone());
                return Ok(go(s, next));
            }
        },
        (Step::Schema, Artifact::SchemaPlan(plan)) => {
            check_schema(plan, s.stories.as_ref().ok_or_else(|| missing("stories"))?)?;
            s.schema = Some(Arc::new(plan.clone()));
            agent(&mut s, Step::TestList, 0, Vec::new())
        }
        (Step::TestList, Artifact::TestList(list)) => {
            check_test_list(
                list,
                s.stories.as_ref().ok_or_else(|| missing("stories"))?,
                &cfg.paths,
            )?;
            s.test_list = Some(Arc::new(list.clone()));
            let user_facing = s
                .stories
                .as_ref()
                .is_some_and(|st| st.stories.iter().any(|x| x.user_facing));
            if user_facing {
                agent(&mut s, Step::Ux, 0, Vec::new())
            } else {
                design_gate(&s)?
            }
        }
        (Step::Ux, Artifact::UxDesign(ux)) => {
            check_ux(ux, s.stories.as_ref().ok_or_else(|| missing("stories"))?)?;
            s.ux = Some(Arc::new(ux.clone()));
            design_gate(&s)?
        }
        (Step::Red { .. }, Artifact::ChangeSet(set)) => {
            let set = check_change_set(set, writer(&s, &step)?, &cfg.paths, &s.build.frozen_tests)?;
            Pending::Apply {
                step: step.clone(),
                attempt,
                change_set: set,
            }
        }
        (
            Step::Green { .. } | Step::Repair { .. } | Step::Refactor { .. },
            Artifact::ChangeSet(set),
        ) => {
            let set = check_change_set(set, Writer::Code, &cfg.paths, &s.build.frozen_tests)?;
            if !s.build.code_authors.contains(author) {
                s.build.code_authors.push(author.clone());
            }
            if set.changes.is_empty() && matches!(step, Step::Refactor { .. }) {
                s.authors.push(Arc::new((key, author.clone())));
                let next = review(&mut s);
                return Ok(go(s, next));
            }
            Pending::Apply {
                step: step.clone(),
                attempt,
                change_set: set,
            }
        }
        (Step::Review { .. }, Artifact::ReviewVerdict(verdict)) => {
            if s.build.code_authors.iter().any(|a| a.name == author.name) {
                return Err(RuleViolation::ReviewerIsAuthor {
                    reviewer: author.clone(),
                });
            }
            s.authors.push(Arc::new((key, author.clone())));
            let next = match verdict {
                ReviewVerdict::Approve { .. } => next_test(&mut s)?,
                ReviewVerdict::ChangesRequested { reasons } => {
                    if reasons.iter().all(|r| r.trim().is_empty()) {
                        return Err(RuleViolation::InvalidArtifact {
                            detail: "a change request needs reasons".into(),
                        });
                    }
                    s.build.review_rounds += 1;
                    let test = current_id(&s)?;
                    let refactor = Step::Refactor {
                        test,
                        round: s.build.review_rounds,
                    };
                    if s.build.review_rounds > cfg.max_review_rounds {
                        let esc = escalation(
                            &step.to_string(),
                            EscalationReason::Verdict(VerdictReason::ReviewBoundSpent),
                            format!(
                                "the review asked for changes {} times: {}",
                                s.build.review_rounds,
                                reasons.join("; ")
                            ),
                        );
                        let resume = Pending::Agent {
                            id: AssignmentId(0),
                            step: refactor,
                            attempt: 0,
                            feedback: reasons.clone(),
                        };
                        return Ok(halt(&mut s, esc, observe(resume)));
                    }
                    observe(agent(&mut s, refactor, 0, reasons.clone()))
                }
            };
            return Ok(go(s, next));
        }
        _ => {
            return Err(RuleViolation::WrongArtifactKind {
                expected: step.output_kind(),
                got: artifact.kind(),
            });
        }
    };
    s.authors.push(Arc::new((key, author.clone())));
    Ok(go(s, next))
}

#[allow(clippy::too_many_arguments)]
fn verified(
    cfg: &MachineConfig,
    state: &State,
    step: Option<Step>,
    purpose: VerifyPurpose,
    inverse: Option<ChangeSet>,
    _attempt: u32,
    tests_after: FileHashes,
    receipt: &TestRunReceipt,
) -> Outcome {
    let mut s = state.clone();
    let names = expected_names(&s, purpose);
    match purpose {
        VerifyPurpose::Red => {
            let focus = s
                .current_test()
                .map(|e| e.runner_name().to_string())
                .ok_or_else(|| missing("test entry"))?;
            match receipt.status_of(&focus) {
                Some(TestStatus::Failed | TestStatus::Errored) => {}
                Some(TestStatus::Passed) => {
                    return Err(RuleViolation::RedPassedWithoutCode { test: focus });
                }
                Some(TestStatus::Skipped) | None => {
                    return Err(RuleViolation::RedTestNotRun { test: focus });
                }
            }
            let broken: Vec<String> = names
                .iter()
                .filter(|n| **n != focus && receipt.status_of(n) != Some(TestStatus::Passed))
                .cloned()
                .collect();
            if !broken.is_empty() {
                return Err(RuleViolation::RedBrokeGreenTest { tests: broken });
            }
            s.build.frozen_tests = tests_after;
            s.receipts.push(Arc::new(receipt.clone()));
            let test = current_id(&s)?;
            let feedback = vec![format!(
                "The new test {focus} fails as it should. Make it pass without touching any test.\n{}",
                excerpt(receipt)
            )];
            let next = observe(agent(&mut s, Step::Green { test }, 0, feedback));
            Ok(go(s, next))
        }
        VerifyPurpose::Green => {
            s.receipts.push(Arc::new(receipt.clone()));
            let test = current_id(&s)?;
            if all_pass(receipt, &names) {
                s.build.repairs = 0;
                let refactor = Step::Refactor {
                    test,
                    round: s.build.review_rounds,
                };
                let next = observe(agent(&mut s, refactor, 0, Vec::new()));
                return Ok(go(s, next));
            }
            s.build.repairs += 1;
            let feedback = vec![failure_feedback(receipt, &names)];
            let repair = Step::Repair {
                test,
                round: s.build.repairs,
            };
            if s.build.repairs > cfg.max_repairs {
                let esc = escalation(
                    &step.map(|x| x.to_string()).unwrap_or_default(),
                    EscalationReason::Verdict(VerdictReason::RepairBoundSpent),
                    format!(
                        "GREEN still fails after {} repair rounds: {}",
                        cfg.max_repairs,
                        feedback.join(" ")
                    ),
                );
                let resume = Pending::Agent {
                    id: AssignmentId(0),
                    step: repair,
                    attempt: 0,
                    feedback,
                };
                return Ok(halt(&mut s, esc, observe(resume)));
            }
            let next = observe(agent(&mut s, repair, 0, feedback));
            Ok(go(s, next))
        }
        VerifyPurpose::Refactor => {
            s.receipts.push(Arc::new(receipt.clone()));
            if all_pass(receipt, &names) {
                let next = review(&mut s);
                return Ok(go(s, next));
            }
            // The refactor broke something: drop it, keep the green code, go on to review.
            let next = review(&mut s);
            match inverse {
                Some(change_set) => Ok(go(
                    s,
                    Pending::Revert {
                        change_set,
                        then: Box::new(next),
                        halt: None,
                    },
                )),
                None => Ok(go(s, next)),
            }
        }
        VerifyPurpose::Deploy => {
            s.receipts.push(Arc::new(receipt.clone()));
            if !all_pass(receipt, &names) {
                let esc = escalation(
                    "deploy",
                    EscalationReason::Verdict(VerdictReason::TestsRed),
                    failure_feedback(receipt, &names),
                );
                let resume = observe(deploy_verify(&mut s));
                return Ok(halt(&mut s, esc, resume));
            }
            let hash = ContentHash::of(&(
                s.schema.clone(),
                receipt.output_digest,
                receipt.workspace_hash,
            ));
            Ok(go(
                s,
                Pending::Gate {
                    gate: GateKind::Promote,
                    hash,
                },
            ))
        }
    }
}

fn refused(
    cfg: &MachineConfig,
    state: &State,
    pending: Pending,
    violation: &RuleViolation,
) -> Outcome {
    let mut s = state.clone();
    let remedy = violation.remedy();
    if remedy == Remedy::Ignore {
        return Ok((s, Vec::new()));
    }
    let feedback =
        format!("Your previous answer was refused: {violation}. Try again within the rules.");
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
        ) => Ok(retry(&mut s, step, attempt, inverse)),
        (_, pending) => {
            let esc = escalation(
                &describe(&pending),
                EscalationReason::Verdict(VerdictReason::RuleViolated),
                violation.to_string(),
            );
            Ok(halt(&mut s, esc, pending))
        }
    }
}

/// The agent of `step` tries again with `feedback` (attempt + 1), after `revert` is undone;
/// past the retry bound the run halts instead, with the violation as the reason.
fn retry_agent(
    cfg: &MachineConfig,
    s: &mut State,
    step: Step,
    attempt: u32,
    revert: Option<ChangeSet>,
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
        Pending::Agent {
            id: AssignmentId(0),
            step: step.clone(),
            attempt: 0,
            feedback: feedback.clone(),
        }
    } else {
        agent(s, step.clone(), attempt + 1, feedback)
    };
    let mut s = s.clone();
    let again = if step.is_build() {
        observe(again)
    } else {
        again
    };
    match (revert, exhausted) {
        (Some(change_set), exhausted) => go(
            s,
            Pending::Revert {
                change_set,
                then: Box::new(again),
                halt: exhausted.then_some(esc),
            },
        ),
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
    resolved: &std::collections::BTreeMap<String, String>,
) -> Outcome {
    let mut s = state.clone();
    let Pending::Apply { step, attempt, .. } = &pending else {
        return Err(violation.clone());
    };
    if violation.remedy() != Remedy::RetryAgent {
        let esc = escalation(
            &describe(&pending),
            EscalationReason::Verdict(VerdictReason::RuleViolated),
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
fn writer<'a>(s: &'a State, step: &Step) -> Result<Writer<'a>, RuleViolation> {
    Ok(match step {
        Step::Red { .. } => Writer::Red {
            must_write: &s.current_test().ok_or_else(|| missing("test entry"))?.path,
        },
        _ => Writer::Code,
    })
}

pub(super) fn check_resolved(
    cfg: &MachineConfig,
    state: &State,
    resolved: &ChangeSet,
) -> Result<ChangeSet, RuleViolation> {
    match &state.pending {
        Some(Pending::Apply { step, .. }) if state.status == RunStatus::Running => {
            check_change_set(
                resolved,
                writer(state, step)?,
                &cfg.paths,
                &state.build.frozen_tests,
            )
        }
        _ => Ok(resolved.clone()),
    }
}

fn gate_decision(
    state: &State,
    gate: GateKind,
    hash: ContentHash,
    approval: &crate::GateApproval,
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
    let next = match gate {
        GateKind::Design => {
            s.frozen = Some(Frozen { hash });
            s.build = Default::default();
            let test = current_id(&s)?;
            observe(agent(&mut s, Step::Red { test }, 0, Vec::new()))
        }
        GateKind::Deploy => Pending::Observe {
            then: Box::new(deploy_verify(&mut s)),
        },
        GateKind::Promote => {
            let request = next_request(&mut s);
            Pending::Observe {
                then: Box::new(Pending::Promote { request }),
            }
        }
    };
    Ok(go(s, next))
}

fn design_gate(s: &State) -> Result<Pending, RuleViolation> {
    let bundle = s.design_bundle().ok_or_else(|| missing("design bundle"))?;
    Ok(Pending::Gate {
        gate: GateKind::Design,
        hash: bundle.hash(),
    })
}

fn review(s: &mut State) -> Pending {
    let test = s.current_test().map(|e| e.id.clone()).unwrap_or_default();
    observe(agent(
        s,
        Step::Review {
            test,
            round: s.build.review_rounds,
        },
        0,
        Vec::new(),
    ))
}

fn next_test(s: &mut State) -> Result<Pending, RuleViolation> {
    s.build.completed += 1;
    s.build.current += 1;
    s.build.code_authors.clear();
    s.build.repairs = 0;
    s.build.review_rounds = 0;
    if s.current_test().is_some() {
        let test = current_id(s)?;
        return Ok(observe(agent(s, Step::Red { test }, 0, Vec::new())));
    }
    let evidence = s
        .release_evidence()
        .ok_or_else(|| missing("release evidence"))?;
    Ok(Pending::Gate {
        gate: GateKind::Deploy,
        hash: ContentHash::of(&evidence),
    })
}

fn deploy_verify(s: &mut State) -> Pending {
    Pending::Verify {
        request: next_request(s),
        step: None,
        purpose: VerifyPurpose::Deploy,
        workspace_hash: s.build.workspace_hash.unwrap_or(ContentHash::of_bytes(b"")),
        inverse: None,
        attempt: 0,
        tests_after: s.build.frozen_tests.clone(),
    }
}

fn agent(s: &mut State, step: Step, attempt: u32, feedback: Vec<String>) -> Pending {
    s.next_assignment += 1;
    Pending::Agent {
        id: AssignmentId(s.next_assignment),
        step,
        attempt,
        feedback,
    }
}

fn next_request(s: &mut State) -> crate::RequestId {
    s.next_request += 1;
    crate::RequestId(s.next_request)
}

fn observe(then: Pending) -> Pending {
    Pending::Observe {
        then: Box::new(then),
    }
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

fn escalation(step: &str, reason: EscalationReason, detail: String) -> Escalation {
    Escalation {
        step: step.to_string(),
        reason,
        detail,
    }
}

fn missing(what: &str) -> RuleViolation {
    RuleViolation::StepOutOfOrder {
        expected: format!("{what} first"),
        got: "a later step".into(),
    }
}

fn current_id(s: &State) -> Result<String, RuleViolation> {
    s.current_test()
        .map(|e| e.id.clone())
        .ok_or_else(|| missing("a test entry"))
}

/// Runner names of the tests that must pass: all entries up to the current one (all for deploy).
fn expected_names(s: &State, purpose: VerifyPurpose) -> Vec<String> {
    let Some(list) = &s.test_list else {
        return Vec::new();
    };
    let upto = match purpose {
        VerifyPurpose::Deploy => list.entries.len(),
        _ => (s.build.current + 1).min(list.entries.len()),
    };
    list.entries[..upto]
        .iter()
        .map(|e| e.runner_name().to_string())
        .collect()
}

/// Green means: the run exited cleanly, reported every expected test as passed, and reported
/// nothing failed — an exit code of 0 with failures in the report is not a pass.
fn all_pass(receipt: &TestRunReceipt, names: &[String]) -> bool {
    receipt.exit.success()
        && !receipt.outcomes.is_empty()
        && receipt
            .outcomes
            .iter()
            .all(|o| o.status == TestStatus::Passed || o.status == TestStatus::Skipped)
        && names
            .iter()
            .all(|n| receipt.status_of(n) == Some(TestStatus::Passed))
}

fn failure_feedback(receipt: &TestRunReceipt, names: &[String]) -> String {
    let mut missing: Vec<&str> = names
        .iter()
        .filter(|n| receipt.status_of(n).is_none())
        .map(String::as_str)
        .collect();
    missing.truncate(20);
    format!(
        "Tests not passing: {:?}; not reported: {:?}; exit {:?}.\n{}",
        receipt.not_passed(),
        missing,
        receipt.exit,
        excerpt(receipt)
    )
}

fn excerpt(receipt: &TestRunReceipt) -> String {
    receipt
        .output_excerpt
        .chars()
        .take(FEEDBACK_EXCERPT)
        .collect()
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
    }
}

/// The migrations a verify run needs: those of every story up to the current test's story
/// (all of them for the deploy run).
fn migrations_for(s: &State, purpose: VerifyPurpose) -> Vec<Migration> {
    let Some(plan) = &s.schema else {
        return Vec::new();
    };
    let Some(stories) = &s.stories else {
        return Vec::new();
    };
    if purpose == VerifyPurpose::Deploy {
        return plan.migrations.clone();
    }
    let index_of = |story: &str| stories.stories.iter().position(|x| x.id == story);
    let upto = s
        .current_test()
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
            focus: (*purpose == VerifyPurpose::Red)
                .then(|| s.current_test().map(|e| e.runner_name().to_string()))
                .flatten(),
        },
        Pending::Gate { gate, hash } => Command::AwaitGate {
            gate: *gate,
            hash: *hash,
        },
        Pending::Promote { request } => Command::Promote {
            request: *request,
            migrations: s
                .schema
                .as_ref()
                .map(|p| p.migrations.clone())
                .unwrap_or_default(),
        },
    })
}
