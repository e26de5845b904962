//! Reading a run's ledger back in tests.

use std::path::Path;

use consort_actors::{Event, Ledger};

/// The events of the ledger at `path`, in order; panics if it does not read or its chain does
/// not verify.
pub fn events(path: &Path) -> Vec<Event> {
    Ledger::<Event>::read(path)
        .unwrap_or_else(|e| panic!("the ledger {} reads and verifies: {e}", path.display()))
        .into_iter()
        .map(|e| e.event)
        .collect()
}
