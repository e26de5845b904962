//! Scripted answers for the test projects, as `.consort/agents/*.toml` TOML: the design lane
//! of one story (one criterion `S1-AC1`, one migration, one test `T1`), change-set entries,
//! and a refactor and review that change nothing.

/// A one-story design: what each design step answers.
pub(crate) struct Design<'a> {
    /// The feature id the stories and spec are for.
    pub feature: &'a str,
    /// The story's title, also its want, the spec's summary and the test's description.
    pub story: &'a str,
    /// The migration's version and SQL (no double quotes).
    pub migration: (&'a str, &'a str),
    /// Where `T1` lives.
    pub test_path: &'a str,
    /// `T1`'s runner name, when the runner reports tests by name.
    pub test_name: Option<&'a str>,
}

impl Design<'_> {
    /// The entries for stories, spec, architecture, schema and test list.
    pub(crate) fn toml(&self) -> String {
        let Design {
            feature,
            story,
            migration: (version, sql),
            test_path,
            test_name,
        } = self;
        let test_name = test_name.map_or_else(String::new, |n| format!(", test_name = \"{n}\""));
        format!(
            r#"[[entry]]
step = "stories"
[entry.artifact]
kind = "stories"
[entry.artifact.body]
feature_id = "{feature}"
[[entry.artifact.body.stories]]
id = "S1"
title = "{story}"
as_a = "stock keeper"
i_want = "{story}"
so_that = "I know what is on the shelf"
user_facing = false
[[entry.artifact.body.stories.acceptance_criteria]]
id = "S1-AC1"
given = "stock is recorded"
when = "the keeper asks"
then = "the answer follows the rule"

[[entry]]
step = "spec/r0"
[entry.artifact]
kind = "spec"
[entry.artifact.body]
feature_id = "{feature}"
summary = "{story}"
[[entry.artifact.body.requirements]]
id = "R1"
ac_id = "S1-AC1"
statement = "{story}"

[[entry]]
step = "architecture/r0"
artifact = {{ kind = "architecture-verdict", body = {{ decision = "approve", layers = ["functions over the tables"] }} }}

[[entry]]
step = "schema"
[entry.artifact]
kind = "schema-plan"
body.migrations = [{{ version = "{version}", story_id = "S1", description = "{story}", sql = "{sql}" }}]

[[entry]]
step = "test-list"
[entry.artifact]
kind = "test-list"
body.entries = [{{ id = "T1", ac_id = "S1-AC1", description = "{story}", path = "{test_path}"{test_name} }}]
"#
        )
    }
}

/// A refactor that changes nothing and a review that approves, for every test.
pub(crate) const REFACTOR_AND_REVIEW: &str = r#"[[entry]]
step = "refactor/*/*"
[entry.artifact]
kind = "change-set"
[entry.artifact.body]
summary = "nothing to restructure"
changes = []

[[entry]]
step = "review/*/*"
artifact = { kind = "review-verdict", body = { decision = "approve" } }

"#;

/// A `[[entry.artifact.body.changes]]` writing `content` to `path`.
pub(crate) fn write_change(path: &str, content: &str) -> String {
    format!(
        "[[entry.artifact.body.changes]]\nop = \"write\"\npath = \"{path}\"\ncontent = '''\n{content}'''\n"
    )
}

/// A change-set entry for `step` with `changes` (from [`write_change`]).
pub(crate) fn change_entry(step: &str, summary: &str, changes: &str) -> String {
    format!(
        "[[entry]]\nstep = \"{step}\"\n[entry.artifact]\nkind = \"change-set\"\n[entry.artifact.body]\nsummary = \"{summary}\"\n{changes}\n"
    )
}
