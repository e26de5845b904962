//! The append-only, hash-chained ledger: Consort's durable record of a run.
//!
//! A ledger is a JSON Lines file (by default [`DEFAULT_LEDGER_PATH`], `.consort/ledger.jsonl` in
//! the project). Every line is one [`Entry`]:
//!
//! ```text
//! {"event":{…},"hash":"…64 hex…","prev":"…64 hex…","seq":1,"time":"2025-01-01T00:00:00.000000Z"}
//! ```
//!
//! * `seq` counts from 1 without gaps;
//! * `time` is the RFC 3339 UTC time of the append;
//! * `prev` is the `hash` of the previous entry ([`GENESIS_HEX`], 64 zeros, for the first);
//! * `hash` is the SHA-256 of the canonical JSON ([`canonical_json`](crate::core::hash::canonical_json)) of the object
//!   `{"event", "prev", "seq", "time"}` — exactly the values written on the line, so the check
//!   never depends on how a type re-serialises;
//! * `event` is the caller's event type `E`.
//!
//! # Guarantees
//!
//! * **Write-ahead.** [`Ledger::append`] writes one whole line and calls `sync_data` before it
//!   returns: an event whose append returned `Ok` survives a crash, so "every event is appended
//!   and fsynced before it takes effect" holds as long as callers act only after `append`
//!   returns.
//! * **Tamper evidence.** [`Ledger::verify`] recomputes the whole chain and reports the *first*
//!   bad line by its 1-based line number: an edited field, an edited hash, a deleted, inserted or
//!   swapped line, a wrong sequence number, unparsable JSON, an unknown field, or an event that
//!   does not match `E`. (Deleting the *last* lines cannot be detected by any hash chain without
//!   an outside anchor; keep [`Ledger::head`] elsewhere if that matters.) Because the hash is
//!   over the canonical form, turning a `\n` inside an event string into `\r\n` does not change
//!   the hash — by design, the same equivalence the artifact hashes use.
//! * **Crash recovery.** A crash in the middle of a write can leave a last line without its
//!   newline. [`Ledger::open`] (and the next append) repairs it: an unparsable, newline-less
//!   tail is a torn write and is truncated away with a warning; a newline-less tail that is a
//!   complete, valid next entry (the crash hit between the last byte and the newline) is kept
//!   and terminated. A newline-less tail that parses but does not verify is not something a
//!   crash can produce, and is an error. Any bad line that is not the tail is an error.
//! * **One writer at a time, many processes.** Every operation takes an advisory `flock` on the
//!   ledger file for its own duration only (exclusive to append or repair, shared to read), so
//!   a CLI command such as `consort approve` can append while a run holds the ledger open.
//!   Before appending, the writer re-reads and verifies whatever other processes (or other
//!   handles in this process) appended since it last looked; those entries become visible in
//!   [`Ledger::entries`], and [`Ledger::refresh`] picks them up without appending. A lock that
//!   stays held longer than [`LedgerOptions::lock_timeout`] gives [`LedgerError::Locked`].
//!   A handle keeps its file open between appends; when the path has come to name another file
//!   (the ledger was replaced), the next append opens the path again and judges that file.
//! * **Untrusted input.** The file is read with a line-length cap
//!   ([`LedgerOptions::max_line_bytes`], 64 MiB by default); a longer line, invalid UTF-8,
//!   hostile JSON or anything else gives a typed [`LedgerError`], never a panic.
//!
//! The API is synchronous (plain `std::fs` and `fsync`); from async code call it directly for
//! the occasional event, or through `tokio::task::spawn_blocking` when the lock may be contended.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::core::hash::ContentHash;
use crate::core::sorted_json::{self, Strings};

/// The ledger's default location, relative to the project root.
pub const DEFAULT_LEDGER_PATH: &str = ".consort/ledger.jsonl";

/// The `prev` of the first entry: 64 zeros.
pub const GENESIS_HEX: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The default cap on one line's length: 64 MiB (a shared store reads its rows with the same).
pub const DEFAULT_MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// The default time to wait for another process's lock: 30 s.
pub(crate) const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest excerpt of a parser's message kept in an error.
const MAX_REASON_CHARS: usize = 300;

