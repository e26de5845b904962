//! The typed artifacts that pass between the conductor and the actors.
//!
//! Every artifact is plain data: serde-serialisable, hashable with
//! [`ContentHash::of`](crate::ContentHash::of), and free of behaviour beyond validation helpers.
//! Agents produce the design artifacts, change sets and verdicts; only the Lakebase side
//! produces [`TestRunReceipt`]s; only a human produces a [`GateApproval`].

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::core::hash::ContentHash;

/// The feature request that starts a run: markdown written by a human.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FeatureRequest {
    /// A stable id such as `F1-stock-visibility`.
    pub id: String,
    /// A one-line title.
    pub title: String,
    /// The request itself, as markdown.
    pub body: String,
}

/// One acceptance criterion, in given/when/then form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AcceptanceCriterion {
    /// A stable id prefixed by its story's id, such as `S1-AC2`.
    pub id: String,
    /// The starting situation.
    pub given: String,
    /// The action.
    pub when: String,
    /// The observable outcome.
    pub then: String,
}

/// One user story with its acceptance criteria.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Story {
    /// A stable id such as `S1`.
    pub id: String,
    /// A short title.
    pub title: String,
    /// "As a …"
    pub as_a: String,
    /// "I want to …"
    pub i_want: String,
    /// "so that …"
    pub so_that: String,
    /// Whether a person uses this story through an interface (then the UX Designer designs it).
    #[serde(default)]
    pub user_facing: bool,
    /// The acceptance criteria; at least one.
    pub acceptance_criteria: Vec<AcceptanceCriterion>,
}

/// The Product Owner's backlog for one feature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Stories {
    /// The feature these stories realise.
    pub feature_id: String,
    /// The stories in build order.
    pub stories: Vec<Story>,
}

impl Stories {
    /// Every acceptance-criterion id, in order.
    pub fn ac_ids(&self) -> impl Iterator<Item = &str> {
        self.stories
            .iter()
            .flat_map(|s| s.acceptance_criteria.iter().map(|ac| ac.id.as_str()))
    }

    /// The story that owns an acceptance criterion.
    pub fn story_of_ac(&self, ac_id: &str) -> Option<&Story> {
        self.stories
            .iter()
            .find(|s| s.acceptance_criteria.iter().any(|ac| ac.id == ac_id))
    }
}

/// One requirement of the specification, traced to an acceptance criterion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Requirement {
    /// A stable id such as `R1`.
    pub id: String,
    /// The acceptance criterion it makes precise.
    pub ac_id: String,
    /// The testable statement.
    pub statement: String,
}

/// The Spec Author's structured, testable specification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Spec {
    /// The feature this specifies.
    pub feature_id: String,
    /// A short summary.
    pub summary: String,
    /// The requirements, each traced to an acceptance criterion.
    pub requirements: Vec<Requirement>,
    /// What is deliberately not part of the feature.
    #[serde(default)]
    pub out_of_scope: Vec<String>,
    /// Questions left open.
    #[serde(default)]
    pub open_questions: Vec<String>,
}

/// A persistence invariant the schema must realise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PersistenceInvariant {
    /// A stable id such as `PI1-sku-location-unique`.
    pub id: String,
    /// The kind: unique, foreign_key, not_null, check, transactional, …
    pub kind: String,
    /// What must hold.
    pub brief: String,
}

/// The Architect Reviewer's verdict on the specification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "decision", rename_all = "kebab-case")]
pub enum ArchitectureVerdict {
    /// The spec is sound; these are the layering notes, NFRs and invariants.
    Approve {
        /// Layering and structure notes.
        #[serde(default)]
        layers: Vec<String>,
        /// Non-functional requirements.
        #[serde(default)]
        nfrs: Vec<String>,
        /// Persistence invariants the DBA must realise.
        #[serde(default)]
        invariants: Vec<PersistenceInvariant>,
    },
    /// The spec goes back to the Spec Author with these reasons.
    Revise {
        /// Why, specifically.
        reasons: Vec<String>,
    },
}

impl ArchitectureVerdict {
    /// The persistence invariants an approval names for the DBA (none for a revision).
    pub fn invariants(&self) -> &[PersistenceInvariant] {
        match self {
            Self::Approve { invariants, .. } => invariants,
            Self::Revise { .. } => &[],
        }
    }
}

