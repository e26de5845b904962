//! Runs a coding-agent CLI preset for real, against a model server on loopback, for one GREEN
//! and one REVIEW step, and prints what Consort took from it (the README's "Coding-agent CLIs"
//! records the results). Not a test: the CLIs are optional installs.
//!
//! ```sh
//! # aider: the test kit's OpenAI-compatible stub is started here.
//! cargo run -p consort-agents --example real_cli -- aider /path/to/aider
//! # codex (Responses API) and claude-code (Messages API): start the stub first.
//! python3 consort-agents/examples/real_cli_stubs.py responses 18777 &
//! cargo run -p consort-agents --example real_cli -- codex /path/to/codex http://127.0.0.1:18777/v1
//! python3 consort-agents/examples/real_cli_stubs.py messages 18778 &
//! cargo run -p consort-agents --example real_cli -- claude-code /path/to/claude http://127.0.0.1:18778
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use consort_actors::{Artifact, Assignment, Role};
use consort_agents::{CommandConfig, ExternalCommandAgent, Preset};
use consort_testkit::artifacts::assignment;
use consort_testkit::model::{ok, start_answering};

const VERDICT: &str =
    r#"{"kind": "review-verdict", "body": {"decision": "approve", "notes": ["fine"]}}"#;

fn step(id: u64, key: &str, content: &str) -> Assignment {
    let mut a = assignment(id, key);
    a.inputs.files = BTreeMap::from([("src/stock.sql".to_string(), content.to_string())]);
    a
}

/// The configuration for `preset` running `program` against `url`, with a private HOME.
fn config(preset: Preset, program: &str, url: &str, home: &str) -> CommandConfig {
    let mut cfg = CommandConfig::preset(preset).with_timeout(Duration::from_secs(300));
    cfg.program = program.to_string();
    cfg.pass_env = vec!["PATH".into()];
    let env = &mut cfg.env_set;
    env.insert("HOME".into(), home.into());
    match preset {
        Preset::Aider => {
            cfg.args = ["--model", "openai/local", "--edit-format", "whole"]
                .map(String::from)
                .to_vec();
            env.insert("OPENAI_API_BASE".into(), url.into());
            env.insert("OPENAI_API_KEY".into(), "local".into());
            env.insert("LITELLM_LOCAL_MODEL_COST_MAP".into(), "True".into());
            if let Ok(p) = std::env::var("PYTHONPATH") {
                env.insert("PYTHONPATH".into(), p);
            }
        }
        Preset::Codex => {
            let provider = format!(
                "model_providers.local={{name=\"local\",base_url=\"{url}\",wire_api=\"responses\"}}"
            );
            cfg.args = vec![
                "-m".into(),
                "local".into(),
                "-c".into(),
                "model_provider=local".into(),
                "-c".into(),
                provider,
            ];
            env.insert("CODEX_HOME".into(), format!("{home}/.codex"));
            env.insert("OPENAI_API_KEY".into(), "local".into());
        }
        _ => {
            env.insert("ANTHROPIC_BASE_URL".into(), url.into());
            env.insert("ANTHROPIC_API_KEY".into(), "local".into());
            env.insert(
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
                "1".into(),
            );
        }
    }
    cfg
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [preset, program, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: real_cli <aider|codex|claude-code> <program> [model server url]".into(),
        );
    };
    let preset: Preset = serde_json::from_value(serde_json::Value::String(preset.clone()))?;
    let (url, _stub) = match rest.first() {
        Some(url) => (url.clone(), None),
        None => {
            let (url, stub) = start_answering(|seen| {
                if seen.body.to_string().contains("review-verdict") {
                    ok(VERDICT)
                } else {
                    ok("src/stock.sql\n```\nselect quantity from stock_records;\n```\n")
                }
            })
            .await;
            (url, Some(stub))
        }
    };
    let home = tempfile::tempdir()?;
    std::fs::create_dir_all(home.path().join(".codex"))?;
    let transcripts = tempfile::tempdir()?;
    let mut cfg = config(preset, program, &url, &home.path().display().to_string());
    cfg.transcript_dir = Some(transcripts.path().to_path_buf());
    let green = step(1, "green/T1", "select 1;\n");
    let review = step(2, "review/T1/0", "select quantity from stock_records;\n");
    for (role, a) in [(Role::Driver, green), (Role::Navigator, review)] {
        let out = ExternalCommandAgent::new(role, cfg.clone()).run(&a).await;
        match out {
            Ok(out) => match out.artifact {
                Artifact::ChangeSet(cs) => {
                    for c in &cs.changes {
                        println!("{}: change {}", a.step, c.path());
                    }
                }
                other => println!("{}: {}", a.step, serde_json::to_string(&other)?),
            },
            Err(e) => println!("{}: failed: {e}", a.step),
        }
        let path = cfg.transcript_path(&a).ok_or("no transcript directory")?;
        let t = std::fs::read_to_string(&path)?;
        let from = t.find("--- stderr").unwrap_or(0);
        println!("--- transcript {}\n{}", path.display(), &t[from..]);
    }
    Ok(())
}
