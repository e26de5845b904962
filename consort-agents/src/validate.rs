//! The role rules every produced artifact must satisfy, and turning untrusted JSON into an
//! artifact of the expected kind.
//!
//! Every rule the state machine applies to an answer is the machine's own function, called
//! here (`consort_actors::check_stories`, `check_spec`, `check_schema`, `check_test_list`,
//! `check_ux`, `check_architecture`, `check_review`, `check_change_set`, with the path rules
//! and frozen tests the assignment carries), so an agent hears of a violation before the
//! machine refuses it, in the machine's words, and the two can never disagree. What is checked
//! only here is what the machine does not judge: the kind against the step, text fields left
//! empty, the JSON form, and change sets' size, emptiness and duplicate paths. Rules about the
//! run itself (a RED that must fail, the tree a run leaves, …) are the machine's alone.

use std::collections::BTreeSet;

use consort_actors::normalise_relative;
use consort_actors::{
    ArchitectureVerdict, Artifact, ArtifactKind, Assignment, ChangeSet, FileChange, ReviewVerdict,
    SchemaPlan, Spec, Step, Stories, TestList, UxDesign,
};
use serde_json::Value;

/// Everything wrong with an artifact, one line per problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.join("; "))]
pub struct RuleViolations {
    /// The problems found, in order.
    pub problems: Vec<String>,
}

/// Checks a produced artifact against the assignment: the kind must be the expected one, the
/// role rules must hold (non-empty lists, unique ids, plain relative paths, …), and references
/// to the inputs must resolve.
pub fn check_artifact(assignment: &Assignment, artifact: &Artifact) -> Result<(), RuleViolations> {
    let mut p = Problems::default();
    let expected = assignment.expected_kind();
    if artifact.kind() != expected {
        p.push(format!(
            "step {} must produce a {expected}, not a {}",
            assignment.step,
            artifact.kind()
        ));
        return p.finish();
    }
    match artifact {
        Artifact::Stories(s) => check_stories(assignment, s, &mut p),
        Artifact::Spec(s) => check_spec(assignment, s, &mut p),
        Artifact::ArchitectureVerdict(v) => check_architecture(v, &mut p),
        Artifact::SchemaPlan(s) => check_schema(assignment, s, &mut p),
        Artifact::TestList(t) => check_test_list(assignment, t, &mut p),
        Artifact::UxDesign(u) => check_ux(assignment, u, &mut p),
        Artifact::ChangeSet(c) => check_change_set(assignment, c, &mut p),
        Artifact::ReviewVerdict(r) => check_review(r, &mut p),
        Artifact::TestRunReceipt(_) => p.push("no agent may produce a test-run receipt"),
    }
    p.finish()
}

/// Interprets untrusted JSON as an artifact of `expected` kind.
///
/// Accepts either the tagged form `{"kind": "...", "body": {...}}` or the bare body. Members
/// whose value is `null` are dropped first, so `null` means "absent" (models asked for a strict
/// schema send `null` for optional fields). A tagged artifact of another kind is returned as
/// such, so the caller can refuse it by kind.
pub fn parse_artifact(expected: ArtifactKind, mut value: Value) -> Result<Artifact, String> {
    strip_nulls(&mut value);
    if let Some(obj) = value.as_object()
        && obj.contains_key("kind")
        && obj.contains_key("body")
        && obj.len() == 2
    {
        return serde_json::from_value::<Artifact>(value).map_err(|e| {
            format!(
                "the answer is not a valid artifact: {}",
                short(&e.to_string())
            )
        });
    }
    let kind = serde_json::to_value(expected).map_err(|e| e.to_string())?;
    let tagged = serde_json::json!({ "kind": kind, "body": value });
    serde_json::from_value::<Artifact>(tagged).map_err(|e| {
        format!(
            "the answer is not a valid {expected}: {}",
            short(&e.to_string())
        )
    })
}

fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, val| !val.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

fn short(s: &str) -> String {
    clip(s, 400)
}

/// `s` cut to at most `max` bytes (on a character boundary), with `…` when it was cut.
pub(crate) fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn push(&mut self, s: impl Into<String>) {
        // Bounded: a pathological artifact must not produce a megabyte of feedback.
        if self.0.len() < 20 {
            self.0.push(s.into());
        }
    }

    fn finish(self) -> Result<(), RuleViolations> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(RuleViolations { problems: self.0 })
        }
    }

    fn non_empty(&mut self, what: &str, value: &str) {
        if value.trim().is_empty() {
            self.push(format!("{what} is empty"));
        }
    }

    /// The machine's verdict on the same rule, in its words.
    fn machine(&mut self, verdict: Result<(), consort_actors::RuleViolation>) {
        if let Err(violation) = verdict {
            self.push(violation.to_string());
        }
    }

    fn unique<'a>(&mut self, what: &str, ids: impl IntoIterator<Item = &'a str>) {
        let mut seen = BTreeSet::new();
        for id in ids {
            if !seen.insert(id) {
                self.push(format!("{what} `{id}` appears twice"));
            }
        }
    }
}

