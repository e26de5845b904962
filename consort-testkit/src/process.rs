//! Running processes from tests: their output as text, waiting for a condition, and finding
//! the processes of a data directory or below a process.

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

/// The path of the example `name` built for the running test binary: integration tests live in
/// `target/<profile>/deps`, and cargo builds every example, into `target/<profile>/examples`,
/// before it runs them.
pub fn built_example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    exe.parent()
        .and_then(std::path::Path::parent)
        .expect("profile dir")
        .join("examples")
        .join(name)
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

/// The processes whose working directory is `data_dir`: a PostgreSQL server of that data
/// directory and its backends (each changes into its data directory).
pub fn servers_of(data_dir: &std::path::Path) -> Vec<u32> {
    let Ok(data) = std::fs::canonicalize(data_dir) else {
        return Vec::new();
    };
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| consort_lakebase::procinfo::alive(*pid))
        .filter(|pid| consort_lakebase::procinfo::cwd(*pid).is_some_and(|cwd| cwd == data))
        .collect()
}

/// A live descendant of `pid` whose command name is `name` (`psql`), if there is one.
pub fn descendant_named(pid: u32, name: &str) -> Option<u32> {
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        for child in consort_lakebase::procinfo::children_of(p) {
            let comm = std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
            if comm.trim() == name {
                return Some(child);
            }
            todo.push(child);
        }
    }
    None
}