/// What a design's schema plan leaves undone: with no migration while the architecture names
/// persistence invariants, the words a person reads at the design gate (`None` otherwise).
pub fn unrealised_invariants(
    architecture: &ArchitectureVerdict,
    schema: &SchemaPlan,
) -> Option<String> {
    let invariants = architecture.invariants();
    if !schema.migrations.is_empty() || invariants.is_empty() {
        return None;
    }
    let ids: Vec<&str> = invariants.iter().map(|i| i.id.as_str()).collect();
    Some(format!(
        "no migration, though the architecture names {} ({}): nothing in this design makes the database hold them",
        crate::core::text::counted(
            invariants.len() as u64,
            "persistence invariant",
            "persistence invariants"
        ),
        ids.join(", ")
    ))
}

/// One ordered SQL migration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Migration {
    /// A version id, unique and ordered, such as `0001_stock_records`.
    pub version: String,
    /// The story this migration serves.
    pub story_id: String,
    /// What it does, in a line.
    #[serde(default)]
    pub description: String,
    /// The SQL, applied in one transaction.
    pub sql: String,
}

impl Migration {
    /// The checksum recorded with an applied migration: SHA-256 of its normalised SQL.
    pub fn checksum(&self) -> ContentHash {
        Self::checksum_of(&self.sql)
    }

    /// Whether its text is a psql script rather than SQL: a line that starts with a backslash
    /// (a meta-command such as `\set` or `\i`, or the end of COPY data, `\.`), which no SQL
    /// statement begins with. Only a project's own existing schema files may be psql scripts
    /// (applied by psql); the design's migrations are SQL (`check_schema` refuses one that
    /// is not), since psql runs what its meta-commands say unconfined.
    pub fn is_psql_script(&self) -> bool {
        self.sql
            .lines()
            .any(|line| line.trim_start().starts_with('\\'))
    }

    /// The checksum [`Migration::checksum`] gives a migration holding `sql`.
    pub fn checksum_of(sql: &str) -> ContentHash {
        ContentHash::of_bytes(crate::core::hash::normalise_newlines(sql).as_bytes())
    }
}

/// The DBA's physical schema and per-story migration plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SchemaPlan {
    /// Migrations in the order they are applied.
    pub migrations: Vec<Migration>,
}

/// One entry of the ordered master test list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TestEntry {
    /// A stable id such as `T1`.
    pub id: String,
    /// The acceptance criterion this test proves.
    pub ac_id: String,
    /// What the test checks.
    pub description: String,
    /// The test file it lives in, relative to the work tree; must match a test-path glob.
    pub path: String,
    /// The name the test runner reports for it. Defaults to `path` (one test per file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_name: Option<String>,
}

impl TestEntry {
    /// The name under which the runner reports this test.
    pub fn runner_name(&self) -> &str {
        self.test_name.as_deref().unwrap_or(&self.path)
    }
}

/// The Test Strategist's ordered master test list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TestList {
    /// The tests, in build order.
    pub entries: Vec<TestEntry>,
}

/// One screen of the interface design.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Screen {
    /// The user-facing story this screen serves.
    pub story_id: String,
    /// The screen's name.
    pub name: String,
    /// The elements it shows.
    pub elements: Vec<String>,
}

/// The UX Designer's interface design; only for user-facing stories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UxDesign {
    /// The screens, at least one per user-facing story.
    pub screens: Vec<Screen>,
    /// Design notes: tokens, states, empty states.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// One file change: the full new content of a file, or its deletion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum FileChange {
    /// Create or overwrite the file with exactly this content.
    Write {
        /// Path relative to the work tree.
        path: String,
        /// The whole new content.
        content: String,
    },
    /// Remove the file.
    Delete {
        /// Path relative to the work tree.
        path: String,
    },
    /// Put back exactly these bytes, given in hex: the conductor's undo of a file that is not
    /// UTF-8 text (which a [`FileChange::Write`] cannot hold). No agent may write it: it is not
    /// in the schema agents answer with, and the machine refuses it in their change sets.
    #[schemars(skip)]
    Restore {
        /// Path relative to the work tree.
        path: String,
        /// The file's bytes, as lowercase hex.
        hex: String,
    },
}

impl FileChange {
    /// The path this change touches.
    pub fn path(&self) -> &str {
        match self {
            FileChange::Write { path, .. }
            | FileChange::Delete { path }
            | FileChange::Restore { path, .. } => path,
        }
    }

