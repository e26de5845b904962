//! Every hard rule the state machine enforces, as a typed violation, and the pure checks that
//! find them.

use serde::{Deserialize, Serialize};

use crate::core::artifact::{
    ArchitectureVerdict, ArtifactKind, ChangeSet, FileChange, FileHashes, ReviewVerdict,
    SchemaPlan, Spec, Stories, TestList, UxDesign,
};
use crate::core::hash::ContentHash;
use crate::core::paths::{PathError, PathPolicy, WriteProblem, normalise_relative};
use crate::core::protocol::AssignmentId;
use crate::core::role::{ActorId, Role};
use crate::core::test_outline::Language;
use crate::{GateKind, RequestId};

/// A broken rule. Every variant is a refusal: the event that broke it changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "rule", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum RuleViolation {
    /// The event does not fit what the machine is waiting for.
    #[error("step out of order: waiting for {expected}, got {got}")]
    StepOutOfOrder {
        /// What the machine waits for.
        expected: String,
        /// What arrived.
        got: String,
    },
    /// An artifact answers an assignment that is not the pending one.
    #[error(
        "artifact answers {got}, but the pending assignment is {}",
        crate::core::text::or_none(expected)
    )]
    UnknownAssignment {
        /// The pending assignment, if any.
        expected: Option<AssignmentId>,
        /// The assignment the artifact claims to answer.
        got: AssignmentId,
    },
    /// An artifact came from an actor of another role than the one assigned.
    #[error("{got} answered a step assigned to {expected}")]
    WrongRole {
        /// The role assigned.
        expected: Role,
        /// The role that answered.
        got: Role,
    },
    /// The artifact is not of the kind the step produces.
    #[error("step wants a {expected}, got a {got}")]
    WrongArtifactKind {
        /// The kind the step must produce.
        expected: ArtifactKind,
        /// The kind produced.
        got: ArtifactKind,
    },
    /// An agent returned a test-run receipt: only the Lakebase side produces receipts.
    #[error(
        "{author} returned a test-run receipt of its own making; only the Lakebase side produces receipts"
    )]
    ForgedReceipt {
        /// The agent that tried.
        author: ActorId,
    },
    /// A design artifact is malformed or inconsistent with the design so far.
    #[error("invalid artifact: {detail}")]
    InvalidArtifact {
        /// What is wrong.
        detail: String,
    },
    /// A change-set path is not a plain path inside the work tree.
    #[error("path refused: {reason}")]
    PathOutsideWorkTree {
        /// Why.
        reason: PathError,
    },
    /// A change set touches the harness (Consort's files, the runner's configuration, the
    /// manifests the test tool reads). The message tells the agent that a dependency is a
    /// human's change, so the refusal that reaches a human says what is needed.
    #[error(
        "{path} is part of the harness (it decides how the tests are run and judged); no agent may change it. A new dependency, a test setting or a runner script is a human's change, made between runs: leave {path} as it is"
    )]
    TouchesHarness {
        /// The path.
        path: String,
    },
    /// A change set writes into a directory that is never hashed (a cache, version-control
    /// metadata, Consort's state): no receipt would cover what it writes there.
    #[error(
        "{path} lies in {dir}/, a directory that is never hashed (caches, version control, Consort's state); no agent may write there"
    )]
    TouchesUnhashed {
        /// The path.
        path: String,
        /// The skipped directory name on its way.
        dir: String,
    },
    /// The file system cannot take a change at this path (a name too long, a file where a
    /// directory must be, …); nothing of the change set was left applied.
    #[error("{path} cannot be written: {problem}")]
    PathNotWritable {
        /// The path, as resolved in the work tree.
        path: String,
        /// What the file system objects to.
        problem: WriteProblem,
    },
    /// A code change set touches a test path.
    #[error("{path} is a test path; only the Navigator writes tests, and only in RED")]
    TouchesTests {
        /// The path.
        path: String,
    },
    /// An accepted (frozen) test file would change, or changed on disk.
    #[error("{path} is a frozen test; it may not be changed, renamed or deleted")]
    FrozenTestModified {
        /// The path.
        path: String,
    },
    /// A RED's new version of a file that holds accepted tests changes what is frozen of it: an
    /// accepted test's definition, or what the file's tests share, or it adds what would reach
    /// them (a file-wide hook, a name they use). Judged on the file's syntax tree.
    #[error(
        "{path} holds accepted tests, and your version of it changes them: {detail}. A RED may add new tests to this file (with the imports, fixtures and helpers they need), but every accepted test and what the file's tests share stay exactly as accepted"
    )]
    FrozenTestChanged {
        /// The file.
        path: String,
        /// What changed, naming the item and its line.
        detail: String,
    },
    /// A change would alter a test an earlier feature of the project accepted: part of this
    /// feature's regression suite, it is frozen for every agent.
    #[error(
        "{path} holds test {test} of the earlier feature {feature}, part of the regression suite: it may not be changed or deleted (a human may retire it with `consort test retire {feature}/{test}`)"
    )]
    EarlierTestFrozen {
        /// The file.
        path: String,
        /// The feature that accepted the test.
        feature: String,
        /// The test's id in that feature's test list.
        test: String,
    },
    /// A retirement names no test this feature inherited.
    #[error("{feature}/{test} is not a test this feature inherited from an earlier feature")]
    NotAnEarlierTest {
        /// The feature named.
        feature: String,
        /// The test named.
        test: String,
    },
    /// A redo names a test that is not the running entry's accepted test.
    #[error(
        "{test} cannot be written again: {why} (a redo is for the test of the entry the build lane is on, once its RED was accepted, while the run is halted)"
    )]
    NotARedoableTest {
        /// The entry named.
        test: String,
        /// Why not.
        why: String,
    },
    /// A quarantine names a test that is already quarantined.
    #[error("{test} is already quarantined")]
    AlreadyQuarantined {
        /// The test named.
        test: String,
    },
    /// A retirement names a test that is already retired.
    #[error("{feature}/{test} is already retired")]
    AlreadyRetired {
        /// The feature named.
        feature: String,
        /// The test named.
        test: String,
    },
    /// A RED change set touches a path that is not a test path.
    #[error("RED may only write test paths; {path} is not one")]
    NonTestInRed {
        /// The path.
        path: String,
    },
    /// A RED change set does not write the test file of the entry.
    #[error("RED must write {path}, the entry's test file")]
    RedMissingTest {
        /// The expected path.
        path: String,
    },
    /// A frozen file on disk differs from its hash while no change set wrote it: someone or
    /// something changed it outside Consort (a hand edit), not the role whose step was next.
    #[error(
        "{path} changed outside Consort: it is frozen as {expected}, but {} and no change set wrote it. Put the frozen version back (in a git repository: `git checkout -- {path}`), then `consort retry --by NAME`; or end the run with `consort stop --by NAME`",
        found.as_ref().map_or_else(|| "the file is gone".to_string(), |h| format!("the file on disk is {h}"))
    )]
    ChangedOutsideConsort {
        /// The file, relative to the work tree.
        path: String,
        /// The hash it was frozen with.
        expected: ContentHash,
        /// The hash found on disk (None: missing or unreadable).
        found: Option<ContentHash>,
    },
    /// A test file exists on disk that no accepted RED wrote.
    #[error("test file {path} appeared outside RED")]
    UnexpectedTestFile {
        /// The path.
        path: String,
    },
    /// The new test passed before any code was written: not a RED.
    #[error("the new test {test} passed before any code was written; that is not a RED")]
    RedPassedWithoutCode {
        /// The test's runner name.
        test: String,
    },
    /// The new test broke tests that were green before, or the design's migrations its run is
    /// the first to apply did (which no RED can mend: a person decides).
    #[error("RED broke tests that were green: {}{}", tests.join(", "), migrations_note(migrations))]
    RedBrokeGreenTest {
        /// The tests that no longer pass.
        tests: Vec<String>,
        /// The design's migrations that this RED's run was the first to apply (its story's,
        /// at the story's first entry); empty when it applied none anew.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        migrations: Vec<String>,
    },
    /// The run does not report the new test at all.
    #[error(
        "the run did not report the new test {test}{}",
        load_failure_note(failed_elsewhere)
    )]
    RedTestNotRun {
        /// The test's runner name.
        test: String,
        /// Failures the run reported under names no expected test has: a test file that
        /// failed to load (an import or collection error) is reported so by most runners.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        failed_elsewhere: Vec<String>,
    },
    /// The test command was stopped at its time limit before it reported the new test: a
    /// time-out, never a file that failed to load.
    #[error(
        "the test command ran {} and was stopped at its time limit before it reported the new test {test}: something in the run waits for what never comes (a worker process that died, a lock, a server that is not there); the end of what it printed is below",
        crate::core::text::whole_seconds(*ran_ms)
    )]
    RedRunTimedOut {
        /// The test's runner name.
        test: String,
        /// How long the command ran before it was stopped, in milliseconds.
        ran_ms: u64,
    },
    /// A receipt answers another request.
    #[error(
        "receipt answers {got}, but the pending request is {}",
        crate::core::text::or_none(expected)
    )]
    ReceiptNotForRequest {
        /// The pending request, if any.
        expected: Option<RequestId>,
        /// The request the receipt answers.
        got: RequestId,
    },
    /// A receipt was produced for another work-tree state than the one issued: something
    /// besides Consort wrote in the project between the request and the run, not the role
    /// whose step it was.
    #[error(
        "the work tree changed between the verification's request and its run{}: something besides Consort wrote in the project (an editor, a watcher, output redirected into it, a hand edit while the run waited). Put the tree back as Consort left it (asked for {expected}, found {got}) and keep what writes there out of the project, then `consort retry --by NAME`; or end the run with `consort stop --by NAME`",
        named_paths(paths)
    )]
    ReceiptWorkspaceMismatch {
        /// The hash the request was issued for.
        expected: ContentHash,
        /// The hash in the receipt.
        got: ContentHash,
        /// The paths that differ, as the verifier found them (empty: it could not tell; see
        /// [`crate::TestRunReceipt::changed_since_request`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        paths: Vec<String>,
    },
    /// The test run changed the work tree outside the declared caches: what it was judged on
    /// is not what stands now, so the run counts for nothing.
    #[error("the test run changed the work tree outside the declared caches: {}", paths.join(", "))]
    RunChangedTree {
        /// The changed paths, relative to the work tree.
        paths: Vec<String>,
    },
    /// A receipt names no database branch or no command: it records no test run, so it
    /// proves nothing either way (a RED would count tests that never ran as failing). Or it
    /// records a run of some tests where the whole suite was asked for.
    #[error(
        "the receipt of request {request} records no run of what was asked ({missing} missing): it is evidence of nothing"
    )]
    ReceiptWithoutRun {
        /// The request the receipt answers.
        request: RequestId,
        /// What it lacks: `branch` or `command` (empty), or `the whole suite` (it ran a
        /// selection of tests where the request asked for all).
        missing: String,
    },
    /// The reviewer authored code under review.
    #[error("{reviewer} authored the code under review and may not review it")]
    ReviewerIsAuthor {
        /// The reviewer.
        reviewer: ActorId,
    },
    /// The frozen design on disk no longer matches the approved hash.
    #[error("the frozen design on disk is not the approved one: approved {expected}, found {}", found.as_ref().map_or_else(|| "no readable design file".to_string(), |h| h.to_string()))]
    DesignHashMismatch {
        /// The approved hash.
        expected: ContentHash,
        /// The hash found on disk (None: missing or unreadable).
        found: Option<ContentHash>,
    },
    /// A migration file of the frozen design was changed or removed on disk.
    #[error(
        "the frozen migration {path} was changed or removed on disk; the approved design is the only source of migrations (its SQL is in the frozen design, design.json in the feature's record under .consort/)"
    )]
    MigrationFileChanged {
        /// The file, relative to the work tree.
        path: String,
    },
    /// A gate decision arrived for a gate that is not waiting.
    #[error("the {gate} gate is not waiting for a decision")]
    GateNotPending {
        /// The gate named.
        gate: GateKind,
    },
    /// A gate decision names another hash than the one waiting.
    #[error("{gate} gate approval is for {got}, but the gate waits for {expected}")]
    GateHashMismatch {
        /// The gate.
        gate: GateKind,
        /// The hash waiting.
        expected: ContentHash,
        /// The hash in the decision.
        got: ContentHash,
    },
    /// Something tried to pass a gate that was not approved.
    #[error("the {gate} gate has not been approved")]
    GateNotApproved {
        /// The gate.
        gate: GateKind,
    },
    /// A promotion report does not show every planned migration applied.
    #[error("promotion not verified: {detail}")]
    PromoteUnverified {
        /// What is missing.
        detail: String,
    },
    /// A retry arrived while nothing is halted.
    #[error("nothing is halted; there is no decision to take")]
    NotHalted,
    /// The run is over.
    #[error("the run is over")]
    Finished,
    /// A stop arrived once the promotion was approved: the promotion may be under way (a
    /// lane's merge in the base, its migrations not yet in the parent database), and a stop
    /// then would leave the feature's code in the base without its migrations.
    #[error(
        "the promotion was approved and may be under way: the feature's code may be in the base already and its migrations not yet in the parent database, and a stop now could leave them apart; `consort run` finishes it, or the process that runs it does"
    )]
    PromotionUnderWay,
    /// The machine reached a state its lifecycle does not allow: a bug in Consort, not a fault
    /// of the work. The run halts (retrying would meet the same state again).
    #[error("internal invariant broken: {what} (a bug in Consort, not in the work)")]
    Invariant {
        /// What should have held.
        what: String,
    },
}