/// The fixed field names of a line.
const FIELDS: [&str; 5] = ["event", "hash", "prev", "seq", "time"];

/// The hash every chain starts from: 32 zero bytes ([`GENESIS_HEX`]).
pub(crate) const GENESIS: ContentHash = ContentHash::from_raw([0; 32]);

/// The hash every chain starts from (`GENESIS`, written [`GENESIS_HEX`]).
pub fn genesis() -> ContentHash {
    GENESIS
}

/// One recorded event with its place in the chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry<E> {
    /// Position in the ledger, from 1, without gaps.
    pub seq: u64,
    /// When the entry was appended (UTC).
    pub time: DateTime<Utc>,
    /// The hash of the previous entry ([`genesis`] for the first).
    pub prev: ContentHash,
    /// SHA-256 of the canonical JSON of `{event, prev, seq, time}`.
    pub hash: ContentHash,
    /// The event.
    pub event: E,
}

/// Everything that can go wrong with a ledger.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The file or its directory could not be read, written, locked or synced.
    #[error("ledger {path}: cannot {op}")]
    Io {
        /// The ledger file.
        path: PathBuf,
        /// What was being done ("open", "read", "append", …).
        op: &'static str,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// A line is not a well-formed entry (not JSON, a missing or unknown field, a field of the
    /// wrong type, a bad time or hash, or an event that does not match the event type).
    #[error("ledger line {line}: {reason}")]
    BadLine {
        /// The 1-based line number.
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A well-formed line does not continue the chain (wrong sequence number, a `prev` that does
    /// not link to the previous entry, or a `hash` that does not match the contents).
    #[error("ledger chain broken at line {line}: {reason}")]
    ChainBroken {
        /// The 1-based line number.
        line: u64,
        /// How the chain breaks there.
        reason: String,
    },
    /// A line is longer than the configured cap.
    #[error("ledger line {line} is longer than {limit} bytes")]
    LineTooLong {
        /// The 1-based line number.
        line: u64,
        /// The cap in bytes.
        limit: usize,
    },
    /// Another process (or handle) held the ledger's lock for longer than the lock timeout.
    #[error("ledger {path} is locked by another writer (waited {})", crate::core::text::duration_text(*waited))]
    Locked {
        /// The ledger file.
        path: PathBuf,
        /// How long this call waited.
        waited: Duration,
    },
    /// The file is shorter than the part this handle already read: someone truncated or
    /// replaced it behind the ledger's back.
    #[error("ledger {path} shrank from {known} to {found} bytes since it was read")]
    Truncated {
        /// The ledger file.
        path: PathBuf,
        /// Bytes this handle had already verified.
        known: u64,
        /// The file's length now.
        found: u64,
    },
    /// The event cannot be recorded (it does not serialise to JSON, or its line would be
    /// longer than the line cap). Nothing was written.
    #[error("event cannot be recorded: {reason}")]
    Event {
        /// Why.
        reason: String,
    },
}

impl LedgerError {
    /// The 1-based line number the error is about, when it is about one line.
    pub fn line(&self) -> Option<u64> {
        match self {
            LedgerError::BadLine { line, .. }
            | LedgerError::ChainBroken { line, .. }
            | LedgerError::LineTooLong { line, .. } => Some(*line),
            _ => None,
        }
    }
}

/// Tunables of a ledger handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerOptions {
    /// The longest line accepted when reading, and the longest line an append may write.
    pub max_line_bytes: usize,
    /// How long to wait for a lock held by another process or handle.
    pub lock_timeout: Duration,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        LedgerOptions {
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        }
    }
}

/// The result of a successful [`Ledger::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Number of valid entries (complete lines).
    pub entries: u64,
    /// The hash of the last entry ([`genesis`] when the ledger is empty).
    pub head: ContentHash,
    /// Bytes of a newline-less last line left by a crash mid-write, if any. [`Ledger::open`]
    /// repairs it; it is not counted in `entries`.
    pub torn_tail_bytes: Option<u64>,
}

/// Where a reader stands in the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tip {
    /// Sequence number of the last entry read (0 when none).
    seq: u64,
    /// Hash of the last entry read (genesis when none).
    hash: ContentHash,
    /// Byte offset just after the last complete line read.
    offset: u64,
    /// Complete lines read.
    lines: u64,
}