    /// The same change at another path.
    pub fn at(&self, path: String) -> FileChange {
        match self {
            FileChange::Write { content, .. } => FileChange::Write {
                path,
                content: content.clone(),
            },
            FileChange::Delete { .. } => FileChange::Delete { path },
            FileChange::Restore { hex, .. } => FileChange::Restore {
                path,
                hex: hex.clone(),
            },
        }
    }

    /// The change that makes `path` hold exactly `bytes`: a [`FileChange::Write`] when they are
    /// UTF-8 text, a [`FileChange::Restore`] otherwise. Nothing is lost either way.
    pub fn exactly(path: String, bytes: Vec<u8>) -> FileChange {
        match String::from_utf8(bytes) {
            Ok(content) => FileChange::Write { path, content },
            Err(e) => FileChange::Restore {
                path,
                hex: hex::encode(e.into_bytes()),
            },
        }
    }

    /// The bytes this change leaves at its path (None for a deletion, or a malformed restore).
    pub fn bytes(&self) -> Option<std::borrow::Cow<'_, [u8]>> {
        match self {
            FileChange::Write { content, .. } => Some(content.as_bytes().into()),
            FileChange::Delete { .. } => None,
            FileChange::Restore { hex, .. } => hex::decode(hex).ok().map(Into::into),
        }
    }
}

/// A set of file changes proposed by the Navigator (tests) or the Driver (code).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChangeSet {
    /// What the change does, in a line.
    #[serde(default)]
    pub summary: String,
    /// The changes, applied in order.
    pub changes: Vec<FileChange>,
}

/// The Navigator's review of the Driver's code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "decision", rename_all = "kebab-case")]
pub enum ReviewVerdict {
    /// The code is accepted.
    Approve {
        /// Optional remarks.
        #[serde(default)]
        notes: Vec<String>,
    },
    /// The Driver must refactor, for these reasons.
    ChangesRequested {
        /// What to change, specifically.
        reasons: Vec<String>,
    },
}

/// The outcome of one test in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TestStatus {
    /// It ran and passed.
    Passed,
    /// It ran and failed.
    Failed,
    /// It was skipped.
    Skipped,
    /// It could not run (setup error, crash).
    Errored,
}

impl fmt::Display for TestStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TestStatus::Passed => "passed",
            TestStatus::Failed => "failed",
            TestStatus::Skipped => "skipped",
            TestStatus::Errored => "errored",
        })
    }
}

/// One named test's outcome in a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TestOutcome {
    /// The name the runner reported.
    pub name: String,
    /// Its status.
    pub status: TestStatus,
    /// What the runner said about a failed or errored test: the failure's message and
    /// location, as its report gives them (JUnit `<failure>`, a TAP diagnostic, libtest's
    /// captured output, `go test`'s output lines), capped at [`TestOutcome::MESSAGE_CAP`]
    /// characters. Absent for passing tests and for runners that give none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl TestOutcome {
    /// Most characters of a failure message a receipt keeps per test.
    pub const MESSAGE_CAP: usize = 1500;

    /// The name of the outcome a run that did not succeed gets when it named no failing test:
    /// the suite failed as a whole (no test of that name exists).
    pub const WHOLE_RUN: &'static str = "(exit)";

    /// An outcome without a message.
    pub fn new(name: impl Into<String>, status: TestStatus) -> TestOutcome {
        TestOutcome {
            name: name.into(),
            status,
            message: None,
        }
    }

    /// This outcome with the runner's text about it: trimmed, capped at
    /// [`TestOutcome::MESSAGE_CAP`] characters (its head and tail kept), and dropped when
    /// empty.
    pub fn with_message(mut self, text: &str) -> TestOutcome {
        let text = text.trim();
        self.message =
            (!text.is_empty()).then(|| crate::core::text::head_and_tail(text, Self::MESSAGE_CAP));
        self
    }

    /// Whether the test failed or errored.
    pub fn is_failure(&self) -> bool {
        matches!(self.status, TestStatus::Failed | TestStatus::Errored)
    }
}

/// How the test command ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ExitRecord {
    /// The exit code, when the process exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Whether the time limit killed it.
    pub timed_out: bool,
}

impl std::fmt::Display for ExitRecord {
    /// `exit 3`, `killed by signal 9`, `timed out`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.timed_out, self.code, self.signal) {
            (true, _, _) => f.write_str("timed out"),
            (false, Some(code), _) => write!(f, "exit {code}"),
            (false, None, Some(signal)) => write!(f, "killed by signal {signal}"),
            (false, None, None) => f.write_str("no exit status"),
        }
    }
}

