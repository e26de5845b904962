//! Role play through MCP: `next_assignment` takes the assignment the run parked for a role,
//! `submit` hands the answer over and waits for the run's verdict.
//!
//! An assignment is offered only while the machine waits for exactly it (the ledger's pending
//! step) and no answer to it is accepted or waiting for the run's judgement, so a mailbox file
//! left by a killed run is never played, and an answer handed over while the run was down is
//! not asked for again. The author of a test's code
//! (whoever answered its GREEN, repairs or refactors in this mailbox) is refused its review,
//! before it is taken and again at submission; the machine's own author check stands behind.

use std::time::{Duration, Instant};

use consort_actors::{AssignmentId, Event, Pending, Role, Step, TestStatus};
use consort_agents::AgentConfig;
use consort_agents::mcp::{MailboxError, Parked, Verdict};
use serde_json::{Value, json};

use super::ToolError;
use super::tools::{NextArgs, SubmitArgs};
use consort::project::Project;

/// The first and the longest pause between two looks.
const POLL: (Duration, Duration) = (Duration::from_millis(25), Duration::from_millis(500));

/// Polls `probe` with backoff until it answers or `limit` passes.
async fn poll<T>(
    limit: Duration,
    mut probe: impl FnMut() -> Result<Option<T>, ToolError>,
) -> Result<Option<T>, ToolError> {
    let start = Instant::now();
    let mut pause = POLL.0;
    loop {
        if let Some(found) = probe()? {
            return Ok(Some(found));
        }
        if start.elapsed() >= limit {
            return Ok(None);
        }
        tokio::time::sleep(pause.min(limit.saturating_sub(start.elapsed()))).await;
        pause = (pause * 2).min(POLL.1);
    }
}

/// The assignment the machine waits for, when it is `role`'s and parked.
fn waiting_for(project: &Project, role: Role) -> Result<Option<Parked>, ToolError> {
    let state = project.state()?;
    let Some(Pending::Agent { id, step, .. }) = &state.pending else {
        return Ok(None);
    };
    if step.role() != role {
        return Ok(None);
    }
    Ok(project.mailbox().parked(id.0)?)
}

/// The assignment the machine waits for, when it is `role`'s, parked, and still waiting for
/// an answer: not accepted, and no submission waiting for the run's judgement.
fn open_for(project: &Project, role: Role) -> Result<Option<Parked>, ToolError> {
    let Some(parked) = waiting_for(project, role)? else {
        return Ok(None);
    };
    let mailbox = project.mailbox();
    let judged = mailbox.verdict(parked.id)?;
    if judged.as_ref().is_some_and(|v| v.closed) {
        return Ok(None);
    }
    let judged_seq = judged.map_or(0, |v| v.seq);
    let unjudged = match mailbox.submission(parked.id) {
        Ok(sub) => sub.is_some_and(|s| s.seq > judged_seq),
        Err(MailboxError::Malformed { .. }) => false,
        Err(e) => return Err(e.into()),
    };
    Ok((!unjudged).then_some(parked))
}

/// Refuses a review to an identity that wrote the code under review.
fn check_not_author(project: &Project, parked: &Parked, identity: &str) -> Result<(), ToolError> {
    let Ok(Step::Review { test, .. }) = parked.step() else {
        return Ok(());
    };
    let mailbox = project.mailbox();
    if !mailbox.code_authors(&test)?.iter().any(|a| a == identity) {
        return Ok(());
    }
    let mut steps = Vec::new();
    for p in mailbox.all_parked()? {
        let code = matches!(p.step(), Ok(Step::Green { test: t } | Step::Repair { test: t, .. } | Step::Refactor { test: t, .. }) if t == test);
        let by_them = mailbox.taken(p.id)?.is_some_and(|t| t.identity == identity);
        if code && by_them && !steps.contains(&p.step) {
            steps.push(p.step.clone());
        }
    }
    Err(ToolError::AuthorReviews {
        identity: identity.to_string(),
        test,
        steps: steps.join(", "),
    })
}

