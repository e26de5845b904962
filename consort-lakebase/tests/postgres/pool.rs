//! The warm branch pool on a real cluster (a private one per test, so branch counts are
//! exact).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{base_of, branch_names, migration};
use consort_lakebase::{
    BaseSpec, BranchPool, BranchProvider, EmbeddedConfig, EmbeddedPostgres, EmbeddedProvider,
    PoolConfig, Released,
};

/// A provider on a cluster of its own: `list` reports every Consort branch of a server, whatever
/// its parent database, so exact branch counts need a server no other test uses.
async fn private_provider() -> Arc<dyn BranchProvider> {
    let cluster = EmbeddedPostgres::start(EmbeddedConfig::temporary())
        .await
        .expect("a private cluster starts");
    Arc::new(EmbeddedProvider::new(cluster).await.expect("provider"))
}

async fn count_consort_branches(p: &Arc<dyn BranchProvider>) -> usize {
    p.list("consort-").await.expect("list").len()
}

async fn eventually<F, Fut>(secs: u64, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn warm_branches_serve_acquires_a_new_base_invalidates_and_nothing_is_left() {
    let provider = private_provider().await;
    let pool = BranchPool::new(provider.clone(), consort_testkit::cluster::pool_config(3));
    assert_eq!(pool.start().await.expect("start-up sweep"), 0);
    let v1 = consort_testkit::cluster::base_spec(vec![migration("0001", "CREATE TABLE a (x int)")]);
    pool.warm(&v1).await.expect("warm");
    assert_eq!(pool.ready(), 3);
    assert_eq!(count_consort_branches(&provider).await, 3);

    let got = pool.acquire(&v1).await.expect("acquire");
    assert!(got.from_pool, "served by a warm branch");
    assert_eq!(got.prepare_ms, 0, "the base was already prepared");
    assert_eq!(got.lease.branch().base.key, v1.key());
    let first = got.lease.branch().name.clone();
    assert_eq!(
        got.lease.release(false).await.expect("release"),
        Released::Deleted
    );
    assert!(
        !provider
            .list("consort-")
            .await
            .expect("list")
            .iter()
            .any(|b| b.name == first),
        "a released branch is gone, never reused"
    );

    // Concurrent acquires get distinct branches.
    let mut handles = Vec::new();
    for _ in 0..6 {
        let pool = pool.clone();
        let spec = v1.clone();
        handles.push(tokio::spawn(async move { pool.acquire(&spec).await }));
    }
    let mut leases = Vec::new();
    for h in handles {
        leases.push(h.await.expect("join").expect("acquire").lease);
    }
    let mut names: Vec<String> = leases.iter().map(|l| l.branch().name.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 6);
    for l in leases {
        l.release(false).await.expect("release");
    }

    // New migrations: a new base; the old base's ready branches are dropped.
    let v2 = base_of(vec![
        migration("0001", "CREATE TABLE a (x int)"),
        migration("0002", "ALTER TABLE a ADD COLUMN y int"),
    ]);
    let got = pool.acquire(&v2).await.expect("acquire v2");
    assert_eq!(got.lease.branch().base.key, v2.key());
    assert_eq!(pool.stats().invalidations, 1);
    assert!(
        eventually(30, || {
            let provider = provider.clone();
            let old = v1.key();
            async move {
                provider
                    .list("consort-")
                    .await
                    .expect("list")
                    .iter()
                    .all(|b| b.base.key != old)
            }
        })
        .await,
        "no branch of the old base is left"
    );
    got.lease.release(false).await.expect("release");
    let stats = pool.stats();
    assert!(stats.served_from_pool >= 1);
    assert!(stats.created >= 8);

    pool.shutdown().await.expect("shutdown");
    assert_eq!(
        count_consort_branches(&provider).await,
        0,
        "no branch with the prefix is left"
    );
    let stats = pool.stats();
    assert_eq!(stats.live, 0, "{stats:?}");
    assert!(
        pool.acquire(&v1).await.is_err(),
        "a shut-down pool serves nothing"
    );
}

/// Waits until `pool` holds `n` ready branches, then a while longer to see that it stays so.
async fn settles_at(pool: &BranchPool, n: usize) -> usize {
    let pool2 = pool.clone();
    eventually(30, move || {
        let pool = pool2.clone();
        async move { pool.ready() >= n }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    pool.ready()
}

#[tokio::test]
async fn a_pool_as_leased_keeps_ready_as_many_branches_as_were_leased_at_once() {
    let provider = private_provider().await;
    let as_leased = PoolConfig {
        as_leased: true,
        ..consort_testkit::cluster::pool_config(4)
    };
    let pool = BranchPool::new(provider.clone(), as_leased);
    let v1 = consort_testkit::cluster::base_spec(vec![migration("0001", "CREATE TABLE a (x int)")]);

    // One verification after the other: one branch ready, not the pool's size of four.
    for _ in 0..4 {
        let got = pool.acquire(&v1).await.expect("acquire");
        got.lease.release_in_background(false);
        assert_eq!(
            settles_at(&pool, 1).await,
            1,
            "one at a time keeps one ready"
        );
    }

    // A burst of three at once: from then on three are kept ready.
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(pool.acquire(&v1).await.expect("acquire").lease);
    }
    for l in leases {
        l.release(false).await.expect("release");
    }
    assert_eq!(
        settles_at(&pool, 3).await,
        3,
        "a burst of three keeps three ready"
    );

    // Every branch made was leased or is ready: none was made for nothing.
    let stats = pool.stats();
    assert_eq!(
        stats.created,
        4 + 3 + pool.ready() as u64,
        "branches made beyond the demand: {stats:?}"
    );
    pool.shutdown().await.expect("shutdown");
    assert_eq!(count_consort_branches(&provider).await, 0);
}

#[tokio::test]
async fn failed_runs_can_be_kept_and_dropped_leases_are_cleaned_up() {
    let provider = private_provider().await;
    let pool = BranchPool::new(
        provider.clone(),
        PoolConfig {
            size: 1,
            keep_failed: true,
            keep_failed_for: Duration::from_secs(600),
            ..PoolConfig::default()
        },
    );
    let spec = BaseSpec::default();
    let kept = pool.acquire(&spec).await.expect("acquire");
    let kept_name = kept.lease.branch().name.clone();
    assert!(matches!(
        kept.lease.release(true).await.expect("release"),
        Released::Kept(_)
    ));
    let passed = pool.acquire(&spec).await.expect("acquire");
    let passed_name = passed.lease.branch().name.clone();
    assert_eq!(
        passed.lease.release(false).await.expect("release"),
        Released::Deleted,
        "only failed runs are kept"
    );
    let dropped = pool.acquire(&spec).await.expect("acquire");
    let dropped_name = dropped.lease.branch().name.clone();
    drop(dropped); // no release: the lease deletes its branch in the background
    assert!(
        eventually(30, || {
            let provider = provider.clone();
            let n = dropped_name.clone();
            async move {
                !provider
                    .list("consort-")
                    .await
                    .expect("list")
                    .iter()
                    .any(|b| b.name == n)
            }
        })
        .await
    );
    pool.shutdown().await.expect("shutdown");
    let left = branch_names(&*provider, "consort-").await;
    assert_eq!(
        left,
        vec![kept_name.clone()],
        "the kept branch survives the sweep"
    );
    assert!(!left.contains(&passed_name));
    provider.delete(&kept_name).await.expect("delete kept");
    assert_eq!(count_consort_branches(&provider).await, 0);
}

/// A release handed to the background does not hold up its caller, and shutdown waits for it:
/// nothing is left behind even when shutdown comes right after.
#[tokio::test]
async fn background_releases_finish_before_shutdown_returns() {
    let provider = private_provider().await;
    let pool = BranchPool::new(provider.clone(), consort_testkit::cluster::pool_config(0));
    let spec =
        consort_testkit::cluster::base_spec(vec![migration("0001", "CREATE TABLE a (x int)")]);
    let mut names = Vec::new();
    for _ in 0..3 {
        let got = pool.acquire(&spec).await.expect("acquire");
        names.push(got.lease.branch().name.clone());
        got.lease.release_in_background(false);
    }
    pool.shutdown().await.expect("shutdown");
    let left = provider.list("consort-").await.expect("list");
    assert!(
        names.iter().all(|n| !left.iter().any(|b| &b.name == n)),
        "every released branch is gone once shutdown returns: {left:?}"
    );
    let stats = pool.stats();
    assert_eq!(
        (stats.created, stats.dropped, stats.live),
        (3, 3, 0),
        "{stats:?}"
    );
}