impl ExitRecord {
    /// Exit code 0, no signal, no timeout.
    pub fn success(&self) -> bool {
        self.code == Some(0) && self.signal.is_none() && !self.timed_out
    }
}

/// How long each part of a verification took, in milliseconds.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct RunTimings {
    /// Getting a fresh branch.
    pub acquire_ms: u64,
    /// Applying migrations to it.
    pub migrate_ms: u64,
    /// Running the tests.
    pub run_ms: u64,
}

/// Evidence of one real test run on one fresh database branch.
///
/// **Only the Lakebase side produces receipts**: no role may return one, and the state machine
/// accepts a receipt only as the answer to the verify request it issued, for the workspace hash
/// it was issued for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TestRunReceipt {
    /// The verify request this answers.
    pub request_id: RequestId,
    /// The hash of the work tree that was tested.
    pub workspace_hash: ContentHash,
    /// The branch provider (`embedded`, `postgres-url`, `lakebase`).
    pub provider: String,
    /// How the branch's files were made from its base's: `clone` (PostgreSQL 18's file clones
    /// on a file system with reflinks) or `copy`; absent when the provider does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_copy: Option<String>,
    /// The branch the tests ran against.
    pub branch_id: String,
    /// The runner (`psql`, `command`).
    pub runner: String,
    /// The command line that ran (secrets never appear here).
    pub command: String,
    /// Time spent per part.
    pub timings: RunTimings,
    /// Per-test outcomes.
    pub outcomes: Vec<TestOutcome>,
    /// How the command ended.
    pub exit: ExitRecord,
    /// SHA-256 of the whole captured output.
    pub output_digest: ContentHash,
    /// The start and end of the output, capped.
    pub output_excerpt: String,
    /// How the run was confined (see [`Confinement`]).
    #[serde(default, skip_serializing_if = "Confinement::is_unrecorded")]
    pub confinement: Confinement,
    /// Work-tree paths the run itself changed, outside the declared caches. A receipt with any
    /// is void: the run changed what it was judged on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tree_changes: Vec<String>,
    /// Work-tree paths that differ between the tree the request was issued for and the tree
    /// the run found (added, changed or removed), when the two differ and the request listed
    /// the tree's files: something besides Consort wrote in the project between the two. A
    /// receipt for another tree than the one asked for is void either way.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed_since_request: Vec<String>,
    /// Tests that were green before this step, failed on a first run, and passed on this
    /// one, on a fresh branch: flaky, not broken. This receipt is the second run's, judged
    /// like any other; no agent is charged for what the first run saw.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flaky: Vec<String>,
    /// Test files that failed to load because a module of the project they import does not
    /// exist (or lacks the name they import), as the verifier read the runner's load failures
    /// and checked them against the tree: the first test of a new module is a RED so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_modules: Vec<MissingModule>,
    /// The shards the suite was split into, when it was (see [`ShardRun`]): `outcomes` is
    /// their outcomes, shard after shard, and `branch_id` the first shard's branch. Empty for
    /// a suite run whole, in one process on one branch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardRun>,
    /// The test files the run was limited to, when its request selected tests
    /// ([`crate::VerifyRequest::select`]); empty: the whole suite ran. A receipt limited so
    /// for a request that asked for the whole suite is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selection: Vec<String>,
    /// The hash of the configuration that judged the run (`[runner]`, `[paths]`,
    /// `[migrations]`: see [`crate::Harness`]), as its request named it; None in receipts
    /// written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness: Option<ContentHash>,
}

/// One part of a suite split over database branches: its own fresh branch, its own process,
/// the test files it was given. The verifier checks that the shards' tests together are
/// exactly what the runner collects for the whole suite (a test no shard ran is a runner
/// fault, never a pass); a shard stopped because the verdict was already a failure says so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShardRun {
    /// The branch it ran on.
    pub branch_id: String,
    /// The command line that ran (secrets never appear here).
    pub command: String,
    /// The test files it was given, relative to the work tree.
    pub files: Vec<String>,
    /// How many of the receipt's outcomes are this shard's (they follow the earlier shards').
    pub outcomes: usize,
    /// How the command ended (`None` when it was stopped before it ended).
    pub exit: Option<ExitRecord>,
    /// Its own run time, in milliseconds.
    pub run_ms: u64,
}

impl ShardRun {
    /// Whether it was stopped before it ended, because another shard's failure had already
    /// made the verdict a failure.
    pub fn stopped(&self) -> bool {
        self.exit.is_none()
    }
}

