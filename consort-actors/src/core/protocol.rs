//! What the conductor, the role actors and the Lakebase actor exchange, as plain data: what an
//! assignment carries, what an answer cost, why an agent or the infrastructure failed, and the
//! requests and reports of test runs and promotions. The actor messages that carry them are
//! the runtime's (`runtime/messages.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::core::artifact::{
    ArchitectureVerdict, Artifact, ArtifactKind, EscalationReason, FeatureRequest, InfraFault,
    Migration, RequestId, SchemaPlan, Spec, Stories, TestEntry, TestList, UxDesign, VerdictReason,
};
use crate::core::budget::SpentBudget;
use crate::core::hash::ContentHash;
use crate::core::role::{ActorId, Role};

key_type! {
    /// The id of one assignment; unique within a run.
    #[serde(transparent)]
    pub struct AssignmentId(pub u64);
}

impl std::fmt::Display for AssignmentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "asg-{}", self.0)
    }
}

/// What an agent is given for a step: the artifacts so far and the files it needs.
///
/// The artifacts are shared with the conductor's state (`Arc`): building an assignment, and
/// keeping a copy of it for a retry after a crash, costs reference counts, not copies.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AssignmentInputs {
    /// The feature request.
    pub feature: Option<Arc<FeatureRequest>>,
    /// Stories, once written.
    pub stories: Option<Arc<Stories>>,
    /// The spec, once written.
    pub spec: Option<Arc<Spec>>,
    /// The architecture verdict, once given.
    pub architecture: Option<Arc<ArchitectureVerdict>>,
    /// The schema plan, once written.
    pub schema: Option<Arc<SchemaPlan>>,
    /// The test list, once written.
    pub test_list: Option<Arc<TestList>>,
    /// The UX design, once written.
    pub ux: Option<Arc<UxDesign>>,
    /// The test-list entry a build step works on.
    pub test: Option<TestEntry>,
    /// Work-tree files relevant to the step (path → content), read by the conductor.
    pub files: BTreeMap<String, String>,
    /// Work-tree files the step does not get in full, by path and size, and why: nothing is
    /// left out silently (see [`crate::core::context`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_included: Vec<NotIncluded>,
    /// The files past the listing's cap ([`crate::core::context::MAX_LISTED`]), counted: a large tree
    /// is summed up here rather than listed file by file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_listed: Option<NotListed>,
    /// The change sets accepted since the current test's last review, oldest first: what a
    /// review judges, and what a repair round tried before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Arc<crate::core::artifact::ChangeSet>>,
    /// For the schema plan: the migrations the project's earlier features promoted, which
    /// the plan builds on (its versions come after theirs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_migrations: Vec<crate::core::regression::EarlierMigration>,
    /// For the schema plan: how the project numbers its migration files, which the plan's
    /// versions must follow (the width, and after the last number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_numbering: Option<crate::core::migration_files::MigrationNumbering>,
    /// For the schema plan: the project's own migration tool, when it applies the migrations:
    /// each migration's `sql` is then the whole file in the tool's format (the project's
    /// existing migrations among the files show it), named after the project's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_tool: Option<crate::core::migration_files::ToolFormat>,
    /// For the schema plan: the database's tables as they stand before the feature, after the
    /// project's migrations, whatever tool made them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_catalog: Option<crate::core::catalog::SchemaCatalog>,
}

/// A work-tree file an assignment lists but does not carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NotIncluded {
    /// The path, relative to the work tree.
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Why it is left out.
    pub why: Omission,
}

/// How many files, and how many bytes, an assignment neither carries nor lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NotListed {
    /// Files.
    pub files: u64,
    /// Their total size in bytes.
    pub bytes: u64,
}

/// Why a file is listed rather than included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Omission {
    /// The step's context pack does not include it (see [`crate::core::context::pack`]).
    NotInPack,
    /// Including it would pass the assignment's byte limit.
    OverLimit,
    /// It is not UTF-8 text.
    NotText,
}

