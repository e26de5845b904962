//! `--agents openai`: the StockFlow example with every role played through the real
//! OpenAI-compatible client, against a loopback chat-completions server whose "model" answers
//! each assignment from the StockFlow script. The whole path runs: HTTP, structured output,
//! parsing, validation, the conductor's rules, real branches, real psql runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use consort::actors::Artifact;
use consort::agents::Script;
use consort_testkit::model::{Reply, Seen, start_answering};
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
    let Some((role, step, attempt)) = req.asked() else {
        return refuse(400, "no assignment names its step");
    };
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

fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("profile dir")
        .join("examples")
        .join("stockflow")
}

#[test]
fn the_stockflow_ensemble_runs_on_the_openai_compatible_backend() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let script = Script::from_toml_str(consort::init::STOCKFLOW_SCRIPT).expect("script");
    let (base, model) = rt.block_on(start_answering(move |req| answer(&script, req)));
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("sf");
    let out = Command::new(example())
        .args(["--agents", "openai", "--approve-as", "ada", "--dir"])
        .arg(&dir)
        .env("CONSORT_OPENAI_BASE_URL", &base)
        .env("CONSORT_OPENAI_MODEL", "replay")
        .env("CONSORT_OPENAI_API_KEY", KEY)
        .env("CONSORT_LOG", "debug")
        .stdin(Stdio::null())
        .output()
        .expect("run the example");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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
    let ledger = std::fs::read_to_string(dir.join(".consort/ledger.jsonl")).expect("ledger");
    assert!(
        !text.contains(KEY),
        "the API key appears in the output or logs"
    );
    assert!(!ledger.contains(KEY), "the API key appears in the ledger");
}
