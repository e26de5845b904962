//! What the agent learns about its server rather than assumes: whether tool calls survive a
//! `response_format` in the same request, and how large the model's context window is.
//!
//! Both are learned once per server and model in a process and shared by every agent that
//! talks to it (eight roles, one server: one probe).
//!
//! - **Tools beside a schema.** OpenAI honours `tools` and `response_format: json_schema` in
//!   one request; llama.cpp's server applies only the schema and never returns a tool call. The
//!   probe asks for a call of a one-line function (`tool_choice: "required"`) in a request that
//!   also carries a schema: a tool call back means [`ToolProtocol::Together`], anything else
//!   (an answer by the schema, a 400) means [`ToolProtocol::Separate`], which works everywhere.
//! - **The context window.** Configured ([`super::OpenAiConfig::context_tokens`]), else read
//!   from the server where it says: llama.cpp's `GET /props`
//!   (`default_generation_settings.n_ctx`). Servers that do not say leave it unknown, and the
//!   prompt is not fitted until the server refuses one ([`context_refusal`]).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How tool rounds and structured output share a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolProtocol {
    /// Ask the server once (a small probe call, its tokens counted) and use what it does.
    #[default]
    Detect,
    /// Tools and `response_format` in the same request (OpenAI and servers like it).
    Together,
    /// Tool rounds without `response_format` (the schema is in the system prompt), then the
    /// answer asked for with it and without tools (llama.cpp, whose schema wins over tools).
    Separate,
}

impl std::fmt::Display for ToolProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ToolProtocol::Detect => "detect",
            ToolProtocol::Together => "together",
            ToolProtocol::Separate => "separate",
        })
    }
}

/// The name of the probe's function.
pub(super) const PROBE_FUNCTION: &str = "consort_probe";

/// The probe's request: a function call required beside a schema.
pub(super) fn probe_request(model: &str, limit_field: &str) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "You call functions when you are asked to."},
            {"role": "user", "content": format!("Call the function {PROBE_FUNCTION}.")},
        ],
        "tools": [{"type": "function", "function": {
            "name": PROBE_FUNCTION,
            "description": "Answers a probe of the server's features.",
            "parameters": {"type": "object", "properties": {}, "required": [],
                           "additionalProperties": false},
        }}],
        "tool_choice": "required",
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "consort_probe_answer", "strict": true,
            "schema": {"type": "object", "properties": {"answer": {"type": "string"}},
                       "required": ["answer"], "additionalProperties": false},
        }},
        limit_field: 64,
    })
}

/// What was learned about one server and model.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Learned {
    /// The protocol the probe chose.
    pub protocol: Option<ToolProtocol>,
    /// The context window the server reported, once asked (`Some(None)`: it does not say).
    pub window: Option<Option<u64>>,
}

fn learned() -> &'static Mutex<HashMap<String, Learned>> {
    static LEARNED: OnceLock<Mutex<HashMap<String, Learned>>> = OnceLock::new();
    LEARNED.get_or_init(Mutex::default)
}

/// What this process already learned about `base_url` and `model`.
pub(super) fn recall(base_url: &str, model: &str) -> Learned {
    learned()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&key(base_url, model))
        .copied()
        .unwrap_or_default()
}

/// The tool protocol this process learned for `base_url` (with `/v1`) and `model`, once an
/// agent with [`ToolProtocol::Detect`] probed it.
pub fn learned_protocol(base_url: &str, model: &str) -> Option<ToolProtocol> {
    recall(base_url.trim_end_matches('/'), model).protocol
}

/// Keeps what was learned about `base_url` and `model`.
pub(super) fn remember(base_url: &str, model: &str, update: impl FnOnce(&mut Learned)) {
    let mut all = learned()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    update(all.entry(key(base_url, model)).or_default());
}

fn key(base_url: &str, model: &str) -> String {
    format!("{base_url}\u{0}{model}")
}

/// The server's root for its own endpoints: the base URL without its `/v1`.
pub(super) fn server_root(base_url: &str) -> &str {
    base_url.strip_suffix("/v1").unwrap_or(base_url)
}

/// The context window a llama.cpp-style `/props` answer gives.
pub fn window_from_props(props: &Value) -> Option<u64> {
    props
        .pointer("/default_generation_settings/n_ctx")
        .or_else(|| props.get("n_ctx"))
        .and_then(Value::as_u64)
        .filter(|n| *n > 0)
}

/// Asks the server for its context window (`GET <root>/props`); `None` when it does not say.
pub(super) async fn ask_window(http: &reqwest::Client, base_url: &str, key: &str) -> Option<u64> {
    let mut request = http.get(format!("{}/props", server_root(base_url)));
    if !key.is_empty() {
        request = request.bearer_auth(key);
    }
    let answer = request.send().await.ok()?;
    if !answer.status().is_success() {
        return None;
    }
    window_from_props(&answer.json::<Value>().await.ok()?)
}

/// What `consort doctor` learns of an OpenAI-compatible server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerCheck {
    /// The model names the server lists (`GET /v1/models`: ids and llama.cpp's aliases), or
    /// why it could not be asked.
    pub models: Result<Vec<String>, String>,
    /// The context window: configured, or what the server says (`/props`); none when unknown.
    pub context_tokens: Option<u64>,
    /// Whether the window came from the configuration.
    pub context_configured: bool,
}

