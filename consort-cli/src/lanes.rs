//! `consort run --parallel N`: the backlog's features in lanes, their progress on one stream
//! with each line's feature in front, and at the end a line per lane with what to do next.

use std::path::Path;

use consort::lanes::{LaneOptions, LaneReport, run_lanes};
use consort::project::{ProjectError, approve_command};
use consort_actors::{Progress, RunOutcome};
use tokio::sync::mpsc;

use crate::ui;

/// Drives the lanes, printing as they go; returns the exit code (the worst lane's).
pub async fn run_parallel(dir: &Path, opts: LaneOptions) -> Result<i32, ProjectError> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, Progress)>();
    let printer = tokio::spawn(async move {
        while let Some((feature, p)) = rx.recv().await {
            eprintln!("[{feature}] {}", ui::describe(&p));
        }
    });
    let parallel = opts.parallel.max(1);
    println!("driving up to {parallel} features at once, each in its own lane");
    let opts = LaneOptions {
        progress: Some(tx),
        ..opts
    };
    let reports = tokio::select! {
        r = run_lanes(dir, opts) => r,
        signal = ui::interruption() => Err(ui::interrupted(signal?)),
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), printer).await;
    let reports = reports?;
    if reports.is_empty() {
        println!(
            "no feature to drive: every feature of the backlog is done or stopped, or driven by another process (`consort status --dir {}`)",
            dir.display()
        );
        return Ok(ui::EXIT_DONE);
    }
    println!("\n── lanes ──");
    let mut code = ui::EXIT_DONE;
    for report in &reports {
        let (line, lane_code) = lane_line(dir, report);
        println!("{line}");
        code = code.max(lane_code);
    }
    Ok(code)
}

/// What one lane's end means, for people, with its exit code.
fn lane_line(dir: &Path, report: &LaneReport) -> (String, i32) {
    let id = &report.feature;
    match &report.outcome {
        Err(e) => (
            format!("{id}: could not run: {}", consort_actors::error_chain(e)),
            1,
        ),
        Ok(run) => {
            let code = ui::exit_code(&run.outcome);
            let next = match &run.outcome {
                RunOutcome::AtGate { gate, hash } => format!(
                    "\n  approve it: {} --feature {id}",
                    approve_command(dir, *gate, &hash.to_hex())
                ),
                RunOutcome::Halted { .. } => format!(
                    "\n  fix the cause, then: consort retry --by <your-name> --dir {} --feature {id}",
                    dir.display()
                ),
                RunOutcome::Done | RunOutcome::Stopped if report.removed => {
                    "; its lane's worktree is removed".to_string()
                }
                RunOutcome::Done | RunOutcome::Stopped => String::new(),
            };
            (
                format!("{id}: {}{next}", ui::outcome_line(&run.outcome)),
                code,
            )
        }
    }
}
