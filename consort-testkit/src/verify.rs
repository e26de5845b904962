//! Verification requests to a Lakebase actor, as the conductor sends them.

use std::path::Path;
use std::time::Duration;

use consort_actors::{
    ContentHash, InfraError, InfraFault, LakebaseMsg, Migration, RequestId, TestRunReceipt,
    VerifyPurpose, VerifyRequest,
};
use ractor::{ActorRef, rpc::CallResult};

/// A GREEN request for the tree at `tree` with these migrations and every test. Its workspace
/// hash is deliberately not the tree's: a receipt must carry the hash it measured.
pub fn request(id: u64, tree: &Path, migrations: Vec<Migration>) -> VerifyRequest {
    VerifyRequest {
        id: RequestId(id),
        purpose: VerifyPurpose::Green,
        work_tree: tree.to_path_buf(),
        workspace_hash: ContentHash::of_bytes(b"what the conductor believes"),
        files: None,
        migrations,
        tests: Vec::new(),
        focus: None,
        caches: Vec::new(),
        hidden: Vec::new(),
        select: Vec::new(),
        quarantined: Vec::new(),
        harness: None,
        tool_records: Vec::new(),
    }
}

/// A request like [`request`], for a run of `purpose` whose new or changed test is `focus`.
pub fn focused(
    id: u64,
    tree: &Path,
    migrations: Vec<Migration>,
    purpose: VerifyPurpose,
    focus: &str,
) -> VerifyRequest {
    let mut req = request(id, tree, migrations);
    req.purpose = purpose;
    req.focus = Some(focus.into());
    req
}

/// Sends `req` to the Lakebase actor and returns its answer: a receipt or an infrastructure
/// error. Panics when the actor is gone or does not answer within `timeout`.
pub async fn verify(
    actor: &ActorRef<LakebaseMsg>,
    req: VerifyRequest,
    timeout: Duration,
) -> Result<TestRunReceipt, InfraError> {
    match actor
        .call(|port| LakebaseMsg::Verify(req, port), Some(timeout))
        .await
        .expect("the Lakebase actor is alive")
    {
        CallResult::Success(answer) => answer,
        other => panic!("the Lakebase actor did not answer: {other:?}"),
    }
}

/// Asserts that `text` (a receipt's or a run's output excerpt, a fault's detail) holds
/// `needle`; a failure shows the text.
#[track_caller]
pub fn assert_contains(text: &str, needle: &str) {
    assert!(text.contains(needle), "{text}");
}

/// Asserts that `e` is a `fault` whose detail holds `needle`; a failure shows the error.
#[track_caller]
pub fn assert_fault(e: &InfraError, fault: InfraFault, needle: &str) {
    assert_eq!(e.fault, fault, "{e}");
    assert_contains(&e.detail, needle);
}
