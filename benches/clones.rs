//! Cold branch creation with PostgreSQL 18's file clones against copies, for bases of about
//! 100 MB, 1 GB and 5 GB, in one run on one XFS file system with reflinks (an image on a loop
//! device, made here; so this bench needs root and mkfs.xfs from xfsprogs).
//!
//! One embedded cluster of Consort's own PostgreSQL 18 (`PostgresSource::Fetched`) lives on the
//! XFS mount; each base is built once; then, for each size, branches are created through the
//! provider (`EmbeddedProvider::create` + `delete`: the login role, `CREATE DATABASE … TEMPLATE
//! … STRATEGY FILE_COPY`, the first login) with `file_copy_method = clone` and then with
//! `copy` (`ALTER SYSTEM` and a reload between the two), the median of three each.
//!
//! `cargo bench --bench clones`

#[path = "common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
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

/// An XFS image with reflinks, mounted until dropped.
struct Xfs {
    at: PathBuf,
    image: PathBuf,
}

impl Xfs {
    fn make(dir: &Path) -> Xfs {
        let (image, at) = (dir.join("clones.img"), dir.join("xfs"));
        std::fs::create_dir_all(&at).expect("mount point");
        for (program, args) in [
            ("truncate", vec!["-s", "24G", image.to_str().expect("path")]),
            (
                "mkfs.xfs",
                vec!["-q", "-m", "reflink=1", image.to_str().expect("path")],
            ),
            (
                "mount",
                vec![
                    "-o",
                    "loop",
                    image.to_str().expect("path"),
                    at.to_str().expect("path"),
                ],
            ),
        ] {
            consort_testkit::process::succeeded(Command::new(program).args(&args), program);
        }
        std::fs::set_permissions(&at, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        Xfs { at, image }
    }
}

impl Drop for Xfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

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
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let xfs = Xfs::make(tmp.path());
    rt.block_on(async {
        let cluster = EmbeddedPostgres::start(EmbeddedConfig {
            postgres: PostgresSource::Fetched,
            ..EmbeddedConfig::at(xfs.at.join("cluster"))
        })
        .await
        .expect("a cluster of PostgreSQL 18 on XFS");
        let provider = EmbeddedProvider::new(cluster.clone()).await.expect("provider");
        assert_eq!(provider.branch_copy(), Some("clone"), "XFS with reflinks clones");
        let admin = connect(&admin_info(&cluster, "postgres")).await.expect("admin");
        let namer = BranchNamer::new();
        for (name, rows) in BASES {
            let t = Instant::now();
            let base = provider.prepare_base(&spec(rows)).await.expect("base");
            let built = t.elapsed();
            let mut by = Vec::new();
            for method in ["clone", "copy"] {
                admin
                    .batch_execute(&format!(
                        "ALTER SYSTEM SET file_copy_method = {method}; SELECT pg_reload_conf()"
                    ))
                    .await
                    .expect("file_copy_method");
                // The reload reaches the next administrator sessions' backends.
                tokio::time::sleep(Duration::from_millis(200)).await;
                by.push(create_time(&provider, &base, &namer).await);
            }
            report_line(
                &format!("clones, a base of {name}"),
                &format!(
                    "cold branch create + drop: clone {}, copy {} ({:.3}× of copy); the base took {} to build",
                    common::fmt(by[0]),
                    common::fmt(by[1]),
                    by[0].as_secs_f64() / by[1].as_secs_f64().max(1e-9),
                    common::fmt(built)
                ),
            );
        }
        cluster.stop().expect("stop");
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
