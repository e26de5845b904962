//! The pure lifecycle state machine: `(state, event) -> Result<(state, commands), RuleViolation>`.
//!
//! **Architecture invariant:** this module does no I/O, spawns nothing and reads no clock. All it
//! knows arrives in an [`Event`]; all it wants done leaves as a [`Command`]. The conductor
//! performs the commands and feeds their results back as events, appending each event to the
//! ledger first — so replaying the ledger through [`Machine::step`] rebuilds the exact state.
//!
//! The state always holds exactly one [`Pending`] thing it waits for while running; the command
//! that asks for it is derived from it ([`State::pending_command`]). A resumed run therefore
//! re-issues exactly the command whose result is missing, and nothing whose result is recorded.
//!
//! When [`Machine::step`] refuses an event with a [`RuleViolation`], the state is unchanged; the
//! conductor then records the refusal by feeding [`Event::Refused`], and the machine applies the
//! violation's [`Remedy`]: ignore it, let the agent retry with the violation as feedback
//! (bounded), or halt for a human. A change set the conductor could not apply is reported as
//! [`Event::ApplyDenied`], which the machine accepts and answers the same way (the rule check
//! itself stays here: the conductor asks [`Machine::check_resolved`]).

mod next;
mod rules;
mod scratch;
mod transition;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::core::artifact::{
    ArchitectureVerdict, ChangeSet, DesignBundle, Escalation, FeatureRequest, FileHashes,
    GateApproval, GateKind, Migration, RequestId, SchemaPlan, Spec, Stories, TestEntry, TestList,
    TestRunReceipt, UxDesign,
};
use crate::core::hash::ContentHash;
use crate::core::paths::{PathError, PathPolicy};
use crate::core::protocol::{
    AgentFailure, AssignmentId, InfraError, PromoteReport, StepScope, Usage, VerifyPurpose,
};
use crate::core::regression::{Inherited, Quarantine, Retirement};
use crate::core::role::{ActorId, Role};
use crate::core::step::Step;
use crate::core::test_outline::TestFileVerdicts;

/// The pure checks, one per artifact kind an agent produces (a receipt is never an agent's:
/// only the Lakebase side makes one), plus the disk checks the conductor's observations get.
pub use rules::{
    Remedy, RuleViolation, Writer, check_architecture, check_change_set, check_review,
    check_schema, check_spec, check_stories, check_test_list, check_ux,
};
pub use scratch::{ScratchPlan, ScratchVerdict};
pub use transition::refusal_said;

/// Bounds and path rules the machine enforces.
#[derive(Debug, Clone)]
pub struct MachineConfig {
    /// Which paths are tests and which are the harness.
    pub paths: PathPolicy,
    /// Architect revise verdicts allowed before escalating (default 2).
    pub max_revisions: u32,
    /// GREEN repair rounds allowed before escalating (default 3).
    pub max_repairs: u32,
    /// Review change requests allowed before escalating (default 2).
    pub max_review_rounds: u32,
    /// Refused answers an agent may retry per step before escalating (default 2).
    pub max_agent_retries: u32,
    /// Where the design's migrations are written as files (None: they live in the design
    /// only). When set, every observation before a build step checks them.
    pub migration_files: Option<crate::core::migration_files::MigrationFiles>,
    /// What a build step's run covers; a conductor records it in the start event, from
    /// which the machine takes it (so a replay judges each run as it was judged).
    pub per_step: StepScope,
}

impl Default for MachineConfig {
    fn default() -> Self {
        MachineConfig {
            paths: PathPolicy::default(),
            max_revisions: 2,
            max_repairs: 3,
            max_review_rounds: 2,
            max_agent_retries: 2,
            migration_files: None,
            per_step: StepScope::Whole,
        }
    }
}