/// How the project's tests run: what the Test Strategist, the Navigator and the Driver are told
/// in every assignment, for every backend.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunnerFacts {
    /// The runner kind (`psql` or `command`).
    pub runner: String,
    /// How a run starts: the test command, or what psql runs.
    pub command: String,
    /// Globs of the files the runner runs as tests; a test-list entry elsewhere is refused.
    pub collects: Vec<String>,
    /// Globs of the code files the runner loads before the tests, in this order (empty: the
    /// tests load what they import).
    pub loads: Vec<String>,
    /// When a test counts as passed.
    pub pass_rule: String,
    /// What every run starts from.
    pub before_tests: String,
    /// The environment variables the tests get (names only).
    pub environment: Vec<String>,
    /// How the runner names a test: the form a test-list entry's `test_name` must take
    /// (see [`TestIdentity::form`](crate::TestIdentity::form)).
    #[serde(default)]
    pub test_names: String,
}

/// What the role may write at this step, besides [`RunnerFacts`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WriteRules {
    /// The rule in a sentence.
    pub summary: String,
    /// The path rules the machine judges every change set and test list with.
    pub paths: crate::core::paths::PathRules,
    /// Test files accepted in RED: frozen, no agent may change them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frozen_tests: Vec<String>,
    /// The tests earlier features of the project accepted, the regression suite: frozen too,
    /// and a change to one halts the run until a human retires it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_tests: Vec<crate::core::regression::EarlierTest>,
}

/// Tokens, calls and time spent on one assignment.
///
/// Every field defaults when missing, so usage written before a field existed still reads.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Usage {
    /// Prompt tokens, when the backend reports them.
    pub prompt_tokens: u64,
    /// Completion tokens, when the backend reports them.
    pub completion_tokens: u64,
    /// Prompt tokens the server answered from its prompt cache (a part of `prompt_tokens`).
    pub cached_tokens: u64,
    /// Model or program calls made.
    pub calls: u32,
    /// Tool calls the model made (function calling).
    pub tool_calls: u32,
    /// Wall time in milliseconds.
    pub wall_ms: u64,
    /// The model that answered, when the backend knows it. (A boxed `str`: a usage travels in
    /// every failure, which stays small.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<Box<str>>,
    /// Calls whose answer ended for a reason other than a natural stop or a tool call, by the
    /// reason the server gave (`length`: cut at the token limit; `content_filter`, …).
    /// (Boxed: a usage travels in every failure, which stays small.)
    #[serde(skip_serializing_if = "no_finish_reasons")]
    pub finish_reasons: Box<BTreeMap<String, u32>>,
    /// Tool calls that repeated an earlier call of the step word for word: answered from the
    /// first call's result, not run again (a part of `tool_calls`).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub repeated_tool_calls: u32,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

#[allow(clippy::borrowed_box)] // serde hands the field over as it is
fn no_finish_reasons(reasons: &Box<BTreeMap<String, u32>>) -> bool {
    reasons.is_empty()
}

impl Usage {
    /// Whether nothing at all was spent (the ledger omits such usage).
    pub fn is_zero(&self) -> bool {
        *self == Usage::default()
    }

    /// Prompt plus completion tokens.
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    /// Adds `other` to this usage (the model is kept, or taken from `other` when unknown).
    pub fn add(&mut self, other: &Usage) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.calls = self.calls.saturating_add(other.calls);
        self.tool_calls = self.tool_calls.saturating_add(other.tool_calls);
        self.wall_ms = self.wall_ms.saturating_add(other.wall_ms);
        self.repeated_tool_calls = self
            .repeated_tool_calls
            .saturating_add(other.repeated_tool_calls);
        for (reason, n) in other.finish_reasons.iter() {
            let count = self.finish_reasons.entry(reason.clone()).or_default();
            *count = count.saturating_add(*n);
        }
        if self.model.is_none() {
            self.model.clone_from(&other.model);
        }
    }
}