fn check_stories(a: &Assignment, s: &Stories, p: &mut Problems) {
    p.non_empty("feature_id", &s.feature_id);
    for story in &s.stories {
        p.non_empty(&format!("story {} title", story.id), &story.title);
        for ac in &story.acceptance_criteria {
            for (field, text) in [("given", &ac.given), ("when", &ac.when), ("then", &ac.then)] {
                p.non_empty(&format!("{} {field}", ac.id), text);
            }
        }
    }
    // The feature's id, when the assignment names the feature (the machine always does).
    let feature_id = a.inputs.feature.as_ref().map_or(&s.feature_id, |f| &f.id);
    p.machine(consort_actors::check_stories(s, feature_id));
}

fn check_spec(a: &Assignment, s: &Spec, p: &mut Problems) {
    p.non_empty("feature_id", &s.feature_id);
    p.non_empty("summary", &s.summary);
    for r in &s.requirements {
        p.non_empty(&format!("requirement {} statement", r.id), &r.statement);
    }
    if let Some(stories) = &a.inputs.stories {
        p.machine(consort_actors::check_spec(s, stories));
    }
}

fn check_architecture(v: &ArchitectureVerdict, p: &mut Problems) {
    if let ArchitectureVerdict::Approve { invariants, .. } = v {
        p.unique("invariant id", invariants.iter().map(|i| i.id.as_str()));
        for i in invariants {
            p.non_empty("an invariant id", &i.id);
            p.non_empty(&format!("invariant {} kind", i.id), &i.kind);
            p.non_empty(&format!("invariant {} brief", i.id), &i.brief);
        }
    }
    p.machine(consort_actors::check_architecture(v));
}

fn check_schema(a: &Assignment, s: &SchemaPlan, p: &mut Problems) {
    for m in &s.migrations {
        p.non_empty("a migration version", &m.version);
    }
    if let Some(stories) = &a.inputs.stories {
        p.machine(consort_actors::check_schema(
            s,
            stories,
            a.inputs.migration_tool.as_ref(),
        ));
    }
}

fn check_test_list(a: &Assignment, t: &TestList, p: &mut Problems) {
    for e in &t.entries {
        p.non_empty(&format!("test {} description", e.id), &e.description);
    }
    // The machine's own check, with the project's path rules when the assignment carries them
    // (without them, any test path is allowed: only the list's form and traces are judged).
    let policy = match &a.writes {
        Some(w) => w.paths.policy(),
        None => consort_actors::PathPolicy::new(&["**"], &[]),
    };
    match (policy, a.inputs.stories.as_deref()) {
        (Ok(policy), Some(stories)) => {
            p.machine(consort_actors::check_test_list(t, stories, &policy))
        }
        (Ok(_), None) => p.push("the assignment carries no stories to trace the tests to"),
        (Err(e), _) => p.push(format!("the assignment's path rules do not compile: {e}")),
    }
}

fn check_ux(a: &Assignment, u: &UxDesign, p: &mut Problems) {
    if u.screens.is_empty() {
        p.push("screens is empty: design at least one screen");
    }
    for s in &u.screens {
        p.non_empty("a screen name", &s.name);
        if s.elements.is_empty() {
            p.push(format!("screen `{}` lists no elements", s.name));
        }
    }
    if let Some(stories) = &a.inputs.stories {
        p.machine(consort_actors::check_ux(u, stories));
    }
}

fn check_change_set(a: &Assignment, c: &ChangeSet, p: &mut Problems) {
    let step = &a.step;
    // A refactor may legitimately change nothing; every other change-set step must change
    // something.
    if c.changes.is_empty() && !matches!(step, Step::Refactor { .. }) {
        p.push(format!(
            "changes is empty: step {step} must change at least one file"
        ));
    }
    let mut seen = BTreeSet::new();
    for change in &c.changes {
        match normalise_relative(change.path()) {
            Ok(norm) => {
                if !seen.insert(norm.clone()) {
                    p.push(format!("path `{norm}` is changed twice"));
                }
            }
            Err(e) => p.push(e.to_string()),
        }
        if let FileChange::Write { content, path } = change
            && content.len() > 1 << 20
        {
            p.push(format!("file `{path}` is larger than 1 MiB"));
        }
    }
    // Who may write what: the machine's check, with the path rules the assignment carries.
    if let Some(w) = &a.writes {
        let writer = match (step, &a.inputs.test) {
            (Step::Red { .. }, Some(entry)) => consort_actors::Writer::Red {
                must_write: &entry.path,
            },
            (Step::Red { .. }, None) => return,
            _ => consort_actors::Writer::Code,
        };
        // Only the frozen paths matter to the check, not their hashes.
        let frozen: consort_actors::FileHashes = w
            .frozen_tests
            .iter()
            .map(|path| (path.clone(), consort_actors::ContentHash::of_bytes(b"")))
            .collect();
        match w.paths.policy() {
            Ok(policy) => {
                p.machine(consort_actors::check_change_set(c, writer, &policy, &frozen).map(drop))
            }
            Err(e) => p.push(format!("the assignment's path rules do not compile: {e}")),
        }
    }
}