impl Tip {
    fn start() -> Self {
        Tip {
            seq: 0,
            hash: genesis(),
            offset: 0,
            lines: 0,
        }
    }
}

/// What follows the last complete line.
enum Tail<E> {
    /// Nothing: the file ends with a newline (or is empty).
    Clean,
    /// An unparsable, newline-less fragment: a torn write.
    Torn { start: u64, len: u64 },
    /// A complete, valid next entry that lacks only its newline.
    Unterminated { entry: Entry<E>, len: u64 },
}

/// The result of reading a ledger from some tip to its end.
struct Scan<E> {
    entries: Vec<Entry<E>>,
    tip: Tip,
    tail: Tail<E>,
}

/// An open, verified ledger, positioned for appending.
///
/// The handle keeps every entry read or written in memory ([`Ledger::entries`]), and keeps its
/// file open between appends. It holds no lock between calls; see the module documentation for
/// the locking protocol.
#[derive(Debug)]
pub struct Ledger<E> {
    path: PathBuf,
    options: LedgerOptions,
    entries: Vec<Entry<E>>,
    tip: Tip,
    /// The file, open for appending, unlocked (None after a failed operation: reopened next).
    file: Option<File>,
    _event: PhantomData<fn() -> E>,
}

impl<E: Serialize + DeserializeOwned + Clone> Ledger<E> {
    /// Opens the ledger at `path` with default options, creating the file and its directory
    /// when missing, verifying the existing chain and repairing a torn last line.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        Self::open_with(path, LedgerOptions::default())
    }

    /// [`Ledger::open`] with explicit options.
    pub fn open_with(path: impl AsRef<Path>, options: LedgerOptions) -> Result<Self, LedgerError> {
        let path = path.as_ref().to_path_buf();
        let created = ensure_file(&path)?;
        let file = open_rw(&path)?;
        lock(&file, &path, true, options.lock_timeout)?;
        let scan = scan::<E>(&file, &path, Tip::start(), options.max_line_bytes)?;
        let mut ledger = Ledger {
            path,
            options,
            entries: scan.entries,
            tip: scan.tip,
            file: None,
            _event: PhantomData,
        };
        ledger.repair_tail(&file, scan.tail)?;
        ledger.keep(file);
        if created {
            tracing::info!(path = %ledger.path.display(), "created a new ledger");
        }
        Ok(ledger)
    }

    /// Appends one event: re-reads whatever others appended since this handle last looked,
    /// writes one line, fsyncs it, and returns the recorded entry (the one now last in
    /// [`Ledger::entries`]).
    ///
    /// When this returns `Ok`, the entry is on disk. On `Err` nothing was recorded (a partial
    /// line from a failed write is repaired by the next open or append).
    pub fn append(&mut self, event: &E) -> Result<&Entry<E>, LedgerError> {
        // On any error below, `file` is closed (which releases the lock) and reopened next time.
        let file = self.take_file()?;
        lock(&file, &self.path, true, self.options.lock_timeout)?;
        self.catch_up(&file, true)?;

        let seq = self.tip.seq + 1;
        // Microseconds, as written, so the returned entry equals the one read back later.
        let time = Utc::now().trunc_subsecs(6);
        let prev = self.tip.hash;
        let (mut line, hash) = entry_line(event, seq, prev, time)?;
        if line.len() > self.options.max_line_bytes {
            return Err(LedgerError::Event {
                reason: format!(
                    "its line would be {} bytes, over the {}-byte cap",
                    line.len(),
                    self.options.max_line_bytes
                ),
            });
        }
        line.push('\n');

        let mut writer = &file;
        writer
            .write_all(line.as_bytes())
            .map_err(|e| io_err(&self.path, "append", e))?;
        file.sync_data()
            .map_err(|e| io_err(&self.path, "sync", e))?;
        self.keep(file);

        self.tip = Tip {
            seq,
            hash,
            offset: self.tip.offset + line.len() as u64,
            lines: self.tip.lines + 1,
        };
        self.entries.push(Entry {
            seq,
            time,
            prev,
            hash,
            event: event.clone(),
        });
        Ok(&self.entries[self.entries.len() - 1])
    }

    /// Reads entries appended by other processes or handles since this handle last looked,
    /// and returns them (they are also added to [`Ledger::entries`]). Takes a shared lock and
    /// never modifies the file; a torn tail is left for the next writer to repair.
    pub fn refresh(&mut self) -> Result<&[Entry<E>], LedgerError> {
        let before = self.entries.len();
        let file = File::open(&self.path).map_err(|e| io_err(&self.path, "open", e))?;
        lock(&file, &self.path, false, self.options.lock_timeout)?;
        self.catch_up(&file, false)?;
        Ok(&self.entries[before..])
    }

    /// Reads and verifies the ledger at `path` without creating or repairing anything, and
    /// returns its entries (a torn tail is ignored).
    pub fn read(path: impl AsRef<Path>) -> Result<Vec<Entry<E>>, LedgerError> {
        let path = path.as_ref();
        let options = LedgerOptions::default();
        let file = File::open(path).map_err(|e| io_err(path, "open", e))?;
        lock(&file, path, false, options.lock_timeout)?;
        Ok(scan::<E>(&file, path, Tip::start(), options.max_line_bytes)?.entries)
    }

    /// Recomputes the whole chain of the ledger at `path` (with default options) and reports
    /// the first bad line as an error, or a summary when every line is good.
    pub fn verify(path: impl AsRef<Path>) -> Result<VerifyReport, LedgerError> {
        Self::verify_with(path, LedgerOptions::default())
    }

    /// [`Ledger::verify`] with explicit options (line cap, lock timeout).
    pub fn verify_with(
        path: impl AsRef<Path>,
        options: LedgerOptions,
    ) -> Result<VerifyReport, LedgerError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| io_err(path, "open", e))?;
        lock(&file, path, false, options.lock_timeout)?;
        let scan = scan::<E>(&file, path, Tip::start(), options.max_line_bytes)?;
        let torn_tail_bytes = match scan.tail {
            Tail::Clean => None,
            Tail::Torn { len, .. } | Tail::Unterminated { len, .. } => Some(len),
        };
        Ok(VerifyReport {
            entries: scan.tip.lines,
            head: scan.tip.hash,
            torn_tail_bytes,
        })
    }

    /// Every entry, oldest first.
    pub fn entries(&self) -> &[Entry<E>] {
        &self.entries
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the ledger has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The hash of the last entry ([`genesis`] when empty): the value the next entry's `prev`
    /// will have, and an anchor for detecting truncation from outside.
    pub fn head(&self) -> ContentHash {
        self.tip.hash
    }

    /// The sequence number the next append will get.
    pub fn next_seq(&self) -> u64 {
        self.tip.seq + 1
    }

    /// Unlocks `file` and keeps it for the next append (or closes it, which also unlocks it, when
    /// unlocking fails).
    fn keep(&mut self, file: File) {
        if file.unlock().is_ok() {
            self.file = Some(file);
        }
    }

    /// The kept file, or the path opened afresh when none is kept or when the path now names
    /// another file (replaced behind this handle's back: appending to the old one would lose the
    /// entry; reading the new one lets [`Ledger::catch_up`] judge it).
    fn take_file(&mut self) -> Result<File, LedgerError> {
        match self.file.take() {
            Some(file) if names_file(&self.path, &file) => Ok(file),
            _ => open_rw(&self.path),
        }
    }

    /// Reads what others appended after this handle's tip; repairs a torn tail when `repair`
    /// (the caller then holds the exclusive lock).
    fn catch_up(&mut self, file: &File, repair: bool) -> Result<(), LedgerError> {
        let found = file
            .metadata()
            .map_err(|e| io_err(&self.path, "stat", e))?
            .len();
        if found < self.tip.offset {
            return Err(LedgerError::Truncated {
                path: self.path.clone(),
                known: self.tip.offset,
                found,
            });
        }
        if found == self.tip.offset {
            return Ok(());
        }
        let scan = scan::<E>(file, &self.path, self.tip, self.options.max_line_bytes)?;
        if !scan.entries.is_empty() {
            tracing::debug!(
                path = %self.path.display(),
                new = scan.entries.len(),
                "picked up entries appended by another writer"
            );
        }
        self.entries.extend(scan.entries);
        self.tip = scan.tip;
        if repair {
            self.repair_tail(file, scan.tail)?;
        }
        Ok(())
    }

    /// Truncates a torn tail or terminates a complete one. The caller holds the exclusive lock.
    fn repair_tail(&mut self, file: &File, tail: Tail<E>) -> Result<(), LedgerError> {
        match tail {
            Tail::Clean => Ok(()),
            Tail::Torn { start, len } => {
                tracing::warn!(
                    path = %self.path.display(),
                    line = self.tip.lines + 1,
                    bytes = len,
                    "truncating a torn last line left by a crash mid-write"
                );
                file.set_len(start)
                    .map_err(|e| io_err(&self.path, "truncate", e))?;
                file.sync_all().map_err(|e| io_err(&self.path, "sync", e))
            }
            Tail::Unterminated { entry, len } => {
                tracing::warn!(
                    path = %self.path.display(),
                    line = self.tip.lines + 1,
                    "completing a last entry whose newline was lost in a crash"
                );
                let mut writer = file;
                writer
                    .write_all(b"\n")
                    .map_err(|e| io_err(&self.path, "append", e))?;
                file.sync_data()
                    .map_err(|e| io_err(&self.path, "sync", e))?;
                self.tip = Tip {
                    seq: entry.seq,
                    hash: entry.hash,
                    offset: self.tip.offset + len + 1,
                    lines: self.tip.lines + 1,
                };
                self.entries.push(entry);
                Ok(())
            }
        }
    }
}