/// Everything the machine can be told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    /// A feature request starts the run.
    Start {
        /// The request.
        feature: FeatureRequest,
        /// What the project's earlier features leave to this one (omitted when nothing, as in
        /// a project's first feature and in ledgers written before backlogs existed).
        #[serde(default, skip_serializing_if = "Inherited::is_empty")]
        inherited: Inherited,
        /// What each build step's run covers (omitted for the whole suite, the default).
        #[serde(default, skip_serializing_if = "StepScope::is_whole")]
        per_step: StepScope,
        /// The configuration that judges the runs, when the conductor knows it (omitted in
        /// ledgers written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        harness: Option<crate::core::harness::Harness>,
    },
    /// An agent answered an assignment.
    Produced {
        /// The assignment answered.
        assignment: AssignmentId,
        /// Who produced it.
        author: ActorId,
        /// What it produced.
        artifact: crate::core::artifact::Artifact,
        /// What producing it cost (omitted when nothing was counted, so lines written before
        /// usage was recorded read and hash exactly as they were written).
        #[serde(default, skip_serializing_if = "Usage::is_zero")]
        usage: Usage,
        /// The step's transcript of tool calls, when the agent kept one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        transcript: Option<crate::core::protocol::TranscriptRef>,
    },
    /// An agent could not answer (after its own retries and the supervisor's restarts).
    AgentFailed {
        /// The assignment.
        assignment: AssignmentId,
        /// Why.
        failure: AgentFailure,
        /// The role that was asked (omitted in lines written before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        role: Option<Role>,
        /// What the failed step cost: the agent's report and the conductor's wall time
        /// (omitted when zero, like [`Event::Produced`]'s).
        #[serde(default, skip_serializing_if = "Usage::is_zero")]
        usage: Usage,
    },
    /// The conductor refused the previous event with this violation (recorded for the audit
    /// trail; the machine applies the violation's remedy).
    Refused {
        /// The violation.
        violation: RuleViolation,
        /// The output of the test run whose receipt was refused (capped), fed back to the
        /// agent with the violation so that it can repair. None for every other refusal, and
        /// in ledgers written before it existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run_output: Option<String>,
    },
    /// The conductor read the disk before a build step.
    Observed {
        /// Hash of the frozen design file on disk (None: missing or unreadable).
        design_hash: Option<ContentHash>,
        /// Hashes of every test file on disk.
        tests: FileHashes,
        /// The design's migration files as found on disk: path → the checksum of the SQL they
        /// hold ([`Migration::checksum`]; None: missing or unreadable). Empty before the design
        /// is frozen, without [`MachineConfig::migration_files`], and in ledgers written
        /// before it existed.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        migrations: BTreeMap<String, Option<ContentHash>>,
    },
    /// The conductor applied the pending change set.
    Applied {
        /// Hash of the whole work tree after applying.
        workspace_hash: ContentHash,
        /// Hashes of every test file on disk after applying.
        tests: FileHashes,
        /// The change set that undoes it.
        inverse: ChangeSet,
    },
    /// The conductor refused to apply the change set (a path resolves outside the work tree);
    /// nothing was written.
    ApplyRefused {
        /// Why.
        reason: PathError,
    },
    /// The conductor did not apply the pending change set, and nothing of it is left written:
    /// re-checked by [`Machine::check_resolved`] with its paths as they resolve on disk (through
    /// symbolic links), it breaks a rule; or the file system cannot take one of its paths
    /// ([`RuleViolation::PathNotWritable`]). The machine lets the agent retry with the violation
    /// as feedback (bounded), exactly as for a refused answer; this event is the record of the
    /// refusal.
    ApplyDenied {
        /// The violation, naming the resolved path.
        violation: RuleViolation,
        /// The change set's paths that resolve to another path on disk: spelled → resolved.
        #[serde(default)]
        resolved: std::collections::BTreeMap<String, String>,
    },
    /// The Lakebase side answered a verify request.
    VerifyCompleted {
        /// The receipt.
        receipt: TestRunReceipt,
    },
    /// The Lakebase side could not run a verify request (infrastructure).
    VerifyFailed {
        /// The request.
        request: RequestId,
        /// Why.
        error: InfraError,
    },
    /// A human decided at a gate.
    Gate {
        /// The decision, bound to a hash.
        approval: GateApproval,
    },
    /// The Lakebase side promoted the migrations to the parent.
    Promoted {
        /// What it did.
        report: PromoteReport,
    },
    /// The promotion failed (infrastructure).
    PromoteFailed {
        /// The request.
        request: RequestId,
        /// Why.
        error: InfraError,
    },
    /// A human retired an earlier feature's test: from now on it is not part of this
    /// feature's regression suite, and a RED may replace its file.
    Retired {
        /// The decision.
        retirement: Retirement,
    },
    /// A person quarantined a test (see [`Quarantine`]): from now on its failures judge
    /// nothing. The run goes on (or stays halted) where it was.
    Quarantined {
        /// The decision.
        quarantine: Quarantine,
    },
    /// A person set aside the accepted test of the running entry, which its RED writes again
    /// (see [`Redo`]).
    Redone {
        /// The decision.
        redo: Redo,
    },
    /// A person changed the configuration that judges the runs while the feature was open
    /// (see [`crate::HarnessChange`]): recorded when the run resumed under it; the runs that
    /// follow are judged, and their receipts named, under the new one.
    HarnessChanged {
        /// The change.
        change: crate::core::harness::HarnessChange,
    },
    /// A human decided what to do about a halt (retry or stop), or stopped a run that is not
    /// halted (interrupted, or waiting at a gate).
    Human {
        /// Retry the halted step, or stop.
        decision: HumanDecision,
        /// Who decided.
        by: String,
    },
}

