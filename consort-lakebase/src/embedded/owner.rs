//! Who owns a kept cluster's server, and what a start does with a server whose owner is gone.
//!
//! A kept cluster directory `D` holds, besides the data:
//!
//! | path | what |
//! |---|---|
//! | `D/start.lock` | an exclusive `flock` held while a process starts (or attaches to) the server |
//! | `D/owner` | `<owner pid> <owner start ticks> <postmaster pid>`, written by the process that started the server |
//!
//! The start lock makes starts one at a time: a process that holds it sees either no server, a
//! server whose owner is alive and that has finished its start (attach to it), or a server left
//! by an owner that has died — killed during the server's start-up, during a run, or ended
//! before its watchdog could be started. The kernel releases the lock when its holder dies, so
//! a crashed start never blocks the next one. A server whose owner is gone is stopped here
//! (the owner's watchdog may be doing the same) and waited for, before the new server starts:
//! until the pid is gone and `postmaster.pid` no longer names it, as `postgres` itself checks.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tracing::{info, warn};

use crate::error::{Error, Result, duration_text};
use crate::procinfo;

/// The start lock's file name in a cluster directory.
const START_LOCK: &str = "start.lock";
/// The owner record's file name in a cluster directory.
const OWNER: &str = "owner";
/// How long to wait between looks at a server that is going down.
const POLL: Duration = Duration::from_millis(20);

/// How long each signal is given to stop a server whose owner is gone: a fast shutdown
/// (`SIGINT`), then an immediate one (`SIGQUIT`), then `SIGKILL`.
const STOP_STEPS: [(Signal, Duration); 3] = [
    (Signal::SIGINT, Duration::from_secs(20)),
    (Signal::SIGQUIT, Duration::from_secs(5)),
    (Signal::SIGKILL, Duration::from_secs(5)),
];

/// The start lock of a cluster directory, held until dropped.
#[derive(Debug)]
pub(super) struct StartLock {
    file: Option<Flock<File>>,
}

impl StartLock {
    /// Takes the start lock of `dir`, waiting up to `patience` for another process's start.
    pub(super) async fn take(dir: &Path, patience: Duration) -> Result<StartLock> {
        let path = dir.join(START_LOCK);
        let deadline = Instant::now() + patience;
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| Error::cluster_io(format!("open {}", path.display()), e))?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(locked) => return Ok(StartLock { file: Some(locked) }),
                Err((_, Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                    tokio::time::sleep(POLL).await;
                }
                Err((_, Errno::EWOULDBLOCK)) => {
                    return Err(Error::Cluster(format!(
                        "another process has been starting the server in {} for {}; it may be stuck (see {}): end it, or wait and run again",
                        dir.display(),
                        duration_text(patience),
                        dir.join("postgres.log").display()
                    )));
                }
                Err((_, errno)) => {
                    return Err(Error::cluster_io(
                        format!("lock {}", path.display()),
                        errno.into(),
                    ));
                }
            }
        }
    }
}

impl Drop for StartLock {
    fn drop(&mut self) {
        if let Some(file) = self.file.take()
            && let Err((locked, errno)) = file.unlock()
        {
            // The kernel releases it when the process ends; forgetting it avoids the panic
            // of `Flock`'s own drop.
            warn!(%errno, "cannot release the cluster's start lock");
            std::mem::forget(locked);
        }
    }
}

/// Records this process as the owner of the server `postmaster` in `dir`.
pub(super) fn record_owner(dir: &Path, postmaster: u32) -> Result<()> {
    let (pid, ticks) = procinfo::me().ok_or_else(|| {
        Error::Cluster(
            "cannot read this process's start time from /proc/self/stat, so no other process could tell whether the server's owner is alive".into(),
        )
    })?;
    let path = dir.join(OWNER);
    std::fs::write(&path, format!("{pid} {ticks} {postmaster}\n"))
        .map_err(|e| Error::cluster_io(format!("write {}", path.display()), e))
}

/// Whether the process recorded as the owner of `postmaster` in `dir` is alive. No record, a
/// record of another server or an unreadable one: no live owner.
pub(super) fn owner_alive(dir: &Path, postmaster: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join(OWNER)) else {
        return false;
    };
    let fields: Vec<u64> = text
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    match fields.as_slice() {
        [pid, ticks, pm] if *pm == u64::from(postmaster) => {
            u32::try_from(*pid).is_ok_and(|pid| procinfo::same_process_alive(pid, *ticks))
        }
        _ => false,
    }
}

