//! The Lakebase REST backend end to end, against a loopback HTTP server that implements the
//! documented Lakebase Autoscaling request and response shapes, with a real local
//! PostgreSQL behind it: every branch is a real database and every minted credential a real
//! password (with `VALID UNTIL` at the credential's expiry).

#[path = "lakebase_api/ca.rs"]
mod ca;
#[path = "lakebase_api/holds.rs"]
mod holds;
#[path = "lakebase_api/pg.rs"]
mod pg;
#[path = "lakebase_api/server.rs"]
mod server;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use consort_actors::TestStatus;
use consort_lakebase::lakebase_api::{
    ApiError, AuthReadyPolicy, LakebaseClient, LakebaseConfig, LakebaseProvider, PollPolicy,
    RestClient, RetryPolicy, types::BranchSpec,
};
use consort_lakebase::{
    BaseRef, BaseSpec, BranchProvider, Error, PsqlRunner, PsqlRunnerConfig, RunContext, Secret,
    SslMode, TestRunner,
};
use serde_json::json;

use crate::common::{assert_count, query_value};
use pg::LocalPg;
use server::{Fault, Lakebase, PROJECT, USER};

const HOUR: Duration = Duration::from_secs(3600);

fn config(lb: &Lakebase, pg_port: u16) -> LakebaseConfig {
    let mut c = LakebaseConfig::new(lb.url.clone(), Secret::new(lb.token.clone()), PROJECT);
    c.user = Some(USER.to_string());
    // One PostgreSQL stands in for all branches: each branch is its own database.
    c.database = "{branch}".to_string();
    c.port = pg_port;
    c.allow_plaintext_loopback = true;
    c.retry = RetryPolicy {
        max_attempts: 4,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        max_retry_after: Duration::from_secs(5),
    };
    c.poll = PollPolicy {
        initial_interval: Duration::from_millis(10),
        max_interval: Duration::from_millis(40),
        timeout: Duration::from_secs(10),
    };
    c.auth_ready = AuthReadyPolicy {
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(200),
        budget: Duration::from_secs(10),
    };
    c.credential_refresh_margin = Duration::from_millis(300);
    c
}

fn provider(lb: &Lakebase, pg_port: u16) -> LakebaseProvider {
    LakebaseProvider::new(config(lb, pg_port)).expect("provider")
}

/// A local PostgreSQL, the service in front of it and a provider of that service.
async fn backed() -> (LocalPg, Lakebase, LakebaseProvider) {
    let pg = LocalPg::start().await;
    let lb = Lakebase::start(Some(&pg)).await;
    let p = provider(&lb, pg.port);
    (pg, lb, p)
}

/// A provider of the service on `lb` and its default base (the project's default branch).
async fn provider_and_base(lb: &Lakebase, pg_port: u16) -> (LakebaseProvider, BaseRef) {
    let p = provider(lb, pg_port);
    let base = p.prepare_base(&BaseSpec::default()).await.expect("base");
    (p, base)
}

/// Checks a count in the parent database, `production`, read as its admin.
async fn assert_parent_count(pg: &LocalPg, sql: &str, expected: i64, why: &str) {
    let admin = pg.admin_connect("production").await.expect("admin");
    assert_count(&admin, sql, expected, why).await;
}

/// Logs in with `info`, which must be refused as a bad password (SQLSTATE 28P01; `why` says
/// why): the error.
async fn refused_login(info: &consort_lakebase::ConnectInfo, why: &str) -> ApiError {
    let err = consort_lakebase::lakebase_api::connect(info)
        .await
        .expect_err(why);
    assert!(
        matches!(&err, ApiError::Postgres { code: Some(c), .. } if c == "28P01"),
        "{err:?}"
    );
    err
}

fn client(lb: &Lakebase) -> LakebaseClient {
    let c = config(lb, 5432);
    let rest =
        RestClient::new(&c.host, c.token.clone(), c.retry, Duration::from_secs(10)).expect("rest");
    LakebaseClient::new(rest, PROJECT, c.poll).expect("client")
}

/// Creates branch `name` from `base`, which must fail (`why` says why); returns the error.
async fn refused(p: &dyn BranchProvider, name: &str, base: &BaseRef, why: &str) -> Error {
    p.create(name, base).await.expect_err(why)
}

fn ttl_spec(source: &str) -> BranchSpec {
    BranchSpec {
        source_branch: Some(format!("projects/{PROJECT}/branches/{source}")),
        ttl: Some("3600s".into()),
        ..BranchSpec::default()
    }
}

async fn connect(info: &consort_lakebase::ConnectInfo) -> tokio_postgres::Client {
    consort_lakebase::lakebase_api::connect(info)
        .await
        .expect("connect to the branch")
}

