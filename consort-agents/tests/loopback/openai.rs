//! The OpenAI-compatible backend, driven through a role actor, against a loopback server.

use std::sync::Arc;
use std::time::Duration;

use consort_actors::workbench::{Advice, FileText, Hits, Listing, ToolError, Tools, Workbench};
use consort_actors::{
    ActorId, AgentFailure, Allowance, Artifact, BudgetName, ChangeSet, ContextMeasure, FileChange,
    Measure, Remaining, Role,
};
use consort_agents::{
    Agent, AgentOutput, ApiKey, HttpPolicy, OpenAiAgent, OpenAiConfig, RoleArgs, spawn_role,
};
use consort_testkit::agents::{ask, invalid_output};
use consort_testkit::artifacts::{assignment, entry, with_files};
use consort_testkit::assert::assert_each;
use consort_testkit::model::{Reply, green_answer, ok, start_stub};
use serde_json::{Value, json};

const KEY: &str = "sk-test-0123456789abcdef";

fn config(base: &str) -> OpenAiConfig {
    OpenAiConfig {
        api_key_env: None,
        temperature: Some(0.1),
        max_tokens: Some(2048),
        http: HttpPolicy {
            max_retries: 2,
            initial_backoff_ms: 10,
            max_backoff_ms: 2_000,
            request_timeout_secs: 30,
            connect_timeout_secs: 5,
        },
        ..OpenAiConfig::new(base, "stub-model")
    }
}

fn agent(role: Role, cfg: OpenAiConfig) -> Arc<OpenAiAgent> {
    Arc::new(OpenAiAgent::with_key(role, cfg, ApiKey::new(KEY).expect("key")).expect("agent"))
}

async fn driver_actor(
    agent: Arc<dyn Agent>,
    timeout: Duration,
) -> ractor::ActorRef<consort_actors::RoleMsg> {
    let args = RoleArgs::new(ActorId::new(Role::Driver, "driver"), agent).with_timeout(timeout);
    spawn_role(args).await.expect("spawn").0
}

fn expected_change_set() -> Artifact {
    Artifact::ChangeSet(ChangeSet {
        summary: "stock lookup".into(),
        changes: vec![FileChange::Write {
            path: "src/stock.sql".into(),
            content: "select 1;\n".into(),
        }],
    })
}

/// Asks a driver on the model at `base` for `green/T1` (assignment `id`); checks that the answer
/// is the expected change set (`why` says why it should be) and returns it.
async fn green_from(base: &str, id: u64, why: &str) -> AgentOutput {
    let out = agent(Role::Driver, config(base))
        .act(&assignment(id, "green/T1"))
        .await
        .expect(why);
    assert_eq!(out.artifact, expected_change_set(), "{why}");
    out
}

#[tokio::test]
async fn valid_structured_output_is_produced_and_the_request_is_well_formed() {
    let (base, stub) = start_stub(vec![ok(&green_answer())]).await;
    let actor = driver_actor(agent(Role::Driver, config(&base)), Duration::from_secs(30)).await;
    let mut a = assignment(1, "green/T1");
    a.feedback = vec!["remember the index".into()];
    let produced = ask(&actor, a).await.expect("produced");
    assert_eq!(produced.artifact, expected_change_set());
    assert_eq!(produced.author, ActorId::new(Role::Driver, "driver"));
    assert_eq!(produced.usage.prompt_tokens, 10);
    assert_eq!(produced.usage.completion_tokens, 5);
    assert_eq!(produced.usage.calls, 1);

    let seen = stub.seen();
    assert_eq!(seen.len(), 1);
    let req = &seen[0];
    assert_eq!(
        req.authorization.as_deref(),
        Some(&*format!("Bearer {KEY}"))
    );
    assert_eq!(req.body["model"], "stub-model");
    assert_eq!(req.body["max_completion_tokens"], 2048);
    let rf = &req.body["response_format"];
    assert_eq!(rf["type"], "json_schema", "{rf}");
    assert_eq!(rf["json_schema"]["strict"], true);
    assert_eq!(rf["json_schema"]["name"], "consort_change_set");
    let schema = &rf["json_schema"]["schema"];
    assert_eq!(schema["properties"]["kind"]["enum"][0], "change-set");
    assert!(
        schema.to_string().contains("\"changes\""),
        "the body schema comes from ChangeSet: {schema}"
    );
    assert_eq!(req.messages()[0]["role"], "system");
    let system = req.content(0);
    assert!(system.contains("**Driver**"), "{system}");
    assert!(system.contains("Never create, edit or delete a test file"));
    assert_eq!(req.messages()[1]["role"], "user");
    let user: Value = serde_json::from_str(req.content(1)).expect("the user message is JSON");
    assert_eq!(user["step"], "green/T1");
    assert_eq!(user["answer_with"], "change-set");
    assert_eq!(user["feedback"], json!(["remember the index"]));
}