/// The hash of an entry from the values written on its line.
/// The line (without its newline) that records `event` as entry `seq` after `prev`, appended
/// at `time` (whole microseconds), and the entry's hash: what every store writes, so that one
/// check ([`verify_line`]) reads them all.
pub fn entry_line<E: Serialize>(
    event: &E,
    seq: u64,
    prev: ContentHash,
    time: DateTime<Utc>,
) -> Result<(String, ContentHash), LedgerError> {
    let event_err = |e: serde_json::Error| LedgerError::Event {
        reason: cap(&e.to_string()),
    };
    // The event's compact text with sorted keys, exactly as its `serde_json::Value` writes
    // (the line's `event` field), and also its canonical form unless a string holds a
    // carriage return, which the canonical form writes as `\n`.
    let event_text = sorted_json::to_string(event, Strings::Plain).map_err(event_err)?;
    let canonical_text = if event_text.contains("\\r") {
        Some(sorted_json::to_string(event, Strings::NormaliseNewlines).map_err(event_err)?)
    } else {
        None
    };
    // Digits, hex and RFC 3339 characters: written as JSON without any escaping.
    let time_text = time.to_rfc3339_opts(SecondsFormat::Micros, true);
    let prev_hex = prev.to_hex();
    let seq_text = seq.to_string();
    // Both objects end with the same fields, `"prev":…,"seq":…,"time":…}` (keys sorted).
    let rest = [
        "\"prev\":\"",
        prev_hex.as_str(),
        "\",\"seq\":",
        &seq_text,
        ",\"time\":\"",
        &time_text,
        "\"}",
    ];
    // The canonical `{event, prev, seq, time}` object, streamed into SHA-256.
    let hashed_event = canonical_text.as_deref().unwrap_or(&event_text);
    let hash = ContentHash::of_pieces(["{\"event\":", hashed_event, ","].into_iter().chain(rest));
    // The object `{event, hash, prev, seq, time}` as serde_json writes it.
    let hash_hex = hash.to_hex();
    let mut line = String::with_capacity(event_text.len() + 256);
    for piece in ["{\"event\":", &event_text, ",\"hash\":\"", &hash_hex, "\","]
        .into_iter()
        .chain(rest)
    {
        line.push_str(piece);
    }
    Ok((line, hash))
}

