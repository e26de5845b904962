//! A loopback Lakebase Autoscaling control plane for the tests: the documented paths,
//! request bodies and answers of `/api/2.0/postgres/…` (branches, long-running operations
//! that finish after N polls, endpoints, credentials with an expiry, paged lists, purge
//! deletes), bearer-token checks, scripted faults (429/503 with `Retry-After`, 403, …) and a
//! request log. With a [`LocalPg`] behind it every branch is a real database (a copy of its
//! source via `CREATE DATABASE … TEMPLATE`), and every credential is a real password of the
//! user's role with `VALID UNTIL` set to the credential's expiry.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::pg::LocalPg;

/// The project the server hosts.
pub(crate) const PROJECT: &str = "demo";
/// The identity behind the token (the Postgres user).
pub(crate) const USER: &str = "ci-bot@example.com";

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub(crate) struct Req {
    /// When it arrived.
    pub at: Instant,
    /// HTTP method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Query parameters.
    pub query: HashMap<String, String>,
    /// JSON body (`null` when none).
    pub body: Value,
    /// The `User-Agent` header.
    pub user_agent: Option<String>,
}

/// A scripted failure answer.
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    /// Method it applies to.
    pub method: &'static str,
    /// A substring of the path it applies to.
    pub path_contains: String,
    /// Status to answer.
    pub status: u16,
    /// `error_code`.
    pub code: String,
    /// `message`.
    pub message: String,
    /// `Retry-After` seconds, if any.
    pub retry_after: Option<u64>,
    /// How many requests it answers.
    pub times: usize,
}

impl Fault {
    /// A fault answering one `method` request on a `/branches` path with `status`, `code`
    /// and `message`, without `Retry-After`.
    pub(crate) fn on_branches(
        method: &'static str,
        status: u16,
        code: &str,
        message: impl Into<String>,
    ) -> Fault {
        Fault {
            method,
            path_contains: "/branches".into(),
            status,
            code: code.into(),
            message: message.into(),
            retry_after: None,
            times: 1,
        }
    }

    /// The same fault answering `times` requests.
    pub(crate) fn times(self, times: usize) -> Fault {
        Fault { times, ..self }
    }

    /// The same fault asking to wait `secs` seconds (`Retry-After`).
    pub(crate) fn retry_after(self, secs: u64) -> Fault {
        Fault {
            retry_after: Some(secs),
            ..self
        }
    }
}

/// Behaviour knobs.
#[derive(Debug, Clone)]
pub(crate) struct Knobs {
    /// Polls before an operation is done (0 = done at once).
    pub op_polls: u32,
    /// Largest list page.
    pub page_size: usize,
    /// The host endpoints report.
    pub endpoint_host: String,
    /// Longest credential lifetime the server grants.
    pub credential_lifetime: Duration,
    /// How many credentials per branch are handed out before logins work (the "External
    /// authorization failed" window).
    pub auth_window_mints: usize,
    /// Whether creating an endpoint starts an operation that fails.
    pub fail_endpoint_ops: bool,
    /// The lifetime of OAuth access tokens (`expires_in`).
    pub oauth_lifetime: Duration,
}

/// An OAuth access token the server handed out.
struct AccessToken {
    token: String,
    expires: Instant,
    revoked: bool,
}

struct BranchRec {
    uid: String,
    create_time: SystemTime,
    source: Option<String>,
    spec: Value,
    state: &'static str,
    default: bool,
}

struct EndpointRec {
    id: String,
    host: String,
    endpoint_type: String,
}

struct OpRec {
    polls_left: u32,
    outcome: Result<Value, Value>,
    ready_branch: Option<String>,
}

