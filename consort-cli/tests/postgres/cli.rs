//! The `consort` command and the StockFlow example, end to end, in temporary directories, on
//! the embedded PostgreSQL.

use crate::common::status_json;
use crate::common::{
    assert_exit, assert_exit_saying, consort, consort_in, dir_arg, doctor, init_stockflow,
    ledger_text, run, run_and_kill_after, run_to_done_and_verify, says, stockflow_tempdir,
};
use consort_testkit::process::{built_example, text};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn pending_gate(dir: &Path) -> (String, String) {
    let s = status_json(dir);
    let g = &s["pending_gate"];
    (
        g["gate"].as_str().expect("gate").to_string(),
        g["hash"].as_str().expect("hash").to_string(),
    )
}

fn approve(dir: &Path, gate: &str, hash: &str) -> Output {
    run(consort()
        .args(["approve", gate, "--hash", hash, "--by", "ada"])
        .args(dir_arg(dir)))
}

/// A temporary directory with a project `consort init` wrote.
fn initialised() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    let o = run(consort().arg("init").arg(tmp.path()));
    assert!(o.status.success(), "{}", text(&o));
    tmp
}

fn branches_left(dir: &Path) -> usize {
    let o = run(consort().arg("branches").args(dir_arg(dir)));
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines().filter(|l| l.starts_with("consort-")).count()
}

/// The design's migrations are files under `migrations/` holding its SQL, and the promotion
/// applied exactly those, verified in the parent.
fn migrations_are_files_and_promoted(dir: &Path) {
    let design: consort::actors::DesignBundle = serde_json::from_str(
        &std::fs::read_to_string(
            consort::project::Project::open(dir)
                .expect("project")
                .design_path(),
        )
        .expect("design"),
    )
    .expect("design JSON");
    let plan = &design.schema.migrations;
    assert!(!plan.is_empty());
    for (i, m) in plan.iter().enumerate() {
        let path = dir
            .join("migrations")
            .join(consort::actors::migration_file_name(i, m));
        assert_eq!(
            std::fs::read_to_string(&path).expect("the migration's file"),
            m.sql,
            "{}",
            path.display()
        );
    }
    let events = consort_testkit::ledger::events(&ledger_path(dir));
    let report = events
        .iter()
        .find_map(|e| match e {
            consort::actors::Event::Promoted { report } => Some(report.clone()),
            _ => None,
        })
        .expect("promoted");
    let versions: Vec<String> = plan.iter().map(|m| m.version.clone()).collect();
    assert_eq!(report.applied, versions, "exactly the design's migrations");
    assert!(report.verified, "and verified in the parent");
}

/// `consort exec -- COMMAND` gives a person's own command a fresh branch with what was
/// promoted, under the project's own names too (`[branch_env]`), exits as the command does,
/// and leaves no branch behind.
fn exec_runs_on_a_branch_with_everything_promoted(dir: &Path) {
    let config = dir.join("consort.toml");
    let original = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        format!("{original}\n[branch_env]\nDB_NAME = \"{{database}}\"\n"),
    )
    .expect("write config");
    let o = run(consort().arg("exec").args(dir_arg(dir)).args([
        "--",
        "sh",
        "-c",
        "psql -XAtc 'SELECT count(*) FROM consort_migrations'; [ \"$DB_NAME\" = \"$PGDATABASE\" ] || exit 9; exit 7",
    ]));
    std::fs::write(&config, original).expect("put the config back");
    assert_exit(
        &o,
        7,
        "exec exits as its command did (9: DB_NAME is not the branch)",
    );
    let promoted: u32 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("a count ({e}): {}", text(&o)));
    assert!(
        promoted > 0,
        "the promoted migrations are there: {}",
        text(&o)
    );
    says(&o, "(everything promoted)");
    let o = run(consort().arg("branches").args(dir_arg(dir)));
    // The branch is gone.
    says(&o, "0 branch(es)");
}