/// A test file that failed to load because a module of the project it imports is missing:
/// the file the import names does not exist in the tree, or exists without the name imported.
/// A missing package (a bare `import 'left-pad'`, a Python module outside the project's own
/// packages) or a syntax error is never one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MissingModule {
    /// The outcome that reported the load failure.
    pub outcome: String,
    /// The test file that failed to load, relative to the work tree.
    pub test_file: String,
    /// The module it imports, relative to the work tree (`src/orders.js`, `app/orders.py`; a Go
    /// package's directory; a Rust crate's `src/lib.rs`).
    pub module: String,
    /// Whether the load failure kept every test of the run from running, not only this file's:
    /// cargo builds every test target before it runs one, so a test target that does not
    /// compile runs nothing. Every expected test is then not run because of the RED.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stops_every_test: bool,
}

/// How a test run was confined; every receipt records it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Confinement {
    /// Linux Landlock at this ABI: what judges the run was read-only to it, Consort's private
    /// state unreadable, writes allowed only in its scratch directory and the declared caches,
    /// and TCP connections only to its branch's port (when `network`).
    Landlock {
        /// The Landlock ABI version the kernel enforced.
        abi: u32,
        /// Whether TCP connections were restricted (ABI 4 and later).
        network: bool,
    },
    /// Linux Landlock at this ABI (as [`Confinement::Landlock`]) in namespaces of the run's
    /// own: a mount namespace (ptys of its own, its own `/dev/shm`, the dependency directories
    /// read-only) and, when `own_network`, a network of its own: a loopback on which it may
    /// serve and connect at will, and its branch forwarded in, nothing else reachable.
    /// Without `own_network` (a branch on another machine), TCP connections only to the
    /// branch's port.
    Namespaced {
        /// The Landlock ABI version the kernel enforced.
        abi: u32,
        /// Whether the run had a network of its own.
        own_network: bool,
    },
    /// Confinement was switched off by the configuration (`sandbox = "off"`).
    Off,
    /// Recorded before confinement existed (an old ledger).
    #[default]
    Unrecorded,
}

impl Confinement {
    /// Whether this is [`Confinement::Unrecorded`].
    pub fn is_unrecorded(&self) -> bool {
        matches!(self, Confinement::Unrecorded)
    }

    /// Whether the run was confined (by Landlock, in namespaces or not).
    pub fn is_confined(&self) -> bool {
        matches!(
            self,
            Confinement::Landlock { .. } | Confinement::Namespaced { .. }
        )
    }
}

impl std::fmt::Display for Confinement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Confinement::Landlock { abi, network: true } => {
                write!(f, "Landlock ABI {abi} (files and TCP)")
            }
            Confinement::Landlock {
                abi,
                network: false,
            } => {
                write!(f, "Landlock ABI {abi} (files only)")
            }
            Confinement::Namespaced {
                abi,
                own_network: true,
            } => write!(
                f,
                "Landlock ABI {abi} in namespaces of its own (a network with only its branch forwarded in, ptys, read-only dependencies)"
            ),
            Confinement::Namespaced {
                abi,
                own_network: false,
            } => write!(
                f,
                "Landlock ABI {abi} in namespaces of its own (ptys, read-only dependencies; TCP only to its branch's port)"
            ),
            Confinement::Off => f.write_str("off (sandbox = \"off\")"),
            Confinement::Unrecorded => f.write_str("not recorded"),
        }
    }
}

impl TestRunReceipt {
    /// The status of a named test, if the run reported it.
    pub fn status_of(&self, name: &str) -> Option<TestStatus> {
        self.outcomes
            .iter()
            .find(|o| o.name == name)
            .map(|o| o.status)
    }

    /// The names of tests that did not pass.
    pub fn not_passed(&self) -> Vec<&str> {
        self.outcomes
            .iter()
            .filter(|o| o.status != TestStatus::Passed)
            .map(|o| o.name.as_str())
            .collect()
    }
}

key_type! {
    /// The id of a verify or promote request; unique within a run.
    #[serde(transparent)]
    pub struct RequestId(pub u64);
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

key_type! {
    /// The three human gates.
    #[serde(rename_all = "kebab-case")]
    pub enum GateKind {
        /// Approve the frozen design bundle.
        Design,
        /// Approve the release and its evidence.
        Deploy,
        /// Approve applying the migrations to the parent database.
        Promote,
    }
}

impl GateKind {
    /// The lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            GateKind::Design => "design",
            GateKind::Deploy => "deploy",
            GateKind::Promote => "promote",
        }
    }
}

