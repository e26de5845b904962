//! Picking the next feature (issue 49, item 8): what a worker asks at every look — where each
//! feature of the backlog stands (`Project::states_of`) — at 10 and 100 features, each with
//! the ledger of a real StockFlow run (half of them done, half stopped half-way through their
//! chain, so still unfinished).
//!
//! - **cold**: the first look of a process, which replays every ledger (what every look cost
//!   before the index);
//! - **indexed**: every later look, which reads each chain's head and replays nothing that did
//!   not move;
//! - the floor, in the same run: a `stat` of every ledger file, the least any look can read.
//!
//! The ledgers are the file ledger's; with the shared store the heads are one statement for
//! all features (`PgStore::heads`).
//!
//! `cargo bench --bench pick`

#[path = "../../benches/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use common::{interleave, report_line, report_ratio};
use consort::actors::RunOutcome;
use consort::project::Project;
use consort_cli::init::STOCKFLOW_FEATURE;
use criterion::{Criterion, criterion_group, criterion_main};

/// Writes the StockFlow example project into `dir`, as `consort init --example stockflow`.
fn write_project(dir: &Path) {
    consort_cli::init::init(dir, Some(consort_cli::init::Example::Stockflow), false)
        .expect("consort init --example stockflow");
}

/// The ledger of one StockFlow run to done, on the embedded PostgreSQL.
fn done_ledger(rt: &tokio::runtime::Runtime) -> Vec<String> {
    let dir = tempfile::tempdir().expect("project dir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    write_project(dir.path());
    let project = Project::open(dir.path()).expect("project");
    let report = common::run_once(rt, &project);
    assert_eq!(report.outcome, RunOutcome::Done, "StockFlow runs to done");
    std::fs::read_to_string(project.ledger_path())
        .expect("the ledger")
        .lines()
        .map(String::from)
        .collect()
}

/// A project of `n` features, each with `ledger` (every second one cut half-way), and the
/// paths of their ledger files.
fn backlog_of(n: usize, ledger: &[String]) -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().expect("project dir");
    write_project(dir.path());
    let config = Project::open(dir.path()).expect("project").config;
    for i in 2..=n {
        let request = dir.path().join(format!("request-{i}.md"));
        std::fs::write(&request, STOCKFLOW_FEATURE).expect("request");
        consort::backlog::add(dir.path(), &config, &request, Some(&format!("F{i}-copy")))
            .expect("added to the backlog");
    }
    let project = Project::open(dir.path()).expect("project");
    let mut paths = Vec::new();
    for (i, feature) in project.backlog().expect("backlog").iter().enumerate() {
        let path = Project::open_feature(dir.path(), Some(&feature.id))
            .expect("the feature")
            .ledger_path();
        let lines = if i % 2 == 0 {
            ledger
        } else {
            &ledger[..ledger.len() / 2]
        };
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, lines.join("\n") + "\n").expect("ledger");
        paths.push(path);
    }
    (dir, paths)
}

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let ledger = done_ledger(&rt);
    let mut g = common::group(c, "pick", 20, 1);
    let mut lines = Vec::new();
    for n in [10, 100] {
        let (dir, paths) = backlog_of(n, &ledger);
        let project = Project::open(dir.path()).expect("project");
        let features = project.backlog().expect("backlog");
        let states = project.states_of(&features).expect("states");
        let unfinished = states.iter().filter(|s| s.is_unfinished()).count();
        assert_eq!(unfinished, n / 2, "half are unfinished");
        let cold = || {
            let fresh = Project::open(dir.path()).expect("project");
            let t = Instant::now();
            fresh.states_of(&features).expect("states");
            t.elapsed()
        };
        let indexed = || {
            let t = Instant::now();
            project.states_of(&features).expect("states");
            t.elapsed()
        };
        let floor = || {
            let t = Instant::now();
            for p in &paths {
                std::fs::metadata(p).expect("stat");
            }
            t.elapsed()
        };
        common::bench_timed(&mut g, format!("cold look, {n} features"), cold);
        common::bench_timed(&mut g, format!("indexed look, {n} features"), indexed);
        if common::profiling() {
            continue;
        }
        let rounds = if n > 10 { 21 } else { 101 };
        let first = interleave(rounds, cold, indexed);
        report_ratio(
            &format!("a worker's first look, {n} features"),
            &first,
            "every later look (indexed)",
            None,
        );
        let later = interleave(101, indexed, floor);
        report_ratio(
            &format!("an indexed look, {n} features"),
            &later,
            "a stat of every ledger",
            None,
        );
        lines.push(format!(
            "{n} features: cold {} | indexed {} | stat floor {}",
            common::fmt(first.figure),
            common::fmt(later.figure),
            common::fmt(later.floor)
        ));
    }
    g.finish();
    report_line(
        "a look",
        &format!(
            "{} ({} ledger entries each)",
            lines.join("; "),
            ledger.len()
        ),
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
