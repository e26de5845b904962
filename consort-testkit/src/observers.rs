//! Append observers for crash tests.

use std::ops::ControlFlow;

use consort_actors::AppendObserver;

/// Aborts the process right after the `n`-th durable append, as a crash at that point would:
/// no destructor runs, nothing is flushed beyond what the append itself made durable.
#[derive(Debug, Clone, Copy)]
pub struct AbortAfter(pub u64);

impl AppendObserver for AbortAfter {
    fn appended(&self, index: u64) -> ControlFlow<()> {
        if index == self.0 {
            std::process::abort();
        }
        ControlFlow::Continue(())
    }
}