#[tokio::test]
async fn invalid_json_is_retried_with_the_error_fed_back() {
    let (base, stub) = start_stub(vec![
        ok("Sure! I changed src/stock.sql for you."),
        ok(&format!("```json\n{}\n```", green_answer())),
    ])
    .await;
    let actor = driver_actor(agent(Role::Driver, config(&base)), Duration::from_secs(30)).await;
    let produced = ask(&actor, assignment(2, "green/T1"))
        .await
        .expect("produced on the second try");
    assert_eq!(produced.artifact, expected_change_set());
    assert_eq!(produced.usage.calls, 2);
    assert_eq!(produced.usage.prompt_tokens, 20);

    let seen = stub.seen();
    assert_eq!(seen.len(), 2);
    let second = &seen[1];
    let msgs = second.messages();
    assert_eq!(msgs.len(), 4, "system, assignment, bad answer, feedback");
    assert_eq!(msgs[2]["role"], "assistant");
    assert_eq!(second.content(2), "Sure! I changed src/stock.sql for you.");
    assert_eq!(msgs[3]["role"], "user");
    let feedback = second.content(3);
    assert!(feedback.contains("rejected"), "{feedback}");
    assert!(feedback.contains("not JSON"), "{feedback}");
}

#[tokio::test]
async fn schema_violations_until_the_bound_are_a_typed_error() {
    let bad = json!({"kind": "change-set", "body": {"changes": "everything"}}).to_string();
    let (base, stub) = start_stub(vec![ok(&bad)]).await;
    let actor = driver_actor(agent(Role::Driver, config(&base)), Duration::from_secs(30)).await;
    let reply = ask(&actor, assignment(3, "green/T1")).await;
    let (attempts, detail, usage) = invalid_output(reply);
    assert_eq!(attempts, 3, "one try and the default two retries");
    assert!(detail.contains("not a valid artifact"), "{detail}");
    assert_eq!(usage.calls, 3, "refused answers cost their tokens too");
    assert_eq!(usage.model.as_deref(), Some("stub-model"));
    assert_eq!(stub.seen().len(), 3);
}

#[tokio::test]
async fn role_rule_violations_are_fed_back_and_bounded() {
    // Well-formed JSON, but a GREEN change set that changes nothing breaks the role rules.
    let empty = json!({"kind": "change-set", "body": {"changes": []}}).to_string();
    let (base, stub) = start_stub(vec![ok(&empty)]).await;
    let cfg = OpenAiConfig {
        output_retries: 1,
        ..config(&base)
    };
    let reply = agent(Role::Driver, cfg)
        .act(&assignment(4, "green/T1"))
        .await;
    let (attempts, detail, _) = invalid_output(reply);
    assert_eq!(attempts, 2);
    assert!(detail.contains("changes is empty"), "{detail}");
    let seen = stub.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].content(3).contains("changes is empty"));
}

