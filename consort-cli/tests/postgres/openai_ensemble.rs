//! `--agents openai`: the StockFlow example with every role played through the real
//! OpenAI-compatible client, against a loopback chat-completions server whose "model" answers
//! each assignment from the StockFlow script. The whole path runs: HTTP, structured output,
//! parsing, validation, the conductor's rules, real branches, real psql runs.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::ledger_text;
use consort::actors::Artifact;
use consort::actors::Step;
use consort::agents::Script;
use consort_testkit::assert::assert_each;
use consort_testkit::model::{Reply, Seen, start_answering, tool_calls};
use consort_testkit::process::built_example;
use serde_json::{Value, json};

const KEY: &str = "sk-consort-test-7f3a9c2e51d8";

/// The body of an artifact, as the model is asked to answer it.
fn body(artifact: &Artifact) -> Value {
    serde_json::to_value(artifact)
        .ok()
        .and_then(|v| v.get("body").cloned())
        .unwrap_or(Value::Null)
}

fn refuse(status: u16, message: &str) -> Reply {
    Reply::Json(status, vec![], json!({"error": {"message": message}}))
}

/// The "model": answers each assignment from the StockFlow script.
fn answer(script: &Script, req: &Seen) -> Reply {
    if req.authorization.as_deref() != Some(&format!("Bearer {KEY}")) {
        return refuse(401, "bad key");
    }
    // A server that honours `tool_choice: "required"` beside a schema, as OpenAI does: the
    // backend's probe learns that tools and structured output go together here.
    if req.body["tool_choice"] == "required"
        && let Some(name) = req.body["tools"][0]["function"]["name"].as_str()
    {
        return Reply::Json(200, vec![], tool_calls(&[(name, json!({}))]));
    }
    let Some((role, step, attempt)) = req.asked() else {
        return refuse(400, "no assignment names its step");
    };
    if attempt == 0
        && let Some(reply) = explore(script, req, &step)
    {
        return reply;
    }
    let content = match script.lookup(role, &step, attempt) {
        Ok(entry) => body(&entry.artifact).to_string(),
        Err(e) => format!("I cannot answer {step}: {e}"),
    };
    // A "compatible" server: no id, no usage.
    Reply::Json(
        200,
        vec![],
        json!({
            "id": null,
            "object": "chat.completion",
            "created": 0,
            "model": "replay",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]
        }),
    )
}

/// The test file of T1, which RED writes.
const T1_TEST: &str = "tests/s1_01_file_new_stock.sql";

/// At red/T1 and green/T1 the "model" uses its tools before it answers, as a model finding its
/// way around a project would, and tries what an agent should not get away with: reading
/// outside the tree or Consort's ledger, and trying a change that touches a frozen test.
fn explore(script: &Script, req: &Seen, step: &Step) -> Option<Reply> {
    let scripted = |s: &Step| {
        script
            .lookup(s.role(), s, 0)
            .map(|e| body(&e.artifact))
            .unwrap_or(Value::Null)
    };
    let calls: Vec<(&str, Value)> = match (step.to_string().as_str(), req.tool_rounds()) {
        ("red/T1", 0) => vec![
            ("list_files", json!({"glob": null})),
            ("run_tests", json!({"change_set": scripted(step)})),
        ],
        ("green/T1", 0) => vec![
            ("read_file", json!({"path": T1_TEST})),
            ("search", json!({"text": "S1-AC1", "glob": "tests/**"})),
            ("read_file", json!({"path": "../outside.txt"})),
            ("read_file", json!({"path": ".consort/ledger.jsonl"})),
            (
                "run_tests",
                json!({"change_set": {"summary": "nothing yet", "changes": []}}),
            ),
            (
                "run_tests",
                json!({"change_set": {"summary": "weaken the test", "changes": [
                    {"op": "write", "path": T1_TEST, "content": "select 1;\n"}
                ]}}),
            ),
        ],
        ("green/T1", 1) => vec![("run_tests", json!({"change_set": scripted(step)}))],
        _ => return None,
    };
    Some(Reply::Json(200, vec![], tool_calls(&calls)))
}

