//! The system prompt of each role, kept in `prompts/<role>.md` and included at build time.

use consort_actors::Role;

/// The instructions about the answer's form, appended to every role's prompt.
pub const ANSWER_FORMAT: &str = "\
## How you work

Your assignment comes as JSON. For steps with tests or code, a first message gives `harness`
(how tests run: runner, command, collected test files, loaded code, pass rule, environment) and
the schema plan. The step's message has `step`, `answer_with` (the kind to produce), `writes`
(what you may write), `inputs` (the design parts and files this step needs; `not_included` names
the files left out; `changes` the change sets since the last review) and `feedback` (what went
wrong before). Act on every feedback item.

## Answer format

Answer with exactly one JSON object and nothing else (no prose, no markdown fence):
`{\"kind\": \"<the kind named in answer_with>\", \"body\": { … }}`. The body follows the JSON
schema of that kind. File paths are relative to the work tree. If your answer is rejected, the
next message says why; answer again with the whole corrected object.
";

/// The role's own prompt (its part and its hard rules), without the answer format.
pub fn role_prompt(role: Role) -> &'static str {
    match role {
        Role::ProductOwner => include_str!("../prompts/product-owner.md"),
        Role::SpecAuthor => include_str!("../prompts/spec-author.md"),
        Role::ArchitectReviewer => include_str!("../prompts/architect-reviewer.md"),
        Role::Dba => include_str!("../prompts/dba.md"),
        Role::TestStrategist => include_str!("../prompts/test-strategist.md"),
        Role::UxDesigner => include_str!("../prompts/ux-designer.md"),
        Role::Navigator => include_str!("../prompts/navigator.md"),
        Role::Driver => include_str!("../prompts/driver.md"),
    }
}

/// The full system prompt for a role: its part, its hard rules and the answer format.
pub fn system_prompt(role: Role) -> String {
    format!("{}\n{ANSWER_FORMAT}", role_prompt(role).trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_has_a_prompt_naming_it() {
        let titles = [
            (Role::ProductOwner, "Product Owner"),
            (Role::SpecAuthor, "Spec Author"),
            (Role::ArchitectReviewer, "Architect Reviewer"),
            (Role::Dba, "DBA"),
            (Role::TestStrategist, "Test Strategist"),
            (Role::UxDesigner, "UX Designer"),
            (Role::Navigator, "Navigator"),
            (Role::Driver, "Driver"),
        ];
        assert_eq!(titles.map(|(role, _)| role), Role::ALL, "every role, once");
        for (role, title) in titles {
            let p = system_prompt(role);
            assert!(p.contains(&format!("**{title}**")), "{role} prompt");
            assert!(p.contains("Hard rules"), "{role} prompt states its rules");
            assert!(p.contains("Answer format"));
        }
    }
}