/// Parses and verifies `line` (one entry's line, without its newline) as entry `expect_seq`
/// after `prev`: the check every line of every store passes before it is believed. Errors name
/// the entry by its sequence number.
pub fn verify_line<E: DeserializeOwned>(
    line: &str,
    expect_seq: u64,
    prev: &ContentHash,
) -> Result<Entry<E>, LedgerError> {
    check_line(line.as_bytes(), expect_seq, expect_seq, prev)
}

fn entry_hash(seq: &Value, time: &Value, prev: &Value, event: &Value) -> ContentHash {
    /// `{event, prev, seq, time}`: fields in sorted order, so it serialises exactly as the
    /// object with those keys would (the canonical form), without copying the event.
    #[derive(Serialize)]
    struct Hashed<'a> {
        event: &'a Value,
        prev: &'a Value,
        seq: &'a Value,
        time: &'a Value,
    }
    crate::core::hash::hash_sorted(&Hashed {
        event,
        prev,
        seq,
        time,
    })
}

/// Reads complete lines from `tip` to the end of `file`, verifying each against the chain.
fn scan<E: DeserializeOwned>(
    file: &File,
    path: &Path,
    mut tip: Tip,
    max_line_bytes: usize,
) -> Result<Scan<E>, LedgerError> {
    let mut handle = file;
    handle
        .seek(SeekFrom::Start(tip.offset))
        .map_err(|e| io_err(path, "read", e))?;
    let mut reader = BufReader::new(handle);
    let mut entries = Vec::new();
    let mut buf = Vec::new();
    let limit = u64::try_from(max_line_bytes)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    loop {
        buf.clear();
        let n = (&mut reader)
            .take(limit)
            .read_until(b'\n', &mut buf)
            .map_err(|e| io_err(path, "read", e))?;
        if n == 0 {
            return Ok(Scan {
                entries,
                tip,
                tail: Tail::Clean,
            });
        }
        let line = tip.lines + 1;
        let terminated = buf.last() == Some(&b'\n');
        if terminated {
            buf.pop();
        }
        if buf.len() > max_line_bytes {
            return Err(LedgerError::LineTooLong {
                line,
                limit: max_line_bytes,
            });
        }
        let n = n as u64;
        if !terminated {
            // The file ends without a newline: a torn write, or a complete entry whose newline
            // was lost. Anything else there is an error like on any other line.
            let tail = match check_line::<E>(&buf, line, tip.seq + 1, &tip.hash) {
                Ok(entry) => Tail::Unterminated { entry, len: n },
                Err(err) => {
                    if serde_json::from_slice::<Value>(&buf).is_ok() {
                        return Err(err);
                    }
                    Tail::Torn {
                        start: tip.offset,
                        len: n,
                    }
                }
            };
            return Ok(Scan { entries, tip, tail });
        }
        let entry = check_line::<E>(&buf, line, tip.seq + 1, &tip.hash)?;
        tip = Tip {
            seq: entry.seq,
            hash: entry.hash,
            offset: tip.offset + n,
            lines: line,
        };
        entries.push(entry);
    }
}

