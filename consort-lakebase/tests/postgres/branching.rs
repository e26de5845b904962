//! Template branching on a real embedded cluster: isolation, credentials, busy templates,
//! migrations and promote.

use crate::common::{assert_rows, branch_names, migration, must_query, provider, query_strings};
use consort_lakebase::{
    BaseRef, BaseSpec, Branch, BranchProvider, ConnectInfo, Error, migrate, names::BranchNamer,
};

use consort_testkit::cluster::base_spec as spec;
use consort_testkit::cluster::{provider_on, unique_database};

/// A new branch of `base` on `p`, and how to reach it.
async fn branch_of(p: &impl BranchProvider, base: &BaseRef) -> (Branch, ConnectInfo) {
    let b = p
        .create(&BranchNamer::new().next_name(), base)
        .await
        .expect("branch");
    let info = p.connect_info(&b).await.expect("info");
    (b, info)
}

/// The base of one migration on `p`.
async fn base_with(p: &impl BranchProvider, version: &str, sql: &str) -> BaseRef {
    p.prepare_base(&spec(vec![migration(version, sql)]))
        .await
        .expect("base")
}

#[tokio::test]
async fn a_row_written_in_one_branch_is_absent_from_another_and_from_the_parent() {
    let p = provider().await;
    let namer = BranchNamer::new();
    let base = p
        .prepare_base(&spec(vec![migration(
            "0001_items",
            "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL)",
        )]))
        .await
        .expect("base");
    let a = p.create(&namer.next_name(), &base).await.expect("branch a");
    let b = p.create(&namer.next_name(), &base).await.expect("branch b");
    let ia = p.connect_info(&a).await.expect("info a");
    let ib = p.connect_info(&b).await.expect("info b");
    assert_ne!(ia.secret, ib.secret, "each branch has its own password");
    must_query(&ia, "INSERT INTO items VALUES (1, 'only in a')").await;
    assert_rows(&ia, "SELECT name FROM items", &["only in a"]).await;
    assert!(
        must_query(&ib, "SELECT name FROM items").await.is_empty(),
        "branch b does not see a's row"
    );
    // The parent has no items table at all (the migration lives only in the base).
    let mut parent = ib.clone();
    parent.database = p.parent_database().to_string();
    let err = query_strings(&parent, "SELECT 1")
        .await
        .expect_err("b's role may not connect to the parent");
    assert!(err.to_string().contains("permission denied"), "{err}");
    let mut other = ia.clone();
    other.database = ib.database.clone();
    assert!(
        query_strings(&other, "SELECT 1").await.is_err(),
        "a's role may not connect to b"
    );
    p.delete(&a.name).await.expect("delete a");
    p.delete(&b.name).await.expect("delete b");
    p.delete(&a.name).await.expect("deleting twice is fine");
    assert!(
        query_strings(&ia, "SELECT 1").await.is_err(),
        "a deleted branch's credentials stop working"
    );
}

#[tokio::test]
async fn the_golden_template_refuses_connections_and_create_still_works() {
    let p = provider().await;
    let base = base_with(&*p, "0001_t", "CREATE TABLE t (x int)").await;
    let namer = BranchNamer::new();
    let branch = p.create(&namer.next_name(), &base).await.expect("create");
    let mut to_template = p.connect_info(&branch).await.expect("info");
    to_template.database = base.id.clone();
    let err = query_strings(&to_template, "SELECT 1")
        .await
        .expect_err("nobody connects to the template");
    assert!(
        err.to_string()
            .contains("not currently accepting connections")
            || err.to_string().contains("permission denied"),
        "{err}"
    );
    // The attempt left nothing connected: branching keeps working.
    let second = p
        .create(&namer.next_name(), &base)
        .await
        .expect("create again");
    p.delete(&branch.name).await.expect("delete");
    p.delete(&second.name).await.expect("delete");
}