impl Event {
    /// The [`Event::Refused`] that records `violation` as the answer to `refused`: a refused
    /// receipt's output excerpt goes with it, for the agent's feedback.
    pub fn refusal(refused: &Event, violation: RuleViolation) -> Event {
        let run_output = match refused {
            Event::VerifyCompleted { receipt } => Some(transition::excerpt(receipt)),
            _ => None,
        };
        Event::Refused {
            violation,
            run_output,
        }
    }

    /// A short name for logs and violations.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Start { .. } => "start",
            Event::Produced { .. } => "produced",
            Event::AgentFailed { .. } => "agent-failed",
            Event::Refused { .. } => "refused",
            Event::Observed { .. } => "observed",
            Event::Applied { .. } => "applied",
            Event::ApplyRefused { .. } => "apply-refused",
            Event::ApplyDenied { .. } => "apply-denied",
            Event::VerifyCompleted { .. } => "verify-completed",
            Event::VerifyFailed { .. } => "verify-failed",
            Event::Gate { .. } => "gate",
            Event::Promoted { .. } => "promoted",
            Event::PromoteFailed { .. } => "promote-failed",
            Event::Retired { .. } => "retired",
            Event::Redone { .. } => "redone",
            Event::Quarantined { .. } => "quarantined",
            Event::HarnessChanged { .. } => "harness-changed",
            Event::Human { .. } => "human",
        }
    }
}

/// A person's recorded decision that the running entry's accepted test is wrong: the test is
/// written again from RED (the Navigator told why), the rest of the feature stands. Only while
/// the run is halted, only for the entry the build lane is on, and only after its RED was
/// accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redo {
    /// The test-list entry (`T2`).
    pub test: String,
    /// Who decided.
    pub by: String,
    /// Why the test is wrong.
    pub reason: String,
}

/// What a human can decide about a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HumanDecision {
    /// Retry the halted step, with fresh bounds (only when halted).
    Retry,
    /// End the run: a halted one, or one that was interrupted or waits at a gate.
    Stop,
}

