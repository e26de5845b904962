//! The role actor: kinds, identity, roles, time limits, crashes, one assignment at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use consort_actors::{
    ActorId, AgentFailure, Artifact, ArtifactKind, ChangeSet, RequestId, Role, RoleMsg, TestList,
};
use consort_agents::{
    Agent, AgentOutput, RoleArgs, assign, identify, spawn_role, spawn_role_linked,
};
use consort_testkit::agents::{agent_fn, ask, fixed, invalid_output};
use consort_testkit::artifacts::{assignment, change, receipt_with};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::mpsc;

fn change_set(path: &str) -> Artifact {
    change(path, "select 1;\n")
}

fn receipt() -> Artifact {
    Artifact::TestRunReceipt(Box::new(receipt_with(
        RequestId(1),
        consort_actors::ContentHash::of_bytes(b"tree"),
        &[],
        0,
        "",
    )))
}

async fn actor(role: Role, name: &str, agent: impl Agent) -> ActorRef<RoleMsg> {
    let args = RoleArgs::new(ActorId::new(role, name), Arc::new(agent))
        .with_timeout(Duration::from_secs(10));
    spawn_role(args).await.expect("spawn").0
}

#[tokio::test]
async fn a_driver_cannot_produce_a_test_list() {
    let driver = actor(
        Role::Driver,
        "driver",
        fixed(Artifact::TestList(TestList { entries: vec![] })),
    )
    .await;
    let reply = ask(&driver, assignment(1, "green/T1")).await;
    assert_eq!(
        reply,
        Err(AgentFailure::KindNotAllowed {
            role: Role::Driver,
            kind: ArtifactKind::TestList
        })
    );
}

#[tokio::test]
async fn nobody_can_produce_a_test_run_receipt() {
    for (role, step) in [
        (Role::Navigator, "red/T1"),
        (Role::Navigator, "review/T1/0"),
        (Role::Driver, "green/T1"),
        (Role::Dba, "schema"),
    ] {
        let a = actor(role, "forger", fixed(receipt())).await;
        let reply = ask(&a, assignment(2, step)).await;
        assert_eq!(
            reply,
            Err(AgentFailure::KindNotAllowed {
                role,
                kind: ArtifactKind::TestRunReceipt
            }),
            "{role} at {step}"
        );
    }
}

#[tokio::test]
async fn a_navigator_produces_a_change_set_in_red_and_a_verdict_in_review() {
    let nav = actor(
        Role::Navigator,
        "navigator",
        fixed(change_set("tests/t1.sql")),
    )
    .await;
    let red = ask(&nav, assignment(3, "red/T1")).await;
    assert!(red.is_ok(), "{red:?}");
    let review = ask(&nav, assignment(4, "review/T1/0")).await;
    assert_eq!(
        review,
        Err(AgentFailure::KindNotAllowed {
            role: Role::Navigator,
            kind: ArtifactKind::ChangeSet
        })
    );
}

#[tokio::test]
async fn every_artifact_is_stamped_with_the_actor_that_produced_it() {
    let one = actor(Role::Driver, "driver-a", fixed(change_set("src/a.sql"))).await;
    let two = actor(Role::Driver, "driver-b", fixed(change_set("src/a.sql"))).await;
    assert_eq!(
        identify(&one).await.expect("identify"),
        ActorId::new(Role::Driver, "driver-a")
    );
    let p1 = ask(&one, assignment(5, "green/T1"))
        .await
        .expect("produced");
    let p2 = ask(&two, assignment(6, "green/T1"))
        .await
        .expect("produced");
    assert_eq!(p1.author, ActorId::new(Role::Driver, "driver-a"));
    assert_eq!(p2.author, ActorId::new(Role::Driver, "driver-b"));
    assert_eq!(p1.assignment.0, 5);
    assert_eq!(p2.assignment.0, 6);
    assert_eq!(p1.artifact, p2.artifact);
    assert_ne!(p1.author, p2.author);
}