struct St {
    knobs: Knobs,
    branches: BTreeMap<String, BranchRec>,
    endpoints: BTreeMap<String, Vec<EndpointRec>>,
    ops: HashMap<String, OpRec>,
    seq: u64,
    requests: Vec<Req>,
    faults: Vec<Fault>,
    not_before: Option<Instant>,
    early: usize,
    fail_ops: HashMap<String, Value>,
    mints: Vec<(String, String)>,
    mints_per_branch: HashMap<String, usize>,
    current: Option<(String, SystemTime)>,
    /// The service principal allowed to buy access tokens: (client id, secret).
    oauth: Option<(String, String)>,
    access_tokens: Vec<AccessToken>,
    token_requests: usize,
}

impl St {
    /// The next number of the server's one sequence (resource ids, operations, tokens).
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}

struct Shared {
    token: String,
    st: Mutex<St>,
    admin: Option<tokio_postgres::Client>,
}

/// The running server; stops when dropped.
pub(crate) struct Lakebase {
    /// Base URL, `http://127.0.0.1:<port>`.
    pub url: String,
    /// The API token it accepts.
    pub token: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Lakebase {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

fn new_token(seq: u64) -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let h = consort_actors::ContentHash::of_bytes(format!("{seq}-{nanos}").as_bytes());
    format!("lbtok-{}", &h.to_hex()[..40])
}

fn error(status: u16, code: &str, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        axum::Json(json!({"error_code": code, "message": message})),
    )
        .into_response()
}

fn ok(v: Value) -> Response {
    (StatusCode::OK, axum::Json(v)).into_response()
}

fn branch_resource(id: &str) -> String {
    format!("projects/{PROJECT}/branches/{id}")
}

/// When a branch expires, from its spec (`expire_time`, or creation + `ttl`).
fn expire_time(b: &BranchRec) -> Option<String> {
    if let Some(t) = b.spec.get("expire_time").and_then(Value::as_str) {
        return Some(t.to_string());
    }
    let ttl = b
        .spec
        .get("ttl")
        .and_then(Value::as_str)
        .and_then(|t| t.strip_suffix('s'))
        .and_then(|n| n.parse::<u64>().ok())?;
    Some(format_rfc3339(b.create_time + Duration::from_secs(ttl)))
}

fn branch_json(id: &str, b: &BranchRec) -> Value {
    json!({
        "name": branch_resource(id),
        "uid": b.uid,
        "parent": format!("projects/{PROJECT}"),
        "create_time": format_rfc3339(b.create_time),
        "update_time": format_rfc3339(b.create_time),
        "spec": b.spec,
        "status": {
            "current_state": b.state,
            "default": b.default,
            "source_branch": b.source,
            "expire_time": expire_time(b),
        }
    })
}

fn endpoint_json(branch: &str, e: &EndpointRec) -> Value {
    json!({
        "name": format!("{}/endpoints/{}", branch_resource(branch), e.id),
        "spec": {"endpoint_type": e.endpoint_type},
        "status": {
            "endpoint_type": e.endpoint_type,
            "current_state": "ACTIVE",
            "hosts": {"host": e.host}
        }
    })
}

fn valid_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && id.len() <= 63
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !id.ends_with('-')
}

