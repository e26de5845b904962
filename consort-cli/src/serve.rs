//! `consort serve`: the run of one feature, driven as `consort run` drives it, with its live
//! report and an approval page on a loopback address.
//!
//! The gates are decided on the page: the run's approver ([`WebApprover`]) parks each gate
//! request until a person decides it there, and the decision goes back to the conductor, which
//! records it in the ledger as the same `Event::Gate` that `consort approve` records. A
//! decision names the hash it was made for (the page's), and only a decision for the hash the
//! gate waits for now is taken: a stale page can never approve a newer design. Every request
//! passes `guard`'s checks; a decision also needs the session's token.

mod guard;
mod pages;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Form, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::Utc;
use consort_actors::{
    Approver, BoxFuture, ContentHash, GateApproval, GateDecision, GateKind, GateRequest,
};
use tokio::sync::oneshot;

use crate::report::{RenderOptions, ReportError};
use consort::project::{Project, ProjectError, RunOptions};
use consort::runlock::RunLock;

pub use guard::Refusal;

/// Why `consort serve` could not serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The address could not be listened on.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The run could not be made.
    #[error(transparent)]
    Project(#[from] ProjectError),
}

/// What the server shares between its handlers and the run's approver.
struct Shared {
    project: Project,
    token: String,
    port: u16,
    pending: Mutex<Option<Pending>>,
    notice: Mutex<Option<String>>,
}

/// The gate the run waits at, and where its decision goes.
struct Pending {
    request: GateRequest,
    reply: Option<oneshot::Sender<GateApproval>>,
}

impl Shared {
    fn pending_request(&self) -> Option<GateRequest> {
        lock(&self.pending).as_ref().map(|p| p.request.clone())
    }

    fn notice(&self) -> Option<String> {
        lock(&self.notice).clone()
    }
}

/// A mutex's value, also after a panic elsewhere (what it guards is replaced whole).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The run's approver: parks each gate request for the page and answers with the decision a
/// person makes there. The conductor's gate timeout still applies (no answer: the gate stays
/// closed).
pub struct WebApprover {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WebApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The session token stays out of every log.
        f.debug_struct("WebApprover")
            .field("port", &self.shared.port)
            .finish_non_exhaustive()
    }
}

impl Approver for WebApprover {
    fn decide<'a>(&'a self, request: &'a GateRequest) -> BoxFuture<'a, Option<GateApproval>> {
        let (tx, rx) = oneshot::channel();
        *lock(&self.shared.pending) = Some(Pending {
            request: request.clone(),
            reply: Some(tx),
        });
        let hash = request.hash;
        Box::pin(async move {
            let _clear = ClearPending {
                shared: &self.shared,
                hash,
            };
            rx.await.ok()
        })
    }
}

/// Takes a gate off the page once its wait ends, decided or not.
struct ClearPending<'a> {
    shared: &'a Shared,
    hash: ContentHash,
}

impl Drop for ClearPending<'_> {
    fn drop(&mut self) {
        let mut pending = lock(&self.shared.pending);
        if pending
            .as_ref()
            .is_some_and(|p| p.request.hash == self.hash)
        {
            *pending = None;
        }
    }
}

/// Serves `project`'s feature on `addr` while it runs under `lock` with `opts` (its approver
/// replaced by the page's), then goes on serving the final report until `SIGINT` or
/// `SIGTERM`. Returns the run's exit code ([`crate::ui::exit_code`]).
pub async fn serve(
    project: Project,
    lock: RunLock,
    addr: SocketAddr,
    mut opts: RunOptions,
) -> Result<i32, ServeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let shared = Arc::new(Shared {
        project: project.clone(),
        token: guard::new_token(),
        port: local.port(),
        pending: Mutex::new(None),
        notice: Mutex::new(None),
    });
    println!("serving the live report and the approval page at http://{local}/");
    let (stop, stopped) = oneshot::channel::<()>();
    let app = router(Arc::clone(&shared));
    let server = tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
    });
    opts.approver = Some(Arc::new(WebApprover {
        shared: Arc::clone(&shared),
    }));
    let ran = crate::ui::run_printed(&project, lock, opts).await;
    let code = match &ran {
        Ok(report) => {
            println!(
                "\nthe run ended ({}); the report stays at http://{local}/ until you end the server (Ctrl-C)",
                crate::ui::outcome_line(&report.outcome)
            );
            let _ = crate::ui::interruption().await;
            crate::ui::exit_code(&report.outcome)
        }
        Err(_) => 0,
    };
    let _ = stop.send(());
    if let Ok(Err(e)) = server.await {
        tracing::warn!(error = %consort_actors::error_chain(&e), "the report server ended with an error");
    }
    ran?;
    Ok(code)
}

fn router(shared: Arc<Shared>) -> axum::Router {
    axum::Router::new()
        .route("/", get(report_page))
        .route("/approve", get(approval_page))
        .route("/decide", post(decide))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&shared),
            only_this_server,
        ))
        .with_state(shared)
}

