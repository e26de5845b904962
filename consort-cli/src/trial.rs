//! `consort doctor`'s trial run: one test file of the suite run as a verification runs it
//! (see [`consort::project::Project::trial_run`]), read as a check.

use std::path::Path;

use consort::project::{Project, ProjectError, TrialRun};
use consort_actors::{Confinement, TestOutcome, TestStatus, counted, error_chain};

use crate::collect::Finding;

/// The trial run of the project in `dir`, as findings: passed when it ran (its tests' own
/// failures are named, not a fault: the baseline records them), failed when the confinement
/// refused the run something or the run could not be made; and failed when the runner
/// collects test files the test paths miss.
pub fn check(dir: &Path) -> Vec<Finding> {
    let one = match on_the_project(dir, |project| async move { project.trial_run().await }) {
        Ok(trial) => {
            let mut found: Vec<Finding> = trial.migrations.iter().map(tool_text).collect();
            found.push(Finding {
                ok: true,
                what: ran_text(&trial),
                hint: String::new(),
            });
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
        Err(e) => Finding {
            ok: false,
            what: format!("a trial run, as a verification runs it: {e}"),
            hint: RUN_HINT.into(),
        },
    };
    vec![one]
}

/// What the project's migration tool did before the trial run's tests.
fn tool_text(trial: &consort::project::ToolTrial) -> Finding {
    let done = &trial.done;
    let head = done
        .recorded
        .iter()
        .next_back()
        .map(|r| format!(" (the head: {r})"))
        .unwrap_or_default();
    Finding {
        ok: true,
        what: format!(
            "the project's migration tool, {}, applied the migrations in {}/ on a fresh branch, confined, in {:.2} s: its bookkeeping records {}{head}",
            trial.tool,
            trial.dir,
            done.ms as f64 / 1000.0,
            counted(done.recorded.len() as u64, "migration", "migrations")
        ),
        hint: String::new(),
    }
}

/// What to do about a run that could not be made.
const RUN_HINT: &str = "a verification would meet the same: fix what is named above (`consort exec -- <command>` runs the suite unconfined on a branch, to compare)";

/// `consort doctor --baseline`: the project's whole suite run as a feature's baseline runs it
/// (see [`consort::project::Project::baseline_run`]), as findings: passed when every test
/// passed or failed only quarantined; failed, naming each failing test and what it said, when
/// a feature's baseline would halt on it.
pub fn baseline(dir: &Path) -> Vec<Finding> {
    let ran = match on_the_project(dir, |project| async move { project.baseline_run().await }) {
        Ok(ran) => ran,
        Err(e) => {
            return vec![Finding {
                ok: false,
                what: format!("the baseline, as a feature's runs it: {e}"),
                hint: RUN_HINT.into(),
            }];
        }
    };
    let outcomes = &ran.run.report.outcomes;
    let quarantined = |name: &str| ran.quarantined.iter().any(|q| q.test == name);
    let failing: Vec<&TestOutcome> = outcomes
        .iter()
        .filter(|o| o.is_failure() && !quarantined(&o.name))
        .collect();
    let mut what = format!(
        "the baseline, the whole suite as a feature's baseline runs it, on a fresh branch with the project's migrations, {}: {} passed",
        how_confined(ran.run.confinement),
        outcomes
            .iter()
            .filter(|o| o.status == TestStatus::Passed)
            .count()
    );
    let set_aside = outcomes
        .iter()
        .filter(|o| o.is_failure() && quarantined(&o.name))
        .count();
    if set_aside > 0 {
        what.push_str(&format!(
            ", {set_aside} quarantined failing (judging nothing)"
        ));
    }
    if failing.is_empty() {
        return vec![Finding {
            ok: true,
            what,
            hint: String::new(),
        }];
    }
    what.push_str(&format!(
        "; {} before any feature:",
        counted(failing.len() as u64, "test fails", "tests fail")
    ));
    for o in failing.iter().take(20) {
        let said = o
            .message
            .as_deref()
            .and_then(|m| m.lines().map(str::trim).find(|l| !l.is_empty()));
        what.push_str(&format!("\n        {}", o.name));
        if let Some(said) = said {
            let short: String = said.chars().take(160).collect();
            let more = if short.len() < said.len() { "…" } else { "" };
            what.push_str(&format!(": {short}{more}"));
        }
    }
    vec![Finding {
        ok: false,
        what,
        hint: "a feature's baseline halts on these before any agent acts: quarantine each that cannot pass here (`consort test quarantine NAME --by <you> --reason <why>`), or fix the setup".into(),
    }]
}

/// Opens the project in `dir` and runs `f` on it, on a runtime of its own (doctor is not
/// async), with errors as the words a person reads.
fn on_the_project<T, F, Fut>(dir: &Path, f: F) -> Result<T, String>
where
    T: Send + 'static,
    F: FnOnce(Project) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, ProjectError>>,
{
    let dir = dir.to_path_buf();
    let ran = on_a_thread_of_its_own(move || async move {
        let project = Project::open(&dir).map_err(|e| error_chain(&e))?;
        f(project).await.map_err(|e| match &e {
            // The run's own words, not under a "database" heading: a runner's error is
            // not the database's.
            ProjectError::Database(inner) => error_chain(inner),
            _ => error_chain(&e),
        })
    });
    ran.unwrap_or_else(|_| Err("its thread panicked; report this as a bug in Consort".into()))
}

/// Runs the future `f` makes on a thread and runtime of its own (for callers that are not
/// async), its errors as words; `Err` when that thread panicked.
pub(crate) fn on_a_thread_of_its_own<T, F, Fut>(f: F) -> std::thread::Result<Result<T, String>>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(f())
    })
    .join()
}

/// How a run was confined, in words.
fn how_confined(confinement: Confinement) -> String {
    match confinement {
        Confinement::Off => "unconfined (sandbox = \"off\")".to_string(),
        c => format!("confined ({c})"),
    }
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
    let how = how_confined(trial.confinement);
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
    if let Some(place) = &trial.branches_in_memory {
        text.push_str(&format!(
            "; branches are made in memory, in {}",
            place.display()
        ));
    }
    text
}
