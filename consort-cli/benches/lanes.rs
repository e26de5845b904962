//! Lanes: two features of the same size, the scripted StockFlow feature and its twin (every
//! table, function, file, test and migration of StockFlow renamed, so that the two share no
//! object and no file), in one git project on the embedded PostgreSQL, driven three ways:
//!
//! - one after the other, as `consort run` walks the backlog (one ensemble per feature, on the
//!   project's tree, no merge check);
//! - in lanes one at a time (`run_lanes` with `parallel: 1`, as `consort run --parallel 1`):
//!   worktrees, the merge check, the shared provider;
//! - in lanes two at once (`parallel: 2`).
//!
//! The figure is the two-at-once wall time; beside it, in the same run, the one-after-the-other
//! wall time of the same two features (the sequential figure it is meant to beat), and the
//! branch work per lane from the receipts (Σ `acquire_ms + migrate_ms`).
//!
//! `cargo bench --bench lanes`

#[path = "../../benches/common/mod.rs"]
mod common;
mod twins;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{median, report_line};
use consort::actors::{ApproveAs, Approver, RunOutcome, RunReport};
use consort::lanes::{LaneOptions, run_lanes};
use consort::project::{Project, RunOptions};
use consort_cli::init::{STOCKFLOW_FEATURE, STOCKFLOW_FEATURE_ID, STOCKFLOW_SCRIPT};
use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime;

/// The twin's feature id.
const TWIN_ID: &str = twins::DEPOT.id;

fn twin(text: &str) -> String {
    twins::twin(text, &twins::DEPOT)
}

/// A git project whose backlog is StockFlow, then its twin; each feature played by its script.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("project dir");
    // Reachable by the server's user, so the cluster lives in the project (and goes with it).
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let files = [
        (
            "consort.toml".to_string(),
            consort_cli::init::config_template(
                STOCKFLOW_FEATURE_ID,
                ".consort/agents/{feature}.toml",
            ),
        ),
        ("feature.md".into(), STOCKFLOW_FEATURE.into()),
        ("twin.md".into(), twin(STOCKFLOW_FEATURE)),
        (
            format!(".consort/agents/{STOCKFLOW_FEATURE_ID}.toml"),
            STOCKFLOW_SCRIPT.into(),
        ),
        (
            format!(".consort/agents/{TWIN_ID}.toml"),
            twin(STOCKFLOW_SCRIPT),
        ),
    ];
    for (rel, text) in files {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    consort::git::keep_state_out_of_git(dir.path()).expect(".consort/.gitignore");
    consort::git::GitRepo::init_with_commit(dir.path(), "Bench", "before Consort").expect("git");
    let project = Project::open(dir.path()).expect("project");
    consort::backlog::add(
        dir.path(),
        &project.config,
        &dir.path().join("twin.md"),
        Some(TWIN_ID),
    )
    .expect("the twin joins the backlog");
    dir
}

fn approver() -> Arc<dyn Approver> {
    Arc::new(ApproveAs {
        name: "bench".into(),
    })
}

/// What one way of driving the two features measured.
#[derive(Debug, Clone, Default)]
struct Drive {
    wall: Duration,
    /// Per feature: Σ (acquire_ms + migrate_ms) of its receipts, and its receipts.
    branch_work: BTreeMap<String, (Duration, usize)>,
    /// Per feature: where its run's wall time went, by phase.
    phases: BTreeMap<String, String>,
}

impl Drive {
    fn add(&mut self, feature: &str, report: &RunReport) {
        assert_eq!(report.outcome, RunOutcome::Done, "{feature} runs to done");
        let r = &report.state.receipts;
        let ms: u64 = r
            .iter()
            .map(|x| x.timings.acquire_ms + x.timings.migrate_ms)
            .sum();
        self.branch_work
            .insert(feature.to_owned(), (Duration::from_millis(ms), r.len()));
        self.phases.insert(
            feature.to_owned(),
            consort_cli::ui::time_line(&report.phase_times),
        );
    }
}

/// StockFlow, then its twin, each in its own ensemble on the project's tree.
fn one_after_the_other(rt: &Runtime) -> Drive {
    let dir = project();
    let mut drive = Drive::default();
    let t = Instant::now();
    rt.block_on(async {
        for id in [STOCKFLOW_FEATURE_ID, TWIN_ID] {
            let project = Project::open_feature(dir.path(), Some(id)).expect("project");
            let ensemble = project
                .ensemble(RunOptions {
                    approver: Some(approver()),
                    ..RunOptions::default()
                })
                .await
                .expect("ensemble");
            let report = ensemble.run().await.expect("run");
            ensemble.shutdown().await;
            drive.add(id, &report);
        }
    });
    drive.wall = t.elapsed();
    drive
}