#[tokio::test]
async fn a_wrong_kind_from_the_model_is_corrected_by_feedback() {
    let (base, stub) = start_stub(vec![
        ok(&json!({"kind": "test-list", "body": {"entries": []}}).to_string()),
        ok(&green_answer()),
    ])
    .await;
    green_from(&base, 5, "second answer accepted").await;
    let feedback = stub.seen()[1].content(3).to_string();
    assert!(
        feedback.contains("you answered with a test-list"),
        "{feedback}"
    );
}

#[tokio::test]
async fn server_errors_are_retried_then_succeed() {
    let (base, stub) = start_stub(vec![
        Reply::Json(500, vec![], json!({"error": {"message": "boom"}})),
        ok(&green_answer()),
    ])
    .await;
    let out = green_from(&base, 6, "succeeds after the retry").await;
    assert_eq!(out.usage.calls, 1, "HTTP retries are not model calls");
    assert_eq!(stub.seen().len(), 2);
}

#[tokio::test]
async fn a_server_that_keeps_failing_is_model_unavailable_after_the_bound() {
    let (base, stub) = start_stub(vec![Reply::Json(
        503,
        vec![],
        json!({"error": {"message": "overloaded"}}),
    )])
    .await;
    let reply = agent(Role::Driver, config(&base))
        .act(&assignment(7, "green/T1"))
        .await;
    match reply {
        Err(AgentFailure::ModelUnavailable { detail, .. }) => {
            assert!(detail.contains("503"), "{detail}");
            assert!(detail.contains("overloaded"), "{detail}");
        }
        other => panic!("expected ModelUnavailable, got {other:?}"),
    }
    assert_eq!(
        stub.seen().len(),
        3,
        "one request and max_retries = 2 retries"
    );
}

#[tokio::test]
async fn a_refused_connection_is_model_unavailable() {
    // Bind and drop a listener: nothing listens on that port any more.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let reply = agent(Role::Driver, config(&format!("http://127.0.0.1:{port}/v1")))
        .act(&assignment(8, "green/T1"))
        .await;
    match reply {
        Err(AgentFailure::ModelUnavailable { detail, .. }) => {
            assert!(detail.contains("cannot connect"), "{detail}")
        }
        other => panic!("expected ModelUnavailable, got {other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn rate_limits_are_retried_after_the_delay_the_server_asks_for() {
    let capture = consort_testkit::logs::Capture::default();
    let _guard =
        tracing::subscriber::set_default(consort_testkit::logs::capturing_subscriber(&capture));
    // Another test's thread may have registered the retry log's callsite while this
    // subscriber was being set, with no subscriber interested: recompute every callsite's
    // interest now that this one is in place.
    tracing::callsite::rebuild_interest_cache();
    let (base, stub) = start_stub(vec![
        Reply::Json(
            429,
            vec![("retry-after", "1".into())],
            json!({"error": {"message": "slow down", "type": "rate_limit_error"}}),
        ),
        ok(&green_answer()),
    ])
    .await;
    green_from(&base, 9, "succeeds after the rate limit").await;
    assert_eq!(stub.seen().len(), 2);
    let logs = capture.text();
    // The configured backoff is 10 ms; the wait used is the server's 1 s.
    assert!(logs.contains("delay_ms=1000"), "{logs}");
    assert!(logs.contains("retry_after=true"), "{logs}");
    assert!(logs.contains("HTTP 429"), "{logs}");
}

#[tokio::test]
async fn a_hung_server_runs_into_the_time_limit() {
    let (base, stub) = start_stub(vec![Reply::Hang]).await;
    let actor = driver_actor(
        agent(Role::Driver, config(&base)),
        Duration::from_millis(300),
    )
    .await;
    let reply = ask(&actor, assignment(10, "green/T1")).await;
    assert_eq!(reply, Err(AgentFailure::Timeout { secs: 1 }));
    assert_eq!(stub.seen().len(), 1);
    // The actor is still there and answers.
    let id = consort_agents::identify(&actor).await.expect("identify");
    assert_eq!(id.role, Role::Driver);
}

#[tokio::test]
async fn lax_compatible_answers_are_accepted() {
    // `"id": null`, no `object`, `created`, `model`, `usage`, `index` or `role`; the JSON sits
    // in prose after a think block.
    let lax = json!({
        "id": null,
        "choices": [{
            "message": {"content": format!("<think>the user wants {{a change}}</think>Here it is: {}", green_answer())},
            "finish_reason": "stop"
        }]
    });
    let (base, _stub) = start_stub(vec![Reply::Json(200, vec![], lax)]).await;
    let out = agent(Role::Driver, config(&base))
        .act(&assignment(11, "green/T1"))
        .await
        .expect("accepted");
    assert_eq!(out.artifact, expected_change_set());
    assert_eq!(out.usage.prompt_tokens, 0);
    assert_eq!(out.usage.calls, 1);
}

#[tokio::test]
async fn a_server_without_json_schema_support_is_asked_by_prompt() {
    let (base, stub) = start_stub(vec![Reply::RefuseSchema(Box::new(ok(&green_answer())))]).await;
    let agent = agent(Role::Driver, config(&base));
    let out = agent
        .act(&assignment(12, "green/T1"))
        .await
        .expect("accepted without response_format");
    assert_eq!(out.artifact, expected_change_set());
    let seen = stub.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].body.get("response_format").is_some());
    assert!(seen[1].body.get("response_format").is_none());
    assert!(seen[1].content(0).contains("must match this JSON schema"));
    // The agent remembers: the next assignment goes straight to the prompt form.
    agent
        .act(&assignment(13, "green/T1"))
        .await
        .expect("accepted");
    assert_eq!(stub.seen().len(), 3);
}