/// What the machine does after refusing an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remedy {
    /// Nothing: the event was stale or premature, the machine keeps waiting.
    Ignore,
    /// The agent may try again, with the violation as feedback (bounded).
    RetryAgent,
    /// Stop for a human.
    Halt,
}

impl RuleViolation {
    /// How the machine answers this violation.
    pub fn remedy(&self) -> Remedy {
        use RuleViolation::*;
        match self {
            StepOutOfOrder { .. }
            | UnknownAssignment { .. }
            | ReceiptNotForRequest { .. }
            | GateNotPending { .. }
            | GateHashMismatch { .. }
            | GateNotApproved { .. }
            | NotHalted
            | NotAnEarlierTest { .. }
            | NotARedoableTest { .. }
            | AlreadyRetired { .. }
            | AlreadyQuarantined { .. }
            | PromotionUnderWay
            | Finished => Remedy::Ignore,
            WrongRole { .. }
            | WrongArtifactKind { .. }
            | ForgedReceipt { .. }
            | InvalidArtifact { .. }
            | PathOutsideWorkTree { .. }
            | TouchesHarness { .. }
            | TouchesUnhashed { .. }
            | PathNotWritable { .. }
            | TouchesTests { .. }
            | FrozenTestModified { .. }
            | FrozenTestChanged { .. }
            | NonTestInRed { .. }
            | RedMissingTest { .. }
            | RedPassedWithoutCode { .. }
            | RedBrokeGreenTest { .. }
            | RedTestNotRun { .. }
            | RedRunTimedOut { .. } => Remedy::RetryAgent,
            UnexpectedTestFile { .. }
            | ChangedOutsideConsort { .. }
            | ReceiptWorkspaceMismatch { .. }
            | RunChangedTree { .. }
            | ReceiptWithoutRun { .. }
            | ReviewerIsAuthor { .. }
            | DesignHashMismatch { .. }
            | MigrationFileChanged { .. }
            | EarlierTestFrozen { .. }
            | PromoteUnverified { .. }
            | Invariant { .. } => Remedy::Halt,
        }
    }
}