#[test]
fn init_run_gate_approve_resume_done_verify() {
    let tmp = stockflow_tempdir();
    let dir = tmp.path();
    assert!(dir.join("consort.toml").exists() && dir.join("feature.md").exists());
    let again = run(consort().arg("init").arg(dir));
    assert_exit(&again, 1, "init refuses to overwrite");

    let o = run(consort().arg("run").args(dir_arg(dir)));
    assert_exit_saying(
        &o,
        3,
        "stops at the design gate",
        "consort approve design --hash",
    );
    let (gate, hash) = pending_gate(dir);
    assert_eq!(gate, "design");

    let wrong = "0".repeat(64);
    let o = approve(dir, "design", &wrong);
    assert_ne!(o.status.code(), Some(0), "a wrong hash is refused");
    assert!(
        text(&o).contains(&hash),
        "the refusal names the hash that waits: {}",
        text(&o)
    );
    let o = approve(dir, "deploy", &hash);
    assert_ne!(
        o.status.code(),
        Some(0),
        "another gate is refused: {}",
        text(&o)
    );
    let o = approve(dir, "design", &hash);
    assert!(o.status.success(), "{}", text(&o));

    // Through the build lane to the deploy gate, then the promote gate, then done.
    let mut outcome = None;
    for _ in 0..3 {
        let o = run(consort().arg("run").args(dir_arg(dir)));
        match o.status.code() {
            Some(0) => {
                outcome = Some(0);
                break;
            }
            Some(3) => {
                let (gate, hash) = pending_gate(dir);
                assert!(gate == "deploy" || gate == "promote", "{gate}");
                assert!(approve(dir, &gate, &hash).status.success());
                if gate == "promote" {
                    // Approved, the promotion is finished, never stopped half way.
                    let o = run(consort().args(["stop", "--by", "ada"]).args(dir_arg(dir)));
                    assert_exit_saying(&o, 1, "a stop is refused", "`consort run` finishes it");
                    assert_eq!(status_json(dir)["phase"], "promote");
                }
            }
            other => panic!("unexpected exit {other:?}: {}", text(&o)),
        }
    }
    assert_eq!(outcome, Some(0), "the run finishes");
    assert_eq!(status_json(dir)["phase"], "done");
    migrations_are_files_and_promoted(dir);
    exec_runs_on_a_branch_with_everything_promoted(dir);
    let o = run(consort().arg("verify").args(dir_arg(dir)));
    assert!(o.status.success(), "verify passes: {}", text(&o));
    let o = run(consort().arg("log").args(dir_arg(dir)));
    says(&o, "verify-completed");
    // A reader that stops early (`consort log --json | head -c 1`) ends the log quietly; the
    // whole run's ledger is larger than a pipe's buffer, so the log does write to a closed pipe.
    let mut log = consort()
        .args(["log", "--json"])
        .args(dir_arg(dir))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("consort log starts");
    let mut first = [0u8; 1];
    std::io::Read::read_exact(log.stdout.as_mut().expect("stdout"), &mut first).expect("a byte");
    drop(log.stdout.take());
    let o = log.wait_with_output().expect("consort log ends");
    assert!(
        o.status.success(),
        "a closed pipe is not an error: {}",
        text(&o)
    );
    assert!(!text(&o).contains("panicked"), "{}", text(&o));
    assert_eq!(branches_left(dir), 0);
}

#[test]
fn a_run_killed_during_the_build_lane_resumes_to_the_end() {
    let tmp = stockflow_tempdir();
    let dir = tmp.path();
    // Kill without warning once the build lane has recorded a few verified runs.
    run_and_kill_after(dir, 3);
    assert_ne!(status_json(dir)["phase"], "done");

    run_to_done_and_verify(dir, "resumes to the end");
    assert_eq!(
        branches_left(dir),
        0,
        "no branch with Consort's prefix is left"
    );
}