/// Asks the server at `config.base_url` for its models and its context window, with `key`
/// when one is given. Never fails: what could not be learned is said in the answer.
pub async fn check_server(config: &super::OpenAiConfig, key: Option<&str>) -> ServerCheck {
    let base = config.base_url.trim().trim_end_matches('/');
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(
            config.http.connect_timeout_secs.max(5),
        ))
        .build();
    let (models, window) = match http {
        Ok(http) => {
            let mut request = http.get(format!("{base}/models"));
            if let Some(k) = key.filter(|k| !k.is_empty()) {
                request = request.bearer_auth(k);
            }
            let models = match request.send().await {
                Ok(r) if r.status().is_success() => r
                    .json::<Value>()
                    .await
                    .map(|v| model_names(&v))
                    .map_err(|e| format!("its model list is not JSON: {e}")),
                Ok(r) => Err(format!("GET {base}/models answered HTTP {}", r.status())),
                Err(e) => Err(format!(
                    "no answer at {base}: {}",
                    crate::validate::clip(&e.to_string(), 200)
                )),
            };
            let window = match config.context_tokens {
                Some(_) => None,
                None => ask_window(&http, base, key.unwrap_or_default()).await,
            };
            (models, window)
        }
        Err(e) => (Err(format!("cannot build an HTTP client: {e}")), None),
    };
    ServerCheck {
        models,
        context_tokens: config.context_tokens.map(u64::from).or(window),
        context_configured: config.context_tokens.is_some(),
    }
}

/// The names a `/v1/models` answer gives: each entry's `id` and any `aliases` (llama.cpp).
fn model_names(v: &Value) -> Vec<String> {
    let mut names = Vec::new();
    for m in v
        .get("data")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        names.extend(m.get("id").and_then(Value::as_str).map(str::to_string));
        for a in m
            .get("aliases")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            names.extend(a.as_str().map(str::to_string));
        }
    }
    names
}

/// A server's refusal of a prompt over its context window, read from its error: the prompt's
/// size and the window when the message gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextRefusal {
    /// The prompt's tokens, as the server counted them.
    pub prompt_tokens: Option<u64>,
    /// The window, as the server gave it.
    pub window: Option<u64>,
}

/// Whether an error answer refuses the prompt for its length: llama.cpp's
/// `exceed_context_size_error` ("request (9000 tokens) exceeds the available context size
/// (8192 tokens)"), OpenAI's `context_length_exceeded`, vLLM's "maximum context length".
pub fn context_refusal(
    message: &str,
    kind: Option<&str>,
    code: Option<&str>,
) -> Option<ContextRefusal> {
    let lower = message.to_ascii_lowercase();
    let said = kind == Some("exceed_context_size_error")
        || code == Some("context_length_exceeded")
        || lower.contains("context size")
        || lower.contains("context length")
        || lower.contains("context window");
    if !said {
        return None;
    }
    let mut refusal = ContextRefusal {
        prompt_tokens: None,
        window: None,
    };
    for (n, about_context) in numbers_before_tokens(&lower) {
        if about_context {
            refusal.window.get_or_insert(n);
        } else {
            refusal.prompt_tokens.get_or_insert(n);
        }
    }
    Some(refusal)
}

/// The numbers followed by the word "tokens" in a text, in order, each with whether one of the
/// three words before it names the context ("context size (8192 tokens)", "maximum context
/// length is 8192 tokens") rather than the request ("request (9000 tokens)").
fn numbers_before_tokens(text: &str) -> Vec<(u64, bool)> {
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || "(),:.".contains(c))
        .filter(|w| !w.is_empty())
        .collect();
    (0..words.len().saturating_sub(1))
        .filter(|&i| words[i + 1].starts_with("token"))
        .filter_map(|i| {
            let n = words[i].parse().ok()?;
            let before = &words[i.saturating_sub(3)..i];
            Some((n, before.iter().any(|w| w.starts_with("context"))))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_refusals_are_read_from_the_servers_words() {
        let llama = context_refusal(
            "request (9000 tokens) exceeds the available context size (8192 tokens), try increasing it",
            Some("exceed_context_size_error"),
            None,
        );
        assert_eq!(
            llama,
            Some(ContextRefusal {
                prompt_tokens: Some(9000),
                window: Some(8192)
            })
        );
        let openai = context_refusal(
            "This model's maximum context length is 8192 tokens. However, your messages resulted in 9100 tokens.",
            Some("invalid_request_error"),
            Some("context_length_exceeded"),
        );
        assert_eq!(
            openai,
            Some(ContextRefusal {
                prompt_tokens: Some(9100),
                window: Some(8192)
            })
        );
        assert_eq!(
            context_refusal("response_format is not supported", None, None),
            None
        );
    }

    #[test]
    fn the_window_is_read_from_props_and_a_zero_is_not_a_window() {
        assert_eq!(
            window_from_props(&json!({"default_generation_settings": {"n_ctx": 8192}})),
            Some(8192)
        );
        assert_eq!(window_from_props(&json!({"n_ctx": 0})), None);
        assert_eq!(window_from_props(&json!({"other": 1})), None);
        assert_eq!(server_root("http://h:1/v1"), "http://h:1");
    }
}
