//! Cold branch creation with PostgreSQL 18's file clones against copies, for bases of about
//! 100 MB, 1 GB and 5 GB, in one run on one XFS file system with reflinks (an image on a loop
//! device, made here; so this bench needs root and mkfs.xfs from xfsprogs).
//!
//! Two embedded clusters of Consort's own PostgreSQL 18 (`PostgresSource::Fetched`) on the XFS
//! mount, one after the other: one with `file_copy_method = clone` (what Consort sets there),
//! one with `copy`. Each builds the three bases, then creates branches of each through the
//! provider (`EmbeddedProvider::create`: the login role, `CREATE DATABASE … TEMPLATE …
//! STRATEGY FILE_COPY`, the first login; then deleted, untimed), the median of three.
//!
//! `cargo bench --bench clones`

#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::report_line;
use consort::actors::Migration;
use consort::lakebase::names::BranchNamer;
use consort::lakebase::{
    BaseRef, BaseSpec, BranchProvider, EmbeddedConfig, EmbeddedPostgres, EmbeddedProvider,
    PostgresSource, connect,
};
use consort_testkit::cluster::admin_info;
use criterion::{Criterion, criterion_group, criterion_main};

/// The bases: a name and rows of about 1 kB each.
const BASES: [(&str, u64); 3] = [
    ("100 MB", 100_000),
    ("1 GB", 1_000_000),
    ("5 GB", 5_000_000),
];

/// A base of `rows` rows of about 1 kB.
fn spec(rows: u64) -> BaseSpec {
    BaseSpec {
        migrations: vec![Migration {
            version: format!("0001_rows_{rows}"),
            story_id: "S1".into(),
            description: String::new(),
            sql: format!(
                "CREATE TABLE filler AS SELECT g AS id, repeat(md5(g::text), 30) AS body FROM generate_series(1, {rows}) g"
            ),
        }],
        fixtures: Vec::new(),
        promoted: Vec::new(),
    }
}

/// The median of three cold creates (and deletes) of a branch of `base`.
async fn create_time(provider: &EmbeddedProvider, base: &BaseRef, namer: &BranchNamer) -> Duration {
    let mut times = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let branch = provider
            .create(&namer.next_name(), base)
            .await
            .expect("create");
        times.push(t.elapsed());
        provider.delete(&branch.name).await.expect("delete");
    }
    common::median(&mut times)
}

fn bench(c: &mut Criterion) {
    let mut g = common::group(c, "clones", 1, 1);
    common::bench_timed(&mut g, "nothing (this bench reports below)", || {
        Duration::from_nanos(1)
    });
    g.finish();
    if common::profiling() {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        report_line(
            "clones",
            "needs root (an XFS image on a loop device): not run",
        );
        return;
    }
    let rt = common::runtime();
    let tmp = consort_testkit::cluster::tmp_dir("consort-clones-", 0o755);
    let xfs = consort_testkit::xfs::XfsMount::make(tmp.path(), "24G");
    let mut timed: Vec<Vec<(String, Duration)>> = Vec::new();
    for method in ["clone", "copy"] {
        let dir = xfs.at.join(format!("cluster-{method}"));
        timed.push(rt.block_on(bases_and_branches(&dir, method)));
        // Room for the next cluster's bases.
        let _ = std::fs::remove_dir_all(&dir);
    }
    for (i, (name, _)) in BASES.iter().enumerate() {
        let ((size, clone), (_, copy)) = (&timed[0][i], &timed[1][i]);
        report_line(
            &format!("clones, a base of {name}"),
            &format!(
                "{size} on disk; cold branch create: clone {}, copy {} ({:.3}× of copy)",
                common::fmt(*clone),
                common::fmt(*copy),
                common::ratio(*clone, *copy),
            ),
        );
    }
}

/// On a cluster of PostgreSQL 18 in `dir` whose `file_copy_method` is `method`, each base of
/// [`BASES`] built, then timed: its size on disk and the median cold branch create.
async fn bases_and_branches(dir: &Path, method: &str) -> Vec<(String, Duration)> {
    let cluster = EmbeddedPostgres::start(EmbeddedConfig {
        postgres: PostgresSource::Fetched,
        // Given after Consort's own, so `copy` wins over the clone XFS allows.
        settings: vec![("file_copy_method".into(), method.into())],
        ..EmbeddedConfig::at(dir)
    })
    .await
    .expect("a cluster of PostgreSQL 18 on XFS");
    let provider = EmbeddedProvider::new(cluster.clone())
        .await
        .expect("provider");
    assert_eq!(provider.branch_copy(), Some(method));
    let admin = connect(&admin_info(&cluster, "postgres"))
        .await
        .expect("admin");
    let namer = BranchNamer::new();
    let mut out = Vec::new();
    for (_, rows) in BASES {
        let base = provider.prepare_base(&spec(rows)).await.expect("base");
        let size: String = admin
            .query_one(
                "SELECT pg_size_pretty(pg_database_size($1::text::name))",
                &[&base.id],
            )
            .await
            .expect("the base's size")
            .get(0);
        out.push((size, create_time(&provider, &base, &namer).await));
    }
    drop(admin);
    cluster.stop().expect("stop");
    out
}

criterion_group!(benches, bench);
criterion_main!(benches);
