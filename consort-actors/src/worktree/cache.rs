//! The stat cache behind [`WorkTree::file_hashes`](super::WorkTree::file_hashes), like git's
//! index: a file's content hash is reused only while the file's stat is exactly the one it was
//! hashed under, and only once that stat is safely older than the moment it was recorded.
//!
//! **Invariant:** a hash taken from the cache is the hash of the file's content now. It rests
//! on three things:
//!
//! * **Every stat field matches**: size, mtime and ctime (seconds and nanoseconds), inode,
//!   device and mode (file type and permissions). Code can put an mtime back with `utimensat`,
//!   but any change to a file (a write, a rename over it, a `utimensat`) sets its ctime to the
//!   kernel's clock, and nothing short of setting that clock can set a ctime.
//! * **Racily clean entries are read again.** Timestamps have a granularity (a kernel tick, or
//!   a second or two on some file systems), so a file changed right after it was read can keep
//!   the stat it was read under. An entry whose mtime or ctime is not older than the clock read
//!   at the start of its pass by [`RACY_MARGIN`] is re-read on every later pass, until a pass
//!   finds it safely old; only then is its hash reused. The stat recorded is the one of the
//!   open file (`fstat`), taken before its bytes are read: a change during the read leaves a
//!   newer ctime, or a racy entry.
//! * **The walk decides what is in the tree**, never the cache: an entry not seen by a pass
//!   (a file deleted, turned into a link or a directory, or skipped by the filter) leaves it.
//!   The walk is the serial walk's own listing (`list_dir`), so the same files are found under
//!   the same names.
//!
//! A pass lists, stats and reads with up to [`MAX_WORKERS`] threads (the caller's included),
//! which take directories from one queue: `lstat` is most of an observation's cost, and a
//! system call per file does not get cheaper otherwise. The workers share the entries read
//! only (marking the ones they see); what they read is recorded once they are done.
//!
//! It assumes the file system's timestamps come from this machine's clock (or one within the
//! margin of it), and that the clock is not set back by more than the margin.

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Listed, WorkTreeError, io_err, list_dir};
use crate::core::hash::ContentHash;
use crate::core::paths::TreeFilter;

/// How much older than the clock at the start of a pass a file's mtime and ctime must be for
/// its entry to be trusted on later passes: more than the coarsest timestamp granularity in
/// use (FAT's two seconds) plus the kernel's coarse clock lag (a tick).
pub(crate) const RACY_MARGIN: Duration = Duration::from_secs(3);

/// The size of the buffer a file is read through.
const READ_BUF: usize = 64 * 1024;

/// Most threads a pass walks, stats and reads with (the calling thread included).
const MAX_WORKERS: usize = 4;

/// How many files a pass finds on the calling thread alone before it starts the others.
const ALONE_UP_TO: usize = 256;

/// A time as whole seconds and nanoseconds since the epoch (seconds negative before it).
type Stamp = (i64, i64);

/// What a file's hash was taken under: every field must match for the hash to be reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    size: u64,
    mtime: Stamp,
    ctime: Stamp,
    ino: u64,
    dev: u64,
    /// File type and permission bits.
    mode: u32,
}

impl Stat {
    fn of(meta: &Metadata) -> Self {
        Stat {
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            ino: meta.ino(),
            dev: meta.dev(),
            mode: meta.mode(),
        }
    }

    /// Whether both timestamps are before `limit` (`None`: nothing is old enough).
    fn older_than(&self, limit: Option<Stamp>) -> bool {
        limit.is_some_and(|l| self.mtime < l && self.ctime < l)
    }
}

/// One file's hash and the stat it was taken under.
#[derive(Debug)]
struct Entry {
    stat: Stat,
    hash: ContentHash,
    /// Whether the stat was safely old when recorded: only then may the hash be reused.
    settled: bool,
    /// The last pass that saw the file (marked by the pass's workers, which share the map).
    seen: AtomicU64,
}