#[tokio::test]
async fn names_without_the_prefix_or_with_bad_characters_are_refused() {
    let p = provider().await;
    let base = p.prepare_base(&BaseSpec::default()).await.expect("base");
    for bad in [
        "postgres",
        "consort",
        "Consort-x",
        "consort_x",
        "consort-a b",
    ] {
        assert!(
            matches!(p.create(bad, &base).await, Err(Error::InvalidName(_))),
            "{bad}"
        );
        assert!(
            matches!(p.delete(bad).await, Err(Error::InvalidName(_))),
            "{bad}"
        );
    }
    let name = BranchNamer::new().next_name();
    let b = p.create(&name, &base).await.expect("create");
    assert!(matches!(
        p.create(&name, &base).await,
        Err(Error::AlreadyExists(_))
    ));
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn list_and_reset_work_on_this_runs_branches() {
    let p = provider().await;
    let base = base_with(&*p, "0001_r", "CREATE TABLE r (x int)").await;
    let namer = BranchNamer::new();
    let prefix = format!("consort-{}-", namer.run());
    let a = p.create(&namer.next_name(), &base).await.expect("a");
    let b = p.create(&namer.next_name(), &base).await.expect("b");
    let listed = branch_names(&*p, &prefix).await;
    assert_eq!(listed, vec![a.name.clone(), b.name.clone()]);
    let info = p.connect_info(&a).await.expect("info");
    must_query(&info, "INSERT INTO r VALUES (1)").await;
    let a2 = p.reset(&a).await.expect("reset");
    assert_eq!(a2.name, a.name);
    let info = p.connect_info(&a2).await.expect("info");
    assert!(
        must_query(&info, "SELECT x FROM r").await.is_empty(),
        "reset brings the branch back to its base"
    );
    p.delete(&a2.name).await.expect("delete");
    p.delete(&b.name).await.expect("delete");
    assert!(p.list(&prefix).await.expect("list").is_empty());
}

#[tokio::test]
async fn migrations_apply_in_order_once_and_a_changed_checksum_is_refused() {
    let p = provider().await;
    let m1 = migration("0001_stock", "CREATE TABLE stock (sku text PRIMARY KEY)");
    let m2 = migration(
        "0002_qty",
        "ALTER TABLE stock ADD COLUMN qty int NOT NULL DEFAULT 0",
    );
    let base = p
        .prepare_base(&spec(vec![m1.clone(), m2.clone()]))
        .await
        .expect("base");
    let (b, info) = branch_of(&*p, &base).await;
    // Both recorded, in order, with their checksums; the second depends on the first.
    assert_rows(
        &info,
        "SELECT version || ':' || checksum FROM consort_migrations ORDER BY applied_at",
        &[
            &format!("0001_stock:{}", m1.checksum()),
            &format!("0002_qty:{}", m2.checksum()),
        ],
    )
    .await;
    // Apply again on the branch itself (as its owner): nothing new; a changed migration with
    // the same version is a typed error and nothing of it is applied.
    let mut client = consort_lakebase::connect(&info).await.expect("connect");
    let again = migrate::apply(&mut client, &[m1.clone(), m2.clone()])
        .await
        .expect("reapply");
    assert!(again.applied.is_empty());
    assert_eq!(again.already_applied, vec!["0001_stock", "0002_qty"]);
    let changed = migration("0002_qty", "ALTER TABLE stock ADD COLUMN bad int");
    let err = migrate::apply(&mut client, &[m1.clone(), changed])
        .await
        .expect_err("checksum mismatch");
    assert!(
        matches!(&err, Error::ChecksumMismatch { version, .. } if version == "0002_qty"),
        "{err}"
    );
    let broken = migration("0003_broken", "ALTER TABLE nope ADD COLUMN x int");
    let err = migrate::apply(&mut client, &[m1, m2, broken.clone()])
        .await
        .expect_err("sql error");
    assert!(matches!(&err, Error::Migration { version, .. } if version == "0003_broken"));
    assert!(
        !migrate::recorded(&client)
            .await
            .expect("recorded")
            .contains_key("0003_broken"),
        "a failed migration is rolled back with its record"
    );
    assert!(
        migrate::check_plan(&[broken.clone(), broken]).is_err(),
        "duplicate versions are refused"
    );
    drop(client);
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn a_failing_migration_fails_the_base_and_leaves_nothing_behind() {
    let p = provider().await;
    let err = p
        .prepare_base(&spec(vec![
            migration("0001_ok", "CREATE TABLE fine (x int)"),
            migration("0002_bad", "SELECT * FROM missing_table"),
        ]))
        .await
        .expect_err("bad migration");
    assert!(
        matches!(&err, Error::Migration { version, .. } if version == "0002_bad"),
        "{err}"
    );
}

#[tokio::test]
async fn promote_applies_pending_migrations_to_the_parent_and_verifies_them() {
    // A parent of its own on the shared cluster: promote changes the parent, which other
    // tests copy from.
    let parent = unique_database("promote");
    let p = provider_on(&parent).await;
    let m1 = migration("0001_loc", "CREATE TABLE locations (id int PRIMARY KEY)");
    let m2 = migration("0002_seed", "INSERT INTO locations VALUES (1), (2)");
    let first = p
        .promote(std::slice::from_ref(&m1))
        .await
        .expect("promote 1");
    assert_eq!(first.target, parent);
    assert_eq!(first.applied, vec!["0001_loc"]);
    assert!(first.verified && first.failure.is_none());
    let second = p
        .promote(&[m1.clone(), m2.clone()])
        .await
        .expect("promote 2");
    assert_eq!(second.applied, vec!["0002_seed"]);
    assert_eq!(second.already_applied, vec!["0001_loc"]);
    assert!(second.verified);
    // The parent now holds the data: a base copied from it (with no migrations of its own)
    // shows it in a branch.
    let base = p.prepare_base(&BaseSpec::default()).await.expect("base");
    let (b, info) = branch_of(&*p, &base).await;
    assert_rows(&info, "SELECT count(*) FROM locations", &["2"]).await;
    // A changed migration is refused on the parent: verified false, reason given, nothing applied.
    let changed = migration("0002_seed", "INSERT INTO locations VALUES (3)");
    let third = p.promote(&[m1, changed]).await.expect("promote 3");
    assert!(!third.verified);
    assert!(third.applied.is_empty());
    assert!(
        third
            .failure
            .as_deref()
            .is_some_and(|f| f.contains("checksum")),
        "{:?}",
        third.failure
    );
    p.delete(&b.name).await.expect("delete");
}

#[tokio::test]
async fn a_base_is_copied_from_its_own_parent_even_when_another_parent_has_the_same_spec() {
    let (first, second) = (unique_database("parent"), unique_database("parent"));
    let (a, b) = (provider_on(&first).await, provider_on(&second).await);
    a.promote(&[migration("0001_only_a", "CREATE TABLE only_in_a (id int)")])
        .await
        .expect("promote into the first parent");
    // The same spec on both: each base must be a copy of its own parent.
    let base_a = a.prepare_base(&BaseSpec::default()).await.expect("base a");
    let base_b = b.prepare_base(&BaseSpec::default()).await.expect("base b");
    assert_ne!(base_a.id, base_b.id, "two parents share one template");
    let (branch, info) = branch_of(&*b, &base_b).await;
    let only_in_a = "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'";
    assert_eq!(
        must_query(&info, only_in_a).await,
        vec!["0".to_string()],
        "the second parent's base holds the first parent's table"
    );
    b.delete(&branch.name).await.expect("delete");
}

/// A project's schema lives in a schema of its own, created by a psql script (`\set`,
/// `:"var"`, COPY data) that psql applies; the design's migration then adds an index and a
/// schema of its own. Both reach a base, its branches and, promoted, the parent: the owner
/// role may create schemas where Consort owns the database.
#[tokio::test]
async fn migrations_create_schemas_and_a_projects_psql_script_is_applied_by_psql() {
    let parent = unique_database("schemas");
    let p = provider_on(&parent).await;
    let script = migration(
        "0000_broker",
        "\\set schema broker\n\
         CREATE SCHEMA :\"schema\";\n\
         CREATE TABLE :\"schema\".jobs (id int PRIMARY KEY, queue text NOT NULL);\n\
         COPY :\"schema\".jobs (id, queue) FROM stdin;\n\
         1\tdefault\n\
         2\tmail\n\
         \\.\n",
    );
    assert!(script.is_psql_script());
    let index = migration(
        "0001_queue_index",
        "CREATE INDEX jobs_by_queue ON broker.jobs (queue);\n\
         CREATE SCHEMA reporting;\n\
         CREATE VIEW reporting.queues AS SELECT queue, count(*) AS n FROM broker.jobs GROUP BY queue;",
    );
    let plan = vec![script.clone(), index.clone()];
    let base = p.prepare_base(&spec(plan.clone())).await.expect("base");
    let (b, info) = branch_of(&*p, &base).await;
    assert_rows(
        &info,
        "SELECT string_agg(queue, ',' ORDER BY queue) FROM reporting.queues",
        &["default,mail"],
    )
    .await;
    assert_rows(
        &info,
        "SELECT indexname FROM pg_indexes WHERE schemaname = 'broker' AND indexname = 'jobs_by_queue'",
        &["jobs_by_queue"],
    )
    .await;
    // The branch's tests may use and change what the migrations made.
    must_query(&info, "INSERT INTO broker.jobs VALUES (3, 'mail')").await;
    // Where no psql applies it (the Lakebase backend's builder), a script is refused as such.
    let mut client = consort_lakebase::connect(&info).await.expect("connect");
    let unapplied = migration("0009_more", "\\set x 1\nSELECT :x;\n");
    let err = migrate::apply(&mut client, &[unapplied])
        .await
        .expect_err("a psql script through the protocol");
    assert!(err.to_string().contains("it is a psql script"), "{err}");
    drop(client);
    p.delete(&b.name).await.expect("delete");

    let promoted = p.promote(&plan).await.expect("promote");
    assert!(promoted.verified, "{:?}", promoted.failure);
    assert_eq!(promoted.applied, ["0000_broker", "0001_queue_index"]);

    // A failing script fails as a migration, naming it and what psql said; nothing of it stays.
    let broken = migration(
        "0000_broken",
        "\\set schema halfway\nCREATE SCHEMA :\"schema\";\nSELECT * FROM nowhere;\n",
    );
    let err = p
        .prepare_base(&spec(vec![broken]))
        .await
        .expect_err("a failing script fails the base");
    let text = err.to_string();
    assert!(matches!(err, Error::Migration { .. }), "{text}");
    assert!(
        text.contains("0000_broken") && text.contains("\"nowhere\" does not exist"),
        "{text}"
    );
}
