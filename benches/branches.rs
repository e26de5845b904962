//! Branches on the embedded cluster, for bases of about 10 MB and 100 MB (migrations plus a
//! `generate_series` fixture):
//!
//! * cold branch create + drop through the provider (`EmbeddedProvider::create` + `delete`:
//!   login role, `CREATE DATABASE … TEMPLATE … STRATEGY FILE_COPY`, `CONNECT` restricted, the
//!   first login checked; then `DROP DATABASE … WITH (FORCE)` and the role), beside the bare
//!   `CREATE DATABASE … TEMPLATE … STRATEGY FILE_COPY` + `DROP DATABASE` issued directly by the
//!   superuser on the same cluster, in the same run. Goal: ≤ 1.2×.
//! * acquiring a branch from the warm pool (`BranchPool::acquire` with a ready branch). Goal:
//!   ≤ 5 ms at the median. Also shown: acquire plus the first login as the branch's role (what a
//!   test run needs before its first query), beside a first login to a database that exists.
//!
//! The superuser's password is read from the cluster's `admin.pw` (this process started the
//! cluster, so it may read it); the provider never hands it out.
//!
//! `cargo bench --bench branches`

#[path = "common/mod.rs"]
mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{interleave, median_of, report_line, report_ratio};
use consort::actors::Migration;
use consort::lakebase::names::BranchNamer;
use consort::lakebase::{
    BaseRef, BaseSpec, BranchPool, BranchProvider, EmbeddedCluster, EmbeddedProvider, connect,
};
use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;

type Fut<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// Runs SQL as the superuser; returns the first column of the first row as text, if any.
type Sql = Arc<dyn Fn(String) -> Fut<Option<String>> + Send + Sync>;

use consort_testkit::cluster::admin_info;