impl Lakebase {
    /// Starts the server. With `pg`, creates the user's role and the `production` branch
    /// database (a table `items` with one row, `seed`).
    pub(crate) async fn start(pg: Option<&LocalPg>) -> Lakebase {
        let admin = match pg {
            Some(pg) => {
                let admin = pg
                    .admin_connect("postgres")
                    .await
                    .expect("admin connection");
                admin
                    .batch_execute(&format!("CREATE ROLE {} LOGIN CREATEDB", ident(USER)))
                    .await
                    .expect("create role");
                admin
                    .batch_execute(&format!("CREATE DATABASE production OWNER {}", ident(USER)))
                    .await
                    .expect("create production");
                let prod = pg.admin_connect("production").await.expect("production");
                prod.batch_execute(&format!(
                    "CREATE TABLE items (id int PRIMARY KEY, label text NOT NULL);
                     INSERT INTO items VALUES (1, 'seed');
                     ALTER TABLE items OWNER TO {};",
                    ident(USER)
                ))
                .await
                .expect("seed production");
                Some(admin)
            }
            None => None,
        };
        let token = format!("dapi-{}", new_token(0));
        let mut branches = BTreeMap::new();
        branches.insert(
            "production".to_string(),
            BranchRec {
                uid: "br-production".into(),
                create_time: SystemTime::now() - Duration::from_secs(30 * 86_400),
                source: None,
                spec: json!({"no_expiry": true}),
                state: "READY",
                default: true,
            },
        );
        let shared = Arc::new(Shared {
            token: token.clone(),
            admin,
            st: Mutex::new(St {
                knobs: Knobs {
                    op_polls: 2,
                    page_size: 100,
                    endpoint_host: "127.0.0.1".into(),
                    credential_lifetime: Duration::from_secs(3600),
                    auth_window_mints: 0,
                    fail_endpoint_ops: false,
                    oauth_lifetime: Duration::from_secs(3600),
                },
                branches,
                endpoints: BTreeMap::new(),
                ops: HashMap::new(),
                seq: 0,
                requests: Vec::new(),
                faults: Vec::new(),
                not_before: None,
                early: 0,
                fail_ops: HashMap::new(),
                mints: Vec::new(),
                mints_per_branch: HashMap::new(),
                current: None,
                oauth: None,
                access_tokens: Vec::new(),
                token_requests: 0,
            }),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Lakebase {
            url: format!("http://{addr}"),
            token,
            shared,
            task,
        }
    }

    /// Changes the behaviour knobs.
    pub(crate) async fn knobs(&self, f: impl FnOnce(&mut Knobs)) {
        f(&mut self.shared.st.lock().await.knobs);
    }

    /// Adds a scripted fault.
    pub(crate) async fn fault(&self, fault: Fault) {
        self.shared.st.lock().await.faults.push(fault);
    }

    /// Makes the create operation of `branch` finish with this `error` object.
    pub(crate) async fn fail_operation(&self, branch: &str, error: Value) {
        self.shared
            .st
            .lock()
            .await
            .fail_ops
            .insert(branch.to_string(), error);
    }

    /// Adds a READY branch (no database) created `age` ago from `source` (a branch id).
    pub(crate) async fn preload(&self, id: &str, source: Option<&str>, age: Duration) {
        let mut st = self.shared.st.lock().await;
        let uid = format!("br-pre-{}", st.next_seq());
        st.branches.insert(
            id.to_string(),
            BranchRec {
                uid,
                create_time: SystemTime::now() - age,
                source: source.map(branch_resource),
                spec: json!({"ttl": "3600s"}),
                state: "READY",
                default: false,
            },
        );
    }

    /// Lets the service principal `client_id` with `secret` buy access tokens at
    /// `/oidc/v1/token`; the tokens it hands out are accepted besides the fixed one.
    pub(crate) async fn allow_oauth(&self, client_id: &str, secret: &str) {
        self.shared.st.lock().await.oauth = Some((client_id.into(), secret.into()));
    }

    /// Refuses every access token handed out so far (HTTP 401 from now on).
    pub(crate) async fn revoke_access_tokens(&self) {
        for t in &mut self.shared.st.lock().await.access_tokens {
            t.revoked = true;
        }
    }

    /// How many access tokens were asked for.
    pub(crate) async fn token_requests(&self) -> usize {
        self.shared.st.lock().await.token_requests
    }

    /// Revokes the database credential handed out so far: the user's role gets a password
    /// nobody knows, and the next credential minted is a new one.
    pub(crate) async fn revoke_credentials(&self) {
        let mut st = self.shared.st.lock().await;
        let seq = st.next_seq();
        admin_exec(
            &self.shared,
            &format!("ALTER ROLE {} PASSWORD '{}'", ident(USER), new_token(seq)),
        )
        .await
        .expect("revoke");
        st.current = None;
    }

    /// Expires the database credential handed out so far before the expiry it reported (as a
    /// service may, mid-use): the user's role keeps its password but is valid until a moment
    /// past, so logins with it fail with 28P01; the next credential minted is a new one.
    pub(crate) async fn expire_credentials(&self) {
        let mut st = self.shared.st.lock().await;
        admin_exec(
            &self.shared,
            &format!("ALTER ROLE {} VALID UNTIL '-infinity'", ident(USER)),
        )
        .await
        .expect("expire");
        st.current = None;
    }

    /// Every request so far.
    pub(crate) async fn requests(&self) -> Vec<Req> {
        self.shared.st.lock().await.requests.clone()
    }

    /// The requests seen with this method, in order.
    pub(crate) async fn requests_of(&self, method: &str) -> Vec<Req> {
        let mut all = self.requests().await;
        all.retain(|r| r.method == method);
        all
    }

    /// The first request seen with this method.
    pub(crate) async fn first_request(&self, method: &str) -> Option<Req> {
        self.requests_of(method).await.into_iter().next()
    }

    /// How many requests had this method and a path containing `part`.
    pub(crate) async fn count(&self, method: &str, part: &str) -> usize {
        self.requests()
            .await
            .iter()
            .filter(|r| r.method == method && r.path.contains(part))
            .count()
    }

    /// How many create-branch requests (`POST …/branches`) arrived.
    pub(crate) async fn creates(&self) -> usize {
        self.requests()
            .await
            .iter()
            .filter(|r| r.method == "POST" && r.path.ends_with("/branches"))
            .count()
    }

    /// Requests that arrived before a `Retry-After` had passed.
    pub(crate) async fn early_retries(&self) -> usize {
        self.shared.st.lock().await.early
    }

    /// Credentials handed out: (endpoint, token).
    pub(crate) async fn mints(&self) -> Vec<(String, String)> {
        self.shared.st.lock().await.mints.clone()
    }

    /// Ids of live branches.
    pub(crate) async fn branch_ids(&self) -> Vec<String> {
        self.shared
            .st
            .lock()
            .await
            .branches
            .keys()
            .cloned()
            .collect()
    }

    /// The `spec` a branch was created with.
    pub(crate) async fn spec_of(&self, id: &str) -> Option<Value> {
        self.shared
            .st
            .lock()
            .await
            .branches
            .get(id)
            .map(|b| b.spec.clone())
    }

    /// Whether a database named like the branch exists in the PostgreSQL behind.
    pub(crate) async fn database_exists(&self, id: &str) -> bool {
        let Some(admin) = &self.shared.admin else {
            return false;
        };
        admin
            .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&id])
            .await
            .expect("query pg_database")
            .is_some()
    }
}

