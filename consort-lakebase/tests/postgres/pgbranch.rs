//! Template branching on a server (`pgbranch/`), through the provider both server backends
//! share: busy parents, open sessions, concurrency over several administrator connections,
//! orphan sweeps, and the URL backend inside an existing server. Each test starts its own
//! cluster: they sweep everything and sit on the parent, which would disturb a shared one.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::common::{assert_count, base_of, branch_names, empty_base, migration, query_value};
use consort_lakebase::names::{BRANCH_PREFIX, BranchNamer, quote_literal};
use consort_lakebase::{
    BaseSpec, BranchProvider, ConnectInfo, EmbeddedCluster, EmbeddedConfig, EmbeddedPostgres,
    EmbeddedProvider, Error, PostgresUrlProvider, Secret, ServerOptions, connect,
};
use tokio_postgres::Client;

/// Most administrator connections one provider opens (`pgbranch/admin.rs`).
const ADMIN_CONNECTIONS: i64 = 4;

async fn provider() -> (Arc<EmbeddedCluster>, EmbeddedProvider) {
    let cluster = EmbeddedPostgres::start(EmbeddedConfig::temporary())
        .await
        .expect("cluster");
    let p = EmbeddedProvider::new(cluster.clone())
        .await
        .expect("provider");
    (cluster, p)
}

use consort_testkit::cluster::{admin_info, fresh_branch};

/// The pid of a process that has exited (and been reaped).
fn exited_pid() -> u32 {
    let mut gone = std::process::Command::new("true").spawn().expect("spawn");
    let pid = gone.id();
    gone.wait().expect("reap");
    pid
}

async fn admin(cluster: &EmbeddedCluster) -> Client {
    connect(&admin_info(cluster, "postgres"))
        .await
        .expect("admin")
}

async fn db_exists(admin: &Client, db: &str) -> bool {
    admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
        .await
        .expect("lookup")
        .is_some()
}

/// The URL of database `app` as `appuser` with `password` on `cluster`, then `params`.
fn app_url(cluster: &EmbeddedCluster, password: &str, params: &str) -> Secret {
    Secret::new(format!(
        "postgresql://appuser:{password}@127.0.0.1:{}/app{params}",
        cluster.port()
    ))
}

#[tokio::test]
async fn a_session_on_the_parent_is_waited_out() {
    let (cluster, b) = provider().await;
    // Someone sits on the parent: copying it fails with 55006 until they leave.
    let holder = connect(&admin_info(&cluster, "consort"))
        .await
        .expect("hold the parent");
    let spec = base_of(vec![migration("0001", "CREATE TABLE t (x int)")]);
    let release = async {
        while b.busy_retries() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(holder);
    };
    let (base, ()) = tokio::join!(b.prepare_base(&spec), release);
    let base = base.expect("the base is built once the parent is free");
    assert!(b.busy_retries() > 0);
    let branch = b
        .create(&BranchNamer::new().next_name(), &base)
        .await
        .expect("branch");
    b.delete(&branch.name).await.expect("delete");
}

