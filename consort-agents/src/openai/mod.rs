//! The OpenAI-compatible backend: a chat-completions model asked for structured output.
//!
//! One [`OpenAiAgent`] per role, each with its own [`OpenAiConfig`] (base URL, model, key
//! variable, temperature, token limit, retries, budgets). The request carries the role's system
//! prompt (from `prompts/<role>.md`) and the assignment as JSON; the answer is asked for with a
//! `json_schema` response format derived from the artifact type, read as raw JSON (so
//! `"id": null` or a missing `usage` do not matter), its JSON found even inside prose or a
//! fence, and validated against the artifact type and the role rules. An invalid answer is
//! sent back with the reason, up to [`OpenAiConfig::output_retries`] times.
//!
//! **The API key never appears in logs, errors or `Debug` output**: it lives in an [`ApiKey`]
//! whose `Debug` is redacted, and every error text is scrubbed of it.

mod budget;
mod extract;
mod schema;
mod tools;
mod transport;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestMessage,
    ChatCompletionRequestSystemMessage, ChatCompletionRequestUserMessage,
    CreateChatCompletionRequestArgs, ResponseFormat, ResponseFormatJsonSchema,
};
use consort_actors::{AgentFailure, Artifact, ArtifactKind, Assignment, Omission, Role, Usage};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::agent::{ActFuture, Agent, AgentOutput};
use crate::prompts::system_prompt;
use crate::validate::{check_artifact, parse_artifact};

pub use extract::{Completion, ToolCall, extract_json, read_completion};
pub use schema::{body_schema, ordered_schema_text, response_schema};
pub use tools::ToolUse;
pub use transport::{HttpPolicy, RetryTransport, retry_after};

/// An API key. Its `Debug` prints `ApiKey(<redacted>)`; it has no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key, refusing one that cannot be sent in an HTTP header (control characters,
    /// spaces, non-ASCII).
    pub fn new(key: impl Into<String>) -> Result<Self, OpenAiConfigError> {
        let key = key.into();
        if key.chars().any(|c| !c.is_ascii_graphic()) {
            return Err(OpenAiConfigError::BadApiKey);
        }
        Ok(ApiKey(key))
    }

    /// Reads the key from the environment variable `var`.
    pub fn from_env(var: &str) -> Result<Self, OpenAiConfigError> {
        match std::env::var(var) {
            Ok(k) if !k.is_empty() => ApiKey::new(k),
            _ => Err(OpenAiConfigError::MissingApiKey {
                var: var.to_string(),
            }),
        }
    }

    fn expose(&self) -> &str {
        &self.0
    }

    /// Replaces every occurrence of the key in `text`.
    fn scrub(&self, text: &str) -> String {
        if self.0.len() < 4 {
            return text.to_string();
        }
        text.replace(&self.0, "<redacted>")
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// A configuration that cannot be used. Never contains the key itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenAiConfigError {
    /// The key variable is unset or empty.
    #[error("the API key variable {var} is not set")]
    MissingApiKey {
        /// The variable's name.
        var: String,
    },
    /// The key has characters an HTTP header cannot carry.
    #[error("the API key contains characters that cannot be sent in a header")]
    BadApiKey,
    /// The base URL is not an http(s) URL.
    #[error("base_url {0:?} must start with http:// or https:// (and include /v1)")]
    BadBaseUrl(String),
    /// No model name.
    #[error("no model configured")]
    MissingModel,
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Http(String),
}

/// Which request field carries the token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenLimitField {
    /// `max_completion_tokens` (OpenAI's current name).
    #[default]
    MaxCompletionTokens,
    /// `max_tokens` (older servers).
    MaxTokens,
}

/// How structured output is requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    /// `response_format: {type: json_schema, …}` (default). If the server refuses it with
    /// HTTP 400, the agent falls back to [`StructuredOutput::Prompt`] for the rest of its life.
    #[default]
    JsonSchema,
    /// `response_format: {type: json_object}`, with the schema in the system prompt.
    JsonObject,
    /// No `response_format`; the schema is in the system prompt.
    Prompt,
}

