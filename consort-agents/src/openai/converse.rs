//! One step's conversation with the model: tool rounds, the answer, its checks and the
//! feedback after a refused answer, each call fitted to the context window and the budget.

use std::time::{Duration, Instant};

use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestAssistantMessage, ChatCompletionRequestMessage,
    ChatCompletionRequestSystemMessage, ChatCompletionRequestUserMessage,
    CreateChatCompletionRequestArgs, ResponseFormat, ResponseFormatJsonSchema,
};
use consort_actors::{AgentFailure, Artifact, ArtifactKind, Assignment, ContextMeasure, Usage};
use serde_json::{Value, json};

use super::server::{self, ContextRefusal, ToolProtocol};
use super::talk::Talk;
use super::{
    Completion, OpenAiAgent, StructuredOutput, TokenLimitField, excerpt, extract_json,
    ordered_schema_text, read_completion, response_schema, tools,
};
use crate::agent::AgentOutput;
use crate::validate::{check_artifact, parse_artifact};

/// Characters per token when a prompt is measured against the context window: JSON and code
/// run about three characters a token, fewer than prose.
const CHARS_PER_TOKEN: usize = 3;

pub(super) enum CallError {
    /// Give up with this failure.
    Fail(AgentFailure),
    /// The server refused the response_format (HTTP 400): retry without it.
    SchemaRefused(String),
    /// The prompt does not fit the context window: estimated so before the call, or the
    /// server refused it.
    ContextRefused(ContextRefusal, ContextMeasure),
    /// The server could not read what the model wrote (llama.cpp: "the model produced output
    /// that does not match the expected format"): the model's fault, not the server's.
    Unreadable(String),
}

/// What one call asks for.
#[derive(Clone, Copy)]
pub(super) struct Ask<'t> {
    expected: ArtifactKind,
    mode: StructuredOutput,
    /// The schema goes in the system prompt (also while `response_format` is left out for tool
    /// rounds, so the prompt's beginning stays the same for the server's cache).
    schema_in_prompt: bool,
    tools: Option<&'t Value>,
    /// `tool_choice: "required"`.
    require_tool: bool,
    limit: Option<u32>,
}

/// Where a step's conversation stands.
struct Progress {
    attempt: u32,
    rounds: u32,
    /// The completion token limit of the next call.
    limit: Option<u32>,
    /// The limit was raised once after a cut-off answer.
    raised: bool,
    /// Tools are no longer offered: the next call asks for the answer.
    answering: bool,
    last: String,
}

impl OpenAiAgent {
    pub(super) async fn converse(&self, a: &Assignment) -> Result<AgentOutput, AgentFailure> {
        let expected = a.expected_kind();
        let attempts = self.config.output_retries.saturating_add(1);
        let offered =
            tools::definitions(a, self.config.strict_schema).filter(|_| self.config.tools.enabled);
        let mut usage = Usage::default();
        let protocol = match offered {
            Some(_) => self.protocol(&mut usage).await?,
            None => ToolProtocol::Together,
        };
        let window = self.window().await;
        let mut talk = Talk::new(a, offered.is_some(), self.config.tools.code_on_demand);
        let mut transcript = tools::Transcript::new(a, &self.config.model);
        let mut at = Progress {
            attempt: 0,
            rounds: 0,
            limit: self.config.max_tokens,
            raised: false,
            answering: false,
            last: String::new(),
        };
        while at.attempt < attempts {
            let tools_now = offered
                .as_ref()
                .filter(|_| at.rounds < self.config.tools.max_rounds && !at.answering);
            let ask = self.ask(expected, protocol, offered.is_some(), tools_now, &at);
            let completion = match self.fitted_call(a, &mut talk, &usage, ask, window).await {
                Ok(c) => c,
                Err(CallError::SchemaRefused(detail)) => {
                    self.drop_schema(&detail);
                    continue;
                }
                Err(CallError::ContextRefused(r, measured)) => {
                    self.keep(&transcript);
                    let failure = self.context_exceeded(a, &talk, ask, r, measured, window);
                    return Err(failure.with_usage(&usage));
                }
                Err(CallError::Fail(f)) => {
                    self.keep(&transcript);
                    return Err(f.with_usage(&usage));
                }
                Err(CallError::Unreadable(detail)) => {
                    self.unreadable(a, &mut talk, &mut at, detail);
                    continue;
                }
            };
            self.account(a, &completion, &mut usage);
            if let (Some(_), Some(bench)) = (tools_now, &a.tools)
                && tools::wants_tools(&completion)
            {
                at.rounds += 1;
                let made = tools::round(
                    bench,
                    &completion,
                    at.rounds,
                    talk.later_mut(),
                    &mut transcript,
                )
                .await;
                usage.tool_calls = usage.tool_calls.saturating_add(made.calls);
                usage.repeated_tool_calls = usage.repeated_tool_calls.saturating_add(made.repeated);
                if at.rounds == self.config.tools.max_rounds {
                    talk.push(ChatCompletionRequestUserMessage::from(format!(
                        "No tool rounds are left for this step: answer now with the {expected}."
                    )));
                }
                continue;
            }
            at.attempt += 1;
            match interpret(a, &completion) {
                Ok(artifact) => {
                    let transcript = self.keep(&transcript);
                    return Ok(AgentOutput {
                        artifact,
                        usage,
                        transcript,
                    });
                }
                Err(detail) => {
                    at.answering = protocol == ToolProtocol::Separate;
                    self.refused(a, &mut talk, &mut at, &usage, &completion, detail, attempts);
                }
            }
        }
        self.keep(&transcript);
        Err(AgentFailure::InvalidOutput {
            attempts,
            detail: at.last,
            usage,
        })
    }

