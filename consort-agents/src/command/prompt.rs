//! What the program is told: the prompt text a coding-agent CLI gets (the role's prompt, how to
//! answer in the scratch copy, the assignment) and the JSON a plain command reads on stdin.

use consort_actors::{ArtifactKind, Assignment};
use serde_json::Value;

use crate::openai::response_schema;
use crate::prompts::{role_prompt, system_prompt};

/// The prompt text for a coding-agent CLI: the role's prompt, how to answer from the scratch
/// copy, and the assignment as JSON (the files' contents are not repeated: they are in the
/// current directory, listed by path and size).
///
/// For a change-set step the CLI edits files and the difference is its answer; for any other
/// step it answers with one JSON object, whose schema the prompt carries.
pub fn cli_prompt(assignment: &Assignment) -> String {
    let kind = assignment.expected_kind();
    let mut text = String::new();
    text.push_str(role_prompt(assignment.role).trim_end());
    text.push_str("\n\n## How you work here\n\n");
    text.push_str(&format!(
        "Consort runs you as its {} for the step `{}` (attempt {}). The current directory is a \
         scratch copy holding the files this step needs; nothing outside it counts, and no \
         question you ask will be answered: work with what you have.\n\n",
        assignment.role, assignment.step, assignment.attempt
    ));
    if kind == ArtifactKind::ChangeSet {
        text.push_str(
            "Answer by editing files in the current directory: create, change or delete them. \
             When you finish, the difference between this directory and the files you were \
             given is taken as your change set, and your role's path rules are checked on it \
             (a change to a file your role may not write is refused). Do not commit, and write \
             nothing outside the current directory. End with a one-line summary of what you \
             changed.\n",
        );
    } else {
        text.push_str(&format!(
            "Do not change any file. Your final message must be exactly one JSON object and \
             nothing else (no prose, no markdown fence): `{{\"kind\": \"{kind}\", \"body\": \
             {{ … }}}}`, following this JSON schema:\n\n```json\n{}\n```\n",
            response_schema(kind, false)
        ));
    }
    text.push_str("\n## Assignment\n\n");
    text.push_str(
        "`step` is the step, `inputs` the artifacts produced so far and the files of the \
         step (in the current directory), `feedback` what went wrong in earlier tries, failing \
         test runs or reviews: act on every feedback item.\n\n```json\n",
    );
    text.push_str(&assignment_listing(assignment));
    text.push_str("\n```\n");
    text
}

/// The assignment as pretty JSON, inputs not yet produced left out and each file's content
/// replaced by a note of its size.
fn assignment_listing(assignment: &Assignment) -> String {
    let mut v = match serde_json::to_value(assignment) {
        Ok(v) => v,
        // An assignment is plain data; its serialisation cannot fail. Say so if it ever does.
        Err(e) => return format!("{{\"unserialisable\": \"{e}\"}}"),
    };
    if let Some(inputs) = v.get_mut("inputs").and_then(Value::as_object_mut) {
        inputs.retain(|_, input| !input.is_null());
    }
    if let Some(files) = v
        .get_mut("inputs")
        .and_then(|i| i.get_mut("files"))
        .and_then(Value::as_object_mut)
    {
        for content in files.values_mut() {
            let bytes = content.as_str().map_or(0, str::len);
            *content = Value::String(format!("{bytes} bytes, in the current directory"));
        }
    }
    serde_json::to_string_pretty(&v).unwrap_or_else(|e| format!("{{\"unserialisable\": \"{e}\"}}"))
}

/// The JSON a plain command reads on stdin: the assignment's fields, plus `role_prompt` (the
/// role's full system prompt, answer format included), `step_key` (`green/T1`), `answer_with` (the artifact kind) and
/// `prompt` (the text [`cli_prompt`] renders, for a wrapper that hands it to a CLI).
pub(crate) fn stdin_json(assignment: &Assignment, prompt: &str) -> serde_json::Result<Vec<u8>> {
    let mut v = serde_json::to_value(assignment)?;
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "role_prompt".into(),
            Value::String(system_prompt(assignment.role)),
        );
        o.insert(
            "step_key".into(),
            Value::String(assignment.step.to_string()),
        );
        o.insert(
            "answer_with".into(),
            Value::String(assignment.expected_kind().to_string()),
        );
        o.insert("prompt".into(), Value::String(prompt.to_string()));
    }
    serde_json::to_vec(&v)
}

#[cfg(test)]
mod tests {
    use super::*;
    fn review() -> Assignment {
        let mut a = consort_testkit::artifacts::assignment(3, "review/T1/0");
        a.inputs
            .files
            .insert("src/a.sql".into(), "select 1;\n".into());
        a.attempt = 1;
        a.feedback = vec!["name the query".into()];
        a
    }

    #[test]
    fn the_prompt_is_role_then_how_then_the_assignment() {
        let p = cli_prompt(&review());
        let role = p.find("**Navigator**").expect("role prompt");
        let how = p.find("## How you work here").expect("how");
        let asg = p.find("## Assignment").expect("assignment");
        assert!(role < how && how < asg, "{p}");
        assert!(p.contains("step `review/T1/0` (attempt 1)"), "{p}");
        assert!(
            p.contains("\"src/a.sql\": \"10 bytes, in the current directory\""),
            "{p}"
        );
        assert!(p.contains("{\"kind\": \"review-verdict\""), "{p}");
        assert!(!p[asg..].contains("null"), "empty inputs are left out: {p}");
        assert!(!p.contains("select 1;"), "{p}");
    }

    #[test]
    fn stdin_carries_the_assignment_and_the_role_prompt() {
        let a = review();
        let v: Value =
            serde_json::from_slice(&stdin_json(&a, "P").expect("encodes")).expect("JSON");
        assert_eq!(v["step_key"], "review/T1/0");
        assert_eq!(v["answer_with"], "review-verdict");
        assert_eq!(v["prompt"], "P");
        assert_eq!(v["inputs"]["files"]["src/a.sql"], "select 1;\n");
        assert!(
            v["role_prompt"]
                .as_str()
                .is_some_and(|r| r.contains("Answer format"))
        );
    }
}