/// An artifact produced for an assignment, with its author.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Produced {
    /// The assignment answered.
    pub assignment: AssignmentId,
    /// The actor that produced it.
    pub author: ActorId,
    /// The artifact.
    pub artifact: Artifact,
    /// What it cost.
    pub usage: Usage,
    /// The step's transcript of tool calls and their results, when the agent kept one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript: Option<TranscriptRef>,
}

/// Where a step's transcript is kept and the SHA-256 of its bytes, as the ledger records it: a
/// resumed run finds the step done and its transcript checkable, and never repeats it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TranscriptRef {
    /// The file's name in the run's transcript directory (`.consort/transcripts/`).
    pub path: String,
    /// The hash of its contents.
    pub hash: ContentHash,
}

/// Why an agent could not produce an artifact.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, thiserror::Error,
)]
#[serde(tag = "failure", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum AgentFailure {
    /// The output stayed invalid (bad JSON, wrong schema, broken role rule) after the retries.
    #[error("invalid output after {attempts} attempt(s): {detail}")]
    InvalidOutput {
        /// Attempts made.
        attempts: u32,
        /// What was wrong with the last one.
        detail: String,
        /// What the attempts cost (the answers were refused, the tokens are spent).
        #[serde(default, skip_serializing_if = "Usage::is_zero")]
        usage: Usage,
    },
    /// The role produced an artifact kind it may not produce.
    #[error("{role} may not produce a {kind} for this step")]
    KindNotAllowed {
        /// The role.
        role: Role,
        /// The kind it produced.
        kind: ArtifactKind,
    },
    /// The role was asked for a step that is not its own.
    #[error("{role} was assigned step {step}, which is not its own")]
    WrongRole {
        /// The role asked.
        role: Role,
        /// The step.
        step: String,
    },
    /// A scripted agent's next entry does not answer this assignment.
    #[error("script mismatch: expected an entry for {wanted}, found {found}")]
    ScriptMismatch {
        /// The step asked.
        wanted: String,
        /// What the script had next.
        found: String,
    },
    /// A scripted agent has no entry left.
    #[error("script exhausted: no entry left for {wanted}")]
    ScriptExhausted {
        /// The step asked.
        wanted: String,
    },
    /// A token or time budget was exceeded (written by earlier versions, whose budgets lived in
    /// the agent; kept so their ledgers still read).
    #[error("budget exceeded: {detail}")]
    BudgetExceeded {
        /// Which budget, and by how much.
        detail: String,
    },
    /// A budget of the run or the role is spent, or the next call would go over what is left:
    /// the call was not made.
    #[error("budget spent: {budget}")]
    BudgetSpent {
        /// Which budget, its limit and what is spent.
        budget: SpentBudget,
        /// What the step had spent before it stopped.
        #[serde(default, skip_serializing_if = "Usage::is_zero")]
        usage: Usage,
    },
    /// The step's prompt does not fit the model's context window, even after it was fitted
    /// (contents listed instead of carried, older feedback dropped), or the server said so:
    /// the call was not made again.
    #[error(
        "the prompt for step {step} needs about {prompt_tokens} tokens, more than the model's context window{} ({measured})",
        window_text(*.window)
    )]
    ContextExceeded {
        /// The step.
        step: String,
        /// The prompt's size in tokens (the server's count, or Consort's estimate).
        prompt_tokens: u32,
        /// The context window in tokens, when known.
        window: Option<u32>,
        /// Who measured.
        measured: ContextMeasure,
        /// What the step spent before it stopped.
        #[serde(default, skip_serializing_if = "Usage::is_zero")]
        usage: Usage,
    },
    /// The model server failed after the retries (5xx, 429, connection refused).
    #[error("model server failing: {detail}")]
    ModelUnavailable {
        /// What happened (never the key).
        detail: String,
        /// What the step spent on the calls before the server failed.
        #[serde(default, skip_serializing_if = "Usage::is_zero")]
        usage: Usage,
    },
    /// The agent did not answer within its time limit.
    #[error("timed out after {secs} s")]
    Timeout {
        /// The limit.
        secs: u64,
    },
    /// An external agent program failed or broke a rule (for example wrote outside its copy).
    #[error("agent command failed: {detail}")]
    CommandFailed {
        /// What happened.
        detail: String,
    },
    /// The actor crashed while working on the step.
    #[error("agent actor crashed: {detail}")]
    Crashed {
        /// The panic or error text.
        detail: String,
    },
}