/// `next_assignment`: takes the assignment waiting for `role` in the first of `features`
/// that has one, as `identity`.
pub(super) async fn next_assignment(
    features: &[Project],
    identity: &str,
    req: NextArgs,
) -> Result<String, ToolError> {
    let Some(first) = features.first() else {
        return Err(ToolError::BadArguments {
            tool: "next_assignment".into(),
            detail: "no feature to play in".into(),
        });
    };
    let role: Role =
        req.role
            .parse()
            .map_err(|e: consort_actors::UnknownRole| ToolError::BadArguments {
                tool: "next_assignment".into(),
                detail: e.to_string(),
            })?;
    if !matches!(first.config.agents.for_role(role), AgentConfig::Mcp(_)) {
        return Err(ToolError::NotAnMcpRole { role });
    }
    let limit = Duration::from_secs(req.wait_secs.min(300));
    let open = poll(limit, || {
        for project in features {
            if let Some(parked) = open_for(project, role)? {
                return Ok(Some((project, parked)));
            }
        }
        Ok(None)
    })
    .await?;
    let Some((project, parked)) = open else {
        let next = crate::views::next_text(first, Some(identity))?;
        return Ok(format!(
            "nothing waits for the {role} now (is `consort run` going on?). {next}"
        ));
    };
    check_not_author(project, &parked, identity)?;
    let taken = project.mailbox().take(&parked, identity)?;
    let refusals_left = project
        .mailbox()
        .verdict(parked.id)?
        .map_or(parked.max_refusals, |v| v.refusals_left);
    let answer = json!({
        "feature": project.feature_id(),
        "assignment_id": parked.id,
        "role": parked.role,
        "step": parked.step,
        "attempt": parked.attempt,
        "taken_by": taken.identity,
        "answer_with": parked.answer_with,
        "refused_submissions_left": refusals_left,
        "how_to_answer": format!(
            "call submit with assignment = {}, feature = \"{}\" and artifact = {{\"kind\": \"{}\", \"body\": {{…}}}} following assignment.answer_schema; act on every item of assignment.feedback",
            parked.id, project.feature_id(), parked.answer_with
        ),
        "assignment": parked.assignment,
    });
    Ok(serde_json::to_string_pretty(&answer)?)
}

