//! Supervision tests with real ractor actors.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use consort_actors::InfraFault;
use consort_actors::{
    ChildPhase, ChildSpec, ChildStatus, RestartPolicy, Supervised, SupervisionError,
};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

const T: Duration = Duration::from_secs(10);

/// How a test worker misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Panic on the first `Work` message of the whole test (shared counter), then behave.
    PanicOnce,
    /// Return an error from the handler on the first `Work`, then behave.
    ErrOnce,
    /// Panic on every `Work`.
    AlwaysPanic,
    /// Sleep 11 s, then panic, on every `Work`.
    SlowPanic,
    /// Never fail.
    None,
}

#[derive(Clone)]
struct Worker {
    fault: Fault,
    /// `Work` messages received, over all incarnations.
    received: Arc<AtomicUsize>,
    /// Incarnations started.
    started: Arc<AtomicUsize>,
    /// Inputs seen, over all incarnations.
    inputs: Arc<Mutex<Vec<String>>>,
}

impl Worker {
    fn new(fault: Fault) -> Self {
        Worker {
            fault,
            received: Arc::new(AtomicUsize::new(0)),
            started: Arc::new(AtomicUsize::new(0)),
            inputs: Arc::new(Mutex::new(Vec::new())),
        }
    }
}

enum WorkMsg {
    /// Answer with the input upper-cased.
    Work(String, RpcReplyPort<String>),
    /// Stop normally.
    Quit,
    /// Panic now.
    Crash,
    /// Drop the reply port without answering.
    Ignore(RpcReplyPort<String>),
    /// Sleep for a long time before answering.
    Slow(RpcReplyPort<String>),
}

impl Actor for Worker {
    type Msg = WorkMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<WorkMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        self.started.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<WorkMsg>,
        msg: WorkMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WorkMsg::Work(input, reply) => {
                let n = self.received.fetch_add(1, Ordering::SeqCst);
                self.inputs.lock().expect("lock").push(input.clone());
                match self.fault {
                    Fault::PanicOnce if n == 0 => panic!("boom on {input}"),
                    Fault::ErrOnce if n == 0 => return Err(format!("bad day on {input}").into()),
                    Fault::AlwaysPanic => panic!("boom every time"),
                    Fault::SlowPanic => {
                        tokio::time::sleep(Duration::from_secs(11)).await;
                        panic!("slow boom");
                    }
                    _ => {}
                }
                let _ = reply.send(input.to_uppercase());
            }
            WorkMsg::Quit => myself.stop(Some("done".into())),
            WorkMsg::Crash => panic!("crash requested"),
            WorkMsg::Ignore(reply) => drop(reply),
            WorkMsg::Slow(reply) => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                let _ = reply.send("late".into());
            }
        }
        Ok(())
    }
}

async fn supervise(worker: &Worker, policy: RestartPolicy) -> Supervised<WorkMsg> {
    let spec = ChildSpec::for_actor("worker", worker.clone(), ()).with_policy(policy);
    Supervised::start(spec).await.expect("start")
}

/// At most `max_restarts` restarts in a window of `window_secs` seconds.
fn at_most(max_restarts: usize, window_secs: u64) -> RestartPolicy {
    RestartPolicy {
        max_restarts,
        window: Duration::from_secs(window_secs),
    }
}

/// Whether the child's last failure is recorded and says `text`.
fn last_error_has<M>(status: &ChildStatus<M>, text: &str) -> bool {
    status
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains(text))
}

/// A worker with this fault, supervised under the default policy.
async fn supervised(fault: Fault) -> (Worker, Supervised<WorkMsg>) {
    let worker = Worker::new(fault);
    let sup = supervise(&worker, RestartPolicy::default()).await;
    (worker, sup)
}

/// Calls `sup` with the work `input`, which fails (`what` says why) as given up after
/// `restarts` restarts.
async fn assert_gave_up(sup: &Supervised<WorkMsg>, input: &str, what: &str, restarts: usize) {
    let err = sup.call(work(input), T).await.expect_err(what);
    assert!(
        matches!(err, SupervisionError::GaveUp { restarts: r, .. } if r == restarts),
        "{err:?}"
    );
}

