//! Shared helpers of the integration tests. The embedded cluster (one per test binary) comes
//! from `consort_testkit::cluster`; it is stopped when the test binary exits by the cluster's
//! owner watchdog, which sees this process's lifeline pipe close. `tests/cluster.rs` proves that
//! a killed owner leaves no server.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use consort_actors::Migration;
use consort_lakebase::{
    BaseSpec, Branch, BranchProvider, EmbeddedProvider, RunContext, SandboxMode,
};

#[allow(unused_imports)] // each test binary uses some of them
pub(crate) use consort_testkit::cluster::{cluster, dyn_provider, provider};
#[allow(unused_imports)]
pub(crate) use consort_testkit::disk::{tree_of, write_tree};

/// A migration.
pub(crate) fn migration(version: &str, sql: &str) -> Migration {
    Migration {
        version: version.into(),
        story_id: "S1".into(),
        description: String::new(),
        sql: sql.into(),
    }
}

/// The base of no migrations on `p`.
pub(crate) async fn empty_base<P: BranchProvider + ?Sized>(p: &P) -> consort_lakebase::BaseRef {
    p.prepare_base(&BaseSpec::default()).await.expect("base")
}

/// A base of `migrations`, without fixtures or promoted features.
pub(crate) fn base_of(migrations: Vec<Migration>) -> BaseSpec {
    BaseSpec {
        migrations,
        ..BaseSpec::default()
    }
}

/// The names of the branches `p` lists under `prefix`, in its order.
pub(crate) async fn branch_names(p: &dyn BranchProvider, prefix: &str) -> Vec<String> {
    p.list(prefix)
        .await
        .expect("list")
        .into_iter()
        .map(|b| b.name)
        .collect()
}

/// The first column of the one row `sql` returns (a failure names the query).
pub(crate) async fn query_value<T>(
    client: &tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> T
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    client
        .query_one(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// Asserts that `sql`, a `SELECT count(*) …` without parameters, counts `expected`.
pub(crate) async fn assert_count(
    client: &tokio_postgres::Client,
    sql: &str,
    expected: i64,
    why: &str,
) {
    let n: i64 = query_value(client, sql, &[]).await;
    assert_eq!(n, expected, "{why} ({sql})");
}

/// Runs a query as the branch's own user and returns the first column of every row.
pub(crate) async fn query_strings(
    info: &consort_lakebase::ConnectInfo,
    sql: &str,
) -> Result<Vec<String>, consort_lakebase::Error> {
    let c = consort_lakebase::connect(info).await?;
    let rows = c
        .simple_query(sql)
        .await
        .map_err(|e| consort_lakebase::Error::from_pg("query", e))?;
    Ok(rows
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect())
}

/// [`query_strings`] that must succeed: the first column of every row (a failure names the
/// query).
pub(crate) async fn must_query(info: &consort_lakebase::ConnectInfo, sql: &str) -> Vec<String> {
    query_strings(info, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Asserts that `sql` on `info` returns `expected`, the first column of each row as text.
pub(crate) async fn assert_rows(
    info: &consort_lakebase::ConnectInfo,
    sql: &str,
    expected: &[&str],
) {
    assert_eq!(must_query(info, sql).await, expected, "{sql}");
}

/// A fresh branch of `spec` on the shared cluster and a confined run context for `tree` on it
/// (Consort's state and the cluster hidden, `caches` writable).
pub(crate) async fn confined_branch(
    tree: &Path,
    spec: &BaseSpec,
    caches: Vec<std::path::PathBuf>,
) -> (Arc<EmbeddedProvider>, Branch, RunContext) {
    confined_branch_hiding(tree, spec, caches, Vec::new()).await
}

/// [`confined_branch`] with `also_hidden` hidden too (a project's lanes).
pub(crate) async fn confined_branch_hiding(
    tree: &Path,
    spec: &BaseSpec,
    caches: Vec<std::path::PathBuf>,
    also_hidden: Vec<std::path::PathBuf>,
) -> (Arc<EmbeddedProvider>, Branch, RunContext) {
    branch_context(tree, spec, caches, also_hidden, SandboxMode::Landlock).await
}

/// A fresh branch of `spec` and a run context for `tree` on it, confined as `mode` says,
/// `also_hidden` hidden beside Consort's private state.
pub(crate) async fn branch_context(
    tree: &Path,
    spec: &BaseSpec,
    caches: Vec<std::path::PathBuf>,
    also_hidden: Vec<std::path::PathBuf>,
    mode: SandboxMode,
) -> (Arc<EmbeddedProvider>, Branch, RunContext) {
    let p = provider().await;
    let (branch, conn) = consort_testkit::cluster::fresh_branch(&*p, spec).await;
    let mut hidden = vec![tree.join(".consort")];
    hidden.extend(p.private_paths());
    hidden.extend(also_hidden);
    let ctx =
        RunContext::prepare(tree.to_path_buf(), conn, mode, hidden, caches).expect("a run context");
    (p, branch, ctx)
}