/// The one of `features` whose run waits for assignment `id`, and its parked assignment.
fn waiting_on(features: &[Project], id: u64) -> Result<(&Project, Parked), ToolError> {
    let mut found = Vec::new();
    for project in features {
        let Some(parked) = project.mailbox().parked(id)? else {
            continue;
        };
        if waiting_for(project, parked.role)?.is_some_and(|p| p.id == id) {
            found.push((project, parked));
        }
    }
    match found.len() {
        0 => Err(MailboxError::NotWaiting { id }.into()),
        1 => Ok(found.remove(0)),
        _ => Err(ToolError::BadArguments {
            tool: "submit".into(),
            detail: format!(
                "assignment {id} waits in features {}: give the feature next_assignment named",
                found
                    .iter()
                    .map(|(p, _)| p.feature_id())
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
        }),
    }
}

/// `submit`: hands over the answer to assignment `req.assignment` (of the one of `features`
/// that waits on it) and waits for the verdict.
pub(super) async fn submit(
    features: &[Project],
    identity: &str,
    req: SubmitArgs,
) -> Result<String, ToolError> {
    let id = req.assignment;
    let (project, parked) = waiting_on(features, id)?;
    let mailbox = project.mailbox();
    check_not_author(project, &parked, identity)?;
    // Some clients send an object argument as JSON text.
    let artifact = match req.artifact {
        Value::String(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        other => other,
    };
    let seq = mailbox.submit(id, identity, artifact)?;
    let limit = Duration::from_secs(req.wait_secs.unwrap_or(120).min(600));
    let verdict = poll(limit, || {
        Ok(mailbox.verdict(id)?.filter(|v: &Verdict| v.seq >= seq))
    })
    .await?;
    let Some(verdict) = verdict else {
        return Ok(format!(
            "submitted as #{seq} for assignment {id}; the run has not judged it yet (is `consort run` going on?): it is kept, and judged when the run takes the step up; `status` and `next` show where it stands"
        ));
    };
    if !verdict.accepted {
        let left = if verdict.closed {
            "no submission is left: the step failed, see `next`".to_string()
        } else {
            format!(
                "{} allowed: fix it and submit again",
                consort_actors::counted(
                    verdict.refusals_left,
                    "more refused submission is",
                    "more refused submissions are"
                )
            )
        };
        return Err(ToolError::Refused {
            reason: verdict
                .reason
                .unwrap_or_else(|| "the run recorded no reason".into()),
            left,
        });
    }
    let outcome = poll(limit, || machine_outcome(project, id)).await?;
    Ok(match outcome {
        Some(text) => format!("accepted: {} answered as #{seq}. {text}", parked.step),
        None => format!(
            "accepted: {} answered as #{seq}; the run is still working on it (see `next`)",
            parked.step
        ),
    })
}

/// What the machine made of assignment `id`'s accepted answer, once it has moved on: refused
/// (with its reason: a new assignment carries it as feedback) or taken, with the runs made.
fn machine_outcome(project: &Project, id: u64) -> Result<Option<String>, ToolError> {
    let state = project.state()?;
    // A run that halted, stopped or ended has settled whatever it waits on.
    let ended = matches!(
        state.status,
        consort_actors::RunStatus::Halted { .. }
            | consort_actors::RunStatus::Stopped
            | consort_actors::RunStatus::Done
    );
    let settled = ended
        || match &state.pending {
            Some(Pending::Agent { id: next, .. }) => next.0 != id,
            Some(Pending::Gate { .. }) | None => true,
            Some(_) => false,
        };
    if !settled {
        return Ok(None);
    }
    let entries = project.entries().map_err(crate::views::ViewError::from)?;
    let Some(at) = entries.iter().position(
        |e| matches!(&e.event, Event::Produced { assignment, .. } if *assignment == AssignmentId(id)),
    ) else {
        return Ok(Some("the machine has not recorded it (see `log`)".into()));
    };
    let mut notes = Vec::new();
    let mut refused = None;
    for e in &entries[at + 1..] {
        match &e.event {
            Event::Refused { violation, .. } => refused = Some(violation.to_string()),
            Event::ApplyDenied { violation, .. } => refused = Some(violation.to_string()),
            Event::VerifyCompleted { receipt } => {
                let passed = receipt
                    .outcomes
                    .iter()
                    .filter(|o| o.status == TestStatus::Passed)
                    .count();
                notes.push(format!(
                    "run {} on {}: {passed} passed, {} not passed",
                    receipt.request_id,
                    receipt.branch_id,
                    receipt.outcomes.len() - passed
                ));
            }
            Event::Produced { .. } | Event::AgentFailed { .. } | Event::Gate { .. } => break,
            _ => {}
        }
    }
    let runs = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    };
    let after = match &state.status {
        consort_actors::RunStatus::Halted { escalation, .. } => Some(format!(
            "The run {}; a person decides: `consort retry --by NAME` or `consort stop --by NAME`.",
            crate::ui::outcome_line(&consort_actors::RunOutcome::Halted {
                escalation: escalation.clone()
            })
        )),
        consort_actors::RunStatus::Stopped => Some("The run was stopped.".into()),
        consort_actors::RunStatus::Done => Some("The run is done.".into()),
        _ => None,
    };
    Ok(Some(match (refused, after) {
        (Some(v), Some(after)) => format!("but the machine refused it{runs}: {v}. {after}"),
        (Some(v), None) => format!(
            "but the machine refused it{runs}: {v}. The next assignment carries this as feedback."
        ),
        (None, Some(after)) => format!("The machine took it{runs}. {after}"),
        (None, None) => format!("The machine took it{runs}; the run goes on."),
    }))
}
