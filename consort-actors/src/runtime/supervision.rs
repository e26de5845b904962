//! Supervision with a restart policy: OTP-style bounded restarts for ractor actors.
//!
//! ractor links actors and tells a supervisor when a child starts, stops or fails, but it has
//! no restart policy (and its default `handle_supervisor_evt` stops the supervisor when any
//! child exits). This module adds one:
//!
//! * [`RestartPolicy`] — at most `max_restarts` restarts within a sliding `window`
//!   (defaults: 3 in 60 s), and [`RestartIntensity`], the pure tracker that applies it
//!   (`record(now) -> Restart | GiveUp`), testable without actors or clocks.
//! * A supervisor actor that owns **one** child at a time, described by a [`ChildSpec`] (a
//!   label, a cloneable spawn function that links the child to the supervisor, and a policy).
//!   When the child *fails* (a panic or a handler error, ractor's `ActorFailed`) it is
//!   restarted while the intensity allows; past the limit the supervisor gives up, records the
//!   last error, and stops itself. A child that *stops normally* (`ActorTerminated`, including
//!   an explicit `kill`) is not restarted ("transient" in OTP terms); the supervisor records
//!   the reason and stops too. A restart whose spawn fails counts as another failure. Children
//!   are spawned without a name by [`ChildSpec::for_actor`], so supervisors in different tests
//!   or runs never collide in ractor's process-wide registry.
//! * [`Supervised`], the cloneable handle callers keep. It publishes the child's
//!   [`ChildStatus`] through a `tokio::sync::watch` channel: the current child, its
//!   incarnation (1 for the first start, +1 per restart), restarts so far, the last error, and
//!   the [`ChildPhase`]. [`Supervised::call`] sends a request to the current child; when the
//!   child dies mid-call it waits for the restarted child and sends **the same message again**
//!   (built again from the same inputs by the caller's closure), once per restart. It ends with
//!   a typed [`SupervisionError`]: [`SupervisionError::GaveUp`] when the supervisor gave up,
//!   [`SupervisionError::Timeout`] when an attempt passed its deadline, and so on.
//!   [`SupervisionError::infra_fault`] maps each to the escalation's infrastructure reason.
//!
//! Guarantees: a failed child is never restarted more than `max_restarts` times within any
//! `window`; a call is never retried more than `max_restarts` times; a call never waits longer
//! than its timeout for one attempt or for one restart; stopping the supervisor stops the child
//! (gracefully, then ractor kills what is left).
//!
//! Not included, deliberately: restart backoff (the conductor's steps are slow compared with a
//! restart), one-for-all groups (each role has its own supervisor), and restarting on a call
//! timeout (a slow child is not a crashed child; the caller decides).

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::rpc::CallResult;
use ractor::{
    Actor, ActorCell, ActorProcessingErr, ActorRef, Message, RpcReplyPort, SpawnErr,
    SupervisionEvent,
};
use tokio::sync::watch;

use crate::core::artifact::InfraFault;

/// How long a stopping supervisor waits for its child to stop gracefully before ractor kills it.
const CHILD_STOP_GRACE: Duration = Duration::from_secs(5);

/// OTP-style restart intensity: at most `max_restarts` restarts within any `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Restarts allowed within one window; the next failure gives up. `0` never restarts.
    pub max_restarts: usize,
    /// The sliding window. A restart older than this (or exactly this old) no longer counts.
    /// A zero window means no limit at all.
    pub window: Duration,
}

impl Default for RestartPolicy {
    /// 3 restarts in 60 seconds.
    fn default() -> Self {
        RestartPolicy {
            max_restarts: 3,
            window: Duration::from_secs(60),
        }
    }
}

/// What the intensity tracker decides about one failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartDecision {
    /// Restart the child; `in_window` restarts (this one included) are now in the window.
    Restart {
        /// Restarts in the window, this one included.
        in_window: usize,
    },
    /// The intensity is exceeded: `in_window` restarts already happened within the window.
    GiveUp {
        /// Restarts in the window.
        in_window: usize,
    },
}

/// The pure sliding-window tracker behind [`RestartPolicy`]: no clock of its own, no I/O.
#[derive(Debug, Clone)]
pub struct RestartIntensity {
    policy: RestartPolicy,
    recent: VecDeque<Instant>,
}

