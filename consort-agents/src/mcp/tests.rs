use std::sync::Arc;
use std::time::Duration;

use consort_actors::{AgentFailure, Artifact, ReviewVerdict};
use consort_testkit::artifacts::assignment;
use serde_json::json;

use super::*;

fn approve() -> Value {
    json!({"kind": "review-verdict", "body": {"decision": "approve"}})
}

fn nonsense() -> Value {
    json!({"kind": "review-verdict", "body": {"decision": "maybe"}})
}

/// An agent over a fresh mailbox, with `max_refusals`.
fn agent(max_refusals: u32) -> (tempfile::TempDir, Arc<McpAgent>, Mailbox) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mailbox = Mailbox::new(tmp.path().join("mcp"));
    let agent = McpAgent::new(
        mailbox.clone(),
        Some(tmp.path().join("transcripts")),
        max_refusals,
    );
    (tmp, Arc::new(agent), mailbox)
}

/// Starts `act` for `a` on its own task and waits until the assignment is parked.
async fn parked(
    agent: &Arc<McpAgent>,
    mailbox: &Mailbox,
    a: consort_actors::Assignment,
) -> tokio::task::JoinHandle<Result<AgentOutput, AgentFailure>> {
    let id = a.id.0;
    let agent = Arc::clone(agent);
    let task = tokio::spawn(async move { agent.act(&a).await });
    for _ in 0..500 {
        if mailbox.parked(id).expect("readable").is_some() {
            return task;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never parked");
}

/// Waits for the verdict of submission `seq`.
async fn verdict(mailbox: &Mailbox, id: u64, seq: u32) -> Verdict {
    for _ in 0..1000 {
        if let Some(v) = mailbox.verdict(id).expect("readable")
            && v.seq >= seq
        {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("no verdict for #{seq}");
}

#[tokio::test]
async fn a_refused_submission_is_answered_word_for_word_and_the_next_one_accepted() {
    let (_tmp, agent, mailbox) = agent(2);
    let task = parked(&agent, &mailbox, assignment(7, "review/T1/0")).await;
    let p = mailbox.parked(7).expect("readable").expect("parked");
    assert_eq!(p.answer_with, "review-verdict");
    assert_eq!(p.assignment["step_key"], "review/T1/0");
    assert!(p.assignment["answer_schema"].is_object());
    mailbox.take(&p, "nav").expect("taken");

    let seq = mailbox.submit(7, "nav", nonsense()).expect("submitted");
    let v = verdict(&mailbox, 7, seq).await;
    assert!(!v.accepted && !v.closed);
    assert_eq!(v.refusals_left, 1);
    let reason = v.reason.expect("a reason");
    let direct =
        crate::validate::parse_artifact(consort_actors::ArtifactKind::ReviewVerdict, nonsense())
            .expect_err("refused by the same function");
    assert_eq!(
        reason, direct,
        "the reason is the validator's, word for word"
    );

    let seq = mailbox.submit(7, "nav", approve()).expect("submitted");
    assert_eq!(seq, 2);
    let out = task.await.expect("joined").expect("accepted");
    assert!(matches!(
        out.artifact,
        Artifact::ReviewVerdict(ReviewVerdict::Approve { .. })
    ));
    assert_eq!(out.usage.model.as_deref(), Some("mcp:nav"));
    let t = out.transcript.expect("the step's record");
    assert!(t.path.ends_with(".mcp.json"), "{}", t.path);
    let v = verdict(&mailbox, 7, 2).await;
    assert!(v.accepted && v.closed);
    let closed = mailbox.submit(7, "nav", approve());
    assert!(matches!(closed, Err(MailboxError::NotWaiting { id: 7 })));
}

#[tokio::test]
async fn refusals_past_the_retry_bound_fail_the_step_as_invalid_output() {
    let (_tmp, agent, mailbox) = agent(1);
    let task = parked(&agent, &mailbox, assignment(3, "review/T1/0")).await;
    for seq in 1..=2 {
        assert_eq!(
            mailbox.submit(3, "nav", nonsense()).expect("submitted"),
            seq
        );
        verdict(&mailbox, 3, seq).await;
    }
    let failure = task.await.expect("joined").expect_err("refused twice");
    assert!(
        matches!(failure, AgentFailure::InvalidOutput { attempts: 2, .. }),
        "{failure}"
    );
    assert!(mailbox.verdict(3).expect("readable").expect("one").closed);
    // Resumed after the last refusal was written, the step fails again at once.
    let again = tokio::time::timeout(
        Duration::from_secs(5),
        agent.act(&assignment(3, "review/T1/0")),
    )
    .await
    .expect("at once");
    assert!(matches!(again, Err(AgentFailure::InvalidOutput { .. })));
}

#[tokio::test]
async fn malformed_and_stale_files_are_typed_errors_and_never_a_panic() {
    let (tmp, agent, mailbox) = agent(2);
    let dir = tmp.path().join("mcp");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("a9.assignment.json"), "{not json").expect("write");
    assert!(matches!(
        mailbox.parked(9),
        Err(MailboxError::Malformed { .. })
    ));
    assert!(matches!(
        mailbox.all_parked(),
        Err(MailboxError::Malformed { .. })
    ));
    std::fs::remove_file(dir.join("a9.assignment.json")).expect("rm");

    let task = parked(&agent, &mailbox, assignment(4, "review/T1/0")).await;
    // A torn or foreign submission is no answer: the agent keeps waiting.
    std::fs::write(
        dir.join("a4.submission.json"),
        "{\"assignment\": 4, \"seq\"",
    )
    .expect("write");
    let stale = Submission {
        assignment: 5,
        seq: 1,
        identity: "nav".into(),
        at: chrono::Utc::now(),
        artifact: approve(),
    };
    assert!(matches!(
        mailbox.submission(4),
        Err(MailboxError::Malformed { .. })
    ));
    std::fs::write(
        dir.join("a4.submission.json"),
        serde_json::to_vec(&stale).expect("json"),
    )
    .expect("write");
    let err = mailbox.submission(4).expect_err("another assignment's");
    assert!(
        err.to_string().contains("answers assignment 5, not 4"),
        "{err}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!task.is_finished(), "neither file is an answer");
    assert!(mailbox.verdict(4).expect("readable").is_none());

    // A submission already judged is not judged again.
    let seq = mailbox.submit(4, "nav", nonsense()).expect("submitted");
    verdict(&mailbox, 4, seq).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        mailbox
            .verdict(4)
            .expect("readable")
            .expect("one")
            .refusals_left,
        1
    );
    mailbox.submit(4, "nav", approve()).expect("submitted");
    task.await.expect("joined").expect("accepted");
}

#[tokio::test]
async fn an_accepted_answer_survives_a_restart_of_the_run() {
    let (_tmp, agent, mailbox) = agent(2);
    let a = assignment(11, "review/T1/0");
    let task = parked(&agent, &mailbox, a.clone()).await;
    mailbox.submit(11, "nav", approve()).expect("submitted");
    task.await.expect("joined").expect("accepted");
    // The run was killed before the ledger line: the same assignment is parked again, and the
    // accepted answer is handed over at once.
    let again = tokio::time::timeout(Duration::from_secs(5), agent.act(&a))
        .await
        .expect("answered at once")
        .expect("accepted");
    assert!(matches!(again.artifact, Artifact::ReviewVerdict(_)));
}

#[test]
fn the_first_identity_keeps_an_assignment_and_code_authors_are_known() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mailbox = Mailbox::new(tmp.path());
    let green = mailbox.park(&assignment(1, "green/T1"), 2).expect("parked");
    assert_eq!(mailbox.take(&green, "drv").expect("taken").identity, "drv");
    assert_eq!(mailbox.take(&green, "drv").expect("again").identity, "drv");
    let err = mailbox.take(&green, "nav").expect_err("taken by drv");
    assert_eq!(
        err.to_string(),
        "assignment 1 (green/T1) was taken by drv; only that identity may answer it"
    );
    assert!(matches!(
        mailbox.submit(1, "nav", approve()),
        Err(MailboxError::TakenByOther { .. })
    ));
    let refactor = mailbox
        .park(&assignment(2, "refactor/T1/0"), 2)
        .expect("parked");
    mailbox.take(&refactor, "drv2").expect("taken");
    let other = mailbox.park(&assignment(3, "green/T2"), 2).expect("parked");
    mailbox.take(&other, "someone").expect("taken");
    assert_eq!(
        mailbox.code_authors("T1").expect("readable"),
        vec!["drv".to_string(), "drv2".to_string()]
    );
    assert!(mailbox.code_authors("T3").expect("readable").is_empty());
    for bad in ["", "a b", "../x", &"x".repeat(65)] {
        assert!(matches!(
            check_identity(bad),
            Err(MailboxError::BadIdentity(_))
        ));
    }
}
