//! The script skeleton `consort init` writes: it parses, answers every design step, shows
//! every field of each artifact, and every placeholder is found.

use consort_actors::Role;
use consort_actors::Step;
use consort_agents::{Script, openai::body_schema, placeholders, script_skeleton};

#[test]
fn the_skeleton_parses_and_answers_every_design_step_with_placeholders() {
    let text = script_skeleton();
    let script = Script::from_toml_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let steps = Step::design_lane();
    assert_eq!(script.entries().len(), steps.len());
    for step in &steps {
        let entry = script.lookup(step.role(), step, 0).expect("answered");
        assert_eq!(entry.artifact.kind(), step.output_kind());
        let holes = placeholders(&entry.artifact).expect("json");
        assert!(!holes.is_empty(), "{step} has placeholders");
    }
    assert!(text.contains("docs/ARTIFACTS.md"));
}

/// Every property named in a schema (its own, its variants' and its definitions').
fn property_names(schema: &serde_json::Value, out: &mut Vec<String>) {
    if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
        out.extend(props.keys().cloned());
    }
    for key in ["oneOf", "anyOf"] {
        for v in schema
            .get(key)
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
        {
            property_names(v, out);
        }
    }
    if let Some(defs) = schema.get("$defs").and_then(|d| d.as_object()) {
        for def in defs.values() {
            property_names(def, out);
        }
    }
}

#[test]
fn the_skeleton_shows_every_field_of_every_design_artifact() {
    let text = script_skeleton();
    let sections: Vec<&str> = text.split("\n[[entry]]\n").skip(1).collect();
    let steps = Step::design_lane();
    assert_eq!(sections.len(), steps.len());
    for (step, section) in steps.iter().zip(sections) {
        assert!(
            section.starts_with(&format!("step = \"{step}\"\n")),
            "{section}"
        );
        let mut names = Vec::new();
        property_names(&body_schema(step.output_kind()), &mut names);
        for name in names {
            let shown = section.contains(&format!("\n{name} = "))
                || section.contains(&format!(".{name}]"))
                || section.contains(&format!(" {name}"));
            assert!(shown, "{step}: field {name} is not in\n{section}");
        }
    }
    assert!(
        text.contains("# decision: approve (below), or revise with reasons"),
        "{text}"
    );
}

#[tokio::test]
async fn a_scripted_agent_will_not_answer_with_a_placeholder() {
    let script = Script::from_toml_str(&script_skeleton()).expect("parses");
    let agent = script.agent(Role::ProductOwner);
    let a = consort_testkit::artifacts::assignment(1, "stories");
    match consort_agents::Agent::act(&agent, &a).await {
        Err(consort_agents::AgentFailure::ScriptMismatch { found, .. }) => {
            assert!(found.contains("entry 1 (<inline>:"), "{found}");
            assert!(
                found.contains("placeholders in body.feature_id,"),
                "{found}"
            );
            assert!(found.contains("consort doctor"), "{found}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_filled_in_script_has_no_placeholders_and_a_bad_field_is_named() {
    let filled =
        Script::from_toml_str(include_str!("../fixtures/design_lane.toml")).expect("parses");
    for e in filled.entries() {
        assert_eq!(
            placeholders(&e.artifact).expect("json"),
            Vec::<String>::new()
        );
    }
    let bad = "[[entry]]\nstep = \"schema\"\nartifact = { kind = \"schema-plan\", body = { migrations = [ { version = \"1\", story_id = \"S1\" } ] } }\n";
    let err = Script::from_toml_str(bad)
        .expect_err("missing sql")
        .to_string();
    assert!(
        err.contains("entry 1 (line 1): (step schema) body.migrations[0]: missing field `sql`"),
        "{err}"
    );
}
