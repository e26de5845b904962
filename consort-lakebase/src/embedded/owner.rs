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

use crate::error::{ClusterError, Error, Result, duration_text};
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
            // Nothing is read or written through it: the lock is all it is for.
            let file = OpenOptions::new()
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
                    return Err(ClusterError::StartLockHeld {
                        dir: dir.to_path_buf(),
                        waited: patience,
                    }
                    .into());
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
    let (pid, ticks) = procinfo::me().ok_or(ClusterError::NoStartTime)?;
    let path = dir.join(OWNER);
    std::fs::write(&path, format!("{pid} {ticks} {postmaster}\n"))
        .map_err(|e| Error::cluster_io(format!("write {}", path.display()), e))
}

/// Whether the process recorded as the owner of `postmaster` in `dir` is alive. No record, a
/// record of another server or an unreadable one: no live owner.
pub(super) fn owner_alive(dir: &Path, postmaster: u32) -> bool {
    match procinfo::read_numbers(&dir.join(OWNER)).as_deref() {
        Some([pid, ticks, pm]) if *pm == u64::from(postmaster) => {
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
    /// A lock file that names no pid (empty or unparsable) while no server process works in
    /// the data directory: what a server killed between creating its lock file and writing
    /// it leaves. `postgres` refuses to start over it ("lock file is empty"); it is stale.
    Stale,
}

/// The lock file's name in a data directory.
const PID_FILE: &str = "postmaster.pid";

/// What the data directory's lock file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LockFile {
    /// There is none.
    Absent,
    /// Its first line is this pid.
    Pid(u32),
    /// It exists but names no pid: empty (a server between creating and writing it, or
    /// killed there), garbled, or unreadable.
    Garbled,
}

fn lock_file(data_dir: &Path) -> LockFile {
    match std::fs::read_to_string(data_dir.join(PID_FILE)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => LockFile::Absent,
        Err(_) => LockFile::Garbled,
        Ok(text) => match text.lines().next().map(|l| l.trim().parse::<u32>()) {
            Some(Ok(pid)) if pid > 0 => LockFile::Pid(pid),
            _ => LockFile::Garbled,
        },
    }
}

/// The pid on the first line of `postmaster.pid` (written first, before the server is ready).
pub(super) fn pid_file_pid(data_dir: &Path) -> Option<u32> {
    match lock_file(data_dir) {
        LockFile::Pid(pid) => Some(pid),
        LockFile::Absent | LockFile::Garbled => None,
    }
}

/// The postmaster of a `postgres` process working in `data_dir`, if any. The postmaster
/// changes into its data directory before it creates its lock file, so a server that is
/// writing (or about to write) the lock file is found here. A process whose working directory
/// cannot be read is another user's (only when this process is not root), and `postgres`
/// never runs as root: it cannot enter our `0700` data directory, so it is not counted.
fn server_in(data_dir: &Path) -> Option<u32> {
    let pids: Vec<u32> = procinfo::with_cwd(data_dir)
        .into_iter()
        .filter(|pid| super::cluster::is_postgres(*pid))
        .collect();
    // The postmaster is the one whose parent is not itself a server of the directory (its
    // children, the backends, share its working directory).
    pids.iter()
        .copied()
        .find(|pid| procinfo::parent_of(*pid).is_none_or(|pp| !pids.contains(&pp)))
}

/// Who holds the data directory `dir/data`.
pub(super) fn holder(dir: &Path, data_dir: &Path) -> Holder {
    let pid = match lock_file(data_dir) {
        LockFile::Absent => return Holder::Free,
        LockFile::Pid(pid) => pid,
        LockFile::Garbled => match server_in(data_dir) {
            Some(pid) => pid,
            None => return Holder::Stale,
        },
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

/// Removes a stale lock file (see [`Holder::Stale`]) of `dir/data`; `Ok(false)` when the lock
/// file is not stale (any more). Safe against a live server: it is looked at again just before
/// the removal, and a server starting after that look cannot create its own lock file while
/// this one exists (`postgres` creates it with `O_EXCL`), so the file removed is never a live
/// server's.
pub(super) fn remove_stale_lock(dir: &Path, data_dir: &Path) -> Result<bool> {
    if holder(dir, data_dir) != Holder::Stale {
        return Ok(false);
    }
    let path = data_dir.join(PID_FILE);
    warn!(
        path = %path.display(),
        "removing a lock file that names no server while no server works in the data directory (left by a server killed in its start-up)"
    );
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(Error::cluster_io(format!("remove {}", path.display()), e)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command, Stdio};

    /// A cluster directory (`dir`, `dir/data`) whose lock file holds `content`.
    fn with_lock_file(content: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let root = tempfile::tempdir().expect("a temporary directory");
        let dir = root.path().to_path_buf();
        let data = dir.join("data");
        std::fs::create_dir(&data).expect("the data directory");
        std::fs::write(data.join(PID_FILE), content).expect("the lock file");
        (root, dir, data)
    }

    /// A process named `postgres` that works in `data_dir` and writes nothing: a server caught
    /// between creating its lock file and writing it.
    fn server_in_start_up(data_dir: &Path, scratch: &Path) -> Child {
        let exe = scratch.join("postgres");
        let sleep = ["/usr/bin/sleep", "/bin/sleep"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("a sleep program");
        std::fs::copy(sleep, &exe).expect("copy sleep as postgres");
        Command::new(&exe)
            .arg("600")
            .current_dir(data_dir)
            .stdin(Stdio::null())
            .spawn()
            .expect("start the stand-in server")
    }

    #[test]
    fn a_lock_file_naming_no_pid_with_no_server_is_stale_and_removed() {
        for content in ["", "\n", "garbage\n", "0\n"] {
            let (_root, dir, data) = with_lock_file(content);
            assert_eq!(holder(&dir, &data), Holder::Stale, "lock file {content:?}");
            assert!(remove_stale_lock(&dir, &data).expect("removal"));
            assert!(
                !data.join(PID_FILE).exists(),
                "lock file {content:?} removed"
            );
            assert_eq!(holder(&dir, &data), Holder::Free);
        }
    }

    #[test]
    fn an_empty_lock_file_of_a_server_in_its_start_up_is_never_removed() {
        let (root, dir, data) = with_lock_file("");
        let mut server = server_in_start_up(&data, root.path());
        let pid = server.id();
        let seen = holder(&dir, &data);
        let kept = remove_stale_lock(&dir, &data);
        let _ = server.kill();
        let _ = server.wait();
        assert_eq!(
            seen,
            Holder::Abandoned(pid),
            "a server working in the data directory holds it, lock file written or not"
        );
        assert!(
            !kept.expect("no error"),
            "not removed while a server may write it"
        );
        assert!(data.join(PID_FILE).exists());
        // Once that server is gone, the empty file is a remnant.
        assert_eq!(holder(&dir, &data), Holder::Stale);
        assert!(remove_stale_lock(&dir, &data).expect("removal"));
        assert!(!data.join(PID_FILE).exists());
    }

    #[test]
    fn a_written_lock_file_is_never_stale() {
        let (_root, dir, data) = with_lock_file(&format!("{}\n", std::process::id()));
        assert_ne!(holder(&dir, &data), Holder::Stale);
        assert!(!remove_stale_lock(&dir, &data).expect("no error"));
        assert!(data.join(PID_FILE).exists());
    }
}
