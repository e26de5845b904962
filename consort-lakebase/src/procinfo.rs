//! Facts about processes and this host, read from `/proc` (Linux).
//!
//! Used to tell whether the process that created a branch or cluster is still alive, so the
//! sweeper removes only true orphans.

use std::path::Path;

/// The kernel's start time of a process (clock ticks since boot, `/proc/<pid>/stat` field 22),
/// or `None` when the process does not exist or is a zombie.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: split after it.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); field 22 is index 19.
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return None;
    }
    // Field 52 (exit code) is non-zero once the process is exiting.
    if fields.get(49).is_some_and(|c| *c != "0") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Whether `pid` is a live (non-zombie) process.
pub fn alive(pid: u32) -> bool {
    start_ticks(pid).is_some()
}

/// Whether the process `pid` that started at `ticks` is still the same live process.
pub fn same_process_alive(pid: u32, ticks: u64) -> bool {
    start_ticks(pid) == Some(ticks)
}

/// This process's id and start time.
pub fn me() -> (u32, u64) {
    let pid = std::process::id();
    (pid, start_ticks(pid).unwrap_or(0))
}

/// The kernel boot id, which tells whether a recorded pid belongs to this boot.
pub fn boot_id() -> String {
    read_trimmed("/proc/sys/kernel/random/boot_id")
}

/// The host name.
pub fn hostname() -> String {
    read_trimmed("/proc/sys/kernel/hostname")
}

fn read_trimmed(p: impl AsRef<Path>) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The pids of live processes whose parent is `ppid`.
pub fn children_of(ppid: u32) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_string();
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    let state = *f.first()?;
                    let parent: u32 = f.get(1)?.parse().ok()?;
                    Some(parent == ppid && state != "Z" && state != "X")
                })
                .unwrap_or(false)
        })
        .collect()
}

/// The pids of live (non-zombie) processes in process group `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_string();
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    // fields 3 (state), 4 (ppid), 5 (pgrp); field 52 (exit code) is set
                    // once the process is already dying.
                    let state = *f.first()?;
                    let pgrp: u32 = f.get(2)?.parse().ok()?;
                    let dying = f.get(49).is_some_and(|c| *c != "0");
                    Some(pgrp == pgid && state != "Z" && state != "X" && !dying)
                })
                .unwrap_or(false)
        })
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
                    .unwrap_or(false)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_dead_one_is_not() {
        let (pid, ticks) = me();
        assert!(ticks > 0);
        assert!(same_process_alive(pid, ticks));
        assert!(!same_process_alive(pid, ticks + 1));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let cpid = child.id();
        child.wait().expect("wait");
        assert!(!alive(cpid));
        assert!(!boot_id().is_empty());
    }
}