/// Per-role limits, as earlier versions wrote them in a role's configuration.
///
/// The agent no longer keeps its own count (it started again at zero in every process): the
/// `consort` program reads these as the role's budget in `[budget.roles.<role>]`, derived
/// from the ledger and checked by the conductor before every step; what is left arrives in
/// the assignment ([`Assignment::budget`]), and the agent checks every call against that
/// before making it ([`AgentFailure::BudgetSpent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Budget {
    /// Total tokens (prompt + completion, as reported by the server) this role may spend.
    pub max_tokens: Option<u64>,
    /// Total wall time, in seconds, this role may spend in model calls.
    pub max_wall_secs: Option<u64>,
}

/// The configuration of one role's model.
///
/// Deserialisable, so it can sit in a configuration file:
///
/// ```toml
/// base_url = "http://127.0.0.1:8000/v1"
/// api_key_env = "MY_LLM_KEY"
/// model = "qwen2.5-coder-32b"
/// temperature = 0.2
/// max_tokens = 4096
/// budget = { max_tokens = 200000, max_wall_secs = 1800 }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenAiConfig {
    /// The API base, including `/v1`, without a trailing slash.
    /// Default `https://api.openai.com/v1`.
    pub base_url: String,
    /// The NAME of the environment variable holding the key (`None`: send no real key, for
    /// local servers). Default `OPENAI_API_KEY`.
    pub api_key_env: Option<String>,
    /// The model name.
    pub model: String,
    /// Sampling temperature (omitted when `None`).
    pub temperature: Option<f32>,
    /// The completion token limit of one call (omitted when `None`).
    pub max_tokens: Option<u32>,
    /// Which field carries `max_tokens`.
    pub token_limit_field: TokenLimitField,
    /// How structured output is requested.
    pub structured_output: StructuredOutput,
    /// Rewrite the schema for strict mode and send `strict: true`. Default `true`.
    pub strict_schema: bool,
    /// Retries after an invalid answer, each with the validation error fed back. Default 2.
    pub output_retries: u32,
    /// HTTP retries and time limits.
    pub http: HttpPolicy,
    /// Token and wall-time budgets of the role (read by the `consort` program into its
    /// ledger-derived budgets; see [`Budget`]).
    pub budget: Budget,
    /// Text appended to the role's system prompt (house conventions, language, …).
    pub extra_instructions: Option<String>,
    /// Tool use in build steps (see [`ToolUse`]).
    pub tools: ToolUse,
    /// Where each step's transcript of tool calls is written (`consort` sets
    /// `.consort/transcripts/`); none: no transcript is kept.
    #[serde(skip)]
    pub transcript_dir: Option<std::path::PathBuf>,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        OpenAiConfig {
            base_url: "https://api.openai.com/v1".into(),
            api_key_env: Some("OPENAI_API_KEY".into()),
            model: String::new(),
            temperature: None,
            max_tokens: None,
            token_limit_field: TokenLimitField::default(),
            structured_output: StructuredOutput::default(),
            strict_schema: true,
            output_retries: 2,
            http: HttpPolicy::default(),
            budget: Budget::default(),
            extra_instructions: None,
            tools: ToolUse::default(),
            transcript_dir: None,
        }
    }
}

impl OpenAiConfig {
    /// A configuration for `model` at `base_url` (which includes `/v1`), other fields default.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        OpenAiConfig {
            base_url: base_url.into(),
            model: model.into(),
            ..OpenAiConfig::default()
        }
    }
}

/// What a role has spent so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Spent {
    /// Tokens reported by the server.
    pub tokens: u64,
    /// Wall time in model conversations.
    pub wall: Duration,
    /// Model calls.
    pub calls: u64,
}

/// An [`Agent`] backed by an OpenAI-compatible chat-completions server.
pub struct OpenAiAgent {
    role: Role,
    config: OpenAiConfig,
    key: ApiKey,
    client: Client<OpenAIConfig>,
    spent: Mutex<Spent>,
    /// Everything counted so far (tokens, calls), so a step cut short still reports its usage.
    counted: Mutex<Usage>,
    schema_refused: AtomicBool,
}

impl fmt::Debug for OpenAiAgent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiAgent")
            .field("role", &self.role)
            .field("base_url", &self.config.base_url)
            .field("model", &self.config.model)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

enum CallError {
    /// Give up with this failure.
    Fail(AgentFailure),
    /// The server refused the response_format (HTTP 400): retry without it.
    SchemaRefused(String),
}