/// What the machine waits for while running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "waiting", rename_all = "kebab-case")]
pub enum Pending {
    /// An agent's answer.
    Agent {
        /// The assignment id.
        id: AssignmentId,
        /// The step.
        step: Step,
        /// 0 for the first try.
        attempt: u32,
        /// Feedback to hand the agent.
        feedback: Vec<String>,
    },
    /// A disk observation, before `then` is issued.
    Observe {
        /// What follows a clean observation.
        then: Box<Pending>,
    },
    /// The conductor applying a change set produced for `step`.
    Apply {
        /// The step that produced it.
        step: Step,
        /// The agent's attempt that produced it.
        attempt: u32,
        /// The (normalised) change set.
        change_set: ChangeSet,
    },
    /// The conductor undoing a change set, before `then` (or before halting with `halt`).
    Revert {
        /// The undo change set.
        change_set: ChangeSet,
        /// What follows (or what a retry re-issues, when halting).
        then: Box<Pending>,
        /// Halt with this escalation once reverted.
        halt: Option<Escalation>,
    },
    /// A test run on a fresh branch.
    Verify {
        /// The request id.
        request: RequestId,
        /// The step whose work is verified (None for the deploy run).
        step: Option<Step>,
        /// Why.
        purpose: VerifyPurpose,
        /// The work tree the run must be for.
        workspace_hash: ContentHash,
        /// How to undo the change under test, when it may be dropped.
        inverse: Option<ChangeSet>,
        /// The agent's attempt that produced the change under test.
        attempt: u32,
        /// Test files on disk (with hashes) for the run; frozen when a RED is accepted.
        tests_after: FileHashes,
    },
    /// A human decision at a gate.
    Gate {
        /// Which gate.
        gate: GateKind,
        /// The hash to approve.
        hash: ContentHash,
    },
    /// The baseline: the project's whole suite, run as the verifications will, before the
    /// build lane's first step, and again before the next one after a person changed the
    /// harness (see [`VerifyPurpose::Baseline`]).
    Baseline {
        /// The request id.
        request: RequestId,
        /// What the run goes on with once the baseline holds: None when the build lane opens
        /// (its first RED), what was pending when the harness changed otherwise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        then: Option<Box<Pending>>,
    },
    /// Promotion of the migrations to the parent database.
    Promote {
        /// The request id.
        request: RequestId,
    },
}

/// What the machine asks the conductor to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum Command {
    /// Ask `role` to perform `step`; answer with [`Event::Produced`] or [`Event::AgentFailed`].
    Assign {
        /// The assignment id.
        id: AssignmentId,
        /// The role.
        role: Role,
        /// The step.
        step: Step,
        /// 0 for the first try.
        attempt: u32,
        /// Feedback for the agent.
        feedback: Vec<String>,
    },
    /// Read the design file's hash and every test file's hash; answer with [`Event::Observed`].
    Observe,
    /// Apply a change set to the work tree; answer with [`Event::Applied`],
    /// [`Event::ApplyRefused`] or [`Event::ApplyDenied`].
    Apply {
        /// The change set.
        change_set: ChangeSet,
    },
    /// Run the tests on a fresh branch; answer with [`Event::VerifyCompleted`] or
    /// [`Event::VerifyFailed`].
    Verify {
        /// The request id.
        request: RequestId,
        /// Why.
        purpose: VerifyPurpose,
        /// The work-tree hash the run must be for.
        workspace_hash: ContentHash,
        /// Migrations accepted so far.
        migrations: Vec<Migration>,
        /// Runner names of the tests expected so far.
        tests: Vec<String>,
        /// The current entry's test, in RED and GREEN (see [`crate::VerifyRequest::focus`]).
        focus: Option<String>,
        /// The tests to run when the step runs only the feature's own (see
        /// [`crate::VerifyRequest::select`]); empty: the whole suite.
        select: Vec<String>,
    },
    /// Wait for a human decision on a gate; answer with [`Event::Gate`]. For the design gate,
    /// write the frozen design to disk first.
    AwaitGate {
        /// Which gate.
        gate: GateKind,
        /// The hash to approve.
        hash: ContentHash,
    },
    /// Run the project's whole suite as it stands, on a fresh branch of the base, as every
    /// verification will; answer with [`Event::VerifyCompleted`] or [`Event::VerifyFailed`].
    Baseline {
        /// The request id.
        request: RequestId,
        /// Runner names of the earlier features' tests in force.
        tests: Vec<String>,
    },
    /// Apply the migrations to the parent database; answer with [`Event::Promoted`] or
    /// [`Event::PromoteFailed`].
    Promote {
        /// The request id.
        request: RequestId,
        /// The approved migrations.
        migrations: Vec<Migration>,
    },
    /// Tell the humans: the run halted. Answer, when decided, with [`Event::Human`].
    Escalate {
        /// What and why.
        escalation: Escalation,
    },
    /// The run finished.
    Finish,
}

