//! Human gates: who approves, and how an approval reaches the machine.
//!
//! Approvals reach the state machine in one of two ways: through an [`Approver`] while a run is
//! live (embedding, a terminal prompt, `--approve-as`), or through the ledger while the run is
//! stopped (`consort approve` appends an [`Event::Gate`](crate::Event::Gate) and the next run
//! replays it). Either way the machine checks the gate and the exact hash. **Gates fail closed:**
//! no answer, a timeout, an error or another hash all mean "not approved".

use std::future::Future;
use std::pin::Pin;

use chrono::Utc;
use serde::{Deserialize, Serialize};

use crate::core::artifact::{GateApproval, GateDecision, GateKind};
use crate::core::hash::ContentHash;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a gate asks a human to decide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRequest {
    /// Which gate.
    pub gate: GateKind,
    /// The exact hash to approve.
    pub hash: ContentHash,
    /// A human-readable summary of what is being approved.
    pub summary: String,
}

/// Decides gates while a run is live. `None` means "no decision now": the run stops at the
/// gate and can be resumed after an approval is recorded in the ledger.
pub trait Approver: Send + Sync {
    /// Decide, or decline to decide (`None`).
    fn decide<'a>(&'a self, request: &'a GateRequest) -> BoxFuture<'a, Option<GateApproval>>;
}

/// Never decides: every gate stops the run (the default; approvals come through the ledger).
#[derive(Debug, Clone, Copy, Default)]
pub struct StopAtGates;

impl Approver for StopAtGates {
    fn decide<'a>(&'a self, _: &'a GateRequest) -> BoxFuture<'a, Option<GateApproval>> {
        Box::pin(async { None })
    }
}

/// Approves every gate as the named person, recording that in the ledger (`--approve-as`).
#[derive(Debug, Clone)]
pub struct ApproveAs {
    /// Who approves.
    pub name: String,
}

impl ApproveAs {
    /// The approval it gives `request`: the gate and hash asked about, now, by its name.
    pub fn approval(&self, request: &GateRequest) -> GateApproval {
        GateApproval {
            gate: request.gate,
            hash: request.hash,
            approver: self.name.clone(),
            at: Utc::now(),
            decision: GateDecision::Approve,
            note: format!("approved by {} via approve-as", self.name),
        }
    }
}

impl Approver for ApproveAs {
    fn decide<'a>(&'a self, request: &'a GateRequest) -> BoxFuture<'a, Option<GateApproval>> {
        Box::pin(async move { Some(self.approval(request)) })
    }
}