async fn admin_sql(cluster: &EmbeddedCluster) -> Sql {
    let client = Arc::new(
        connect(&admin_info(cluster, "postgres"))
            .await
            .expect("superuser connection"),
    );
    Arc::new(move |sql: String| {
        let c = client.clone();
        Box::pin(async move {
            if sql.trim_start().to_uppercase().starts_with("SELECT") {
                let row = c.query_one(sql.as_str(), &[]).await.expect("query");
                Some(row.get::<_, String>(0))
            } else {
                c.batch_execute(&sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                None
            }
        })
    })
}

/// A base of roughly `mb` megabytes: one table filled by `generate_series` (the catalogs of an
/// empty database are about 7.5 MB already).
fn base_spec(mb: u64) -> BaseSpec {
    let rows = (mb.saturating_sub(7) * 1_000_000) / 76;
    BaseSpec {
        migrations: vec![Migration {
            version: "0001".into(),
            story_id: "S1".into(),
            description: "stock records".into(),
            sql: "CREATE TABLE stock (id bigint, sku text, qty int)".into(),
        }],
        fixtures: vec![format!(
            "INSERT INTO stock SELECT g, md5(g::text), g % 97 FROM generate_series(1, {rows}) g"
        )],
        promoted: Vec::new(),
    }
}

struct Fixture {
    rt: Runtime,
    cluster: Arc<EmbeddedCluster>,
    provider: Arc<EmbeddedProvider>,
    sql: Sql,
    namer: BranchNamer,
}

impl Fixture {
    fn provider_cycle(&self, base: &BaseRef) -> Duration {
        self.rt.block_on(async {
            let name = self.namer.next_name();
            let t = Instant::now();
            let b = self.provider.create(&name, base).await.expect("create");
            self.provider.delete(&b.name).await.expect("delete");
            t.elapsed()
        })
    }

    fn bare_cycle(&self, base: &BaseRef) -> Duration {
        self.rt.block_on(async {
            let db = format!("bare_{}", self.namer.next_name().replace('-', "_"));
            let t = Instant::now();
            (self.sql)(format!(
                "CREATE DATABASE {db} TEMPLATE {} STRATEGY FILE_COPY",
                base.id
            ))
            .await;
            (self.sql)(format!("DROP DATABASE {db}")).await;
            t.elapsed()
        })
    }

    fn size_of(&self, db: &str) -> String {
        self.rt
            .block_on((self.sql)(format!(
                "SELECT pg_size_pretty(pg_database_size('{db}'))"
            )))
            .unwrap_or_default()
    }
}

/// Waits (untimed) until the pool holds `n` ready branches.
async fn until_ready(pool: &BranchPool, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while pool.ready() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let (cluster, provider, sql) = rt.block_on(async {
        let cluster = consort_testkit::cluster::cluster().await;
        let provider = consort_testkit::cluster::provider().await;
        let sql = admin_sql(&cluster).await;
        (cluster, provider, sql)
    });
    let fx = Fixture {
        rt,
        cluster,
        provider,
        sql,
        namer: BranchNamer::new(),
    };
    let version = fx
        .rt
        .block_on((fx.sql)("SELECT version()".into()))
        .unwrap_or_default();
    println!("server: {version}");

    let mut bases = Vec::new();
    for mb in [10u64, 100] {
        let t = Instant::now();
        let base = fx
            .rt
            .block_on(fx.provider.prepare_base(&base_spec(mb)))
            .expect("base");
        println!(
            "base ~{mb} MB: {} is {} (built in {:.1} s)",
            base.id,
            fx.size_of(&base.id),
            t.elapsed().as_secs_f64()
        );
        bases.push((mb, base));
    }

    let mut g = common::group(c, "branches", 200, 2);
    for (mb, base) in &bases {
        common::bench_timed(
            &mut g,
            format!("provider create + drop, {mb} MB base"),
            || fx.provider_cycle(base),
        );
        common::bench_timed(
            &mut g,
            format!("floor: bare CREATE DATABASE … FILE_COPY + DROP, {mb} MB base"),
            || fx.bare_cycle(base),
        );
    }

    // The warm pool, over the 10 MB base.
    let spec = base_spec(10);
    let provider: Arc<dyn BranchProvider> = fx.provider.clone();
    let pool = BranchPool::new(provider.clone(), consort_testkit::cluster::pool_config(2));
    fx.rt.block_on(pool.warm(&spec)).expect("warm");
    let acquire = || {
        fx.rt.block_on(async {
            until_ready(&pool, 2).await;
            let t = Instant::now();
            let a = pool.acquire(&spec).await.expect("acquire");
            let d = t.elapsed();
            assert!(a.from_pool, "served by a ready branch");
            a.lease.release(false).await.expect("release");
            d
        })
    };
    let acquire_login = || {
        fx.rt.block_on(async {
            until_ready(&pool, 2).await;
            let t = Instant::now();
            let a = pool.acquire(&spec).await.expect("acquire");
            let info = provider.connect_info(a.lease.branch()).await.expect("info");
            let client = connect(&info).await.expect("login");
            client.batch_execute("SELECT 1").await.expect("select");
            let d = t.elapsed();
            drop(client);
            a.lease.release(false).await.expect("release");
            d
        })
    };
    // A database that is already there, reached the same way (its own role, over TCP).
    let standing = fx
        .rt
        .block_on(pool.acquire(&spec))
        .expect("a standing branch");
    let standing_info = fx
        .rt
        .block_on(provider.connect_info(standing.lease.branch()))
        .expect("info");
    let login_existing = || {
        fx.rt.block_on(async {
            let t = Instant::now();
            let client = connect(&standing_info).await.expect("login");
            client.batch_execute("SELECT 1").await.expect("select");
            t.elapsed()
        })
    };
    common::bench_timed(&mut g, "warm pool acquire", acquire);
    common::bench_timed(
        &mut g,
        "warm pool acquire + first login as the branch role",
        acquire_login,
    );
    common::bench_timed(
        &mut g,
        "floor: first login to an existing database",
        login_existing,
    );
    g.finish();

    if common::profiling() {
        return;
    }
    // ---- side by side, interleaved
    for (mb, base) in &bases {
        let rounds = if *mb >= 100 { 21 } else { 41 };
        let pair = interleave(rounds, || fx.provider_cycle(base), || fx.bare_cycle(base));
        report_ratio(
            &format!("branch create + drop, {mb} MB base, provider"),
            &pair,
            "bare CREATE DATABASE … STRATEGY FILE_COPY + DROP DATABASE",
            Some(1.2),
        );
    }
    let warm = median_of(31, acquire);
    report_line(
        "warm pool acquire",
        &format!(
            "median {} | goal ≤ 5 ms: {}",
            common::fmt(warm),
            if warm <= Duration::from_millis(5) {
                "met"
            } else {
                "MISSED"
            }
        ),
    );
    let login = interleave(15, acquire_login, login_existing);
    report_ratio(
        "warm pool acquire + first login",
        &login,
        "first login to an existing database",
        None,
    );

    // ---- no leaks
    fx.rt
        .block_on(standing.lease.release(false))
        .expect("release");
    fx.rt.block_on(pool.shutdown()).expect("pool shutdown");
    let left = fx.rt.block_on((fx.sql)(
        "SELECT count(*)::text FROM pg_database WHERE datname LIKE 'consort\\_%' OR datname LIKE 'bare\\_%'"
            .into(),
    ));
    let stats = pool.stats();
    report_line(
        "branches left after the bench",
        &format!(
            "{} databases; pool created {} dropped {} live {}",
            left.unwrap_or_default(),
            stats.created,
            stats.dropped,
            stats.live
        ),
    );
    drop(pool);
    drop(provider);
    drop(fx.provider);
    fx.cluster.stop().expect("stop the cluster");
}

criterion_group!(benches, bench);
criterion_main!(benches);