impl RestartIntensity {
    /// A tracker with no restarts recorded.
    pub fn new(policy: RestartPolicy) -> Self {
        RestartIntensity {
            policy,
            recent: VecDeque::new(),
        }
    }

    /// The policy it applies.
    pub fn policy(&self) -> RestartPolicy {
        self.policy
    }

    /// Records a failure at `now` and decides: restart (the restart is counted) or give up.
    pub fn record(&mut self, now: Instant) -> RestartDecision {
        self.expire(now);
        if self.recent.len() >= self.policy.max_restarts {
            return RestartDecision::GiveUp {
                in_window: self.recent.len(),
            };
        }
        self.recent.push_back(now);
        RestartDecision::Restart {
            in_window: self.recent.len(),
        }
    }

    /// Restarts that still count at `now`.
    pub fn in_window(&mut self, now: Instant) -> usize {
        self.expire(now);
        self.recent.len()
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&oldest) = self.recent.front() {
            if now.saturating_duration_since(oldest) >= self.policy.window {
                self.recent.pop_front();
            } else {
                break;
            }
        }
    }
}

/// The future a [`SpawnFn`] returns: the new child, linked to the supervisor.
pub type SpawnFuture<M> = Pin<Box<dyn Future<Output = Result<ActorRef<M>, SpawnErr>> + Send>>;

/// Starts one incarnation of a child. It receives the supervisor's cell and **must** spawn the
/// child linked to it (`Actor::spawn_linked(.., supervisor)`), or the supervisor never hears
/// of the child's failure. Called once per start, with the same captured inputs each time.
pub type SpawnFn<M> = Arc<dyn Fn(ActorCell) -> SpawnFuture<M> + Send + Sync>;

/// Everything a supervisor needs to (re)start its child.
pub struct ChildSpec<M> {
    label: String,
    spawn: SpawnFn<M>,
    policy: RestartPolicy,
}

impl<M> Clone for ChildSpec<M> {
    fn clone(&self) -> Self {
        ChildSpec {
            label: self.label.clone(),
            spawn: Arc::clone(&self.spawn),
            policy: self.policy,
        }
    }
}

impl<M> fmt::Debug for ChildSpec<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildSpec")
            .field("label", &self.label)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<M: Message> ChildSpec<M> {
    /// A spec from a spawn function (see [`SpawnFn`] for its contract), with the default policy.
    /// `label` names the child in logs and errors (for example `driver` or `lakebase`).
    pub fn new<F, Fut>(label: impl Into<String>, spawn: F) -> Self
    where
        F: Fn(ActorCell) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ActorRef<M>, SpawnErr>> + Send + 'static,
    {
        let spawn: SpawnFn<M> = Arc::new(move |supervisor| Box::pin(spawn(supervisor)));
        ChildSpec {
            label: label.into(),
            spawn,
            policy: RestartPolicy::default(),
        }
    }

    /// A spec that spawns clones of `actor` with clones of `args`, unnamed and linked to the
    /// supervisor, with the default policy.
    pub fn for_actor<A>(label: impl Into<String>, actor: A, args: A::Arguments) -> Self
    where
        A: Actor<Msg = M> + Clone,
        A::Arguments: Clone + Sync,
    {
        Self::new(label, move |supervisor: ActorCell| {
            let actor = actor.clone();
            let args = args.clone();
            async move {
                Actor::spawn_linked(None, actor, args, supervisor)
                    .await
                    .map(|(child, _join)| child)
            }
        })
    }

    /// The same spec with another restart policy.
    pub fn with_policy(mut self, policy: RestartPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The child's label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The restart policy.
    pub fn policy(&self) -> RestartPolicy {
        self.policy
    }
}

/// Where the supervised child is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildPhase {
    /// The supervisor is starting the first incarnation.
    Starting,
    /// A child is running ([`ChildStatus::child`] is set).
    Running,
    /// The child failed and a restart is under way.
    Restarting,
    /// The child stopped normally and was not restarted; the supervisor has stopped.
    Stopped {
        /// The child's exit reason, if it gave one.
        reason: Option<String>,
    },
    /// The restart intensity was exceeded; the supervisor has stopped.
    GaveUp,
    /// The supervisor itself was stopped (and with it the child).
    SupervisorStopped,
}