/// Who found that a prompt does not fit a context window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ContextMeasure {
    /// Consort's estimate before the call, after cutting what could be cut: no call was made.
    Estimated,
    /// The server refused the call.
    ServerRefused,
}

impl std::fmt::Display for ContextMeasure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ContextMeasure::Estimated => {
                "estimated before the call, after cutting what could be cut; no call was made"
            }
            ContextMeasure::ServerRefused => "the server refused the call",
        })
    }
}

fn window_text(window: Option<u32>) -> String {
    window.map_or(String::new(), |n| format!(" of {n} tokens"))
}

impl AgentFailure {
    /// Whether the failure is the infrastructure's (model server, time, crash) rather than the
    /// agent's output.
    pub fn is_infrastructure(&self) -> bool {
        matches!(
            self,
            AgentFailure::ModelUnavailable { .. }
                | AgentFailure::ContextExceeded { .. }
                | AgentFailure::Timeout { .. }
                | AgentFailure::Crashed { .. }
        )
    }

    /// What the failed attempt had spent, as far as the agent reported it.
    pub fn usage(&self) -> Usage {
        match self {
            AgentFailure::InvalidOutput { usage, .. }
            | AgentFailure::BudgetSpent { usage, .. }
            | AgentFailure::ModelUnavailable { usage, .. }
            | AgentFailure::ContextExceeded { usage, .. } => usage.clone(),
            _ => Usage::default(),
        }
    }

    /// The same failure carrying `spent` as what the step spent, for the failures that carry
    /// usage and have none yet.
    pub fn with_usage(mut self, spent: &Usage) -> Self {
        match &mut self {
            AgentFailure::InvalidOutput { usage, .. }
            | AgentFailure::BudgetSpent { usage, .. }
            | AgentFailure::ModelUnavailable { usage, .. }
            | AgentFailure::ContextExceeded { usage, .. }
                if usage.is_zero() =>
            {
                usage.clone_from(spent);
            }
            _ => {}
        }
        self
    }

    /// The escalation reason this failure maps to when it stops a run.
    pub fn escalation_reason(&self) -> EscalationReason {
        match self {
            AgentFailure::ModelUnavailable { .. } => {
                EscalationReason::Infrastructure(InfraFault::ModelServerFailing)
            }
            AgentFailure::ContextExceeded { .. } => {
                EscalationReason::Infrastructure(InfraFault::ContextWindowTooSmall)
            }
            AgentFailure::Timeout { .. } => EscalationReason::Infrastructure(InfraFault::Timeout),
            AgentFailure::Crashed { .. } => {
                EscalationReason::Infrastructure(InfraFault::ActorCrashing)
            }
            AgentFailure::BudgetExceeded { .. } => {
                EscalationReason::Verdict(VerdictReason::BudgetExceeded)
            }
            AgentFailure::BudgetSpent { budget, .. } => {
                EscalationReason::BudgetSpent(budget.budget.clone())
            }
            AgentFailure::KindNotAllowed { .. } | AgentFailure::WrongRole { .. } => {
                EscalationReason::Verdict(VerdictReason::RuleViolated)
            }
            AgentFailure::InvalidOutput { .. }
            | AgentFailure::ScriptMismatch { .. }
            | AgentFailure::ScriptExhausted { .. }
            | AgentFailure::CommandFailed { .. } => {
                EscalationReason::Verdict(VerdictReason::InvalidOutput)
            }
        }
    }
}

