//! Usage and budgets end to end: the `consort` program with every role on the OpenAI-compatible
//! backend (`--agents openai`), against a loopback chat-completions server that answers each
//! assignment from the StockFlow script and reports usage for every call. The usage lands in
//! the ledger and shows in `consort status --json`, `consort log` and the summary; a budget is
//! checked before every call, a spent one halts the run with the typed `budget-spent` reason,
//! and a resumed run continues from what the ledger says was spent.

use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use crate::common::status_json;
use crate::common::{assert_halted, consort, ledger_text, run};
use consort::actors::Artifact;
use consort::agents::Script;
use consort_testkit::model::{Reply, Seen, Stub, start_answering};
use consort_testkit::process::text;
use serde_json::{Value, json};

const KEY: &str = "sk-consort-budget-test-51d8";
/// Every call "costs" this much: 100000 prompt tokens (10000 of them cached) and 20000
/// completion; far more than any prompt's estimate, so the tests do not depend on prompt sizes.
const PER_CALL: u64 = 120_000;

/// The "model": the StockFlow script's answer to the assignment, with usage.
fn answer(script: &Script, req: &Seen) -> Reply {
    let content = match req.asked() {
        Some((role, step, attempt)) => match script.lookup(role, &step, attempt) {
            Ok(entry) => body(&entry.artifact).to_string(),
            Err(e) => format!("I cannot answer {step}: {e}"),
        },
        None => "no step".to_string(),
    };
    Reply::Json(
        200,
        vec![],
        json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "replay",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100_000, "completion_tokens": 20_000, "total_tokens": 120_000,
                      "prompt_tokens_details": {"cached_tokens": 10_000}}
        }),
    )
}

fn body(artifact: &Artifact) -> Value {
    serde_json::to_value(artifact)
        .ok()
        .and_then(|v| v.get("body").cloned())
        .unwrap_or(Value::Null)
}

/// A StockFlow project and a model server for it.
fn project() -> (
    tempfile::TempDir,
    tokio::runtime::Runtime,
    String,
    Arc<Stub>,
) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let script = Script::from_toml_str(consort_cli::init::STOCKFLOW_SCRIPT).expect("script");
    let (base, model) = rt.block_on(start_answering(move |req| answer(&script, req)));
    let tmp = tempfile::tempdir().expect("tempdir");
    let o = run(consort()
        .arg("init")
        .arg(tmp.path())
        .args(["--example", "stockflow"]));
    assert!(o.status.success(), "{}", text(&o));
    (tmp, rt, base, model)
}

fn run_openai(dir: &Path, base: &str) -> Output {
    run(consort()
        .args(["run", "--agents", "openai", "--dir"])
        .arg(dir)
        .env("CONSORT_OPENAI_BASE_URL", base)
        .env("CONSORT_OPENAI_MODEL", "replay")
        .env("CONSORT_OPENAI_API_KEY", KEY))
}

