//! Helpers shared by the test binaries that drive the `consort` program (`mod common;`). Each
//! binary uses some of them.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use consort_testkit::process::text;

pub(crate) mod script;
pub(crate) mod toolchain;

/// The `consort` program built for these tests.
pub(crate) fn consort() -> Command {
    Command::new(env!("CARGO_BIN_EXE_consort"))
}

/// Runs `cmd` with no input and collects its output.
pub(crate) fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .expect("the command starts")
}

/// Runs `consort ARGS --dir DIR`.
pub(crate) fn in_dir(args: &[&str], dir: &Path) -> Output {
    run(consort().args(args).arg("--dir").arg(dir))
}

/// Checks that `o` exited with `code`; `what` says what that means (the message adds the output).
#[track_caller]
pub(crate) fn assert_exit(o: &Output, code: i32, what: &str) {
    assert_eq!(o.status.code(), Some(code), "{what}: {}", text(o));
}

/// Checks that `o` exited with `code` (`what` says what that means) and said `said`.
#[track_caller]
pub(crate) fn assert_exit_saying(o: &Output, code: i32, what: &str, said: &str) {
    assert_exit(o, code, what);
    says(o, said);
}

/// Checks that `o`'s output (standard output, then error) holds `needle`; a failure shows it.
#[track_caller]
pub(crate) fn says(o: &Output, needle: &str) {
    consort_testkit::verify::assert_contains(&text(o), needle);
}

/// Writes `files` (path, content) under `dir`, making the directories they need.
pub(crate) fn write(dir: &Path, files: &[(&str, &str)]) {
    for (path, content) in files {
        let full = dir.join(path);
        std::fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
        std::fs::write(full, content).expect("write");
    }
}

/// `--dir DIR`, as arguments.
pub(crate) fn dir_arg(dir: &Path) -> [&std::ffi::OsStr; 2] {
    ["--dir".as_ref(), dir.as_os_str()]
}

/// `consort feature add REQUEST --id ID --dir DIR`.
pub(crate) fn feature_add(request: &Path, id: &str, dir: &Path) -> Command {
    let mut cmd = consort();
    cmd.args(["feature", "add"])
        .arg(request)
        .args(["--id", id])
        .args(dir_arg(dir));
    cmd
}

/// `consort doctor --dir DIR`: how it exited, and what it said.
pub(crate) fn doctor(dir: &Path) -> (Output, String) {
    let o = run(consort().arg("doctor").args(dir_arg(dir)));
    let said = text(&o);
    (o, said)
}

/// `consort SUBCOMMAND --dir DIR`, with no input.
pub(crate) fn consort_in(subcommand: &str, dir: &Path) -> Command {
    let mut cmd = consort();
    cmd.arg(subcommand).args(dir_arg(dir)).stdin(Stdio::null());
    cmd
}

/// `consort run --dir DIR --approve-as ada`, with no input: the run that approves every gate.
pub(crate) fn approving_run(dir: &Path) -> Command {
    let mut cmd = consort_in("run", dir);
    cmd.args(["--approve-as", "ada"]);
    cmd
}

/// Runs `consort run --approve-as ada`, which must end done (`what` says which run that is),
/// then `consort verify`, which must pass.
pub(crate) fn run_to_done_and_verify(dir: &Path, what: &str) {
    assert_exit(&run(&mut approving_run(dir)), 0, what);
    assert_exit(&run(&mut consort_in("verify", dir)), 0, "verify passes");
}

/// The text of the ledger of the project in `dir`.
pub(crate) fn ledger_text(dir: &Path) -> String {
    let project = consort::project::Project::open(dir).expect("project");
    std::fs::read_to_string(project.ledger_path()).expect("ledger")
}

/// `consort init DIR --example stockflow`, which must succeed.
pub(crate) fn init_stockflow(dir: &Path) {
    let o = run(consort()
        .arg("init")
        .arg(dir)
        .args(["--example", "stockflow"]));
    assert_exit(&o, 0, "init --example stockflow");
}

/// A fresh temporary directory holding `consort init --example stockflow`.
pub(crate) fn stockflow_tempdir() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    init_stockflow(tmp.path());
    tmp
}

/// Runs `consort run --approve-as ada` and kills it once the ledger holds `verified` receipts.
pub(crate) fn run_and_kill_after(dir: &Path, verified: usize) {
    let mut child = approving_run(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let ledger = consort::project::Project::open(dir)
        .expect("project")
        .ledger_path();
    let start = Instant::now();
    while std::fs::read_to_string(&ledger)
        .unwrap_or_default()
        .matches("\"verify-completed\"")
        .count()
        < verified
    {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the run ended before it could be killed: {status}");
        }
        assert!(start.elapsed() < Duration::from_secs(300), "no progress");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().expect("SIGKILL");
    let _ = child.wait();
}

/// Asserts that `halted`, the `halted` object of `consort status --json`, is of `kind` for
/// `reason`, and that its detail says `detail`.
pub(crate) fn assert_halted(halted: &serde_json::Value, kind: &str, reason: &str, detail: &str) {
    assert_eq!(halted["kind"], kind, "{halted:#}");
    assert_eq!(halted["reason"], reason, "{halted:#}");
    let said = halted["detail"].as_str().unwrap_or_default();
    assert!(
        said.contains(detail),
        "the detail says `{detail}`: {halted:#}"
    );
}

/// `consort status --json` of the project in `dir`, which must succeed.
pub(crate) fn status_json(dir: &Path) -> serde_json::Value {
    let o = run(consort_in("status", dir).arg("--json"));
    assert_exit(&o, 0, "status");
    serde_json::from_slice(&o.stdout).expect("status JSON")
}

/// The gate `lane` (a lane as `consort status --json` lists it) waits at: approved on the
/// command line, as ada.
pub(crate) fn approve_lane_gate(dir: &Path, lane: &serde_json::Value) {
    let gate = lane["pending_gate"]["gate"].as_str().expect("a gate waits");
    let hash = lane["pending_gate"]["hash"].as_str().expect("hash");
    let feature = lane["feature"].as_str().expect("feature");
    let o = run(consort_in("approve", dir).args([
        gate,
        "--hash",
        hash,
        "--by",
        "ada",
        "--feature",
        feature,
    ]));
    assert_exit(&o, 0, &format!("the waiting {gate} gate is approved"));
}
