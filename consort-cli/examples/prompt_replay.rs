//! Measures what a real model would be sent: the StockFlow run with every role on the
//! OpenAI-compatible backend, against a loopback server that replays the recorded StockFlow
//! answers (`examples/stockflow/data/script.toml`) for whatever step each request asks.
//!
//! ```text
//! cargo run --example prompt_replay            # a table per request, then the totals
//! cargo run --example prompt_replay -- --csv   # one CSV line per request
//! cargo run --example prompt_replay -- --show green/T3   # also prints what that step was sent
//! ```
//!
//! The figures are characters of the messages sent (system and user turns), which is what a
//! server tokenises; the JSON schema sent as `response_format` and the tool definitions of
//! build steps are counted apart. BENCHMARKS.md
//! records them.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use consort::project::{Project, RunOptions};
use consort::{ApproveAs, RunLock, RunOutcome};
use consort_agents::{AgentConfig, OpenAiConfig, Script};
use consort_testkit::model::{Reply, Seen, error_body, ok, start_answering};
use serde_json::Value;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let csv = args.iter().any(|a| a == "--csv");
    let show = args
        .iter()
        .position(|a| a == "--show")
        .and_then(|i| args.get(i + 1).cloned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(replay(csv, show))
}

async fn replay(csv: bool, show: Option<String>) -> Result<()> {
    let script_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/stockflow/data/script.toml");
    let script = Script::from_path(&script_path)?;
    let (base, stub) = start_answering(move |seen| answer(&script, seen)).await;
    let dir = tempfile::tempdir()?;
    let lock = RunLock::acquire(dir.path(), "prompt replay")?;
    consort_cli::init::init(
        dir.path(),
        Some(consort_cli::init::Example::Stockflow),
        false,
    )?;
    let project = Project::open(dir.path())?;
    let mut model = OpenAiConfig::new(base, "replay");
    model.api_key_env = None;
    let opts = RunOptions {
        approver: Some(Arc::new(ApproveAs {
            name: "replay".into(),
        })),
        agents_override: Some(AgentConfig::Openai(model)),
        ..RunOptions::default()
    };
    let ensemble = project.ensemble_locked(lock, opts).await?;
    let result = ensemble.run().await;
    ensemble.shutdown().await;
    let report = result?;
    if !matches!(report.outcome, RunOutcome::Done) {
        bail!("the replayed run did not finish: {}", report.outcome);
    }
    let seen = stub.seen();
    let rows: Vec<Row> = seen.iter().map(Row::of).collect::<Result<_>>()?;
    if let Some(step) = show {
        for (row, request) in rows.iter().zip(&seen) {
            if row.step == step {
                for m in request.messages() {
                    let role = m.get("role").and_then(Value::as_str).unwrap_or("?");
                    let text = m.get("content").and_then(Value::as_str).unwrap_or("");
                    println!("── {role} ──\n{text}\n");
                }
            }
        }
    }
    print_rows(&rows, csv);
    Ok(())
}

/// The scripted answer to one request, found by the step and attempt its assignment names.
fn answer(script: &Script, seen: &Seen) -> Reply {
    match find_answer(script, seen) {
        Ok(text) => ok(&text),
        Err(e) => Reply::Json(400, vec![], error_body(&e.to_string())),
    }
}

fn find_answer(script: &Script, seen: &Seen) -> Result<String> {
    let (role, step, attempt) = seen.asked().context("no message names the step")?;
    let entry = script.lookup(role, &step, attempt)?;
    Ok(serde_json::to_string(&entry.artifact)?)
}

/// One request's figures.
struct Row {
    step: String,
    system: usize,
    user: usize,
    schema: usize,
    tools: usize,
}

impl Row {
    fn of(seen: &Seen) -> Result<Row> {
        let (_, step, _) = seen.asked().context("no message names the step")?;
        let (mut system, mut user) = (0, 0);
        for m in seen.messages() {
            let chars = m
                .get("content")
                .and_then(Value::as_str)
                .map_or(0, |t| t.chars().count());
            match m.get("role").and_then(Value::as_str) {
                Some("system") => system += chars,
                _ => user += chars,
            }
        }
        let schema = seen
            .body
            .get("response_format")
            .map_or(0, |f| f.to_string().chars().count());
        let tools = seen
            .body
            .get("tools")
            .map_or(0, |t| t.to_string().chars().count());
        Ok(Row {
            step: step.to_string(),
            system,
            user,
            schema,
            tools,
        })
    }

    fn prompt(&self) -> usize {
        self.system + self.user
    }

    fn is_build(&self) -> bool {
        ["red/", "green/", "refactor/", "review/"]
            .iter()
            .any(|p| self.step.starts_with(p))
    }
}

/// One line of the table: `cells` comma-separated for CSV, else in aligned columns.
fn table_line(cells: [String; 6], csv: bool) -> String {
    if csv {
        return cells.join(",");
    }
    let [step, numbers @ ..] = cells;
    let mut line = format!("{step:<18}");
    for n in numbers {
        line.push_str(&format!(" {n:>8}"));
    }
    line
}

fn print_rows(rows: &[Row], csv: bool) {
    let header = if csv {
        "step,system_chars,user_chars,prompt_chars,schema_chars,tools_chars".to_string()
    } else {
        table_line(
            ["step", "system", "user", "prompt", "schema", "tools"].map(String::from),
            false,
        )
    };
    println!("{header}");
    for r in rows {
        let [system, user, prompt, schema, tools] =
            [r.system, r.user, r.prompt(), r.schema, r.tools].map(|n| n.to_string());
        let cells = [r.step.clone(), system, user, prompt, schema, tools];
        println!("{}", table_line(cells, csv));
    }
    if csv {
        return;
    }
    let total: usize = rows.iter().map(Row::prompt).sum();
    let schema: usize = rows.iter().map(|r| r.schema).sum();
    let tools: usize = rows.iter().map(|r| r.tools).sum();
    println!(
        "\n{} requests; prompt characters {total} in total (sent apart: response schemas {schema}, tool definitions {tools})",
        rows.len()
    );
    let mut build = rows.iter().filter(|r| r.is_build());
    if let Some(first) = build.next() {
        let largest = rows
            .iter()
            .filter(|r| r.is_build())
            .max_by_key(|r| r.prompt())
            .unwrap_or(first);
        println!(
            "first build step {} {} chars; largest {} {} chars ({:.2}x the first)",
            first.step,
            first.prompt(),
            largest.step,
            largest.prompt(),
            largest.prompt() as f64 / first.prompt().max(1) as f64
        );
    }
}