#[test]
fn the_example_runs_to_the_end_with_approve_as_and_stops_without_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let done = tmp.path().join("done");
    let o = run(Command::new(built_example("stockflow"))
        .args(["--approve-as", "ada", "--dir"])
        .arg(&done));
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("approving every gate as ada"), "{out}");
    assert!(
        out.contains("summary") && out.contains("branches:") && out.contains("ledger:"),
        "{out}"
    );
    let ledger = ledger_text(&done);
    assert!(
        ledger.contains("\"approver\":\"ada\""),
        "the ledger records who approved"
    );
    let o = run(consort().arg("verify").args(dir_arg(&done)));
    assert!(o.status.success(), "{}", text(&o));

    let stopped = tmp.path().join("stopped");
    let o = run(Command::new(built_example("stockflow"))
        .arg("--dir")
        .arg(&stopped));
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        text(&o).contains("consort -- approve design --hash")
            || text(&o).contains("  consort approve design --hash"),
        "the command to continue, runnable from here: {}",
        text(&o)
    );
}

/// A run whose output goes to a file in the project would change the tree it is judged on, at
/// a moment no one chooses: refused before anything starts. Under `.consort/`, which no hash
/// covers, it runs.
#[test]
fn a_run_writing_its_output_into_the_project_is_refused() {
    let tmp = stockflow_tempdir();
    let dir = tmp.path();
    let log = std::fs::File::create(dir.join("run.log")).expect("a log in the project");
    let o = consort_in("run", dir).stdout(log).output().expect("runs");
    assert_exit_saying(&o, 2, "a usage error", "inside the project's work tree");
    assert!(
        !lock_path(dir).exists(),
        "refused before it took the project"
    );
    let kept = std::fs::File::create(dir.join(".consort/run.log")).expect("a log in .consort");
    let o = consort_in("run", dir).stdout(kept).output().expect("runs");
    assert_exit(&o, 3, "the run reaches the design gate");
}

/// Writes `app.log` into the project right after the first change set is applied, before its
/// verification runs: what a watcher or an editor does at a moment no one chooses.
#[derive(Debug)]
struct WritesAfterFirstApply {
    ledger: PathBuf,
    log: PathBuf,
}

impl consort::actors::AppendObserver for WritesAfterFirstApply {
    fn appended(&self, _index: u64) -> std::ops::ControlFlow<()> {
        let events = consort_testkit::ledger::events(&self.ledger);
        if matches!(events.last(), Some(consort::actors::Event::Applied { .. }))
            && !self.log.exists()
        {
            std::fs::write(&self.log, "listening on :3000\n").expect("the stray log");
        }
        std::ops::ControlFlow::Continue(())
    }
}

/// A file written into the project between a change and its verification halts the run as a
/// change outside Consort, charging no role, and the halt names the file. Once it is gone,
/// `consort retry` and `consort run` go on to done.
#[test]
fn a_file_written_between_a_change_and_its_run_is_named_and_the_run_goes_on_once_it_is_gone() {
    use consort::project::{Project, RunOptions};
    use std::sync::Arc;
    let tmp = stockflow_tempdir();
    let dir = tmp.path();
    let log = dir.join("app.log");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let outcome = runtime.block_on(async {
        let project = Project::open(dir).expect("project");
        let opts = RunOptions {
            approver: Some(Arc::new(consort::ApproveAs { name: "ada".into() })),
            append_observer: Some(Arc::new(WritesAfterFirstApply {
                ledger: project.ledger_path(),
                log: log.clone(),
            })),
            ..RunOptions::default()
        };
        let lock = project.lock("consort run").expect("the run lock");
        let ensemble = project.ensemble_locked(lock, opts).await.expect("build");
        let report = ensemble.run().await.expect("the run ends");
        ensemble.shutdown().await;
        report.outcome
    });
    let consort::actors::RunOutcome::Halted { escalation } = outcome else {
        panic!("not halted: {outcome:?}")
    };
    assert_eq!(
        escalation.reason,
        consort::actors::EscalationReason::ChangedOutsideConsort
    );
    consort_testkit::verify::assert_contains(&escalation.detail, "its run (app.log)");
    let o = run(&mut consort_in("status", dir));
    says(&o, "changed-outside-consort");
    says(&o, "(app.log)");
    std::fs::remove_file(&log).expect("the log goes");
    let o = run(consort().args(["retry", "--by", "ada"]).args(dir_arg(dir)));
    assert_exit(&o, 0, "retry after the log is gone");
    run_to_done_and_verify(dir, "the run goes on to done");
}

