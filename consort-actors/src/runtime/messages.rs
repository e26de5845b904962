//! The messages between the conductor, the role actors and the Lakebase actor.
//!
//! `consort-agents` implements the role side ([`RoleMsg`]) and `consort-lakebase` the database
//! side ([`LakebaseMsg`]). Nothing but these typed messages crosses between actors; what they
//! carry is the core's data (`core/protocol.rs`).

use std::sync::Arc;

use ractor::RpcReplyPort;
use serde::{Deserialize, Serialize};

use crate::core::artifact::{ArtifactKind, TestRunReceipt};
use crate::core::budget::Remaining;
use crate::core::protocol::{
    AgentFailure, AssignmentId, AssignmentInputs, InfraError, Produced, PromoteReport,
    PromoteRequest, RunnerFacts, VerifyRequest, WriteRules,
};
use crate::core::role::{ActorId, Role};
use crate::core::step::Step;

/// One unit of work for one role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Assignment {
    /// Unique id; the reply must answer this id.
    pub id: AssignmentId,
    /// The role asked.
    pub role: Role,
    /// The step.
    pub step: Step,
    /// 0 for the first try; counts retries after refusals.
    pub attempt: u32,
    /// How tests run, for the roles whose work is tests and code (the Test Strategist, the
    /// Navigator and the Driver).
    /// (Read as `harness` too, its earlier name.)
    #[serde(default, alias = "harness", skip_serializing_if = "Option::is_none")]
    pub runner: Option<Arc<RunnerFacts>>,
    /// What the role may write, for the same roles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes: Option<WriteRules>,
    /// Inputs.
    pub inputs: AssignmentInputs,
    /// Feedback from earlier tries, failing runs or reviews, for the agent to act on.
    pub feedback: Vec<String>,
    /// What the run's and the role's budgets leave for this step (None: no budget applies). A
    /// backend that makes several calls checks each one against it before making it, and stops
    /// with [`AgentFailure::BudgetSpent`] instead of a call that would go over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Remaining>,
    /// The tools of a build step: read, list, search, and try a change on a scratch branch
    /// (see [`crate::runtime::workbench`]). Not serialised: a program given the assignment as JSON
    /// works in its own copy instead.
    #[serde(skip)]
    #[schemars(skip)]
    pub tools: Option<crate::runtime::workbench::Tools>,
}

impl Assignment {
    /// The artifact kind this assignment must be answered with.
    pub fn expected_kind(&self) -> ArtifactKind {
        self.step.output_kind()
    }
}

/// The answer of a role actor.
pub type RoleReply = Result<Produced, AgentFailure>;

/// Messages a role actor understands.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // sent once per step; boxing would only add an allocation
pub enum RoleMsg {
    /// Do this step and answer with the artifact or a typed failure.
    Assign(Assignment, RpcReplyPort<RoleReply>),
    /// Tell your identity.
    Identify(RpcReplyPort<ActorId>),
}

/// Messages the Lakebase actor understands.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // sent once per run; boxing would only add an allocation
pub enum LakebaseMsg {
    /// Run the suite on a fresh branch and answer with a receipt.
    Verify(
        VerifyRequest,
        RpcReplyPort<Result<TestRunReceipt, InfraError>>,
    ),
    /// Apply the migrations to the parent database.
    Promote(
        PromoteRequest,
        RpcReplyPort<Result<PromoteReport, InfraError>>,
    ),
}