/// What a RED that broke earlier tests says when its run was the first to apply some of the
/// design's migrations: they may be what broke them, which no RED can mend.
fn migrations_note(migrations: &[String]) -> String {
    said_of(migrations, |versions| {
        format!(
            ". This run was the first with the design's migrations {versions}: when they, not the new test, break those tests, the feature changes what the tests check and no RED can mend it. A person decides: quarantine a project's own test (`consort test quarantine NAME --by NAME --reason …`) or retire an earlier feature's (`consort test retire FEATURE/TEST --by NAME --reason …`), then `consort retry --by NAME`; or end the run (`consort stop --by NAME`) and ask for another design"
        )
    })
}

/// What `say` makes of `items` joined with commas, or nothing when there are none.
fn said_of(items: &[String], say: impl FnOnce(String) -> String) -> String {
    if items.is_empty() {
        String::new()
    } else {
        say(items.join(", "))
    }
}

/// How many paths a message names before it counts the rest.
const PATHS_NAMED: usize = 10;

/// ` (a, b and 3 more)`: the paths a message names, or nothing when there are none.
fn named_paths(paths: &[String]) -> String {
    match paths.len() {
        0 => String::new(),
        n if n <= PATHS_NAMED => format!(" ({})", paths.join(", ")),
        n => format!(
            " ({} and {} more)",
            paths[..PATHS_NAMED].join(", "),
            n - PATHS_NAMED
        ),
    }
}