async fn handle(
    State(sh): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let raw = body.clone();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let path = uri.path().to_string();
    let mut st = sh.st.lock().await;
    let now = Instant::now();
    st.requests.push(Req {
        at: now,
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        body: body.clone(),
        user_agent: headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    });
    if method == Method::POST && path == "/oidc/v1/token" {
        return oidc_token(&mut st, &headers, &raw);
    }
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let accepted = bearer == sh.token
        || st
            .access_tokens
            .iter()
            .any(|t| t.token == bearer && !t.revoked && now < t.expires);
    if !accepted {
        return error(401, "UNAUTHENTICATED", "missing or wrong bearer token");
    }
    if let Some(nb) = st.not_before {
        if now < nb {
            st.early += 1;
            let mut r = error(429, "REQUEST_LIMIT_EXCEEDED", "retried before Retry-After");
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return r;
        }
        st.not_before = None;
    }
    if let Some(i) = st
        .faults
        .iter()
        .position(|f| f.times > 0 && f.method == method.as_str() && path.contains(&f.path_contains))
    {
        st.faults[i].times -= 1;
        let f = st.faults[i].clone();
        let mut r = error(f.status, &f.code, &f.message);
        if let Some(secs) = f.retry_after {
            st.not_before = Some(now + Duration::from_secs(secs));
            r.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&secs.to_string()).expect("header"),
            );
        }
        return r;
    }
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method.as_str(), segs.as_slice()) {
        ("GET", ["api", "2.0", "preview", "scim", "v2", "Me"]) => ok(json!({"userName": USER})),
        ("POST", ["api", "2.0", "postgres", "credentials"]) => {
            credential(&sh, &mut st, &body).await
        }
        (m, ["api", "2.0", "postgres", "projects", p, rest @ ..]) => {
            if *p != PROJECT {
                return error(404, "NOT_FOUND", "no such project");
            }
            match (m, rest) {
                ("GET", ["branches"]) => list(&st, &query),
                ("POST", ["branches"]) => create_branch(&sh, &mut st, &query, &body).await,
                ("GET", ["branches", b]) => match st.branches.get(*b) {
                    Some(rec) => ok(branch_json(b, rec)),
                    None => error(404, "NOT_FOUND", "branch not found"),
                },
                ("PATCH", ["branches", b]) => update_branch(&mut st, b, &query, &body),
                ("DELETE", ["branches", b]) => delete_branch(&sh, &mut st, b, &query).await,
                ("GET", ["branches", b, "endpoints"]) => {
                    if !st.branches.contains_key(*b) {
                        return error(404, "NOT_FOUND", "branch not found");
                    }
                    let eps: Vec<Value> = st
                        .endpoints
                        .get(*b)
                        .map(|v| v.iter().map(|e| endpoint_json(b, e)).collect())
                        .unwrap_or_default();
                    ok(json!({"endpoints": eps}))
                }
                ("POST", ["branches", b, "endpoints"]) => {
                    create_endpoint(&mut st, b, &query, &body)
                }
                ("GET", ["branches", b, "endpoints", e]) => match st
                    .endpoints
                    .get(*b)
                    .and_then(|v| v.iter().find(|x| x.id == *e))
                {
                    Some(rec) => ok(endpoint_json(b, rec)),
                    None => error(404, "NOT_FOUND", "endpoint not found"),
                },
                ("GET", ["branches", _, "operations", _]) => poll(&mut st, &path),
                _ => error(404, "ENDPOINT_NOT_FOUND", "no such API"),
            }
        }
        _ => error(404, "ENDPOINT_NOT_FOUND", "no such API"),
    }
}

