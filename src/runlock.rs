//! One run per project: the run lock, `.consort/run.lock`.
//!
//! Whatever drives a project (`consort run`, the StockFlow example, any run
//! [`Project::ensemble`](crate::Project::ensemble) builds) holds an exclusive `flock(2)` on this
//! file for as long as it drives it, and the commands that write the ledger (`consort approve`,
//! `reject`, `retry`, `stop`) hold it while they write. A second one is refused before it touches
//! anything, with a message naming the holder. Commands that only read (`status`, `log`,
//! `verify`, `branches`) never take it.
//!
//! Whoever holds the lock writes a one-line holder record into the file — its PID, since when
//! (RFC 3339) and the command — so that a refusal can say who holds the project. The record is
//! only a label: the flock is the truth. The kernel releases the flock when its holder dies, so a
//! lock left by a killed process is simply taken by the next command, which overwrites the stale
//! record. The record is untrusted input: a missing, garbled or oversized record never stops
//! anyone, and it is shown only after control characters are replaced.
//!
//! The file is never deleted (deleting a lock file lets two processes lock two different files);
//! a holder that ends normally empties it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// Where the run lock lives, relative to the project directory.
pub const RUN_LOCK_FILE: &str = ".consort/run.lock";

/// Most bytes of a holder record read; a longer file is garbled.
const MAX_RECORD_BYTES: u64 = 4096;
/// Most characters of a holder's command shown.
const MAX_COMMAND_CHARS: usize = 200;
/// A holder writes its record right after it locks: how often, and how far apart, a refused
/// command looks again before it reports an unnamed holder.
const RECORD_READS: u32 = 5;
const RECORD_READ_PAUSE: Duration = Duration::from_millis(20);

/// Who holds (or held) a project's run lock, as its holder record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's process id.
    pub pid: u32,
    /// When it took the lock.
    pub since: DateTime<Utc>,
    /// The command it runs (`consort run`, `consort approve`, …).
    pub command: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PID {}, since {}, `{}`",
            self.pid,
            self.since.to_rfc3339_opts(SecondsFormat::Secs, true),
            self.command
        )
    }
}

/// The holder record as written in the lock file: one JSON line.
#[derive(Serialize, Deserialize)]
struct Record {
    pid: u32,
    since: String,
    command: String,
}

impl Holder {
    /// This process, running `command`, from now.
    fn this_process(command: &str) -> Holder {
        Holder {
            pid: std::process::id(),
            // Whole seconds, as the record keeps it.
            since: Utc::now().trunc_subsecs(0),
            command: shown(command),
        }
    }

    /// The record's line (JSON, newline-terminated).
    fn to_line(&self) -> Result<String, serde_json::Error> {
        let record = Record {
            pid: self.pid,
            since: self.since.to_rfc3339_opts(SecondsFormat::Secs, true),
            command: self.command.clone(),
        };
        Ok(format!("{}\n", serde_json::to_string(&record)?))
    }

    /// Reads a holder record; `None` when it is empty, garbled or names no process.
    pub fn parse(bytes: &[u8]) -> Option<Holder> {
        let record: Record = serde_json::from_slice(bytes.trim_ascii()).ok()?;
        let since = DateTime::parse_from_rfc3339(&record.since).ok()?;
        (record.pid > 0).then(|| Holder {
            pid: record.pid,
            since: since.with_timezone(&Utc),
            command: shown(&record.command),
        })
    }
}

/// A command as it may be shown: control characters replaced, at most [`MAX_COMMAND_CHARS`].
fn shown(command: &str) -> String {
    command
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(MAX_COMMAND_CHARS)
        .collect()
}

/// Why the run lock could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunLockError {
    /// Another process holds the project or the feature, and its record names it.
    #[error("another consort run ({holder}) holds {scope}; wait for it or stop it")]
    Held {
        /// Who holds it.
        holder: Holder,
        /// What it holds.
        scope: LockScope,
    },
    /// Another process holds the project or the feature, but its record does not say which.
    #[error(
        "another consort run holds {scope} (its lock file {} does not name it); wait for it or stop it",
        path.display()
    )]
    HeldByUnnamed {
        /// The lock file.
        path: PathBuf,
        /// What it holds.
        scope: LockScope,
    },
    /// The lock file could not be opened, locked or written.
    #[error("run lock {}: cannot {what}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What failed.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// What a lock holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockScope {
    /// The whole project: a run in the project's own work tree, or a change to its backlog.
    Project,
    /// One feature: the lane that drives it (see [`crate::lanes`]).
    Feature(String),
    /// The project's merges: one lane merges and promotes at a time.
    Merges,
    /// The project's lane worktrees: one process makes or removes one at a time.
    Worktrees,
}