/// What a RED that did not report its test says about failures under other names.
fn load_failure_note(failed_elsewhere: &[String]) -> String {
    said_of(failed_elsewhere, |names| {
        format!(
            "; the runner reported a failure under another name ({names}): the test file probably failed to load (an import or collection error), so its tests never ran. A file that fails to load is a RED only when what it lacks is a module of the project's code the feature will write (a relative import of a file that does not exist yet, a module of the project's own package); a syntax error, or a package that is not installed, is not — what the runner said is below"
        )
    })
}

fn invalid(detail: impl Into<String>) -> RuleViolation {
    RuleViolation::InvalidArtifact {
        detail: detail.into(),
    }
}

fn require(ok: bool, detail: impl FnOnce() -> String) -> Result<(), RuleViolation> {
    if ok { Ok(()) } else { Err(invalid(detail())) }
}

fn unique<'a>(what: &str, ids: impl Iterator<Item = &'a str>) -> Result<(), RuleViolation> {
    let mut seen = std::collections::BTreeSet::new();
    for id in ids {
        require(!id.trim().is_empty(), || format!("{what} id is empty"))?;
        require(seen.insert(id), || format!("duplicate {what} id `{id}`"))?;
    }
    Ok(())
}

/// Stories: at least one, each with acceptance criteria whose ids are prefixed by the story's.
pub fn check_stories(stories: &Stories, feature_id: &str) -> Result<(), RuleViolation> {
    require(stories.feature_id == feature_id, || {
        format!(
            "stories are for `{}`, the feature is `{feature_id}`",
            stories.feature_id
        )
    })?;
    require(!stories.stories.is_empty(), || "no stories".into())?;
    unique("story", stories.stories.iter().map(|s| s.id.as_str()))?;
    unique("acceptance criterion", stories.ac_ids())?;
    for s in &stories.stories {
        require(!s.acceptance_criteria.is_empty(), || {
            format!("story {} has no acceptance criteria", s.id)
        })?;
        for ac in &s.acceptance_criteria {
            require(ac.id.starts_with(&format!("{}-", s.id)), || {
                format!(
                    "acceptance criterion {} must be prefixed by its story id {}-",
                    ac.id, s.id
                )
            })?;
            require(!ac.then.trim().is_empty(), || {
                format!("acceptance criterion {} has no 'then'", ac.id)
            })?;
        }
    }
    Ok(())
}

/// Spec: requirements traced to existing acceptance criteria.
pub fn check_spec(spec: &Spec, stories: &Stories) -> Result<(), RuleViolation> {
    require(spec.feature_id == stories.feature_id, || {
        "spec is for another feature".into()
    })?;
    require(!spec.requirements.is_empty(), || {
        "spec has no requirements".into()
    })?;
    unique(
        "requirement",
        spec.requirements.iter().map(|r| r.id.as_str()),
    )?;
    for r in &spec.requirements {
        require(stories.story_of_ac(&r.ac_id).is_some(), || {
            format!(
                "requirement {} traces to unknown acceptance criterion `{}`",
                r.id, r.ac_id
            )
        })?;
    }
    Ok(())
}

