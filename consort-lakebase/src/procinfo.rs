//! Facts about processes and this host, read from `/proc` (Linux).
//!
//! Used to tell whether the process that created a branch or cluster is still alive, so the
//! sweeper removes only true orphans.

use std::path::Path;

/// The fields of `/proc/<pid>/stat` this module reads.
struct Stat {
    /// Field 3: `R`, `S`, … (`Z` zombie, `X` dead).
    state: String,
    /// Field 4.
    ppid: u32,
    /// Field 5.
    pgrp: u32,
    /// Field 22: clock ticks since boot.
    start_ticks: u64,
    /// Field 52 (exit code) is non-zero once the process is exiting. A stopped process (state
    /// `T`, `SIGSTOP` or a terminal's Ctrl-Z; `t`, stopped by a debugger or tracer) holds its
    /// stop signal there instead: it is not dying.
    dying: bool,
}

impl Stat {
    /// `None` when the process does not exist (or its stat line cannot be read).
    fn of(pid: u32) -> Option<Stat> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name (field 2) is in parentheses and may contain spaces: split after it.
        let rest = stat.rsplit_once(')')?.1;
        // `f` starts at field 3 (state): field n is index n - 3.
        let f: Vec<&str> = rest.split_whitespace().collect();
        let state = (*f.first()?).to_string();
        let stopped = state == "T" || state == "t";
        Some(Stat {
            ppid: f.get(1)?.parse().ok()?,
            pgrp: f.get(2)?.parse().ok()?,
            start_ticks: f.get(19)?.parse().ok()?,
            dying: !stopped && f.get(49).is_some_and(|c| *c != "0"),
            state,
        })
    }

    /// Not a zombie and not dead.
    fn live(&self) -> bool {
        self.state != "Z" && self.state != "X"
    }
}

/// The kernel's start time of a process (clock ticks since boot, `/proc/<pid>/stat` field 22),
/// or `None` when the process does not exist, is a zombie or is exiting.
pub fn start_ticks(pid: u32) -> Option<u64> {
    Stat::of(pid)
        .filter(|s| s.live() && !s.dying)
        .map(|s| s.start_ticks)
}

/// Whether `pid` is a live (non-zombie) process.
pub fn alive(pid: u32) -> bool {
    start_ticks(pid).is_some()
}

/// Whether a process `pid` exists at all, zombies included (`kill(pid, 0)` would find it).
pub fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The working directory of `pid`; `None` when it does not exist or may not be looked at.
pub fn cwd(pid: u32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/cwd")).ok()
}

/// Whether the process `pid` that started at `ticks` is still the same live process.
pub fn same_process_alive(pid: u32, ticks: u64) -> bool {
    start_ticks(pid) == Some(ticks)
}

/// The numbers of a record file, such as an owner record (`<pid> <start ticks> …` separated
/// by white space); a field that is not a number is left out. `None` when the file cannot be
/// read.
pub fn read_numbers(path: &Path) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect(),
    )
}

/// This process's id and start time; `None` when `/proc/self/stat` cannot be read (then a
/// marker could not tell this process from a dead one).
pub fn me() -> Option<(u32, u64)> {
    let pid = std::process::id();
    Some((pid, start_ticks(pid)?))
}

/// The kernel boot id, which tells whether a recorded pid belongs to this boot; `None` when
/// it cannot be read.
pub fn boot_id() -> Option<String> {
    read_trimmed("/proc/sys/kernel/random/boot_id")
}

/// The host name; `None` when it cannot be read.
pub fn hostname() -> Option<String> {
    read_trimmed("/proc/sys/kernel/hostname")
}

fn read_trimmed(p: impl AsRef<Path>) -> Option<String> {
    let text = std::fs::read_to_string(p).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// The pids in `/proc` whose stat line satisfies `keep`.
fn pids_where(keep: impl Fn(&Stat) -> bool) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| Stat::of(*pid).is_some_and(|s| keep(&s)))
        .collect()
}

/// The pids of live processes whose parent is `ppid`.
pub fn children_of(ppid: u32) -> Vec<u32> {
    pids_where(|s| s.ppid == ppid && s.live())
}

/// The pids of live (non-zombie, not exiting) processes in process group `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    pids_where(|s| s.pgrp == pgid && s.live() && !s.dying)
}

/// The parent of `pid`; `None` when it does not exist (or its stat line cannot be read).
pub fn parent_of(pid: u32) -> Option<u32> {
    Stat::of(pid).map(|s| s.ppid)
}

/// The pids of live processes whose working directory is `dir` (compared as canonical paths).
/// A process whose working directory may not be looked at (another user's, when this process
/// is not root) is not listed.
pub fn with_cwd(dir: &Path) -> Vec<u32> {
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return Vec::new();
    };
    pids_where(|s| s.live() && !s.dying)
        .into_iter()
        .filter(|pid| cwd(*pid).is_some_and(|c| c == dir))
        .collect()
}

/// The pids of live processes whose command line contains `needle`.
pub fn with_cmdline_containing(needle: &str) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            alive(*pid)
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|b| {
                        String::from_utf8_lossy(&b)
                            .replace('\0', " ")
                            .contains(needle)
                    })
                    // A command line that cannot be read contains nothing.
                    .unwrap_or(false)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_dead_one_is_not() {
        let (pid, ticks) = me().expect("this process's stat line");
        assert!(ticks > 0);
        assert!(same_process_alive(pid, ticks));
        assert!(!same_process_alive(pid, ticks + 1));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let cpid = child.id();
        child.wait().expect("wait");
        assert!(!alive(cpid));
        assert!(boot_id().is_some_and(|b| !b.is_empty()));
    }

    /// A stopped process (a worker paused with `SIGSTOP`, a `consort` suspended with Ctrl-Z)
    /// is alive: its branches and its server are not an ended process's to sweep or stop.
    #[test]
    fn a_stopped_process_is_alive() {
        use nix::sys::signal::{Signal, kill};
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let target = nix::unistd::Pid::from_raw(pid as i32);
        let ticks = start_ticks(pid).expect("a running child");
        kill(target, Signal::SIGSTOP).expect("stop it");
        let stopped = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            Stat::of(pid).is_some_and(|s| s.state == "T")
        });
        assert!(stopped, "the child stopped");
        let seen = (alive(pid), same_process_alive(pid, ticks));
        kill(target, Signal::SIGKILL).expect("kill it");
        child.wait().expect("wait");
        assert_eq!(seen, (true, true), "a stopped process is alive");
    }

    #[test]
    fn a_record_reads_as_its_numbers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("owner");
        assert_eq!(read_numbers(&path), None);
        std::fs::write(&path, "12 345 x 6\n").expect("write");
        assert_eq!(read_numbers(&path), Some(vec![12, 345, 6]));
    }
}
