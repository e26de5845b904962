//! `consort doctor`'s trial run: one test file of the suite run as a verification runs it
//! (see [`consort::project::Project::trial_run`]), read as a check.

use std::path::Path;

use consort::project::{Project, ProjectError, TrialRun};
use consort_actors::{Confinement, TestStatus, counted, error_chain};

use crate::collect::Finding;

/// The trial run of the project in `dir`, as findings: passed when it ran (its tests' own
/// failures are named, not a fault: the baseline records them), failed when the confinement
/// refused the run something or the run could not be made; and failed when the runner
/// collects test files the test paths miss.
pub fn check(dir: &Path) -> Vec<Finding> {
    let dir = dir.to_path_buf();
    let ran = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let project = Project::open(&dir).map_err(|e| error_chain(&e))?;
            project.trial_run().await.map_err(|e| match &e {
                // The run's own words, not under a "database" heading: a runner's error is
                // not the database's.
                ProjectError::Database(inner) => error_chain(inner),
                _ => error_chain(&e),
            })
        })
    })
    .join();
    let one = match ran {
        Ok(Ok(trial)) => {
            let mut found = vec![Finding {
                ok: true,
                what: ran_text(&trial),
                hint: String::new(),
            }];
            if !trial.outside_test_paths.is_empty() {
                found.push(Finding {
                    ok: false,
                    what: format!(
                        "the runner collects test files that [paths] tests misses: {}",
                        trial.outside_test_paths.join(", ")
                    ),
                    hint: "add a glob for them to [paths] tests: to Consort a file outside the test paths is no test, and an agent could change it".into(),
                });
            }
            return found;
        }
        Ok(Err(e)) => Finding {
            ok: false,
            what: format!("a trial run, as a verification runs it: {e}"),
            hint: "a verification would meet the same: fix what is named above (`consort exec -- <command>` runs the suite unconfined on a branch, to compare)".into(),
        },
        Err(_) => Finding {
            ok: false,
            what: "a trial run, as a verification runs it: its thread panicked".into(),
            hint: "report this as a bug in Consort".into(),
        },
    };
    vec![one]
}

/// What a trial run ran and how its tests went.
fn ran_text(trial: &TrialRun) -> String {
    let what = match &trial.file {
        Some(file) => format!("the test file {file}"),
        None => "the whole suite (the runner runs no single file)".into(),
    };
    let count = |status: TestStatus| {
        trial
            .report
            .outcomes
            .iter()
            .filter(|o| o.status == status && !o.name.starts_with('('))
            .count() as u64
    };
    let failed = count(TestStatus::Failed) + count(TestStatus::Errored);
    let how = match trial.confinement {
        Confinement::Off => "unconfined (sandbox = \"off\")".to_string(),
        c => format!("confined ({c})"),
    };
    let mut text = format!(
        "a trial run of {what} on a fresh branch, {how}: {} passed",
        count(TestStatus::Passed)
    );
    if failed > 0 {
        text.push_str(&format!(
            ", {} before any feature (the baseline records it)",
            counted(failed, "test fails", "tests fail")
        ));
    }
    text
}
