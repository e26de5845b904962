//! `--agents openai`: the StockFlow example with every role played through the real
//! OpenAI-compatible client, against a loopback chat-completions server whose "model" answers
//! each assignment from the StockFlow script. The whole path runs: HTTP, structured output,
//! parsing, validation, the conductor's rules, real branches, real psql runs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use consort::actors::{Artifact, Role, Step};
use consort::agents::Script;
use serde_json::{Value, json};

const KEY: &str = "sk-consort-test-7f3a9c2e51d8";

#[derive(Clone)]
struct Model {
    script: Script,
    calls: Arc<AtomicUsize>,
}

/// The body of an artifact, as the model is asked to answer it.
fn body(artifact: &Artifact) -> Value {
    serde_json::to_value(artifact)
        .ok()
        .and_then(|v| v.get("body").cloned())
        .unwrap_or(Value::Null)
}

async fn chat(
    State(model): State<Model>,
    headers: HeaderMap,
    Json(req): Json<Value>,
) -> (StatusCode, Json<Value>) {
    model.calls.fetch_add(1, Ordering::SeqCst);
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {KEY}"))
    {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": {"message": "bad key"}})),
        );
    }
    let assignment: Option<Value> = req["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .and_then(|t| serde_json::from_str(t).ok());
    let Some(a) = assignment else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": {"message": "no assignment"}})),
        );
    };
    let step = a["step"].as_str().and_then(|s| Step::from_str(s).ok());
    let role = a["role"].as_str().and_then(|s| Role::from_str(s).ok());
    let attempt = a["attempt"].as_u64().unwrap_or(0) as u32;
    let (Some(step), Some(role)) = (step, role) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": {"message": "no step"}})),
        );
    };
    let content = match model.script.lookup(role, &step, attempt) {
        Ok(entry) => body(&entry.artifact).to_string(),
        Err(e) => format!("I cannot answer {step}: {e}"),
    };
    // A "compatible" server: no id, no usage.
    (
        StatusCode::OK,
        Json(json!({
            "id": null,
            "object": "chat.completion",
            "created": 0,
            "model": "replay",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]
        })),
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
    let model = Model {
        script,
        calls: Arc::new(AtomicUsize::new(0)),
    };
    let calls = model.calls.clone();
    let addr: SocketAddr = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(chat))
            .with_state(model);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        addr
    });
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("sf");
    let out = Command::new(example())
        .args(["--agents", "openai", "--approve-as", "ada", "--dir"])
        .arg(&dir)
        .env("CONSORT_OPENAI_BASE_URL", format!("http://{addr}/v1"))
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
        calls.load(Ordering::SeqCst) >= 40,
        "every step went through the model server"
    );
    let ledger = std::fs::read_to_string(dir.join(".consort/ledger.jsonl")).expect("ledger");
    assert!(
        !text.contains(KEY),
        "the API key appears in the output or logs"
    );
    assert!(!ledger.contains(KEY), "the API key appears in the ledger");
}