/// What is left of one budget, as the conductor hands it on in an assignment.
fn left(measure: Measure, limit: u64, spent: u64) -> Remaining {
    let allowance = Some(Allowance {
        budget: BudgetName {
            role: Some(Role::Driver),
            measure,
        },
        limit,
        spent,
    });
    Remaining {
        tokens: if measure == Measure::Tokens {
            allowance.clone()
        } else {
            None
        },
        wall_ms: if measure == Measure::WallTime {
            allowance
        } else {
            None
        },
        money_micros: None,
        prices: Default::default(),
    }
}

#[tokio::test]
async fn a_call_that_would_go_over_the_token_budget_is_not_made() {
    let (base, stub) = start_stub(vec![ok(&green_answer())]).await;
    let agent = agent(Role::Driver, config(&base));
    let mut a = assignment(14, "green/T1");
    a.budget = Some(left(Measure::Tokens, 100_000, 0));
    agent.act(&a).await.expect("a call fits in 100000 tokens");
    assert_eq!(stub.seen().len(), 1);
    // 1500 left: the prompt plus the 2048 completion tokens the call may take do not fit.
    let mut a = assignment(15, "green/T1");
    a.budget = Some(left(Measure::Tokens, 100_000, 98_500));
    match agent.act(&a).await {
        Err(AgentFailure::BudgetSpent { budget, usage }) => {
            assert_eq!(budget.spent, 98_500);
            assert!(budget.needed.is_some_and(|n| n > 2048), "{budget}");
            assert!(
                budget
                    .to_string()
                    .starts_with("driver tokens: 98500 of 100000 spent"),
                "{budget}"
            );
            assert_eq!(usage.calls, 0);
        }
        other => panic!("expected BudgetSpent, got {other:?}"),
    }
    assert_eq!(stub.seen().len(), 1, "the call was not made");
    // Without a budget in the assignment, the agent makes its calls.
    agent
        .act(&assignment(16, "green/T1"))
        .await
        .expect("no budget");
    assert_eq!(stub.seen().len(), 2);
}

