//! The role actor: wraps any [`Agent`] and answers the conductor's assignments.
//!
//! **Architecture invariant:** a role actor has no handle on the work tree, the database or the
//! other actors. It receives an [`Assignment`] and replies with an artifact or a typed
//! [`AgentFailure`], nothing else.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use consort_actors::{ActorId, AgentFailure, Assignment, Produced, RoleMsg, RoleReply, Usage};
use ractor::concurrency::JoinHandle;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr};
use tracing::Instrument;

use crate::agent::{Agent, AgentOutput};
use crate::validate::check_artifact;

/// The default per-assignment time limit: ten minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// What a role actor is started with. Cheap to clone, so a supervisor can respawn the actor
/// with the same arguments (the agent is shared, so its budgets survive a restart).
#[derive(Clone)]
pub struct RoleArgs {
    /// The identity stamped as author on everything this actor produces.
    pub id: ActorId,
    /// The agent that does the work.
    pub agent: Arc<dyn Agent>,
    /// The time limit for one assignment; past it the reply is [`AgentFailure::Timeout`].
    pub timeout: Duration,
    /// Whether to apply [`check_artifact`]'s role rules (non-empty lists, plain relative
    /// paths, references that resolve) on top of the kind check. The kind check always
    /// applies. Default: `true`.
    pub check_rules: bool,
}

impl RoleArgs {
    /// Arguments for an actor with identity `id` playing `agent`, with the default time limit
    /// and rule checks on.
    pub fn new(id: ActorId, agent: Arc<dyn Agent>) -> Self {
        RoleArgs {
            id,
            agent,
            timeout: DEFAULT_TIMEOUT,
            check_rules: true,
        }
    }

    /// The same arguments with another per-assignment time limit.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same arguments with the role-rule check switched on or off.
    pub fn with_rule_check(mut self, on: bool) -> Self {
        self.check_rules = on;
        self
    }
}

impl fmt::Debug for RoleArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoleArgs")
            .field("id", &self.id)
            .field("agent", &self.agent.describe())
            .field("timeout", &self.timeout)
            .field("check_rules", &self.check_rules)
            .finish()
    }
}

/// The ractor actor that plays one role.
///
/// Behaviour, per [`RoleMsg`]:
/// - `Identify` answers the actor's [`ActorId`] (between assignments: the mailbox is served in
///   order, so an `Identify` sent during a long assignment waits for it, at most the time
///   limit).
/// - `Assign` is refused with [`AgentFailure::WrongRole`] when the step (or the assignment's
///   role) is not this actor's role. Otherwise the agent runs on its own task, one assignment at
///   a time (further assignments wait in the mailbox), under the time limit
///   ([`AgentFailure::Timeout`]; the agent's task is aborted, which kills an external command's
///   process group). The artifact must be of the step's kind
///   ([`AgentFailure::KindNotAllowed`]: a Driver cannot produce a test list, nobody can produce
///   a test-run receipt) and, when [`RoleArgs::check_rules`] is on, obey the role rules
///   ([`AgentFailure::InvalidOutput`]). The reply is a [`Produced`] stamped with this actor's id
///   as author and the measured wall time.
///
/// **Panics crash the actor.** A panic inside the agent is not swallowed: the actor first
/// replies [`AgentFailure::Crashed`] (so the conductor is not left waiting), then its handler
/// returns an error, so the actor stops and its supervisor receives
/// `SupervisionEvent::ActorFailed` and can restart it with the same [`RoleArgs`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RoleActor;

/// The role actor's state.
#[derive(Debug)]
pub struct RoleState {
    args: RoleArgs,
}

impl Actor for RoleActor {
    type Msg = RoleMsg;
    type State = RoleState;
    type Arguments = RoleArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        tracing::debug!(actor = %args.id, agent = %args.agent.describe(), "role actor started");
        Ok(RoleState { args })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RoleMsg::Identify(reply) => {
                let _ = reply.send(state.args.id.clone());
                Ok(())
            }
            RoleMsg::Assign(assignment, reply) => {
                handle_assignment(&state.args, assignment, reply).await
            }
        }
    }
}