display_as_str!(GateKind);

impl std::str::FromStr for GateKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "design" => Ok(GateKind::Design),
            "deploy" => Ok(GateKind::Deploy),
            "promote" => Ok(GateKind::Promote),
            other => Err(format!(
                "unknown gate `{}` (expected design, deploy or promote)",
                other.chars().take(32).collect::<String>()
            )),
        }
    }
}

/// A human's decision at a gate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "decision", rename_all = "kebab-case")]
pub enum GateDecision {
    /// Approved.
    Approve,
    /// Rejected, with a reason.
    Reject {
        /// Why.
        reason: String,
    },
}

/// An approval (or rejection) at a gate, bound to one exact hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GateApproval {
    /// Which gate.
    pub gate: GateKind,
    /// The hash the human saw and decided on.
    pub hash: ContentHash,
    /// Who decided.
    pub approver: String,
    /// When (the approver's clock).
    pub at: DateTime<Utc>,
    /// Approve or reject.
    pub decision: GateDecision,
    /// A free note.
    #[serde(default)]
    pub note: String,
}

/// Why a run stopped for a human: a verdict on the work, or a fault in the machinery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", content = "cause", rename_all = "kebab-case")]
pub enum EscalationReason {
    /// The work itself is at fault.
    Verdict(VerdictReason),
    /// The infrastructure is at fault; the work may be fine.
    Infrastructure(InfraFault),
    /// A budget people set for the run or a role is spent: neither the work's fault nor the
    /// infrastructure's. The next call was not made; raise the budget to go on.
    BudgetSpent(crate::core::budget::BudgetName),
    /// A frozen file, or the work tree a verification was asked for, changed outside Consort
    /// (a hand edit, another program): neither an agent's doing nor the infrastructure's. Put
    /// it back, then retry.
    ChangedOutsideConsort,
    /// A lane's work does not merge with what other lanes merged since it started (a git
    /// conflict, a migration on the same object, or a merged feature's test broken): the
    /// detail names both sides. Resolve it, then retry.
    Integration,
    /// Tests of the project failed in the baseline, before any agent acted: neither the work's
    /// fault nor the infrastructure's. A person quarantines them or fixes the setup, then
    /// retries.
    FailingBeforeTheFeature,
}

impl EscalationReason {
    /// Whether this is a verdict on the work (as opposed to an infrastructure fault).
    pub fn is_verdict(&self) -> bool {
        matches!(self, EscalationReason::Verdict(_))
    }
}

/// Verdicts that stop a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum VerdictReason {
    /// The tests stayed red.
    TestsRed,
    /// The GREEN repair loop used all its rounds.
    RepairBoundSpent,
    /// The review asked for changes more times than allowed.
    ReviewBoundSpent,
    /// The architect asked for revisions more times than allowed.
    RevisionBoundSpent,
    /// An agent broke a rule more times than allowed, or the work tree was tampered with.
    RuleViolated,
    /// An agent's output stayed invalid after its retries.
    InvalidOutput,
    /// An agent went over its token or time budget.
    BudgetExceeded,
    /// A human rejected a gate.
    GateRejected,
    /// A change would alter a test an earlier feature accepted: only a human may retire it.
    EarlierTestContradicted,
}

/// Infrastructure faults that stop a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum InfraFault {
    /// The database or branch provider failed.
    DatabaseDown,
    /// The model server failed or went away.
    ModelServerFailing,
    /// An actor kept crashing past its restart intensity.
    ActorCrashing,
    /// A step passed its deadline.
    Timeout,
    /// The test runner could not be started.
    RunnerFailed,
    /// The work tree could not be read or written.
    WorkTreeIo,
    /// Consort reached a state its lifecycle does not allow (a bug in Consort itself).
    InvariantBroken,
    /// The branch backend's configuration is unusable (a bad setting, name or missing binary).
    ProviderMisconfigured,
    /// The branch backend's credentials lack a permission.
    PermissionDenied,
    /// The branch backend's quota or branch limit is used up.
    QuotaExhausted,
    /// A migration could not be applied: to the parent (promote), or to the base of a test
    /// run, so that no test ran.
    MigrationFailed,
    /// The test command ran but did not test anything: its program was not found, it wrote
    /// no report, or it collected no test (the configuration's or the machine's fault).
    TestCommandBroken,
    /// A step's prompt does not fit the model's context window.
    ContextWindowTooSmall,
    /// A test run failed on what its confinement refused it (a connection, a path, a pty):
    /// no verdict on the code, for a person to allow or change.
    SandboxRefused,
    /// A lane's merge check refused its promotion: its branch conflicts with work merged since
    /// it started, or breaks the tests of a merged feature. Not a fault of the infrastructure
    /// (it travels as one from the Lakebase side): the machine halts it as
    /// [`EscalationReason::Integration`], for a person to resolve.
    MergeRefused,
}

