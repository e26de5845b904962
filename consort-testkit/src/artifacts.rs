//! Valid artifacts for every step of the lifecycle, and the records around them (approvals,
//! receipts, assignments).
//!
//! The default fixture is a small stock-keeping feature `F1`: three stories (the first one
//! user-facing when asked) of two acceptance criteria each, one requirement per criterion, one
//! migration per story and a test list that cycles through the criteria. The `*_of` builders
//! make other shapes.

use chrono::{TimeZone, Utc};
use consort_actors::{
    AcceptanceCriterion, ActorId, ArchitectureVerdict, Artifact, Assignment, AssignmentId,
    AssignmentInputs, ChangeSet, ContentHash, ExitRecord, FeatureRequest, FileChange, GateApproval,
    GateDecision, GateKind, Migration, RequestId, Requirement, ReviewVerdict, Role, RunTimings,
    SchemaPlan, Screen, Spec, Step, Stories, Story, TestEntry, TestList, TestOutcome,
    TestRunReceipt, TestStatus, UxDesign,
};

/// The feature request `F1`.
pub fn feature() -> FeatureRequest {
    FeatureRequest {
        id: "F1".into(),
        title: "Stock by SKU and location".into(),
        body: "Record stock movements and answer the on-hand quantity per SKU and location.".into(),
    }
}

/// An acceptance criterion with this id.
pub fn ac(id: &str) -> AcceptanceCriterion {
    AcceptanceCriterion {
        id: id.into(),
        given: "a warehouse with stock".into(),
        when: "a movement is recorded".into(),
        then: "the on-hand quantity follows".into(),
    }
}

/// Story `S{n}` with `criteria` acceptance criteria `S{n}-AC1`, `S{n}-AC2`, ….
pub fn story(n: usize, user_facing: bool, criteria: usize) -> Story {
    Story {
        id: format!("S{n}"),
        title: format!("story {n}"),
        as_a: "warehouse operator".into(),
        i_want: "to record stock".into(),
        so_that: "counts are right".into(),
        user_facing,
        acceptance_criteria: (1..=criteria).map(|a| ac(&format!("S{n}-AC{a}"))).collect(),
    }
}

/// Stories `S1`, `S2`, … of feature `F1`, one per `(user_facing, criteria)`.
pub fn stories_of(shape: &[(bool, usize)]) -> Stories {
    Stories {
        feature_id: "F1".into(),
        stories: shape
            .iter()
            .enumerate()
            .map(|(i, (uf, criteria))| story(i + 1, *uf, *criteria))
            .collect(),
    }
}

/// Three stories of two acceptance criteria each; the first is user-facing when asked.
pub fn stories(user_facing: bool) -> Stories {
    stories_of(&[(user_facing, 2), (false, 2), (false, 2)])
}

/// The acceptance criteria ids of [`stories`], in order.
pub fn ac_ids() -> Vec<String> {
    (1..=3)
        .flat_map(|s| (1..=2).map(move |a| format!("S{s}-AC{a}")))
        .collect()
}

/// A spec of feature `F1` with one requirement `R1`, `R2`, … per acceptance criterion.
pub fn spec_of(ac_ids: &[String]) -> Spec {
    Spec {
        feature_id: "F1".into(),
        summary: "Stock movements and on-hand quantities.".into(),
        requirements: ac_ids
            .iter()
            .enumerate()
            .map(|(i, ac_id)| Requirement {
                id: format!("R{}", i + 1),
                ac_id: ac_id.clone(),
                statement: "the system shall keep the quantity consistent".into(),
            })
            .collect(),
        out_of_scope: vec![],
        open_questions: vec![],
    }
}

/// The spec of [`stories`]: one requirement per acceptance criterion.
pub fn spec() -> Spec {
    spec_of(&ac_ids())
}

/// An approving architecture verdict.
pub fn approve_architecture() -> ArchitectureVerdict {
    ArchitectureVerdict::Approve {
        layers: vec!["sql".into()],
        nfrs: vec![],
        invariants: vec![],
    }
}

/// Migration `000{n}` of story `S{n}`: one table `t{n}`.
pub fn migration(n: usize) -> Migration {
    Migration {
        version: format!("000{n}"),
        story_id: format!("S{n}"),
        description: format!("tables of story {n}"),
        sql: format!("CREATE TABLE t{n} (id bigint PRIMARY KEY, qty int NOT NULL);"),
    }
}

/// A schema plan of `n` migrations, one per story.
pub fn schema_of(n: usize) -> SchemaPlan {
    SchemaPlan {
        migrations: (1..=n).map(migration).collect(),
    }
}

