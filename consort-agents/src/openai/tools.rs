//! Tool use (function calling) for build steps: the model may read a file, list files, search
//! the tree and try its change on a scratch branch before it answers.
//!
//! The tools are the assignment's own ([`Assignment::tools`]); this module only describes them
//! to the model, runs the calls it makes and keeps every call and its result in the step's
//! transcript. A scratch run's result is told to the model as advice: the step's real run
//! still happens on a fresh branch after the answer is accepted.

use std::path::{Path, PathBuf};

use async_openai::types::chat::{
    ChatCompletionMessageToolCall, ChatCompletionMessageToolCalls,
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestMessage,
    ChatCompletionRequestToolMessage, ChatCompletionRequestToolMessageContent, FunctionCall,
};
use consort_actors::workbench::{Advice, Tools, Workbench};
use consort_actors::{
    ArtifactKind, Assignment, ChangeSet, ContentHash, Step, TestStatus, TranscriptRef,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::extract::{Completion, ToolCall};
use super::schema::response_schema;

const READ_FILE: &str = "read_file";
const LIST_FILES: &str = "list_files";
const SEARCH: &str = "search";
const RUN_TESTS: &str = "run_tests";

/// How a model may use tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolUse {
    /// Offer the step's tools to the model. Default `true`.
    pub enabled: bool,
    /// Rounds of tool calls per step; then the model must answer. Default 6.
    pub max_rounds: u32,
    /// With tools, list the step's code files (by path and size) instead of sending them, for
    /// the model to read with `read_file`; the entry's test is always sent. Default `true`: the
    /// prompt then does not grow with the code.
    pub code_on_demand: bool,
    /// Ask for at least one tool call in a step's first round (`tool_choice: "required"`).
    /// Default `false`: small models that answer without looking can be made to look first.
    pub require_first: bool,
}

impl Default for ToolUse {
    fn default() -> Self {
        ToolUse {
            enabled: true,
            max_rounds: 6,
            code_on_demand: true,
            require_first: false,
        }
    }
}

/// The function definitions of the step's tools, when it has any: every build step may read,
/// list and search; RED, GREEN, repair and REFACTOR may also run the tests on a scratch branch.
pub(super) fn definitions(a: &Assignment, strict: bool) -> Option<Value> {
    a.tools.as_ref()?;
    let nullable = json!({"type": ["string", "null"]});
    let function = |name: &str, description: &str, properties: Value, required: &[&str]| {
        json!({"type": "function", "function": {
            "name": name,
            "description": description,
            "strict": strict,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            },
        }})
    };
    let mut tools = vec![
        function(
            READ_FILE,
            "Read a text file of the project (a path relative to its root).",
            json!({"path": {"type": "string"}}),
            &["path"],
        ),
        function(
            LIST_FILES,
            "List the project's files and their sizes, those matching a glob when given.",
            json!({"glob": nullable}),
            &["glob"],
        ),
        function(
            SEARCH,
            "Find the lines that contain a text (literally), in the files matching a glob when given.",
            json!({"text": {"type": "string"}, "glob": nullable}),
            &["text", "glob"],
        ),
    ];
    if matches!(
        a.step,
        Step::Red { .. } | Step::Green { .. } | Step::Repair { .. } | Step::Refactor { .. }
    ) {
        tools.push(run_tests_definition(strict));
    }
    Some(Value::Array(tools))
}

fn run_tests_definition(strict: bool) -> Value {
    let mut params = response_schema(ArtifactKind::ChangeSet, strict);
    if let Some(o) = params.as_object_mut() {
        let body = o
            .get_mut("properties")
            .and_then(|p| p.get_mut("body"))
            .map(Value::take);
        o.insert("properties".into(), json!({"change_set": body}));
        o.insert("required".into(), json!(["change_set"]));
    }
    json!({"type": "function", "function": {
        "name": RUN_TESTS,
        "description": "Apply a change set to a scratch copy of the project and run the tests there, \
            on a scratch database branch, exactly as the step's real run would; says whether that \
            run would be accepted. Advice only: it is not a receipt, and the real run happens after \
            you answer. A few runs per step.",
        "strict": strict,
        "parameters": params,
    }})
}