/// What the tools answered, from the last request of `step`'s first attempt.
fn tool_results(seen: &[Seen], step: &str) -> Vec<String> {
    seen.iter()
        .rev()
        .find(|s| {
            s.asked()
                .is_some_and(|(_, st, a)| st.to_string() == step && a == 0)
        })
        .map(Seen::tool_results)
        .unwrap_or_default()
}

/// The tools worked as a model would use them, their results were advice only, and every call
/// is in a transcript whose hash the ledger keeps.
fn assert_tools_used(dir: &Path, seen: &[Seen], ledger: &str) {
    assert_each(
        &tool_results(seen, "red/T1"),
        &[
            ("list_files", &|t| t.contains("feature.md (")),
            ("the scratch RED", &|t| {
                t.contains("would accept") && t.contains("a real RED")
            }),
        ],
    );
    assert_each(
        &tool_results(seen, "green/T1"),
        &[
            ("read_file", &|t| t.contains("S1-AC1: filing a new")),
            ("search", &|t| t.contains(&format!("{T1_TEST}:1:"))),
            ("outside", &|t| t.starts_with("error: ../outside.txt")),
            ("ledger", &|t| t.contains("inside .consort/")),
            ("no code yet", &|t| t.contains("would not accept")),
            ("a frozen test", &|t| {
                t.contains("would be refused, so it did not run")
            }),
            ("the scripted GREEN", &|t| {
                t.contains("would accept") && t.contains("Scratch runs left: 1")
            }),
        ],
    );
    let events: Vec<Value> = ledger
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|e| e["event"].clone())
        .collect();
    // No scratch run is a receipt: every receipt answers one of the run's own requests.
    for e in events.iter().filter(|e| e["event"] == "verify-completed") {
        let id = e["receipt"]["request_id"].as_u64().expect("request id");
        assert!(
            id < 1 << 62,
            "a scratch run's receipt reached the ledger: {e}"
        );
    }
    let kept: Vec<&Value> = events.iter().filter_map(|e| e.get("transcript")).collect();
    assert_eq!(
        kept.len(),
        2,
        "red/T1 and green/T1 keep transcripts: {kept:?}"
    );
    for t in kept {
        let name = t["path"].as_str().expect("transcript name");
        let bytes = std::fs::read(
            consort::project::Project::open(dir)
                .expect("project")
                .transcript_dir()
                .join(name),
        )
        .expect("transcript");
        let hash = consort::actors::ContentHash::of_bytes(&bytes).to_hex();
        assert_eq!(t["hash"].as_str(), Some(hash.as_str()), "{name}");
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("run_tests"), "{name}: {text}");
    }
}

#[test]
fn the_stockflow_ensemble_runs_on_the_openai_compatible_backend() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let script = Script::from_toml_str(consort_cli::init::STOCKFLOW_SCRIPT).expect("script");
    let (base, model) = rt.block_on(start_answering(move |req| answer(&script, req)));
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("sf");
    let out = Command::new(built_example("stockflow"))
        .args(["--agents", "openai", "--approve-as", "ada", "--dir"])
        .arg(&dir)
        .env("CONSORT_OPENAI_BASE_URL", &base)
        .env("CONSORT_OPENAI_MODEL", "replay")
        .env("CONSORT_OPENAI_API_KEY", KEY)
        .env("CONSORT_LOG", "debug")
        .stdin(Stdio::null())
        .output()
        .expect("run the example");
    let text = consort_testkit::process::text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        &text[text.len().saturating_sub(4000)..]
    );
    assert!(
        text.contains("10 of 10 green"),
        "{}",
        &text[text.len().saturating_sub(2000)..]
    );
    assert!(
        model.requests() >= 40,
        "every step went through the model server"
    );
    // The context packs keep the prompts small: before them this run sent 1,151,933 characters
    // of messages (examples/prompt_replay prints the figures per step; BENCHMARKS.md has them).
    let chars: usize = model.seen().iter().map(|s| s.prompt_chars()).sum();
    assert!(
        chars <= 460_000,
        "the run sent {chars} characters of prompt, more than 40 % of the 1,151,933 sent before the context packs"
    );
    let ledger = ledger_text(&dir);
    assert!(
        !text.contains(KEY),
        "the API key appears in the output or logs"
    );
    assert!(!ledger.contains(KEY), "the API key appears in the ledger");
    assert_tools_used(&dir, &model.seen(), &ledger);
}