impl InfraFault {
    /// Whether trying again may cure it: a database, model server or actor that failed, a
    /// deadline, a runner or work tree that could not be used. A test command that did not
    /// run, a migration that failed, a backend misconfigured, refused or over quota, a broken
    /// invariant, a prompt too large or a refused merge fail the same way every time: a
    /// person acts first.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            InfraFault::DatabaseDown
                | InfraFault::ModelServerFailing
                | InfraFault::ActorCrashing
                | InfraFault::Timeout
                | InfraFault::RunnerFailed
                | InfraFault::WorkTreeIo
        )
    }
}

impl fmt::Display for InfraFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InfraFault::DatabaseDown => "the database is down",
            InfraFault::ModelServerFailing => "the model server is failing",
            InfraFault::ActorCrashing => "an actor keeps crashing",
            InfraFault::Timeout => "a deadline passed",
            InfraFault::RunnerFailed => "the test runner could not be started",
            InfraFault::WorkTreeIo => "the work tree could not be read or written",
            InfraFault::InvariantBroken => "an internal invariant broke (a bug in Consort)",
            InfraFault::ProviderMisconfigured => "the branch backend is misconfigured",
            InfraFault::PermissionDenied => "the branch backend refused a permission",
            InfraFault::QuotaExhausted => "the branch backend's quota is used up",
            InfraFault::MigrationFailed => "a migration could not be applied",
            InfraFault::TestCommandBroken => "the test command did not run the tests",
            InfraFault::SandboxRefused => "a test run failed on what its confinement refused it",
            InfraFault::ContextWindowTooSmall => {
                "a step's prompt does not fit the model's context window"
            }
            InfraFault::MergeRefused => "the lane's merge check refused the promotion",
        })
    }
}

/// A stop for a human, with its typed reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Escalation {
    /// The step that escalated, as its key (see [`Step`](crate::Step)).
    pub step: String,
    /// Verdict or infrastructure fault.
    pub reason: EscalationReason,
    /// What happened, for the human (never contains secrets).
    pub detail: String,
}

/// Any artifact an agent can produce.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", content = "body", rename_all = "kebab-case")]
pub enum Artifact {
    /// Product Owner: stories with acceptance criteria.
    Stories(Stories),
    /// Spec Author: the structured spec.
    Spec(Spec),
    /// Architect Reviewer: approve or revise.
    ArchitectureVerdict(ArchitectureVerdict),
    /// DBA: the migration plan.
    SchemaPlan(SchemaPlan),
    /// Test Strategist: the ordered test list.
    TestList(TestList),
    /// UX Designer: the interface design.
    UxDesign(UxDesign),
    /// Navigator (tests, in RED) or Driver (code, in GREEN and REFACTOR).
    ChangeSet(ChangeSet),
    /// Navigator: the review.
    ReviewVerdict(ReviewVerdict),
    /// Never produced by an agent; listed so that an agent that tries is refused by kind.
    TestRunReceipt(Box<TestRunReceipt>),
}

/// The kind of an [`Artifact`], without its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ArtifactKind {
    /// [`Stories`].
    Stories,
    /// [`Spec`].
    Spec,
    /// [`ArchitectureVerdict`].
    ArchitectureVerdict,
    /// [`SchemaPlan`].
    SchemaPlan,
    /// [`TestList`].
    TestList,
    /// [`UxDesign`].
    UxDesign,
    /// [`ChangeSet`].
    ChangeSet,
    /// [`ReviewVerdict`].
    ReviewVerdict,
    /// [`TestRunReceipt`].
    TestRunReceipt,
}