/// Aborts the agent's task when dropped (on timeout, or when the actor is killed mid-step).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn handle_assignment(
    args: &RoleArgs,
    assignment: Assignment,
    reply: RpcReplyPort<RoleReply>,
) -> Result<(), ActorProcessingErr> {
    let role = args.id.role;
    let span = tracing::info_span!(
        "assignment",
        actor = %args.id,
        id = %assignment.id,
        step = %assignment.step,
        attempt = assignment.attempt
    );
    if assignment.step.role() != role || assignment.role != role {
        let failure = AgentFailure::WrongRole {
            role,
            step: assignment.step.to_string(),
        };
        span.in_scope(|| tracing::warn!(%failure, "assignment refused"));
        let _ = reply.send(Err(failure));
        return Ok(());
    }

    let started = Instant::now();
    let agent = Arc::clone(&args.agent);
    let task_assignment = assignment.clone();
    let task = AbortOnDrop(tokio::spawn(
        async move { agent.act(&task_assignment).await }.instrument(span.clone()),
    ));
    let outcome = tokio::time::timeout(args.timeout, async {
        // Poll through a reference so the guard stays alive until we are done with it.
        let mut guard = task;
        (&mut guard.0).await
    })
    .await;
    let wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);

    let result = match outcome {
        Err(_elapsed) => Err(AgentFailure::Timeout {
            secs: args.timeout.as_millis().div_ceil(1000) as u64,
        }),
        Ok(Err(join_error)) if join_error.is_panic() => {
            let detail = panic_text(join_error.into_panic());
            let failure = AgentFailure::Crashed {
                detail: detail.clone(),
            };
            span.in_scope(|| tracing::error!(%detail, "agent panicked; crashing the role actor"));
            let _ = reply.send(Err(failure));
            return Err(format!("agent panicked: {detail}").into());
        }
        Ok(Err(join_error)) => Err(AgentFailure::Crashed {
            detail: join_error.to_string(),
        }),
        Ok(Ok(Err(failure))) => Err(failure),
        Ok(Ok(Ok(output))) => accept(args, &assignment, output, wall_ms),
    };
    span.in_scope(|| match &result {
        Ok(p) => tracing::info!(kind = %p.artifact.kind(), wall_ms, "artifact produced"),
        Err(failure) => tracing::warn!(%failure, wall_ms, "assignment failed"),
    });
    let _ = reply.send(result);
    Ok(())
}

fn accept(
    args: &RoleArgs,
    assignment: &Assignment,
    output: AgentOutput,
    wall_ms: u64,
) -> Result<Produced, AgentFailure> {
    let kind = output.artifact.kind();
    if kind != assignment.expected_kind() {
        return Err(AgentFailure::KindNotAllowed {
            role: args.id.role,
            kind,
        });
    }
    if args.check_rules
        && let Err(v) = check_artifact(assignment, &output.artifact)
    {
        return Err(AgentFailure::InvalidOutput {
            attempts: 1,
            detail: v.to_string(),
            usage: Usage {
                wall_ms,
                ..output.usage
            },
        });
    }
    Ok(Produced {
        assignment: assignment.id,
        author: args.id.clone(),
        artifact: output.artifact,
        usage: Usage {
            wall_ms,
            ..output.usage
        },
        transcript: output.transcript,
    })
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-text panic payload".to_string()
    }
}

/// Spawns an unnamed role actor.
///
/// Returns the actor's reference and the handle that completes when it stops.
pub async fn spawn_role(args: RoleArgs) -> Result<(ActorRef<RoleMsg>, JoinHandle<()>), SpawnErr> {
    Actor::spawn(None, RoleActor, args).await
}

/// Spawns an unnamed role actor linked to `supervisor`, which receives its supervision events
/// (a panic in the agent arrives as `ActorFailed`).
pub async fn spawn_role_linked(
    args: RoleArgs,
    supervisor: ActorCell,
) -> Result<(ActorRef<RoleMsg>, JoinHandle<()>), SpawnErr> {
    Actor::spawn_linked(None, RoleActor, args, supervisor).await
}

/// The role an actor plays, asked by message (a convenience for callers that hold only the
/// reference).
pub async fn identify(actor: &ActorRef<RoleMsg>) -> Result<ActorId, ractor::RactorErr<RoleMsg>> {
    ractor::call!(actor, RoleMsg::Identify)
}

/// Sends one assignment and waits for the reply.
///
/// `limit` bounds the wait on the caller's side (use a little more than the actor's own
/// time limit); `None` waits until the actor replies or stops.
pub async fn assign(
    actor: &ActorRef<RoleMsg>,
    assignment: Assignment,
    limit: Option<Duration>,
) -> Result<RoleReply, ractor::RactorErr<RoleMsg>> {
    match actor
        .call(|port| RoleMsg::Assign(assignment, port), limit)
        .await
        .map_err(ractor::RactorErr::from)?
    {
        ractor::rpc::CallResult::Success(r) => Ok(r),
        other => Err(ractor::RactorErr::from(other)),
    }
}
