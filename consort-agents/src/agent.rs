//! The [`Agent`] trait: the one thing a user implements to put their own agent in a role;
//! [`AsyncAgent`], the same written as an `async fn`.

/// A boxed, `Send` future: what [`Agent::act`] returns. Write the body as
/// `Box::pin(async move { … })`. The one alias of the workspace, `consort_actors::BoxFuture`,
/// re-exported here so that an agent needs this crate alone.
pub use consort_actors::BoxFuture;
use consort_actors::{AgentFailure, Artifact, Assignment, TranscriptRef, Usage};

/// What [`Agent::act`] returns: the output or a typed failure, as a [`BoxFuture`].
pub type ActFuture<'a> = BoxFuture<'a, Result<AgentOutput, AgentFailure>>;

/// What an agent produced for one assignment: the artifact and what it cost.
///
/// The role actor stamps the author and measures the wall time; the agent reports tokens and
/// calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentOutput {
    /// The artifact; its kind must be the assignment's expected kind.
    pub artifact: Artifact,
    /// Tokens and calls spent (`wall_ms` is overwritten by the role actor).
    pub usage: Usage,
    /// The step's transcript of tool calls, when the agent kept one (its hash goes into the
    /// ledger with the artifact).
    pub transcript: Option<TranscriptRef>,
}

impl AgentOutput {
    /// An output with zero usage.
    pub fn new(artifact: Artifact) -> Self {
        AgentOutput {
            artifact,
            usage: Usage::default(),
            transcript: None,
        }
    }

    /// The same output with the given usage.
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }
}

/// An agent that can play a role: given an assignment, produce the artifact or a typed failure.
///
/// The trait is dyn-compatible: an ensemble holds one `Arc<dyn Agent>` per role, and the
/// [`RoleActor`](crate::RoleActor) wraps it. The agent sees only the assignment (the step, the
/// role, the input artifacts and files, the feedback); it has no handle on the work tree, the
/// database or the other agents. Whatever it returns is checked by the role actor before the
/// conductor sees it (the kind must match the step; see [`crate::validate`]).
///
/// A panic inside `act` crashes the role actor (see [`RoleActor`](crate::RoleActor)), so
/// supervision can restart it; return an [`AgentFailure`] for everything you can foresee.
///
/// ```
/// use consort_actors::{AgentFailure, Artifact, Assignment, ReviewVerdict};
/// use consort_agents::{Agent, AgentOutput, BoxFuture};
///
/// /// A reviewer that approves everything (do not ship this one).
/// struct Rubberstamp;
///
/// impl Agent for Rubberstamp {
///     fn act<'a>(&'a self, _a: &'a Assignment) -> BoxFuture<'a, Result<AgentOutput, AgentFailure>> {
///         Box::pin(async move {
///             Ok(AgentOutput::new(Artifact::ReviewVerdict(ReviewVerdict::Approve {
///                 notes: vec!["looks fine".into()],
///             })))
///         })
///     }
/// }
/// ```
pub trait Agent: Send + Sync + 'static {
    /// Performs one assignment.
    fn act<'a>(&'a self, assignment: &'a Assignment) -> ActFuture<'a>;

    /// A short description of the backend for logs (never contains a secret).
    fn describe(&self) -> String {
        std::any::type_name::<Self>().to_string()
    }
}

impl std::fmt::Debug for dyn Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Agent({})", self.describe())
    }
}

/// An agent written as an `async fn`: implement this, and the type is an [`Agent`] (the
/// boxed, dyn-compatible form an ensemble holds) with nothing boxed by hand.
///
/// The future must be `Send` (a role actor runs it on the runtime's threads): hold no
/// `Rc` or `std::sync::MutexGuard` across an `.await`.
///
/// ```
/// use consort_actors::{AgentFailure, Artifact, Assignment, ReviewVerdict};
/// use consort_agents::{Agent, AgentOutput, AsyncAgent};
///
/// /// A reviewer that approves everything (do not ship this one).
/// struct Rubberstamp;
///
/// impl AsyncAgent for Rubberstamp {
///     async fn act(&self, _assignment: &Assignment) -> Result<AgentOutput, AgentFailure> {
///         Ok(AgentOutput::new(Artifact::ReviewVerdict(ReviewVerdict::Approve {
///             notes: vec!["looks fine".into()],
///         })))
///     }
/// }
///
/// // What an ensemble holds per role:
/// let agent: std::sync::Arc<dyn Agent> = std::sync::Arc::new(Rubberstamp);
/// assert!(agent.describe().ends_with("Rubberstamp"));
/// ```
pub trait AsyncAgent: Send + Sync + 'static {
    /// Performs one assignment.
    fn act(
        &self,
        assignment: &Assignment,
    ) -> impl Future<Output = Result<AgentOutput, AgentFailure>> + Send;

    /// A short description of the backend for logs (never contains a secret).
    fn describe(&self) -> String {
        std::any::type_name::<Self>().to_string()
    }
}

impl<T: AsyncAgent> Agent for T {
    fn act<'a>(&'a self, assignment: &'a Assignment) -> ActFuture<'a> {
        Box::pin(AsyncAgent::act(self, assignment))
    }

    fn describe(&self) -> String {
        AsyncAgent::describe(self)
    }
}