/// Whether the completion calls one of the step's tools (a call of another name is how some
/// servers return structured output, and is read as the answer).
pub(super) fn wants_tools(c: &Completion) -> bool {
    c.tool_calls
        .iter()
        .any(|t| [READ_FILE, LIST_FILES, SEARCH, RUN_TESTS].contains(&t.name.as_str()))
}

/// One tool call and its result, as the transcript keeps them.
#[derive(Debug, Clone, Serialize)]
struct Exchange {
    round: u32,
    id: String,
    name: String,
    arguments: String,
    result: String,
    /// The round of the identical call this one repeated (it was not run again).
    #[serde(skip_serializing_if = "Option::is_none")]
    repeats_round: Option<u32>,
}

/// Every tool call of one step, in order.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Transcript {
    step: String,
    attempt: u32,
    role: String,
    model: String,
    exchanges: Vec<Exchange>,
}

impl Transcript {
    pub(super) fn new(a: &Assignment, model: &str) -> Self {
        Transcript {
            step: a.step.to_string(),
            attempt: a.attempt,
            role: a.role.to_string(),
            model: model.to_string(),
            exchanges: Vec::new(),
        }
    }

    /// Writes the transcript into `dir` as `<step>-<attempt>.tools.json`, when a call was made;
    /// returns its name there and its hash.
    pub(super) fn keep(&self, dir: Option<&Path>) -> Result<Option<TranscriptRef>, String> {
        let Some(dir) = dir.filter(|_| !self.exchanges.is_empty()) else {
            return Ok(None);
        };
        let name = format!(
            "{}.tools.json",
            crate::command::transcript_stem(&self.step, self.attempt)
        );
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        let path: PathBuf = dir.join(&name);
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&path, &bytes))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(Some(TranscriptRef {
            path: name,
            hash: ContentHash::of_bytes(&bytes),
        }))
    }
}

/// A call's arguments as the conversation repeats them to the server: as written when they are
/// JSON, else `{}` (a small model cut off mid-call writes broken JSON, and a server that parses
/// the conversation's calls, as llama.cpp does, would refuse every later request of the step).
/// The transcript keeps what the model wrote, and the call's result names the error.
fn echoed_arguments(arguments: &str) -> String {
    if serde_json::from_str::<serde::de::IgnoredAny>(arguments).is_ok() {
        arguments.to_string()
    } else {
        "{}".to_string()
    }
}

/// The calls of one round.
pub(super) struct Made {
    /// Calls the model made.
    pub calls: u32,
    /// Of those, calls that repeated an earlier one word for word (not run again).
    pub repeated: u32,
}