impl ChildPhase {
    /// Whether no child will ever run again under this supervisor.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            ChildPhase::Stopped { .. } | ChildPhase::GaveUp | ChildPhase::SupervisorStopped
        )
    }
}

/// A snapshot of the supervised child, published on every change.
pub struct ChildStatus<M> {
    /// The running child, when there is one.
    pub child: Option<ActorRef<M>>,
    /// 0 before the first start, 1 for the first child, +1 per restart.
    pub incarnation: u64,
    /// Restarts performed (attempts, including ones whose spawn failed).
    pub restarts: usize,
    /// The last failure's text (a panic message or a handler error), if any.
    pub last_error: Option<String>,
    /// The phase.
    pub phase: ChildPhase,
}

impl<M> Clone for ChildStatus<M> {
    fn clone(&self) -> Self {
        ChildStatus {
            child: self.child.clone(),
            incarnation: self.incarnation,
            restarts: self.restarts,
            last_error: self.last_error.clone(),
            phase: self.phase.clone(),
        }
    }
}

impl<M> fmt::Debug for ChildStatus<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildStatus")
            .field("child", &self.child)
            .field("incarnation", &self.incarnation)
            .field("restarts", &self.restarts)
            .field("last_error", &self.last_error)
            .field("phase", &self.phase)
            .finish()
    }
}

impl<M> ChildStatus<M> {
    fn initial() -> Self {
        ChildStatus {
            child: None,
            incarnation: 0,
            restarts: 0,
            last_error: None,
            phase: ChildPhase::Starting,
        }
    }
}

/// Why a supervised child could not serve a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SupervisionError {
    /// The first incarnation could not be started.
    #[error("{label}: the child could not be started: {error}")]
    StartFailed {
        /// The child's label.
        label: String,
        /// The spawn error.
        error: String,
    },
    /// The child kept failing past its restart intensity and the supervisor gave up.
    #[error("{label}: gave up after {restarts} restart(s); last error: {last_error}")]
    GaveUp {
        /// The child's label.
        label: String,
        /// Restarts performed before giving up.
        restarts: usize,
        /// The last failure's text.
        last_error: String,
    },
    /// The same request crashed the child on every attempt, up to the policy's restart count,
    /// although the supervisor itself had not given up (the failures were spread over more
    /// than one window).
    #[error("{label}: the request crashed the child {attempts} time(s); last error: {last_error}")]
    RetriesExhausted {
        /// The child's label.
        label: String,
        /// Attempts made.
        attempts: usize,
        /// The last failure's text.
        last_error: String,
    },
    /// An attempt, or the wait for a restart, passed its deadline.
    #[error("{label}: no answer within {}", crate::core::text::duration_text(*after))]
    Timeout {
        /// The child's label.
        label: String,
        /// The deadline that passed.
        after: Duration,
    },
    /// The child dropped the reply without answering and without failing.
    #[error("{label}: the child dropped the request without answering")]
    NoReply {
        /// The child's label.
        label: String,
    },
    /// The child stopped normally and is not restarted.
    #[error("{label}: the child stopped ({}) and is not restarted", reason.as_deref().unwrap_or("no reason given"))]
    ChildStopped {
        /// The child's label.
        label: String,
        /// The child's exit reason, if any.
        reason: Option<String>,
    },
    /// The supervisor was stopped.
    #[error("{label}: the supervisor was stopped")]
    SupervisorStopped {
        /// The child's label.
        label: String,
    },
}

impl SupervisionError {
    /// The infrastructure fault an escalation should record for this error: a timeout is
    /// [`InfraFault::Timeout`], everything else [`InfraFault::ActorCrashing`].
    pub fn infra_fault(&self) -> InfraFault {
        match self {
            SupervisionError::Timeout { .. } => InfraFault::Timeout,
            _ => InfraFault::ActorCrashing,
        }
    }
}