/// Schema plan: unique, strictly increasing versions, each for a known story, with SQL — or,
/// when the project's migration `tool` applies them, with content in the tool's format.
pub fn check_schema(
    plan: &SchemaPlan,
    stories: &Stories,
    tool: Option<&crate::core::migration_files::ToolFormat>,
) -> Result<(), RuleViolation> {
    unique(
        "migration version",
        plan.migrations.iter().map(|m| m.version.as_str()),
    )?;
    for pair in plan.migrations.windows(2) {
        require(pair[0].version < pair[1].version, || {
            format!(
                "migration versions must increase: {} then {}",
                pair[0].version, pair[1].version
            )
        })?;
    }
    unique(
        "migration file name",
        plan.migrations
            .iter()
            .enumerate()
            .map(|(i, m)| crate::core::migration_files::file_name(i, m))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str),
    )?;
    for m in &plan.migrations {
        require(!m.sql.trim().is_empty(), || {
            format!("migration {} has no SQL", m.version)
        })?;
        match tool {
            None => require(!m.is_psql_script(), || {
                format!(
                    "migration {} holds a psql meta-command (a line that starts with a backslash): a migration is SQL, applied through the protocol, never a psql script",
                    m.version
                )
            })?,
            Some(tool) => tool
                .check_content(&m.sql)
                .map_err(|why| invalid(format!("migration {}: {why}", m.version)))?,
        }
        require(stories.stories.iter().any(|s| s.id == m.story_id), || {
            format!(
                "migration {} is for unknown story `{}`",
                m.version, m.story_id
            )
        })?;
    }
    Ok(())
}

/// A later feature's plan builds on the migrations earlier features promoted: each of its
/// versions comes after every earlier one, and none of its files is an earlier feature's.
pub(super) fn check_builds_on(
    plan: &SchemaPlan,
    earlier: &[crate::core::regression::EarlierMigration],
    files: Option<&crate::core::migration_files::MigrationFiles>,
) -> Result<(), RuleViolation> {
    let Some(last) = earlier
        .iter()
        .max_by(|a, b| a.migration.version.cmp(&b.migration.version))
    else {
        return Ok(());
    };
    for m in &plan.migrations {
        require(m.version > last.migration.version, || {
            format!(
                "migration {} must come after the earlier features' migrations (the last is {} of {}); choose a later version",
                m.version, last.migration.version, last.feature
            )
        })?;
    }
    if let Some(files) = files {
        for (path, m) in files.planned(plan) {
            if let Some(e) = earlier.iter().find(|e| e.path.as_deref() == Some(&path)) {
                return Err(invalid(format!(
                    "migration {} would be written to {path}, the file of {}'s migration {}; choose another version",
                    m.version, e.feature, e.migration.version
                )));
            }
        }
    }
    Ok(())
}

/// Test list: every entry traced to an acceptance criterion, in a test path of its own.
pub fn check_test_list(
    list: &TestList,
    stories: &Stories,
    policy: &PathPolicy,
) -> Result<(), RuleViolation> {
    require(!list.entries.is_empty(), || "the test list is empty".into())?;
    unique("test", list.entries.iter().map(|e| e.id.as_str()))?;
    for e in &list.entries {
        require(
            !e.id.is_empty()
                && e.id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            || {
                format!(
                    "test id `{}` may hold only letters, digits, '-' and '_'",
                    e.id
                )
            },
        )?;
        require(stories.story_of_ac(&e.ac_id).is_some(), || {
            format!(
                "test {} traces to unknown acceptance criterion `{}`",
                e.id, e.ac_id
            )
        })?;
        let path = normalise_relative(&e.path)
            .map_err(|reason| RuleViolation::PathOutsideWorkTree { reason })?;
        require(path == e.path, || {
            format!(
                "test {} path `{}` is not normalised (`{path}`)",
                e.id, e.path
            )
        })?;
        require(policy.is_test(&path) && !policy.is_harness(&path), || {
            format!(
                "test {} lives in `{path}`, which is not a test path ({})",
                e.id,
                policy.test_globs().join(", ")
            )
        })?;
        policy
            .test_identity()
            .check(e)
            .map_err(|detail| RuleViolation::InvalidArtifact { detail })?;
        require(policy.is_collected(&path), || {
            format!(
                "test {} lives in `{path}`, which the test runner never collects as a test (it runs {}): the test would never run; put it in a file the runner collects",
                e.id,
                policy.collected_globs().unwrap_or_default().join(", ")
            )
        })?;
    }
    // Before the names: two entries in one psql file share its name too, and the file is the
    // reason.
    check_no_shared_whole_file(list)?;
    unique("test name", list.entries.iter().map(|e| e.runner_name()))
}