/// Where the run stands, coarsely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// No feature yet.
    Idle,
    /// The design lane.
    Design,
    /// Waiting at the design gate.
    DesignGate,
    /// The build lane.
    Build,
    /// Waiting at the deploy gate.
    DeployGate,
    /// The full-suite deploy verification.
    Deploy,
    /// Waiting at the promote gate.
    PromoteGate,
    /// Applying the migrations to the parent.
    Promote,
    /// Halted for a human.
    Halted,
    /// Finished.
    Done,
    /// Stopped by a human.
    Stopped,
}

impl Phase {
    /// Every phase, in lifecycle order (the three ends last).
    pub const ALL: [Phase; 11] = [
        Phase::Idle,
        Phase::Design,
        Phase::DesignGate,
        Phase::Build,
        Phase::DeployGate,
        Phase::Deploy,
        Phase::PromoteGate,
        Phase::Promote,
        Phase::Halted,
        Phase::Done,
        Phase::Stopped,
    ];

    /// The phase's name, as serialised (`design-gate`).
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Design => "design",
            Phase::DesignGate => "design-gate",
            Phase::Build => "build",
            Phase::DeployGate => "deploy-gate",
            Phase::Deploy => "deploy",
            Phase::PromoteGate => "promote-gate",
            Phase::Promote => "promote",
            Phase::Halted => "halted",
            Phase::Done => "done",
            Phase::Stopped => "stopped",
        }
    }
}

display_as_str!(Phase);

/// One edge of the lifecycle: the machine moves from one [`Phase`] to another (or stays in it)
/// when `label` happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LifecycleEdge {
    /// The phase the run is in.
    pub from: Phase,
    /// The phase it is in next.
    pub to: Phase,
    /// What moves it, for people (`design approved`).
    pub label: &'static str,
}

/// The lifecycle as edges, generated from the machine's own definition: one edge for each
/// phase each row of the lifecycle table (`next.rs`) leads to, in the table's order, then what
/// the transition function adds in every phase a run can be in (a halt — a rejection at a
/// gate, an escalation elsewhere — a retry back to it, and a stop). Pure; no two edges alike.
pub fn lifecycle_edges() -> Vec<LifecycleEdge> {
    let mut edges: Vec<LifecycleEdge> = Vec::new();
    let mut push = |from, to, label| {
        let edge = LifecycleEdge { from, to, label };
        if !edges.contains(&edge) {
            edges.push(edge);
        }
    };
    for kind in next::DoneKind::ALL {
        let (from, label, successors) = next::row(kind);
        for &to in successors {
            push(
                from,
                to,
                if to == Phase::Halted {
                    "bound spent"
                } else {
                    label
                },
            );
        }
    }
    let running = Phase::ALL.into_iter().filter(|p| {
        !matches!(
            p,
            Phase::Idle | Phase::Halted | Phase::Done | Phase::Stopped
        )
    });
    for phase in running {
        let halt = match phase {
            Phase::DesignGate | Phase::DeployGate | Phase::PromoteGate => "rejected",
            _ => "escalated",
        };
        push(phase, Phase::Halted, halt);
        push(Phase::Halted, phase, "retry");
        push(phase, Phase::Stopped, "stop");
    }
    push(Phase::Halted, Phase::Stopped, "stop");
    edges
}

/// How the run is doing.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum RunStatus {
    /// Not started.
    #[default]
    Idle,
    /// Running (possibly waiting at a gate).
    Running,
    /// Halted for a human.
    Halted {
        /// Why.
        escalation: Escalation,
        /// What a retry re-issues. An agent's step names the assignment id the retry gives it
        /// (nothing allocates an id while halted), attempt 0.
        resume: Box<Pending>,
    },
    /// Finished.
    Done,
    /// Stopped by a human.
    Stopped,
}

/// The frozen design and its approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frozen {
    /// The approved design bundle hash.
    pub hash: ContentHash,
}

/// A RED's write of a file that holds frozen tests: judged on the file's syntax tree before it
/// is applied ([`Machine::frozen_files_written`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrozenWrite {
    /// The file, relative to the work tree.
    pub path: String,
    /// The test a person's redo opens in it, by the name the runner reports (None: every test
    /// in it is frozen).
    pub open: Option<String>,
}

