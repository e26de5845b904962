//! The OpenAI-compatible backend against a real server with a real model: llama.cpp's own
//! server (`xllamacpp` from PyPI) with Gemma 3 270M (from PyPI), started by the test.
//!
//! The model is tiny: these tests assert mechanics (tool calls fire and are answered and kept,
//! usage comes from the server, every call ends in an answer or a typed failure), never that
//! the model is right.

use std::collections::BTreeMap;
use std::sync::Arc;

use consort_actors::workbench::{Advice, FileText, Hits, Listing, ToolError, Tools, Workbench};
use consort_actors::{AgentFailure, ChangeSet, TestEntry};
use consort_agents::{Agent, HttpPolicy, OpenAiAgent, OpenAiConfig, ToolProtocol};
use consort_testkit::artifacts::assignment;
use consort_testkit::llama::{LlamaServer, MODEL};

/// A project of three files, read from memory.
struct Files(BTreeMap<String, String>);

impl Workbench for Files {
    fn read(&self, path: &str) -> Result<FileText, ToolError> {
        let text = self
            .0
            .get(path)
            .cloned()
            .ok_or_else(|| ToolError::NotFound { path: path.into() })?;
        Ok(FileText {
            path: path.into(),
            bytes: text.len() as u64,
            text,
            truncated: false,
        })
    }

    fn list(&self, _: Option<&str>) -> Result<Listing, ToolError> {
        Ok(Listing {
            files: self
                .0
                .iter()
                .map(|(p, t)| (p.clone(), t.len() as u64))
                .collect(),
            more: 0,
        })
    }

    fn search(&self, _: &str, _: Option<&str>) -> Result<Hits, ToolError> {
        Ok(Hits::default())
    }

    fn try_change(&self, _: ChangeSet) -> consort_actors::BoxFuture<'_, Result<Advice, ToolError>> {
        Box::pin(async {
            Ok(Advice {
                would_pass: false,
                verdict: "the expected test still fails".into(),
                outcomes: Vec::new(),
                runs_left: 0,
            })
        })
    }
}

fn config(server: &LlamaServer, transcripts: &std::path::Path) -> OpenAiConfig {
    let mut cfg = OpenAiConfig::new(server.base_url(), MODEL);
    cfg.api_key_env = None;
    cfg.temperature = Some(0.0);
    cfg.max_tokens = Some(160);
    cfg.output_retries = 1;
    cfg.tools.max_rounds = 2;
    cfg.tools.require_first = true;
    cfg.transcript_dir = Some(transcripts.to_path_buf());
    cfg.http = HttpPolicy {
        max_retries: 1,
        request_timeout_secs: 240,
        ..HttpPolicy::default()
    };
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_step_with_tool_calls_runs_through_llama_cpp() {
    let server = LlamaServer::start(8192, 256).expect("llama.cpp's server starts");
    let transcripts = tempfile::tempdir().expect("tempdir");
    let files: BTreeMap<String, String> = [
        (
            "tests/t1.sql",
            "select plan(1);\nselect has_table('stock');\n",
        ),
        ("src/stock.sql", "-- the stock table goes here\n"),
        ("README.md", "StockFlow keeps stock levels.\n"),
    ]
    .into_iter()
    .map(|(p, t)| (p.to_string(), t.to_string()))
    .collect();
    let mut a = assignment(1, "green/T1");
    a.inputs.test = Some(TestEntry {
        id: "T1".into(),
        ac_id: "S1-AC1".into(),
        description: "a stock table exists".into(),
        path: "tests/t1.sql".into(),
        test_name: None,
    });
    a.inputs.files = files.clone();
    a.tools = Some(Tools::new(Arc::new(Files(files))));
    let agent = OpenAiAgent::new(
        consort_actors::Role::Driver,
        config(&server, transcripts.path()),
    )
    .expect("agent");
    let result = agent.act(&a).await;
    // The answer is the model's business; how it ended is typed either way.
    let usage = match &result {
        Ok(out) => out.usage.clone(),
        Err(f @ (AgentFailure::InvalidOutput { .. } | AgentFailure::ModelUnavailable { .. })) => {
            eprintln!("the step ended with a typed failure: {f}");
            f.usage()
        }
        Err(other) => panic!("an unexpected failure: {other}"),
    };
    // Tools fired on a server whose schema wins over tools: the tool rounds went without it.
    let kept = std::fs::read_to_string(transcripts.path().join("green_T1-0.tools.json"))
        .expect("a transcript of the tool calls");
    let transcript: serde_json::Value = serde_json::from_str(&kept).expect("JSON");
    let exchanges = transcript["exchanges"].as_array().expect("exchanges");
    assert!(!exchanges.is_empty(), "at least one tool call: {kept}");
    assert!(
        exchanges
            .iter()
            .all(|e| e["result"].as_str().is_some_and(|r| !r.is_empty())),
        "every call was answered: {kept}"
    );
    assert_eq!(
        consort_agents::openai::learned_protocol(server.base_url(), MODEL),
        Some(ToolProtocol::Separate),
        "llama.cpp applies the schema and drops the tools: detected, not assumed"
    );
    eprintln!("usage: {usage:?}\ntranscript: {kept}");
    if !matches!(result, Err(AgentFailure::ModelUnavailable { .. })) {
        assert!(usage.prompt_tokens > 0, "usage from the server: {usage:?}");
        assert!(usage.tool_calls >= 1, "{usage:?}");
        assert_eq!(usage.model.as_deref(), Some(MODEL));
    }
}