/// Every request: addressed to this server by an address (see [`guard::check_host`]), and
/// every answer marked not to be framed or cached, its referrer kept to this server.
async fn only_this_server(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok());
    let mut response = match guard::check_host(host, shared.port) {
        Ok(()) => next.run(req).await,
        Err(refusal) => refused(StatusCode::MISDIRECTED_REQUEST, &refusal),
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

fn refused(status: StatusCode, why: &dyn std::fmt::Display) -> Response {
    let page = pages::plain_page("Refused", &why.to_string(), false);
    (status, Html(page)).into_response()
}

/// The report with `banner`, or a page saying why there is none yet.
fn report_with(shared: &Shared, live: Option<u32>, banner: String) -> Response {
    let opts = RenderOptions {
        live_refresh_secs: live,
        banner_html: Some(banner),
    };
    match crate::report::render(&shared.project, &opts) {
        Ok(page) => Html(page).into_response(),
        Err(ReportError::NotStarted { .. }) => Html(pages::plain_page(
            "The run is starting",
            "The run has not written its ledger yet; this page reloads itself.",
            true,
        ))
        .into_response(),
        Err(e) => {
            let page = pages::plain_page(
                "The report cannot be rendered",
                &consort_actors::error_chain(&e),
                true,
            );
            (StatusCode::INTERNAL_SERVER_ERROR, Html(page)).into_response()
        }
    }
}

async fn report_page(State(shared): State<Arc<Shared>>) -> Response {
    let banner = pages::report_banner(
        shared.pending_request().as_ref(),
        shared.notice().as_deref(),
    );
    report_with(&shared, Some(2), banner)
}

async fn approval_page(State(shared): State<Arc<Shared>>) -> Response {
    let panel = pages::approval_panel(shared.pending_request().as_ref(), &shared.token);
    report_with(&shared, None, panel)
}

/// What the approval form sends.
#[derive(Debug, serde::Deserialize)]
struct DecideForm {
    token: String,
    gate: String,
    hash: String,
    name: String,
    #[serde(default)]
    note: String,
    decision: String,
}

async fn decide(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Form(form): Form<DecideForm>,
) -> Response {
    let header_text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let host = header_text(header::HOST).unwrap_or_default();
    let checked = guard::check_origin(
        header_text(header::ORIGIN),
        header_text(axum::http::HeaderName::from_static("sec-fetch-site")),
        host,
    )
    .and_then(|()| guard::check_token(&form.token, &shared.token));
    if let Err(refusal) = checked {
        tracing::warn!(%refusal, "a gate decision was refused");
        return refused(StatusCode::FORBIDDEN, &refusal);
    }
    match take_decision(&shared, &form) {
        Ok(said) => {
            *lock(&shared.notice) = Some(said);
            Redirect::to("/").into_response()
        }
        Err((status, why)) => refused(status, &why),
    }
}

/// Hands the form's decision to the waiting gate, when it is for that gate and hash and says
/// who decides; returns what was recorded, for the report's notice.
fn take_decision(shared: &Shared, form: &DecideForm) -> Result<String, (StatusCode, String)> {
    let bad = |why: String| (StatusCode::UNPROCESSABLE_ENTITY, why);
    let gate: GateKind = form.gate.parse().map_err(bad)?;
    let hash: ContentHash = form
        .hash
        .parse()
        .map_err(|e: consort_actors::ParseHashError| bad(e.to_string()))?;
    let name = form.name.trim();
    if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(bad(
            "give your name (up to 100 characters): it is recorded in the ledger".into(),
        ));
    }
    let note = form.note.trim().to_string();
    let decision = match form.decision.as_str() {
        "approve" => GateDecision::Approve,
        "reject" if note.is_empty() => {
            return Err(bad("a rejection needs a note saying why".into()));
        }
        "reject" => GateDecision::Reject {
            reason: note.clone(),
        },
        other => {
            return Err(bad(format!(
                "{other} is not a decision (approve or reject)"
            )));
        }
    };
    let mut pending = lock(&shared.pending);
    let Some(waiting) = pending.as_mut() else {
        return Err((
            StatusCode::CONFLICT,
            "no gate waits for a decision now; nothing was recorded".into(),
        ));
    };
    if waiting.request.gate != gate || waiting.request.hash != hash {
        return Err((
            StatusCode::CONFLICT,
            format!(
                "this page was for the {gate} gate at hash {hash}, but the run waits at the {} gate for hash {}; nothing was recorded: reload the approval page",
                waiting.request.gate, waiting.request.hash
            ),
        ));
    }
    let approved = matches!(decision, GateDecision::Approve);
    let approval = GateApproval {
        gate,
        hash,
        approver: name.to_string(),
        at: Utc::now(),
        decision,
        note,
    };
    let sent = waiting.reply.take().map(|reply| reply.send(approval));
    if !matches!(sent, Some(Ok(()))) {
        return Err((
            StatusCode::CONFLICT,
            "the gate stopped waiting before the decision arrived; nothing was recorded".into(),
        ));
    }
    let verb = if approved { "approved" } else { "rejected" };
    Ok(format!(
        "The {gate} gate was {verb} by {name} for {hash}; the run records it in its ledger and goes on."
    ))
}
