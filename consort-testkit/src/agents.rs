//! Agents for tests: an agent made from a closure, and one that always gives the same answer.

use std::future::Future;

use consort_actors::{AgentFailure, Artifact, Assignment, Usage};
use consort_agents::{Agent, AgentOutput, BoxFuture};

/// An agent that answers each assignment with `f(assignment)`.
pub struct FnAgent<F>(F);

impl<F> std::fmt::Debug for FnAgent<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnAgent")
    }
}

/// An agent from a closure over an (owned) assignment.
pub fn agent_fn<F, Fut>(f: F) -> FnAgent<F>
where
    F: Fn(Assignment) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<AgentOutput, AgentFailure>> + Send + 'static,
{
    FnAgent(f)
}

impl<F, Fut> Agent for FnAgent<F>
where
    F: Fn(Assignment) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<AgentOutput, AgentFailure>> + Send + 'static,
{
    fn act<'a>(&'a self, a: &'a Assignment) -> BoxFuture<'a, Result<AgentOutput, AgentFailure>> {
        Box::pin((self.0)(a.clone()))
    }
}

/// An agent that answers every assignment with `artifact`.
pub fn fixed(artifact: Artifact) -> impl Agent {
    agent_fn(move |_| {
        let artifact = artifact.clone();
        async move { Ok(AgentOutput::new(artifact)) }
    })
}

/// Sends `assignment` to a role actor (no time limit) and returns its reply; panics when the
/// actor does not answer.
pub async fn ask(
    actor: &ractor::ActorRef<consort_actors::RoleMsg>,
    assignment: Assignment,
) -> consort_actors::RoleReply {
    consort_agents::assign(actor, assignment, None)
        .await
        .expect("reply")
}

/// The attempts, detail and usage of `reply`'s [`AgentFailure::InvalidOutput`]; panics, quoting
/// `reply`, when it is anything else.
pub fn invalid_output<T: std::fmt::Debug>(reply: Result<T, AgentFailure>) -> (u32, String, Usage) {
    let failure = reply.expect_err("an InvalidOutput");
    let AgentFailure::InvalidOutput {
        attempts,
        detail,
        usage,
    } = failure
    else {
        panic!("expected InvalidOutput, got {failure:?}");
    };
    (attempts, detail, usage)
}