fn check_review(r: &ReviewVerdict, p: &mut Problems) {
    p.machine(consort_actors::check_review(r));
}

#[cfg(test)]
mod tests {
    use super::*;
    use consort_actors::Role;

    /// An assignment of `step`, attempt 0, no inputs (the test kit's).
    fn assignment(step: Step) -> Assignment {
        consort_testkit::artifacts::assignment(1, &step.to_string())
    }

    #[test]
    fn bare_bodies_and_tagged_artifacts_parse() {
        let bare = serde_json::json!({"decision": "approve", "notes": null});
        let a = parse_artifact(ArtifactKind::ReviewVerdict, bare).expect("bare body");
        assert_eq!(
            a,
            Artifact::ReviewVerdict(ReviewVerdict::Approve { notes: vec![] })
        );
        let tagged = serde_json::json!({"kind": "test-list", "body": {"entries": []}});
        let a = parse_artifact(ArtifactKind::ReviewVerdict, tagged).expect("tagged");
        assert_eq!(a.kind(), ArtifactKind::TestList);
        let err = parse_artifact(ArtifactKind::Spec, serde_json::json!({"summary": 3}))
            .expect_err("not a spec");
        assert!(err.contains("not a valid spec"), "{err}");
    }

    #[test]
    fn empty_and_escaping_change_sets_break_the_rules() {
        let red = assignment(Step::Red { test: "T1".into() });
        let empty = Artifact::ChangeSet(ChangeSet::default());
        let err = check_artifact(&red, &empty).expect_err("empty");
        assert!(err.to_string().contains("changes is empty"));
        let refactor = assignment(Step::Refactor {
            test: "T1".into(),
            round: 0,
        });
        assert!(check_artifact(&refactor, &empty).is_ok());
        let escaping = Artifact::ChangeSet(ChangeSet {
            summary: String::new(),
            changes: vec![FileChange::Write {
                path: "../outside.sql".into(),
                content: "x".into(),
            }],
        });
        let err = check_artifact(&red, &escaping).expect_err("escapes");
        assert!(err.to_string().contains("climbs out"), "{err}");
    }

    /// The agent hears the machine's verdict word for word: the same function judges both.
    #[test]
    fn the_self_check_is_the_machines_verdict() {
        let policy = consort_actors::PathPolicy::new(&["tests/**"], &[])
            .and_then(|p| p.with_collected(&["tests/**/test_*.py"]))
            .expect("globs");
        let stories = consort_testkit::artifacts::stories_of(&[(false, 1)]);
        let list = TestList {
            entries: vec![consort_testkit::artifacts::entry(
                "T1",
                "S1-AC1",
                "tests/helpers.py",
            )],
        };
        let mut a = assignment(Step::TestList);
        a.inputs.stories = Some(stories.clone().into());
        a.writes = Some(consort_actors::WriteRules {
            summary: String::new(),
            paths: policy.rules(),
            frozen_tests: vec![],
            earlier_tests: vec![],
        });
        let mine = check_artifact(&a, &Artifact::TestList(list.clone())).expect_err("refused");
        let machine =
            consort_actors::check_test_list(&list, &stories, &policy).expect_err("refused");
        assert_eq!(mine.problems, vec![machine.to_string()]);
        assert!(mine.to_string().contains("never collects"), "{mine}");
        // A Driver's change to a test path: the machine's words again.
        let mut green = assignment(Step::Green { test: "T1".into() });
        green.writes = a.writes.clone();
        let set = ChangeSet {
            summary: String::new(),
            changes: vec![FileChange::Write {
                path: "tests/test_a.py".into(),
                content: "x".into(),
            }],
        };
        let mine = check_artifact(&green, &Artifact::ChangeSet(set.clone())).expect_err("refused");
        let machine = consort_actors::check_change_set(
            &set,
            consort_actors::Writer::Code,
            &policy,
            &Default::default(),
        )
        .expect_err("refused");
        assert_eq!(mine.problems, vec![machine.to_string()]);
    }

    #[test]
    fn wrong_kind_and_receipts_are_rule_violations() {
        let a = assignment(Step::Review {
            test: "T1".into(),
            round: 0,
        });
        assert_eq!(a.role, Role::Navigator);
        let err = check_artifact(&a, &Artifact::TestList(TestList { entries: vec![] }))
            .expect_err("wrong kind");
        assert!(err.to_string().contains("must produce a review-verdict"));
        let revise = Artifact::ReviewVerdict(ReviewVerdict::ChangesRequested { reasons: vec![] });
        assert!(check_artifact(&a, &revise).is_err());
    }
}
