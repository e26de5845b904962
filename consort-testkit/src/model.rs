//! A loopback OpenAI-compatible chat-completions server (`POST /v1/chat/completions` on
//! 127.0.0.1), answering from a queue of replies (the last one repeats) or from a function of
//! the request, and recording every request it receives. It lists its models
//! (`GET /v1/models`) and, when asked to, tells its context window as llama.cpp does
//! (`GET /props`).

use std::collections::VecDeque;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use consort_actors::{Role, Step};
use serde_json::{Value, json};
use tokio::sync::Notify;

/// What the stub answers to one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A status, extra headers and a JSON body.
    Json(u16, Vec<(&'static str, String)>, Value),
    /// Never answer.
    Hang,
    /// 400 when the request carries `response_format`, else the inner reply.
    RefuseSchema(Box<Reply>),
    /// An error status whose message repeats the `Authorization` header it received, as a
    /// careless server might.
    EchoKey(u16),
}

/// One request the stub received.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The JSON body.
    pub body: Value,
}

impl Seen {
    /// The messages of the request.
    pub fn messages(&self) -> &Vec<Value> {
        self.body["messages"].as_array().expect("messages")
    }

    /// The content of the message at `i`.
    pub fn content(&self, i: usize) -> &str {
        self.messages()[i]["content"]
            .as_str()
            .expect("text content")
    }

    /// What the request's assignment asks: the role, step and attempt of the last user message
    /// that names a step (the step's part comes after the stable part of the prompt).
    pub fn asked(&self) -> Option<(Role, Step, u32)> {
        self.body["messages"]
            .as_array()?
            .iter()
            .rev()
            .find_map(|m| {
                let a: Value = serde_json::from_str(m["content"].as_str()?).ok()?;
                let step = Step::from_str(a["step"].as_str()?).ok()?;
                let role = Role::from_str(a["role"].as_str()?).ok()?;
                let attempt = u32::try_from(a["attempt"].as_u64().unwrap_or(0)).ok()?;
                Some((role, step, attempt))
            })
    }

    /// The rounds of tool calls the request's conversation already holds (assistant turns
    /// that called tools).
    pub fn tool_rounds(&self) -> usize {
        self.body["messages"].as_array().map_or(0, |all| {
            all.iter()
                .filter(|m| m["role"] == "assistant" && m["tool_calls"].is_array())
                .count()
        })
    }

    /// The results of the tool calls in the request's conversation, in order.
    pub fn tool_results(&self) -> Vec<String> {
        self.body["messages"].as_array().map_or(Vec::new(), |all| {
            all.iter()
                .filter(|m| m["role"] == "tool")
                .filter_map(|m| m["content"].as_str().map(str::to_string))
                .collect()
        })
    }

    /// Characters of the request's messages (system and user turns): what a server tokenises,
    /// without the schema sent as `response_format`.
    pub fn prompt_chars(&self) -> usize {
        self.body["messages"].as_array().map_or(0, |all| {
            all.iter()
                .filter_map(|m| m["content"].as_str())
                .map(|t| t.chars().count())
                .sum()
        })
    }
}

/// A function that answers a request.
pub type Answer = Box<dyn Fn(&Seen) -> Reply + Send + Sync>;

/// The stub's state: what it will answer and what it received.
#[derive(Default)]
pub struct Stub {
    replies: Mutex<VecDeque<Reply>>,
    last: Mutex<Option<Reply>>,
    seen: Mutex<Vec<Seen>>,
    answer: Option<Answer>,
    stop_after: Option<usize>,
    stop: Notify,
    /// What `GET /props` answers (llama.cpp's server properties); none: 404.
    props: Option<Value>,
}

impl std::fmt::Debug for Stub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stub")
            .field("requests", &self.requests())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Stub {
    /// Every request received so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.seen).clone()
    }

    /// How many requests were received.
    pub fn requests(&self) -> usize {
        lock(&self.seen).len()
    }

    /// The `Authorization` headers received (empty for a request without one).
    pub fn authorizations(&self) -> Vec<String> {
        lock(&self.seen)
            .iter()
            .map(|s| s.authorization.clone().unwrap_or_default())
            .collect()
    }

    fn next_reply(&self, seen: &Seen) -> Option<Reply> {
        if let Some(answer) = &self.answer {
            return Some(answer(seen));
        }
        let next = lock(&self.replies).pop_front();
        let mut last = lock(&self.last);
        if let Some(r) = next {
            *last = Some(r);
        }
        last.clone()
    }
}