#[tokio::test]
async fn a_step_of_another_role_is_refused_before_the_agent_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let counting = agent_fn(move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok(AgentOutput::new(change_set("src/a.sql"))) }
    });
    let driver = actor(Role::Driver, "driver", counting).await;
    let reply = ask(&driver, assignment(7, "review/T1/0")).await;
    assert_eq!(
        reply,
        Err(AgentFailure::WrongRole {
            role: Role::Driver,
            step: "review/T1/0".into()
        })
    );
    // A Driver step labelled as the Navigator's is refused too.
    let mut mislabelled = assignment(8, "green/T1");
    mislabelled.role = Role::Navigator;
    assert!(matches!(
        ask(&driver, mislabelled).await,
        Err(AgentFailure::WrongRole { .. })
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn role_rules_are_checked_unless_switched_off() {
    let empty = Artifact::ChangeSet(ChangeSet::default());
    let strict = actor(Role::Driver, "driver", fixed(empty.clone())).await;
    let (attempts, detail, _) = invalid_output(ask(&strict, assignment(9, "green/T1")).await);
    assert_eq!(attempts, 1);
    assert!(detail.contains("changes is empty"), "{detail}");
    let args = RoleArgs::new(ActorId::new(Role::Driver, "lax"), Arc::new(fixed(empty)))
        .with_rule_check(false);
    let (lax, _) = spawn_role(args).await.expect("spawn");
    assert!(ask(&lax, assignment(10, "green/T1")).await.is_ok());
}

#[tokio::test]
async fn a_slow_agent_runs_into_the_time_limit_and_the_actor_carries_on() {
    let sleepy = agent_fn(|a| async move {
        if a.attempt == 0 {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Ok(AgentOutput::new(change_set("src/a.sql")))
    });
    let args = RoleArgs::new(ActorId::new(Role::Driver, "driver"), Arc::new(sleepy))
        .with_timeout(Duration::from_millis(200));
    let (driver, _) = spawn_role(args).await.expect("spawn");
    let reply = ask(&driver, assignment(11, "green/T1")).await;
    assert_eq!(reply, Err(AgentFailure::Timeout { secs: 1 }));
    let mut retry = assignment(12, "green/T1");
    retry.attempt = 1;
    let produced = ask(&driver, retry).await.expect("the retry is answered");
    assert_eq!(produced.assignment.0, 12);
}

#[tokio::test]
async fn assignments_are_worked_one_at_a_time() {
    // How many assignments are being worked now, and the most at once.
    let (now, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (now_in, max_in) = (now.clone(), max.clone());
    let tracking = agent_fn(move |_| {
        let (now, max) = (now_in.clone(), max_in.clone());
        async move {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            max.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            Ok(AgentOutput::new(change_set("src/a.sql")))
        }
    });
    let args = RoleArgs::new(ActorId::new(Role::Driver, "driver"), Arc::new(tracking));
    let (driver, _) = spawn_role(args).await.expect("spawn");
    let calls: Vec<_> = (0..5)
        .map(|i| {
            let d = driver.clone();
            tokio::spawn(async move { assign(&d, assignment(20 + i, "green/T1"), None).await })
        })
        .collect();
    for c in calls {
        c.await.expect("join").expect("reply").expect("produced");
    }
    assert_eq!(max.load(Ordering::SeqCst), 1);
}

/// A supervisor that forwards its children's failures to the test.
struct Watcher(mpsc::UnboundedSender<String>);

impl Actor for Watcher {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _: ActorRef<()>,
        event: SupervisionEvent,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        if let SupervisionEvent::ActorFailed(_, err) = event {
            let _ = self.0.send(err.to_string());
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_panicking_agent_crashes_the_actor_for_its_supervisor() {
    async fn explode() -> Result<AgentOutput, AgentFailure> {
        panic!("the model client exploded")
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (watcher, _) = Actor::spawn(None, Watcher(tx), ()).await.expect("watcher");
    let args = RoleArgs::new(
        ActorId::new(Role::Driver, "driver"),
        Arc::new(agent_fn(|_| explode())),
    );
    let (driver, handle) = spawn_role_linked(args.clone(), watcher.get_cell())
        .await
        .expect("spawn");
    let reply = assign(&driver, assignment(30, "green/T1"), None)
        .await
        .expect("the caller still gets a reply");
    match reply {
        Err(AgentFailure::Crashed { detail }) => {
            assert!(detail.contains("the model client exploded"), "{detail}")
        }
        other => panic!("expected Crashed, got {other:?}"),
    }
    let failure = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the supervisor hears of it")
        .expect("event");
    assert!(failure.contains("the model client exploded"), "{failure}");
    handle.await.expect("the actor stopped");
    // The supervisor can respawn it with the same arguments.
    let (again, _) = spawn_role_linked(args, watcher.get_cell())
        .await
        .expect("respawn");
    assert_eq!(
        identify(&again).await.expect("identify"),
        ActorId::new(Role::Driver, "driver")
    );
    watcher.stop(None);
}