#[tokio::test]
async fn the_wall_time_budget_stops_a_slow_role() {
    let (base, _stub) = start_stub(vec![Reply::Hang]).await;
    let mut a = assignment(17, "green/T1");
    a.budget = Some(left(Measure::WallTime, 61_000, 60_000));
    match agent(Role::Driver, config(&base)).act(&a).await {
        Err(AgentFailure::BudgetSpent { budget, .. }) => {
            assert_eq!(budget.budget.measure, Measure::WallTime);
            assert!(budget.to_string().contains("wall time"), "{budget}")
        }
        other => panic!("expected BudgetSpent, got {other:?}"),
    }
}

#[tokio::test]
async fn every_role_gets_its_own_prompt_and_schema() {
    let stories = json!({"kind": "stories", "body": serde_json::to_value(consort_testkit::artifacts::stories(true)).expect("json")});
    let (base, stub) = start_stub(vec![ok(&stories.to_string())]).await;
    let mut a = assignment(18, "stories");
    a.inputs.feature = Some(consort_testkit::artifacts::feature().into());
    let out = agent(Role::ProductOwner, config(&base))
        .act(&a)
        .await
        .expect("stories accepted");
    assert_eq!(
        out.artifact,
        Artifact::Stories(consort_testkit::artifacts::stories(true))
    );
    let req = &stub.seen()[0];
    assert!(req.content(0).contains("**Product Owner**"));
    assert_eq!(
        req.body["response_format"]["json_schema"]["schema"]["properties"]["kind"]["enum"][0],
        "stories"
    );
    let user: Value = serde_json::from_str(req.content(1)).expect("json");
    assert_eq!(
        user["inputs"]["feature"]["id"],
        consort_testkit::artifacts::feature().id
    );
}

#[tokio::test]
async fn other_client_errors_fail_at_once_without_dropping_the_schema() {
    let (base, stub) = start_stub(vec![Reply::Json(
        400,
        vec![],
        json!({"error": {"message": "Unrecognized request argument supplied: seed_v2",
            "type": "invalid_request_error", "param": null, "code": null}}),
    )])
    .await;
    match agent(Role::Driver, config(&base))
        .act(&assignment(19, "green/T1"))
        .await
    {
        Err(AgentFailure::ModelUnavailable { detail, .. }) => {
            assert!(detail.contains("400"), "{detail}");
            assert!(detail.contains("seed_v2"), "{detail}");
        }
        other => panic!("expected ModelUnavailable, got {other:?}"),
    }
    let seen = stub.seen();
    assert_eq!(seen.len(), 1, "a 400 is not retried");
    assert!(seen[0].body.get("response_format").is_some());
}

/// The step, prompt size, window and measure of a `ContextExceeded` failure.
fn context_sizes(
    result: Result<AgentOutput, AgentFailure>,
) -> (String, u32, Option<u32>, ContextMeasure) {
    match result {
        Err(AgentFailure::ContextExceeded {
            step,
            prompt_tokens,
            window,
            measured,
            ..
        }) => (step, prompt_tokens, window, measured),
        other => panic!("expected ContextExceeded, got {other:?}"),
    }
}