/// Parses and verifies one line (without its newline) as the entry after `prev`.
fn check_line<E: DeserializeOwned>(
    bytes: &[u8],
    line: u64,
    expect_seq: u64,
    prev: &ContentHash,
) -> Result<Entry<E>, LedgerError> {
    let bad = |reason: String| LedgerError::BadLine { line, reason };
    let broken = |reason: String| LedgerError::ChainBroken { line, reason };

    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| bad(format!("not valid JSON: {}", cap(&e.to_string()))))?;
    let Value::Object(mut object) = value else {
        return Err(bad("not a JSON object".into()));
    };
    if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(format!(
            "unexpected field \"{}\"",
            cap(unknown).escape_debug()
        )));
    }
    let mut take = |name: &str| {
        object
            .remove(name)
            .ok_or_else(|| bad(format!("missing field \"{name}\"")))
    };
    let seq_value = take("seq")?;
    let time_value = take("time")?;
    let prev_value = take("prev")?;
    let hash_value = take("hash")?;
    let event_value = take("event")?;

    let seq = seq_value
        .as_u64()
        .ok_or_else(|| bad("\"seq\" is not a non-negative integer".into()))?;
    let time = time_value
        .as_str()
        .ok_or_else(|| bad("\"time\" is not a string".into()))
        .and_then(|t| {
            DateTime::parse_from_rfc3339(t)
                .map_err(|e| bad(format!("\"time\" is not an RFC 3339 time: {e}")))
        })?
        .with_timezone(&Utc);
    let parse_hash = |v: &Value, name: &str| -> Result<ContentHash, LedgerError> {
        v.as_str()
            .and_then(|s| s.parse::<ContentHash>().ok())
            .ok_or_else(|| bad(format!("\"{name}\" is not 64 hex digits")))
    };
    let entry_prev = parse_hash(&prev_value, "prev")?;
    let hash = parse_hash(&hash_value, "hash")?;

    if seq != expect_seq {
        return Err(broken(format!(
            "sequence number {seq} where {expect_seq} was expected (a line was deleted, inserted or moved)"
        )));
    }
    if entry_prev != *prev {
        return Err(broken(
            "\"prev\" does not match the previous entry's hash".into(),
        ));
    }
    if entry_hash(&seq_value, &time_value, &prev_value, &event_value) != hash {
        return Err(broken(
            "\"hash\" does not match the entry's contents (the line was edited)".into(),
        ));
    }
    let event = serde_json::from_value::<E>(event_value).map_err(|e| {
        bad(format!(
            "the event does not match the event type: {}",
            cap(&e.to_string())
        ))
    })?;
    Ok(Entry {
        seq,
        time,
        prev: entry_prev,
        hash,
        event,
    })
}