/// What the data directory's `postmaster.pid` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holder {
    /// No lock file, or one naming a process that no longer exists (`postgres` removes it).
    Free,
    /// A server of this data directory whose owner is alive.
    Owned(u32),
    /// A server of this data directory whose owner is gone (or never recorded itself).
    Abandoned(u32),
    /// A process that has exited but still exists (a zombie): `postgres` would refuse to start.
    Exiting(u32),
    /// A live process that is not a server of this data directory (the pid was reused).
    Foreign(u32),
}

/// The pid on the first line of `postmaster.pid` (written first, before the server is ready).
pub(super) fn pid_file_pid(data_dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Who holds the data directory `dir/data`.
pub(super) fn holder(dir: &Path, data_dir: &Path) -> Holder {
    let Some(pid) = pid_file_pid(data_dir) else {
        return Holder::Free;
    };
    if !procinfo::exists(pid) {
        Holder::Free
    } else if !procinfo::alive(pid) {
        Holder::Exiting(pid)
    } else if !serves(pid, data_dir) {
        Holder::Foreign(pid)
    } else if owner_alive(dir, pid) {
        Holder::Owned(pid)
    } else {
        Holder::Abandoned(pid)
    }
}

/// Whether `pid` is a PostgreSQL server whose working directory is `data_dir` (the postmaster
/// changes into its data directory before it writes `postmaster.pid`).
fn serves(pid: u32, data_dir: &Path) -> bool {
    if !super::cluster::is_postgres(pid) {
        return false;
    }
    match (procinfo::cwd(pid), std::fs::canonicalize(data_dir)) {
        (Some(cwd), Ok(data)) => cwd == data,
        // Not allowed to look (another user's server cannot serve our 0700 data directory,
        // but a server is not taken for a stranger on a guess).
        _ => true,
    }
}

/// Whether `postgres` would find the data directory free of `pid`: the process has ended and
/// either is gone or no longer named by the lock file.
fn released(pid: u32, data_dir: &Path) -> bool {
    !procinfo::alive(pid) && (!procinfo::exists(pid) || pid_file_pid(data_dir) != Some(pid))
}

async fn wait_released(pid: u32, data_dir: &Path, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        if released(pid, data_dir) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Stops the server `pid` of `data_dir`, whose owner is gone, and waits until the data
/// directory is free of it; [`Error::ServerWontStop`] when it never goes.
pub(super) async fn stop_abandoned(pid: u32, data_dir: &Path) -> Result<()> {
    let began = Instant::now();
    for (signal, patience) in STOP_STEPS {
        if released(pid, data_dir) {
            break;
        }
        if signal != Signal::SIGINT {
            warn!(pid, %signal, "the abandoned server did not stop in time; signalling it again");
        }
        // Gone in between (ESRCH) is what we want; anything else shows as the wait failing.
        let _ = kill(Pid::from_raw(pid as i32), signal);
        if wait_released(pid, data_dir, patience).await {
            info!(
                pid,
                waited_ms = began.elapsed().as_millis() as u64,
                "stopped the server a process that ended had left running"
            );
            return Ok(());
        }
    }
    if released(pid, data_dir) {
        return Ok(());
    }
    Err(Error::ServerWontStop {
        pid,
        data_dir: data_dir.to_path_buf(),
        waited: duration_text(began.elapsed()),
    })
}

/// Waits for a process that has exited (a zombie named by the lock file) to disappear.
pub(super) async fn wait_exited(pid: u32, data_dir: &Path, patience: Duration) -> Result<()> {
    if wait_released(pid, data_dir, patience).await {
        return Ok(());
    }
    Err(Error::ServerWontStop {
        pid,
        data_dir: data_dir.to_path_buf(),
        waited: duration_text(patience),
    })
}

/// The record of the directory a fallback cluster directory stands in for (see
/// [`super::fallback_dir`]): its file name.
pub(super) const REQUESTED: &str = "requested";

/// Writes into the fallback directory `dir` the directory it stands in for.
pub(super) fn record_requested(dir: &Path, requested: &Path) -> Result<()> {
    let path = dir.join(REQUESTED);
    use std::os::unix::ffi::OsStrExt;
    let mut text = requested.as_os_str().as_bytes().to_vec();
    text.push(b'\n');
    std::fs::write(&path, text)
        .map_err(|e| Error::cluster_io(format!("write {}", path.display()), e))
}

/// The directory a fallback cluster directory stands in for, as recorded; `None` when there is
/// no readable record (missing, empty, not one absolute path).
pub(super) fn read_requested(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = std::fs::read(dir.join(REQUESTED)).ok()?;
    let line = bytes.strip_suffix(b"\n")?;
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(line));
    (path.is_absolute() && !line.contains(&b'\n')).then_some(path)
}
