//! What holds off the paved road: no branch outlives a failed create, a revoked credential is
//! re-minted, 400s are typed by what the service says, TLS trusts a configured CA and checks
//! the host name, refusals that are not the login window fail at once with the server's words,
//! OAuth for service principals, the branch limit, the User-Agent and `allow_missing`.

use super::*;
use ca::TestCa;
use consort_lakebase::lakebase_api::OAuthClient;
use pg::PgOptions;

/// Creates `name`, which must fail, and checks that the service no longer has it and was
/// asked to delete it (with `allow_missing`).
async fn refused_and_gone(
    lb: &Lakebase,
    p: &LakebaseProvider,
    name: &str,
    base: &BaseRef,
) -> Error {
    let err = refused(p, name, base, "the create must fail").await;
    assert!(
        !lb.branch_ids().await.contains(&name.to_string()),
        "{name} left behind after: {err}"
    );
    let deletes: Vec<_> = lb
        .requests_of("DELETE")
        .await
        .into_iter()
        .filter(|r| r.path.ends_with(&format!("/branches/{name}")))
        .collect();
    assert_eq!(deletes.len(), 1, "one delete of {name}");
    assert_eq!(
        deletes[0].query.get("allow_missing").map(String::as_str),
        Some("true")
    );
    err
}

/// A service over a local parent, a provider with its base, and the branch `name` with the
/// credential it was handed first.
async fn branch_with_credential(
    name: &str,
) -> (
    LocalPg,
    Lakebase,
    LakebaseProvider,
    BaseRef,
    consort_lakebase::Branch,
    consort_lakebase::ConnectInfo,
) {
    let pg = LocalPg::start().await;
    let lb = Lakebase::start(Some(&pg)).await;
    let (p, base) = provider_and_base(&lb, pg.port).await;
    let branch = p.create(name, &base).await.expect("create");
    let cached = p.connect_info(&branch).await.expect("info");
    (pg, lb, p, base, branch, cached)
}

/// [`refused_and_gone`], having minted exactly one credential (`why` says why no more).
async fn refused_after_one_mint(
    lb: &Lakebase,
    p: &LakebaseProvider,
    name: &str,
    base: &BaseRef,
    why: &str,
) -> Error {
    let before = lb.mints().await.len();
    let err = refused_and_gone(lb, p, name, base).await;
    assert_eq!(lb.mints().await.len(), before + 1, "{why}");
    err
}