impl std::fmt::Display for LockScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockScope::Project => f.write_str("this project"),
            LockScope::Feature(id) => write!(f, "feature {id}"),
            LockScope::Merges => f.write_str("this project's merges"),
            LockScope::Worktrees => f.write_str("this project's lane worktrees"),
        }
    }
}

/// The run lock of one project or one feature, held until dropped (then its record is emptied and the flock
/// released).
#[derive(Debug)]
pub struct RunLock {
    file: Option<Flock<File>>,
    path: PathBuf,
    holder: Holder,
}

impl RunLock {
    /// Takes the run lock of the project in `project_dir` for `command`, without waiting.
    ///
    /// Refused with [`RunLockError::Held`] (or [`RunLockError::HeldByUnnamed`]) when another
    /// process holds it; nothing is written then. A record left by a process that no longer
    /// holds the lock — killed, say — is overwritten.
    pub fn acquire(project_dir: &Path, command: &str) -> Result<RunLock, RunLockError> {
        Self::acquire_at(project_dir.join(RUN_LOCK_FILE), LockScope::Project, command)
    }

    /// Takes the lock file at `path`, which holds `scope`, as [`RunLock::acquire`] does.
    pub fn acquire_at(
        path: PathBuf,
        scope: LockScope,
        command: &str,
    ) -> Result<RunLock, RunLockError> {
        let io = |what: &'static str| {
            let path = path.clone();
            move |source: std::io::Error| RunLockError::Io { path, what, source }
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io("create its directory"))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io("open it"))?;
        let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => locked,
            Err((file, Errno::EWOULDBLOCK)) => return Err(held_by(file, path, scope)),
            Err((_, errno)) => return Err(io("lock it")(errno.into())),
        };
        if let Some(stale) = read_record(&mut file) {
            tracing::info!(%stale, "taking over a run lock its holder no longer holds");
        }
        let holder = Holder::this_process(command);
        write_record(&mut file, &holder).map_err(io("write the holder record"))?;
        Ok(RunLock {
            file: Some(file),
            path,
            holder,
        })
    }

    /// Takes the lock file at `path` as [`RunLock::acquire_at`] does, waiting (a short sleep
    /// between tries, at most `patience`) while another process holds it.
    pub fn wait_at(
        path: PathBuf,
        scope: LockScope,
        command: &str,
        patience: std::time::Duration,
    ) -> Result<RunLock, RunLockError> {
        let started = std::time::Instant::now();
        loop {
            match Self::acquire_at(path.clone(), scope.clone(), command) {
                Err(RunLockError::Held { .. } | RunLockError::HeldByUnnamed { .. })
                    if started.elapsed() < patience =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    /// Who holds the lock: this process.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let Some(file) = self.file.take() else {
            return;
        };
        // Empty the record before unlocking, so no one reads a finished holder as the owner.
        let _ = file.set_len(0);
        if let Err((locked, errno)) = file.unlock() {
            // Unreachable in practice (the descriptor is ours); the kernel releases the lock
            // when the process ends. Forgetting it avoids the panic of `Flock`'s own drop.
            tracing::warn!(%errno, path = %self.path.display(), "cannot release the run lock");
            std::mem::forget(locked);
        }
    }
}

/// The refusal for a lock someone else holds, naming the holder when its record says who.
fn held_by(mut file: File, path: PathBuf, scope: LockScope) -> RunLockError {
    for attempt in 0..RECORD_READS {
        if let Some(holder) = read_record(&mut file) {
            return RunLockError::Held { holder, scope };
        }
        if attempt + 1 < RECORD_READS {
            std::thread::sleep(RECORD_READ_PAUSE);
        }
    }
    RunLockError::HeldByUnnamed { path, scope }
}

/// The holder record in `file`, if it holds a readable one.
fn read_record(file: &mut File) -> Option<Holder> {
    file.seek(SeekFrom::Start(0)).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return None;
    }
    Holder::parse(&bytes)
}