/// A cloneable handle on a supervised child.
pub struct Supervised<M> {
    label: Arc<str>,
    policy: RestartPolicy,
    supervisor: ActorCell,
    status: watch::Receiver<ChildStatus<M>>,
}

impl<M> Clone for Supervised<M> {
    fn clone(&self) -> Self {
        Supervised {
            label: Arc::clone(&self.label),
            policy: self.policy,
            supervisor: self.supervisor.clone(),
            status: self.status.clone(),
        }
    }
}

impl<M> fmt::Debug for Supervised<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervised")
            .field("label", &self.label)
            .field("policy", &self.policy)
            .field("supervisor", &self.supervisor)
            .field("status", &*self.status.borrow())
            .finish()
    }
}

impl<M: Message> Supervised<M> {
    /// Starts an unlinked supervisor and its first child; returns once the child is running.
    pub async fn start(spec: ChildSpec<M>) -> Result<Self, SupervisionError> {
        Self::start_inner(spec, None).await
    }

    /// Like [`Supervised::start`], with the supervisor linked to `parent`, which then receives
    /// the supervisor's own supervision events (it terminates after giving up, after its child
    /// stopped normally, or when stopped). `parent` must override `handle_supervisor_evt`.
    pub async fn start_linked(
        spec: ChildSpec<M>,
        parent: ActorCell,
    ) -> Result<Self, SupervisionError> {
        Self::start_inner(spec, Some(parent)).await
    }

    async fn start_inner(
        spec: ChildSpec<M>,
        parent: Option<ActorCell>,
    ) -> Result<Self, SupervisionError> {
        let label: Arc<str> = Arc::from(spec.label.as_str());
        let policy = spec.policy;
        let (tx, rx) = watch::channel(ChildStatus::initial());
        let actor = SupervisorActor { spec };
        let spawned = match parent {
            Some(parent) => Actor::spawn_linked(None, actor, tx, parent).await,
            None => Actor::spawn(None, actor, tx).await,
        };
        let (supervisor, _join) = spawned.map_err(|e| SupervisionError::StartFailed {
            label: label.to_string(),
            error: spawn_error_text(&e),
        })?;
        Ok(Supervised {
            label,
            policy,
            supervisor: supervisor.get_cell(),
            status: rx,
        })
    }

    /// The child's label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The restart policy.
    pub fn policy(&self) -> RestartPolicy {
        self.policy
    }

    /// The supervisor actor (to link, monitor or stop it).
    pub fn supervisor(&self) -> &ActorCell {
        &self.supervisor
    }

    /// The running child, if there is one right now.
    pub fn current(&self) -> Option<ActorRef<M>> {
        self.status.borrow().child.clone()
    }

    /// A snapshot of the child's status.
    pub fn status(&self) -> ChildStatus<M> {
        self.status.borrow().clone()
    }

    /// The current incarnation (0 before the first start, 1 for the first child, +1 per
    /// restart), read without copying the status.
    pub fn incarnation(&self) -> u64 {
        self.status.borrow().incarnation
    }

    /// A receiver that sees every status change (for `changed()` / `wait_for`).
    pub fn subscribe(&self) -> watch::Receiver<ChildStatus<M>> {
        self.status.clone()
    }

    /// Waits until a child newer than incarnation `after` is running, and returns it; or until
    /// the supervisor is done (an error saying why), or `timeout` passes.
    pub async fn wait_for_restart(
        &self,
        after: u64,
        timeout: Duration,
    ) -> Result<ActorRef<M>, SupervisionError> {
        let status = self
            .wait_until(timeout, |s| {
                (s.incarnation > after && s.phase == ChildPhase::Running) || s.phase.is_terminal()
            })
            .await;
        match status {
            Some(status) => self.running_or_error(status),
            None => {
                let now = self.status();
                if now.incarnation == after && now.phase == ChildPhase::Running {
                    Err(SupervisionError::NoReply {
                        label: self.label.to_string(),
                    })
                } else {
                    Err(self.timeout(timeout))
                }
            }
        }
    }

    /// Waits until the supervisor is done with its child (gave up, child stopped, supervisor
    /// stopped) and returns the final status, or `None` after `timeout`.
    pub async fn wait_terminal(&self, timeout: Duration) -> Option<ChildStatus<M>> {
        self.wait_until(timeout, |s| s.phase.is_terminal()).await
    }