/// `POST /oidc/v1/token`: client credentials (HTTP Basic) for an access token.
fn oidc_token(st: &mut St, headers: &HeaderMap, body: &[u8]) -> Response {
    use base64::Engine as _;
    st.token_requests += 1;
    let form = String::from_utf8_lossy(body);
    let fields: HashMap<&str, &str> = form
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    if fields.get("grant_type") != Some(&"client_credentials")
        || fields.get("scope") != Some(&"all-apis")
    {
        return (StatusCode::BAD_REQUEST, axum::Json(json!({"error": "invalid_request", "error_description": "grant_type=client_credentials and scope=all-apis are required"}))).into_response();
    }
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok());
    let known = st
        .oauth
        .as_ref()
        .map(|(id, secret)| format!("{id}:{secret}"));
    if basic.is_none() || basic != known {
        return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "invalid_client", "error_description": "Client authentication failed"}))).into_response();
    }
    let seq = st.next_seq();
    let token = format!("oat-{}", new_token(seq));
    let lifetime = st.knobs.oauth_lifetime;
    st.access_tokens.push(AccessToken {
        token: token.clone(),
        expires: Instant::now() + lifetime,
        revoked: false,
    });
    ok(json!({"access_token": token, "token_type": "Bearer", "expires_in": lifetime.as_secs()}))
}

fn new_op(
    st: &mut St,
    branch: &str,
    outcome: Result<Value, Value>,
    ready: Option<String>,
) -> Response {
    let name = format!(
        "{}/operations/op-{}",
        branch_resource(branch),
        st.next_seq()
    );
    let polls = st.knobs.op_polls;
    st.ops.insert(
        name.clone(),
        OpRec {
            polls_left: polls,
            outcome,
            ready_branch: ready,
        },
    );
    if polls == 0 {
        return poll_named(st, &name);
    }
    ok(
        json!({"name": name, "done": false, "metadata": {"@type": "type.googleapis.com/databricks.postgres.v1.OperationMetadata"}}),
    )
}