/// Creates the ledger's directory and file when missing; true when the file was created.
fn ensure_file(path: &Path) -> Result<bool, LedgerError> {
    if path.is_file() {
        return Ok(false);
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| io_err(path, "create the directory of", e))?;
    let created = match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(io_err(path, "create", e)),
    };
    if created {
        // Make the new directory entry durable too.
        File::open(parent)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| io_err(path, "sync the directory of", e))?;
    }
    Ok(created)
}

/// Whether `path` still names the open `file` (same device and inode).
fn names_file(path: &Path, file: &File) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(path), file.metadata()) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (path, file);
        false
    }
}

/// Opens the ledger for reading and appending.
fn open_rw(path: &Path) -> Result<File, LedgerError> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
        .map_err(|e| io_err(path, "open", e))
}

/// Takes an advisory lock on `file` (released when it is closed), waiting up to `timeout`.
fn lock(file: &File, path: &Path, exclusive: bool, timeout: Duration) -> Result<(), LedgerError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        let attempt = if exclusive {
            file.try_lock()
        } else {
            file.try_lock_shared()
        };
        match attempt {
            Ok(()) => return Ok(()),
            Err(TryLockError::WouldBlock) => {
                let waited = started.elapsed();
                if waited >= timeout {
                    return Err(LedgerError::Locked {
                        path: path.to_path_buf(),
                        waited,
                    });
                }
                std::thread::sleep(pause.min(timeout - waited));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(TryLockError::Error(e)) => return Err(io_err(path, "lock", e)),
        }
    }
}