/// Replaces the record in `file` with `holder`'s, on disk before the lock is used.
fn write_record(file: &mut File, holder: &Holder) -> std::io::Result<()> {
    let line = holder.to_line().map_err(std::io::Error::other)?;
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(line.as_bytes())?;
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(dir: &Path) -> Vec<u8> {
        std::fs::read(dir.join(RUN_LOCK_FILE)).unwrap_or_default()
    }

    #[test]
    fn the_holder_is_recorded_and_a_second_taker_is_refused_by_name() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let lock = RunLock::acquire(tmp.path(), "consort run").expect("free");
        let on_disk = Holder::parse(&record(tmp.path())).expect("a readable record");
        assert_eq!(&on_disk, lock.holder());
        assert_eq!(on_disk.pid, std::process::id());
        assert_eq!(on_disk.command, "consort run");

        let before = record(tmp.path());
        let err = RunLock::acquire(tmp.path(), "consort approve").expect_err("held");
        let RunLockError::Held { holder, .. } = &err else {
            panic!("expected Held, got {err:?}")
        };
        assert_eq!(holder, lock.holder());
        assert_eq!(record(tmp.path()), before, "a refused taker writes nothing");
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "another consort run (PID {}, since ",
                std::process::id()
            )) && message.ends_with(", `consort run`) holds this project; wait for it or stop it"),
            "{message}"
        );

        drop(lock);
        assert!(record(tmp.path()).is_empty(), "a released lock is emptied");
        let again = RunLock::acquire(tmp.path(), "consort stop").expect("free again");
        assert_eq!(again.holder().command, "consort stop");
    }

    #[test]
    fn the_message_shows_the_time_in_rfc3339_seconds() {
        let holder = Holder::parse(
            br#"{"pid":1234,"since":"2026-12-01T09:30:00.123+00:00","command":"consort run"}"#,
        )
        .expect("parses");
        assert_eq!(
            RunLockError::Held {
                holder,
                scope: LockScope::Project
            }
            .to_string(),
            "another consort run (PID 1234, since 2026-12-01T09:30:00Z, `consort run`) holds \
             this project; wait for it or stop it"
        );
    }

    #[test]
    fn a_stale_or_garbled_record_without_a_holder_is_taken_over() {
        let stale = br#"{"pid":999999999,"since":"2026-01-01T00:00:00Z","command":"consort run"}"#;
        let garbled: &[&[u8]] = &[stale, b"\xff\xfe not json \x00", b"", &[b'x'; 10_000]];
        for content in garbled {
            let tmp = tempfile::tempdir().expect("tempdir");
            std::fs::create_dir_all(tmp.path().join(".consort")).expect("mkdir");
            std::fs::write(tmp.path().join(RUN_LOCK_FILE), content).expect("seed");
            let lock = RunLock::acquire(tmp.path(), "consort run").expect("taken over");
            let on_disk = Holder::parse(&record(tmp.path())).expect("overwritten");
            assert_eq!(on_disk.pid, std::process::id());
            drop(lock);
        }
    }

    #[test]
    fn a_held_lock_with_a_garbled_record_is_still_refused_without_a_name() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let lock = RunLock::acquire(tmp.path(), "consort run").expect("free");
        std::fs::write(tmp.path().join(RUN_LOCK_FILE), b"\x1b[2Jgarbage").expect("garble");
        let err = RunLock::acquire(tmp.path(), "consort run").expect_err("held");
        assert!(matches!(err, RunLockError::HeldByUnnamed { .. }), "{err:?}");
        assert!(err.to_string().contains("does not name it"), "{err}");
        drop(lock);
    }

    #[test]
    fn a_recorded_command_is_shown_without_control_characters_and_bounded() {
        let long = format!("consort run\u{1b}[31m\n{}", "y".repeat(1000));
        let line = format!(
            r#"{{"pid":7,"since":"2026-01-01T00:00:00Z","command":{}}}"#,
            serde_json::to_string(&long).expect("json")
        );
        let holder = Holder::parse(line.as_bytes()).expect("parses");
        assert!(holder.command.starts_with("consort run?[31m?y"));
        assert!(!holder.command.chars().any(char::is_control));
        assert_eq!(holder.command.chars().count(), MAX_COMMAND_CHARS);
        assert_eq!(
            Holder::parse(br#"{"pid":0,"since":"2026-01-01T00:00:00Z","command":"x"}"#),
            None,
            "PID 0 names no process"
        );
        assert_eq!(
            Holder::parse(br#"{"pid":7,"since":"yesterday","command":"x"}"#),
            None
        );
    }

    #[test]
    fn an_unusable_lock_path_is_a_typed_error() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(tmp.path().join(RUN_LOCK_FILE)).expect("a directory in its place");
        let err = RunLock::acquire(tmp.path(), "consort run").expect_err("unusable");
        assert!(matches!(err, RunLockError::Io { .. }), "{err:?}");
        assert!(err.to_string().contains("run.lock"), "{err}");
    }
}