/// Relative path → the hash of the file there and the stat it was taken under. Shared by the
/// clones of a [`WorkTree`](super::WorkTree).
pub(crate) struct HashCache {
    entries: HashMap<String, Entry>,
    pass: u64,
    /// The clock a pass reads before it looks at any file (the system's; tests set their own).
    clock: Box<dyn Fn() -> SystemTime + Send>,
}

impl fmt::Debug for HashCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HashCache")
            .field("entries", &self.entries.len())
            .field("pass", &self.pass)
            .finish_non_exhaustive()
    }
}

impl Default for HashCache {
    fn default() -> Self {
        HashCache {
            entries: HashMap::new(),
            pass: 0,
            clock: Box::new(SystemTime::now),
        }
    }
}

/// One regular file a pass found: its relative and full paths and its content hash.
pub(crate) struct Found {
    pub(crate) rel: String,
    pub(crate) full: PathBuf,
    pub(crate) hash: ContentHash,
    /// The entry to record, when the file was read.
    read: Option<Entry>,
}

/// What a pass's workers share: the cache's entries (read only), the pass, the limit before
/// which a stat is settled, and the directories still to list.
struct Shared<'a> {
    entries: &'a HashMap<String, Entry>,
    pass: u64,
    settled_before: Option<Stamp>,
    filter: &'a TreeFilter,
    queue: Queue,
}

/// The directories still to list (full path, relative prefix), and how many workers are
/// listing one: the walk is over when none is left and none is busy.
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    changed: Condvar,
}

#[derive(Default)]
struct QueueState {
    dirs: Vec<(PathBuf, String)>,
    busy: usize,
    failed: bool,
}