/// Both features in lanes, `parallel` at once.
fn in_lanes(rt: &Runtime, parallel: usize) -> Drive {
    let dir = project();
    let mut drive = Drive::default();
    let opts = LaneOptions {
        parallel,
        run: RunOptions {
            approver: Some(approver()),
            ..RunOptions::default()
        },
        ..LaneOptions::default()
    };
    let t = Instant::now();
    let reports = rt
        .block_on(run_lanes(dir.path(), opts))
        .expect("the lanes run");
    drive.wall = t.elapsed();
    assert_eq!(reports.len(), 2, "two lanes ran");
    for lane in reports {
        let report = lane.outcome.expect("the lane ran");
        drive.add(&lane.feature, &report);
    }
    drive
}

/// The same two features from the command line, as a user runs them: `consort run --parallel
/// 2` once, or `consort run` twice (each run takes the backlog's next feature); wall time of
/// the processes, each starting and stopping its own server.
fn from_the_command_line(parallel: bool) -> Duration {
    let dir = project();
    let consort = || {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_consort"));
        cmd.args(["run", "--approve-as", "bench", "--dir"])
            .arg(dir.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        cmd
    };
    let runs = if parallel { 1 } else { 2 };
    let t = Instant::now();
    for _ in 0..runs {
        let mut cmd = consort();
        if parallel {
            cmd.args(["--parallel", "2"]);
        }
        let status = cmd.status().expect("consort runs");
        assert!(status.success(), "consort run ends done");
    }
    t.elapsed()
}

fn summary(name: &str, drives: &[Drive]) -> Duration {
    let mut walls: Vec<Duration> = drives.iter().map(|d| d.wall).collect();
    let wall = median(&mut walls);
    let per_lane: Vec<String> = drives
        .first()
        .map(|d| {
            d.branch_work
                .iter()
                .map(|(feature, (work, receipts))| {
                    format!("{feature} {} over {receipts} receipts", common::fmt(*work))
                })
                .collect()
        })
        .unwrap_or_default();
    let phases: Vec<String> = drives
        .first()
        .map(|d| {
            d.phases
                .iter()
                .map(|(feature, line)| format!("{feature}: {line}"))
                .collect()
        })
        .unwrap_or_default();
    report_line(
        name,
        &format!(
            "{} runs, median wall {} | branch work per lane (first run): {} | phases (first run): {}",
            drives.len(),
            common::fmt(wall),
            per_lane.join(", "),
            phases.join("; ")
        ),
    );
    wall
}

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let two: RefCell<Vec<Drive>> = RefCell::new(Vec::new());
    let mut g = common::group(c, "lanes", 1, 1);
    common::bench_timed(&mut g, "StockFlow and its twin, --parallel 2", || {
        let d = in_lanes(&rt, 2);
        let wall = d.wall;
        two.borrow_mut().push(d);
        wall
    });
    g.finish();
    if common::profiling() {
        return;
    }

    // The sequential figures, three rounds each, interleaved with three more of two at once.
    let mut sequential = Vec::new();
    let mut one = Vec::new();
    for _ in 0..3 {
        sequential.push(one_after_the_other(&rt));
        one.push(in_lanes(&rt, 1));
        two.borrow_mut().push(in_lanes(&rt, 2));
    }
    let seq = summary("one after the other (consort run)", &sequential);
    let lanes_one = summary("lanes, one at a time (--parallel 1)", &one);
    let lanes_two = summary("lanes, two at once (--parallel 2)", &two.into_inner());
    report_line(
        "two at once beside one after the other",
        &format!(
            "{} the sequential wall time ({:.2}× that of one lane at a time)",
            common::versus(lanes_two, seq),
            common::ratio(lanes_two, lanes_one),
        ),
    );
    // From the command line, interleaved: three rounds each way.
    let (mut cli_two, mut cli_seq) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        cli_seq.push(from_the_command_line(false));
        cli_two.push(from_the_command_line(true));
    }
    let (two, seq) = (median(&mut cli_two), median(&mut cli_seq));
    report_line(
        "from the command line, two at once beside one after the other",
        &format!(
            "`consort run --parallel 2` beside `consort run` twice: {}",
            common::versus(two, seq)
        ),
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
