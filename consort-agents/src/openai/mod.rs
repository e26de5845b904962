//! The OpenAI-compatible backend: a chat-completions model asked for structured output.
//!
//! One [`OpenAiAgent`] per role, each with its own [`OpenAiConfig`] (base URL, model, key
//! variable, temperature, token limit, retries, budgets). The request carries the role's system
//! prompt (from `prompts/<role>.md`) and the assignment as JSON; the answer is asked for with a
//! `json_schema` response format derived from the artifact type, read as raw JSON (so
//! `"id": null` or a missing `usage` do not matter), its JSON found even inside prose or a
//! fence, and validated against the artifact type and the role rules. An invalid answer is
//! sent back with the reason, up to [`OpenAiConfig::output_retries`] times. An answer cut
//! off at the token limit is fed back naming the limit, and the limit is doubled once when the
//! budget allows it; every finish reason other than a natural stop is counted in the step's
//! [`Usage::finish_reasons`].
//!
//! **Tools on every compatible server.** Build steps offer tools. Whether a server returns tool
//! calls when the same request carries a `response_format` is learned, not assumed
//! ([`ToolProtocol`]): where it does not (llama.cpp), tool rounds go without the schema and the
//! answer is asked for with it. A tool call repeated word for word is answered from the first
//! one's result and counted ([`Usage::repeated_tool_calls`]).
//!
//! **Context windows.** With a known window ([`OpenAiConfig::context_tokens`] or the server's
//! `/props`), every call's prompt is measured before it is sent and cut to fit: code listed
//! instead of carried, older feedback dropped, earlier tool results cut. A prompt that still
//! does not fit, or that the server refuses for its length, ends the step with
//! [`AgentFailure::ContextExceeded`](consort_actors::AgentFailure::ContextExceeded) naming the step, the prompt's size and the window; it is
//! never retried as it was.
//!
//! **The API key never appears in logs, errors or `Debug` output**: it lives in an [`ApiKey`]
//! whose `Debug` is redacted, and every error text is scrubbed of it.

mod budget;
mod converse;
mod extract;
mod schema;
mod server;
mod talk;
mod tools;
mod transport;

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use consort_actors::{ArtifactKind, Assignment, Role, Usage};
use serde::{Deserialize, Serialize};

use crate::agent::{ActFuture, Agent};
use crate::prompts::system_prompt;

pub use extract::{Completion, ToolCall, extract_json, read_completion};
pub use schema::{body_schema, ordered_schema_text, response_schema};
pub use server::{
    ContextRefusal, ServerCheck, ToolProtocol, check_server, context_refusal, learned_protocol,
    window_from_props,
};
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
    #[error("base_url `{0}` must start with http:// or https:// (and include /v1)")]
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
/// before making it ([`consort_actors::AgentFailure::BudgetSpent`]).
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
    /// How tool rounds and structured output share a conversation (see [`ToolProtocol`]).
    /// Default: detected once per server and model.
    pub tool_protocol: ToolProtocol,
    /// The model's context window in tokens. None (default): read from the server where it
    /// says (llama.cpp's `/props`), else unknown. Each call's prompt is fitted into it before
    /// it is sent (see the module documentation).
    pub context_tokens: Option<u32>,
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
            tool_protocol: ToolProtocol::default(),
            context_tokens: None,
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
    /// The same HTTP client, for the server's own endpoints (`/props`).
    http: reqwest::Client,
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
            RetryTransport::new(http.clone(), config.http.clone()).scrubbing(&key),
        );
        Ok(OpenAiAgent {
            role,
            config,
            key,
            client,
            http,
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

    /// The role's system prompt, with the answer's schema when `with_schema` (the schema is not
    /// sent as `response_format`, or not in every call of the step).
    fn system_message(&self, expected: ArtifactKind, with_schema: bool) -> String {
        let mut text = system_prompt(self.role);
        if with_schema {
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

fn excerpt(s: &str) -> String {
    crate::validate::clip(s.trim(), 300)
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
