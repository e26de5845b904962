//! Scripted replay: a whole design lane from one script, and the script's failure modes.

use std::collections::BTreeMap;
use std::time::Duration;

use consort_actors::{
    ActorId, AgentFailure, ArchitectureVerdict, Artifact, Assignment, FileChange, ReviewVerdict,
    Role, RoleMsg, Step,
};
use consort_agents::{Agent, RoleArgs, Script, ScriptError, spawn_role};
use consort_testkit::agents::ask;
use consort_testkit::artifacts::{assignment, feature};
use ractor::ActorRef;

/// The design lane of a small feature, with one architect revision.
const DESIGN_LANE: &str = include_str!("../fixtures/design_lane.toml");

async fn actor_for(role: Role, script: &Script) -> ActorRef<RoleMsg> {
    let args = RoleArgs::new(
        ActorId::new(role, format!("{role}-scripted")),
        std::sync::Arc::new(script.agent(role)),
    )
    .with_timeout(Duration::from_secs(5));
    spawn_role(args).await.expect("spawn").0
}

#[tokio::test]
async fn a_whole_design_lane_runs_from_one_script() {
    let script = Script::from_toml_str(DESIGN_LANE).expect("the script parses");
    assert_eq!(script.roles().len(), 6);
    let mut actors = BTreeMap::new();
    for role in script.roles() {
        actors.insert(role, actor_for(role, &script).await);
    }
    let mut inputs = consort_actors::AssignmentInputs {
        feature: Some(feature().into()),
        ..Default::default()
    };
    let mut next_id = 0;
    let mut run = |step: &str, inputs: &consort_actors::AssignmentInputs| {
        next_id += 1;
        let mut a = assignment(next_id, step);
        a.inputs = inputs.clone();
        a
    };

    let ask = |a: Assignment| {
        let actor = actors[&a.step.role()].clone();
        async move {
            let p = ask(&actor, a).await.expect("produced");
            assert_eq!(p.author.name, format!("{}-scripted", p.author.role));
            p.artifact
        }
    };

    let Artifact::Stories(stories) = ask(run("stories", &inputs)).await else {
        panic!("stories expected")
    };
    assert_eq!(stories.stories[0].acceptance_criteria[0].id, "S1-AC1");
    inputs.stories = Some(stories.into());

    let Artifact::Spec(spec0) = ask(run("spec/r0", &inputs)).await else {
        panic!("spec expected")
    };
    inputs.spec = Some(spec0.into());
    let verdict = ask(run("architecture/r0", &inputs)).await;
    assert!(matches!(
        verdict,
        Artifact::ArchitectureVerdict(ArchitectureVerdict::Revise { .. })
    ));
    let Artifact::Spec(spec1) = ask(run("spec/r1", &inputs)).await else {
        panic!("spec expected")
    };
    assert!(spec1.requirements[0].statement.contains("unknown SKU"));
    inputs.spec = Some(spec1.into());
    let Artifact::ArchitectureVerdict(approve) = ask(run("architecture/r1", &inputs)).await else {
        panic!("verdict expected")
    };
    assert!(
        matches!(approve, ArchitectureVerdict::Approve { ref invariants, .. } if invariants.len() == 1)
    );
    inputs.architecture = Some(approve.into());

    let Artifact::SchemaPlan(schema) = ask(run("schema", &inputs)).await else {
        panic!("schema expected")
    };
    let sql = &schema.migrations[0].sql;
    assert!(sql.starts_with("CREATE TABLE stock_records (\n"), "{sql}");
    assert!(
        sql.contains(r"'a \n stays literal'"),
        "literal strings keep backslashes"
    );
    inputs.schema = Some(schema.into());

    let Artifact::TestList(tests) = ask(run("test-list", &inputs)).await else {
        panic!("test list expected")
    };
    assert_eq!(tests.entries[0].runner_name(), "tests/t1_lookup.sql");
    inputs.test_list = Some(tests.into());

    let Artifact::UxDesign(ux) = ask(run("ux", &inputs)).await else {
        panic!("ux expected")
    };
    assert_eq!(ux.screens[0].story_id, "S1");
}

