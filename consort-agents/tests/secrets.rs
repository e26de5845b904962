//! The API key never appears in logs (everything, at TRACE, from every crate), in failures, in
//! error `Display`/`Debug`, or in the agent's `Debug`.
//!
//! This binary holds one test because it installs a global subscriber.

use std::time::Duration;

use consort_actors::{ActorId, Role};
use consort_agents::{
    Agent, ApiKey, HttpPolicy, OpenAiAgent, OpenAiConfig, OpenAiConfigError, RoleArgs, spawn_role,
};
use consort_testkit::agents::ask;
use consort_testkit::artifacts::assignment;
use consort_testkit::logs::{Capture, capturing_subscriber};
use consort_testkit::model::{Reply, green_answer, ok, start_stub};
use serde_json::json;
use std::sync::Arc;

const KEY: &str = "sk-live-SECRET-7f3a9c1e5b2d4f60";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_never_reaches_logs_errors_or_debug_output() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(capturing_subscriber(&capture))
        .expect("the only subscriber in this binary");

    // A server that echoes the key back in its error messages, then fails, then answers.
    let (base, stub) = start_stub(vec![
        Reply::Json(
            500,
            vec![],
            json!({"error": {"message": format!("internal error for key {KEY}")}}),
        ),
        Reply::Json(
            401,
            vec![],
            json!({"error": {"message": format!("Incorrect API key provided: {KEY}"),
                "type": "invalid_request_error", "code": "invalid_api_key"}}),
        ),
        ok(&green_answer()),
    ])
    .await;
    let cfg = OpenAiConfig {
        api_key_env: None,
        http: HttpPolicy {
            max_retries: 1,
            initial_backoff_ms: 10,
            ..HttpPolicy::default()
        },
        ..OpenAiConfig::new(&base, "stub-model")
    };
    let agent = Arc::new(
        OpenAiAgent::with_key(Role::Driver, cfg.clone(), ApiKey::new(KEY).expect("key"))
            .expect("agent"),
    );
    let args = RoleArgs::new(ActorId::new(Role::Driver, "driver"), agent.clone())
        .with_timeout(Duration::from_secs(30));
    let (actor, _) = spawn_role(args.clone()).await.expect("spawn");

    // 500 then 401: the failure must not carry the key the server echoed.
    let failure = ask(&actor, assignment(1, "green/T1"))
        .await
        .expect_err("401 fails");
    let shown = format!("{failure} {failure:?}");
    assert!(shown.contains("401"), "{shown}");
    assert!(
        !shown.contains(KEY),
        "the key leaked into the failure: {shown}"
    );
    assert!(shown.contains("<redacted>"), "{shown}");

    // Then a success, so the normal path is logged too.
    ask(&actor, assignment(2, "green/T1"))
        .await
        .expect("produced");
    // The key did go over the wire.
    assert!(
        stub.seen()
            .iter()
            .all(|s| s.authorization.as_deref() == Some(&*format!("Bearer {KEY}")))
    );

    // Debug output of everything that holds the key.
    let debug = format!(
        "{agent:?} {:?} {args:?} {:?}",
        ApiKey::new(KEY).expect("key"),
        agent.describe()
    );
    assert!(!debug.contains(KEY), "{debug}");
    assert!(debug.contains("<redacted>"), "{debug}");

    // A key variable that is unset is named, never valued; a bad key is refused without echo.
    let missing = OpenAiAgent::new(
        Role::Driver,
        OpenAiConfig {
            api_key_env: Some("CONSORT_SECRETS_TEST_UNSET".into()),
            ..cfg
        },
    )
    .expect_err("unset");
    assert!(missing.to_string().contains("CONSORT_SECRETS_TEST_UNSET"));
    let bad = ApiKey::new(format!("{KEY}\n")).expect_err("newline");
    assert_eq!(bad, OpenAiConfigError::BadApiKey);
    assert!(!format!("{bad} {bad:?}").contains(KEY));

    // Give the server task a moment to finish logging, then search every line.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let logs = capture.text();
    assert!(
        logs.contains("model server call failed"),
        "the capture works: {logs}"
    );
    assert!(logs.contains("model call"), "{logs}");
    assert!(!logs.contains(KEY), "the key leaked into the logs:\n{logs}");
    assert!(
        !logs.contains("SECRET-7f3a"),
        "part of the key leaked:\n{logs}"
    );
}
