//! The agent's side of the budgets: every call checked against what the assignment says is
//! left ([`Assignment::budget`]) before it is made, and the step bounded by the wall time left.
//!
//! The call's prompt tokens are estimated as its characters divided by four (rounded up: the
//! system prompt, every message as sent and the tool definitions), plus
//! its completion token limit ([`OpenAiConfig::max_tokens`](super::OpenAiConfig::max_tokens),
//! raised once after a cut-off answer; without one only the prompt counts). A call whose estimate does not fit is not made: the step ends with
//! [`AgentFailure::BudgetSpent`], carrying what the step spent before.

use std::time::{Duration, Instant};

use consort_actors::{AgentFailure, Assignment, CallEstimate, Usage};

use super::{Completion, OpenAiAgent};
use crate::agent::AgentOutput;

impl OpenAiAgent {
    /// Refuses the next call when the assignment's budget cannot pay for it.
    pub(super) fn check_call(
        &self,
        assignment: &Assignment,
        so_far: &Usage,
        limit: Option<u32>,
        prompt_chars: usize,
    ) -> Result<(), AgentFailure> {
        let Some(remaining) = &assignment.budget else {
            return Ok(());
        };
        let estimate = CallEstimate {
            prompt_tokens: CallEstimate::prompt_tokens_of_chars(prompt_chars),
            max_completion_tokens: limit.map_or(0, u64::from),
        };
        remaining
            .check_call(so_far, Some(&self.config.model), estimate)
            .map_err(|budget| {
                tracing::warn!(role = %self.role, %budget, "the next model call would go over a budget; not made");
                AgentFailure::BudgetSpent {
                    budget,
                    usage: self.stamped(so_far.clone()),
                }
            })
    }

    /// The usage of one completion, with this agent's model.
    pub(super) fn call_usage(&self, c: &Completion) -> Usage {
        self.stamped(Usage {
            prompt_tokens: c.prompt_tokens.unwrap_or(0),
            completion_tokens: c.completion_tokens.unwrap_or(0),
            cached_tokens: c.cached_tokens.unwrap_or(0),
            calls: 1,
            ..Usage::default()
        })
    }

    /// Adds one call's usage to the running count.
    pub(super) fn count(&self, call: &Usage) {
        self.counted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(call);
    }

    fn counted(&self) -> Usage {
        self.counted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn stamped(&self, mut usage: Usage) -> Usage {
        usage.model = Some(self.config.model.as_str().into());
        usage
    }

    /// Runs the conversation within the wall time the assignment's budget leaves; past it the
    /// step ends with [`AgentFailure::BudgetSpent`] and the usage counted until then.
    pub(super) async fn within_wall_budget(
        &self,
        assignment: &Assignment,
    ) -> Result<AgentOutput, AgentFailure> {
        let Some(remaining) = &assignment.budget else {
            return self.converse(assignment).await;
        };
        let Some(left) = remaining.wall_left_ms(&Usage::default()) else {
            return self.converse(assignment).await;
        };
        let before = self.counted();
        let started = Instant::now();
        match tokio::time::timeout(Duration::from_millis(left), self.converse(assignment)).await {
            Ok(result) => result,
            Err(_) => {
                let mut usage = since(&self.counted(), &before);
                usage.wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                let usage = self.stamped(usage);
                match remaining.wall_spent(&usage) {
                    Some(budget) => Err(AgentFailure::BudgetSpent { budget, usage }),
                    None => Err(AgentFailure::Timeout {
                        secs: left.div_ceil(1000),
                    }),
                }
            }
        }
    }
}

/// What was counted between two snapshots of the running count.
fn since(now: &Usage, before: &Usage) -> Usage {
    Usage {
        prompt_tokens: now.prompt_tokens.saturating_sub(before.prompt_tokens),
        completion_tokens: now
            .completion_tokens
            .saturating_sub(before.completion_tokens),
        cached_tokens: now.cached_tokens.saturating_sub(before.cached_tokens),
        calls: now.calls.saturating_sub(before.calls),
        tool_calls: now.tool_calls.saturating_sub(before.tool_calls),
        repeated_tool_calls: now
            .repeated_tool_calls
            .saturating_sub(before.repeated_tool_calls),
        finish_reasons: Box::new(
            now.finish_reasons
                .iter()
                .map(|(r, n)| {
                    let was = before.finish_reasons.get(r).copied().unwrap_or(0);
                    (r.clone(), n.saturating_sub(was))
                })
                .filter(|(_, n)| *n > 0)
                .collect(),
        ),
        wall_ms: 0,
        model: None,
    }
}