/// Progress through the build lane.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BuildProgress {
    /// Index of the current test-list entry.
    pub current: usize,
    /// Test files accepted in RED, with their hashes: immutable from then on.
    pub frozen_tests: FileHashes,
    /// Actors that wrote code for the current entry (they may not review it).
    pub code_authors: Vec<ActorId>,
    /// GREEN repair rounds used for the current entry.
    pub repairs: u32,
    /// Review change requests for the current entry.
    pub review_rounds: u32,
    /// Hash of the work tree after the last applied change.
    pub workspace_hash: Option<ContentHash>,
    /// Entries completed (reviewed and approved).
    pub completed: usize,
    /// The change sets applied for the current entry since its last review, oldest first (a
    /// reverted refactor is taken out): what the next review judges and a repair builds on.
    #[serde(default)]
    pub since_review: Vec<Arc<ChangeSet>>,
    /// What the Driver must hear in its next assignment (a refactor that was reverted).
    #[serde(default)]
    pub driver_notes: Vec<String>,
    /// The current entry's test file while a person's [`Redo`] has set it aside: frozen still
    /// (no one else may touch it), but its RED may rewrite it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redo: Option<String>,
}

/// The machine's whole state. Plain data: serialisable, comparable, replayable.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct State {
    /// How the run is doing.
    pub status: RunStatus,
    /// What the machine waits for (None when idle, halted or finished).
    pub pending: Option<Pending>,
    /// The feature request.
    pub feature: Option<Arc<FeatureRequest>>,
    /// Stories, once accepted.
    pub stories: Option<Arc<Stories>>,
    /// Spec, once accepted.
    pub spec: Option<Arc<Spec>>,
    /// The approving architecture verdict.
    pub architecture: Option<Arc<ArchitectureVerdict>>,
    /// Architect revise verdicts so far.
    pub revisions: u32,
    /// Schema plan, once accepted.
    pub schema: Option<Arc<SchemaPlan>>,
    /// Test list, once accepted.
    pub test_list: Option<Arc<TestList>>,
    /// UX design, once accepted.
    pub ux: Option<Arc<UxDesign>>,
    /// The frozen, approved design.
    pub frozen: Option<Frozen>,
    /// Build-lane progress.
    pub build: BuildProgress,
    /// Every receipt accepted, in order.
    pub receipts: Vec<Arc<TestRunReceipt>>,
    /// Every gate approval accepted, in order.
    pub approvals: Vec<GateApproval>,
    /// The promotion report, once promoted.
    pub promotion: Option<PromoteReport>,
    /// What the project's earlier features left to this one (see [`Inherited`]).
    #[serde(default)]
    pub inherited: Arc<Inherited>,
    /// What each build step's run covers, as the start event says.
    #[serde(default)]
    pub per_step: StepScope,
    /// The earlier tests a human retired, in order.
    #[serde(default)]
    pub retired: Vec<Retirement>,
    /// The accepted tests of this feature a person set aside to be written again, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redone: Vec<Redo>,
    /// The tests a person quarantined, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<Quarantine>,
    /// The configuration that judges the runs, as recorded at the start and changed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness: Option<crate::core::harness::Harness>,
    /// The changes people made to it while the feature was open, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub harness_changes: Vec<crate::core::harness::HarnessChange>,
    /// What the baseline found: the tests that failed before the feature (None: no baseline
    /// ran yet, or a ledger written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Baseline>,
    /// Authors of every accepted artifact, by step key (shared, so that a step's copy of the
    /// state does not copy the names).
    pub authors: Vec<Arc<(String, ActorId)>>,
    /// Next assignment id.
    pub next_assignment: u64,
    /// Next request id.
    pub next_request: u64,
}

/// What the baseline run found (see [`VerifyPurpose::Baseline`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    /// The run's request.
    pub request: RequestId,
    /// The tests that failed there, by runner name: failing before the feature.
    pub failing: Vec<String>,
}

impl State {
    /// Every quarantine in force: the earlier features' (see [`Inherited::quarantined`]), then
    /// this feature's.
    pub fn quarantines(&self) -> impl Iterator<Item = &Quarantine> {
        self.inherited.quarantined.iter().chain(&self.quarantined)
    }