#[test]
fn bad_configuration_is_a_usage_error_naming_the_key() {
    let tmp = initialised();
    let dir = tmp.path();
    let cfg = std::fs::read_to_string(dir.join("consort.toml")).expect("read");
    std::fs::write(
        dir.join("consort.toml"),
        cfg.replace("max_repairs = 3", "max_repairz = 3"),
    )
    .expect("write");
    let o = run(consort().arg("status").args(dir_arg(dir)));
    assert_exit_saying(&o, 2, "a usage error", "max_repairz");
    let o = run(consort().arg("frobnicate"));
    assert_eq!(o.status.code(), Some(2));
}

// ---------- one run per project ----------

fn ledger_path(dir: &Path) -> PathBuf {
    consort::project::Project::open(dir)
        .expect("project")
        .ledger_path()
}

fn lock_path(dir: &Path) -> PathBuf {
    dir.join(".consort/run.lock")
}

/// The PID the run lock's holder record names, if it names one.
fn lock_pid(dir: &Path) -> Option<u64> {
    let bytes = std::fs::read(lock_path(dir)).ok()?;
    let record: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    record["pid"].as_u64()
}

/// What a refused command must leave alone: the ledger's bytes, the lock file's bytes, and the
/// entries (name, is a directory, size) of the project directory and of `.consort/`.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    ledger: Vec<u8>,
    lock: Vec<u8>,
    entries: Vec<(String, bool, u64)>,
}

fn snapshot(dir: &Path) -> Snapshot {
    let mut entries = Vec::new();
    for d in [dir.to_path_buf(), dir.join(".consort")] {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let meta = e.metadata().expect("metadata");
            let size = if meta.is_dir() { 0 } else { meta.len() };
            entries.push((e.path().display().to_string(), meta.is_dir(), size));
        }
    }
    entries.sort();
    Snapshot {
        ledger: std::fs::read(ledger_path(dir)).unwrap_or_default(),
        lock: std::fs::read(lock_path(dir)).unwrap_or_default(),
        entries,
    }
}

/// A `consort` process in the background, killed if the test ends before it does.
struct Background(std::process::Child);

impl Background {
    fn spawn(cmd: &mut Command) -> Self {
        Background(
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn"),
        )
    }

    fn pid(&self) -> u64 {
        u64::from(self.0.id())
    }