impl OpenAiAgent {
    /// An agent for `role`, reading the key from the variable named by
    /// [`OpenAiConfig::api_key_env`].
    pub fn new(role: Role, config: OpenAiConfig) -> Result<Self, OpenAiConfigError> {
        let key = match &config.api_key_env {
            Some(var) => ApiKey::from_env(var)?,
            None => ApiKey(String::new()),
        };
        OpenAiAgent::with_key(role, config, key)
    }

    /// An agent for `role` with a key given directly.
    pub fn with_key(
        role: Role,
        mut config: OpenAiConfig,
        key: ApiKey,
    ) -> Result<Self, OpenAiConfigError> {
        let base = config.base_url.trim().trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(OpenAiConfigError::BadBaseUrl(base));
        }
        config.base_url = base;
        if config.model.trim().is_empty() {
            return Err(OpenAiConfigError::MissingModel);
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(config.http.request_timeout_secs.max(1)))
            .connect_timeout(Duration::from_secs(config.http.connect_timeout_secs.max(1)))
            .build()
            .map_err(|e| OpenAiConfigError::Http(e.to_string()))?;
        let openai = OpenAIConfig::new()
            .with_api_base(config.base_url.clone())
            .with_api_key(key.expose())
            .with_org_id("")
            .with_project_id("");
        let client = Client::build(http.clone(), openai).with_http_service(
            RetryTransport::new(http, config.http.clone()).scrubbing(key.expose()),
        );
        Ok(OpenAiAgent {
            role,
            config,
            key,
            client,
            spent: Mutex::new(Spent::default()),
            counted: Mutex::new(Usage::default()),
            schema_refused: AtomicBool::new(false),
        })
    }

    /// The role this agent plays.
    pub fn role(&self) -> Role {
        self.role
    }

    /// What it has spent so far.
    pub fn spent(&self) -> Spent {
        *self.spent.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add_spent(&self, tokens: u64, wall: Duration, calls: u64) -> Spent {
        let mut s = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        s.tokens = s.tokens.saturating_add(tokens);
        s.wall += wall;
        s.calls += calls;
        *s
    }

    fn structured(&self) -> StructuredOutput {
        if self.schema_refused.load(Ordering::Relaxed) {
            StructuredOutput::Prompt
        } else {
            self.config.structured_output
        }
    }

    fn system_message(&self, expected: ArtifactKind, mode: StructuredOutput) -> String {
        let mut text = system_prompt(self.role);
        if mode != StructuredOutput::JsonSchema {
            text.push_str(&format!(
                "\nThe answer must match this JSON schema:\n{}\n",
                ordered_schema_text(&response_schema(expected, false))
            ));
        }
        if let Some(extra) = &self.config.extra_instructions {
            text.push('\n');
            text.push_str(extra);
            text.push('\n');
        }
        text
    }

    async fn converse(&self, assignment: &Assignment) -> Result<AgentOutput, AgentFailure> {
        let expected = assignment.expected_kind();
        let attempts = self.config.output_retries.saturating_add(1);
        let offered = tools::definitions(assignment, self.config.strict_schema)
            .filter(|_| self.config.tools.enabled);
        let on_demand = offered.is_some() && self.config.tools.code_on_demand;
        let mut turns: Vec<ChatCompletionRequestMessage> = user_messages(assignment, on_demand);
        let mut usage = Usage::default();
        let mut last = String::new();
        let mut attempt = 0u32;
        let mut rounds = 0u32;
        let mut transcript = tools::Transcript::new(assignment, &self.config.model);
        while attempt < attempts {
            let mode = self.structured();
            self.check_call(assignment, &usage, expected, mode, &turns)?;
            let started = Instant::now();
            let offer = offered
                .as_ref()
                .filter(|_| rounds < self.config.tools.max_rounds);
            let completion = match self.call(expected, mode, &turns, offer).await {
                Ok(c) => c,
                Err(CallError::SchemaRefused(detail)) => {
                    tracing::warn!(
                        role = %self.role,
                        %detail,
                        "server refused the json_schema response format; asking by prompt instead"
                    );
                    self.schema_refused.store(true, Ordering::Relaxed);
                    continue;
                }
                Err(CallError::Fail(f)) => return Err(f),
            };
            self.account(assignment, &completion, started, &mut usage);
            if let (Some(_), Some(bench)) = (offer, &assignment.tools)
                && tools::wants_tools(&completion)
            {
                rounds += 1;
                let calls =
                    tools::round(bench, &completion, rounds, &mut turns, &mut transcript).await;
                usage.tool_calls = usage.tool_calls.saturating_add(calls);
                if rounds == self.config.tools.max_rounds {
                    turns.push(
                        ChatCompletionRequestUserMessage::from(format!(
                            "No tool rounds are left for this step: answer now with the {expected}."
                        ))
                        .into(),
                    );
                }
                continue;
            }
            attempt += 1;
            match interpret(assignment, &completion) {
                Ok(artifact) => {
                    let transcript = self.keep(&transcript);
                    return Ok(AgentOutput {
                        artifact,
                        usage,
                        transcript,
                    });
                }
                Err(detail) => {
                    let detail = self.key.scrub(&detail);
                    tracing::warn!(
                        role = %self.role,
                        step = %assignment.step,
                        attempt,
                        of = attempts,
                        %detail,
                        "invalid model output"
                    );
                    turns.push(
                        ChatCompletionRequestAssistantMessage::from(
                            completion.content.clone().unwrap_or_default(),
                        )
                        .into(),
                    );
                    turns.push(
                        ChatCompletionRequestUserMessage::from(format!(
                            "Your answer was rejected: {detail}\nAnswer again with the whole \
                             corrected JSON object {{\"kind\": \"{expected}\", \"body\": {{…}}}} \
                             and nothing else."
                        ))
                        .into(),
                    );
                    last = detail;
                }
            }
        }
        self.keep(&transcript);
        Err(AgentFailure::InvalidOutput {
            attempts,
            detail: last,
            usage,
        })
    }

    /// Counts one call's usage in the step's, and logs the call.
    fn account(
        &self,
        a: &Assignment,
        completion: &Completion,
        started: Instant,
        usage: &mut Usage,
    ) {
        let tokens =
            completion.prompt_tokens.unwrap_or(0) + completion.completion_tokens.unwrap_or(0);
        let call = self.call_usage(completion);
        usage.add(&call);
        self.count(&call);
        self.add_spent(tokens, Duration::ZERO, 1);
        tracing::info!(
            role = %self.role,
            model = %self.config.model,
            step = %a.step,
            calls = usage.calls,
            tool_calls = usage.tool_calls,
            prompt_tokens = completion.prompt_tokens,
            completion_tokens = completion.completion_tokens,
            usage_reported = completion.prompt_tokens.is_some(),
            elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "model call"
        );
    }

    /// Writes the step's transcript of tool calls, when it has one; a transcript that cannot
    /// be written is logged, not fatal (the answer is still checked and recorded).
    fn keep(&self, transcript: &tools::Transcript) -> Option<consort_actors::TranscriptRef> {
        match transcript.keep(self.config.transcript_dir.as_deref()) {
            Ok(kept) => kept,
            Err(detail) => {
                tracing::warn!(role = %self.role, %detail, "tool transcript not kept");
                None
            }
        }
    }

    async fn call(
        &self,
        expected: ArtifactKind,
        mode: StructuredOutput,
        turns: &[ChatCompletionRequestMessage],
        tools: Option<&Value>,
    ) -> Result<Completion, CallError> {
        let fail = |detail: String| CallError::Fail(AgentFailure::ModelUnavailable { detail });
        let mut messages: Vec<ChatCompletionRequestMessage> = vec![
            ChatCompletionRequestSystemMessage::from(self.system_message(expected, mode)).into(),
        ];
        messages.extend_from_slice(turns);
        let mut args = CreateChatCompletionRequestArgs::default();
        args.model(self.config.model.clone()).messages(messages);
        if let Some(t) = self.config.temperature {
            args.temperature(t);
        }
        match mode {
            StructuredOutput::JsonSchema => {
                args.response_format(ResponseFormat::JsonSchema {
                    json_schema: ResponseFormatJsonSchema {
                        description: Some(format!("A Consort {expected} artifact")),
                        name: format!("consort_{}", expected.to_string().replace('-', "_")),
                        schema: response_schema(expected, self.config.strict_schema),
                        strict: Some(self.config.strict_schema),
                    },
                });
            }
            StructuredOutput::JsonObject => {
                args.response_format(ResponseFormat::JsonObject);
            }
            StructuredOutput::Prompt => {}
        }
        let request = args
            .build()
            .map_err(|e| fail(format!("cannot build the request: {e}")))?;
        let mut body = serde_json::to_value(&request)
            .map_err(|e| fail(format!("cannot serialise the request: {e}")))?;
        if let (Some(n), Some(obj)) = (self.config.max_tokens, body.as_object_mut()) {
            let field = match self.config.token_limit_field {
                TokenLimitField::MaxCompletionTokens => "max_completion_tokens",
                TokenLimitField::MaxTokens => "max_tokens",
            };
            obj.insert(field.into(), json!(n));
        }
        if let (Some(t), Some(obj)) = (tools, body.as_object_mut()) {
            obj.insert("tools".into(), t.clone());
        }
        let body = with_ordered_schema(body).map_err(fail)?;
        let answer: Result<Value, OpenAIError> = self.client.chat().create_byot(&body).await;
        match answer {
            Ok(v) => read_completion(&v).map_err(|detail| {
                fail(format!(
                    "the server's answer is not a chat completion: {detail}"
                ))
            }),
            Err(OpenAIError::ApiError(e))
                if e.status_code.as_u16() == 400
                    && mode == StructuredOutput::JsonSchema
                    && about_response_format(&e.api_error) =>
            {
                Err(CallError::SchemaRefused(self.key.scrub(&e.to_string())))
            }
            Err(e) => Err(fail(self.describe_error(&e))),
        }
    }

    fn describe_error(&self, e: &OpenAIError) -> String {
        let text = match e {
            OpenAIError::ApiError(api) => {
                let retried = api.status_code.as_u16() == 429 || api.status_code.is_server_error();
                format!(
                    "HTTP {}{}: {}",
                    api.status_code,
                    if retried {
                        format!(" after {} request(s)", self.config.http.max_retries + 1)
                    } else {
                        String::new()
                    },
                    excerpt(&api.api_error.message)
                )
            }
            OpenAIError::Reqwest(r) if r.is_timeout() => format!(
                "no answer within {} s at {} after {} request(s)",
                self.config.http.request_timeout_secs,
                self.config.base_url,
                self.config.http.max_retries + 1
            ),
            OpenAIError::Reqwest(r) if r.is_connect() => format!(
                "cannot connect to {} after {} request(s)",
                self.config.base_url,
                self.config.http.max_retries + 1
            ),
            OpenAIError::JSONDeserialize(_, content) => {
                format!("the server's answer is not JSON: {}", excerpt(content))
            }
            other => excerpt(&other.to_string()),
        };
        self.key.scrub(&text)
    }
}