fn io_err(path: &Path, op: &'static str, source: io::Error) -> LedgerError {
    LedgerError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// Caps a message taken from untrusted input.
fn cap(text: &str) -> String {
    if text.chars().count() <= MAX_REASON_CHARS {
        return text.to_string();
    }
    let mut out: String = text.chars().take(MAX_REASON_CHARS).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn genesis_is_64_zeros() {
        assert_eq!(genesis().to_hex(), GENESIS_HEX);
        assert_eq!(GENESIS_HEX.len(), 64);
    }

    #[test]
    fn check_line_accepts_a_line_built_like_append() {
        let seq = json!(1);
        let time = json!("2025-01-01T00:00:00.000000Z");
        let prev = json!(GENESIS_HEX);
        let event = json!({"kind": "x", "n": 1.5});
        let hash = entry_hash(&seq, &time, &prev, &event);
        let line =
            json!({"seq": seq, "time": time, "prev": prev, "hash": hash.to_hex(), "event": event});
        let bytes = serde_json::to_vec(&line).expect("json");
        let entry: Entry<Value> = check_line(&bytes, 1, 1, &genesis()).expect("valid");
        assert_eq!(entry.hash, hash);
        assert_eq!(entry.event, event);
        // The same line at the wrong position breaks the chain.
        let err = check_line::<Value>(&bytes, 2, 2, &genesis()).expect_err("wrong seq");
        assert!(
            matches!(err, LedgerError::ChainBroken { line: 2, .. }),
            "{err}"
        );
    }

    /// `append` writes the line and hashes from the event's text; this must be exactly what
    /// the object `{event, hash, prev, seq, time}` and the canonical hash of `{event, prev, seq,
    /// time}` give, with and without carriage returns (which only the canonical form rewrites).
    #[test]
    fn appended_lines_are_the_serialised_object_and_hash_canonically() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("l.jsonl");
        let mut ledger = Ledger::<Value>::open(&path).expect("open");
        let events = [
            json!({"kind": "plain", "n": 1.5, "list": ["a", "é ✓", "tab\t\"q\"\\"], "z": null}),
            json!({"kind": "crlf", "sql": "select 1;\r\nselect 2;\r", "nested": {"k\r": "v\r\n"}}),
            json!({"kind": "escaped text that is not a CR", "s": "a backslash then r: \\r"}),
        ];
        for e in &events {
            ledger.append(e).expect("append");
        }
        let text = std::fs::read_to_string(&path).expect("read");
        for line in text.lines() {
            let v: Value = serde_json::from_str(line).expect("json");
            assert_eq!(serde_json::to_string(&v).expect("json"), line);
            let canonical =
                json!({"event": v["event"], "prev": v["prev"], "seq": v["seq"], "time": v["time"]});
            assert_eq!(
                v["hash"].as_str().expect("hash"),
                ContentHash::of(&canonical).to_hex()
            );
        }
        assert_eq!(Ledger::<Value>::verify(&path).expect("verify").entries, 3);
    }

    /// A line written before usage was recorded (no `usage` in its `produced` or
    /// `agent-failed` event) still verifies and reads with zero usage; an event with zero
    /// usage is written exactly as such lines were, so their hashes are unchanged.
    #[test]
    fn an_old_line_without_usage_still_verifies_and_hashes_as_written() {
        use crate::core::machine::Event;
        use crate::core::protocol::Usage;
        let seq = json!(1);
        let time = json!("2025-01-01T00:00:00.000000Z");
        let prev = json!(GENESIS_HEX);
        let old = json!({
            "event": "produced",
            "assignment": 1,
            "author": {"role": "product-owner", "name": "product-owner"},
            "artifact": {"kind": "review-verdict", "body": {"decision": "approve", "notes": []}},
        });
        let hash = entry_hash(&seq, &time, &prev, &old);
        let line =
            json!({"seq": seq, "time": time, "prev": prev, "hash": hash.to_hex(), "event": old});
        let bytes = serde_json::to_vec(&line).expect("json");
        let entry: Entry<Event> =
            check_line(&bytes, 1, 1, &genesis()).expect("an old line verifies");
        let Event::Produced { usage, .. } = &entry.event else {
            panic!("a produced event");
        };
        assert!(usage.is_zero());
        // Written again, the event is the old one byte for byte: the same hash.
        let again = serde_json::to_value(&entry.event).expect("json");
        assert_eq!(again, old);
        assert_eq!(entry_hash(&seq, &time, &prev, &again), hash);
        let failed = json!({"event": "agent-failed", "assignment": 2,
            "failure": {"failure": "invalid-output", "attempts": 3, "detail": "x"}});
        let e: Event = serde_json::from_value(failed.clone()).expect("an old failure reads");
        assert!(matches!(&e, Event::AgentFailed { role: None, usage, .. } if usage.is_zero()));
        assert_eq!(serde_json::to_value(&e).expect("json"), failed);
        // With usage, the usage is on the line and read back.
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("l.jsonl");
        let mut ledger = Ledger::<Event>::open(&path).expect("open");
        let mut with = entry.event.clone();
        if let Event::Produced { usage, .. } = &mut with {
            *usage = Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
                calls: 1,
                model: Some("m".into()),
                ..Usage::default()
            };
        }
        ledger.append(&with).expect("append");
        let read = Ledger::<Event>::read(&path).expect("verifies");
        assert_eq!(read[0].event, with);
        assert!(
            std::fs::read_to_string(&path)
                .expect("read")
                .contains("\"usage\":{")
        );
    }

    #[test]
    fn reasons_from_untrusted_input_are_capped() {
        let long = "x".repeat(10_000);
        assert!(cap(&long).chars().count() <= MAX_REASON_CHARS + 1);
        assert_eq!(cap("short"), "short");
    }
}