fn poll(st: &mut St, path: &str) -> Response {
    let name = path.trim_start_matches("/api/2.0/postgres/").to_string();
    let Some(op) = st.ops.get_mut(&name) else {
        return error(404, "NOT_FOUND", "operation not found");
    };
    op.polls_left = op.polls_left.saturating_sub(1);
    poll_named(st, &name)
}

fn poll_named(st: &mut St, name: &str) -> Response {
    let Some(op) = st.ops.get(name) else {
        return error(404, "NOT_FOUND", "operation not found");
    };
    if op.polls_left > 0 {
        return ok(json!({"name": name, "done": false}));
    }
    let outcome = op.outcome.clone();
    if let Some(b) = op.ready_branch.clone()
        && let Some(rec) = st.branches.get_mut(&b)
    {
        rec.state = "READY";
    }
    match outcome {
        Ok(mut response) => {
            if let Some(b) = st.ops.get(name).and_then(|o| o.ready_branch.clone())
                && let Some(rec) = st.branches.get(&b)
            {
                response = branch_json(&b, rec);
            }
            ok(json!({"name": name, "done": true, "response": response}))
        }
        Err(err) => ok(json!({"name": name, "done": true, "error": err})),
    }
}

fn list(st: &St, query: &HashMap<String, String>) -> Response {
    let size = query
        .get("page_size")
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(st.knobs.page_size)
        .min(st.knobs.page_size)
        .max(1);
    let start = match query.get("page_token") {
        Some(t) => match t.strip_prefix('t').and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => n,
            None => return error(400, "INVALID_PARAMETER_VALUE", "bad page token"),
        },
        None => 0,
    };
    let all: Vec<Value> = st
        .branches
        .iter()
        .map(|(id, b)| branch_json(id, b))
        .collect();
    let page: Vec<Value> = all.iter().skip(start).take(size).cloned().collect();
    let next = start + page.len();
    if next < all.len() {
        ok(json!({"branches": page, "next_page_token": format!("t{next}")}))
    } else {
        ok(json!({"branches": page}))
    }
}

