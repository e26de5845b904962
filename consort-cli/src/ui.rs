//! What a person sees: progress lines or a spinner, gate prompts, the end-of-run summary, and
//! the documented exit codes. Shared by the `consort` program and the StockFlow example.

use std::io::IsTerminal;
use std::time::Duration;

use consort_actors::{GateKind, Progress, RunOutcome, RunReport, TestStatus};
use consort_lakebase::PoolStatsSnapshot;
use indicatif::{ProgressBar, ProgressStyle};

use consort::project::{Interruption, Project, ProjectError, RunOptions};
use consort::runlock::RunLock;

mod prompt;
pub use prompt::{TerminalApprover, without_spinner};

/// Exit code: the run is done.
pub const EXIT_DONE: i32 = 0;
/// Exit code: any other failure.
pub const EXIT_FAILURE: i32 = 1;
/// Exit code: usage or configuration error.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: waiting at a gate.
pub const EXIT_GATE: i32 = 3;
/// Exit code: halted by an escalation (or stopped by a human).
pub const EXIT_HALTED: i32 = 4;

/// Whether a run of `project` must be refused because this process's output goes into its work
/// tree (see [`output_in_tree`]); says so on standard error when it must.
pub fn refuse_output_in_tree(project: &Project) -> bool {
    let Some(file) = output_in_tree(project) else {
        return false;
    };
    eprintln!(
        "refused: this command's output goes to {}, inside the project's work tree, whose files are checked before and after every test run: the run would change that file under itself and halt; write the output outside the project, under its .consort/ directory, or in a directory `[paths] caches` names",
        file.display()
    );
    true
}

/// Where this process's standard output or error is a file inside `project`'s work tree that
/// the tree's hash covers (not under `.consort/`, `.git/` or a cache directory): that file.
/// Every such file is hashed before a test run and checked against it, so a run that keeps
/// writing its own output there changes the tree under itself and halts.
pub fn output_in_tree(project: &Project) -> Option<std::path::PathBuf> {
    let tree = std::fs::canonicalize(project.work_tree()).ok()?;
    let filter = consort_actors::TreeFilter::new(&project.config.paths.caches);
    [1, 2].into_iter().find_map(|fd| {
        let target = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
        let inside = target.strip_prefix(&tree).ok()?.to_str()?;
        filter.skipped_dir(inside).is_none().then_some(target)
    })
}

/// The exit code for a run outcome.
pub fn exit_code(outcome: &RunOutcome) -> i32 {
    match outcome {
        RunOutcome::Done => EXIT_DONE,
        RunOutcome::AtGate { .. } => EXIT_GATE,
        RunOutcome::Halted { .. } | RunOutcome::Stopped => EXIT_HALTED,
    }
}