/// Runs the completion's tool calls, appends the model's turn and one result per call to
/// `turns`, and keeps them in the transcript. A call identical to an earlier one of the step
/// (same function, same arguments) is not run again: its result says so and names the round.
pub(super) async fn round(
    tools: &Tools,
    completion: &Completion,
    round: u32,
    turns: &mut Vec<ChatCompletionRequestMessage>,
    transcript: &mut Transcript,
) -> Made {
    let mut repeated = 0u32;
    let calls = completion
        .tool_calls
        .iter()
        .map(|c| {
            ChatCompletionMessageToolCalls::Function(ChatCompletionMessageToolCall {
                id: c.id.clone(),
                function: FunctionCall {
                    name: c.name.clone(),
                    arguments: echoed_arguments(&c.arguments),
                },
            })
        })
        .collect();
    turns.push(
        ChatCompletionRequestAssistantMessage {
            content: completion.content.clone().map(Into::into),
            tool_calls: Some(calls),
            ..ChatCompletionRequestAssistantMessage::default()
        }
        .into(),
    );
    for call in &completion.tool_calls {
        let earlier = transcript
            .exchanges
            .iter()
            .find(|e| e.name == call.name && e.arguments == call.arguments)
            .map(|e| e.round);
        let result = match earlier {
            Some(r) => {
                repeated += 1;
                format!(
                    "Not run again: this is the same call as in round {r}, and its result is above. \
                     Use it, or make a different call, or answer."
                )
            }
            None => run(tools.bench(), call).await,
        };
        tracing::debug!(tool = %call.name, round, repeated = earlier.is_some(), "tool call");
        turns.push(
            ChatCompletionRequestToolMessage {
                content: ChatCompletionRequestToolMessageContent::Text(result.clone()),
                tool_call_id: call.id.clone(),
            }
            .into(),
        );
        transcript.exchanges.push(Exchange {
            round,
            id: call.id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            result,
            repeats_round: earlier,
        });
    }
    Made {
        calls: u32::try_from(completion.tool_calls.len()).unwrap_or(u32::MAX),
        repeated,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    #[serde(default)]
    glob: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    text: String,
    #[serde(default)]
    glob: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunArgs {
    change_set: ChangeSet,
}

/// One call's result, as text for the model.
async fn run(bench: &dyn Workbench, call: &ToolCall) -> String {
    fn args<T: serde::de::DeserializeOwned>(call: &ToolCall) -> Result<T, String> {
        serde_json::from_str(&call.arguments)
            .map_err(|e| format!("error: bad arguments for {}: {e}", call.name))
    }
    let answer = match call.name.as_str() {
        READ_FILE => args::<ReadArgs>(call).map(|a| match bench.read(&a.path) {
            Ok(f) if f.truncated => format!(
                "{} ({} bytes; the first {} shown)\n{}",
                f.path,
                f.bytes,
                f.text.len(),
                f.text
            ),
            Ok(f) => format!("{} ({} bytes)\n{}", f.path, f.bytes, f.text),
            Err(e) => format!("error: {e}"),
        }),
        LIST_FILES => args::<ListArgs>(call).map(|a| match bench.list(a.glob.as_deref()) {
            Ok(l) if l.files.is_empty() => "no file matches".to_string(),
            Ok(l) => {
                let mut text: Vec<String> = l
                    .files
                    .iter()
                    .map(|(p, b)| format!("{p} ({b} bytes)"))
                    .collect();
                if l.more > 0 {
                    text.push(format!("… and {} more files", l.more));
                }
                text.join("\n")
            }
            Err(e) => format!("error: {e}"),
        }),
        SEARCH => {
            args::<SearchArgs>(call).map(|a| match bench.search(&a.text, a.glob.as_deref()) {
                Ok(h) if h.hits.is_empty() => format!("no line contains `{}`", a.text),
                Ok(h) => {
                    let mut text: Vec<String> = h
                        .hits
                        .iter()
                        .map(|h| format!("{}:{}: {}", h.path, h.line, h.text))
                        .collect();
                    if h.more {
                        text.push("(more lines match; narrow the search)".into());
                    }
                    text.join("\n")
                }
                Err(e) => format!("error: {e}"),
            })
        }
        RUN_TESTS => match args::<RunArgs>(call) {
            Ok(a) => Ok(match bench.try_change(a.change_set).await {
                Ok(advice) => advice_text(&advice),
                Err(e) => format!("error: {e}"),
            }),
            Err(e) => Err(e),
        },
        other => Err(format!("error: there is no tool named `{other}`")),
    };
    answer.unwrap_or_else(|e| e)
}

fn advice_text(a: &Advice) -> String {
    let outcomes: Vec<String> = a
        .outcomes
        .iter()
        .map(|o| {
            let status = match o.status {
                TestStatus::Passed => "passed",
                TestStatus::Failed => "failed",
                TestStatus::Errored => "errored",
                TestStatus::Skipped => "skipped",
            };
            format!("{}: {status}", o.name)
        })
        .collect();
    format!(
        "Advice only (not a receipt): the step's real run {} accept this change.\n{}\nTests: {}\nScratch runs left: {}",
        if a.would_pass { "would" } else { "would not" },
        a.verdict.trim_end(),
        if outcomes.is_empty() {
            "none reported".to_string()
        } else {
            outcomes.join(", ")
        },
        a.runs_left
    )
}
