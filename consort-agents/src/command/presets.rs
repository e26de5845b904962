//! Presets of the command backend for the coding-agent CLIs people already use: the command
//! line each one documents for a non-interactive run, and how to read its final message.
//!
//! | preset | command line | final message |
//! |---|---|---|
//! | `claude-code` | `claude -p <prompt> --output-format json --permission-mode acceptEdits` | `result` of the one JSON object on stdout |
//! | `codex` | `codex exec --json --skip-git-repo-check --sandbox workspace-write <prompt>` | `text` of the last `item.completed` event of type `agent_message` (JSON Lines on stdout) |
//! | `aider` | `aider --message <prompt> --yes-always --no-git --no-pretty --no-stream --no-check-update --no-analytics --chat-history-file /dev/null --input-history-file /dev/null <files>` | stdout as printed |
//!
//! aider's history files go to `/dev/null`: left in the scratch copy, they would be part of the
//! diff.
//!
//! The configuration's `args` go between the preset's options and its trailing positional
//! arguments, so a model or a flag can be added (`args = ["--model", "sonnet"]`).

use consort_actors::Usage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A coding-agent CLI the command backend knows how to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Preset {
    /// Anthropic's Claude Code in print mode.
    ClaudeCode,
    /// OpenAI's Codex CLI, `codex exec`.
    Codex,
    /// aider, one `--message` and exit.
    Aider,
}

/// The placeholder argument replaced by the rendered prompt.
pub const PROMPT_PLACEHOLDER: &str = "{prompt}";
/// The placeholder argument replaced by the paths of the step's files (one argument each).
pub const FILES_PLACEHOLDER: &str = "{files}";

/// How the program's stdout is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutputFormat {
    /// The artifact itself (the plain command backend).
    Artifact,
    /// Claude Code's `--output-format json`: one object with `result`.
    ClaudeJson,
    /// Codex's `exec --json`: JSON Lines events.
    CodexJsonl,
    /// Plain text (aider).
    Text,
}

impl Preset {
    /// Every preset.
    pub const ALL: [Preset; 3] = [Preset::ClaudeCode, Preset::Codex, Preset::Aider];

    /// Its name in a configuration file.
    pub fn as_str(self) -> &'static str {
        match self {
            Preset::ClaudeCode => "claude-code",
            Preset::Codex => "codex",
            Preset::Aider => "aider",
        }
    }

    /// The program it runs when the configuration names none.
    pub fn program(self) -> &'static str {
        match self {
            Preset::ClaudeCode => "claude",
            Preset::Codex => "codex",
            Preset::Aider => "aider",
        }
    }

    /// The options before the configuration's own `args`.
    fn head(self) -> &'static [&'static str] {
        match self {
            Preset::ClaudeCode => &[
                "-p",
                PROMPT_PLACEHOLDER,
                "--output-format",
                "json",
                "--permission-mode",
                "acceptEdits",
            ],
            Preset::Codex => &[
                "exec",
                "--json",
                "--skip-git-repo-check",
                "--sandbox",
                "workspace-write",
            ],
            Preset::Aider => &[
                "--message",
                PROMPT_PLACEHOLDER,
                "--yes-always",
                "--no-git",
                "--no-pretty",
                "--no-stream",
                "--no-check-update",
                "--no-analytics",
                "--chat-history-file",
                "/dev/null",
                "--input-history-file",
                "/dev/null",
            ],
        }
    }

    /// The positional arguments after the configuration's own `args`.
    fn tail(self) -> &'static [&'static str] {
        match self {
            Preset::ClaudeCode => &[],
            Preset::Codex => &[PROMPT_PLACEHOLDER],
            Preset::Aider => &[FILES_PLACEHOLDER],
        }
    }

    /// The argument template: the preset's options, `extra`, its positional arguments.
    pub fn args(self, extra: &[String]) -> Vec<String> {
        self.head()
            .iter()
            .map(|s| s.to_string())
            .chain(extra.iter().cloned())
            .chain(self.tail().iter().map(|s| s.to_string()))
            .collect()
    }

    pub(crate) fn output(self) -> OutputFormat {
        match self {
            Preset::ClaudeCode => OutputFormat::ClaudeJson,
            Preset::Codex => OutputFormat::CodexJsonl,
            Preset::Aider => OutputFormat::Text,
        }
    }
}

