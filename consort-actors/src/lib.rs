//! The Consort runtime: typed artifacts, the pure lifecycle state machine, the conductor actor,
//! supervision, gates, and the hash-chained ledger.
//!
//! **Architecture invariant:** this crate knows no LLM and no database. Role agents live in
//! `consort-agents`, database branches and test runs in `consort-lakebase`; both speak to the
//! conductor only through the messages [`RoleMsg`] and [`LakebaseMsg`].
//!
//! Every public item has one path, at this crate's root.
//!
//! # Example
//!
//! The [`Machine`] is a plain function of state and event: start a run, see what it asks for,
//! and see it refuse an answer that breaks a rule while its state stays where it was.
//!
//! ```
//! use consort_actors::{
//!     ActorId, Artifact, Command, Event, FeatureRequest, Machine, MachineConfig, Role,
//!     RuleViolation, State, Step, Stories,
//! };
//!
//! let machine = Machine::new(MachineConfig::default());
//! let start = Event::Start {
//!     feature: FeatureRequest {
//!         id: "F1".into(),
//!         title: "Stock levels".into(),
//!         body: "Show the stock of every product per warehouse.".into(),
//!     },
//!     inherited: Default::default(),
//!     per_step: Default::default(),
//!     harness: None,
//! };
//! let (state, commands) = machine.step(&State::default(), &start).expect("a run starts");
//! let Some(Command::Assign { id, role, step, .. }) = commands.first() else {
//!     panic!("the first command asks a role");
//! };
//! assert_eq!((*role, step), (Role::ProductOwner, &Step::Stories));
//!
//! // A backlog with no story in it is refused; the same command is still the one pending.
//! let empty = Event::Produced {
//!     assignment: *id,
//!     author: ActorId::new(Role::ProductOwner, "product-owner"),
//!     artifact: Artifact::Stories(Stories { feature_id: "F1".into(), stories: vec![] }),
//!     usage: Default::default(),
//!     transcript: None,
//! };
//! let refused: RuleViolation = machine.step(&state, &empty).expect_err("refused");
//! assert!(!refused.to_string().is_empty());
//! assert_eq!(state.pending_command().as_ref(), commands.first());
//! ```

// The library holds no function over 100 lines (clippy.toml sets the threshold).
#![warn(clippy::too_many_lines)]

/// Declares a small `Copy` key, an id or a closed set of names, with the derives every such key
/// of the protocol has: comparable and hashable (a map or set key), serialisable, and described
/// in the JSON schema.
macro_rules! key_type {
    ($item:item) => {
        #[derive(
            Debug,
            Clone,
            Copy,
            PartialEq,
            Eq,
            Hash,
            PartialOrd,
            Ord,
            serde::Serialize,
            serde::Deserialize,
            schemars::JsonSchema,
        )]
        $item
    };
}

