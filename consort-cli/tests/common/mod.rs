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
pub(crate) fn assert_exit(o: &Output, code: i32, what: &str) {
    assert_eq!(o.status.code(), Some(code), "{what}: {}", text(o));
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

/// `consort init DIR --example stockflow`, which must succeed.
pub(crate) fn init_stockflow(dir: &Path) {
    let o = run(consort()
        .arg("init")
        .arg(dir)
        .args(["--example", "stockflow"]));
    assert_exit(&o, 0, "init --example stockflow");
}

/// Runs `consort run --approve-as ada` and kills it once the ledger holds `verified` receipts.
pub(crate) fn run_and_kill_after(dir: &Path, verified: usize) {
    let mut child = consort()
        .arg("run")
        .args(dir_arg(dir))
        .args(["--approve-as", "ada"])
        .stdin(Stdio::null())
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
