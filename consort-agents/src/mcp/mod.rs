//! The `mcp` backend: a role played by a coding client through `consort mcp`.
//!
//! [`McpAgent::act`] parks the assignment in the feature's mailbox ([`Mailbox`]) and waits,
//! polling with backoff, for a submission; the role actor's step time limit bounds the wait.
//! Each submission is judged by the same functions every backend's answer goes through
//! ([`crate::validate::parse_artifact`], then [`crate::validate::check_artifact`], which calls
//! the machine's own rules); a refusal is written back as a [`Verdict`] with the reason word
//! for word, and the client may submit again, at most `max_agent_retries` more times (then the
//! step fails as [`AgentFailure::InvalidOutput`], like any backend's). The accepted answer's
//! record — who took and who submitted it — is kept as the step's transcript, whose hash the
//! ledger records with the artifact.

pub mod mailbox;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::time::Duration;

use consort_actors::{AgentFailure, Artifact, Assignment, ContentHash, TranscriptRef, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agent::{ActFuture, Agent, AgentOutput};
use crate::prompts::system_prompt;
use crate::validate::{check_artifact, parse_artifact};
pub use mailbox::{Mailbox, MailboxError, Parked, Submission, Taken, Verdict, check_identity};

/// `backend = "mcp"`: the role waits for an MCP client. Nothing is configured per role; the
/// project sets the mailbox, transcript directory and retry bound.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// The feature's mailbox directory (set by the project: `<record dir>/mcp`).
    #[serde(skip)]
    pub mailbox: Option<PathBuf>,
    /// Where the step records go (the project's `.consort/transcripts/`).
    #[serde(skip)]
    pub transcript_dir: Option<PathBuf>,
    /// Refused submissions allowed per assignment (the project's `max_agent_retries`).
    #[serde(skip)]
    pub max_refusals: u32,
}

/// The agent behind `backend = "mcp"`.
#[derive(Debug, Clone)]
pub struct McpAgent {
    mailbox: Mailbox,
    transcript_dir: Option<PathBuf>,
    max_refusals: u32,
}

/// What a failure says when the refusal it ends on recorded no reason.
const NO_REASON: &str = "the last submission was refused without a recorded reason";

/// The first and the longest pause between two looks at the mailbox.
const POLL: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(500));

impl McpAgent {
    /// An agent waiting in `mailbox`.
    pub fn new(mailbox: Mailbox, transcript_dir: Option<PathBuf>, max_refusals: u32) -> Self {
        McpAgent {
            mailbox,
            transcript_dir,
            max_refusals,
        }
    }