fn set_budget(dir: &Path, table: &str) {
    let path = dir.join("consort.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    let kept = text
        .split("\n[budget]\n")
        .next()
        .unwrap_or_default()
        .to_string();
    std::fs::write(&path, format!("{kept}\n[budget]\n{table}\n")).expect("write config");
}

#[test]
fn agents_openai_starts_with_default_budgets_and_usage_is_recorded_and_shown() {
    let (tmp, _rt, base, model) = project();
    let dir = tmp.path();
    let o = run_openai(dir, &base);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(3), "stops at the design gate: {out}");
    assert!(
        out.contains("budgets (the defaults of --agents openai"),
        "the defaults are printed: {out}"
    );
    assert!(out.contains("run: 2000000 tokens, 7200 s"), "{out}");
    assert!(out.contains("each role: 800000 tokens"), "{out}");
    let calls = model.requests() as u64;
    assert!(calls >= 5, "the design lane went through the model");
    // The summary shows the usage in total and per role.
    let total = format!("usage:     total: {} tokens", calls * PER_CALL);
    assert!(out.contains(&total), "{total} in {out}");
    assert!(
        out.contains("usage:     product-owner: 120000 tokens"),
        "{out}"
    );
    // status --json: per role and in total, from the ledger.
    let s = status_json(dir);
    let usage = &s["usage"];
    assert_eq!(usage["total"]["prompt_tokens"], json!(calls * 100_000));
    assert_eq!(usage["total"]["cached_tokens"], json!(calls * 10_000));
    assert_eq!(usage["total"]["completion_tokens"], json!(calls * 20_000));
    assert_eq!(usage["total"]["calls"], json!(calls));
    assert_eq!(
        usage["roles"]["spec-author"]["prompt_tokens"],
        json!(100_000)
    );
    // consort log: each answer's usage, and the totals at the end.
    let o = run(consort().args(["log", "--dir"]).arg(dir));
    let log = String::from_utf8_lossy(&o.stdout);
    assert!(
        log.contains("· 120000 tokens (100000 prompt, 10000 cached, 20000 completion), 1 call"),
        "{log}"
    );
    assert!(log.contains("(replay)"), "the model is named: {log}");
    assert!(
        log.contains(&format!("usage: total: {} tokens", calls * PER_CALL)),
        "{log}"
    );
    // The ledger line records it.
    let ledger = ledger_text(dir);
    assert!(ledger.contains("\"usage\":{\"cached_tokens\":10000,\"calls\":1,"));
}

#[test]
fn a_spent_budget_halts_before_the_call_and_a_resumed_run_keeps_what_was_spent() {
    let (tmp, _rt, base, model) = project();
    let dir = tmp.path();
    // Three calls fit; after them 1000 tokens are left, less than the fourth call's prompt
    // alone is estimated at (the schema step gets the stories, the spec and the architecture
    // verdict), so it is not made.
    set_budget(dir, "tokens = 361000");
    let o = run_openai(dir, &base);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(4), "halted: {out}");
    assert!(out.contains("budgets (from consort.toml):"), "{out}");
    assert!(out.contains("run: 361000 tokens"), "{out}");
    assert_eq!(model.requests(), 3, "no call past the budget: {out}");
    assert!(out.contains("budget spent: run tokens"), "{out}");
    let s = status_json(dir);
    assert_halted(
        &s["halted"],
        "budget",
        "budget-spent",
        "run tokens: 360000 of 361000 spent, the next call needs",
    );
    assert_eq!(s["halted"]["budget"], "run tokens");
    assert_eq!(s["usage"]["total"]["calls"], json!(3));
    assert_eq!(s["usage"]["total"]["prompt_tokens"], json!(300_000));
    // Resumed with a budget that is now spent exactly: the conductor refuses before it
    // assigns, from the amount in the ledger (not from zero), and no request is made.
    set_budget(dir, "tokens = 360000");
    let o = run(consort().args(["retry", "--by", "ada", "--dir"]).arg(dir));
    assert!(o.status.success(), "{}", text(&o));
    let o = run_openai(dir, &base);
    assert_eq!(o.status.code(), Some(4), "halted again: {}", text(&o));
    assert_eq!(model.requests(), 3, "the resumed run made no call");
    let s = status_json(dir);
    assert_halted(
        &s["halted"],
        "budget",
        "budget-spent",
        "run tokens: 360000 of 360000 spent",
    );
    // A per-role budget names the role.
    set_budget(dir, "tokens = 10000000\n[budget.roles.dba]\ntokens = 100");
    let o = run(consort().args(["retry", "--by", "ada", "--dir"]).arg(dir));
    assert!(o.status.success(), "{}", text(&o));
    let o = run_openai(dir, &base);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert_eq!(model.requests(), 3);
    assert_eq!(status_json(dir)["halted"]["budget"], "dba tokens");
}