/// A file whose language Consort does not parse is frozen whole once a test in it is accepted,
/// so no later RED could add a test to it: a test list that puts an entry in such a file beside
/// another entry, or beside an earlier feature's test in force, could never be built, and is
/// refused at design.
pub(crate) fn check_files_frozen_whole(
    list: &TestList,
    inherited: &crate::core::regression::Inherited,
    retired: &[crate::core::regression::Retirement],
) -> Result<(), RuleViolation> {
    check_no_shared_whole_file(list)?;
    for e in list.entries.iter().filter(|e| frozen_whole(&e.path)) {
        if let Some(t) = inherited.owner(&e.path, retired) {
            return Err(frozen_whole_refusal(
                &e.path,
                format!(
                    "test {} would live beside {} of the earlier feature {}",
                    e.id, t.test, t.feature
                ),
            ));
        }
    }
    Ok(())
}

/// No two entries of `list` in one file no parser reads (see [`check_files_frozen_whole`]).
fn check_no_shared_whole_file(list: &TestList) -> Result<(), RuleViolation> {
    for (i, e) in list.entries.iter().enumerate() {
        if !frozen_whole(&e.path) {
            continue;
        }
        if let Some(other) = list.entries[..i].iter().find(|o| o.path == e.path) {
            return Err(frozen_whole_refusal(
                &e.path,
                format!("tests {} and {} would both live", other.id, e.id),
            ));
        }
    }
    Ok(())
}

/// Whether a test file is frozen whole: no parser Consort has reads its language.
fn frozen_whole(path: &str) -> bool {
    Language::of(path).is_none()
}

/// The refusal of a test that would share `path`, frozen whole, with the test `beside` names.
fn frozen_whole_refusal(path: &str, beside: String) -> RuleViolation {
    invalid(format!(
        "{beside} in `{path}`, a file Consort does not parse (it parses {}), so the file is frozen whole once its first test is accepted and a later RED could not add another; give each test a file of its own there",
        crate::core::test_outline::PARSED_LANGUAGES
    ))
}

/// UX design: at least one screen for every user-facing story, none for unknown stories.
pub fn check_ux(ux: &UxDesign, stories: &Stories) -> Result<(), RuleViolation> {
    for s in stories.stories.iter().filter(|s| s.user_facing) {
        require(ux.screens.iter().any(|sc| sc.story_id == s.id), || {
            format!("user-facing story {} has no screen", s.id)
        })?;
    }
    for sc in &ux.screens {
        require(stories.stories.iter().any(|s| s.id == sc.story_id), || {
            format!(
                "screen `{}` is for unknown story `{}`",
                sc.name, sc.story_id
            )
        })?;
    }
    Ok(())
}

/// Architecture verdict: a revise verdict needs reasons.
pub fn check_architecture(verdict: &ArchitectureVerdict) -> Result<(), RuleViolation> {
    match verdict {
        ArchitectureVerdict::Approve { .. } => Ok(()),
        ArchitectureVerdict::Revise { reasons } => require(has_reasons(reasons), || {
            "a revise verdict needs reasons".into()
        }),
    }
}

/// Review verdict: a change request needs reasons. (Who may review is the machine's to judge
/// against the code's authors, as the verdict arrives.)
pub fn check_review(verdict: &ReviewVerdict) -> Result<(), RuleViolation> {
    match verdict {
        ReviewVerdict::Approve { .. } => Ok(()),
        ReviewVerdict::ChangesRequested { reasons } => require(has_reasons(reasons), || {
            "a change request needs reasons".into()
        }),
    }
}

fn has_reasons(reasons: &[String]) -> bool {
    reasons.iter().any(|r| !r.trim().is_empty())
}

/// Who may write what in a change set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer<'a> {
    /// The Navigator in RED: new test files only, including `must_write`.
    Red {
        /// The entry's test file.
        must_write: &'a str,
    },
    /// The Driver in GREEN, repair or refactor: no test path, no harness.
    Code,
}