impl Artifact {
    /// This artifact's kind.
    pub fn kind(&self) -> ArtifactKind {
        match self {
            Artifact::Stories(_) => ArtifactKind::Stories,
            Artifact::Spec(_) => ArtifactKind::Spec,
            Artifact::ArchitectureVerdict(_) => ArtifactKind::ArchitectureVerdict,
            Artifact::SchemaPlan(_) => ArtifactKind::SchemaPlan,
            Artifact::TestList(_) => ArtifactKind::TestList,
            Artifact::UxDesign(_) => ArtifactKind::UxDesign,
            Artifact::ChangeSet(_) => ArtifactKind::ChangeSet,
            Artifact::ReviewVerdict(_) => ArtifactKind::ReviewVerdict,
            Artifact::TestRunReceipt(_) => ArtifactKind::TestRunReceipt,
        }
    }

    /// The artifact's content hash.
    pub fn hash(&self) -> ContentHash {
        ContentHash::of(self)
    }
}

impl ArtifactKind {
    /// Every kind.
    pub const ALL: [ArtifactKind; 9] = [
        ArtifactKind::Stories,
        ArtifactKind::Spec,
        ArtifactKind::ArchitectureVerdict,
        ArtifactKind::SchemaPlan,
        ArtifactKind::TestList,
        ArtifactKind::UxDesign,
        ArtifactKind::ChangeSet,
        ArtifactKind::ReviewVerdict,
        ArtifactKind::TestRunReceipt,
    ];

    /// The kind's name, as serialised (`test-list`).
    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactKind::Stories => "stories",
            ArtifactKind::Spec => "spec",
            ArtifactKind::ArchitectureVerdict => "architecture-verdict",
            ArtifactKind::SchemaPlan => "schema-plan",
            ArtifactKind::TestList => "test-list",
            ArtifactKind::UxDesign => "ux-design",
            ArtifactKind::ChangeSet => "change-set",
            ArtifactKind::ReviewVerdict => "review-verdict",
            ArtifactKind::TestRunReceipt => "test-run-receipt",
        }
    }
}

display_as_str!(ArtifactKind);

/// The frozen design: everything the design lane produced, hashed as one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DesignBundle {
    /// The request the design answers.
    pub feature: FeatureRequest,
    /// Stories and acceptance criteria.
    pub stories: Stories,
    /// The structured spec.
    pub spec: Spec,
    /// The architect's approving verdict.
    pub architecture: ArchitectureVerdict,
    /// The schema and migration plan.
    pub schema: SchemaPlan,
    /// The ordered test list.
    pub test_list: TestList,
    /// The UX design, when any story is user-facing.
    pub ux: Option<UxDesign>,
}

impl DesignBundle {
    /// The one hash a human approves at the design gate.
    pub fn hash(&self) -> ContentHash {
        ContentHash::of(self)
    }
}

/// A file-name → content-hash map of a set of files (for example the frozen tests).
pub type FileHashes = BTreeMap<String, ContentHash>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_named_as_it_is_serialised() {
        for kind in ArtifactKind::ALL {
            let json = serde_json::to_value(kind).expect("serialise");
            assert_eq!(json.as_str(), Some(kind.as_str()));
            assert_eq!(kind.to_string(), kind.as_str());
        }
    }

    #[test]
    fn artifacts_round_trip_through_json() {
        let a = Artifact::ChangeSet(ChangeSet {
            summary: "add test".into(),
            changes: vec![
                FileChange::Write {
                    path: "tests/t1.sql".into(),
                    content: "select 1;".into(),
                },
                FileChange::Delete {
                    path: "old.sql".into(),
                },
            ],
        });
        let json = serde_json::to_string(&a).expect("serialise");
        let back: Artifact = serde_json::from_str(&json).expect("parse");
        assert_eq!(a, back);
        assert_eq!(back.kind(), ArtifactKind::ChangeSet);
        assert_eq!(ArtifactKind::ChangeSet.to_string(), "change-set");
    }

    #[test]
    fn escalation_reasons_say_whose_fault() {
        assert!(EscalationReason::Verdict(VerdictReason::TestsRed).is_verdict());
        assert!(!EscalationReason::Infrastructure(InfraFault::DatabaseDown).is_verdict());
    }

    #[test]
    fn exit_record_success_needs_zero_and_no_timeout() {
        let ok = ExitRecord {
            code: Some(0),
            signal: None,
            timed_out: false,
        };
        assert!(ok.success());
        assert!(
            !ExitRecord {
                timed_out: true,
                ..ok.clone()
            }
            .success()
        );
        assert!(
            !ExitRecord {
                code: Some(1),
                ..ok
            }
            .success()
        );
    }
}