async fn chat(State(stub): State<Arc<Stub>>, headers: HeaderMap, body: Json<Value>) -> Response {
    let seen = Seen {
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        body: body.0,
    };
    let n = {
        let mut all = lock(&stub.seen);
        all.push(seen.clone());
        all.len()
    };
    let mut response = match stub.next_reply(&seen) {
        Some(reply) => render(reply, &seen).await,
        None => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    if stub.stop_after == Some(n) {
        // Gone after this answer: the client may not send another request on this connection
        // (kept alive, it could reach the server after its listener closed).
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        stub.stop.notify_one();
    }
    response
}

fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

async fn render(reply: Reply, seen: &Seen) -> Response {
    match reply {
        Reply::Json(code, headers, value) => {
            let mut resp = (status(code), Json(value)).into_response();
            for (k, v) in headers {
                resp.headers_mut()
                    .insert(k, v.parse().expect("header value"));
            }
            resp
        }
        Reply::Hang => {
            std::future::pending::<()>().await;
            StatusCode::OK.into_response()
        }
        Reply::RefuseSchema(inner) => {
            if seen.body.get("response_format").is_some() {
                (
                    StatusCode::BAD_REQUEST,
                    Json(json!({"error": {"message": "response_format is not supported",
                        "type": "invalid_request_error", "param": "response_format", "code": null}})),
                )
                    .into_response()
            } else {
                Box::pin(render(*inner, seen)).await
            }
        }
        Reply::EchoKey(code) => {
            let auth = seen.authorization.clone().unwrap_or_default();
            (
                status(code),
                Json(error_body(&format!("rejected credentials: {auth}"))),
            )
                .into_response()
        }
    }
}

/// `GET /v1/models`: the stub's model names.
async fn models() -> Json<Value> {
    Json(json!({"object": "list", "data": [
        {"id": "stub-model", "object": "model"},
        {"id": "replay", "object": "model"},
    ]}))
}

/// `GET /props`, when the stub has properties.
async fn props(State(stub): State<Arc<Stub>>) -> Response {
    match &stub.props {
        Some(p) => Json(p.clone()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn serve(stub: Stub) -> (String, Arc<Stub>) {
    let stub = Arc::new(stub);
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", axum::routing::get(models))
        .route("/props", axum::routing::get(props))
        .with_state(Arc::clone(&stub));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("address");
    let s = Arc::clone(&stub);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { s.stop.notified().await })
            .await;
    });
    (format!("http://{addr}/v1"), stub)
}

/// Starts a stub on this runtime answering `replies` in order (the last one repeats). Returns
/// the base URL (with `/v1`) and the stub.
pub async fn start_stub(replies: Vec<Reply>) -> (String, Arc<Stub>) {
    start_stub_stopping(replies, None).await
}

/// The same, but the server goes away after `stop_after` requests.
pub async fn start_stub_stopping(
    replies: Vec<Reply>,
    stop_after: Option<usize>,
) -> (String, Arc<Stub>) {
    serve(Stub {
        replies: Mutex::new(replies.into()),
        stop_after,
        ..Stub::default()
    })
    .await
}

/// Starts a stub answering `replies` in order that also tells its context window, as
/// llama.cpp's server does (`GET /props` with `default_generation_settings.n_ctx`).
pub async fn start_stub_with_window(replies: Vec<Reply>, n_ctx: u64) -> (String, Arc<Stub>) {
    serve(Stub {
        replies: Mutex::new(replies.into()),
        props: Some(json!({"default_generation_settings": {"n_ctx": n_ctx}})),
        ..Stub::default()
    })
    .await
}

/// Starts a stub that answers each request with `answer(request)`.
pub async fn start_answering(
    answer: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
) -> (String, Arc<Stub>) {
    serve(Stub {
        answer: Some(Box::new(answer)),
        ..Stub::default()
    })
    .await
}

/// A complete chat completion whose message content is `content`.
pub fn completion(content: &str) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "stub-model",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop"
        }],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
}

/// A complete chat completion whose message calls these functions (name, arguments), with
/// ids `call_0`, `call_1`, …
pub fn tool_calls(calls: &[(&str, Value)]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("call_{i}"), "type": "function",
                   "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    json!({
        "id": "chatcmpl-tools",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "stub-model",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": null, "tool_calls": calls},
            "finish_reason": "tool_calls"
        }],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
}

/// An OpenAI-style error body with this message.
pub fn error_body(message: &str) -> Value {
    json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}})
}

/// A 200 reply with `completion(content)`.
pub fn ok(content: &str) -> Reply {
    Reply::Json(200, vec![], completion(content))
}

/// An error status with an OpenAI-style error body (and `Retry-After: 0` for 429).
pub fn fail(code: u16) -> Reply {
    let headers = if code == 429 {
        vec![("retry-after", "0".to_string())]
    } else {
        vec![]
    };
    Reply::Json(
        code,
        headers,
        error_body(&format!("the model server says {code}")),
    )
}

/// A valid change set for `green/T1`, as a model would write it.
pub fn green_answer() -> String {
    json!({"kind": "change-set", "body": {
        "summary": "stock lookup",
        "changes": [{"op": "write", "path": "src/stock.sql", "content": "select 1;\n"}]
    }})
    .to_string()
}