/// A server's refusal of a prompt over its context window, in OpenAI's words and in
/// llama.cpp's (whose numeric `code` async-openai cannot read as OpenAI's error shape).
#[tokio::test]
async fn a_context_refusal_is_typed_with_the_sizes_and_not_retried() {
    let refusals = [
        json!({"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9100 tokens.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
        json!({"error": {"code": 400, "message": "request (9100 tokens) exceeds the available context size (8192 tokens), try increasing it",
            "type": "exceed_context_size_error", "n_prompt_tokens": 9100, "n_ctx": 8192}}),
    ];
    for (i, body) in refusals.into_iter().enumerate() {
        let (base, stub) = start_stub(vec![Reply::Json(400, vec![], body)]).await;
        let result = agent(Role::Driver, config(&base))
            .act(&assignment(30 + i as u64, "green/T1"))
            .await;
        assert_eq!(
            context_sizes(result),
            (
                "green/T1".into(),
                9100,
                Some(8192),
                ContextMeasure::ServerRefused
            )
        );
        assert_eq!(
            stub.requests(),
            1,
            "a context refusal is not retried as it was"
        );
    }
}

/// A workbench that answers every call the same way and counts the runs: what the tool loop
/// does with the answers is under test here, not the tools (the conductor's are tested with it).
struct Counting(std::sync::atomic::AtomicU32);

impl Workbench for Counting {
    fn read(&self, path: &str) -> Result<FileText, ToolError> {
        Ok(FileText {
            path: path.into(),
            text: "-- the file\n".into(),
            bytes: 12,
            truncated: false,
        })
    }

    fn list(&self, _: Option<&str>) -> Result<Listing, ToolError> {
        Ok(Listing::default())
    }

    fn search(&self, _: &str, _: Option<&str>) -> Result<Hits, ToolError> {
        Ok(Hits::default())
    }

    fn try_change(&self, _: ChangeSet) -> consort_actors::BoxFuture<'_, Result<Advice, ToolError>> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Box::pin(async {
            Ok(Advice {
                would_pass: true,
                verdict: "every expected test passes".into(),
                outcomes: Vec::new(),
                runs_left: 0,
            })
        })
    }
}

/// A "model" that calls tools for as long as it is offered them, then answers.
fn tool_hungry(req: &consort_testkit::model::Seen) -> Reply {
    if req.body.get("tools").is_none() {
        return ok(&green_answer());
    }
    let change = json!({"change_set": {"summary": "try", "changes": []}});
    Reply::Json(
        200,
        vec![],
        consort_testkit::model::tool_calls(&[
            ("read_file", json!({"path": "src/stock.sql"})),
            ("run_tests", change),
            ("read_file", json!({"wrong": 1})),
        ]),
    )
}

#[tokio::test]
async fn tool_rounds_are_bounded_and_every_call_is_kept_in_a_hashed_transcript() {
    let (base, stub) = consort_testkit::model::start_answering(tool_hungry).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&base);
    cfg.tools.max_rounds = 2;
    cfg.transcript_dir = Some(dir.path().to_path_buf());
    let bench = Arc::new(Counting(Default::default()));
    let mut a = with_files(
        assignment(1, "green/T1"),
        &[
            ("tests/t1.sql", "-- the entry's test\n"),
            ("src/stock.sql", "-- the code so far\n"),
        ],
    );
    a.tools = Some(Tools::new(Arc::clone(&bench)));
    a.inputs.test = Some(consort_actors::TestEntry {
        description: "files stock".into(),
        ..entry("T1", "S1-AC1", "tests/t1.sql")
    });
    let out = agent(Role::Driver, cfg)
        .act(&a)
        .await
        .expect("an answer after the rounds");
    assert_eq!(out.artifact, expected_change_set());
    let all = stub.seen();
    // First the probe: a required call beside a schema, which this server answers with calls.
    assert_eq!(all[0].body["tool_choice"], "required");
    assert!(all[0].body.get("response_format").is_some());
    let seen = &all[1..];
    assert_eq!(seen.len(), 3, "two tool rounds, then the answer");
    assert!(
        seen.iter().all(|s| s.body.get("response_format").is_some()),
        "a server that calls tools beside a schema gets both in one request"
    );
    assert!(
        seen[..2]
            .iter()
            .all(|s| s.body["tools"].as_array().is_some_and(|t| t.len() == 4))
    );
    assert!(
        seen[2].body.get("tools").is_none(),
        "no tools once the rounds are spent"
    );
    // The code is listed for the model to read; the entry's test is sent.
    let step_part = seen[0].content(seen[0].messages().len() - 1);
    assert!(step_part.contains("the entry's test"), "{step_part}");
    assert!(!step_part.contains("the code so far"), "{step_part}");
    assert!(
        step_part.contains("src/stock.sql (19 bytes)")
            && step_part.contains("read it with read_file"),
        "{step_part}"
    );
    // Round 2 repeats round 1 word for word.
    let repeated = |t: &str| t.starts_with("Not run again");
    assert_each(
        &seen[2].tool_results(),
        &[
            ("the file", &|t| t.contains("-- the file")),
            ("run_tests", &|t| {
                t.starts_with("Advice only (not a receipt)")
            }),
            ("bad arguments", &|t| {
                t.starts_with("error: bad arguments for read_file")
            }),
            ("a repeated call", &repeated),
            ("a repeated call", &repeated),
            ("a repeated call", &repeated),
        ],
    );
    assert!(
        seen[2]
            .content(seen[2].messages().len() - 1)
            .contains("No tool rounds are left")
    );
    assert_eq!(
        bench.0.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the repeated scratch run is not run again"
    );
    assert_eq!(
        (out.usage.calls, out.usage.tool_calls),
        (4, 6),
        "the probe, two rounds and the answer"
    );
    assert_eq!(out.usage.repeated_tool_calls, 3);
    let kept = out.transcript.expect("a transcript");
    let bytes = std::fs::read(dir.path().join(&kept.path)).expect("the transcript file");
    assert_eq!(kept.path, "green_T1-0.tools.json");
    assert_eq!(kept.hash, consort_actors::ContentHash::of_bytes(&bytes));
    let text: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(text["exchanges"].as_array().map(Vec::len), Some(6));
}

