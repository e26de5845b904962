//! Running processes from tests: their output as text, and waiting for a condition.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Standard output and standard error of a finished process, as one text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `cmd` to its end and returns its output; panics, naming `what` and quoting the
/// process's output, when it cannot start or exits unsuccessfully.
pub fn succeeded(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} does not start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        text(&out)
    );
    out
}

/// Waits up to `secs` for `cond` (a process to die, a file to appear), checking every 20 ms;
/// whether it came true. No timing is asserted.
pub fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}
