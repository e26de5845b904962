//! Shared helpers for the integration tests: assignments, fixtures, a loopback
//! OpenAI-compatible server, and a tracing capture.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use consort_actors::{
    AcceptanceCriterion, Assignment, AssignmentId, AssignmentInputs, FeatureRequest, Step, Stories,
    Story,
};
use serde_json::{Value, json};

/// An assignment for `step` (its own role), attempt 0, no inputs.
pub fn assignment(id: u64, step: &str) -> Assignment {
    let step: Step = step.parse().expect("step key");
    Assignment {
        id: AssignmentId(id),
        role: step.role(),
        step,
        attempt: 0,
        inputs: AssignmentInputs::default(),
        feedback: vec![],
    }
}

pub fn feature() -> FeatureRequest {
    FeatureRequest {
        id: "F1-stock-visibility".into(),
        title: "Stock visibility".into(),
        body: "As a warehouse clerk I want to see stock per SKU and location.".into(),
    }
}

pub fn stories() -> Stories {
    Stories {
        feature_id: "F1-stock-visibility".into(),
        stories: vec![Story {
            id: "S1".into(),
            title: "See stock".into(),
            as_a: "clerk".into(),
            i_want: "to see stock per SKU and location".into(),
            so_that: "I can pick orders".into(),
            user_facing: true,
            acceptance_criteria: vec![AcceptanceCriterion {
                id: "S1-AC1".into(),
                given: "a SKU stored in two locations".into(),
                when: "I look it up".into(),
                then: "I see both quantities".into(),
            }],
        }],
    }
}

// ---------------------------------------------------------------------------------------------
// A loopback OpenAI-compatible server.

/// What the stub answers to one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A status, extra headers and a JSON body.
    Json(u16, Vec<(&'static str, String)>, Value),
    /// Never answer.
    Hang,
    /// 400 when the request carries `response_format`, else the inner reply.
    RefuseSchema(Box<Reply>),
}

/// One request the stub received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub authorization: Option<String>,
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
}

#[derive(Default)]
pub struct Stub {
    replies: Mutex<VecDeque<Reply>>,
    last: Mutex<Option<Reply>>,
    seen: Mutex<Vec<Seen>>,
}

impl Stub {
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

async fn chat(
    State(stub): State<Arc<Stub>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    stub.seen.lock().expect("lock").push(Seen {
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        body: body.clone(),
    });
    let reply = {
        let next = stub.replies.lock().expect("lock").pop_front();
        let mut last = stub.last.lock().expect("lock");
        if let Some(r) = next {
            *last = Some(r);
        }
        last.clone().expect("the stub has a reply")
    };
    render(reply, &body).await
}

async fn render(reply: Reply, body: &Value) -> Response {
    match reply {
        Reply::Json(status, headers, value) => {
            let mut resp =
                (StatusCode::from_u16(status).expect("status"), Json(value)).into_response();
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
            if body.get("response_format").is_some() {
                (
                    StatusCode::BAD_REQUEST,
                    Json(json!({"error": {"message": "response_format is not supported",
                        "type": "invalid_request_error", "param": "response_format", "code": null}})),
                )
                    .into_response()
            } else {
                Box::pin(render(*inner, body)).await
            }
        }
    }
}

/// Starts a stub on 127.0.0.1 answering `replies` in order (the last one repeats). Returns
/// the base URL (with `/v1`) and the stub.
pub async fn start_stub(replies: Vec<Reply>) -> (String, Arc<Stub>) {
    let stub = Arc::new(Stub {
        replies: Mutex::new(replies.into()),
        ..Stub::default()
    });
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(Arc::clone(&stub));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/v1"), stub)
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

/// A 200 reply with `completion(content)`.
pub fn ok(content: &str) -> Reply {
    Reply::Json(200, vec![], completion(content))
}

/// A valid change set for `green/T1`, as the model would write it.
pub fn green_answer() -> String {
    json!({"kind": "change-set", "body": {
        "summary": "stock lookup",
        "changes": [{"op": "write", "path": "src/stock.sql", "content": "select 1;\n"}]
    }})
    .to_string()
}

// ---------------------------------------------------------------------------------------------
// Capturing tracing output.

/// A `MakeWriter` that appends everything to a shared buffer.
#[derive(Clone, Default)]
pub struct Capture(pub Arc<Mutex<Vec<u8>>>);

impl Capture {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
}

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// A subscriber logging everything (TRACE, all targets) into `capture`.
pub fn capturing_subscriber(capture: &Capture) -> impl tracing::Subscriber + Send + Sync {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(capture.clone())
        .finish()
}