fn work(input: &str) -> impl Fn(RpcReplyPort<String>) -> WorkMsg + '_ {
    move |port| WorkMsg::Work(input.to_string(), port)
}

#[tokio::test]
async fn a_child_that_panics_is_restarted_and_the_call_retried() {
    let (worker, sup) = supervised(Fault::PanicOnce).await;
    let first = sup.current().expect("running");
    assert_eq!(sup.status().incarnation, 1);

    let reply = sup
        .call(work("step-1"), T)
        .await
        .expect("retried call succeeds");
    assert_eq!(reply, "STEP-1");

    let status = sup.status();
    assert_eq!(status.phase, ChildPhase::Running);
    assert_eq!(status.incarnation, 2);
    assert_eq!(status.restarts, 1);
    assert!(last_error_has(&status, "boom on step-1"));
    assert_ne!(sup.current().expect("running").get_id(), first.get_id());
    assert_eq!(worker.started.load(Ordering::SeqCst), 2);
    // The retried step got the same inputs.
    assert_eq!(*worker.inputs.lock().expect("lock"), ["step-1", "step-1"]);
    sup.shutdown().await;
}

#[tokio::test]
async fn a_handler_error_counts_as_a_failure_too() {
    let (_worker, sup) = supervised(Fault::ErrOnce).await;
    assert_eq!(sup.call(work("x"), T).await.expect("retried"), "X");
    let status = sup.status();
    assert_eq!(status.restarts, 1);
    assert!(last_error_has(&status, "bad day on x"));
    sup.shutdown().await;
}

#[tokio::test]
async fn a_child_that_always_panics_leads_to_gave_up_after_max_restarts() {
    let (worker, sup) = supervised(Fault::AlwaysPanic).await;
    let err = sup.call(work("x"), T).await.expect_err("must give up");
    match &err {
        SupervisionError::GaveUp {
            label,
            restarts,
            last_error,
        } => {
            assert_eq!(label, "worker");
            assert_eq!(*restarts, 3);
            assert!(last_error.contains("boom every time"), "{last_error}");
        }
        other => panic!("expected GaveUp, got {other:?}"),
    }
    assert_eq!(err.infra_fault(), InfraFault::ActorCrashing);
    // One first start plus exactly three restarts; four attempts of the same message.
    assert_eq!(worker.started.load(Ordering::SeqCst), 4);
    assert_eq!(worker.received.load(Ordering::SeqCst), 4);
    let status = sup.wait_terminal(T).await.expect("terminal");
    assert_eq!(status.phase, ChildPhase::GaveUp);
    assert!(status.child.is_none());
    // The supervisor stopped itself.
    sup.supervisor()
        .wait(Some(T))
        .await
        .expect("supervisor stopped");
    // Later calls fail fast with the same reason.
    assert_gave_up(&sup, "y", "still gave up", 3).await;
}