/// Whether a 400 answer complains about the `response_format` (and not, say, the context
/// length).
fn about_response_format(e: &async_openai::error::ApiError) -> bool {
    let text =
        format!("{} {}", e.message, e.param.as_deref().unwrap_or_default()).to_ascii_lowercase();
    [
        "response_format",
        "json_schema",
        "structured output",
        "schema",
    ]
    .iter()
    .any(|w| text.contains(w))
}

fn excerpt(s: &str) -> String {
    crate::validate::clip(s.trim(), 300)
}

/// The user messages of an assignment, as JSON: the part that stays the same from step to
/// step first (how the tests run, the schema plan), then the step's own part, so that a server
/// can cache the prompt's beginning (see `consort_actors::context`).
///
/// With `on_demand` (the model has `read_file`), the files other than the entry's test are
/// listed with their sizes instead of carried: the prompt stops growing with the code, and the
/// model reads what it needs.
fn user_messages(a: &Assignment, on_demand: bool) -> Vec<ChatCompletionRequestMessage> {
    let mut carried = a.inputs.clone();
    let entry_test = a.inputs.test.as_ref().map(|t| t.path.as_str());
    let readable: Vec<(String, usize)> = if on_demand {
        let (keep, read) = std::mem::take(&mut carried.files)
            .into_iter()
            .partition(|(p, _)| Some(p.as_str()) == entry_test);
        carried.files = keep;
        read.into_iter()
            .map(|(p, t): (String, String)| (p, t.len()))
            .collect()
    } else {
        Vec::new()
    };
    let mut inputs = serde_json::to_value(&carried).unwrap_or(Value::Null);
    let mut stable = serde_json::Map::new();
    if let Some(o) = inputs.as_object_mut() {
        o.retain(|_, v| !(v.is_null() || v.as_object().is_some_and(|m| m.is_empty())));
        if let Some(schema) = o.remove("schema") {
            stable.insert("schema".into(), schema);
        }
        if !a.inputs.not_included.is_empty()
            || a.inputs.not_listed.is_some()
            || !readable.is_empty()
        {
            o.remove("not_listed");
            o.insert("not_included".into(), not_included(a, &readable));
        }
    }
    if let Some(h) = &a.harness {
        stable.insert("harness".into(), json!(h));
    }
    let mut step = json!({
        "step": a.step.to_string(),
        "role": a.role,
        "attempt": a.attempt,
        "answer_with": a.expected_kind(),
        "inputs": inputs,
        "feedback": a.feedback,
    });
    if let (Some(w), Some(o)) = (&a.writes, step.as_object_mut()) {
        o.insert("writes".into(), json!(w));
    }
    let mut out = Vec::with_capacity(2);
    if !stable.is_empty() {
        out.push(ChatCompletionRequestUserMessage::from(Value::Object(stable).to_string()).into());
    }
    out.push(ChatCompletionRequestUserMessage::from(step.to_string()).into());
    out
}