/// Installs the command line's log subscriber: the filter from `CONSORT_LOG` (default
/// `warn`, and the progress of long work such as fetching PostgreSQL), written to standard
/// error.
///
/// Colour only on a terminal, and never when `NO_COLOR` is set (to anything but empty).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CONSORT_LOG").unwrap_or_else(|_| {
                format!("warn,{}=info", consort_lakebase::PROGRESS_TARGET).into()
            }),
        )
        .with_ansi(colour_allowed(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        .with_writer(std::io::stderr)
        .init();
}

/// Whether to colour a stream: a terminal, and `NO_COLOR` unset or empty (no-color.org).
fn colour_allowed(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Whether standard input and error are a terminal.
pub fn is_terminal() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// Starts printing the progress of a run's event stream ([`consort::Ensemble::subscribe`], the
/// one source embedders read too): a spinner on a terminal, plain lines otherwise. Ends when
/// the stream does (the ensemble shut down); a printer that fell behind says how many reports it
/// missed and goes on.
pub fn progress_printer(
    mut events: tokio::sync::broadcast::Receiver<consort_actors::RunEvent>,
) -> tokio::task::JoinHandle<()> {
    use tokio::sync::broadcast::error::RecvError;
    let fancy = std::io::stderr().is_terminal();
    tokio::spawn(async move {
        let bar = fancy.then(|| {
            let b = ProgressBar::new_spinner();
            b.set_style(
                ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b.enable_steady_tick(Duration::from_millis(120));
            prompt::set_spinner(Some(b.clone()));
            b
        });
        loop {
            let (line, transient) = match events.recv().await {
                Ok(consort_actors::RunEvent::Progress(p)) => {
                    (describe(&p), matches!(p, Progress::Step { .. }))
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(n)) => (
                    format!(
                        "({n} events not shown: the printer fell behind; `consort log` has them)"
                    ),
                    false,
                ),
                Err(RecvError::Closed) => break,
            };
            match &bar {
                Some(b) if transient => b.set_message(line),
                Some(b) => b.println(line),
                None => eprintln!("{line}"),
            }
        }
        if let Some(b) = bar {
            prompt::set_spinner(None);
            b.finish_and_clear();
        }
    })
}

pub(crate) fn describe(p: &Progress) -> String {
    match p {
        Progress::Phase { phase } => format!("phase: {phase}"),
        Progress::Step {
            step,
            role,
            test,
            of,
        } if *of > 0 && *test > 0 => format!("[test {test}/{of}] {role}: {step}"),
        Progress::Step { step, role, .. } => format!("{role}: {step}"),
        Progress::Receipt {
            request,
            passed,
            failed,
            branch,
        } => {
            format!("  run {request} on {branch}: {passed} passed, {failed} not passed")
        }
        Progress::Refused { violation } => format!("  refused: {violation}"),
        Progress::GateWaiting {
            gate,
            hash,
            summary,
        } => {
            let said: String = summary.lines().map(|l| format!("\n  {l}")).collect();
            format!("gate: {gate} waits for approval of {hash}{said}")
        }
        Progress::Stopped { outcome } => format!("stopped: {outcome}"),
    }
}

/// A size for people: `512 B`, `3.4 kB`, `45.2 MB`, `1.3 GB`.
pub fn bytes_text(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["kB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The signals a run listens for: once one arrives the run is stopped, not killed.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals, ProjectError> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind, name| {
            signal(kind).map_err(|source| ProjectError::Signals {
                signal: name,
                source,
            })
        };
        Ok(Signals {
            int: listen(SignalKind::interrupt(), "SIGINT")?,
            term: listen(SignalKind::terminate(), "SIGTERM")?,
        })
    }

    async fn next(&mut self) -> Interruption {
        tokio::select! {
            _ = self.int.recv() => Interruption::Interrupt,
            _ = self.term.recv() => Interruption::Terminate,
        }
    }
}

/// Waits for `SIGINT` or `SIGTERM` (what ends `consort serve` after its run).
pub async fn interruption() -> Result<Interruption, ProjectError> {
    Ok(Signals::install()?.next().await)
}

/// How long an interrupted run's actors are given to stop before the servers are stopped
/// regardless.
const INTERRUPTED_SHUTDOWN: Duration = Duration::from_secs(30);

/// Runs `project` once under `lock`, as the `consort` command and the StockFlow example do:
/// progress printed while it runs (see [`progress_printer`]), the
/// ensemble shut down, then the summary printed (see [`print_summary`]).
///
/// `SIGINT` and `SIGTERM` stop the run while it starts or runs: the ensemble is shut down, the
/// embedded database servers this process started are stopped, and
/// [`ProjectError::Interrupted`] is returned. The ledger is left as a crash would leave it (every
/// event is fsynced before it takes effect), so `consort run` resumes it.
pub async fn run_printed(
    project: &Project,
    lock: RunLock,
    opts: RunOptions,
) -> Result<RunReport, ProjectError> {
    let mut signals = Signals::install()?;
    let ensemble = tokio::select! {
        built = project.ensemble_locked(lock, opts) => built?,
        // The start is dropped: a server it had started stops with its handle.
        signal = signals.next() => return Err(interrupted(signal)),
    };
    let printer = progress_printer(ensemble.subscribe());
    let ran = tokio::select! {
        r = ensemble.run() => Ok(r),
        signal = signals.next() => Err(signal),
    };
    let result = match ran {
        Ok(result) => result,
        Err(signal) => return Err(stop_interrupted(ensemble, signal).await),
    };
    let stats = ensemble.shutdown().await;
    // The printer ends with the run's last sender; a moment to print what is left.
    let _ = tokio::time::timeout(Duration::from_secs(2), printer).await;
    let report = result?;
    print_summary(&report, &stats, project);
    print_git(project, &report);
    Ok(report)
}

/// Stops a run that `signal` interrupted: the actors (bounded), then the servers, and only
/// then releases the project's run lock, so no other run attaches to a server about to stop.
async fn stop_interrupted(mut ensemble: consort::Ensemble, signal: Interruption) -> ProjectError {
    tracing::info!(%signal, "stopping the run");
    let locks = ensemble.take_run_locks();
    if tokio::time::timeout(INTERRUPTED_SHUTDOWN, ensemble.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("the run's actors did not stop in time; stopping its servers regardless");
    }
    let error = interrupted(signal);
    drop(locks);
    error
}

/// Stops every embedded server this process started (whatever still holds its handle) and
/// says the run was interrupted by `signal`.
pub(crate) fn interrupted(signal: Interruption) -> ProjectError {
    let stopped = consort_lakebase::EmbeddedPostgres::stop_all_owned();
    tracing::info!(%signal, servers = stopped, "interrupted; embedded servers stopped");
    ProjectError::Interrupted(signal)
}

/// Makes the commits still missing and says where the run's branch stands; at the deploy
/// gate, the commit the release is.
fn print_git(project: &Project, report: &RunReport) {
    match project.git_sync() {
        Ok(Some(sync)) => {
            let head = sync
                .head
                .as_deref()
                .map_or("no commit yet", |h| &h[..h.len().min(12)]);
            println!(
                "git: {} on branch {}, at {head}",
                consort_actors::counted(sync.total as u64, "Consort commit", "Consort commits"),
                sync.branch
            );
            if matches!(
                report.outcome,
                RunOutcome::AtGate {
                    gate: GateKind::Deploy,
                    ..
                }
            ) {
                println!("  the release to approve is commit {head}");
            }
            if report.outcome == RunOutcome::Done {
                println!(
                    "  ready to merge: from your branch, git merge {}{}",
                    sync.branch,
                    merge_note(project.config.git.remote.as_deref())
                );
            }
        }
        Ok(None) => {}
        Err(e) => eprintln!(
            "warning: the run's commits could not be made: {}",
            consort_actors::error_chain(&e)
        ),
    }
}

/// What Consort did with the run's branch beyond this checkout: pushed it, where `[git]
/// remote` names a remote; else nothing.
fn merge_note(remote: Option<&str>) -> String {
    match remote {
        Some(remote) => format!(" (Consort pushed the branch to the remote {remote})"),
        None => " (Consort pushed nothing and merged nothing)".into(),
    }
}

/// Prints the budgets a run with `opts` starts with, and where they come from (nothing when
/// no budget applies).
pub fn print_budgets(project: &Project, opts: &RunOptions) -> Result<(), ProjectError> {
    let budgets = project.budgets(opts)?;
    if budgets.is_unlimited() {
        return Ok(());
    }
    let from = if project.config.budget.is_empty() && opts.default_budgets.is_some() {
        "the defaults of --agents openai; set [budget] in consort.toml to change them"
    } else {
        "from consort.toml"
    };
    println!("budgets ({from}):");
    for line in consort::config::budget_lines(&budgets) {
        println!("  {line}");
    }
    Ok(())
}

/// Says which roles wait for a coding client over MCP (`backend = "mcp"`), and how a client
/// joins, before a run starts: without it a parked step would look like a hung one.
pub fn print_mcp_roles(project: &Project, opts: &RunOptions) {
    if opts.agents_override.is_some() {
        return;
    }
    let played: Vec<&str> = consort_actors::Role::ALL
        .iter()
        .filter(|r| {
            matches!(
                project.config.agents.for_role(**r),
                consort_agents::AgentConfig::Mcp(_)
            )
        })
        .map(|r| r.as_str())
        .collect();
    if played.is_empty() {
        return;
    }
    println!(
        "{} played by coding clients over MCP: each step waits until a client takes it (`consort mcp --dir {} --as <name>` in the client's MCP configuration)",
        played.join(", "),
        project.dir.display()
    );
}

/// Prints the end-of-run summary: tests, receipts, branches, time per phase, the ledger.
pub fn print_summary(report: &RunReport, branches: &PoolStatsSnapshot, project: &Project) {
    let dir = &project.dir;
    let s = &report.state;
    let tests = s.test_list.as_ref().map_or(0, |l| l.entries.len());
    let green: usize = s.test_list.as_ref().map_or(0, |l| {
        l.entries
            .iter()
            .filter(|e| {
                s.receipts.iter().any(|r| {
                    s.passed(r) && r.status_of(e.runner_name()) == Some(TestStatus::Passed)
                })
            })
            .count()
    });
    println!("\n── summary ──");
    println!("outcome:   {}", outcome_line(&report.outcome));
    for line in built_lines(s, &files_written(project)) {
        println!("{line}");
    }
    println!(
        "tests:     {green} of {tests} green ({} completed RED→GREEN→REFACTOR→REVIEW)",
        s.build.completed
    );
    let failing = s.receipts.iter().filter(|r| !s.passed(r)).count();
    let quarantined = if s.quarantines().next().is_some() {
        "; a quarantined test's failures count for nothing"
    } else {
        ""
    };
    println!(
        "receipts:  {} verified runs: {} failed (every RED, and each GREEN or REFACTOR that did not pass{quarantined}), {} passed",
        s.receipts.len(),
        failing,
        s.receipts.len() - failing
    );
    println!(
        "branches:  {} created, {} dropped, {} live",
        branches.created, branches.dropped, branches.live
    );
    println!("time:      {}", time_line(&report.phase_times));
    match project.events() {
        Ok(events) => {
            let totals = consort_actors::usage_totals(events.iter());
            for line in usage_lines(&totals) {
                println!("usage:     {line}");
            }
        }
        Err(e) => {
            tracing::warn!(error = %consort_actors::error_chain(&e), "cannot read the ledger for the usage summary")
        }
    }
    let ledger = match project.records().store() {
        Some(store) => format!(
            "feature {} of project {} in the shared store",
            project.feature_id(),
            store.project()
        ),
        None => report.ledger_path.display().to_string(),
    };
    println!(
        "ledger:    {ledger} ({} events this run)",
        report.events_appended
    );
    println!("project:   {}", dir.display());
}

/// The phases that took time (10 ms or more), in lifecycle order: `design 1.2 s, build 8.4 s`.
pub fn time_line(phase_times: &std::collections::BTreeMap<String, Duration>) -> String {
    use consort_actors::Phase;
    let rank = |name: &str| Phase::ALL.iter().position(|p| p.as_str() == name);
    let mut phases: Vec<(&String, &Duration)> = phase_times
        .iter()
        .filter(|(_, d)| **d >= Duration::from_millis(10))
        .collect();
    phases.sort_by_key(|(name, _)| rank(name).unwrap_or(Phase::ALL.len()));
    let parts: Vec<String> = phases
        .iter()
        .map(|(name, d)| match d.as_millis() {
            ms if ms < 1000 => format!("{name} {ms} ms"),
            _ => format!("{name} {:.1} s", d.as_secs_f64()),
        })
        .collect();
    if parts.is_empty() {
        "no phase took measurable time in this process".into()
    } else {
        parts.join(", ")
    }
}

/// What the run built, for people: the feature, its stories, its migrations and the files its
/// accepted change sets wrote (the first twelve, then a count).
pub fn built_lines(s: &consort_actors::State, files: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(f) = &s.feature {
        out.push(format!("feature:   {} ({})", f.title, f.id));
    }
    if let Some(stories) = &s.stories {
        let titles: Vec<String> = stories
            .stories
            .iter()
            .map(|st| format!("{} {}", st.id, st.title))
            .collect();
        out.push(format!("stories:   {}", titles.join("; ")));
    }
    if let Some(plan) = &s.schema {
        let versions: Vec<&str> = plan.migrations.iter().map(|m| m.version.as_str()).collect();
        out.push(format!(
            "schema:    {}: {}",
            consort_actors::counted(versions.len() as u64, "migration", "migrations"),
            versions.join(", ")
        ));
    }
    if !files.is_empty() {
        let text = consort_actors::first_and_more(files, 12);
        out.push(format!("files:     {} written: {text}", files.len()));
    }
    out
}

/// The files the accepted change sets of `project`'s current feature wrote or deleted, in the
/// order first written, from its ledger (empty when it cannot be read).
fn files_written(project: &Project) -> Vec<String> {
    let (Ok(machine), Ok(events)) = (project.machine(), project.events()) else {
        return Vec::new();
    };
    consort_actors::FilesWritten::of(&machine, events.iter())
}

/// What a run spent, for people: the total first, then one line per role that spent anything
/// (`total: 1200 tokens (…), 4 calls, 3.2 s`, `driver: …`). Derived from the ledger.
pub fn usage_lines(totals: &consort_actors::UsageTotals) -> Vec<String> {
    let run = totals.run();
    if run.tokens() == 0 && run.wall_ms < 1000 {
        // Scripted or replayed agents: nothing worth telling per role was spent.
        return vec![format!(
            "{}, no tokens spent",
            consort_actors::counted(run.calls, "call", "calls")
        )];
    }
    let mut out = vec![format!("total: {}", run.line())];
    out.extend(
        totals
            .roles
            .iter()
            .map(|(role, u)| format!("{role}: {}", u.total.line())),
    );
    out
}

/// One step's usage, for people: `1200 tokens (1000 prompt, 0 cached, 200 completion), 2
/// calls, 3.1 s`.
pub fn usage_text(u: &consort_actors::Usage) -> String {
    consort_actors::Tally {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        cached_tokens: u.cached_tokens,
        calls: u64::from(u.calls),
        tool_calls: u64::from(u.tool_calls),
        wall_ms: u.wall_ms,
        steps: 1,
    }
    .line()
}

/// One line describing an outcome.
pub fn outcome_line(outcome: &RunOutcome) -> String {
    match outcome {
        RunOutcome::Done => {
            "done: every test green, every gate approved, migrations promoted".into()
        }
        RunOutcome::AtGate { gate, hash } => {
            format!("waiting at the {gate} gate for approval of {hash}")
        }
        RunOutcome::Halted { escalation } => format!(
            "halted at {} ({}): {}",
            escalation.step,
            match &escalation.reason {
                consort_actors::EscalationReason::Verdict(_) => "verdict".to_string(),
                consort_actors::EscalationReason::Infrastructure(_) =>
                    "infrastructure fault".to_string(),
                consort_actors::EscalationReason::BudgetSpent(_) => "budget".to_string(),
                consort_actors::EscalationReason::ChangedOutsideConsort =>
                    "changed outside Consort".to_string(),
                consort_actors::EscalationReason::Integration => "lane not merged".to_string(),
                consort_actors::EscalationReason::FailingBeforeTheFeature =>
                    "failing before the feature".to_string(),
            },
            escalation.detail
        ),
        RunOutcome::Stopped => "stopped by a human".into(),
    }
}

/// `command` (a `consort …` command line) as it runs from where the user is: unchanged when
/// a `consort` program is on `PATH`, else through cargo (`cargo run -q --bin consort -- …`),
/// which works in this repository right after an example, before anything is installed.
pub fn runnable(command: &str) -> String {
    runnable_with(std::env::var_os("PATH"), command)
}

/// [`runnable`] for this `PATH`.
fn runnable_with(path: Option<std::ffi::OsString>, command: &str) -> String {
    let installed = path.is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| is_executable(&dir.join("consort")))
    });
    match command.strip_prefix("consort ") {
        Some(args) if !installed => format!("cargo run -q --bin consort -- {args}"),
        _ => command.to_string(),
    }
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What `consort stop` says of the work no run verified: nothing, what it put back, or exactly
/// what it leaves and why.
pub fn unverified_text(
    work: &consort::project::UnverifiedWork,
    put_back: bool,
    keep: bool,
) -> String {
    let step = work.last_verified.as_deref().map_or_else(
        || "the run's start".to_string(),
        |s| format!("the last verified step ({s})"),
    );
    if work.differs.is_empty() {
        return format!("the work tree is as {step} left it\n");
    }
    let paths: Vec<String> = work
        .differs
        .iter()
        .map(|(p, how)| format!("  {p} ({how})"))
        .collect();
    let paths = paths.join("\n");
    if put_back {
        return format!(
            "put back what {step} left, undoing work no run verified (it stays in the ledger: consort log):\n{paths}\n"
        );
    }
    let why = if keep {
        "as --keep asked"
    } else {
        "the tree changed since the run's last change, so nothing was overwritten"
    };
    format!("left in the work tree ({why}), work no run verified since {step}:\n{paths}\n")
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_run_summary_says_where_the_branch_was_pushed_when_it_was() {
        assert_eq!(
            super::merge_note(Some("origin")),
            " (Consort pushed the branch to the remote origin)"
        );
        assert!(super::merge_note(None).contains("pushed nothing"));
    }

    #[test]
    fn a_consort_command_runs_through_cargo_until_one_is_installed() {
        let bin = tempfile::tempdir().expect("tempdir");
        let with_path = |path: &std::path::Path| {
            runnable_with(Some(path.as_os_str().to_owned()), "consort verify --dir d")
        };
        assert_eq!(
            with_path(bin.path()),
            "cargo run -q --bin consort -- verify --dir d"
        );
        let exe = bin.path().join("consort");
        std::fs::write(&exe, "#!/bin/sh\n").expect("write");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(with_path(bin.path()), "consort verify --dir d");
        assert_eq!(runnable_with(None, "git log"), "git log");
    }

    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour_allowed(true, None));
        assert!(colour_allowed(true, Some(OsStr::new(""))));
        assert!(!colour_allowed(true, Some(OsStr::new("1"))));
        assert!(!colour_allowed(false, None));
    }

    #[test]
    fn the_time_line_is_in_lifecycle_order_and_leaves_out_what_took_no_time() {
        let times: std::collections::BTreeMap<String, Duration> = [
            ("promote", Duration::from_millis(30)),
            ("build", Duration::from_millis(5650)),
            ("design-gate", Duration::from_millis(2)),
            ("design", Duration::from_millis(120)),
            ("idle", Duration::ZERO),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(
            time_line(&times),
            "design 120 ms, build 5.7 s, promote 30 ms"
        );
        assert!(time_line(&Default::default()).starts_with("no phase"));
    }

    #[test]
    fn usage_that_spent_nothing_is_one_line_and_spending_is_told_per_role() {
        use consort_actors::{Role, RoleUsage, Tally, UsageTotals};
        let with = |tally: Tally| UsageTotals {
            roles: [(
                Role::Driver,
                RoleUsage {
                    total: tally,
                    by_model: Default::default(),
                },
            )]
            .into(),
        };
        let scripted = Tally {
            calls: 3,
            steps: 3,
            wall_ms: 4,
            ..Tally::default()
        };
        assert_eq!(usage_lines(&with(scripted)), ["3 calls, no tokens spent"]);
        let model = Tally {
            calls: 1,
            steps: 1,
            prompt_tokens: 100,
            completion_tokens: 20,
            wall_ms: 1500,
            ..Tally::default()
        };
        let lines = usage_lines(&with(model));
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("total: 120 tokens"), "{lines:?}");
        assert!(lines[1].starts_with("driver: 120 tokens"), "{lines:?}");
    }
}
