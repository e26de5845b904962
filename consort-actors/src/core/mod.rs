//! The pure core: the artifacts, the state machine and its rules, the context packs, budgets,
//! paths and the run's history. No async, no I/O, no clock: every function here is a function
//! of its arguments, so the lifecycle can be replayed, tested and reasoned about alone.
//!
//! **Layering:** nothing here uses the ledger, the work tree or the runtime
//! (`tests/machine/layers.rs` reads every `crate::` path to check it).

pub(crate) mod artifact;
pub(crate) mod budget;
pub(crate) mod catalog;
pub mod context;
pub(crate) mod harness;
pub(crate) mod hash;
pub(crate) mod history;
pub(crate) mod machine;
pub(crate) mod migration_files;
pub(crate) mod paths;
pub(crate) mod protocol;
pub(crate) mod regression;
pub(crate) mod role;
pub(crate) mod sorted_json;
pub(crate) mod step;
pub(crate) mod test_identity;
pub(crate) mod test_outline;
pub(crate) mod text;