/// Why a verification was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum VerifyPurpose {
    /// The new test must fail; earlier tests must pass.
    Red,
    /// Everything must pass.
    Green,
    /// Everything must still pass after a refactor.
    Refactor,
    /// The full suite before release.
    Deploy,
    /// The project's whole suite when the build lane opens, before any agent acts, run exactly
    /// as the verifications will: what fails there fails before the feature, and a person
    /// decides about it.
    Baseline,
}

/// What a build step's run covers (`[runner] per_step`; recorded in the feature's start event,
/// so a replay judges every run as it was judged).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum StepScope {
    /// Every run is the whole suite (the default).
    #[default]
    Whole,
    /// A step runs the feature's own tests up to its entry, on one branch in one process; the
    /// GREEN and REFACTOR runs of each story's last entry, the deploy run and the merge check
    /// run the whole suite. A test of an earlier feature or of the project that a step breaks
    /// is found at the end of the story, and charged to that step.
    Feature,
}

impl StepScope {
    /// Whether this is [`StepScope::Whole`].
    pub fn is_whole(&self) -> bool {
        matches!(self, StepScope::Whole)
    }
}

/// A request to run the test suite on a fresh branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VerifyRequest {
    /// Unique id; the receipt must carry it.
    pub id: RequestId,
    /// Why.
    pub purpose: VerifyPurpose,
    /// The work tree to test.
    pub work_tree: PathBuf,
    /// The hash of the work tree the conductor expects to be tested.
    pub workspace_hash: ContentHash,
    /// The files of the tree `workspace_hash` is the hash of (path to content hash), when the
    /// conductor kept them: a run that finds another tree names the paths that differ
    /// ([`crate::TestRunReceipt::changed_since_request`]). None: not kept (a tree the conductor did
    /// not write last, or a request of an older version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<crate::core::artifact::FileHashes>,
    /// The migrations accepted so far, applied to the fresh branch before the run.
    pub migrations: Vec<Migration>,
    /// The runner names of the tests expected so far (for runners that run named tests).
    pub tests: Vec<String>,
    /// The current entry's test: the new test in RED, the test made to pass in GREEN. Every
    /// other test was green before the step (so a failure of one is run once more, to tell a
    /// flaky test from a broken one); none in REFACTOR and the deploy run.
    pub focus: Option<String>,
    /// The project's extra cache directory names (`[paths] caches`), skipped at any depth when
    /// the tree is hashed, on top of the defaults of [`crate::core::paths::TreeFilter`]: the verifier
    /// hashes exactly what the conductor hashed. Empty in requests written before it existed.
    #[serde(default)]
    pub caches: Vec<String>,
    /// More paths the run may not read, on top of its own tree's `.consort/` (a scratch run
    /// hides the real tree's state too). Empty in requests written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<PathBuf>,
    /// The tests to run, by runner name, when the step runs only the feature's own
    /// ([`StepScope::Feature`]); empty: the whole suite. A runner that cannot run a selection,
    /// or a name it cannot place in a file, runs the whole suite.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub select: Vec<String>,
    /// The tests a person quarantined (by runner name): their failures judge nothing, so none
    /// of them stops a split run early. Empty in requests written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<String>,
    /// The hash of the configuration that judges the runs, in force for this request (see
    /// [`crate::Harness`]); the receipt names it. None before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness: Option<ContentHash>,
    /// With the project's migration tool: what its bookkeeping must hold once it applied the
    /// design's migrations of this run (see [`crate::ToolFormat::expected_records`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_records: Vec<String>,
}