/// Checks a change set against the path policy and the frozen tests; returns the normalised
/// change set on success.
///
/// The machine calls it with the paths as the agent spelled them; the conductor calls it again
/// (through [`crate::core::machine::Machine::check_resolved`]) with the paths as they resolve on disk,
/// through symbolic links, before it writes anything — so a path is judged by the file it
/// reaches, with the same typed violation as a direct write of that file.
pub fn check_change_set(
    set: &ChangeSet,
    writer: Writer<'_>,
    policy: &PathPolicy,
    frozen: &FileHashes,
) -> Result<ChangeSet, RuleViolation> {
    let mut normalised = Vec::with_capacity(set.changes.len());
    for change in &set.changes {
        let path = normalise_relative(change.path())
            .map_err(|reason| RuleViolation::PathOutsideWorkTree { reason })?;
        normalised.push(match change {
            FileChange::Write { content, .. } => FileChange::Write {
                path,
                content: content.clone(),
            },
            FileChange::Delete { .. } => FileChange::Delete { path },
            FileChange::Restore { .. } => {
                return Err(RuleViolation::InvalidArtifact {
                    detail: format!(
                        "{path}: a restore of raw bytes is the conductor's own undo; write text with a write change"
                    ),
                });
            }
        });
    }
    // A change to a frozen test is refused as such wherever it sits in the set: a rename is a
    // write of the new path and a deletion of the frozen one, in either order. A RED may write
    // a frozen file whose language is parsed: its new version is judged test by test on the
    // syntax tree before it is applied ([`joins_frozen_file`]).
    if let Some(change) = normalised
        .iter()
        .find(|c| frozen.contains_key(c.path()) && !joins_frozen_file(writer, c))
    {
        return Err(RuleViolation::FrozenTestModified {
            path: change.path().to_string(),
        });
    }
    for change in &normalised {
        let path = change.path().to_string();
        if policy.is_harness(&path) {
            return Err(RuleViolation::TouchesHarness { path });
        }
        if let Some(dir) = policy.tree_filter().skipped_dir(&path) {
            let dir = dir.to_string();
            return Err(RuleViolation::TouchesUnhashed { path, dir });
        }
        match writer {
            Writer::Red { .. } if !policy.is_test(&path) => {
                return Err(RuleViolation::NonTestInRed { path });
            }
            Writer::Code if policy.is_test(&path) => {
                return Err(RuleViolation::TouchesTests { path });
            }
            _ => {}
        }
    }
    if let Writer::Red { must_write } = writer {
        let writes_it = normalised
            .iter()
            .any(|c| matches!(c, FileChange::Write { path, .. } if path == must_write));
        if !writes_it {
            return Err(RuleViolation::RedMissingTest {
                path: must_write.to_string(),
            });
        }
    }
    Ok(ChangeSet {
        summary: set.summary.clone(),
        changes: normalised,
    })
}

/// Whether `change` is a RED's write of a file whose language Consort parses: such a file may
/// hold accepted tests and gain new ones, which the conductor judges on the syntax tree
/// ([`crate::core::test_outline::judge`]) and the machine requires before it is applied
/// ([`crate::core::machine::Machine::check_resolved`]).
pub(crate) fn joins_frozen_file(writer: Writer<'_>, change: &FileChange) -> bool {
    matches!(writer, Writer::Red { .. })
        && matches!(change, FileChange::Write { .. })
        && Language::of(change.path()).is_some()
}

/// The test files a change set leaves behind, with their content hashes.
pub(crate) fn written_hashes(set: &ChangeSet) -> FileHashes {
    let mut out = FileHashes::new();
    for c in &set.changes {
        match c.bytes() {
            Some(bytes) => {
                out.insert(c.path().to_string(), ContentHash::of_bytes(&bytes));
            }
            None => {
                out.remove(c.path());
            }
        }
    }
    out
}