    /// Whether a person quarantined the test `name`, in this feature or an earlier one.
    pub fn is_quarantined(&self, name: &str) -> bool {
        self.quarantines().any(|q| q.test == name)
    }

    /// The runner names of the quarantined tests.
    pub fn quarantined_names(&self) -> Vec<String> {
        self.quarantines().map(|q| q.test.clone()).collect()
    }

    /// Whether `receipt` records a passing run as this feature judges it: every test it
    /// reports passed, but those quarantined now (whose failures judge nothing, though they
    /// make the test command's exit code fail).
    pub fn passed(&self, receipt: &crate::TestRunReceipt) -> bool {
        transition::all_pass(receipt, &[], &self.quarantined_names())
    }
}

/// The release evidence a human approves at the deploy gate (its hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseEvidence {
    /// The approved design hash.
    pub design: ContentHash,
    /// The final work-tree hash.
    pub workspace: Option<ContentHash>,
    /// (request, workspace, output digest) of every accepted receipt.
    pub receipts: Vec<(RequestId, ContentHash, ContentHash)>,
}

impl State {
    /// The coarse phase.
    pub fn phase(&self) -> Phase {
        match &self.status {
            RunStatus::Idle => return Phase::Idle,
            RunStatus::Halted { .. } => return Phase::Halted,
            RunStatus::Done => return Phase::Done,
            RunStatus::Stopped => return Phase::Stopped,
            RunStatus::Running => {}
        }
        // Look through an observation, a revert or a baseline run again to what it leads to.
        let mut pending = self.pending.as_ref();
        while let Some(
            Pending::Observe { then }
            | Pending::Revert { then, .. }
            | Pending::Baseline {
                then: Some(then), ..
            },
        ) = pending
        {
            pending = Some(then);
        }
        match pending {
            Some(Pending::Gate {
                gate: GateKind::Design,
                ..
            }) => Phase::DesignGate,
            Some(Pending::Gate {
                gate: GateKind::Deploy,
                ..
            }) => Phase::DeployGate,
            Some(Pending::Gate {
                gate: GateKind::Promote,
                ..
            }) => Phase::PromoteGate,
            Some(Pending::Promote { .. }) => Phase::Promote,
            Some(Pending::Verify {
                purpose: VerifyPurpose::Deploy,
                ..
            }) => Phase::Deploy,
            _ if self.frozen.is_none() => Phase::Design,
            _ if self.promotion_ready() => Phase::Deploy,
            _ => Phase::Build,
        }
    }

    fn promotion_ready(&self) -> bool {
        self.test_list
            .as_ref()
            .is_some_and(|l| self.build.completed >= l.entries.len())
    }

    /// The gate waiting for a decision, with its hash.
    pub fn pending_gate(&self) -> Option<(GateKind, ContentHash)> {
        match &self.pending {
            Some(Pending::Gate { gate, hash }) if self.status == RunStatus::Running => {
                Some((*gate, *hash))
            }
            _ => None,
        }
    }

    /// The design bundle, once every part of it is accepted.
    pub fn design_bundle(&self) -> Option<DesignBundle> {
        Some(DesignBundle {
            feature: FeatureRequest::clone(self.feature.as_ref()?),
            stories: Stories::clone(self.stories.as_ref()?),
            spec: Spec::clone(self.spec.as_ref()?),
            architecture: ArchitectureVerdict::clone(self.architecture.as_ref()?),
            schema: SchemaPlan::clone(self.schema.as_ref()?),
            test_list: TestList::clone(self.test_list.as_ref()?),
            ux: self.ux.as_deref().cloned(),
        })
    }

    /// The current test-list entry in the build lane.
    pub fn current_test(&self) -> Option<&TestEntry> {
        self.test_list.as_ref()?.entries.get(self.build.current)
    }

    /// The release evidence whose hash the deploy gate approves.
    pub fn release_evidence(&self) -> Option<ReleaseEvidence> {
        Some(ReleaseEvidence {
            design: self.frozen.as_ref()?.hash,
            workspace: self.build.workspace_hash,
            receipts: self
                .receipts
                .iter()
                .map(|r| (r.request_id, r.workspace_hash, r.output_digest))
                .collect(),
        })
    }