    /// Polls until `ready` holds; panics if the process ends first (or never gets there).
    fn wait_for(&mut self, what: &str, mut ready: impl FnMut() -> bool) {
        let start = Instant::now();
        while !ready() {
            if let Ok(Some(status)) = self.0.try_wait() {
                panic!("the background run ended ({status}) before {what}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "the background run never got to: {what}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        self.0.wait().expect("wait")
    }

    /// SIGKILL, without warning.
    fn kill(&mut self) {
        self.0.kill().expect("SIGKILL");
        let _ = self.0.wait();
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A role played by a shell command that says it is waiting, then waits until the test releases
/// it (at most ~2 minutes) and answers with `answer`, if any. It holds a live run at a known
/// step, so that what happens while a run holds the project is not a matter of timing.
struct Latch {
    dir: PathBuf,
}

impl Latch {
    fn on(project: &Path, role: &str, answer: Option<&str>) -> Self {
        let dir = project.join(".consort/latch");
        std::fs::create_dir_all(&dir).expect("latch dir");
        if let Some(answer) = answer {
            std::fs::write(dir.join("answer.json"), answer).expect("answer");
        }
        let script = "touch \"$1/waiting\"; i=0; \
            while [ ! -e \"$1/go\" ] && [ $i -lt 2400 ]; do sleep 0.05; i=$((i+1)); done; \
            if [ -e \"$1/answer.json\" ]; then cat \"$1/answer.json\"; fi";
        let quoted = |s: &str| serde_json::to_string(s).expect("a TOML basic string");
        let table = format!(
            "\n[agents.roles.{role}]\nbackend = \"command\"\nprogram = \"sh\"\nargs = [\"-c\", {}, \"latch\", {}]\ntimeout_ms = 180000\n",
            quoted(script),
            quoted(&dir.display().to_string())
        );
        let config = project.join("consort.toml");
        let mut text = std::fs::read_to_string(&config).expect("consort.toml");
        text.push_str(&table);
        std::fs::write(&config, text).expect("write consort.toml");
        Latch { dir }
    }

    fn waiting(&self) -> bool {
        self.dir.join("waiting").exists()
    }

    fn release(&self) {
        std::fs::write(self.dir.join("go"), "").expect("release the latch");
    }
}

impl Drop for Latch {
    fn drop(&mut self) {
        // A latched command outlives a killed run; let it end.
        let _ = std::fs::write(self.dir.join("go"), "");
    }
}

/// The StockFlow script's stories, as the JSON artifact a command agent prints.
fn stockflow_stories(project: &Path) -> String {
    let script = std::fs::read_to_string(project.join(".consort/agents/stockflow.toml"))
        .expect("the StockFlow script");
    let script: toml::Table = toml::from_str(&script).expect("TOML");
    let entries = script["entry"].as_array().expect("entries");
    let stories = entries
        .iter()
        .find(|e| e.get("step").and_then(toml::Value::as_str) == Some("stories"))
        .expect("the stories entry");
    serde_json::to_string(&stories["artifact"]).expect("JSON")
}

/// A first `consort run` holding a project, and what a test of the held project starts from.
struct Holding {
    /// The latch its Product Owner waits at (dropped first: it lets a latched command end).
    latch: Latch,
    /// The run.
    first: Background,
    /// Its PID.
    pid: u64,
    /// The project as it is while held.
    before: Snapshot,
}

/// A StockFlow project whose first `consort run` (started here) holds the project while its
/// Product Owner is latched at the stories step.
fn a_run_holding_the_project(dir: &Path) -> Holding {
    init_stockflow(dir);
    let latch = Latch::on(dir, "product-owner", Some(&stockflow_stories(dir)));
    let mut first = Background::spawn(consort().arg("run").args(dir_arg(dir)));
    let pid = first.pid();
    first.wait_for("its lock file names it", || lock_pid(dir) == Some(pid));
    first.wait_for("the latched step", || latch.waiting());
    let before = snapshot(dir);
    Holding {
        latch,
        first,
        pid,
        before,
    }
}

fn refusal_names(o: &Output, pid: u64) {
    let out = text(o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains(&format!("another consort run (PID {pid}, since "))
            && out.contains("`consort run`) holds this project; wait for it or stop it"),
        "the refusal names the holder: {out}"
    );
    assert_eq!(
        out.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "one message: {out}"
    );
}

#[test]
fn a_second_run_is_refused_while_the_first_holds_the_project() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let mut held = a_run_holding_the_project(dir);
    assert!(
        !held.before.ledger.is_empty(),
        "the first run has started its ledger"
    );
    assert!(!held.before.lock.is_empty(), "and holds the lock");

    let o = run(consort().arg("run").args(dir_arg(dir)));
    refusal_names(&o, held.pid);
    let o = run(Command::new(built_example("stockflow"))
        .arg("--dir")
        .arg(dir));
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains(&format!("another consort run (PID {}, since ", held.pid)),
        "the example is refused the same way: {out}"
    );
    assert_eq!(snapshot(dir), held.before, "the refused runs wrote nothing");

    held.latch.release();
    assert_eq!(
        held.first.wait().code(),
        Some(3),
        "the first run goes on to the design gate"
    );
    assert_eq!(status_json(dir)["phase"], "design-gate");
    assert_ne!(
        lock_pid(dir),
        Some(held.pid),
        "the first run let go of the lock"
    );
    // The command agent's run left its transcript with the run's files.
    let transcript = std::fs::read_to_string(
        consort::project::Project::open(dir)
            .expect("project")
            .transcript_dir()
            .join("stories-0.txt"),
    )
    .expect("the command agent's transcript");
    assert!(
        transcript.contains("outcome: exit code 0") && transcript.contains("\"kind\""),
        "{transcript}"
    );
    let o = run(consort().arg("verify").args(dir_arg(dir)));
    assert!(o.status.success(), "verify passes: {}", text(&o));
}

#[test]
fn writers_are_refused_and_readers_served_while_a_run_holds_the_project() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let mut held = a_run_holding_the_project(dir);
    let zeros = "0".repeat(64);
    let writers: [&[&str]; 4] = [
        &["approve", "design", "--hash", &zeros, "--by", "ada"],
        &[
            "reject", "design", "--hash", &zeros, "--by", "ada", "--reason", "no",
        ],
        &["retry", "--by", "ada"],
        // The machine would take this stop (a run that is not halted may be stopped): only the
        // lock refuses it.
        &["stop", "--by", "ada"],
    ];
    for args in writers {
        let o = run(consort().args(args).args(dir_arg(dir)));
        refusal_names(&o, held.pid);
    }
    assert_eq!(
        snapshot(dir),
        held.before,
        "the refused commands wrote nothing"
    );

    let s = status_json(dir);
    assert_eq!(s["phase"], "design", "{s}");
    assert_eq!(s["step"], "stories", "{s}");
    let o = run(consort().arg("log").args(dir_arg(dir)));
    assert!(
        o.status.success() && text(&o).contains("start"),
        "{}",
        text(&o)
    );
    let o = run(consort().arg("verify").args(dir_arg(dir)));
    assert!(o.status.success(), "verify reads along: {}", text(&o));
    let o = run(consort().arg("branches").args(dir_arg(dir)));
    assert!(o.status.success(), "branches reads along: {}", text(&o));
    assert_eq!(
        snapshot(dir).ledger,
        held.before.ledger,
        "the readers wrote no ledger line"
    );

    held.latch.release();
    assert_eq!(held.first.wait().code(), Some(3), "at the design gate");
    let (gate, hash) = pending_gate(dir);
    let lines = std::fs::read_to_string(ledger_path(dir)).expect("ledger");
    let o = approve(dir, &gate, &hash);
    assert!(
        o.status.success(),
        "with the run gone, approve writes: {}",
        text(&o)
    );
    let after = std::fs::read_to_string(ledger_path(dir)).expect("ledger");
    assert_eq!(after.lines().count(), lines.lines().count() + 1);
}

#[test]
fn a_lock_left_by_a_dead_process_is_taken_over() {
    let tmp = stockflow_tempdir();
    let dir = tmp.path();
    // PIDs never exceed 2^22 on Linux: this holder is dead, and nothing holds the flock.
    let dead = 999_999_999u64;
    assert!(!Path::new(&format!("/proc/{dead}")).exists());
    std::fs::write(
        lock_path(dir),
        format!(r#"{{"pid":{dead},"since":"2026-01-01T00:00:00Z","command":"consort run"}}"#),
    )
    .expect("a stale holder record");
    let o = run(consort().arg("run").args(dir_arg(dir)));
    assert_exit(
        &o,
        3,
        "the run takes the lock over and reaches the design gate",
    );
    assert!(!text(&o).contains("holds this project"), "{}", text(&o));
    assert_ne!(lock_pid(dir), Some(dead), "the stale record is gone");

    // A garbled lock file (not UTF-8, not a record) stops no one either.
    std::fs::write(lock_path(dir), b"\xff\xfe\x00{\"pid\": \x1b[2J").expect("garble");
    let (gate, hash) = pending_gate(dir);
    let o = approve(dir, &gate, &hash);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read(lock_path(dir)).expect("lock file"),
        b"",
        "the approval took the lock and emptied it when done"
    );
    assert_eq!(status_json(dir)["phase"], "build");
}

#[test]
fn stop_ends_a_run_that_was_killed_mid_build_lane() {
    let tmp = stockflow_tempdir();
    let dir = tmp.path();
    // The Navigator never answers its first RED: the run is killed while it waits.
    let latch = Latch::on(dir, "navigator", None);
    let mut child = Background::spawn(
        consort()
            .arg("run")
            .args(dir_arg(dir))
            .args(["--approve-as", "ada"]),
    );
    let pid = child.pid();
    child.wait_for("the first RED", || latch.waiting());
    child.kill();
    let s = status_json(dir);
    assert_eq!(s["phase"], "build", "interrupted, not halted: {s}");
    assert!(
        s["step"].as_str().is_some_and(|st| st.starts_with("red/")),
        "{s}"
    );
    assert_eq!(s["halted"], serde_json::Value::Null, "{s}");
    assert_eq!(
        lock_pid(dir),
        Some(pid),
        "the killed run's record is left behind"
    );

    // A retry still needs a halt; the refusal is the machine's, not the lock's.
    let o = run(consort().args(["retry", "--by", "ada"]).args(dir_arg(dir)));
    assert_exit_saying(&o, 1, "a retry needs a halt", "not halted");

    let o = run(consort().args(["stop", "--by", "ada"]).args(dir_arg(dir)));
    assert!(o.status.success(), "stop takes the lock over: {}", text(&o));
    assert_eq!(status_json(dir)["phase"], "stopped");
    let o = run(consort().arg("status").args(dir_arg(dir)));
    says(&o, "phase:   stopped");
    let o = run(consort().arg("log").args(dir_arg(dir)));
    says(&o, "stop by ada");
    let o = run(consort().arg("run").args(dir_arg(dir)));
    assert_exit(&o, 4, "a stopped run stays stopped");
    let o = run(consort().arg("verify").args(dir_arg(dir)));
    assert!(o.status.success(), "verify passes: {}", text(&o));
    says(&o, "nothing recorded after the run ended");

    // A process that never read the stop went on writing: its rows change nothing a replay
    // shows, and verify fails on them.
    let ledger = std::fs::read_dir(dir.join(".consort/features"))
        .expect("the features' records")
        .flatten()
        .map(|f| f.path().join("ledger.jsonl"))
        .find(|l| l.is_file())
        .expect("the feature's ledger");
    let mut chain =
        consort_actors::Ledger::<consort_actors::Event>::open(&ledger).expect("the ledger");
    chain
        .append(&consort_actors::Event::Human {
            decision: consort_actors::HumanDecision::Retry,
            by: "a worker".into(),
        })
        .expect("appended");
    drop(chain);
    let o = run(consort().arg("verify").args(dir_arg(dir)));
    assert!(!o.status.success(), "verify fails: {}", text(&o));
    assert!(
        text(&o).contains("but 1 entry came after it")
            && text(&o).contains("after the run was over"),
        "{}",
        text(&o)
    );
}

/// `consort.toml` from `consort init` with its `[runner]` lines replaced.
fn with_runner(cfg: &str, runner: &str) -> String {
    cfg.lines()
        .filter(|l| !l.starts_with("setup = ") && !l.starts_with("tests = [\"tests/**/*.sql\"]"))
        .map(|l| {
            if l.starts_with("kind = \"psql\"") {
                runner.to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_runner_configuration_is_harness_and_checked_against_the_test_paths() {
    let tmp = initialised();
    let dir = tmp.path();
    let cfg = std::fs::read_to_string(dir.join("consort.toml")).expect("read");
    let write = |text: &str| std::fs::write(dir.join("consort.toml"), text).expect("write");

    // A configuration `status` refuses (exit 2) with a message that names all of `names`.
    let refused_naming = |config: &str, names: &[&str]| {
        write(config);
        let o = run(consort().arg("status").args(dir_arg(dir)));
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(names.iter().all(|n| text(&o).contains(n)), "{}", text(&o));
    };

    // psql test globs the test paths do not cover: a configuration error naming both keys.
    refused_naming(
        &cfg.replace("tests = [\"tests/**/*.sql\"]", "tests = [\"**/*.sql\"]"),
        &["`runner.tests`", "`paths.tests`"],
    );

    // A runner script inside the test paths: refused, naming the command's key.
    refused_naming(
        &with_runner(&cfg, "kind = \"command\"\ncommand = \"./tests/run.sh\""),
        &["`runner.command`", "tests/run.sh"],
    );

    // A command runner: doctor lists what it protects.
    write(&with_runner(
        &cfg,
        "kind = \"command\"\ncommand = \"sh scripts/run-tests.sh && python -m pytest -q\"",
    ));
    let o = doctor(dir).0;
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("harness from [runner] (no agent may change these):"),
        "{out}"
    );
    assert!(
        out.contains("scripts/run-tests.sh (run by runner.command)"),
        "{out}"
    );
    assert!(
        out.contains("Python configuration, at any depth outside the test paths: pyproject.toml"),
        "{out}"
    );
}

#[test]
fn outside_a_project_the_commands_say_how_to_start_one_and_a_missing_request_is_a_configuration_error()
 {
    let tmp = tempfile::tempdir().expect("tempdir");
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    for command in ["status", "run", "verify", "log"] {
        let o = run(consort().arg(command).args(dir_arg(&empty)));
        assert_exit(&o, 2, &format!("{command} outside a project"));
        let out = consort_testkit::process::text(&o);
        assert!(
            out.contains("is not a Consort project")
                && out.contains(&format!("consort init {}", empty.display())),
            "{command}: {out}"
        );
    }
    let dir = tmp.path().join("sf");
    init_stockflow(&dir);
    std::fs::remove_file(dir.join("feature.md")).expect("rm");
    let o = run(consort().arg("run").args(dir_arg(&dir)));
    assert_exit(&o, 2, "a missing feature request");
    assert!(
        consort_testkit::process::text(&o).contains("feature.md"),
        "{}",
        consort_testkit::process::text(&o)
    );
}

/// A feature that has not started has no run to stop or retry: said in words, nothing recorded.
#[test]
fn stop_and_retry_of_a_feature_that_has_not_started_are_refused_in_words() {
    let dir = stockflow_tempdir();
    for command in ["stop", "retry"] {
        let o = run(consort()
            .args([command, "--by", "ada"])
            .args(dir_arg(dir.path())));
        assert_exit_saying(
            &o,
            1,
            &format!("{command} before any run"),
            &format!("has not started, so there is no run to {command}"),
        );
    }
    assert!(
        !ledger_path(dir.path()).exists(),
        "nothing was recorded: {}",
        ledger_path(dir.path()).display()
    );
}

/// A person's change to what judges the runs (`[runner]` here) while the feature is open is
/// recorded when the run resumes under it — who, which section, the old and new hash — said on
/// resume, named by every receipt after it, and listed by `consort verify`.
#[test]
fn a_change_to_the_runner_while_the_feature_is_open_is_recorded_and_named_by_later_receipts() {
    let tmp = stockflow_tempdir();
    let dir = tmp.path();
    let o = run(consort().arg("run").args(dir_arg(dir)));
    assert_exit(&o, 3, "stops at the design gate");
    let config = std::fs::read_to_string(dir.join("consort.toml")).expect("config");
    assert!(config.contains("timeout_secs = 60"), "{config}");
    std::fs::write(
        dir.join("consort.toml"),
        config.replace("timeout_secs = 60", "timeout_secs = 90"),
    )
    .expect("edit the runner");
    let o = run(crate::common::approving_run(dir).stdin(Stdio::null()));
    assert_exit(&o, 0, "resumes to done under the changed runner");
    // Said on resume.
    says(&o, "consort.toml changed what judges the runs");
    let events = consort_testkit::ledger::events(&ledger_path(dir));
    let (mut changes, mut receipts) = (Vec::new(), Vec::new());
    for e in &events {
        match e {
            consort::actors::Event::HarnessChanged { change } => changes.push(change),
            consort::actors::Event::VerifyCompleted { receipt } => receipts.push(receipt),
            _ => {}
        }
    }
    assert_eq!(changes.len(), 1, "recorded once");
    assert_eq!(changes[0].by, "ada");
    assert_eq!(changes[0].to.changed_from(&changes[0].from), ["runner"]);
    let now = changes[0].to.hash();
    assert!(!receipts.is_empty());
    assert!(
        receipts.iter().all(|r| r.harness == Some(now)),
        "every receipt after the change names the harness in force"
    );
    let o = run(consort().arg("verify").args(dir_arg(dir)));
    assert!(o.status.success(), "{}", text(&o));
    says(&o, "ok    harness changed: by ada: [runner] ");
}