    /// Sends a request to the current child and waits for the reply, each attempt bounded by
    /// `timeout`. When the child dies mid-call, waits for the restarted child and sends a
    /// message built again by `build` — the same inputs — once per restart, at most
    /// `max_restarts` times.
    pub async fn call<R, F>(&self, build: F, timeout: Duration) -> Result<R, SupervisionError>
    where
        F: Fn(RpcReplyPort<R>) -> M,
        R: Send + 'static,
    {
        let mut retries = 0usize;
        loop {
            let (child, incarnation) = self.running_child(timeout).await?;
            match child.call(&build, Some(timeout)).await {
                Ok(CallResult::Success(reply)) => return Ok(reply),
                Ok(CallResult::Timeout) => return Err(self.timeout(timeout)),
                Ok(CallResult::SenderError) | Err(_) => {
                    tracing::warn!(
                        label = %self.label,
                        incarnation,
                        "child went away during a call; waiting for its restart"
                    );
                    self.wait_for_restart(incarnation, timeout).await?;
                    if retries >= self.policy.max_restarts {
                        return Err(SupervisionError::RetriesExhausted {
                            label: self.label.to_string(),
                            attempts: retries + 1,
                            last_error: self.status().last_error.unwrap_or_default(),
                        });
                    }
                    retries += 1;
                    tracing::info!(label = %self.label, retry = retries, "retrying the same request");
                }
            }
        }
    }

    /// Stops the supervisor and its child, and waits until both are gone.
    pub async fn shutdown(&self) {
        if let Err(e) = self
            .supervisor
            .stop_and_wait(Some("shutdown".into()), None)
            .await
        {
            tracing::debug!(label = %self.label, error = %e, "supervisor was already stopping");
        }
    }

    /// The running child and its incarnation, waiting (up to `timeout`) through a start or a
    /// restart.
    async fn running_child(
        &self,
        timeout: Duration,
    ) -> Result<(ActorRef<M>, u64), SupervisionError> {
        // The common case, a child already running: no waiting, no timer, no status copy.
        {
            let now = self.status.borrow();
            if now.phase == ChildPhase::Running
                && let Some(child) = &now.child
            {
                return Ok((child.clone(), now.incarnation));
            }
        }
        let status = self
            .wait_until(timeout, |s| {
                (s.phase == ChildPhase::Running && s.child.is_some()) || s.phase.is_terminal()
            })
            .await
            .ok_or_else(|| self.timeout(timeout))?;
        let incarnation = status.incarnation;
        self.running_or_error(status)
            .map(|child| (child, incarnation))
    }

    async fn wait_until(
        &self,
        timeout: Duration,
        done: impl FnMut(&ChildStatus<M>) -> bool,
    ) -> Option<ChildStatus<M>> {
        let mut rx = self.status.clone();
        let outcome = match tokio::time::timeout(timeout, rx.wait_for(done)).await {
            Ok(Ok(status)) => Ok(status.clone()),
            Ok(Err(_closed)) => Err(true),
            Err(_elapsed) => Err(false),
        };
        match outcome {
            Ok(status) => Some(status),
            // The sender is gone without a terminal status: report what was last published.
            Err(true) => {
                let mut last = rx.borrow().clone();
                if !last.phase.is_terminal() {
                    last.phase = ChildPhase::SupervisorStopped;
                    last.child = None;
                }
                Some(last)
            }
            Err(false) => None,
        }
    }

    fn running_or_error(&self, status: ChildStatus<M>) -> Result<ActorRef<M>, SupervisionError> {
        let label = || self.label.to_string();
        match (status.phase, status.child) {
            (ChildPhase::Running, Some(child)) => Ok(child),
            (ChildPhase::GaveUp, _) => Err(SupervisionError::GaveUp {
                label: label(),
                restarts: status.restarts,
                last_error: status.last_error.unwrap_or_default(),
            }),
            (ChildPhase::Stopped { reason }, _) => Err(SupervisionError::ChildStopped {
                label: label(),
                reason,
            }),
            _ => Err(SupervisionError::SupervisorStopped { label: label() }),
        }
    }