/// Compares the test files on disk with those expected: frozen first, then unexpected ones.
/// Called only where no change set can have written a frozen file (before a step, and after
/// applying a change set already checked against the frozen tests), so a frozen file that
/// differs changed outside Consort.
pub(crate) fn check_tests_on_disk(
    expected: &FileHashes,
    on_disk: &FileHashes,
) -> Result<(), RuleViolation> {
    for (path, hash) in expected {
        let found = on_disk.get(path).copied();
        if found != Some(*hash) {
            return Err(RuleViolation::ChangedOutsideConsort {
                path: path.clone(),
                expected: *hash,
                found,
            });
        }
    }
    if let Some(path) = on_disk.keys().find(|p| !expected.contains_key(*p)) {
        return Err(RuleViolation::UnexpectedTestFile { path: path.clone() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &str) -> FileChange {
        FileChange::Write {
            path: path.into(),
            content: "x".into(),
        }
    }

    /// A change set of these changes.
    fn set(changes: Vec<FileChange>) -> ChangeSet {
        ChangeSet {
            summary: String::new(),
            changes,
        }
    }

    fn one(path: &str) -> ChangeSet {
        set(vec![write(path)])
    }

    #[test]
    fn a_renamed_frozen_test_is_refused_as_frozen_in_either_order() {
        let policy = PathPolicy::default();
        let mut frozen = FileHashes::new();
        frozen.insert("tests/t1.sql".into(), ContentHash::of_bytes(b"t1"));
        let check = |changes| check_change_set(&set(changes), Writer::Code, &policy, &frozen);
        let delete = FileChange::Delete {
            path: "./tests/t1.sql".into(),
        };
        for changes in [
            vec![write("tests/t1_renamed.sql"), delete.clone()],
            vec![delete.clone(), write("tests/t1_renamed.sql")],
            vec![write("src/a.sql"), write("tests/new.sql"), delete.clone()],
        ] {
            assert_eq!(
                check(changes),
                Err(RuleViolation::FrozenTestModified {
                    path: "tests/t1.sql".into()
                })
            );
        }
        // Without a frozen test in it, a new test path is still refused for the Driver.
        assert_eq!(
            check(vec![write("src/a.sql"), write("tests/new.sql")]),
            Err(RuleViolation::TouchesTests {
                path: "tests/new.sql".into()
            })
        );
        // An escape is refused before anything else, wherever it sits.
        assert!(matches!(
            check(vec![delete, write("../out.sql")]),
            Err(RuleViolation::PathOutsideWorkTree { .. })
        ));
    }

    #[test]
    fn a_test_list_sharing_a_file_no_parser_knows_is_refused_at_design() {
        use crate::core::artifact::{TestEntry, TestList};
        use crate::core::regression::{EarlierTest, Inherited};
        let entry = |id: &str, path: &str| TestEntry {
            id: id.into(),
            ac_id: "S1-AC1".into(),
            description: String::new(),
            path: path.into(),
            test_name: None,
        };
        let list = |entries| TestList { entries };
        let none = Inherited::default();
        // Two entries in one SQL file: the second could never be written.
        let refused = check_files_frozen_whole(
            &list(vec![entry("T1", "tests/t.sql"), entry("T2", "tests/t.sql")]),
            &none,
            &[],
        )
        .expect_err("refused");
        assert!(
            refused
                .to_string()
                .contains("tests T1 and T2 would both live in `tests/t.sql`"),
            "{refused}"
        );
        // In a parsed language they may share it.
        check_files_frozen_whole(
            &list(vec![
                entry("T1", "tests/test_t.py"),
                entry("T2", "tests/test_t.py"),
            ]),
            &none,
            &[],
        )
        .expect("a Python file is judged test by test");
        // Beside an earlier feature's test in an SQL file: refused too.
        let earlier = Inherited {
            tests: vec![EarlierTest {
                feature: "F1".into(),
                test: "T1".into(),
                path: "tests/t.sql".into(),
                runner_name: "tests/t.sql".into(),
                hash: None,
            }],
            ..Inherited::default()
        };
        let refused =
            check_files_frozen_whole(&list(vec![entry("T1", "tests/t.sql")]), &earlier, &[])
                .expect_err("refused");
        assert!(
            refused
                .to_string()
                .contains("beside T1 of the earlier feature F1"),
            "{refused}"
        );
    }

    #[test]
    fn a_red_may_write_a_frozen_file_it_parses_and_no_one_may_delete_it() {
        let policy = PathPolicy::default();
        let mut frozen = FileHashes::new();
        frozen.insert("tests/test_a.py".into(), ContentHash::of_bytes(b"x"));
        frozen.insert("tests/t1.sql".into(), ContentHash::of_bytes(b"y"));
        let red = Writer::Red {
            must_write: "tests/test_a.py",
        };
        assert!(check_change_set(&one("tests/test_a.py"), red, &policy, &frozen).is_ok());
        let delete = set(vec![
            write("tests/test_a.py"),
            FileChange::Delete {
                path: "tests/t1.sql".into(),
            },
        ]);
        assert_eq!(
            check_change_set(&delete, red, &policy, &frozen),
            Err(RuleViolation::FrozenTestModified {
                path: "tests/t1.sql".into()
            })
        );
        let sql = Writer::Red {
            must_write: "tests/t1.sql",
        };
        assert!(matches!(
            check_change_set(&one("tests/t1.sql"), sql, &policy, &frozen),
            Err(RuleViolation::FrozenTestModified { .. })
        ));
        assert!(matches!(
            check_change_set(&one("tests/test_a.py"), Writer::Code, &policy, &frozen),
            Err(RuleViolation::FrozenTestModified { .. })
        ));
    }

    #[test]
    fn version_control_metadata_is_no_role_s() {
        let policy = PathPolicy::default();
        let frozen = FileHashes::new();
        let red = Writer::Red {
            must_write: "tests/t1.sql",
        };
        for path in [
            ".git/hooks/pre-commit",
            ".git/config",
            "vendor/x/.git/config",
            ".hg/hgrc",
            "tests/.svn/entries",
            ".git",
        ] {
            for writer in [Writer::Code, red] {
                assert_eq!(
                    check_change_set(&one(path), writer, &policy, &frozen),
                    Err(RuleViolation::TouchesHarness { path: path.into() }),
                    "{path} {writer:?}"
                );
            }
        }
    }

    #[test]
    fn writes_into_a_cache_are_refused_for_every_role() {
        let policy = PathPolicy::default().with_caches(&["build"]);
        let frozen = FileHashes::new();
        let red = Writer::Red {
            must_write: "tests/t1.sql",
        };
        for (path, dir) in [
            ("src/__pycache__/items.cpython-311.pyc", "__pycache__"),
            ("target/debug/x", "target"),
            ("sub/target/x", "target"),
            ("tests/__pycache__/t1.cpython-311.pyc", "__pycache__"),
            ("web/node_modules/left-pad/index.js", "node_modules"),
            ("sub/.consort/ledger.jsonl", ".consort"),
            ("out/build/x.sql", "build"),
        ] {
            for writer in [Writer::Code, red] {
                assert_eq!(
                    check_change_set(&one(path), writer, &policy, &frozen),
                    Err(RuleViolation::TouchesUnhashed {
                        path: path.into(),
                        dir: dir.into()
                    }),
                    "{path} {writer:?}"
                );
            }
        }
        // A file that is merely called like a cache is hashed, and so may be written.
        assert!(check_change_set(&one("src/target"), Writer::Code, &policy, &frozen).is_ok());
    }
}
