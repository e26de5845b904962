//! `consort run --agents openai` against a real model on a real server: llama.cpp's own
//! server (`xllamacpp` from PyPI) with Gemma 3 270M (from PyPI), started by the test, as the
//! suite starts PostgreSQL.
//!
//! The model is tiny and the test asserts mechanics only: the run reaches a typed outcome (a
//! halt with its reason, or the design gate) within its limits, the server's usage is in the
//! ledger, the spend cap holds, and the key is written nowhere.

mod common;

use std::path::Path;
use std::sync::OnceLock;

use common::{consort, run, stockflow_tempdir};
use consort_testkit::llama::{LlamaServer, MODEL};
use consort_testkit::process::text;
use serde_json::Value;

const KEY: &str = "sk-consort-real-model-9c41e7";
/// The run's token budget: about two calls of the design lane, so the cap is met.
const RUN_TOKENS: u64 = 3_000;

/// One server for the binary's tests (two would share two cores); it stops with the process,
/// whose end closes the launcher's input.
fn server() -> &'static LlamaServer {
    static SERVER: OnceLock<LlamaServer> = OnceLock::new();
    SERVER.get_or_init(|| LlamaServer::start(16_384, 256).expect("llama.cpp's server starts"))
}

fn status_json(dir: &Path) -> Value {
    let o = run(consort().args(["status", "--json", "--dir"]).arg(dir));
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).expect("status is JSON")
}

/// Every file under `dir`, as text, for a search for the key.
fn all_text(dir: &Path) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.ends_with(".git") && !p.ends_with("cluster") {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                out.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }
    out
}

#[test]
fn agents_openai_on_llama_cpp_reaches_a_typed_outcome_within_its_budget() {
    let server = server();
    let tmp = stockflow_tempdir();
    let dir = tmp.path();
    let config = dir.join("consort.toml");
    let text_config = std::fs::read_to_string(&config).expect("config");
    let text_config = text_config.replace("step_timeout_secs = 600", "step_timeout_secs = 300");
    std::fs::write(
        &config,
        format!("{text_config}\n[budget]\ntokens = {RUN_TOKENS}\n"),
    )
    .expect("write config");
    let started = std::time::Instant::now();
    let o = run(consort()
        .args(["run", "--agents", "openai", "--dir"])
        .arg(dir)
        .env("CONSORT_OPENAI_BASE_URL", server.base_url())
        .env("CONSORT_OPENAI_MODEL", MODEL)
        .env("CONSORT_OPENAI_API_KEY", KEY)
        .env("CONSORT_LOG", "debug"));
    let out = text(&o);
    eprintln!("{}", &out[out.len().saturating_sub(1500)..]);
    // A typed outcome: halted with a reason (4) or stopped at the design gate (3).
    let code = o.status.code();
    assert!(matches!(code, Some(3 | 4)), "exit {code:?}: {out}");
    let s = status_json(dir);
    if code == Some(4) {
        let reason = s["halted"]["reason"].as_str().unwrap_or_default();
        assert!(
            [
                "budget-spent",
                "invalid-output",
                "model-server-failing",
                "context-window-too-small",
                "timeout",
            ]
            .contains(&reason),
            "a typed halt: {s}"
        );
    }
    // The server's usage is in the ledger; the cap held (a call is checked before it is made,
    // so at most the last call's overshoot of its estimate is over).
    let total = &s["usage"]["total"];
    let tokens = total["prompt_tokens"].as_u64().unwrap_or(0)
        + total["completion_tokens"].as_u64().unwrap_or(0);
    assert!(total["calls"].as_u64().unwrap_or(0) >= 1, "{s}");
    assert!(total["prompt_tokens"].as_u64().unwrap_or(0) > 0, "{s}");
    assert!(
        tokens <= RUN_TOKENS + 2_000,
        "{tokens} tokens spent against a budget of {RUN_TOKENS}: {s}"
    );
    // The figures BENCHMARKS.md reports for the real model.
    let wall = started.elapsed().as_secs_f64();
    let outcome = s["halted"]["reason"].as_str().unwrap_or("design gate");
    eprintln!(
        "real-model figures: {} requests, {} prompt + {} completion tokens (server usage), \
         run {wall:.0} s, {:.0} tokens/s over the run, outcome: {outcome}",
        total["calls"],
        total["prompt_tokens"],
        total["completion_tokens"],
        tokens as f64 / wall
    );
    // The key is nowhere: not in the output or logs, the ledger, transcripts or the tree.
    assert!(!out.contains(KEY), "the key is in the output");
    assert!(!all_text(dir).contains(KEY), "the key is in the project");
}

/// Sets the driver's backend to the OpenAI-compatible model `model` at `base`.
fn driver_on(dir: &Path, base: &str, model: &str) {
    let config = dir.join("consort.toml");
    let text = std::fs::read_to_string(&config).expect("config");
    let kept = text
        .split("\n[agents.roles.driver]\n")
        .next()
        .unwrap_or_default();
    std::fs::write(
        &config,
        format!(
            "{kept}\n[agents.roles.driver]\nbackend = \"openai\"\nbase_url = \"{base}\"\n\
             model = \"{model}\"\napi_key_env = \"CONSORT_OPENAI_API_KEY\"\n"
        ),
    )
    .expect("write config");
}

fn doctor(dir: &Path) -> String {
    text(&run(consort()
        .args(["doctor", "--dir"])
        .arg(dir)
        .env("CONSORT_OPENAI_API_KEY", KEY)))
}

#[test]
fn doctor_asks_the_model_server_for_its_models_and_context_window() {
    let server = server();
    let tmp = stockflow_tempdir();
    let dir = tmp.path();
    let base = server.base_url();
    let mut out = String::new();
    for (base, model, says) in [
        (
            base,
            MODEL,
            vec![
                format!("ok    model server {base} answers and lists {MODEL}"),
                format!("ok    context window of {MODEL}: 16384 tokens (the server says)"),
            ],
        ),
        // A model the server does not serve: the fix names the ones it does.
        (
            base,
            "gemma-7b",
            vec![
                format!("FAIL  model server {base} answers and lists gemma-7b"),
                MODEL.to_string(),
            ],
        ),
        // No server at all.
        (
            "http://127.0.0.1:9/v1",
            MODEL,
            vec!["FAIL  model server http://127.0.0.1:9/v1: no answer at".to_string()],
        ),
    ] {
        driver_on(dir, base, model);
        out = doctor(dir);
        for said in says {
            assert!(out.contains(&said), "{model} at {base}: {said}: {out}");
        }
    }
    assert!(!out.contains(KEY), "the key is not printed: {out}");
}