async fn admin_exec(sh: &Shared, sql: &str) -> Result<(), String> {
    let Some(admin) = &sh.admin else {
        return Ok(());
    };
    // A template that a client just disconnected from can be busy (55006) for a moment.
    for _ in 0..100 {
        match admin.batch_execute(sql).await {
            Ok(()) => return Ok(()),
            Err(e) if e.code().map(|c| c.code()) == Some("55006") => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Err("template stayed busy".into())
}

async fn create_branch(
    sh: &Shared,
    st: &mut St,
    query: &HashMap<String, String>,
    body: &Value,
) -> Response {
    let Some(id) = query.get("branch_id").cloned() else {
        return error(400, "INVALID_PARAMETER_VALUE", "branch_id is required");
    };
    if !valid_id(&id) || id.contains("reserved") {
        return error(
            400,
            "INVALID_PARAMETER_VALUE",
            &format!("invalid branch_id {id}"),
        );
    }
    if st.branches.contains_key(&id) {
        return error(
            409,
            "ALREADY_EXISTS",
            &format!("branch {id} already exists"),
        );
    }
    let spec = body.get("spec").cloned().unwrap_or(Value::Null);
    let expiries = ["ttl", "expire_time", "no_expiry"]
        .iter()
        .filter(|k| spec.get(**k).is_some())
        .count();
    if expiries != 1 {
        return error(
            400,
            "INVALID_PARAMETER_VALUE",
            "exactly one of ttl, expire_time, no_expiry is required",
        );
    }
    if let Some(ttl) = spec.get("ttl") {
        let ok = ttl
            .as_str()
            .and_then(|t| t.strip_suffix('s'))
            .and_then(|n| n.parse::<u64>().ok())
            .is_some();
        if !ok {
            return error(400, "INVALID_PARAMETER_VALUE", "ttl must look like 3600s");
        }
    }
    let source = match spec.get("source_branch").and_then(Value::as_str) {
        Some(s) => s.to_string(),
        None => branch_resource("production"),
    };
    let Some(source_id) = source.strip_prefix(&format!("projects/{PROJECT}/branches/")) else {
        return error(
            400,
            "INVALID_PARAMETER_VALUE",
            "source_branch must be a branch resource",
        );
    };
    let source_id = source_id.to_string();
    if !st.branches.contains_key(&source_id) {
        return error(
            404,
            "NOT_FOUND",
            &format!("source branch {source_id} not found"),
        );
    }
    if let Some(err) = st.fail_ops.get(&id).cloned() {
        return new_op(st, &id, Err(err), None);
    }
    if let Err(e) = admin_exec(
        sh,
        &format!(
            "CREATE DATABASE {} OWNER {} TEMPLATE {}",
            ident(&id),
            ident(USER),
            ident(&source_id)
        ),
    )
    .await
    {
        return error(500, "INTERNAL_ERROR", &e);
    }
    let uid = format!("br-test-{}", st.next_seq());
    st.branches.insert(
        id.clone(),
        BranchRec {
            uid,
            create_time: SystemTime::now(),
            source: Some(source),
            spec,
            state: "INIT",
            default: false,
        },
    );
    new_op(st, &id, Ok(Value::Null), Some(id.clone()))
}

async fn delete_branch(
    sh: &Shared,
    st: &mut St,
    id: &str,
    query: &HashMap<String, String>,
) -> Response {
    let Some(rec) = st.branches.get(id) else {
        if query.get("allow_missing").map(String::as_str) == Some("true") {
            return new_op(st, id, Ok(json!({})), None);
        }
        return error(404, "NOT_FOUND", "branch not found");
    };
    if rec.default {
        return error(400, "INVALID_STATE", "cannot delete the default branch");
    }
    let me = branch_resource(id);
    if st
        .branches
        .values()
        .any(|b| b.source.as_deref() == Some(me.as_str()))
    {
        return error(400, "INVALID_STATE", "branch has children");
    }
    if let Err(e) = admin_exec(
        sh,
        &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", ident(id)),
    )
    .await
    {
        return error(500, "INTERNAL_ERROR", &e);
    }
    st.branches.remove(id);
    st.endpoints.remove(id);
    new_op(st, id, Ok(json!({})), None)
}

fn update_branch(st: &mut St, id: &str, query: &HashMap<String, String>, body: &Value) -> Response {
    if query.get("update_mask").map(String::as_str) != Some("spec.expiration") {
        return error(
            400,
            "INVALID_PARAMETER_VALUE",
            "update_mask must be spec.expiration",
        );
    }
    let Some(t) = body.pointer("/spec/expire_time").and_then(Value::as_str) else {
        return error(
            400,
            "INVALID_PARAMETER_VALUE",
            "spec.expire_time is required",
        );
    };
    if chrono::DateTime::parse_from_rfc3339(t).is_err() {
        return error(
            400,
            "INVALID_PARAMETER_VALUE",
            "expire_time is not RFC 3339",
        );
    }
    let t = t.to_string();
    let Some(rec) = st.branches.get_mut(id) else {
        return error(404, "NOT_FOUND", "branch not found");
    };
    if let Some(spec) = rec.spec.as_object_mut() {
        spec.remove("ttl");
        spec.remove("no_expiry");
        spec.insert("expire_time".into(), Value::String(t));
    }
    let response = branch_json(id, rec);
    new_op(st, id, Ok(response), None)
}

fn create_endpoint(
    st: &mut St,
    branch: &str,
    query: &HashMap<String, String>,
    body: &Value,
) -> Response {
    if !st.branches.contains_key(branch) {
        return error(404, "NOT_FOUND", "branch not found");
    }
    let Some(id) = query.get("endpoint_id").cloned() else {
        return error(400, "INVALID_PARAMETER_VALUE", "endpoint_id is required");
    };
    let t = body
        .pointer("/spec/endpoint_type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if t != "ENDPOINT_TYPE_READ_WRITE" && t != "ENDPOINT_TYPE_READ_ONLY" {
        return error(
            400,
            "INVALID_PARAMETER_VALUE",
            "spec.endpoint_type is required",
        );
    }
    let host = st.knobs.endpoint_host.clone();
    let fail = st.knobs.fail_endpoint_ops;
    let eps = st.endpoints.entry(branch.to_string()).or_default();
    if eps
        .iter()
        .any(|e| e.id == id || (t == "ENDPOINT_TYPE_READ_WRITE" && e.endpoint_type == t))
    {
        return error(409, "ALREADY_EXISTS", "endpoint exists");
    }
    let rec = EndpointRec {
        id,
        host,
        endpoint_type: t,
    };
    let response = endpoint_json(branch, &rec);
    if fail {
        let failed = json!({"code": 13, "message": "the compute failed to start"});
        return new_op(st, branch, Err(failed), None);
    }
    eps.push(rec);
    new_op(st, branch, Ok(response), None)
}

async fn credential(sh: &Shared, st: &mut St, body: &Value) -> Response {
    let endpoint = body
        .get("endpoint")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let parts: Vec<&str> = endpoint.split('/').collect();
    let (branch, ep) = match parts.as_slice() {
        ["projects", p, "branches", b, "endpoints", e] if *p == PROJECT => {
            (b.to_string(), e.to_string())
        }
        _ => {
            return error(
                400,
                "INVALID_PARAMETER_VALUE",
                "endpoint must be an endpoint resource",
            );
        }
    };
    if !st
        .endpoints
        .get(&branch)
        .is_some_and(|v| v.iter().any(|x| x.id == ep))
    {
        return error(404, "NOT_FOUND", "endpoint not found");
    }
    let ttl = body
        .get("ttl")
        .and_then(Value::as_str)
        .and_then(|t| t.strip_suffix('s'))
        .and_then(|n| n.parse::<u64>().ok());
    let Some(ttl) = ttl.filter(|t| (300..=3600).contains(t)) else {
        return error(400, "INVALID_PARAMETER_VALUE", "ttl must be 300s..3600s");
    };
    let lifetime = Duration::from_secs(ttl).min(st.knobs.credential_lifetime);
    let now = SystemTime::now();
    let count = st.mints_per_branch.entry(branch.clone()).or_insert(0);
    *count += 1;
    let in_window = *count <= st.knobs.auth_window_mints;
    let seq = st.next_seq();
    let (token, expires) = if in_window {
        // Handed out, but logins with it fail: authorization is not wired up yet.
        (new_token(seq), now + lifetime)
    } else {
        match &st.current {
            Some((t, exp)) if exp.duration_since(now).unwrap_or_default() > lifetime / 2 => {
                (t.clone(), *exp)
            }
            _ => {
                let t = new_token(seq);
                let exp = now + lifetime;
                if let Err(e) = admin_exec(
                    sh,
                    &format!(
                        "ALTER ROLE {} PASSWORD '{}' VALID UNTIL '{}'",
                        ident(USER),
                        t,
                        format_rfc3339(exp)
                    ),
                )
                .await
                {
                    return error(500, "INTERNAL_ERROR", &e);
                }
                st.current = Some((t.clone(), exp));
                (t, exp)
            }
        }
    };
    st.mints.push((endpoint, token.clone()));
    ok(json!({"token": token, "expire_time": format_rfc3339(expires)}))
}

/// A time as the API writes it: RFC 3339, UTC, milliseconds.
fn format_rfc3339(t: std::time::SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}