    /// The command that asks for what is pending (what a resumed run issues again).
    pub fn pending_command(&self) -> Option<Command> {
        if self.status != RunStatus::Running {
            return None;
        }
        transition::command_for(self, self.pending.as_ref()?)
    }

    /// The last receipt accepted.
    pub fn last_receipt(&self) -> Option<&TestRunReceipt> {
        self.receipts.last().map(|r| &**r)
    }
}

/// The pure lifecycle state machine.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    config: MachineConfig,
}

impl Machine {
    /// A machine with these bounds and path rules.
    pub fn new(config: MachineConfig) -> Self {
        Machine { config }
    }

    /// The configuration.
    pub fn config(&self) -> &MachineConfig {
        &self.config
    }

    /// One transition. On `Err` the state is unchanged and the event must be followed by
    /// [`Event::Refused`] carrying the violation (the conductor does this).
    pub fn step(
        &self,
        state: &State,
        event: &Event,
    ) -> Result<(State, Vec<Command>), RuleViolation> {
        transition::step(&self.config, state, event)
    }

    /// Checks the change set about to be applied once more, with every path as it resolves on
    /// disk (through symbolic links, relative to the work tree): the rules of
    /// [`check_change_set`] for the pending step's writer, so a write through a link gets the
    /// same typed violation as a direct write of the file it reaches. Returns the normalised
    /// resolved change set. Anything but a pending [`Pending::Apply`] (a revert: the machine's
    /// own undo) passes unchecked. Pure: the conductor resolves, the machine judges.
    ///
    /// A RED may write a file that holds frozen tests when its language is parsed
    /// ([`Machine::frozen_files_written`]): `verdicts` holds the conductor's judgement of each
    /// such write on the file's syntax tree ([`crate::core::test_outline::judge`]); a refused
    /// one is a [`RuleViolation::FrozenTestChanged`], a missing one a broken invariant (fail
    /// closed).
    pub fn check_resolved(
        &self,
        state: &State,
        resolved: &ChangeSet,
        verdicts: &TestFileVerdicts,
    ) -> Result<ChangeSet, RuleViolation> {
        transition::check_resolved(&self.config, state, resolved, verdicts)
    }

    /// The files holding frozen tests that the pending step's change set `set` writes (a RED
    /// adding tests beside accepted ones), each to be judged on its syntax tree before
    /// [`Machine::check_resolved`]. Empty for any other step.
    pub fn frozen_files_written(&self, state: &State, set: &ChangeSet) -> Vec<FrozenWrite> {
        match &state.pending {
            Some(Pending::Apply { step, .. }) => transition::frozen_written(state, step, set),
            _ => Vec::new(),
        }
    }

    /// The plan of a scratch run for `step` in `state` (see [`ScratchPlan`]): for RED, GREEN,
    /// repair and REFACTOR; none for any other step. Pure, like every judgement here.
    pub fn scratch_plan(&self, state: &State, step: &Step) -> Option<ScratchPlan> {
        scratch::plan(state, step)
    }

    /// Where a ledger's run ended: the index of the event after which it was done or stopped,
    /// when it was. Nothing may follow it; a row after it (another process that went on
    /// driving a feature a person stopped) is one `consort verify` fails on.
    pub fn ended_at<'a>(&self, events: impl IntoIterator<Item = &'a Event>) -> Option<usize> {
        let mut state = State::default();
        for (i, event) in events.into_iter().enumerate() {
            if let Ok((next, _)) = self.step(&state, event) {
                state = next;
            }
            if matches!(state.phase(), Phase::Done | Phase::Stopped) {
                return Some(i);
            }
        }
        None
    }

    /// Replays events from the start; refused events are skipped exactly as they were when they
    /// were first fed. Returns the final state.
    pub fn replay<'a>(&self, events: impl IntoIterator<Item = &'a Event>) -> State {
        let mut state = State::default();
        for event in events {
            if let Ok((next, _)) = self.step(&state, event) {
                state = next;
            }
        }
        state
    }
}