#[tokio::test]
async fn zero_max_restarts_gives_up_at_the_first_failure() {
    let worker = Worker::new(Fault::PanicOnce);
    let policy = at_most(0, 60);
    let sup = supervise(&worker, policy).await;
    assert_gave_up(&sup, "x", "no restarts allowed", 0).await;
    assert_eq!(worker.started.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_normal_stop_is_not_restarted() {
    let (worker, sup) = supervised(Fault::None).await;
    let child = sup.current().expect("running");
    child.cast(WorkMsg::Quit).expect("cast");
    let status = sup.wait_terminal(T).await.expect("terminal");
    assert_eq!(
        status.phase,
        ChildPhase::Stopped {
            reason: Some("done".into())
        }
    );
    assert_eq!(status.restarts, 0);
    assert_eq!(worker.started.load(Ordering::SeqCst), 1);
    let err = sup.call(work("x"), T).await.expect_err("stopped");
    assert!(
        matches!(err, SupervisionError::ChildStopped { .. }),
        "{err:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_intensity_window_slides_with_time() {
    let worker = Worker::new(Fault::None);
    let policy = at_most(1, 10);
    let sup = supervise(&worker, policy).await;

    // Crash 1: restarted.
    sup.current()
        .expect("running")
        .cast(WorkMsg::Crash)
        .expect("cast");
    let second = sup.wait_for_restart(1, T).await.expect("restart 1");
    // Eleven seconds later the first restart has left the window: crash 2 is restarted too.
    tokio::time::advance(Duration::from_secs(11)).await;
    second.cast(WorkMsg::Crash).expect("cast");
    let third = sup.wait_for_restart(2, T).await.expect("restart 2");
    assert_eq!(sup.status().restarts, 2);
    // Crash 3 right away: one restart is still in the window, so the supervisor gives up.
    third.cast(WorkMsg::Crash).expect("cast");
    let status = sup.wait_terminal(T).await.expect("terminal");
    assert_eq!(status.phase, ChildPhase::GaveUp);
    assert_eq!(status.restarts, 2);
    assert_eq!(worker.started.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_keeps_crashing_the_child_is_retried_at_most_max_restarts_times() {
    // Failures 11 s apart never exceed "1 restart in 10 s", so the supervisor keeps
    // restarting; the call still stops retrying the same request after max_restarts retries.
    let worker = Worker::new(Fault::SlowPanic);
    let policy = at_most(1, 10);
    let sup = supervise(&worker, policy).await;
    let err = sup
        .call(work("x"), Duration::from_secs(60))
        .await
        .expect_err("retries exhausted");
    match &err {
        SupervisionError::RetriesExhausted {
            attempts,
            last_error,
            ..
        } => {
            assert_eq!(*attempts, 2);
            assert!(last_error.contains("slow boom"), "{last_error}");
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
    assert_eq!(err.infra_fault(), InfraFault::ActorCrashing);
    assert_eq!(worker.received.load(Ordering::SeqCst), 2);
    // The supervisor itself did not give up: a fresh child is running.
    assert_eq!(sup.status().phase, ChildPhase::Running);
    assert_eq!(sup.status().restarts, 2);
    sup.shutdown().await;
}

#[tokio::test]
async fn a_failing_restart_counts_against_the_intensity() {
    let started = Arc::new(AtomicUsize::new(0));
    let worker = Worker::new(Fault::None);
    let counter = Arc::clone(&started);
    let spec = ChildSpec::new("flaky", move |supervisor: ActorCell| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let worker = worker.clone();
        async move {
            if n > 0 {
                return Err(ractor::SpawnErr::StartupFailed(
                    "model server unreachable".into(),
                ));
            }
            Actor::spawn_linked(None, worker, (), supervisor)
                .await
                .map(|(child, _)| child)
        }
    });
    let sup = Supervised::start(spec).await.expect("first start works");
    sup.current()
        .expect("running")
        .cast(WorkMsg::Crash)
        .expect("cast");
    let status = sup.wait_terminal(T).await.expect("terminal");
    assert_eq!(status.phase, ChildPhase::GaveUp);
    assert_eq!(status.restarts, 3);
    assert!(
        last_error_has(&status, "model server unreachable"),
        "{status:?}"
    );
    // The first start plus three failed restart attempts.
    assert_eq!(started.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_failing_first_start_is_start_failed() {
    let spec: ChildSpec<WorkMsg> = ChildSpec::new("never", |_supervisor: ActorCell| async {
        Err(ractor::SpawnErr::StartupFailed("no binary".into()))
    });
    let err = Supervised::start(spec).await.expect_err("cannot start");
    match err {
        SupervisionError::StartFailed { label, error } => {
            assert_eq!(label, "never");
            assert!(error.contains("no binary"), "{error}");
        }
        other => panic!("expected StartFailed, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_child_gives_timeout_and_is_not_restarted() {
    let (_worker, sup) = supervised(Fault::None).await;
    let err = sup.call(WorkMsg::Slow, T).await.expect_err("too slow");
    assert!(matches!(err, SupervisionError::Timeout { .. }), "{err:?}");
    assert_eq!(err.infra_fault(), InfraFault::Timeout);
    assert_eq!(sup.status().incarnation, 1);
    assert_eq!(sup.status().phase, ChildPhase::Running);
    sup.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_dropped_reply_without_a_crash_is_no_reply() {
    let (_worker, sup) = supervised(Fault::None).await;
    let err = sup.call(WorkMsg::Ignore, T).await.expect_err("no answer");
    assert!(matches!(err, SupervisionError::NoReply { .. }), "{err:?}");
    assert_eq!(sup.status().restarts, 0);
    sup.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_the_child_and_reports_supervisor_stopped() {
    let (worker, sup) = supervised(Fault::None).await;
    let child = sup.current().expect("running");
    sup.shutdown().await;
    child
        .wait(Some(T))
        .await
        .expect("child stopped with its supervisor");
    let status = sup.status();
    assert_eq!(status.phase, ChildPhase::SupervisorStopped);
    assert!(status.child.is_none());
    let err = sup.call(work("x"), T).await.expect_err("stopped");
    assert!(
        matches!(err, SupervisionError::SupervisorStopped { .. }),
        "{err:?}"
    );
    assert_eq!(worker.started.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn clones_of_the_handle_follow_restarts() {
    let (_worker, sup) = supervised(Fault::PanicOnce).await;
    let other = sup.clone();
    sup.call(work("a"), T).await.expect("retried");
    assert_eq!(other.status().incarnation, 2);
    assert_eq!(
        other.current().expect("running").get_id(),
        sup.current().expect("running").get_id()
    );
    assert_eq!(other.call(work("b"), T).await.expect("call"), "B");
    sup.shutdown().await;
}

/// A parent that records the supervision events of the supervisor linked to it.
struct Parent {
    events: Arc<Mutex<Vec<String>>>,
}

/// The parent's only message: "answer when you have handled everything before this".
type Barrier = RpcReplyPort<()>;

impl Actor for Parent {
    type Msg = Barrier;
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<Barrier>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _: ActorRef<Barrier>,
        reply: Barrier,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let _ = reply.send(());
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<Barrier>,
        event: SupervisionEvent,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let text = match event {
            SupervisionEvent::ActorTerminated(_, _, reason) => {
                format!("terminated: {}", reason.unwrap_or_default())
            }
            SupervisionEvent::ActorFailed(_, err) => format!("failed: {err}"),
            _ => return Ok(()),
        };
        self.events.lock().expect("lock").push(text);
        Ok(())
    }
}

#[tokio::test]
async fn a_linked_parent_learns_that_the_supervisor_gave_up() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let (parent, _) = Actor::spawn(
        None,
        Parent {
            events: Arc::clone(&events),
        },
        (),
    )
    .await
    .expect("parent");
    let worker = Worker::new(Fault::AlwaysPanic);
    let spec = ChildSpec::for_actor("driver", worker.clone(), ()).with_policy(at_most(1, 60));
    let sup = Supervised::start_linked(spec, parent.get_cell())
        .await
        .expect("start");
    assert_gave_up(&sup, "x", "gives up", 1).await;
    sup.supervisor()
        .wait(Some(T))
        .await
        .expect("supervisor stopped");
    // The parent is alive (it overrides the handler) and saw a termination with the reason.
    // Supervision events are handled before messages, so the barrier's answer comes after it.
    parent
        .call(|port| port, Some(T))
        .await
        .expect("parent alive")
        .expect("barrier answered");
    let seen = events.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].starts_with("terminated: driver: gave up after 1 restart"),
        "{seen:?}"
    );
    assert!(seen[0].contains("boom every time"), "{seen:?}");
    parent.stop(None);
}
