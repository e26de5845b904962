//! Where a feature's events are kept, as the conductor sees it: the file ledger by default
//! ([`Ledger`]), or a store machines share (its PostgreSQL implementation lives with the other
//! PostgreSQL code, in `consort-lakebase`: this crate knows no database).
//!
//! **Invariant:** every event log keeps the same hash chain, written by
//! [`crate::entry_line`] and checked by [`crate::verify_line`], and an event takes effect only
//! once [`EventLog::append`] returned: the file ledger's line is fsynced then, a store's row
//! committed.

use std::sync::Arc;

use crate::core::machine::Event;
use crate::ledger::{Entry, Ledger, LedgerError};

/// Why an event log could not be opened, read or appended to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventLogError {
    /// The file ledger.
    #[error("the ledger")]
    Ledger(#[from] LedgerError),
    /// A store: its own error, which names what failed.
    #[error("the store")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A person's event was judged on fewer entries than the log holds by now.
    #[error(transparent)]
    MovedOn(#[from] LedgerMovedOn),
}

/// A person's event was judged on fewer entries than the log holds by now (another process
/// appended after the log was read): nothing was recorded; read it again and judge anew.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the ledger moved on while the decision was being made (it was judged on {seen} entries; the ledger now holds {now}); nothing was recorded"
)]
pub struct LedgerMovedOn {
    /// How many entries the event was judged on.
    pub seen: u64,
    /// How many the log holds.
    pub now: u64,
}

/// A feature's events, open for appending.
pub trait EventLog: Send {
    /// Every entry, oldest first, as of the last open or append.
    fn entries(&self) -> &[Entry<Event>];

    /// Appends `event` after whatever others appended since; when this returns `Ok`, the
    /// entry is durable and is the last of [`EventLog::entries`].
    fn append(&mut self, event: &Event) -> Result<&Entry<Event>, EventLogError>;

    /// Whether no event has been recorded.
    fn is_empty(&self) -> bool {
        self.entries().is_empty()
    }
}

impl EventLog for Ledger<Event> {
    fn entries(&self) -> &[Entry<Event>] {
        Ledger::entries(self)
    }

    fn append(&mut self, event: &Event) -> Result<&Entry<Event>, EventLogError> {
        Ok(Ledger::append(self, event)?)
    }
}

/// Opens a feature's event log for a conductor (see `ConductorConfig::event_log`); the
/// opening reads and checks every entry.
pub trait OpenEventLog: Send + Sync + std::fmt::Debug {
    /// Opens the log.
    fn open(&self) -> Result<Box<dyn EventLog>, EventLogError>;
}

/// The file ledger at a path, opened for a conductor.
#[derive(Debug, Clone)]
pub struct FileEventLog(pub std::path::PathBuf);

impl OpenEventLog for FileEventLog {
    fn open(&self) -> Result<Box<dyn EventLog>, EventLogError> {
        Ok(Box::new(Ledger::<Event>::open(&self.0)?))
    }
}

/// A shared opener.
pub type EventLogOpener = Arc<dyn OpenEventLog>;