/// `Display` for closed sets of names: each value shows as its `as_str`.
macro_rules! display_as_str {
    ($($ty:ty),* $(,)?) => {$(
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}

// The layers: the pure core, then the ledger, then the work tree, then the runtime; each uses
// only those before it (`tests/machine/layers.rs`).
mod core;
mod event_log;
mod ledger;
mod runtime;
mod worktree;

pub use crate::core::context;
pub use crate::runtime::workbench;

use crate::core::{
    artifact, budget, catalog, harness, hash, history, machine, migration_files, paths, protocol,
    regression, role, step, test_identity, test_outline, text,
};
use crate::runtime::{conductor, gate, messages, supervision};

// The public surface, flat: every public item has exactly this one path (or one in `context`
// or `workbench`). Grouped by layer; what only the crate itself needs is not here.

// The core: artifacts, the state machine and its rules, budgets, paths, the run's history, and
// the data an assignment and its answer carry.
pub use artifact::{
    AcceptanceCriterion, ArchitectureVerdict, Artifact, ArtifactKind, ChangeSet, Confinement,
    DesignBundle, Escalation, EscalationReason, ExitRecord, FeatureRequest, FileChange, FileHashes,
    GateApproval, GateDecision, GateKind, InfraFault, Migration, MissingModule,
    PersistenceInvariant, RequestId, Requirement, ReviewVerdict, RunTimings, SchemaPlan, Screen,
    ShardRun, Spec, Stories, Story, TestEntry, TestList, TestOutcome, TestRunReceipt, TestStatus,
    UxDesign, VerdictReason, unrealised_invariants,
};
pub use budget::{
    Allowance, BudgetName, Budgets, CallEstimate, Limits, Measure, Price, Remaining, RoleUsage,
    SpentBudget, Tally, UsageTotals, usage_totals,
};
pub use catalog::{CatalogTable, MAX_CATALOG_TABLES, SchemaCatalog};
pub use harness::{Harness, HarnessChange};
pub use hash::{ContentHash, ParseHashError, canonical_json};
pub use history::{CommitKind, FilesWritten, StepCommit, Unverified, step_commits, unverified};
pub use machine::{
    Baseline, BuildProgress, Command, Event, Frozen, FrozenWrite, HumanDecision, LifecycleEdge,
    Machine, MachineConfig, Pending, Phase, Redo, ReleaseEvidence, Remedy, RuleViolation,
    RunStatus, ScratchPlan, ScratchVerdict, State, Writer, check_architecture, check_change_set,
    check_review, check_schema, check_spec, check_stories, check_test_list, check_ux,
    lifecycle_edges, refusal_said,
};
pub use migration_files::{
    MigrationFiles, MigrationNumbering, Recorded, ToolFormat, file_name as migration_file_name,
};
pub use paths::{
    CacheNameError, DEFAULT_CACHES, DEPENDENCY_DIRS, GlobError, PathError, PathPolicy, PathRules,
    STATE_DIR, TreeFilter, WriteProblem, check_glob, dependency_caches, glob_covers, literal_glob,
    normalise_relative,
};
pub use protocol::{
    AgentFailure, AssignmentId, AssignmentInputs, ContextMeasure, InfraError, MergeCheckRun,
    NotIncluded, NotListed, Omission, Produced, PromoteReport, PromoteRequest, RunnerFacts,
    StepScope, TranscriptRef, Usage, VerifyPurpose, VerifyRequest, WriteRules,
};
pub use regression::{EarlierMigration, EarlierTest, Inherited, Quarantine, Retirement};
pub use role::{ActorId, Role, UnknownRole};
pub use step::{ParseStepError, Step};
pub use test_identity::TestIdentity;
pub use test_outline::{
    FrozenChange, Language as TestLanguage, PARSED_LANGUAGES, TestFileVerdicts,
    judge as judge_test_file,
};
pub use text::{counted, duration_text, error_chain, first_and_more};

// The ledger: the hash-chained record every event is appended to before it takes effect.
pub use event_log::{
    EventLog, EventLogError, EventLogOpener, FileEventLog, LedgerMovedOn, OpenEventLog,
};
pub use ledger::{
    DEFAULT_LEDGER_PATH, DEFAULT_MAX_LINE_BYTES, Entry, GENESIS_HEX, Ledger, LedgerError,
    LedgerOptions, VerifyReport, entry_line, genesis, verify_line,
};

// The work tree: hashing, reading and applying change sets, confined to the tree.
pub use worktree::{PathIoError, WorkTree, WorkTreeError, hash_dir};

// The runtime: the conductor, its messages, the gates' approvers, supervision.
pub use conductor::{
    APPLY_JOURNAL, AppendObserver, Conductor, ConductorConfig, ConductorError, ConductorHandle,
    ConductorMsg, ConductorState, DESIGN_FILE, DirectLakebase, DirectRole, LakebaseEndpoint,
    OfflineDecision, Progress, RoleEndpoint, RunEvent, RunOutcome, RunReport, SupervisedLakebase,
    SupervisedRole, Wiring, design_hash_on_disk, existing_migrations, record_decision,
    record_gate_decision, record_human_decision, replay_ledger,
};
pub use gate::{ApproveAs, Approver, BoxFuture, GateRequest, StopAtGates};
pub use messages::{Assignment, LakebaseMsg, RoleMsg, RoleReply};
pub use supervision::{
    ChildPhase, ChildSpec, ChildStatus, RestartDecision, RestartIntensity, RestartPolicy, SpawnFn,
    SpawnFuture, Supervised, SupervisionError,
};

/// The actor runtime the protocol is typed in ([`RoleMsg`] carries a `ractor::RpcReplyPort`), so
/// that an embedder's own role or Lakebase actor uses exactly the same version.
pub use ractor;