impl std::fmt::Display for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The program's final message and the tokens it reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FinalMessage {
    /// The text an artifact is read from.
    pub text: String,
    /// Prompt and completion tokens, when the program reported them.
    pub usage: Usage,
}

/// Why a program's output could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// The output is not in the documented format.
    Format(String),
    /// The output says the run failed.
    Reported(String),
}

/// Reads the final message from stdout in the given format.
pub(crate) fn final_message(format: OutputFormat, stdout: &str) -> Result<FinalMessage, ReadError> {
    match format {
        OutputFormat::Artifact | OutputFormat::Text => Ok(FinalMessage {
            text: stdout.to_string(),
            usage: Usage::default(),
        }),
        OutputFormat::ClaudeJson => claude_result(stdout),
        OutputFormat::CodexJsonl => codex_events(stdout),
    }
}

fn count(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// `{"type": "result", "subtype": "success", "is_error": false, "result": "…", "usage": {…}}`.
fn claude_result(stdout: &str) -> Result<FinalMessage, ReadError> {
    let v: Value = serde_json::from_str(stdout.trim()).map_err(|e| {
        ReadError::Format(format!(
            "stdout is not the JSON object of --output-format json ({e})"
        ))
    })?;
    let subtype = v.get("subtype").and_then(Value::as_str).unwrap_or("");
    let is_error = v.get("is_error").and_then(Value::as_bool).unwrap_or(false);
    let result = v.get("result").and_then(Value::as_str);
    if is_error || (!subtype.is_empty() && subtype != "success") {
        return Err(ReadError::Reported(format!(
            "the run ended with {}: {}",
            if subtype.is_empty() {
                "an error"
            } else {
                subtype
            },
            result.unwrap_or("no message")
        )));
    }
    let text = result
        .ok_or_else(|| ReadError::Format("the JSON object has no `result` text".into()))?
        .to_string();
    let usage = v.get("usage").cloned().unwrap_or(Value::Null);
    Ok(FinalMessage {
        text,
        usage: Usage {
            prompt_tokens: count(&usage, "input_tokens")
                + count(&usage, "cache_read_input_tokens")
                + count(&usage, "cache_creation_input_tokens"),
            completion_tokens: count(&usage, "output_tokens"),
            ..Usage::default()
        },
    })
}

/// JSON Lines: `item.completed` items of type `agent_message` carry the messages,
/// `turn.completed` the usage, `turn.failed` a failure. An `error` event alone is not one: the
/// real CLI reports each reconnection attempt as an `error` and may still finish the turn; it
/// is the failure only when no turn completed after it. Lines that are not JSON objects are
/// skipped (they are not events).
fn codex_events(stdout: &str) -> Result<FinalMessage, ReadError> {
    let mut text: Option<String> = None;
    let mut usage = Usage::default();
    let mut events = 0usize;
    let mut last_error: Option<String> = None;
    for line in stdout.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line.trim()) else {
            continue;
        };
        let Some(kind) = v.get("type").and_then(Value::as_str) else {
            continue;
        };
        events += 1;
        let message = || {
            v.get("error")
                .and_then(|e| e.get("message"))
                .or_else(|| v.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("no message")
                .to_string()
        };
        match kind {
            "item.completed" => {
                let item = v.get("item").unwrap_or(&Value::Null);
                let item_type = item.get("type").and_then(Value::as_str);
                if matches!(item_type, Some("agent_message" | "assistant_message"))
                    && let Some(t) = item.get("text").and_then(Value::as_str)
                {
                    text = Some(t.to_string());
                }
            }
            "turn.completed" => {
                last_error = None;
                let u = v.get("usage").unwrap_or(&Value::Null);
                usage.prompt_tokens += count(u, "input_tokens");
                usage.completion_tokens += count(u, "output_tokens");
            }
            "turn.failed" => {
                return Err(ReadError::Reported(format!("turn.failed: {}", message())));
            }
            "error" => last_error = Some(message()),
            _ => {}
        }
    }
    if events == 0 {
        return Err(ReadError::Format(
            "stdout holds no JSON Lines events of exec --json".into(),
        ));
    }
    if let Some(e) = last_error {
        return Err(ReadError::Reported(format!("error: {e}")));
    }
    Ok(FinalMessage {
        text: text.unwrap_or_default(),
        usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_have_their_documented_command_lines() {
        assert_eq!(
            Preset::Codex.args(&["-m".into(), "o4-mini".into()]),
            [
                "exec",
                "--json",
                "--skip-git-repo-check",
                "--sandbox",
                "workspace-write",
                "-m",
                "o4-mini",
                "{prompt}"
            ]
        );
        assert_eq!(
            Preset::ClaudeCode.args(&[])[..4],
            ["-p", "{prompt}", "--output-format", "json"]
        );
        assert_eq!(
            Preset::Aider.args(&[]).last().map(String::as_str),
            Some("{files}")
        );
        for p in Preset::ALL {
            let parsed: Preset =
                serde_json::from_value(Value::String(p.as_str().into())).expect("the name parses");
            assert_eq!(parsed, p);
        }
    }

    #[test]
    fn claude_results_and_errors_are_read() {
        let ok = r#"{"type":"result","subtype":"success","is_error":false,"result":"done",
            "session_id":"s","total_cost_usd":0.01,"usage":{"input_tokens":10,
            "cache_read_input_tokens":5,"output_tokens":3}}"#;
        let m = final_message(OutputFormat::ClaudeJson, ok).expect("read");
        assert_eq!(m.text, "done");
        assert_eq!((m.usage.prompt_tokens, m.usage.completion_tokens), (15, 3));
        let failed = r#"{"type":"result","subtype":"error_max_turns","is_error":true}"#;
        assert!(matches!(
            final_message(OutputFormat::ClaudeJson, failed),
            Err(ReadError::Reported(d)) if d.contains("error_max_turns")
        ));
        assert!(matches!(
            final_message(OutputFormat::ClaudeJson, "Hello"),
            Err(ReadError::Format(_))
        ));
    }

    #[test]
    fn codex_events_give_the_last_agent_message_and_the_usage() {
        let out = concat!(
            "{\"type\":\"thread.started\",\"thread_id\":\"t\"}\n",
            "{\"type\":\"turn.started\"}\n",
            "{\"type\":\"item.completed\",\"item\":{\"id\":\"i0\",\"type\":\"reasoning\",\"text\":\"hm\"}}\n",
            "{\"type\":\"item.completed\",\"item\":{\"id\":\"i1\",\"type\":\"agent_message\",\"text\":\"first\"}}\n",
            "{\"type\":\"item.completed\",\"item\":{\"id\":\"i2\",\"type\":\"agent_message\",\"text\":\"last\"}}\n",
            "{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":7,\"cached_input_tokens\":2,\"output_tokens\":4}}\n",
        );
        let m = final_message(OutputFormat::CodexJsonl, out).expect("read");
        assert_eq!(m.text, "last");
        assert_eq!((m.usage.prompt_tokens, m.usage.completion_tokens), (7, 4));
        // The real CLI reports reconnections as `error` events and may still finish the turn.
        let retried = concat!(
            "{\"type\":\"thread.started\",\"thread_id\":\"t\"}\n",
            "{\"type\":\"item.completed\",\"item\":{\"id\":\"item_0\",\"type\":\"error\",\"message\":\"Model metadata for `local` not found.\"}}\n",
            "{\"type\":\"turn.started\"}\n",
            "{\"type\":\"error\",\"message\":\"Reconnecting... 1/5 (unexpected status 502)\"}\n",
            "{\"type\":\"item.completed\",\"item\":{\"id\":\"i1\",\"type\":\"agent_message\",\"text\":\"ok\"}}\n",
            "{\"type\":\"turn.completed\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}\n",
        );
        assert_eq!(
            final_message(OutputFormat::CodexJsonl, retried).map(|m| m.text),
            Ok("ok".into())
        );
        let gave_up = "{\"type\":\"turn.started\"}\n{\"type\":\"error\",\"message\":\"unexpected status 404\"}\n";
        assert_eq!(
            final_message(OutputFormat::CodexJsonl, gave_up),
            Err(ReadError::Reported("error: unexpected status 404".into()))
        );
        let failed = "{\"type\":\"turn.failed\",\"error\":{\"message\":\"quota\"}}\n";
        assert_eq!(
            final_message(OutputFormat::CodexJsonl, failed),
            Err(ReadError::Reported("turn.failed: quota".into()))
        );
        assert!(matches!(
            final_message(OutputFormat::CodexJsonl, "plain text\n"),
            Err(ReadError::Format(_))
        ));
    }
}