#[tokio::test]
async fn a_step_without_tools_or_with_tools_turned_off_is_offered_none_and_gets_the_code() {
    let (base, stub) = consort_testkit::model::start_answering(tool_hungry).await;
    let mut off = config(&base);
    off.tools.enabled = false;
    let mut with_tools = assignment(2, "green/T1");
    with_tools.tools = Some(Tools::new(Counting(Default::default())));
    with_tools
        .inputs
        .files
        .insert("src/stock.sql".into(), "-- the code so far\n".into());
    for (cfg, a) in [
        (config(&base), assignment(1, "green/T1")),
        (off, with_tools),
    ] {
        let out = agent(Role::Driver, cfg).act(&a).await.expect("answer");
        assert_eq!(out.artifact, expected_change_set());
        assert!(out.transcript.is_none());
    }
    let seen = stub.seen();
    assert_eq!(seen.len(), 2, "one call each, no tool round");
    assert!(
        seen[1]
            .content(seen[1].messages().len() - 1)
            .contains("the code so far")
    );
}

/// A server that behaves like llama.cpp: when a request carries a `response_format`, the schema
/// wins and the tools are ignored (no tool call ever comes back with it). Without the schema it
/// calls `read_file` once, then answers in prose (which is not the artifact).
fn schema_wins(req: &consort_testkit::model::Seen) -> Reply {
    if req.body.get("response_format").is_some() {
        return ok(&green_answer());
    }
    if req.body.get("tools").is_some() && req.tool_rounds() == 0 {
        return Reply::Json(
            200,
            vec![],
            consort_testkit::model::tool_calls(&[("read_file", json!({"path": "src/stock.sql"}))]),
        );
    }
    ok("I read the file; the change looks right to me.")
}

