//! The script skeleton `consort init` writes: it parses, answers every design step, shows
//! every field of each artifact, and every placeholder is found.

use consort_actors::{ArtifactKind, Role};
use consort_agents::{Script, design_steps, openai::body_schema, placeholders, script_skeleton};

#[test]
fn the_skeleton_parses_and_answers_every_design_step_with_placeholders() {
    let text = script_skeleton();
    std::fs::write(std::env::temp_dir().join("consort-skeleton.toml"), &text).expect("write");
    let script = Script::from_toml_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let steps = design_steps();
    assert_eq!(script.entries().len(), steps.len());
    for step in &steps {
        let entry = script.lookup(step.role(), step, 0).expect("answered");
        assert_eq!(entry.artifact.kind(), step.output_kind());
        let holes = placeholders(&entry.artifact).expect("json");
        assert!(!holes.is_empty(), "{step} has placeholders");
    }
    assert!(text.contains("docs/ARTIFACTS.md"));
    let _ = (Role::Navigator, ArtifactKind::ALL, body_schema);
}