/// The request's JSON text with its response schema written in reasoning order (see
/// [`schema::ordered_schema_text`]): a `serde_json::Value` would sort the properties
/// alphabetically, and a strict server generates them in the order the schema gives.
fn with_ordered_schema(mut body: Value) -> Result<Box<serde_json::value::RawValue>, String> {
    const PLACEHOLDER: &str = "__consort_response_schema_7c1e__";
    let slot = body
        .pointer_mut("/response_format/json_schema/schema")
        .map(|s| std::mem::replace(s, json!(PLACEHOLDER)));
    let mut text = body.to_string();
    if let Some(schema) = slot {
        text = text.replacen(
            &json!(PLACEHOLDER).to_string(),
            &ordered_schema_text(&schema),
            1,
        );
    }
    serde_json::value::RawValue::from_string(text)
        .map_err(|e| format!("cannot serialise the request: {e}"))
}

/// The files an assignment lists but does not carry, grouped by why: `{"not in this step's
/// context": ["tests/t1.sql (638 bytes)", …]}`; `readable` are the step's own files left for
/// the model to read.
fn not_included(a: &Assignment, readable: &[(String, usize)]) -> Value {
    let mut groups: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (path, bytes) in readable {
        groups
            .entry("this step's code: read it with read_file")
            .or_default()
            .push(format!("{path} ({bytes} bytes)"));
    }
    for f in &a.inputs.not_included {
        let why = match f.why {
            Omission::NotInPack => "not in this step's context",
            Omission::OverLimit => "over the assignment's size limit",
            Omission::NotText => "not text",
        };
        groups
            .entry(why)
            .or_default()
            .push(format!("{} ({} bytes)", f.path, f.bytes));
    }
    if let Some(rest) = a.inputs.not_listed {
        groups
            .entry("not listed")
            .or_default()
            .push(format!("{} more files ({} bytes)", rest.files, rest.bytes));
    }
    json!(groups)
}