/// A directory taken from the queue, given back as done when dropped: as a failure unless
/// its listing succeeded, so that no worker waits forever for one whose listing panicked.
struct Taken<'a> {
    queue: &'a Queue,
    failed: bool,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.queue.done(self.failed);
    }
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next directory to list, waiting while others may still find some; `None` when the
    /// walk is over or a worker failed.
    fn next(&self) -> Option<(PathBuf, String)> {
        let mut state = self.lock();
        loop {
            if state.failed {
                return None;
            }
            if let Some(dir) = state.dirs.pop() {
                state.busy += 1;
                return Some(dir);
            }
            if state.busy == 0 {
                return None;
            }
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Whether directories are left to list.
    fn has_work(&self) -> bool {
        !self.lock().dirs.is_empty()
    }

    /// More directories to list.
    fn push(&self, dirs: Vec<(PathBuf, String)>) {
        if !dirs.is_empty() {
            self.lock().dirs.extend(dirs);
            self.changed.notify_all();
        }
    }

    /// A directory taken by [`Queue::next`] is done with (`failed`: the pass stops).
    fn done(&self, failed: bool) {
        let mut state = self.lock();
        state.busy = state.busy.saturating_sub(1);
        state.failed |= failed;
        drop(state);
        self.changed.notify_all();
    }
}

impl HashCache {
    /// Hashes every regular file under `root` (as [`list_dir`] lists them, `filter` applied)
    /// through the cache, with up to [`MAX_WORKERS`] threads, and records what it read. The
    /// clock is read once, before any file is looked at. Every entry the pass did not see
    /// leaves the cache. The files come in no particular order.
    pub(crate) fn pass(
        &mut self,
        root: &Path,
        filter: &TreeFilter,
    ) -> Result<Vec<Found>, WorkTreeError> {
        self.pass = self.pass.wrapping_add(1);
        let shared = Shared {
            entries: &self.entries,
            pass: self.pass,
            settled_before: settled_before((self.clock)()),
            filter,
            queue: Queue::default(),
        };
        shared.queue.push(vec![(root.to_path_buf(), String::new())]);
        let mut found = Vec::new();
        let mut buf = Vec::new();
        // A small tree is done before a thread would have started.
        shared.work(&mut found, &mut buf, ALONE_UP_TO)?;
        if shared.queue.has_work() {
            let mut all = Vec::new();
            for part in shared.in_parallel(found, buf) {
                all.extend(part?);
            }
            found = all;
        }
        self.record(&mut found);
        Ok(found)
    }

    /// Records the entries of the files the pass read, and drops every entry it did not see.
    fn record(&mut self, found: &mut [Found]) {
        for f in found.iter_mut() {
            if let Some(entry) = f.read.take() {
                match self.entries.get_mut(&f.rel) {
                    Some(e) => *e = entry,
                    None => {
                        self.entries.insert(f.rel.clone(), entry);
                    }
                }
            }
        }
        let pass = self.pass;
        self.entries
            .retain(|_, e| e.seen.load(Ordering::Relaxed) == pass);
    }

    /// Forgets every entry (after a panic mid-pass, say).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    /// How many files the cache holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Reads the time from `clock` from now on.
    #[cfg(test)]
    pub(crate) fn set_clock(&mut self, clock: impl Fn() -> SystemTime + Send + 'static) {
        self.clock = Box::new(clock);
    }

    /// Replaces the hash held for `rel`, its stat kept: what a read torn by a concurrent
    /// write would leave.
    #[cfg(test)]
    pub(crate) fn poke(&mut self, rel: &str, hash: ContentHash) {
        if let Some(e) = self.entries.get_mut(rel) {
            e.hash = hash;
        }
    }

    /// Whether the entry of `rel` is trusted without a read.
    #[cfg(test)]
    pub(crate) fn is_settled(&self, rel: &str) -> Option<bool> {
        self.entries.get(rel).map(|e| e.settled)
    }
}

/// The stat of the file at `full` as opened (`fstat`), then the hash of its bytes.
fn read_file(full: &Path, buf: &mut Vec<u8>) -> std::io::Result<(Stat, ContentHash)> {
    let file = File::open(full)?;
    let stat = Stat::of(&file.metadata()?);
    if buf.is_empty() {
        buf.resize(READ_BUF, 0);
    }
    Ok((stat, ContentHash::of_reader(file, buf)?))
}

/// The limit before which a stat is settled, for a pass that read the clock at `now`.
fn settled_before(now: SystemTime) -> Option<Stamp> {
    let d = now
        .checked_sub(RACY_MARGIN)?
        .duration_since(UNIX_EPOCH)
        .ok()?;
    Some((
        i64::try_from(d.as_secs()).ok()?,
        i64::from(d.subsec_nanos()),
    ))
}

impl Shared<'_> {
    /// One worker: lists directories from the queue, hashing their files, until the walk is
    /// over or it has found `until` files. A failure stops every worker.
    fn work(
        &self,
        found: &mut Vec<Found>,
        buf: &mut Vec<u8>,
        until: usize,
    ) -> Result<(), WorkTreeError> {
        while found.len() < until
            && let Some((dir, prefix)) = self.queue.next()
        {
            let mut taken = Taken {
                queue: &self.queue,
                failed: true,
            };
            let result = self.list(&dir, &prefix, found, buf);
            taken.failed = result.is_err();
            drop(taken);
            result?;
        }
        Ok(())
    }

    /// Finishes the walk with up to [`MAX_WORKERS`] threads, this one (which found `found`
    /// so far) included. One result per thread; this thread's holds `found` too.
    fn in_parallel(
        &self,
        mut found: Vec<Found>,
        mut buf: Vec<u8>,
    ) -> Vec<Result<Vec<Found>, WorkTreeError>> {
        let workers = std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .clamp(1, MAX_WORKERS);
        std::thread::scope(|scope| {
            let helpers: Vec<_> = (1..workers)
                .map(|_| {
                    scope.spawn(|| {
                        let (mut found, mut buf) = (Vec::new(), Vec::new());
                        self.work(&mut found, &mut buf, usize::MAX).map(|()| found)
                    })
                })
                .collect();
            let mine = self.work(&mut found, &mut buf, usize::MAX);
            let mut results = vec![mine.map(|()| found)];
            for helper in helpers {
                let result = helper
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                results.push(result);
            }
            results
        })
    }

    /// Lists one directory: its subdirectories go to the queue, its files are hashed.
    fn list(
        &self,
        dir: &Path,
        prefix: &str,
        found: &mut Vec<Found>,
        buf: &mut Vec<u8>,
    ) -> Result<(), WorkTreeError> {
        let listed = list_dir(dir, prefix, self.filter)?;
        let mut files = Vec::with_capacity(listed.len());
        let mut dirs = Vec::new();
        for item in listed {
            match item {
                Listed::Dir(path, rel) => dirs.push((path, rel)),
                Listed::File(rel, entry) => files.push((rel, entry)),
            }
        }
        self.queue.push(dirs);
        for (rel, entry) in files {
            found.push(self.hash(rel, &entry, buf)?);
        }
        Ok(())
    }

    /// The hash of the regular file `rel`: the cached one when its entry is settled and every
    /// field of the file's `lstat` matches, otherwise read, with the stat of the file opened
    /// (`fstat`, before its bytes) to record.
    fn hash(
        &self,
        rel: String,
        entry: &fs::DirEntry,
        buf: &mut Vec<u8>,
    ) -> Result<Found, WorkTreeError> {
        let full = entry.path();
        let meta = entry.metadata().map_err(io_err("inspect", &full))?;
        if let Some(e) = self.entries.get(&rel)
            && e.settled
            && e.stat == Stat::of(&meta)
        {
            e.seen.store(self.pass, Ordering::Relaxed);
            let hash = e.hash;
            return Ok(Found {
                rel,
                full,
                hash,
                read: None,
            });
        }
        let (stat, hash) = read_file(&full, buf).map_err(io_err("read", &full))?;
        let entry = Entry {
            stat,
            hash,
            settled: stat.older_than(self.settled_before),
            seen: AtomicU64::new(self.pass),
        };
        Ok(Found {
            rel,
            full,
            hash,
            read: Some(entry),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(mtime: Stamp, ctime: Stamp) -> Stat {
        Stat {
            size: 1,
            mtime,
            ctime,
            ino: 1,
            dev: 1,
            mode: 0o100644,
        }
    }

    #[test]
    fn an_entry_is_settled_only_when_both_times_are_before_the_limit() {
        let limit = Some((100, 500));
        assert!(stat((99, 0), (100, 499)).older_than(limit));
        assert!(stat((-5, 0), (-5, 0)).older_than(limit), "before the epoch");
        for (mtime, ctime, limit, why) in [
            ((100, 500), (99, 0), limit, "mtime at the limit"),
            ((99, 0), (100, 500), limit, "ctime at the limit"),
            ((200, 0), (99, 0), limit, "mtime in the future"),
            ((0, 0), (0, 0), None, "no clock: nothing settles"),
        ] {
            assert!(!stat(mtime, ctime).older_than(limit), "{why}");
        }
    }

    #[test]
    fn the_queue_ends_the_walk_when_nothing_is_left_or_a_worker_failed() {
        let job = |n: &str| (PathBuf::from(n), String::new());
        for failed in [false, true] {
            let queue = Queue::default();
            queue.push(vec![job("a"), job("b")]);
            assert!(queue.next().is_some() && queue.next().is_some());
            std::thread::scope(|scope| {
                // Nothing is queued but two directories are being listed: this one waits.
                let waiting = scope.spawn(|| queue.next());
                queue.done(failed);
                if !failed {
                    queue.push(vec![job("c")]);
                }
                queue.done(false);
                let got = waiting.join().expect("the waiting worker");
                assert_eq!(got.is_some(), !failed, "failed: {failed}");
                if got.is_some() {
                    queue.done(false);
                }
            });
            assert!(queue.next().is_none(), "the walk is over");
        }
    }

    #[test]
    fn a_clock_before_the_epoch_settles_nothing() {
        assert_eq!(settled_before(UNIX_EPOCH), None);
        assert_eq!(
            settled_before(UNIX_EPOCH + Duration::from_millis(10_250)),
            Some((7, 250_000_000))
        );
    }
}