#[tokio::test]
async fn a_branch_is_deleted_when_any_stage_after_its_creation_fails() {
    let pg = LocalPg::start().await;
    let lb = Lakebase::start(Some(&pg)).await;
    let (p, base) = provider_and_base(&lb, pg.port).await;

    // The endpoint's operation fails.
    lb.knobs(|k| k.fail_endpoint_ops = true).await;
    let err = refused_and_gone(&lb, &p, "consort-stage-endpoint", &base).await;
    assert!(
        err.to_string().contains("the compute failed to start"),
        "{err}"
    );
    lb.knobs(|k| k.fail_endpoint_ops = false).await;

    // The login window runs out.
    lb.knobs(|k| k.auth_window_mints = 1000).await;
    let mut cfg = config(&lb, pg.port);
    cfg.auth_ready.budget = Duration::from_millis(300);
    let short = LakebaseProvider::new(cfg).expect("provider");
    let err = refused_and_gone(&lb, &short, "consort-stage-login", &base).await;
    assert!(err.to_string().contains("did not accept logins"), "{err}");
    lb.knobs(|k| k.auth_window_mints = 0).await;

    // TLS fails: the server has no TLS, and plaintext is not allowed.
    let mut cfg = config(&lb, pg.port);
    cfg.allow_plaintext_loopback = false;
    let strict = LakebaseProvider::new(cfg).expect("provider");
    let err = refused_after_one_mint(
        &lb,
        &strict,
        "consort-stage-tls",
        &base,
        "a TLS failure is not retried as the login window",
    )
    .await;
    assert!(
        matches!(err, Error::Connect(ref m) if m.contains("TLS")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_refused_cached_credential_is_minted_again_once() {
    let (_pg, lb, p, base, branch, cached) = branch_with_credential("consort-revoked-1").await;
    lb.revoke_credentials().await;
    let old = refused_login(&cached, "the revoked credential no longer logs in").await;
    assert!(
        matches!(&old, ApiError::Postgres { message, .. } if message.contains("password authentication failed")),
        "the server's words are kept: {old}"
    );
    // The provider's own login (a new branch) re-mints at once.
    let minted = lb.mints().await.len();
    p.create("consort-revoked-2", &base)
        .await
        .expect("a new credential logs in");
    assert_eq!(lb.mints().await.len(), minted + 1, "minted once more");
    // connect_info checks a cached credential with a login and mints again when refused.
    lb.revoke_credentials().await;
    let minted = lb.mints().await.len();
    let checked = p.connect_info(&branch).await.expect("info");
    assert_ne!(
        checked.secret, cached.secret,
        "a revoked credential is never handed out"
    );
    assert_eq!(lb.mints().await.len(), minted + 1, "minted once more");
    drop(connect(&checked).await);
    // A caller that met a refusal tells the provider, which forgets the credential.
    p.invalidate_credential(&branch);
    let fresh = p.connect_info(&branch).await.expect("info");
    assert_eq!(
        lb.mints().await.len(),
        minted + 2,
        "the forgotten credential is asked for again"
    );
    drop(connect(&fresh).await);
    p.delete("consort-revoked-1").await.expect("delete");
    p.delete("consort-revoked-2").await.expect("delete");
}

/// A service may end a credential before the expiry it reported (an independent
/// implementation did, mid-use): `connect_info` must not hand out the cached one then, but a
/// fresh one that logs in.
#[tokio::test]
async fn a_credential_the_server_expired_mid_use_is_replaced_by_connect_info() {
    let (_pg, lb, p, _base, branch, cached) = branch_with_credential("consort-expired-1").await;
    let minted = lb.mints().await.len();
    let again = p.connect_info(&branch).await.expect("info");
    assert_eq!(
        again.secret, cached.secret,
        "a working credential is reused"
    );
    assert_eq!(lb.mints().await.len(), minted, "and not minted again");

    lb.expire_credentials().await;
    let reported = cached.expires_at.expect("an expiry");
    assert!(
        reported > SystemTime::now() + Duration::from_secs(60),
        "the expiry the service reported is still far ahead: only a login tells"
    );
    refused_login(&cached, "the expired credential no longer logs in").await;

    let fresh = p
        .connect_info(&branch)
        .await
        .expect("info after the expiry");
    assert_ne!(fresh.secret, cached.secret, "a new credential");
    assert_eq!(lb.mints().await.len(), minted + 1, "minted once more");
    let db = connect(&fresh).await;
    let one: i32 = query_value(&db, "SELECT 1", &[]).await;
    assert_eq!(one, 1, "the new credential logs in");
    drop(db);
    p.delete("consort-expired-1").await.expect("delete");
}

#[tokio::test]
async fn a_verification_on_a_warm_branch_whose_credential_was_revoked_still_runs() {
    let pg = LocalPg::start().await;
    let lb = Lakebase::start(Some(&pg)).await;
    let provider: Arc<dyn BranchProvider> = Arc::new(provider(&lb, pg.port));
    let tree = crate::common::tree_of(&[("tests/t1.sql", "SELECT 1;\n")]);
    let runner: Arc<dyn TestRunner> =
        Arc::new(PsqlRunner::new(PsqlRunnerConfig::default()).expect("psql runner"));
    let args = consort_lakebase::LakebaseArgs {
        pool: consort_testkit::cluster::pool_config(1),
        ..consort_lakebase::LakebaseArgs::new(provider, runner)
    };
    let stats = args.stats.clone();
    let (actor, join) = consort_lakebase::LakebaseActor::spawn(args)
        .await
        .expect("spawn");
    let verify = |id: u64| {
        let req = consort_testkit::verify::request(id, tree.path(), Vec::new());
        consort_testkit::verify::verify(&actor, req, Duration::from_secs(120))
    };
    let first = verify(1).await.expect("a receipt");
    assert_eq!(first.status_of("tests/t1.sql"), Some(TestStatus::Passed));
    // A verification served by the pool's warm branch, whose credential was minted before the
    // revocation. On a busy machine the pool may not have put its new branch in yet when the
    // verification asks (the branch is then made on demand): try again, a bounded number of
    // times, until the warm one serves.
    // Wait for the pool's warm branch: its create ends with a credential minted for it.
    let minted = lb.mints().await.len();
    let waited = std::time::Instant::now();
    while lb.mints().await.len() <= minted {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the pool made no warm branch"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for id in 2..8 {
        let before = lb.mints().await;
        let served_before = stats.snapshot().served_from_pool;
        lb.revoke_credentials().await;
        let receipt = verify(id)
            .await
            .expect("a receipt, not an infrastructure error");
        assert_eq!(
            receipt.status_of("tests/t1.sql"),
            Some(TestStatus::Passed),
            "{}",
            receipt.output_excerpt
        );
        if stats.snapshot().served_from_pool == served_before {
            continue;
        }
        // The warm branch that served had its credential minted before the revocation, and
        // minted again after the server refused it.
        let of_branch = format!("{}/endpoints/", receipt.branch_id);
        let mints = lb.mints().await;
        let (earlier, later) = mints.split_at(before.len());
        assert!(
            earlier.iter().any(|(e, _)| e.starts_with(&of_branch)),
            "the branch {} was warm before the revocation: {earlier:?}",
            receipt.branch_id
        );
        assert!(
            later.iter().any(|(e, _)| e.starts_with(&of_branch)),
            "the warm branch's refused credential was minted again: {later:?}"
        );
        actor.stop(None);
        let _ = join.await;
        return;
    }
    panic!("no verification was served by a warm branch");
}

#[tokio::test]
async fn a_refused_create_is_typed_by_what_the_service_says() {
    let lb = Lakebase::start(None).await;
    let p = provider(&lb, 5432);
    let base = BaseRef {
        id: "production".into(),
        key: BaseSpec::default().key(),
    };
    // What the service says, and a check of the error it must become.
    type Case = (&'static str, fn(&Error) -> bool);
    let cases: [Case; 3] = [
        (
            "Expiration time exceeds the maximum expiration time of 604800s",
            |e| matches!(e, Error::Misconfigured(c) if c.to_string().contains("TTL of 3600 s") && c.to_string().contains("ttl_secs")),
        ),
        ("invalid branch_id: must start with a letter", |e| {
            matches!(e, Error::InvalidName(_))
        }),
        ("spec.source_branch must be a branch resource", |e| {
            matches!(e, Error::Http { status: 400, .. })
        }),
    ];
    for (said, is) in cases {
        lb.fault(Fault::on_branches(
            "POST",
            400,
            "INVALID_PARAMETER_VALUE",
            said,
        ))
        .await;
        let err = refused(&p, "consort-refused-1", &base, said).await;
        assert!(is(&err), "{said}: {err:?}");
        assert!(err.to_string().contains(said), "the service's words: {err}");
    }
}

#[tokio::test]
async fn tls_trusts_the_configured_ca_and_refuses_another_hosts_certificate() {
    let ca = TestCa::for_host("localhost");
    let pg = LocalPg::start_with(PgOptions {
        tls: Some((ca.cert.clone(), ca.key.clone())),
        hba_reject: vec![],
    })
    .await;
    let lb = Lakebase::start(Some(&pg)).await;
    lb.knobs(|k| k.endpoint_host = "localhost".into()).await;
    let tls = |ca_file: Option<&std::path::Path>| {
        let mut cfg = config(&lb, pg.port);
        cfg.allow_plaintext_loopback = false;
        cfg.ca_file = ca_file.map(std::path::Path::to_path_buf);
        LakebaseProvider::new(cfg).expect("provider")
    };
    let base = BaseRef {
        id: "production".into(),
        key: BaseSpec::default().key(),
    };

    // Trusted through the CA file: the provider, the driver and libpq all verify it.
    let p = tls(Some(&ca.ca));
    let branch = p
        .create("consort-tls-1", &base)
        .await
        .expect("create over TLS");
    let info = p.connect_info(&branch).await.expect("info");
    assert_eq!(info.sslmode, SslMode::Require);
    let env: std::collections::HashMap<_, _> = info.env().into_iter().collect();
    assert_eq!(
        env.get("PGSSLMODE").map(String::as_str),
        Some("verify-full")
    );
    let db = connect(&info).await;
    let ssl: bool = query_value(
        &db,
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        &[],
    )
    .await;
    assert!(ssl, "the session is encrypted");
    drop(db);
    let out = std::process::Command::new("psql")
        .args(["-X", "-A", "-t", "-c", "SELECT 1"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(info.env())
        .output()
        .expect("psql starts");
    assert!(
        out.status.success(),
        "libpq with verify-full: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Without the CA, the certificate's issuer is unknown: refused at once, branch deleted.
    let err = refused(&tls(None), "consort-tls-2", &base, "unknown issuer").await;
    assert!(err.to_string().contains("TLS"), "{err}");
    assert!(!lb.branch_ids().await.contains(&"consort-tls-2".to_string()));

    // A host name the certificate is not for: refused (verify-full).
    lb.knobs(|k| k.endpoint_host = "127.0.0.1".into()).await;
    let err = refused(&tls(Some(&ca.ca)), "consort-tls-3", &base, "another host").await;
    assert!(err.to_string().contains("TLS"), "{err}");
    assert!(!lb.branch_ids().await.contains(&"consort-tls-3".to_string()));
    p.delete("consort-tls-1").await.expect("delete");
}

#[tokio::test]
async fn a_pg_hba_refusal_fails_at_once_with_the_servers_words() {
    let pg = LocalPg::start_with(PgOptions {
        tls: None,
        hba_reject: vec!["consort-hba-1".into()],
    })
    .await;
    let lb = Lakebase::start(Some(&pg)).await;
    let (p, base) = provider_and_base(&lb, pg.port).await;
    let err = refused_after_one_mint(
        &lb,
        &p,
        "consort-hba-1",
        &base,
        "not retried as the login window",
    )
    .await;
    let text = err.to_string();
    assert!(
        text.contains("pg_hba.conf") && text.contains("28000"),
        "{text}"
    );
}

#[tokio::test]
async fn a_service_principal_signs_in_with_oauth_and_a_refused_token_is_fetched_again() {
    let pg = LocalPg::start().await;
    let lb = Lakebase::start(Some(&pg)).await;
    lb.allow_oauth("sp-1234", "sp-secret-value").await;
    let mut cfg = config(&lb, pg.port);
    cfg.token = Secret::new("");
    cfg.oauth = Some(OAuthClient {
        client_id: "sp-1234".into(),
        client_secret: Secret::new("sp-secret-value"),
    });
    let p = LakebaseProvider::new(cfg.clone()).expect("provider");
    let base = p.prepare_base(&BaseSpec::default()).await.expect("base");
    p.create("consort-oauth-1", &base).await.expect("create");
    assert_eq!(
        lb.token_requests().await,
        1,
        "one token, cached for every call"
    );
    // The service refuses the token (revoked): one new token, and the call goes through.
    lb.revoke_access_tokens().await;
    p.delete("consort-oauth-1")
        .await
        .expect("delete with a new token");
    assert_eq!(lb.token_requests().await, 2);
    // A token about to expire is fetched again before it is used.
    lb.knobs(|k| k.oauth_lifetime = Duration::from_secs(30))
        .await;
    let short = LakebaseProvider::new(cfg.clone()).expect("provider");
    short.list("consort-").await.expect("list");
    short.list("consort-").await.expect("list");
    assert_eq!(
        lb.token_requests().await,
        4,
        "a token that expires within the refresh margin is not reused"
    );
    // A wrong secret is typed, and never shown.
    let mut bad = cfg;
    bad.oauth = Some(OAuthClient {
        client_id: "sp-1234".into(),
        client_secret: Secret::new("wrong-secret-value"),
    });
    let err = LakebaseProvider::new(bad)
        .expect("provider")
        .list("consort-")
        .await
        .expect_err("refused");
    let text = format!("{err} {err:?}");
    assert!(text.contains("invalid_client"), "{text}");
    assert!(
        !text.contains("wrong-secret-value") && !text.contains("sp-secret-value"),
        "{text}"
    );
}

#[tokio::test]
async fn requests_name_consort_and_the_branch_limit_is_the_projects() {
    let lb = Lakebase::start(None).await;
    let mut cfg = config(&lb, 5432);
    cfg.max_live_branches = 4;
    let p = LakebaseProvider::new(cfg.clone()).expect("provider");
    assert_eq!(p.capabilities().max_live_branches, Some(4));
    p.list("consort-").await.expect("list");
    let agent = lb.requests().await[0]
        .user_agent
        .clone()
        .unwrap_or_default();
    assert_eq!(agent, format!("consort/{}", env!("CARGO_PKG_VERSION")));
    cfg.max_live_branches = 1;
    assert!(
        LakebaseProvider::new(cfg).is_err(),
        "a limit below a base and a branch"
    );
}