/// Turns a completion into a valid artifact of the expected kind, or says what is wrong.
fn interpret(assignment: &Assignment, c: &Completion) -> Result<Artifact, String> {
    let expected = assignment.expected_kind();
    let text = match (&c.content, &c.refusal) {
        (Some(t), _) if !t.trim().is_empty() => t,
        (_, Some(r)) => return Err(format!("you refused: {}", excerpt(r))),
        _ => {
            return Err(match c.finish_reason.as_deref() {
                Some("length") => "the answer was cut off at the token limit".into(),
                _ => "the answer is empty".into(),
            });
        }
    };
    let value = extract_json(text)?;
    let artifact = parse_artifact(expected, value)?;
    if artifact.kind() != expected {
        return Err(format!(
            "you answered with a {}, but step {} needs a {expected}",
            artifact.kind(),
            assignment.step
        ));
    }
    check_artifact(assignment, &artifact)
        .map_err(|v| format!("the {expected} breaks the rules: {v}"))?;
    Ok(artifact)
}

impl Agent for OpenAiAgent {
    fn act<'a>(&'a self, assignment: &'a Assignment) -> ActFuture<'a> {
        Box::pin(async move {
            let started = Instant::now();
            let result = self.within_wall_budget(assignment).await;
            self.add_spent(0, started.elapsed(), 0);
            result
        })
    }

    fn describe(&self) -> String {
        format!("openai({} at {})", self.config.model, self.config.base_url)
    }
}