    fn timeout(&self, after: Duration) -> SupervisionError {
        SupervisionError::Timeout {
            label: self.label.to_string(),
            after,
        }
    }
}

/// The text of a spawn error, unwrapping ractor's `StartupFailed`.
fn spawn_error_text(e: &SpawnErr) -> String {
    match e {
        SpawnErr::StartupFailed(inner) => crate::core::text::error_chain(inner.as_ref()),
        other => other.to_string(),
    }
}

/// The supervisor actor: one child, restarted per the spec's policy.
struct SupervisorActor<M> {
    spec: ChildSpec<M>,
}

/// The supervisor's own messages.
enum SupervisorMsg {
    /// Try to start the child again after a failure.
    Respawn,
}

struct SupervisorState<M> {
    child: Option<ActorRef<M>>,
    intensity: RestartIntensity,
    status: watch::Sender<ChildStatus<M>>,
}

impl<M: Message> SupervisorActor<M> {
    async fn spawn_child(&self, myself: &ActorRef<SupervisorMsg>) -> Result<ActorRef<M>, String> {
        (self.spec.spawn)(myself.get_cell())
            .await
            .map_err(|e| spawn_error_text(&e))
    }

    fn is_child(state: &SupervisorState<M>, who: &ActorCell) -> bool {
        state
            .child
            .as_ref()
            .is_some_and(|c| c.get_id() == who.get_id())
    }

    /// Applies the policy to a failure: schedule a restart, or give up and stop.
    fn on_failure(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState<M>,
        error: String,
    ) {
        state.child = None;
        let now = tokio::time::Instant::now().into_std();
        let decision = state.intensity.record(now);
        let label = &self.spec.label;
        match decision {
            RestartDecision::Restart { in_window } => {
                tracing::warn!(%label, %error, in_window, "child failed; restarting");
                state.status.send_modify(|s| {
                    s.child = None;
                    s.restarts += 1;
                    s.last_error = Some(error);
                    s.phase = ChildPhase::Restarting;
                });
                if myself.cast(SupervisorMsg::Respawn).is_err() {
                    tracing::debug!(%label, "supervisor is stopping; no restart");
                }
            }
            RestartDecision::GiveUp { in_window } => {
                let restarts = state.status.borrow().restarts;
                tracing::error!(
                    %label, %error, in_window, restarts,
                    "child failed past its restart intensity; giving up"
                );
                let reason = format!("{label}: gave up after {restarts} restart(s): {error}");
                state.status.send_modify(|s| {
                    s.child = None;
                    s.last_error = Some(error);
                    s.phase = ChildPhase::GaveUp;
                });
                myself.stop(Some(reason));
            }
        }
    }
}

impl<M: Message> Actor for SupervisorActor<M> {
    type Msg = SupervisorMsg;
    type State = SupervisorState<M>;
    type Arguments = watch::Sender<ChildStatus<M>>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        status: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let child = self.spawn_child(&myself).await?;
        tracing::debug!(label = %self.spec.label, "child started");
        status.send_modify(|s| {
            s.child = Some(child.clone());
            s.incarnation = 1;
            s.phase = ChildPhase::Running;
        });
        Ok(SupervisorState {
            child: Some(child),
            intensity: RestartIntensity::new(self.spec.policy),
            status,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Respawn => {
                if state.child.is_some() || state.status.borrow().phase != ChildPhase::Restarting {
                    return Ok(());
                }
                match self.spawn_child(&myself).await {
                    Ok(child) => {
                        state.child = Some(child.clone());
                        state.status.send_modify(|s| {
                            s.child = Some(child);
                            s.incarnation += 1;
                            s.phase = ChildPhase::Running;
                        });
                        tracing::info!(label = %self.spec.label, "child restarted");
                    }
                    Err(error) => {
                        self.on_failure(&myself, state, format!("restart failed: {error}"));
                    }
                }
            }
        }
        Ok(())
    }