#[tokio::test]
async fn whole_path_create_poll_endpoint_credential_query_psql_delete() {
    let pg = LocalPg::start().await;
    let lb = Lakebase::start(Some(&pg)).await;
    lb.knobs(|k| k.op_polls = 3).await;
    let mut cfg = config(&lb, pg.port);
    cfg.user = None; // the identity comes from SCIM Me
    let p: Arc<dyn BranchProvider> = Arc::new(LakebaseProvider::new(cfg).expect("provider"));

    let base = p.prepare_base(&BaseSpec::default()).await.expect("base");
    assert_eq!(
        base.id, "production",
        "the project's default branch is the base"
    );
    let branch = p.create("consort-e2e-1", &base).await.expect("create");
    assert_eq!(branch.name, "consort-e2e-1");
    assert_eq!(
        branch.id,
        format!("projects/{PROJECT}/branches/consort-e2e-1")
    );

    // The documented request shapes.
    let reqs = lb.requests().await;
    let create = reqs
        .iter()
        .find(|r| r.method == "POST" && r.path.ends_with("/branches"))
        .expect("create request");
    assert_eq!(
        create.path,
        format!("/api/2.0/postgres/projects/{PROJECT}/branches")
    );
    assert_eq!(
        create.query.get("branch_id").map(String::as_str),
        Some("consort-e2e-1")
    );
    assert_eq!(
        create.body,
        json!({"spec": {"source_branch": "projects/demo/branches/production", "ttl": "3600s"}})
    );
    // Create operation + endpoint operation, each done after 3 polls.
    assert_eq!(lb.count("GET", "/operations/").await, 6);
    let ep = reqs
        .iter()
        .find(|r| r.method == "POST" && r.path.ends_with("/endpoints"))
        .expect("endpoint created");
    assert_eq!(
        ep.query.get("endpoint_id").map(String::as_str),
        Some("primary")
    );
    assert_eq!(ep.body["spec"]["endpoint_type"], "ENDPOINT_TYPE_READ_WRITE");
    let cred = reqs
        .iter()
        .find(|r| r.method == "POST" && r.path == "/api/2.0/postgres/credentials")
        .expect("credential minted");
    assert_eq!(
        cred.body,
        json!({"endpoint": "projects/demo/branches/consort-e2e-1/endpoints/primary", "ttl": "3600s"})
    );
    assert_eq!(lb.count("GET", "/scim/v2/Me").await, 1);

    // A real connection and real queries on the branch.
    let info = p.connect_info(&branch).await.expect("connect info");
    assert_eq!(info.host, "127.0.0.1");
    assert_eq!(info.port, pg.port);
    assert_eq!(info.database, "consort-e2e-1");
    assert_eq!(info.user, USER);
    assert_eq!(info.sslmode, SslMode::Disable);
    assert!(info.expires_at.is_some_and(|t| t > SystemTime::now()));
    let db = connect(&info).await;
    let seed: String = query_value(&db, "SELECT label FROM items WHERE id = 1", &[]).await;
    assert_eq!(seed, "seed");
    db.execute("INSERT INTO items VALUES (2, 'from-the-branch')", &[])
        .await
        .expect("write on the branch");
    drop(db);

    // A real test run: psql with an assertion, with only the branch's credentials.
    let psql = |sql: &str| {
        std::process::Command::new("psql")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("PGHOST", &info.host)
            .env("PGPORT", info.port.to_string())
            .env("PGUSER", &info.user)
            .env("PGDATABASE", &info.database)
            .env("PGPASSWORD", info.secret.expose())
            .env("PGSSLMODE", "disable")
            .args(["-X", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .expect("run psql")
    };
    let out = psql("DO $$ BEGIN ASSERT (SELECT count(*) FROM items) = 2, 'two rows'; END $$");
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failing = psql("DO $$ BEGIN ASSERT (SELECT count(*) FROM items) = 5, 'five rows'; END $$");
    assert!(!failing.status.success(), "a false assertion must fail");

    // The crate's psql runner on a work tree, against the Lakebase branch.
    let tree = tempfile::tempdir().expect("work tree");
    std::fs::create_dir(tree.path().join("tests")).expect("mkdir");
    std::fs::write(
        tree.path().join("tests/two_rows.sql"),
        "DO $$ BEGIN ASSERT (SELECT count(*) FROM items) = 2, 'two rows'; END $$;\n",
    )
    .expect("write test");
    std::fs::write(
        tree.path().join("tests/no_rows.sql"),
        "DO $$ BEGIN ASSERT (SELECT count(*) FROM items) = 0, 'no rows'; END $$;\n",
    )
    .expect("write test");
    let runner = PsqlRunner::new(PsqlRunnerConfig::default()).expect("psql runner");
    let report = runner
        .run(
            &RunContext::prepare(
                tree.path().to_path_buf(),
                info.clone(),
                consort_lakebase::SandboxMode::Landlock,
                Vec::new(),
                Vec::new(),
            )
            .expect("a confined run context"),
        )
        .await
        .expect("run");
    let status = |name: &str| {
        report
            .outcomes
            .iter()
            .find(|o| o.name.contains(name))
            .map(|o| o.status)
    };
    assert_eq!(status("two_rows"), Some(TestStatus::Passed), "{report:?}");
    assert_eq!(status("no_rows"), Some(TestStatus::Failed), "{report:?}");
    assert!(!format!("{report:?}").contains(info.secret.expose()));

    // The parent is untouched.
    assert_parent_count(
        &pg,
        "SELECT count(*) FROM items",
        1,
        "writes on the branch do not reach the parent",
    )
    .await;

    let listed = p.list("consort-").await.expect("list");
    assert_eq!(
        listed.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(),
        ["consort-e2e-1"]
    );
    assert_eq!(listed[0].base.id, "production");

    p.delete("consort-e2e-1").await.expect("delete");
    let del = lb.first_request("DELETE").await.expect("delete request");
    assert_eq!(del.query.get("purge").map(String::as_str), Some("true"));
    assert!(!lb.branch_ids().await.contains(&"consort-e2e-1".to_string()));
    assert!(!lb.database_exists("consort-e2e-1").await);
    assert!(p.list("consort-").await.expect("list").is_empty());
}

#[tokio::test]
async fn operations_are_polled_until_done() {
    let lb = Lakebase::start(None).await;
    lb.knobs(|k| k.op_polls = 5).await;
    let c = client(&lb);
    let op = c
        .create_branch("consort-poll-1", &ttl_spec("production"))
        .await
        .expect("create");
    assert_eq!(
        op.done,
        Some(false),
        "the service answers with an unfinished operation"
    );
    let name = op.name.clone().expect("operation name");
    assert!(name.starts_with("projects/demo/branches/consort-poll-1/operations/"));
    let response = c.wait(op).await.expect("wait").expect("response");
    assert_eq!(lb.count("GET", &name).await, 5, "polled exactly until done");
    assert_eq!(response["status"]["current_state"], "READY");

    lb.knobs(|k| k.op_polls = 0).await;
    let b = c
        .create_branch_and_wait("consort-poll-2", &ttl_spec("production"))
        .await
        .expect("an already-done operation");
    assert_eq!(b.id(), Some("consort-poll-2"));
    assert_eq!(lb.count("GET", "consort-poll-2/operations/").await, 0);
}

#[tokio::test]
async fn retry_after_is_honoured_on_429() {
    let lb = Lakebase::start(None).await;
    lb.fault(Fault::on_branches("POST", 429, "REQUEST_LIMIT_EXCEEDED", "slow down").retry_after(1))
        .await;
    let op = client(&lb)
        .create_branch("consort-rl-1", &ttl_spec("production"))
        .await
        .expect("succeeds after the retry");
    assert!(op.name.is_some());
    assert_eq!(lb.creates().await, 2, "one 429, one retry");
    assert_eq!(
        lb.early_retries().await,
        0,
        "the retry did not arrive before Retry-After had passed"
    );
    let posts = lb.requests_of("POST").await;
    assert!(posts[1].at.duration_since(posts[0].at) >= Duration::from_secs(1));
}

#[tokio::test]
async fn service_unavailable_is_retried_within_bounds() {
    let lb = Lakebase::start(None).await;
    let c = client(&lb);
    lb.fault(Fault::on_branches("GET", 503, "TEMPORARILY_UNAVAILABLE", "try again").times(2))
        .await;
    let all = c.list_branches().await.expect("third attempt succeeds");
    assert_eq!(all.len(), 1);
    assert_eq!(lb.count("GET", "/branches").await, 3);

    lb.fault(Fault::on_branches("GET", 503, "TEMPORARILY_UNAVAILABLE", "down").times(100))
        .await;
    let err = c.list_branches().await.expect_err("gives up");
    assert!(
        matches!(
            &err,
            ApiError::RetriesExhausted {
                attempts: 4,
                status: Some(503),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        lb.count("GET", "/branches").await,
        3 + 4,
        "bounded attempts"
    );
}

#[tokio::test]
async fn a_failing_operation_is_a_typed_error() {
    let lb = Lakebase::start(None).await;
    lb.fail_operation(
        "consort-op-fail",
        json!({"error_code": "INTERNAL_ERROR", "message": "storage hiccup"}),
    )
    .await;
    lb.fail_operation(
        "consort-op-quota",
        json!({"code": 8, "message": "branch limit reached"}),
    )
    .await;
    let c = client(&lb);
    let err = c
        .create_branch_and_wait("consort-op-fail", &ttl_spec("production"))
        .await
        .expect_err("operation failed");
    match &err {
        ApiError::OperationFailed {
            operation,
            code,
            message,
        } => {
            assert!(operation.contains("consort-op-fail/operations/"));
            assert_eq!(code, "INTERNAL_ERROR");
            assert_eq!(message, "storage hiccup");
        }
        other => panic!("expected OperationFailed, got {other:?}"),
    }
    // Through the provider, with a Google-style numeric code (8 = RESOURCE_EXHAUSTED).
    let (p, base) = provider_and_base(&lb, 5432).await;
    let err = refused(&p, "consort-op-quota", &base, "quota").await;
    assert!(
        matches!(err, Error::QuotaExceeded(ref m) if m.contains("branch limit")),
        "{err:?}"
    );
    let err = refused(&p, "consort-op-fail", &base, "failed").await;
    assert!(
        matches!(err, Error::OperationFailed(ref m) if m.contains("storage hiccup")),
        "{err:?}"
    );
}

#[tokio::test]
async fn permission_and_quota_errors_are_typed_and_not_retried() {
    let lb = Lakebase::start(None).await;
    let (p, base) = provider_and_base(&lb, 5432).await;
    // The fault, the branch asked for, the error expected and why only one request was sent.
    type Case = (Fault, &'static str, fn(&Error) -> bool, &'static str);
    let cases: [Case; 3] = [
        (
            Fault::on_branches(
                "POST",
                403,
                "PERMISSION_DENIED",
                "CAN MANAGE is required on project demo",
            ),
            "consort-perm-1",
            |e| matches!(e, Error::PermissionDenied(m) if m.contains("CAN MANAGE")),
            "permission errors are not retried",
        ),
        (
            Fault::on_branches("POST", 429, "QUOTA_EXCEEDED", "10 unarchived branches"),
            "consort-quota-1",
            |e| matches!(e, Error::QuotaExceeded(_)),
            "a quota 429 is permanent, not retried",
        ),
        (
            Fault::on_branches("POST", 400, "RESOURCE_EXHAUSTED", "project is full"),
            "consort-quota-2",
            |e| matches!(e, Error::QuotaExceeded(_)),
            "a full project is permanent, not retried",
        ),
    ];
    for (sent, (fault, name, is_expected, why)) in (1..).zip(cases) {
        lb.fault(fault).await;
        let err = refused(&p, name, &base, "refused").await;
        assert!(is_expected(&err), "{name}: {err:?}");
        assert_eq!(lb.creates().await, sent, "{name}: {why}");
    }
}

#[tokio::test]
async fn invalid_names_are_refused_before_any_request() {
    let lb = Lakebase::start(None).await;
    let p = provider(&lb, 5432);
    let base = consort_lakebase::BaseRef {
        id: "production".into(),
        key: BaseSpec::default().key(),
    };
    let long = format!("consort-{}", "x".repeat(60));
    for bad in [
        "Consort-upper",
        "consort_underscore",
        "1consort",
        "consort-",
        "consort-a.b",
        "consort-ä",
        "",
        long.as_str(),
        "dev-not-ours",
        "consortium-x",
    ] {
        let err = p.create(bad, &base).await.expect_err(bad);
        assert!(matches!(err, Error::InvalidName(_)), "{bad:?}: {err:?}");
        let err = p.delete(bad).await.expect_err(bad);
        assert!(matches!(err, Error::InvalidName(_)), "{bad:?}: {err:?}");
    }
    assert!(lb.requests().await.is_empty(), "the server saw no request");

    // A name the service refuses (INVALID_PARAMETER_VALUE) is an invalid name too.
    let err = refused(&p, "consort-reserved-1", &base, "refused by the service").await;
    assert!(
        matches!(err, Error::InvalidName(ref m) if m.contains("INVALID_PARAMETER_VALUE")),
        "{err:?}"
    );
    assert_eq!(lb.requests().await.len(), 1);
}

#[tokio::test]
async fn an_expired_credential_is_refreshed() {
    let pg = LocalPg::start().await;
    let lb = Lakebase::start(Some(&pg)).await;
    lb.knobs(|k| k.credential_lifetime = Duration::from_secs(2))
        .await;
    let (p, base) = provider_and_base(&lb, pg.port).await;
    let branch = p.create("consort-exp-1", &base).await.expect("create");
    let minted = lb.mints().await.len();

    let a = p.connect_info(&branch).await.expect("info");
    let again = p.connect_info(&branch).await.expect("info");
    assert_eq!(a.secret, again.secret, "a fresh credential is cached");
    assert_eq!(
        lb.mints().await.len(),
        minted,
        "no new credential while it is fresh"
    );
    let expires = a.expires_at.expect("expiry");

    // Wait until the credential has expired (the server set VALID UNTIL to this instant).
    let wait = expires
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        + Duration::from_millis(200);
    tokio::time::sleep(wait).await;

    let b = p.connect_info(&branch).await.expect("info after expiry");
    assert_ne!(a.secret, b.secret, "a new token after expiry");
    assert!(b.expires_at.expect("expiry") > expires);
    assert_eq!(lb.mints().await.len(), minted + 1);
    let db = connect(&b).await;
    let one: i32 = query_value(&db, "SELECT 1", &[]).await;
    assert_eq!(one, 1);
    drop(db);

    refused_login(&a, "the expired token no longer logs in").await;
    p.delete("consort-exp-1").await.expect("delete");
}

#[tokio::test]
async fn the_login_window_after_create_is_retried_with_fresh_credentials() {
    let pg = LocalPg::start().await;
    let lb = Lakebase::start(Some(&pg)).await;
    lb.knobs(|k| k.auth_window_mints = 2).await;
    let (p, base) = provider_and_base(&lb, pg.port).await;
    let branch = p
        .create("consort-auth-1", &base)
        .await
        .expect("create returns once logins work");
    let mints = lb.mints().await;
    assert_eq!(
        mints.len(),
        3,
        "two refused credentials, then one that works"
    );
    assert!(
        mints[0].1 != mints[1].1 && mints[1].1 != mints[2].1,
        "each attempt used a fresh credential"
    );
    let info = p.connect_info(&branch).await.expect("info");
    assert_eq!(
        info.secret.expose(),
        mints[2].1,
        "the working credential is cached"
    );
    drop(connect(&info).await);

    // A window that never closes ends in a typed error within the budget.
    lb.knobs(|k| k.auth_window_mints = 1000).await;
    let mut cfg = config(&lb, pg.port);
    cfg.auth_ready.budget = Duration::from_millis(400);
    let p2 = LakebaseProvider::new(cfg).expect("provider");
    let err = refused(&p2, "consort-auth-2", &base, "never ready").await;
    assert!(
        matches!(err, Error::Connect(ref m) if m.contains("did not accept logins")),
        "{err:?}"
    );
    p.delete("consort-auth-1").await.expect("delete");
    p.delete("consort-auth-2").await.expect("delete");
}

#[tokio::test]
async fn list_follows_pages() {
    let lb = Lakebase::start(None).await;
    lb.knobs(|k| k.page_size = 2).await;
    for i in 0..7 {
        lb.preload(&format!("consort-page-{i}"), Some("production"), HOUR)
            .await;
    }
    lb.preload("dev", Some("production"), HOUR).await;
    let p = provider(&lb, 5432);
    let listed = p.list("consort-page-").await.expect("list");
    let mut names: Vec<_> = listed.iter().map(|b| b.name.clone()).collect();
    names.sort();
    assert_eq!(
        names,
        (0..7)
            .map(|i| format!("consort-page-{i}"))
            .collect::<Vec<_>>()
    );
    // 9 branches (production, dev, 7 ours) in pages of 2.
    let gets: Vec<_> = lb
        .requests()
        .await
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/branches"))
        .collect();
    assert_eq!(gets.len(), 5);
    assert_eq!(gets[0].query.get("page_token"), None);
    assert_eq!(
        gets[1].query.get("page_token").map(String::as_str),
        Some("t2")
    );
    assert!(listed.iter().all(|b| b.base.id == "production"));
    assert!(
        listed
            .iter()
            .all(|b| b.created_at < SystemTime::now() - Duration::from_secs(3000))
    );
}

#[tokio::test]
async fn sweep_deletes_only_old_branches_with_the_owner_prefix() {
    let lb = Lakebase::start(None).await;
    let day = Duration::from_secs(86_400);
    for (id, source, age) in [
        ("consort-old-a", "production", 2 * day),
        ("consort-old-b", "production", 2 * day),
        ("consort-fresh", "production", Duration::from_secs(60)),
        ("consortium-old", "production", 2 * day),
        ("dev-old", "production", 2 * day),
        ("consort-base-aaaaaaaaaaaa", "production", 3 * day),
        (
            "consort-kept-child",
            "consort-base-aaaaaaaaaaaa",
            Duration::from_secs(60),
        ),
        ("consort-base-bbbbbbbbbbbb", "production", 3 * day),
        ("consort-old-child", "consort-base-bbbbbbbbbbbb", 2 * day),
    ] {
        lb.preload(id, Some(source), age).await;
    }

    let p = provider(&lb, 5432);
    let n = p.sweep(day).await.expect("sweep");
    assert_eq!(n, 4);
    let mut left = lb.branch_ids().await;
    left.sort();
    assert_eq!(
        left,
        [
            "consort-base-aaaaaaaaaaaa", // its child is still alive
            "consort-fresh",
            "consort-kept-child",
            "consortium-old",
            "dev-old",
            "production",
        ]
    );
    let deletes = lb.requests_of("DELETE").await;
    assert_eq!(deletes.len(), 4, "children were deleted before their base");
    assert!(
        deletes
            .iter()
            .all(|r| r.query.get("purge").map(String::as_str) == Some("true"))
    );
    assert!(
        deletes
            .last()
            .is_some_and(|r| r.path.ends_with("consort-base-bbbbbbbbbbbb"))
    );
}

/// A writer that collects everything the tracing subscriber prints.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn tokens_never_appear_in_debug_errors_or_logs() {
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let lb = Lakebase::start(None).await;
    let api_token = lb.token.clone();
    let cfg = config(&lb, 5432);
    let (p, base) = provider_and_base(&lb, 5432).await;
    // The server echoes the token in its error message (some proxies do).
    lb.fault(Fault::on_branches(
        "POST",
        403,
        "PERMISSION_DENIED",
        format!("token {api_token} may not create branches"),
    ))
    .await;
    let denied = p
        .create("consort-secret-1", &base)
        .await
        .expect_err("denied");
    lb.fault(
        Fault::on_branches(
            "GET",
            503,
            "TEMPORARILY_UNAVAILABLE",
            format!("busy, {api_token}"),
        )
        .times(4),
    )
    .await;
    let exhausted = p.list("consort-").await.expect_err("exhausted");

    // A real credential, through connect_info (no connection needed).
    let c = client(&lb);
    c.create_branch_and_wait("consort-secret-2", &ttl_spec("production"))
        .await
        .expect("create");
    let branch = consort_lakebase::Branch {
        name: "consort-secret-2".into(),
        id: "projects/demo/branches/consort-secret-2".into(),
        base: base.clone(),
        created_at: SystemTime::now(),
    };
    let info = p.connect_info(&branch).await.expect("info");
    let db_token = info.secret.expose().to_string();
    assert!(db_token.starts_with("lbtok-"));

    let texts = [
        format!("{cfg:?}"),
        format!("{p:?}"),
        format!("{c:?}"),
        format!("{info:?}"),
        format!("{}", info.secret),
        format!("{denied:?} {denied}"),
        format!("{exhausted:?} {exhausted}"),
    ];
    for t in &texts {
        assert!(!t.contains(&api_token), "API token leaked: {t}");
        assert!(!t.contains(&db_token), "DB token leaked: {t}");
    }
    assert!(texts[5].contains("may not create branches"), "{}", texts[5]);
    assert!(
        texts[5].contains("***"),
        "the echoed token is scrubbed: {}",
        texts[5]
    );
    drop(_guard);
    let logged = String::from_utf8(logs.0.lock().expect("logs").clone()).expect("utf8");
    assert!(logged.contains("retrying"), "logs were captured: {logged}");
    assert!(!logged.contains(&api_token), "API token in logs");
    assert!(!logged.contains(&db_token), "DB token in logs");
}

#[tokio::test]
async fn plaintext_is_refused_for_non_loopback_hosts() {
    let lb = Lakebase::start(None).await;
    lb.knobs(|k| k.endpoint_host = "ep-cool-rain-123.database.example.com".into())
        .await;
    let (p, base) = provider_and_base(&lb, 5432).await;
    let err = refused(&p, "consort-tls-1", &base, "refused").await;
    assert!(
        matches!(err, Error::Misconfigured(ref c) if c.to_string().contains("not loopback")),
        "{err:?}"
    );
    assert!(
        lb.mints().await.is_empty(),
        "no credential was minted for a refused host"
    );
    assert!(
        !lb.branch_ids().await.contains(&"consort-tls-1".to_string()),
        "the refused branch was deleted"
    );

    // Without the switch the same host gets sslmode=require.
    client(&lb)
        .create_branch_and_wait("consort-tls-1", &ttl_spec("production"))
        .await
        .expect("create");
    let mut cfg = config(&lb, 5432);
    cfg.allow_plaintext_loopback = false;
    let tls = LakebaseProvider::new(cfg).expect("provider");
    let branch = consort_lakebase::Branch {
        name: "consort-tls-1".into(),
        id: "projects/demo/branches/consort-tls-1".into(),
        base,
        created_at: SystemTime::now(),
    };
    let info = tls.connect_info(&branch).await.expect("info");
    assert_eq!(info.sslmode, SslMode::Require);
    assert_eq!(info.host, "ep-cool-rain-123.database.example.com");
    assert_eq!(info.database, "consort-tls-1");

    // And a plaintext ConnectInfo for a remote host is refused by connect itself.
    let mut plain = info.clone();
    plain.sslmode = SslMode::Disable;
    let err = consort_lakebase::lakebase_api::connect(&plain)
        .await
        .expect_err("refused");
    assert!(matches!(err, ApiError::Config(_)), "{err:?}");
}

#[tokio::test]
async fn reset_recreates_the_branch_from_its_base() {
    let (_pg, lb, p) = backed().await;
    let base = p.prepare_base(&BaseSpec::default()).await.expect("base");
    let branch = p.create("consort-reset-1", &base).await.expect("create");
    let db = connect(&p.connect_info(&branch).await.expect("info")).await;
    db.execute("INSERT INTO items VALUES (7, 'dirty')", &[])
        .await
        .expect("write");
    drop(db);

    let again = p.reset(&branch).await.expect("reset");
    assert_eq!(again.name, branch.name);
    assert_eq!(again.base, base);
    let db = connect(&p.connect_info(&again).await.expect("info")).await;
    assert_count(
        &db,
        "SELECT count(*) FROM items",
        1,
        "the reset branch is back to the base's state",
    )
    .await;
    drop(db);
    assert_eq!(lb.count("DELETE", "consort-reset-1").await, 1);
    assert_eq!(lb.creates().await, 2);
    p.delete("consort-reset-1").await.expect("delete");
}

#[tokio::test]
async fn prepare_base_builds_a_no_expiry_branch_once() {
    let (pg, lb, p) = backed().await;
    let spec = BaseSpec {
        migrations: vec![consort_actors::Migration {
            version: "0001_stock".into(),
            story_id: "S1".into(),
            description: "stock table".into(),
            sql: "CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL CHECK (qty >= 0));"
                .into(),
        }],
        fixtures: vec!["INSERT INTO stock VALUES ('apple', 3);".into()],
        promoted: Vec::new(),
    };
    let base = p.prepare_base(&spec).await.expect("base");
    assert_eq!(base.key, spec.key());
    assert_eq!(base.id, format!("consort-base-{}", spec.key().short()));
    let body = lb.spec_of(&base.id).await.expect("base branch exists");
    assert_eq!(body["no_expiry"], true, "a parent branch must not expire");
    assert!(body.get("ttl").is_none());

    let again = p.prepare_base(&spec).await.expect("idempotent");
    assert_eq!(again, base);
    // A new process (provider) finds the complete base instead of rebuilding it.
    let p2 = provider(&lb, pg.port);
    let third = p2.prepare_base(&spec).await.expect("reused");
    assert_eq!(third, base);
    assert_eq!(lb.creates().await, 1, "built once");

    let branch = p
        .create("consort-child-1", &base)
        .await
        .expect("create from base");
    let db = connect(&p.connect_info(&branch).await.expect("info")).await;
    let qty: i32 = query_value(&db, "SELECT qty FROM stock WHERE sku = 'apple'", &[]).await;
    assert_eq!(qty, 3);
    let recorded: String = query_value(
        &db,
        "SELECT checksum FROM consort_migrations WHERE version = '0001_stock'",
        &[],
    )
    .await;
    assert_eq!(recorded, spec.migrations[0].checksum().to_hex());
    drop(db);

    // The base has a child: the service refuses to delete it, sweep leaves it alone.
    p.delete("consort-child-1").await.expect("delete child");
    p.delete(&base.id).await.expect("delete base");
    assert_eq!(lb.branch_ids().await, ["production"]);
}

#[tokio::test]
async fn create_reuses_a_branch_only_when_the_lineage_matches() {
    let (_pg, lb, p) = backed().await;
    let base = p.prepare_base(&BaseSpec::default()).await.expect("base");
    // The first create's answer was lost; the branch exists with the same source.
    client(&lb)
        .create_branch_and_wait("consort-dup-1", &ttl_spec("production"))
        .await
        .expect("create behind the provider's back");
    let b = p.create("consort-dup-1", &base).await.expect("reused");
    assert_eq!(b.name, "consort-dup-1");
    assert_eq!(lb.creates().await, 2, "the second POST got 409");

    lb.preload("dev", Some("production"), HOUR).await;
    lb.preload("consort-dup-2", Some("dev"), HOUR).await;
    let err = refused(&p, "consort-dup-2", &base, "other lineage").await;
    assert!(
        matches!(err, Error::AlreadyExists(ref m) if m.contains("exists with source")),
        "{err:?}"
    );
    p.delete("consort-dup-1").await.expect("delete");
}

#[tokio::test]
async fn delete_of_a_missing_branch_is_fine() {
    let lb = Lakebase::start(None).await;
    let p = provider(&lb, 5432);
    p.delete("consort-never-was")
        .await
        .expect("not found is fine");
    assert_eq!(lb.count("DELETE", "consort-never-was").await, 1);
    let c = client(&lb);
    c.delete_branch("consort-never-was").await.expect("ok");
    let asked = lb.requests_of("DELETE").await;
    assert!(
        asked
            .iter()
            .all(|r| r.query.get("allow_missing").map(String::as_str) == Some("true")),
        "every delete says allow_missing"
    );
    // A service that answers 404 instead: not an error either.
    lb.fault(Fault::on_branches(
        "DELETE",
        404,
        "NOT_FOUND",
        "branch not found",
    ))
    .await;
    assert!(!c.delete_branch("consort-never-was").await.expect("ok"));
}

#[tokio::test]
async fn kept_branches_outlive_the_orphan_sweep() {
    let lb = Lakebase::start(None).await;
    let day = Duration::from_secs(86_400);
    for (id, age) in [
        // Created two days ago with a one-hour TTL: expired, the service has not removed it.
        ("consort-orphan-1", 2 * day),
        // Young: its owner may still be running.
        ("consort-young-1", Duration::from_secs(60)),
        // Old, but kept for inspection until tomorrow.
        ("consort-kept-1", 2 * day),
        // Old and not ours.
        ("feature-x", 2 * day),
    ] {
        lb.preload(id, Some("production"), age).await;
    }
    let p = provider(&lb, 5432);
    let kept = consort_lakebase::Branch {
        name: "consort-kept-1".into(),
        id: "projects/demo/branches/consort-kept-1".into(),
        base: p.prepare_base(&BaseSpec::default()).await.expect("base"),
        created_at: SystemTime::now() - 2 * day,
    };
    let until = SystemTime::now() + day;
    p.keep_for_inspection(&kept, until).await.expect("keep");
    let patch = lb.first_request("PATCH").await.expect("PATCH sent");
    assert_eq!(
        patch.path,
        "/api/2.0/postgres/projects/demo/branches/consort-kept-1"
    );
    assert_eq!(
        patch.query.get("update_mask").map(String::as_str),
        Some("spec.expiration")
    );
    let sent = patch.body["spec"]["expire_time"]
        .as_str()
        .expect("expire_time");
    let parsed =
        std::time::SystemTime::from(chrono::DateTime::parse_from_rfc3339(sent).expect("rfc3339"));
    assert!(parsed.duration_since(until).unwrap_or_default() < Duration::from_secs(1));

    let n = p.sweep_orphans().await.expect("sweep orphans");
    assert_eq!(n, 1);
    let mut left = lb.branch_ids().await;
    left.sort();
    assert_eq!(
        left,
        [
            "consort-kept-1",
            "consort-young-1",
            "feature-x",
            "production"
        ]
    );
}

#[tokio::test]
async fn promote_applies_migrations_to_the_source_branch() {
    let (pg, _lb, p) = backed().await;
    let m1 = consort_actors::Migration {
        version: "0001_labels".into(),
        story_id: "S1".into(),
        description: "label index".into(),
        sql: "CREATE INDEX items_label ON items (label);".into(),
    };
    let out = p.promote(std::slice::from_ref(&m1)).await.expect("promote");
    assert_eq!(out.target, "projects/demo/branches/production");
    assert_eq!(out.applied, ["0001_labels"]);
    assert!(out.verified && out.failure.is_none(), "{out:?}");
    let again = p.promote(std::slice::from_ref(&m1)).await.expect("again");
    assert!(again.applied.is_empty());
    assert_eq!(again.already_applied, ["0001_labels"]);

    assert_parent_count(
        &pg,
        "SELECT count(*) FROM pg_indexes WHERE indexname = 'items_label'",
        1,
        "the parent itself has the migration",
    )
    .await;

    let changed = consort_actors::Migration {
        sql: "CREATE INDEX items_label2 ON items (label);".into(),
        ..m1
    };
    let out = p.promote(&[changed]).await.expect("promote reports");
    assert!(!out.verified);
    assert!(out.failure.is_some_and(|f| f.contains("checksum")));
}
