//! The Consort runtime: typed artifacts, the pure lifecycle state machine, the conductor actor,
//! supervision, gates, and the hash-chained ledger.
//!
//! **Architecture invariant:** this crate knows no LLM and no database. Role agents live in
//! `consort-agents`, database branches and test runs in `consort-lakebase`; both speak to the
//! conductor only through the messages in [`protocol`].

pub mod artifact;
pub mod conductor;
pub mod gate;
pub mod hash;
pub mod ledger;
pub mod machine;
pub mod paths;
pub mod protocol;
pub mod role;
mod sorted_json;
pub mod step;
pub mod supervision;
pub mod worktree;

pub use artifact::*;
pub use conductor::{
    AppendObserver, Conductor, ConductorConfig, ConductorError, ConductorHandle, Progress,
    RunOutcome, RunReport, Wiring,
};
pub use gate::{ApproveAs, Approver, GateRequest, StopAtGates};
pub use hash::{ContentHash, canonical_json};
pub use machine::{
    Command, Event, Machine, MachineConfig, Pending, Phase, RuleViolation, RunStatus, State,
};
pub use paths::{PathError, PathPolicy, TreeFilter, WriteProblem};
pub use protocol::*;
pub use role::{ActorId, Role};
pub use step::Step;
pub use worktree::{WorkTree, WorkTreeError};

/// The actor runtime the protocol is typed in ([`RoleMsg`] carries a `ractor::RpcReplyPort`), so
/// that an embedder's own role or Lakebase actor uses exactly the same version.
pub use ractor;