#[tokio::test]
async fn a_step_the_script_does_not_answer_is_a_mismatch() {
    let script = Script::from_toml_str(DESIGN_LANE).expect("parses");
    let agent = script.agent(Role::Navigator);
    match agent.act(&assignment(1, "red/T1")).await {
        Err(AgentFailure::ScriptMismatch { wanted, found }) => {
            assert_eq!(wanted, "navigator red/T1 (attempt 0)");
            assert_eq!(found, "no entries for navigator");
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
    match script
        .agent(Role::SpecAuthor)
        .act(&assignment(2, "spec/r7"))
        .await
    {
        Err(AgentFailure::ScriptMismatch { found, .. }) => {
            assert_eq!(
                found,
                "entries for spec-author answer only: spec/r0, spec/r1"
            )
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

const BUILD: &str = r#"
[[entry]]
step = "red/T1"
artifact = { kind = "change-set", body = { summary = "first try", changes = [ { op = "write", path = "tests/t1.sql", content = "select 1;" } ] } }

[[entry]]
step = "red/T1"
artifact = { kind = "change-set", body = { summary = "second try", changes = [ { op = "write", path = "tests/t1.sql", content = "select 2;" } ] } }

[[entry]]
step = "green/T1"
attempt = 2
artifact = { kind = "change-set", body = { summary = "third try", changes = [ { op = "delete", path = "src/old.sql" } ] } }

[[entry]]
step = "review/T1/0"
artifact = { kind = "review-verdict", body = { decision = "changes-requested", reasons = ["rename"] } }

[[entry]]
step = "review/*/*"
artifact = { kind = "review-verdict", body = { decision = "approve", notes = ["generic"] } }

[[entry]]
step = "review/T2/*"
artifact = { kind = "review-verdict", body = { decision = "approve", notes = ["T2 specific"] } }

[[entry]]
step = "refactor/*/0"
artifact = { kind = "change-set", body = { summary = "refactor", changes = [] } }
"#;

fn summary(a: &Artifact) -> String {
    match a {
        Artifact::ChangeSet(c) => c.summary.clone(),
        Artifact::ReviewVerdict(ReviewVerdict::Approve { notes }) => notes.join(","),
        Artifact::ReviewVerdict(ReviewVerdict::ChangesRequested { reasons }) => reasons.join(","),
        other => format!("{other:?}"),
    }
}

fn step(s: &str) -> Step {
    s.parse().expect("step key")
}

#[test]
fn attempts_select_entries_and_running_out_is_exhaustion() {
    let script = Script::from_toml_str(BUILD).expect("parses");
    let nav = |k: &str, n: u32| {
        script
            .lookup(Role::Navigator, &step(k), n)
            .map(|e| summary(&e.artifact))
    };
    assert_eq!(nav("red/T1", 0).expect("first"), "first try");
    assert_eq!(nav("red/T1", 1).expect("second"), "second try");
    match nav("red/T1", 2) {
        Err(AgentFailure::ScriptExhausted { wanted }) => {
            assert!(
                wanted.starts_with("navigator red/T1 (attempt 2)"),
                "{wanted}"
            );
            assert!(wanted.contains("2 entries"), "{wanted}");
        }
        other => panic!("expected exhaustion, got {other:?}"),
    }
    // An explicit attempt answers that attempt only.
    let drv = |n: u32| script.lookup(Role::Driver, &step("green/T1"), n);
    assert_eq!(summary(&drv(2).expect("attempt 2").artifact), "third try");
    assert!(matches!(drv(0), Err(AgentFailure::ScriptExhausted { .. })));
}

/// A scripted agent whose entries run out after a refused answer says what the refusal was,
/// so the halt names what to fix in the answer.
#[tokio::test]
async fn an_exhausted_script_repeats_the_refusal_it_follows() {
    let agent = Script::from_toml_str(BUILD)
        .expect("parses")
        .agent(Role::Navigator);
    let mut a = assignment(1, "red/T1");
    a.attempt = 2;
    a.feedback = vec![
        "Your previous answer was refused: RED broke tests that were green: t0. Try again within the rules.\nThe test run:\n…".into(),
    ];
    let Err(AgentFailure::ScriptExhausted { wanted }) = agent.act(&a).await else {
        panic!("the script is exhausted at attempt 2")
    };
    assert!(
        wanted.ends_with(". The answer was refused: RED broke tests that were green: t0."),
        "{wanted}"
    );
    a.feedback.clear();
    let Err(AgentFailure::ScriptExhausted { wanted }) = agent.act(&a).await else {
        panic!("exhausted")
    };
    assert!(!wanted.contains("was refused:"), "{wanted}");
}

#[test]
fn exact_keys_win_over_wildcards_and_specific_wildcards_over_general_ones() {
    let script = Script::from_toml_str(BUILD).expect("parses");
    let nav = |k: &str, n: u32| {
        summary(
            &script
                .lookup(Role::Navigator, &step(k), n)
                .expect("answered")
                .artifact,
        )
    };
    assert_eq!(nav("review/T1/0", 0), "rename");
    // The exact entry has one answer; a retry of the same step falls back to the wildcard.
    assert_eq!(nav("review/T1/0", 1), "generic");
    assert_eq!(nav("review/T1/1", 0), "generic");
    assert_eq!(nav("review/T9/3", 0), "generic");
    assert_eq!(nav("review/T2/0", 0), "T2 specific");
    let drv = |k: &str| script.lookup(Role::Driver, &step(k), 0);
    assert_eq!(
        summary(&drv("refactor/T3/0").expect("wildcard").artifact),
        "refactor"
    );
    assert!(matches!(
        drv("refactor/T3/1"),
        Err(AgentFailure::ScriptMismatch { .. })
    ));
    // Roles do not see each other's entries.
    assert!(matches!(
        script.lookup(Role::Driver, &step("review/T1/0"), 0),
        Err(AgentFailure::ScriptMismatch { .. })
    ));
}

#[tokio::test]
async fn lookup_is_stateless_so_a_resumed_run_gets_the_same_answers() {
    let script = Script::from_toml_str(BUILD).expect("parses");
    // A full run asks red/T1 twice (a refusal made the conductor retry), then review.
    let first = script.agent(Role::Navigator);
    let mut a0 = assignment(1, "red/T1");
    let run0 = first.act(&a0).await.expect("attempt 0");
    a0.attempt = 1;
    let run1 = first.act(&a0).await.expect("attempt 1");
    // Asking again does not advance anything.
    let again = first.act(&a0).await.expect("attempt 1 again");
    assert_eq!(run1, again);
    assert_ne!(run0, run1);

    // A resumed process builds a fresh agent and asks only the pending step.
    let reloaded = Script::from_toml_str(BUILD).expect("parses");
    let resumed = reloaded.agent(Role::Navigator);
    assert_eq!(resumed.act(&a0).await.expect("resumed"), run1);
}

#[test]
fn parse_errors_say_where() {
    match Script::from_toml_str("[[entry]]\nstep = \"red/T1\"\nartifact = { kind = ")
        .expect_err("syntax")
    {
        ScriptError::Syntax { line, .. } => assert_eq!(line, Some(3)),
        other => panic!("expected a syntax error, got {other:?}"),
    }
    let bad_step = "[[entry]]\nstep = \"red/T1\"\nartifact = { kind = \"review-verdict\", body = { decision = \"approve\" } }\n\n[[entry]]\nstep = \"purple/T1\"\nartifact = { kind = \"review-verdict\", body = { decision = \"approve\" } }\n";
    match Script::from_toml_str(bad_step).expect_err("bad step") {
        ScriptError::Entry {
            entry,
            line,
            detail,
            ..
        } => {
            assert_eq!(entry, 2);
            assert_eq!(line, Some(5));
            assert!(detail.contains("purple/T1"), "{detail}");
        }
        other => panic!("expected an entry error, got {other:?}"),
    }
    let wrong_role = "[[entry]]\nrole = \"driver\"\nstep = \"review/T1/0\"\nartifact = { kind = \"review-verdict\", body = { decision = \"approve\" } }\n";
    let err = Script::from_toml_str(wrong_role).expect_err("wrong role");
    assert!(
        err.to_string()
            .contains("belongs to the navigator, not the driver"),
        "{err}"
    );
    let bad_body = "[[entry]]\nstep = \"schema\"\nartifact = { kind = \"schema-plan\", body = { migrations = [ { version = \"1\" } ] } }\n";
    let err = Script::from_toml_str(bad_body).expect_err("missing sql");
    assert!(err.to_string().contains("entry 1 (line 1)"), "{err}");
    assert!(err.to_string().contains("missing field"), "{err}");

    let json_unknown = r#"[{"step": "ux", "artefact": {}}]"#;
    match Script::from_json_str(json_unknown).expect_err("unknown field") {
        ScriptError::Entry { entry, detail, .. } => {
            assert_eq!(entry, 1);
            assert!(detail.contains("artefact"), "{detail}");
        }
        other => panic!("expected an entry error, got {other:?}"),
    }
    match Script::from_json_str("{\n  \"entry\": [\n    {,}\n  ]\n}").expect_err("syntax") {
        ScriptError::Syntax { line, .. } => assert_eq!(line, Some(3)),
        other => panic!("expected a syntax error, got {other:?}"),
    }
    let dup = "[[entry]]\nstep = \"ux\"\nattempt = 0\nartifact = { kind = \"ux-design\", body = { screens = [] } }\n[[entry]]\nstep = \"ux\"\nattempt = 0\nartifact = { kind = \"ux-design\", body = { screens = [] } }\n";
    let err = Script::from_toml_str(dup).expect_err("duplicate");
    assert!(err.to_string().contains("a second answer"), "{err}");
}

#[test]
fn step_patterns_keep_the_kind_literal_and_the_shape_of_the_key() {
    use consort_agents::StepPattern;
    assert!(
        StepPattern::parse("*/T1").is_err(),
        "the kind cannot be a wildcard"
    );
    assert!(
        StepPattern::parse("red/*/0").is_err(),
        "red has two segments"
    );
    assert!(StepPattern::parse("spec/x1").is_err(), "a revision is r<n>");
    let p = StepPattern::parse("refactor/*/0").expect("pattern");
    assert_eq!(p.role(), Role::Driver);
    assert_eq!(p.wildcards(), 1);
    assert!(p.matches("refactor/T7/0"));
    assert!(!p.matches("refactor/T7/1"));
    assert!(!p.matches("review/T7/0"));
    assert!(
        StepPattern::parse("spec/*")
            .expect("pattern")
            .matches("spec/r3")
    );
}

/// Writes `content` to the file `name` in `dir`; its path.
fn written(dir: &tempfile::TempDir, name: &str, content: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, content).expect("write");
    path
}

#[test]
fn per_role_files_in_both_formats_load_together() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nav = written(
        &dir,
        "navigator.json",
        r#"{"role": "navigator", "entry": [
            {"step": "red/T1", "artifact": {"kind": "change-set",
              "body": {"changes": [{"op": "write", "path": "tests/t1.sql", "content": "select 1;"}]}}}
        ]}"#,
    );
    let drv = written(
        &dir,
        "driver.toml",
        "role = \"driver\"\n[[entry]]\nstep = \"green/T1\"\n[entry.artifact]\nkind = \"change-set\"\n[[entry.artifact.body.changes]]\nop = \"write\"\npath = \"src/a.sql\"\ncontent = '''\nselect 'x';\n'''\n",
    );
    let script = Script::from_paths([&nav, &drv]).expect("both load");
    assert_eq!(
        script.roles().into_iter().collect::<Vec<_>>(),
        vec![Role::Navigator, Role::Driver]
    );
    let green = script
        .lookup(Role::Driver, &step("green/T1"), 0)
        .expect("driver entry");
    match &green.artifact {
        Artifact::ChangeSet(c) => assert_eq!(
            c.changes,
            vec![FileChange::Write {
                path: "src/a.sql".into(),
                content: "select 'x';\n".into()
            }]
        ),
        other => panic!("{other:?}"),
    }
    assert!(green.origin.ends_with("driver.toml:2"), "{}", green.origin);

    // A per-role file may not answer another role's step.
    let bad = written(
        &dir,
        "bad.json",
        r#"{"role": "driver", "entry": [{"step": "ux", "artifact": {"kind": "ux-design", "body": {"screens": []}}}]}"#,
    );
    assert!(matches!(
        Script::from_path(&bad),
        Err(ScriptError::Entry { .. })
    ));
    let yaml = written(&dir, "script.yaml", "entry: []");
    assert!(matches!(
        Script::from_path(&yaml),
        Err(ScriptError::UnknownFormat { .. })
    ));
    assert!(matches!(
        Script::from_path(dir.path().join("missing.toml")),
        Err(ScriptError::Io { .. })
    ));
}

#[test]
fn the_documented_examples_parse() {
    let doc = include_str!("../../SCRIPTS.md");
    let mut blocks = 0;
    for (lang, parse) in [
        (
            "```toml\n",
            Script::from_toml_str as fn(&str) -> Result<Script, ScriptError>,
        ),
        ("```json\n", Script::from_json_str),
    ] {
        let mut rest = doc;
        while let Some(start) = rest.find(lang) {
            let body = &rest[start + lang.len()..];
            let end = body.find("```").expect("closed block");
            let script = parse(&body[..end]).unwrap_or_else(|e| panic!("{lang}: {e}"));
            assert!(!script.entries().is_empty());
            blocks += 1;
            rest = &body[end + 3..];
        }
    }
    assert_eq!(blocks, 2);
    // The TOML example's review entries behave as documented.
    let doc_toml = {
        let start = doc.find("```toml\n").expect("toml") + 8;
        &doc[start..start + doc[start..].find("```").expect("end")]
    };
    let s = Script::from_toml_str(doc_toml).expect("parses");
    // The first review asks for changes; a later one approves.
    for (key, changes_requested) in [("review/T1/0", true), ("review/T1/1", false)] {
        let entry = s
            .lookup(Role::Navigator, &step(key), 0)
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        let Artifact::ReviewVerdict(verdict) = &entry.artifact else {
            panic!("{key}: a review verdict expected, got {:?}", entry.artifact)
        };
        assert_eq!(
            matches!(verdict, ReviewVerdict::ChangesRequested { .. }),
            changes_requested,
            "{key}: {verdict:?}"
        );
    }
}

#[tokio::test]
async fn a_script_holding_a_wrong_kind_is_refused_by_the_role_actor() {
    // Scripts may misbehave on purpose; the actor refuses, as it would a model.
    let script = Script::from_toml_str(
        "[[entry]]\nstep = \"green/T1\"\nartifact = { kind = \"test-list\", body = { entries = [] } }\n",
    )
    .expect("parses");
    let actor = actor_for(Role::Driver, &script).await;
    let reply = ask(&actor, assignment(1, "green/T1")).await;
    assert_eq!(
        reply,
        Err(AgentFailure::KindNotAllowed {
            role: Role::Driver,
            kind: consort_actors::ArtifactKind::TestList
        })
    );
}