    // The default would stop the supervisor whenever the child exits.
    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(who, error) if Self::is_child(state, &who) => {
                self.on_failure(
                    &myself,
                    state,
                    crate::core::text::error_chain(error.as_ref()),
                );
            }
            SupervisionEvent::ActorTerminated(who, _state, reason)
                if Self::is_child(state, &who) =>
            {
                tracing::info!(label = %self.spec.label, ?reason, "child stopped; not restarting");
                state.child = None;
                state.status.send_modify(|s| {
                    s.child = None;
                    s.phase = ChildPhase::Stopped {
                        reason: reason.clone(),
                    };
                });
                myself.stop(Some(format!(
                    "{}: child stopped ({})",
                    self.spec.label,
                    reason.as_deref().unwrap_or("no reason")
                )));
            }
            // ActorStarted, events of earlier incarnations, process groups.
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(child) = state.child.take() {
            // Stop gracefully; ractor kills whatever is still running after this returns.
            if let Err(e) = child
                .stop_and_wait(Some("supervisor stopping".into()), Some(CHILD_STOP_GRACE))
                .await
            {
                tracing::debug!(label = %self.spec.label, error = %e, "child did not stop in time");
            }
        }
        state.status.send_modify(|s| {
            if !s.phase.is_terminal() {
                s.phase = ChildPhase::SupervisorStopped;
            }
            s.child = None;
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, secs: u64) -> Instant {
        base + Duration::from_secs(secs)
    }

    #[test]
    fn default_policy_is_three_in_sixty_seconds() {
        let p = RestartPolicy::default();
        assert_eq!(p.max_restarts, 3);
        assert_eq!(p.window, Duration::from_secs(60));
    }

    #[test]
    fn allows_max_restarts_then_gives_up() {
        let base = Instant::now();
        let mut t = RestartIntensity::new(RestartPolicy::default());
        for (secs, want) in [
            (0, RestartDecision::Restart { in_window: 1 }),
            (1, RestartDecision::Restart { in_window: 2 }),
            (2, RestartDecision::Restart { in_window: 3 }),
            (3, RestartDecision::GiveUp { in_window: 3 }),
        ] {
            assert_eq!(t.record(at(base, secs)), want, "a failure at {secs} s");
        }
        // Giving up does not record a restart.
        assert_eq!(t.in_window(at(base, 3)), 3);
    }

    #[test]
    fn the_window_slides() {
        let base = Instant::now();
        let policy = RestartPolicy {
            max_restarts: 2,
            window: Duration::from_secs(10),
        };
        let mut t = RestartIntensity::new(policy);
        assert!(matches!(
            t.record(at(base, 0)),
            RestartDecision::Restart { .. }
        ));
        assert!(matches!(
            t.record(at(base, 5)),
            RestartDecision::Restart { .. }
        ));
        assert!(matches!(
            t.record(at(base, 9)),
            RestartDecision::GiveUp { .. }
        ));
        // At 10 s the first restart (exactly one window old) no longer counts.
        assert_eq!(
            t.record(at(base, 10)),
            RestartDecision::Restart { in_window: 2 }
        );
        // At 14 s both the 5 s and the 10 s restarts still count.
        assert!(matches!(
            t.record(at(base, 14)),
            RestartDecision::GiveUp { in_window: 2 }
        ));
        // Long after, everything has expired.
        assert_eq!(t.in_window(at(base, 100)), 0);
        assert_eq!(
            t.record(at(base, 100)),
            RestartDecision::Restart { in_window: 1 }
        );
    }

    #[test]
    fn zero_max_restarts_never_restarts() {
        let mut t = RestartIntensity::new(RestartPolicy {
            max_restarts: 0,
            window: Duration::from_secs(60),
        });
        assert_eq!(
            t.record(Instant::now()),
            RestartDecision::GiveUp { in_window: 0 }
        );
    }

    #[test]
    fn infra_fault_mapping() {
        let timeout = SupervisionError::Timeout {
            label: "driver".into(),
            after: Duration::from_secs(1),
        };
        assert_eq!(timeout.infra_fault(), InfraFault::Timeout);
        let gave_up = SupervisionError::GaveUp {
            label: "driver".into(),
            restarts: 3,
            last_error: "boom".into(),
        };
        assert_eq!(gave_up.infra_fault(), InfraFault::ActorCrashing);
        assert!(gave_up.to_string().contains("boom"));
    }
}