#[tokio::test]
async fn a_branch_with_open_sessions_is_dropped_and_its_sessions_ended() {
    let (cluster, b) = provider().await;
    let (branch, info) = fresh_branch(&b, &BaseSpec::default()).await;
    let held = connect(&info).await.expect("a session");
    held.batch_execute("SELECT 1").await.expect("in use");
    b.delete(&branch.name)
        .await
        .expect("dropped although in use");
    assert!(
        held.batch_execute("SELECT 1").await.is_err(),
        "the session was ended"
    );
    let admin = admin(&cluster).await;
    assert!(!db_exists(&admin, &branch.id).await);
    let sessions: i64 = query_value(
        &admin,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
        &[&branch.id],
    )
    .await;
    assert_eq!(sessions, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branches_are_created_and_dropped_concurrently_over_several_connections() {
    let (cluster, b) = provider().await;
    let b = Arc::new(b);
    let base = b.prepare_base(&BaseSpec::default()).await.expect("base");
    let namer = Arc::new(BranchNamer::new());
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let (b, base, namer) = (b.clone(), base.clone(), namer.clone());
            tokio::spawn(async move {
                let branch = b.create(&namer.next_name(), &base).await?;
                b.delete(&branch.name).await
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task").expect("create and delete");
    }
    assert!(b.list(BRANCH_PREFIX).await.expect("list").is_empty());
    // The provider's administrator connections are its sessions on the maintenance database.
    let opened: i64 = query_value(
        &admin(&cluster).await,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = 'postgres' \
         AND application_name = 'consort' AND pid <> pg_backend_pid()",
        &[],
    )
    .await;
    assert!(
        (1..=ADMIN_CONNECTIONS).contains(&opened),
        "{opened} administrator connections"
    );
}

#[tokio::test]
async fn orphans_of_dead_processes_are_swept_and_others_are_kept() {
    let (cluster, b) = provider().await;
    let base = b.prepare_base(&BaseSpec::default()).await.expect("base");
    let namer = BranchNamer::new();
    let mine = b.create(&namer.next_name(), &base).await.expect("mine");
    let dead = b.create(&namer.next_name(), &base).await.expect("dead");
    let kept = b.create(&namer.next_name(), &base).await.expect("kept");
    let expired = b.create(&namer.next_name(), &base).await.expect("expired");
    // Give `dead` the marker of a process that has exited.
    let gone_pid = exited_pid();
    let admin = admin(&cluster).await;
    let mut meta = marker_of(&admin, &dead.id, false).await;
    meta["pid"] = gone_pid.into();
    remark(&admin, &dead.id, false, &meta).await;
    // `kept` is kept for an hour, `expired` was kept until a minute ago.
    b.keep_for_inspection(&kept, SystemTime::now() + Duration::from_secs(3600))
        .await
        .expect("keep");
    b.keep_for_inspection(&expired, SystemTime::now() - Duration::from_secs(60))
        .await
        .expect("keep");
    // A database with the prefix that Consort did not make is never touched.
    admin
        .batch_execute("CREATE DATABASE consort_foreign_1")
        .await
        .expect("foreign db");
    let swept = b.sweep_orphans().await.expect("sweep");
    assert_eq!(swept, 2);
    let left = branch_names(&b, BRANCH_PREFIX).await;
    assert_eq!(left, vec![mine.name.clone(), kept.name.clone()]);
    assert!(db_exists(&admin, "consort_foreign_1").await);
    assert!(matches!(
        b.delete("consort-foreign-1").await,
        Err(Error::PermissionDenied(_))
    ));
    // A person's clean-up takes what is kept for inspection too, never a live process's.
    assert_eq!(b.sweep_unheld().await.expect("sweep unheld"), 1);
    let left = branch_names(&b, BRANCH_PREFIX).await;
    assert_eq!(left, vec![mine.name.clone()], "the live one stays");
    // sweep(older_than = 0) removes every Consort branch, still nothing foreign.
    assert_eq!(b.sweep(Duration::ZERO).await.expect("sweep all"), 1);
    assert!(b.list(BRANCH_PREFIX).await.expect("list").is_empty());
    assert!(db_exists(&admin, "consort_foreign_1").await);
    assert_count(
        &admin,
        "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'consort\\_%'",
        0,
        "branch roles are dropped with their branches",
    )
    .await;
}

/// The marker comment of database `db` (or role `db` when `role`), as JSON.
async fn marker_of(admin: &Client, db: &str, role: bool) -> serde_json::Value {
    let sql = if role {
        "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = $1"
    } else {
        "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1"
    };
    let text: String = query_value(admin, sql, &[&db]).await;
    serde_json::from_str(&text).expect("a JSON marker")
}

/// Writes marker `meta` on database `db` (or role `db` when `role`).
async fn remark(admin: &Client, db: &str, role: bool, meta: &serde_json::Value) {
    let kind = if role { "ROLE" } else { "DATABASE" };
    admin
        .batch_execute(&format!(
            "COMMENT ON {kind} {db} IS {}",
            quote_literal(&meta.to_string())
        ))
        .await
        .expect("re-mark");
}

/// A statement a killed process sent goes on on the server after it died (a `CREATE DATABASE`
/// finishes and commits): the sweep first ends the sessions such a process left running (its
/// liveness key still held, this host saying it is gone) and waits for them, so nothing they
/// would make appears after it.
#[tokio::test]
async fn a_sweep_first_ends_the_sessions_a_killed_process_left_running() {
    let (cluster, b) = provider().await;
    let admin = admin(&cluster).await;
    let base = b.prepare_base(&BaseSpec::default()).await.expect("base");
    let half = b
        .create(&BranchNamer::new().next_name(), &base)
        .await
        .expect("a branch");
    // Its maker was killed while its database was still being made: its role's marker names a
    // dead process, whose key a session of its own still holds.
    let mut dead = marker_of(&admin, &half.id, true).await;
    let my_key = dead["live"].as_u64().expect("a liveness key");
    let dead_key = u32::try_from((my_key + 1) % (1 << 32)).expect("a key");
    dead["pid"] = exited_pid().into();
    dead["live"] = dead_key.into();
    remark(&admin, &half.id, true, &dead).await;
    let drop = format!("DROP DATABASE {} WITH (FORCE)", half.id);
    admin.batch_execute(&drop).await.expect("not made yet");
    let class: i32 = query_value(
        &admin,
        "SELECT classid::int4 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 \
         AND objid = $1::int8::oid LIMIT 1",
        &[&i64::try_from(my_key).expect("a key")],
    )
    .await;
    let outliving = self::admin(&cluster).await;
    outliving
        .execute(
            "SELECT pg_advisory_lock_shared($1, $2)",
            &[&class, &i32::from_ne_bytes(dead_key.to_ne_bytes())],
        )
        .await
        .expect("the dead process's key");
    let busy = format!(
        "DO $$ BEGIN PERFORM pg_sleep(5); CREATE ROLE {}_late; END $$",
        half.id
    );
    let statement = tokio::spawn(async move { outliving.batch_execute(&busy).await });
    let running = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'DO $$ BEGIN PERFORM%'";
    while query_value::<i64>(&admin, running, &[]).await == 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    assert_eq!(b.sweep_unheld().await.expect("sweep"), 0);
    let ended = statement.await.expect("the statement's task");
    assert!(ended.is_err(), "the statement was ended, not finished");
    assert_count(
        &admin,
        "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'consort\\_%'",
        0,
        "neither the half-made branch's role nor what the dead process's statement would make",
    )
    .await;
}

/// What a process killed at any instant leaves, made by hand, then swept (issue 49, item 1):
/// a branch killed between its `CREATE DATABASE` and its comment, a branch and a half-built
/// base of a process on another host whose sessions are gone, and templates nobody uses.
/// What a live process holds stays, from any host.
#[tokio::test]
async fn a_kill_at_any_instant_leaves_nothing_the_sweeps_miss() {
    let (cluster, b) = provider().await;
    let admin = admin(&cluster).await;
    let base = b.prepare_base(&BaseSpec::default()).await.expect("base");
    let namer = BranchNamer::new();
    let half = b.create(&namer.next_name(), &base).await.expect("half");
    let away_dead = b.create(&namer.next_name(), &base).await.expect("away");
    let away_live = b.create(&namer.next_name(), &base).await.expect("away");
    let gone_pid = exited_pid();
    // `half`: its database never got its comment; its role's marker names a dead process.
    let mut role_meta = marker_of(&admin, &half.id, true).await;
    role_meta["pid"] = gone_pid.into();
    remark(&admin, &half.id, true, &role_meta).await;
    admin
        .batch_execute(&format!("COMMENT ON DATABASE {} IS NULL", half.id))
        .await
        .expect("unmark");
    // Made on another host: one by a provider whose sessions are gone, one by this one.
    let mine = marker_of(&admin, &away_live.id, false).await;
    let my_key = mine["live"].as_u64().expect("a liveness key");
    let mut elsewhere = mine.clone();
    elsewhere["host"] = "another-machine".into();
    remark(&admin, &away_live.id, false, &elsewhere).await;
    elsewhere["live"] = ((my_key + 1) % (1 << 32)).into();
    remark(&admin, &away_dead.id, false, &elsewhere).await;
    // Bases killed while being built, before their marker: a dead builder's and a live one's.
    let dead_tmp = format!("consorttmp_{:08x}_x", (my_key + 1) % (1 << 32));
    let live_tmp = format!("consorttmp_{my_key:08x}_x");
    for db in [&dead_tmp, &live_tmp, &"consorttmp_foreign".to_string()] {
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .expect("a half-built base");
    }

    assert_eq!(b.sweep_orphans().await.expect("sweep"), 2);
    let left = branch_names(&b, BRANCH_PREFIX).await;
    assert_eq!(
        left,
        vec![away_live.name.clone()],
        "only the live one stays"
    );
    // A person's clean-up from any clone leaves the live one on the other host too.
    assert_eq!(b.sweep_unheld().await.expect("sweep unheld"), 0);
    assert_eq!(branch_names(&b, BRANCH_PREFIX).await, left);
    for (db, stays) in [
        (half.id.as_str(), false),
        (away_dead.id.as_str(), false),
        (dead_tmp.as_str(), false),
        (live_tmp.as_str(), true),
        ("consorttmp_foreign", true),
    ] {
        assert_eq!(db_exists(&admin, db).await, stays, "{db}");
    }
    assert_count(
        &admin,
        "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'consort\\_%'",
        1,
        "the half-made branch's role went with it",
    )
    .await;

    // The full sweep: every branch, and the templates no branch uses unless a live process
    // made them a moment ago.
    let other = b
        .prepare_base(&base_of(vec![migration("0001", "CREATE TABLE t (x int)")]))
        .await
        .expect("another base");
    // A third, whose maker was killed between its rename and its seal: unsealed.
    let unsealed_spec = base_of(vec![migration("0001", "CREATE TABLE u (x int)")]);
    let unsealed = b.prepare_base(&unsealed_spec).await.expect("a third base");
    for t in [&other, &unsealed] {
        let mut old = marker_of(&admin, &t.id, false).await;
        old["pid"] = gone_pid.into();
        remark(&admin, &t.id, false, &old).await;
    }
    let unseal = format!("ALTER DATABASE {} WITH IS_TEMPLATE false", unsealed.id);
    admin.batch_execute(&unseal).await.expect("unseal");
    // A provider building that base again replaces the abandoned one instead of waiting on it.
    let again = b.prepare_base(&unsealed_spec).await.expect("rebuilt");
    assert_eq!(again.id, unsealed.id);
    assert_count(
        &admin,
        &format!(
            "SELECT count(*) FROM pg_database WHERE datistemplate AND datname = '{}'",
            unsealed.id
        ),
        1,
        "the rebuilt base is sealed",
    )
    .await;
    remark(&admin, &unsealed.id, false, &{
        let mut m = marker_of(&admin, &unsealed.id, false).await;
        m["pid"] = gone_pid.into();
        m
    })
    .await;
    admin.batch_execute(&unseal).await.expect("unseal again");

    assert_eq!(b.sweep(Duration::ZERO).await.expect("sweep all"), 1);
    assert!(
        !db_exists(&admin, &other.id).await,
        "a dead maker's template goes"
    );
    assert!(
        !db_exists(&admin, &unsealed.id).await,
        "a dead maker's unsealed template goes"
    );
    assert!(db_exists(&admin, &base.id).await, "a young live one stays");
}

#[tokio::test]
async fn a_statement_error_keeps_the_servers_message_detail_and_source() {
    let (cluster, _p) = provider().await;
    let admin = admin(&cluster).await;
    let e = admin
        .batch_execute("CREATE DATABASE consort_held TEMPLATE consort")
        .await;
    // Nobody holds the parent here, so this works; the second copy collides by name.
    e.expect("first copy");
    let dup = admin
        .batch_execute("CREATE DATABASE consort_held TEMPLATE consort")
        .await
        .expect_err("a duplicate database");
    let err = Error::from_pg("copying", dup);
    assert_eq!(
        err.sqlstate(),
        Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE)
    );
    assert!(
        err.to_string()
            .contains("database \"consort_held\" already exists"),
        "{err}"
    );
    assert!(
        std::error::Error::source(&err).is_some(),
        "the source is kept"
    );
}

#[tokio::test]
async fn branches_inside_an_existing_server_without_touching_foreign_databases() {
    let cluster = EmbeddedPostgres::start(EmbeddedConfig::temporary())
        .await
        .expect("cluster");
    let admin = admin(&cluster).await;
    // An application role (not a superuser) that owns the parent, as on a shared server.
    for sql in [
        "CREATE ROLE appuser LOGIN CREATEDB CREATEROLE PASSWORD 'app-Secret-42'",
        "CREATE DATABASE app OWNER appuser",
        "CREATE DATABASE consort_not_ours_1",
    ] {
        admin.batch_execute(sql).await.expect("setup");
    }
    let url = app_url(&cluster, "app-Secret-42", "?sslmode=disable");
    let p = PostgresUrlProvider::connect(&url, ServerOptions::default())
        .await
        .expect("connect");
    assert_eq!(p.parent_database(), "app");
    assert_eq!(p.kind(), "postgres-url");
    assert!(p.private_paths().is_empty());
    assert!(!format!("{p:?}").contains("app-Secret-42"));

    // A parent Consort did not create is not changed: what migrations need of it is shown,
    // with the statements that grant it.
    let needs = p.parent_privileges().await.expect("privileges");
    assert_eq!(needs.len(), 2);
    assert!(!needs[0].ok, "{needs:?}");
    assert_eq!(
        needs[0].grant,
        "GRANT CREATE ON DATABASE \"app\" TO \"consortowner\";"
    );
    // Its bases are Consort's own copies: migrations create schemas there all the same.
    let schema = p
        .prepare_base(&base_of(vec![migration(
            "0001_own_schema",
            "CREATE SCHEMA notes_app; CREATE TABLE notes_app.n (id int)",
        )]))
        .await;
    assert!(schema.is_ok(), "{schema:?}");
    admin
        .batch_execute(&needs[0].grant)
        .await
        .expect("a person with the rights grants it");
    let needs = p.parent_privileges().await.expect("privileges");
    assert!(needs[0].ok, "{needs:?}");

    let migrations = vec![migration(
        "0001_notes",
        "CREATE TABLE notes (id int PRIMARY KEY, body text)",
    )];
    let base = p
        .prepare_base(&BaseSpec {
            migrations: migrations.clone(),
            fixtures: vec!["INSERT INTO notes VALUES (1, 'fixture')".into()],
            promoted: Vec::new(),
        })
        .await
        .expect("base");
    let namer = BranchNamer::new();
    let a = p.create(&namer.next_name(), &base).await.expect("a");
    let b = p.create(&namer.next_name(), &base).await.expect("b");
    let ia = p.connect_info(&a).await.expect("info");
    let ca = connect(&ia).await.expect("connect a");
    ca.batch_execute("INSERT INTO notes VALUES (2, 'in a')")
        .await
        .expect("write a");
    let cb = connect(&p.connect_info(&b).await.expect("info"))
        .await
        .expect("connect b");
    assert_count(
        &cb,
        "SELECT count(*) FROM notes",
        1,
        "b has the fixture row only",
    )
    .await;
    drop((ca, cb));

    // Foreign databases with the prefix are neither deleted nor swept.
    assert!(matches!(
        p.delete("consort-not-ours-1").await,
        Err(Error::PermissionDenied(_))
    ));
    assert_eq!(p.sweep(Duration::ZERO).await.expect("sweep"), 2);
    let still: i64 = query_value(
        &admin,
        "SELECT count(*) FROM pg_database WHERE datname IN ('consort_not_ours_1', 'app')",
        &[],
    )
    .await;
    assert_eq!(still, 2);

    // Promote reaches the URL's database.
    let out = p.promote(&migrations).await.expect("promote");
    assert_eq!(out.target, "app");
    assert!(out.verified);

    // A wrong password: a clear error that keeps the driver's error, without the password.
    let bad = app_url(&cluster, "wrong-Pass-77", "");
    let err = PostgresUrlProvider::connect(&bad, ServerOptions::default())
        .await
        .expect_err("bad password");
    assert!(matches!(err, Error::Connection { .. }), "{err}");
    assert!(
        err.to_string().contains("password authentication failed"),
        "{err}"
    );
    assert!(!err.to_string().contains("wrong-Pass-77"), "{err}");
    let err = PostgresUrlProvider::connect(
        &Secret::new("postgresql://u:pw-Zz9@[bad"),
        ServerOptions::default(),
    )
    .await
    .expect_err("bad url");
    assert!(!err.to_string().contains("pw-Zz9"), "{err}");
}

/// What a test on one branch found while it kept trying every other database of the server.
#[derive(Default)]
struct Probe {
    rounds: usize,
    seen: std::collections::BTreeSet<String>,
    written: Vec<String>,
}

/// From branch `home`, tries over and over to connect to every other database and create a
/// table there, until `stop` is set.
async fn probe_others(home: ConnectInfo, stop: Arc<std::sync::atomic::AtomicBool>) -> Probe {
    let own = connect(&home).await.expect("the branch's own session");
    let mut probe = Probe::default();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let names = own
            .query(
                "SELECT datname FROM pg_database WHERE datname <> current_database()",
                &[],
            )
            .await
            .expect("pg_database");
        for name in names.iter().map(|r| r.get::<_, String>(0)) {
            let mut info = home.clone();
            info.database = name.clone();
            if let Ok(other) = connect(&info).await
                && other
                    .batch_execute("CREATE TABLE planted (x int)")
                    .await
                    .is_ok()
            {
                probe.written.push(name.clone());
            }
            probe.seen.insert(name);
        }
        probe.rounds += 1;
    }
    probe
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_being_made_is_never_open_to_a_test_on_another_branch() {
    let (_cluster, b) = provider().await;
    let b = Arc::new(b);
    let base = b.prepare_base(&BaseSpec::default()).await.expect("base");
    let namer = BranchNamer::new();
    let home = b.create(&namer.next_name(), &base).await.expect("home");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let prober = tokio::spawn(probe_others(
        b.connect_info(&home).await.expect("info"),
        stop.clone(),
    ));
    // A base whose migration takes a while (a wide window while it is filled), and branches
    // made and dropped beside it (many narrow ones).
    let slow = base_of(vec![migration(
        "0001_slow",
        "SELECT pg_sleep(1.5); CREATE TABLE t (id int)",
    )]);
    let building = {
        let b = b.clone();
        tokio::spawn(async move { b.prepare_base(&slow).await })
    };
    for _ in 0..6 {
        let branch = b.create(&namer.next_name(), &base).await.expect("create");
        b.delete(&branch.name).await.expect("delete");
    }
    let slow_base = building.await.expect("task").expect("the slow base");
    let branch = b
        .create(&namer.next_name(), &slow_base)
        .await
        .expect("create");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let probe = prober.await.expect("prober");
    b.delete(&branch.name).await.expect("delete");

    assert!(probe.rounds > 0);
    assert!(
        probe.seen.iter().any(|n| n.starts_with("consorttmp_")),
        "the base was seen while it was being filled: {:?}",
        probe.seen
    );
    assert!(
        probe.written.is_empty(),
        "a test wrote to {:?}",
        probe.written
    );
}

/// Two processes removing the same branch at once (two sweeps, two lanes resuming) both
/// succeed: the one whose `DROP ROLE` meets the other's ("tuple concurrently deleted") finds
/// the role gone, which is what it asked for.
#[tokio::test]
async fn two_providers_deleting_one_branch_at_once_both_succeed() {
    let (cluster, first) = provider().await;
    let second = EmbeddedProvider::new(cluster.clone())
        .await
        .expect("a second provider");
    let base = empty_base(&first).await;
    let namer = BranchNamer::new();
    for _ in 0..8 {
        let b = first
            .create(&namer.next_name(), &base)
            .await
            .expect("branch");
        let (a, z) = tokio::join!(first.delete(&b.name), second.delete(&b.name));
        a.expect("the first delete");
        z.expect("the second delete, at the same moment");
    }
    assert!(branch_names(&first, BRANCH_PREFIX).await.is_empty());
}

/// What the DBA is shown: a branch's own tables with their columns, constraints and indexes,
/// PostgreSQL's own schemas left out.
#[tokio::test]
async fn a_branch_s_catalog_lists_its_tables_columns_constraints_and_indexes() {
    let (_cluster, b) = provider().await;
    let spec = base_of(vec![migration(
        "0001",
        "CREATE TABLE shelves (id serial PRIMARY KEY, name text NOT NULL DEFAULT 'top');\
             CREATE SCHEMA app; CREATE TABLE app.labels (id int, shelf_id int NOT NULL REFERENCES shelves(id));\
             CREATE INDEX labels_by_shelf ON app.labels (shelf_id)",
    )]);
    let (branch, info) = fresh_branch(&b, &spec).await;
    let catalog = consort_lakebase::read_catalog(&info)
        .await
        .expect("catalog");
    b.delete(&branch.name).await.expect("delete");
    let names: Vec<&str> = catalog.tables.iter().map(|t| t.name.as_str()).collect();
    assert!(names.iter().all(|n| !n.starts_with("pg_")), "{names:?}");
    let shelves = catalog.table("public.shelves").expect("shelves");
    assert!(
        shelves
            .columns
            .contains(&"name text NOT NULL DEFAULT 'top'::text".to_string()),
        "{shelves:?}"
    );
    let labels = catalog.table("app.labels").expect("labels");
    assert!(
        labels
            .constraints
            .iter()
            .any(|c| c.contains("FOREIGN KEY (shelf_id) REFERENCES shelves(id)")),
        "{labels:?}"
    );
    assert!(
        labels.indexes.iter().any(|i| i.contains("labels_by_shelf")),
        "{labels:?}"
    );
}

/// A migration tool's promotion login: it reaches the parent, what it creates belongs to the
/// owner role as a promotion's SQL does, and once dropped it cannot log in again; one whose
/// maker was killed is swept.
#[tokio::test]
async fn a_promotion_login_acts_as_the_owner_role_on_the_parent_and_goes_when_dropped() {
    let (cluster, b) = provider().await;
    let orphan = b.parent_login().await.expect("a login whose maker dies");
    let admin = admin(&cluster).await;
    let role = &orphan.conn.user;
    let mut meta = marker_of(&admin, role, true).await;
    meta["pid"] = exited_pid().into();
    remark(&admin, role, true, &meta).await;
    b.sweep_orphans().await.expect("sweep");
    let left: i64 = query_value(
        &admin,
        "SELECT count(*) FROM pg_roles WHERE rolname = $1",
        &[role],
    )
    .await;
    assert_eq!(left, 0, "the killed promotion's login is swept");
    let login = b.parent_login().await.expect("a login to the parent");
    let expires_within_the_hour: bool = query_value(
        &admin,
        "SELECT rolvaliduntil BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes' \
         FROM pg_roles WHERE rolname = $1",
        &[&login.conn.user],
    )
    .await;
    assert!(expires_within_the_hour, "the login expires within the hour");
    let c = connect(&login.conn).await.expect("it logs in");
    c.batch_execute("CREATE TABLE made_by_the_tool (x int)")
        .await
        .expect("it may create in the parent");
    let owner: String = c
        .query_one(
            "SELECT tableowner::text FROM pg_tables WHERE tablename = 'made_by_the_tool'",
            &[],
        )
        .await
        .expect("owner")
        .get(0);
    assert_eq!(owner, "consortowner");
    drop(c);
    b.drop_parent_login(&login).await.expect("dropped");
    assert!(
        connect(&login.conn).await.is_err(),
        "the login is gone with its role"
    );
    let (branch, info) = fresh_branch(&b, &BaseSpec::default()).await;
    let seen: i64 = connect(&info)
        .await
        .expect("branch login")
        .query_one("SELECT count(*) FROM made_by_the_tool", &[])
        .await
        .expect("the parent's new table is in a later base")
        .get(0);
    assert_eq!(seen, 0);
    b.delete(&branch.name).await.expect("delete");
}