    /// What the next call asks for.
    fn ask<'t>(
        &self,
        expected: ArtifactKind,
        protocol: ToolProtocol,
        step_has_tools: bool,
        tools_now: Option<&'t Value>,
        at: &Progress,
    ) -> Ask<'t> {
        let separate = protocol == ToolProtocol::Separate && step_has_tools;
        let mode = if separate && tools_now.is_some() {
            StructuredOutput::Prompt
        } else {
            self.structured()
        };
        Ask {
            expected,
            mode,
            schema_in_prompt: mode != StructuredOutput::JsonSchema || separate,
            tools: tools_now,
            require_tool: tools_now.is_some() && at.rounds == 0 && self.config.tools.require_first,
            limit: at.limit,
        }
    }

    /// An answer the server could not parse costs an attempt; the next call asks for the answer
    /// without tools.
    fn unreadable(&self, a: &Assignment, talk: &mut Talk<'_>, at: &mut Progress, detail: String) {
        at.attempt += 1;
        at.answering = true;
        tracing::warn!(role = %self.role, step = %a.step, %detail, "the server could not read the model's answer");
        talk.push(ChatCompletionRequestUserMessage::from(format!(
            "The server could not read your last answer ({detail}). Answer now with the whole \
             JSON object {{\"kind\": \"{}\", \"body\": {{…}}}} and nothing else.",
            a.expected_kind()
        )));
        at.last = detail;
    }

    /// Feeds a refused answer back, raising the token limit once after a cut-off answer when
    /// the budget allows it.
    #[allow(clippy::too_many_arguments)]
    fn refused(
        &self,
        a: &Assignment,
        talk: &mut Talk<'_>,
        at: &mut Progress,
        usage: &Usage,
        completion: &Completion,
        detail: String,
        attempts: u32,
    ) {
        let cut_off = completion.finish_reason.as_deref() == Some("length");
        let mut detail = self.key.scrub(&detail);
        if cut_off {
            let limit = at
                .limit
                .map_or("the server's limit".to_string(), |n| format!("{n} tokens"));
            detail = format!(
                "your answer was cut off at the token limit ({limit}) before it was complete ({detail}); \
                 write the JSON object alone, without padding or repeated whitespace"
            );
            if let (Some(n), false) = (at.limit, at.raised) {
                let raised = n.saturating_mul(2);
                let fits = self.check_call(a, usage, Some(raised), 0).is_ok();
                if fits {
                    at.limit = Some(raised);
                    at.raised = true;
                    detail.push_str(&format!("; the limit is now {raised} tokens"));
                }
            }
        }
        tracing::warn!(
            role = %self.role,
            step = %a.step,
            attempt = at.attempt,
            of = attempts,
            %detail,
            "invalid model output"
        );
        let expected = a.expected_kind();
        talk.push(ChatCompletionRequestAssistantMessage::from(
            completion.content.clone().unwrap_or_default(),
        ));
        talk.push(ChatCompletionRequestUserMessage::from(format!(
            "Your answer was rejected: {detail}\nAnswer again with the whole corrected JSON \
             object {{\"kind\": \"{expected}\", \"body\": {{…}}}} and nothing else."
        )));
        at.last = detail;
    }

    /// Makes the call once its prompt fits the context window (cutting it as far as
    /// [`Talk::tighten`] goes) and the budget.
    async fn fitted_call(
        &self,
        a: &Assignment,
        talk: &mut Talk<'_>,
        usage: &Usage,
        ask: Ask<'_>,
        window: Option<u64>,
    ) -> Result<Completion, CallError> {
        let mut chars = self.prompt_chars(talk, ask);
        if let Some(window) = window {
            loop {
                let need = tokens_of(chars) + self.reserve(ask, window);
                if need <= window {
                    break;
                }
                if !talk.tighten() {
                    return Err(CallError::ContextRefused(
                        ContextRefusal {
                            prompt_tokens: Some(need),
                            window: Some(window),
                        },
                        ContextMeasure::Estimated,
                    ));
                }
                tracing::info!(role = %self.role, step = %a.step, fit = %talk.fit(), need, window,
                    "the prompt was cut to fit the context window");
                chars = self.prompt_chars(talk, ask);
            }
        }
        self.check_call(a, usage, ask.limit, chars)
            .map_err(CallError::Fail)?;
        self.call(ask, &talk.turns()).await
    }

    /// The completion tokens a call keeps room for: its limit, or an eighth of the window.
    fn reserve(&self, ask: Ask<'_>, window: u64) -> u64 {
        ask.limit.map_or(window / 8, u64::from)
    }

    /// The prompt's size in characters: system prompt, messages and tool definitions (which a
    /// chat template renders into the prompt). The response schema is left out: llama.cpp turns
    /// it into a grammar, not prompt tokens.
    fn prompt_chars(&self, talk: &Talk<'_>, ask: Ask<'_>) -> usize {
        let system = self.system_message(ask.expected, ask.schema_in_prompt);
        let turns = serde_json::to_string(&talk.turns()).map_or(0, |t| t.chars().count());
        let tools = ask.tools.map_or(0, |t| t.to_string().chars().count());
        system.chars().count() + turns + tools
    }

    fn context_exceeded(
        &self,
        a: &Assignment,
        talk: &Talk<'_>,
        ask: Ask<'_>,
        refusal: ContextRefusal,
        measured: ContextMeasure,
        window: Option<u64>,
    ) -> AgentFailure {
        let tokens = refusal
            .prompt_tokens
            .unwrap_or_else(|| tokens_of(self.prompt_chars(talk, ask)));
        let failure = AgentFailure::ContextExceeded {
            step: a.step.to_string(),
            prompt_tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
            window: refusal
                .window
                .or(window)
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
            measured,
            usage: Usage::default(),
        };
        tracing::warn!(role = %self.role, %failure, "the prompt does not fit the context window");
        failure
    }

    /// The protocol for tools and structured output with this server: configured, or learned
    /// once per server and model by a probe (whose tokens count in `usage`).
    async fn protocol(&self, usage: &mut Usage) -> Result<ToolProtocol, AgentFailure> {
        if self.config.tool_protocol != ToolProtocol::Detect {
            return Ok(self.config.tool_protocol);
        }
        let (base, model) = (&self.config.base_url, &self.config.model);
        if let Some(known) = server::recall(base, model).protocol {
            return Ok(known);
        }
        let body = server::probe_request(model, self.limit_field());
        let answer: Result<Value, OpenAIError> = self.client.chat().create_byot(&body).await;
        let protocol = match answer {
            Ok(v) => {
                let c = read_completion(&v).unwrap_or_default();
                let call = self.call_usage(&c);
                usage.add(&call);
                self.count(&call);
                if c.tool_calls.is_empty() {
                    ToolProtocol::Separate
                } else {
                    ToolProtocol::Together
                }
            }
            Err(OpenAIError::ApiError(e)) if e.status_code.is_client_error() => {
                ToolProtocol::Separate
            }
            Err(OpenAIError::JSONDeserialize(..)) => ToolProtocol::Separate,
            Err(e) => {
                return Err(AgentFailure::ModelUnavailable {
                    detail: self.describe_error(&e),
                    usage: Usage::default(),
                });
            }
        };
        tracing::info!(base_url = %base, %model, %protocol, "tool protocol detected");
        server::remember(base, model, |l| l.protocol = Some(protocol));
        Ok(protocol)
    }

    /// The model's context window: configured, or what the server says (asked once per server
    /// and model), or unknown.
    async fn window(&self) -> Option<u64> {
        if let Some(n) = self.config.context_tokens {
            return Some(u64::from(n));
        }
        let (base, model) = (&self.config.base_url, &self.config.model);
        if let Some(known) = server::recall(base, model).window {
            return known;
        }
        let window = server::ask_window(&self.http, base, self.key.expose()).await;
        server::remember(base, model, |l| l.window = Some(window));
        window
    }

    fn limit_field(&self) -> &'static str {
        match self.config.token_limit_field {
            TokenLimitField::MaxCompletionTokens => "max_completion_tokens",
            TokenLimitField::MaxTokens => "max_tokens",
        }
    }

    fn drop_schema(&self, detail: &str) {
        tracing::warn!(
            role = %self.role,
            %detail,
            "server refused the json_schema response format; asking by prompt instead"
        );
        self.schema_refused
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts one call's usage in the step's (with its finish reason when it was not a natural
    /// stop), and logs the call.
    fn account(&self, a: &Assignment, completion: &Completion, usage: &mut Usage) {
        let mut call = self.call_usage(completion);
        if let Some(reason) = completion
            .finish_reason
            .as_deref()
            .filter(|r| !["stop", "tool_calls", "function_call"].contains(r))
        {
            call.finish_reasons.insert(reason.to_string(), 1);
        }
        usage.add(&call);
        self.count(&call);
        self.add_spent(call.tokens(), Duration::ZERO, 1);
        tracing::info!(
            role = %self.role,
            model = %self.config.model,
            step = %a.step,
            calls = usage.calls,
            tool_calls = usage.tool_calls,
            prompt_tokens = completion.prompt_tokens,
            completion_tokens = completion.completion_tokens,
            usage_reported = completion.prompt_tokens.is_some(),
            finish_reason = completion.finish_reason.as_deref().unwrap_or("none"),
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
        ask: Ask<'_>,
        turns: &[ChatCompletionRequestMessage],
    ) -> Result<Completion, CallError> {
        let started = Instant::now();
        let body = self.request_body(ask, turns).map_err(|detail| {
            CallError::Fail(AgentFailure::ModelUnavailable {
                detail,
                usage: Usage::default(),
            })
        })?;
        let answer: Result<Value, OpenAIError> = self.client.chat().create_byot(&body).await;
        tracing::debug!(role = %self.role, elapsed_ms = started.elapsed().as_millis() as u64, "model answered");
        match answer {
            Ok(v) => read_completion(&v).map_err(|detail| {
                CallError::Fail(AgentFailure::ModelUnavailable {
                    detail: format!("the server's answer is not a chat completion: {detail}"),
                    usage: Usage::default(),
                })
            }),
            Err(e) => Err(self.call_error(&e, ask.mode)),
        }
    }

    /// Types a failed call: a context refusal, a refused schema, or the server failing.
    fn call_error(&self, e: &OpenAIError, mode: StructuredOutput) -> CallError {
        let (status, error) = error_parts(e);
        if let Some(error) = &error
            && let Some(refusal) = server::context_refusal(
                &error.message,
                error.r#type.as_deref(),
                error.code.as_deref(),
            )
        {
            return CallError::ContextRefused(refusal, ContextMeasure::ServerRefused);
        }
        if let Some(error) = &error
            && status.is_some_and(|s| s >= 500)
            && unreadable_output(&error.message)
        {
            return CallError::Unreadable(self.key.scrub(&excerpt(&error.message)));
        }
        if status.is_none_or(|s| s == 400)
            && mode == StructuredOutput::JsonSchema
            && error.as_ref().is_some_and(about_response_format)
        {
            return CallError::SchemaRefused(self.key.scrub(&e.to_string()));
        }
        CallError::Fail(AgentFailure::ModelUnavailable {
            detail: self.describe_error(e),
            usage: Usage::default(),
        })
    }

    fn request_body(
        &self,
        ask: Ask<'_>,
        turns: &[ChatCompletionRequestMessage],
    ) -> Result<Box<serde_json::value::RawValue>, String> {
        let expected = ask.expected;
        let mut messages: Vec<ChatCompletionRequestMessage> = vec![
            ChatCompletionRequestSystemMessage::from(
                self.system_message(expected, ask.schema_in_prompt),
            )
            .into(),
        ];
        messages.extend_from_slice(turns);
        let mut args = CreateChatCompletionRequestArgs::default();
        args.model(self.config.model.clone()).messages(messages);
        if let Some(t) = self.config.temperature {
            args.temperature(t);
        }
        match ask.mode {
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
            .map_err(|e| format!("cannot build the request: {e}"))?;
        let mut body = serde_json::to_value(&request)
            .map_err(|e| format!("cannot serialise the request: {e}"))?;
        if let Some(obj) = body.as_object_mut() {
            if let Some(n) = ask.limit {
                obj.insert(self.limit_field().into(), json!(n));
            }
            if let Some(t) = ask.tools {
                obj.insert("tools".into(), t.clone());
                if ask.require_tool {
                    obj.insert("tool_choice".into(), json!("required"));
                }
            }
        }
        with_ordered_schema(body)
    }
}

/// A prompt's tokens estimated from its characters, for the context window.
fn tokens_of(chars: usize) -> u64 {
    u64::try_from(chars.div_ceil(CHARS_PER_TOKEN)).unwrap_or(u64::MAX)
}

/// The status and the error object of a failed call, when the server sent one: async-openai
/// reads OpenAI's error shape, and keeps the raw text of others (llama.cpp's numeric `code`).
fn error_parts(e: &OpenAIError) -> (Option<u16>, Option<async_openai::error::ApiError>) {
    match e {
        OpenAIError::ApiError(api) => (Some(api.status_code.as_u16()), Some(api.api_error.clone())),
        OpenAIError::JSONDeserialize(_, content) => {
            let v: Value = serde_json::from_str(content).unwrap_or(Value::Null);
            let error = v.get("error").filter(|e| e.is_object()).map(|e| {
                let text = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
                async_openai::error::ApiError {
                    message: text("message").unwrap_or_default(),
                    r#type: text("type"),
                    param: text("param"),
                    code: text("code"),
                    misalignment: None,
                }
            });
            (None, error)
        }
        _ => (None, None),
    }
}

/// Whether a server error says the model's output could not be parsed (llama.cpp's words),
/// rather than that the server failed.
fn unreadable_output(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("does not match the expected") || m.contains("failed to parse tool call")
}

/// Whether an error answer complains about the `response_format` (and not, say, the context
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

/// The request's JSON text with its response schema written in reasoning order (see
/// [`super::schema::ordered_schema_text`]): a `serde_json::Value` would sort the properties
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

/// Turns a completion into a valid artifact of the expected kind, or says what is wrong.
fn interpret(assignment: &Assignment, c: &Completion) -> Result<Artifact, String> {
    let expected = assignment.expected_kind();
    let text = match (&c.content, &c.refusal) {
        (Some(t), _) if !t.trim().is_empty() => t,
        (_, Some(r)) => return Err(format!("you refused: {}", excerpt(r))),
        _ => {
            return Err(match c.finish_reason.as_deref() {
                Some("length") => "the answer was empty when it was cut off".into(),
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
        .map_err(|v| format!("the {expected} answer breaks the rules: {v}"))?;
    Ok(artifact)
}