/// The schema plan of [`stories`]: three migrations.
pub fn schema() -> SchemaPlan {
    schema_of(3)
}

/// A test-list entry `id` for the criterion `ac_id`, at `path`.
pub fn entry(id: &str, ac_id: &str, path: &str) -> TestEntry {
    TestEntry {
        id: id.into(),
        ac_id: ac_id.into(),
        description: format!("test {id}"),
        path: path.into(),
        test_name: None,
    }
}

/// A test list of `n` entries `T1` … `Tn` at `tests/t01.sql` …, cycling through [`ac_ids`].
pub fn test_list(n: usize) -> TestList {
    let acs = ac_ids();
    TestList {
        entries: (1..=n)
            .map(|i| {
                entry(
                    &format!("T{i}"),
                    &acs[(i - 1) % acs.len()],
                    &format!("tests/t{i:02}.sql"),
                )
            })
            .collect(),
    }
}

/// A UX design with one screen for story `S1`.
pub fn ux() -> UxDesign {
    UxDesign {
        screens: vec![Screen {
            story_id: "S1".into(),
            name: "record stock".into(),
            elements: vec!["sku".into(), "location".into(), "quantity".into()],
        }],
        notes: vec![],
    }
}

/// A write of `content` to `path`.
pub fn write(path: &str, content: &str) -> FileChange {
    FileChange::Write {
        path: path.into(),
        content: content.into(),
    }
}

/// A change set artifact of these changes.
pub fn change_set(summary: &str, changes: Vec<FileChange>) -> Artifact {
    Artifact::ChangeSet(ChangeSet {
        summary: summary.into(),
        changes,
    })
}

/// A change set artifact that writes one file.
pub fn change(path: &str, content: &str) -> Artifact {
    change_set(&format!("write {path}"), vec![write(path, content)])
}

/// An approving review verdict.
pub fn approve_review() -> Artifact {
    Artifact::ReviewVerdict(ReviewVerdict::Approve {
        notes: vec!["reads well".into()],
    })
}

/// The actor that plays `role` under the role's own name.
pub fn author(role: Role) -> ActorId {
    ActorId::new(role, role.as_str())
}

/// An approval of `gate` for `hash` by `ada`, at a fixed time.
pub fn approval(gate: GateKind, hash: ContentHash) -> GateApproval {
    GateApproval {
        gate,
        hash,
        approver: "ada".into(),
        at: Utc
            .with_ymd_and_hms(2026, 11, 29, 12, 0, 0)
            .single()
            .unwrap_or_default(),
        decision: GateDecision::Approve,
        note: String::new(),
    }
}

/// An assignment for the step with key `step` (played by its own role), attempt 0, no inputs.
pub fn assignment(id: u64, step: &str) -> Assignment {
    let step: Step = step.parse().expect("a step key");
    Assignment {
        id: AssignmentId(id),
        role: step.role(),
        step,
        attempt: 0,
        runner: None,
        writes: None,
        inputs: AssignmentInputs::default(),
        feedback: vec![],
        budget: None,
        tools: None,
    }
}

/// `a` with `files` (path, content) added to the files its inputs carry.
pub fn with_files(mut a: Assignment, files: &[(&str, &str)]) -> Assignment {
    a.inputs.files.extend(
        files
            .iter()
            .map(|(path, content)| (path.to_string(), content.to_string())),
    );
    a
}

/// A receipt of the embedded provider and the psql runner for `request` on `workspace_hash`:
/// these outcomes, this exit code and this output excerpt.
pub fn receipt_with(
    request: RequestId,
    workspace_hash: ContentHash,
    outcomes: &[(&str, TestStatus)],
    exit: i32,
    excerpt: &str,
) -> TestRunReceipt {
    TestRunReceipt {
        request_id: request,
        workspace_hash,
        provider: "embedded".into(),
        branch_copy: None,
        branch_id: format!("consort_b{}", request.0),
        runner: "psql".into(),
        command: "psql -X -q -v ON_ERROR_STOP=1 -c BEGIN -f <test> -c ROLLBACK".into(),
        timings: RunTimings::default(),
        outcomes: outcomes
            .iter()
            .map(|(name, status)| TestOutcome::new(*name, *status))
            .collect(),
        exit: ExitRecord {
            code: Some(exit),
            signal: None,
            timed_out: false,
        },
        output_digest: ContentHash::of_bytes(excerpt.as_bytes()),
        output_excerpt: excerpt.into(),
        confinement: Default::default(),
        tree_changes: Vec::new(),
        changed_since_request: Vec::new(),
        flaky: Vec::new(),
        missing_modules: Vec::new(),
        shards: Vec::new(),
        selection: Vec::new(),
        harness: None,
    }
}