/// A request to apply the migrations to the parent database and check them there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PromoteRequest {
    /// Unique id; the report must carry it.
    pub id: RequestId,
    /// The approved migrations, in order.
    pub migrations: Vec<Migration>,
    /// The work tree whose migration files the project's migration tool applies, when one
    /// does (see [`crate::ToolFormat`]); None in requests written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_tree: Option<std::path::PathBuf>,
    /// With the project's migration tool: what its bookkeeping must hold once the design's
    /// migrations are applied (see [`crate::ToolFormat::expected_records`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_records: Vec<String>,
}

/// What a promotion did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PromoteReport {
    /// The request answered.
    pub request_id: RequestId,
    /// The parent database (a name, never a connection string with a secret).
    pub target: String,
    /// Versions applied by this promotion.
    pub applied: Vec<String>,
    /// Versions that were already there with the same checksum.
    pub already_applied: Vec<String>,
    /// Every version in the plan is recorded in the parent with the plan's checksum.
    pub verified: bool,
    /// A lane's merge check, when its branch was merged with work that reached the base
    /// since it started: the run of every merged feature's accepted tests and the lane's on
    /// the merged tree, which passed (a failing one refuses the promotion instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_check: Option<MergeCheckRun>,
}

impl PromoteReport {
    /// What the promotion did to the parent, in words: the versions it applied, or that the
    /// design had no migration at all — never an empty "applied" that reads as success.
    pub fn applied_text(&self) -> String {
        let already = if self.already_applied.is_empty() {
            String::new()
        } else {
            format!(" (already applied: {})", self.already_applied.join(", "))
        };
        match (self.applied.is_empty(), self.already_applied.is_empty()) {
            (false, _) => format!("applied {}{already}", self.applied.join(", ")),
            (true, false) => format!("applied nothing new{already}"),
            (true, true) => "no migration: the design's schema plan has none".into(),
        }
    }
}

/// A lane's merge check as it ran (see [`PromoteReport::merge_check`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MergeCheckRun {
    /// The features whose work the lane was merged with, in backlog order.
    pub merged_with: Vec<String>,
    /// The run's receipt, on its own fresh branch (boxed: a report stays small).
    pub receipt: Box<crate::core::artifact::TestRunReceipt>,
}

/// An infrastructure fault on the Lakebase side (never a test verdict: red tests are a receipt).
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, thiserror::Error,
)]
#[error("{fault}: {detail}")]
pub struct InfraError {
    /// Which kind of fault.
    pub fault: InfraFault,
    /// What happened (never contains a password).
    pub detail: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_promotion_says_what_it_applied_or_that_there_was_nothing() {
        let report = |applied: &[&str], already: &[&str]| PromoteReport {
            request_id: RequestId(1),
            target: "app".into(),
            applied: applied.iter().map(|v| v.to_string()).collect(),
            already_applied: already.iter().map(|v| v.to_string()).collect(),
            verified: true,
            merge_check: None,
        };
        assert_eq!(
            report(&["0001_a", "0002_b"], &[]).applied_text(),
            "applied 0001_a, 0002_b"
        );
        assert_eq!(
            report(&[], &["0001_a"]).applied_text(),
            "applied nothing new (already applied: 0001_a)"
        );
        let none = report(&[], &[]).applied_text();
        assert!(none.starts_with("no migration"), "{none}");
        assert!(
            !none.contains("applied"),
            "an empty promotion never reads as applied: {none}"
        );
    }

    #[test]
    fn failures_say_whose_fault() {
        assert!(AgentFailure::Timeout { secs: 1 }.is_infrastructure());
        assert!(
            !AgentFailure::InvalidOutput {
                attempts: 3,
                detail: "x".into(),
                usage: Usage::default(),
            }
            .is_infrastructure()
        );
        assert!(
            !AgentFailure::ModelUnavailable {
                detail: "503".into(),
                usage: Usage::default(),
            }
            .escalation_reason()
            .is_verdict()
        );
        assert!(
            AgentFailure::BudgetExceeded {
                detail: "tokens".into()
            }
            .escalation_reason()
            .is_verdict()
        );
    }
}
