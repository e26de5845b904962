//! Helpers shared by the test binaries that drive the `consort` program (`mod common;`). Each
//! binary uses some of them.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

use consort_testkit::process::text;

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