    async fn wait_for_answer(&self, assignment: &Assignment) -> Result<AgentOutput, AgentFailure> {
        let id = assignment.id.0;
        let io = |e: MailboxError| AgentFailure::Crashed {
            detail: consort_actors::error_chain(&e),
        };
        let parked = self
            .mailbox
            .park(assignment, self.max_refusals)
            .map_err(io)?;
        tracing::info!(id, step = %parked.step, "assignment parked for an MCP client");
        // On resume, the verdicts already written count: a refusal is not forgotten, and an
        // accepted submission is handed over again.
        let mut judged = self.mailbox.verdict(id).map_err(io)?;
        if let Some(v) = judged.as_ref().filter(|v| v.closed && !v.accepted) {
            // The run was killed after the last refusal was written: the step has failed.
            return Err(AgentFailure::InvalidOutput {
                attempts: v.seq,
                detail: v.reason.clone().unwrap_or_else(|| NO_REASON.into()),
                usage: Usage::default(),
            });
        }
        let mut pause = POLL.0;
        loop {
            let sub = match self.mailbox.submission(id) {
                Ok(s) => s,
                // A torn or foreign submission file is no answer: keep waiting (the server
                // replaces it with the client's next submission).
                Err(e @ MailboxError::Malformed { .. }) => {
                    tracing::warn!(error = %e, "malformed submission");
                    None
                }
                Err(e) => return Err(io(e)),
            };
            let fresh = sub.filter(|s| {
                judged
                    .as_ref()
                    .is_none_or(|v| s.seq > v.seq || (s.seq == v.seq && v.accepted))
            });
            if let Some(sub) = fresh {
                let refusals = judged.as_ref().map_or(0, |v| {
                    self.max_refusals - v.refusals_left.min(self.max_refusals)
                });
                match self.judge(assignment, &sub, refusals).map_err(io)? {
                    Judged::Accepted(artifact) => {
                        let transcript = self.record(assignment, &sub).map_err(io)?;
                        return Ok(AgentOutput {
                            artifact: *artifact,
                            usage: Usage {
                                calls: sub.seq,
                                model: Some(format!("mcp:{}", sub.identity).into()),
                                ..Usage::default()
                            },
                            transcript,
                        });
                    }
                    Judged::Refused(v) if v.closed => {
                        return Err(AgentFailure::InvalidOutput {
                            attempts: sub.seq,
                            detail: v.reason.unwrap_or_else(|| NO_REASON.into()),
                            usage: Usage::default(),
                        });
                    }
                    Judged::Refused(v) => {
                        judged = Some(v);
                        pause = POLL.0;
                        continue;
                    }
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(POLL.1);
        }
    }

    /// Judges `sub`, writes the verdict, and says what it was.
    fn judge(
        &self,
        assignment: &Assignment,
        sub: &Submission,
        refusals_before: u32,
    ) -> Result<Judged, MailboxError> {
        let checked =
            parse_artifact(assignment.expected_kind(), sub.artifact.clone()).and_then(|artifact| {
                check_artifact(assignment, &artifact)
                    .map(|()| artifact)
                    .map_err(|v| v.to_string())
            });
        let (accepted, reason, artifact) = match checked {
            Ok(a) => (true, None, Some(a)),
            Err(reason) => (false, Some(reason), None),
        };
        let refusals = refusals_before + u32::from(!accepted);
        let verdict = Verdict {
            assignment: assignment.id.0,
            seq: sub.seq,
            identity: sub.identity.clone(),
            accepted,
            reason,
            refusals_left: self.max_refusals.saturating_sub(refusals),
            closed: accepted || refusals > self.max_refusals,
        };
        self.mailbox.record_verdict(&verdict)?;
        tracing::info!(
            id = verdict.assignment,
            seq = verdict.seq,
            accepted,
            "submission judged"
        );
        Ok(match artifact {
            Some(a) => Judged::Accepted(Box::new(a)),
            None => Judged::Refused(verdict),
        })
    }

    /// Writes the step's record (who took it, who submitted what) as its transcript.
    fn record(
        &self,
        assignment: &Assignment,
        sub: &Submission,
    ) -> Result<Option<TranscriptRef>, MailboxError> {
        let Some(dir) = &self.transcript_dir else {
            return Ok(None);
        };
        let name = format!(
            "{}.mcp.json",
            crate::command::transcript_stem(&assignment.step.to_string(), assignment.attempt)
        );
        let record = serde_json::json!({
            "step": assignment.step.to_string(),
            "attempt": assignment.attempt,
            "role": assignment.role,
            "taken_by": self.mailbox.taken(assignment.id.0)?.map(|t| t.identity),
            "submitted_by": sub.identity,
            "submission": sub.seq,
            "submitted_at": sub.at,
        });
        let path = dir.join(&name);
        let bytes = serde_json::to_vec_pretty(&record).map_err(|e| MailboxError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&path, &bytes))
            .map_err(|source| MailboxError::Io { path, source })?;
        Ok(Some(TranscriptRef {
            path: name,
            hash: ContentHash::of_bytes(&bytes),
        }))
    }
}

/// A submission, judged.
enum Judged {
    Accepted(Box<Artifact>),
    Refused(Verdict),
}

impl Agent for McpAgent {
    fn act<'a>(&'a self, assignment: &'a Assignment) -> ActFuture<'a> {
        Box::pin(self.wait_for_answer(assignment))
    }

    fn describe(&self) -> String {
        format!("mcp (mailbox {})", self.mailbox.dir().display())
    }
}

/// The assignment as an MCP client gets it: the assignment's fields (role, step, attempt,
/// inputs, feedback, runner facts, write rules), plus `role_prompt` (the role's system prompt),
/// `step_key`, `answer_with` (the artifact kind) and `answer_schema` (the JSON schema of the
/// answer `{kind, body}`).
pub fn assignment_json(assignment: &Assignment) -> Value {
    let mut v = serde_json::to_value(assignment).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        let kind = assignment.expected_kind();
        o.insert("role_prompt".into(), system_prompt(assignment.role).into());
        o.insert("step_key".into(), assignment.step.to_string().into());
        o.insert("answer_with".into(), kind.to_string().into());
        o.insert(
            "answer_schema".into(),
            crate::openai::response_schema(kind, false),
        );
    }
    v
}