#[tokio::test]
async fn on_a_server_whose_schema_wins_over_tools_the_tools_still_fire() {
    let (base, stub) = consort_testkit::model::start_answering(schema_wins).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(&base);
    cfg.transcript_dir = Some(dir.path().to_path_buf());
    cfg.tools.require_first = true;
    let mut a = assignment(1, "green/T1");
    a.tools = Some(Tools::new(Counting(Default::default())));
    let out = agent(Role::Driver, cfg).act(&a).await.expect("an answer");
    assert_eq!(out.artifact, expected_change_set());
    let seen = stub.seen();
    assert_eq!(
        seen.len(),
        4,
        "probe, tool round, prose, the answer by schema"
    );
    // The probe: a required call beside a schema, answered by the schema alone.
    assert_eq!(seen[0].body["tool_choice"], "required");
    assert_eq!(
        consort_agents::openai::learned_protocol(&base, "stub-model"),
        Some(consort_agents::ToolProtocol::Separate)
    );
    // Tool rounds go without the schema (the system prompt carries it), the first requiring a
    // call; the answer is asked for with the schema and without tools.
    for round in &seen[1..3] {
        assert!(round.body.get("response_format").is_none());
        assert!(round.body["tools"].is_array());
        assert!(
            round
                .content(0)
                .contains("The answer must match this JSON schema")
        );
    }
    assert_eq!(seen[1].body["tool_choice"], "required");
    assert!(seen[2].body.get("tool_choice").is_none());
    assert!(seen[3].body.get("response_format").is_some());
    assert!(seen[3].body.get("tools").is_none());
    assert_eq!(
        seen[3].tool_results(),
        vec!["src/stock.sql (12 bytes)\n-- the file\n"]
    );
    assert_eq!((out.usage.calls, out.usage.tool_calls), (4, 1));
    assert!(out.transcript.is_some(), "the tool call is kept");
}

#[tokio::test]
async fn a_cut_off_answer_is_fed_back_with_its_limit_which_is_raised_once() {
    let cut = json!({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant",
            "content": "{\"kind\": \"change-set\", \"body\": {\"summary\": \"stock"},
            "finish_reason": "length"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2048, "total_tokens": 2058}});
    let (base, stub) = start_stub(vec![Reply::Json(200, vec![], cut), ok(&green_answer())]).await;
    let out = green_from(&base, 40, "the second answer is whole").await;
    let seen = stub.seen();
    assert_eq!(seen[0].body["max_completion_tokens"], 2048);
    assert_eq!(seen[1].body["max_completion_tokens"], 4096, "raised once");
    let feedback = seen[1].content(seen[1].messages().len() - 1);
    assert!(
        feedback.contains("cut off at the token limit (2048 tokens)")
            && feedback.contains("the limit is now 4096 tokens"),
        "{feedback}"
    );
    assert_eq!(out.usage.finish_reasons.get("length"), Some(&1));
}

#[tokio::test]
async fn a_prompt_over_a_known_window_is_cut_to_fit_or_refused_with_its_size() {
    // The server says its window (9000 tokens), as llama.cpp's /props does: the whole prompt
    // does not fit, the prompt with the code listed does.
    let (base, stub) =
        consort_testkit::model::start_stub_with_window(vec![ok(&green_answer())], 9_000).await;
    let mut a = assignment(41, "green/T1");
    a.inputs
        .files
        .insert("src/big.sql".into(), "-- a large file\n".repeat(2_000));
    let mut cfg = config(&base);
    cfg.max_tokens = Some(1_000);
    let out = agent(Role::Driver, cfg).act(&a).await.expect("an answer");
    assert_eq!(out.artifact, expected_change_set());
    let step = stub.seen()[0]
        .content(stub.seen()[0].messages().len() - 1)
        .to_string();
    assert!(!step.contains("-- a large file"), "the code is not carried");
    assert!(
        step.contains("src/big.sql (32000 bytes)")
            && step.contains("left out to fit the model's context window"),
        "{step}"
    );
    // A window too small for what cannot be cut: no call, a typed failure with the sizes.
    let mut tiny = config(&base);
    tiny.context_tokens = Some(1_500);
    let (step, prompt_tokens, window, measured) =
        context_sizes(agent(Role::Driver, tiny).act(&a).await);
    assert_eq!((step.as_str(), window), ("green/T1", Some(1_500)));
    assert!(prompt_tokens > 1_500, "{prompt_tokens}");
    assert_eq!(measured, ContextMeasure::Estimated);
    assert_eq!(stub.requests(), 1, "the refused prompt was never sent");
}
