//! Role-scoped context packs: what each step's assignment carries.
//!
//! [`pack`] is the one table that says it, step by step. A build step gets what its role needs
//! for the test-list entry at hand — the entry's acceptance criterion and the requirement that
//! traces to it, not every artifact of the design — so an assignment does not grow with the
//! length of the run. Files the pack leaves out are still named, with their size
//! ([`crate::NotIncluded`]): nothing is dropped silently.
//!
//! Backends put the stable part of a prompt first (the role's prompt, the runner facts) and
//! the step's part last, so a server can cache what repeats.

use std::sync::Arc;

use globset::{Glob, GlobSet, GlobSetBuilder};

use crate::core::artifact::{Spec, Stories, TestEntry, UxDesign};
use crate::core::machine::State;
use crate::core::protocol::AssignmentInputs;
use crate::core::step::Step;

/// How much of an artifact a step receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Nothing of it.
    Omit,
    /// The part that traces to the step's test-list entry: the story with only the entry's
    /// acceptance criterion, the requirements of that criterion (with the spec's summary), the
    /// screens of that story.
    Traced,
    /// All of it.
    Whole,
}

/// Which work-tree files a step receives in full; every other file is listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Files {
    /// None, and no listing (design steps before any code exists).
    Nothing,
    /// None in full: every file listed by path and size.
    Listed,
    /// The code files the runner loads (see [`crate::RunnerFacts::loads`]) and the entry's
    /// test file.
    CodeAndTest,
    /// The entry's test file only.
    Test,
    /// The project's existing migrations (the `.sql` files already in the migrations
    /// directory), for the DBA; nothing else is listed.
    Migrations,
}

/// What one step's assignment carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pack {
    /// The feature request.
    pub feature: Part,
    /// The stories.
    pub stories: Part,
    /// The spec.
    pub spec: Part,
    /// The architecture verdict.
    pub architecture: Part,
    /// The schema plan.
    pub schema: Part,
    /// The test list.
    pub test_list: Part,
    /// The UX design.
    pub ux: Part,
    /// The work-tree files.
    pub files: Files,
    /// The change sets since the entry's last review ([`AssignmentInputs::changes`]).
    pub changes: bool,
    /// How the tests run and what the role may write ([`crate::Assignment::runner`]).
    pub runner: bool,
}

/// The context pack of `step`: the table ARCHITECTURE.md reproduces.
pub fn pack(step: &Step) -> Pack {
    use Files::{CodeAndTest, Listed, Migrations, Nothing, Test};
    use Part::{Omit as O, Traced as T, Whole as W};
    #[rustfmt::skip]
    let row = |feature, stories, spec, architecture, schema, test_list, ux, files, changes, runner| Pack {
        feature, stories, spec, architecture, schema, test_list, ux, files, changes, runner,
    };
    #[rustfmt::skip]
    let pack = match step {
        //                              feature stories spec arch schema tests ux  files        changes runner
        Step::Stories                => row(W,  O,      O,   O,   O,     O,    O,  Nothing,     false,  false),
        Step::Spec { .. }            => row(W,  W,      O,   O,   O,     O,    O,  Nothing,     false,  false),
        Step::Architecture { .. }    => row(W,  W,      W,   O,   O,     O,    O,  Nothing,     false,  false),
        Step::Schema                 => row(O,  W,      W,   W,   O,     O,    O,  Migrations,  false,  false),
        Step::TestList               => row(O,  W,      W,   O,   O,     O,    O,  Listed,      false,  true),
        Step::Ux                     => row(O,  W,      W,   O,   O,     O,    O,  Nothing,     false,  false),
        Step::Red { .. }             => row(O,  T,      T,   O,   W,     O,    T,  Listed,      false,  true),
        Step::Green { .. }           => row(O,  T,      T,   O,   W,     O,    T,  CodeAndTest, false,  true),
        Step::Repair { .. }          => row(O,  T,      T,   O,   W,     O,    T,  CodeAndTest, true,   true),
        Step::Refactor { .. }        => row(O,  T,      O,   O,   O,     O,    O,  CodeAndTest, false,  true),
        Step::Review { .. }          => row(O,  T,      T,   O,   O,     O,    O,  Test,        true,   true),
    };
    pack
}

/// The artifacts `step` receives from `state`, by its [`pack`] (files are the conductor's to
/// read: see [`FileScope`]).
pub fn artifacts(state: &State, step: &Step) -> AssignmentInputs {
    let p = pack(step);
    let entry = if step.is_build() {
        state.current_test()
    } else {
        None
    };
    let ac = entry.map(|e| e.ac_id.as_str());
    AssignmentInputs {
        feature: whole(p.feature, &state.feature),
        stories: scoped(p.stories, &state.stories, |s| traced_stories(s, ac)),
        spec: scoped(p.spec, &state.spec, |s| traced_spec(s, ac)),
        architecture: whole(p.architecture, &state.architecture),
        schema: whole(p.schema, &state.schema),
        test_list: whole(p.test_list, &state.test_list),
        ux: scoped(p.ux, &state.ux, |u| traced_ux(u, state, ac)),
        test: entry.cloned(),
        changes: if p.changes {
            state.build.since_review.clone()
        } else {
            Vec::new()
        },
        earlier_migrations: match step {
            Step::Schema => state.inherited.migrations.clone(),
            _ => Vec::new(),
        },
        migration_numbering: match step {
            Step::Schema => state.inherited.numbering.clone(),
            _ => None,
        },
        schema_catalog: match step {
            Step::Schema => state.inherited.catalog.clone(),
            _ => None,
        },
        ..AssignmentInputs::default()
    }
}

fn whole<T>(part: Part, artifact: &Option<Arc<T>>) -> Option<Arc<T>> {
    match part {
        Part::Omit => None,
        Part::Traced | Part::Whole => artifact.clone(),
    }
}

fn scoped<T>(
    part: Part,
    artifact: &Option<Arc<T>>,
    trace: impl FnOnce(&T) -> Option<T>,
) -> Option<Arc<T>> {
    match part {
        Part::Omit => None,
        Part::Whole => artifact.clone(),
        Part::Traced => artifact.as_deref().and_then(trace).map(Arc::new),
    }
}

/// The story of `ac`, with only that acceptance criterion.
fn traced_stories(stories: &Stories, ac: Option<&str>) -> Option<Stories> {
    let ac = ac?;
    let mut story = stories.story_of_ac(ac)?.clone();
    story.acceptance_criteria.retain(|c| c.id == ac);
    Some(Stories {
        feature_id: stories.feature_id.clone(),
        stories: vec![story],
    })
}

/// The spec's summary and the requirements traced to `ac`.
fn traced_spec(spec: &Spec, ac: Option<&str>) -> Option<Spec> {
    let ac = ac?;
    Some(Spec {
        feature_id: spec.feature_id.clone(),
        summary: spec.summary.clone(),
        requirements: spec
            .requirements
            .iter()
            .filter(|r| r.ac_id == ac)
            .cloned()
            .collect(),
        out_of_scope: Vec::new(),
        open_questions: Vec::new(),
    })
}

/// The screens of the story that owns `ac` (none: no UX for this entry).
fn traced_ux(ux: &UxDesign, state: &State, ac: Option<&str>) -> Option<UxDesign> {
    let story = state.stories.as_deref()?.story_of_ac(ac?)?;
    let screens: Vec<_> = ux
        .screens
        .iter()
        .filter(|s| s.story_id == story.id)
        .cloned()
        .collect();
    (!screens.is_empty()).then(|| UxDesign {
        screens,
        notes: ux.notes.clone(),
    })
}

/// The most files an assignment lists one by one; the rest are counted in
/// [`AssignmentInputs::not_listed`].
pub const MAX_LISTED: usize = 200;

/// Caps `inputs.not_included` at [`MAX_LISTED`] entries, counting the rest. Files left out for
/// their size or form are listed before those the pack leaves out, so they are the last to go.
pub fn cap_listing(inputs: &mut AssignmentInputs) {
    if inputs.not_included.len() <= MAX_LISTED {
        return;
    }
    inputs
        .not_included
        .sort_by_key(|n| n.why == crate::core::protocol::Omission::NotInPack);
    let rest = inputs.not_included.split_off(MAX_LISTED);
    inputs.not_listed = Some(crate::core::protocol::NotListed {
        files: rest.len() as u64,
        bytes: rest.iter().map(|n| n.bytes).sum(),
    });
}

/// Which work-tree files a step gets in full, by its [`Files`] rule.
#[derive(Debug, Clone)]
pub struct FileScope {
    files: Files,
    code: Option<GlobSet>,
    test: Option<String>,
}

impl FileScope {
    /// The scope of `step` at `entry`, where `loads` are the globs of the code the runner
    /// loads (empty: every file that is not a test is code), or for [`Files::Migrations`] the
    /// globs of the existing migrations (empty: none). A glob that does not compile matches
    /// nothing (the project's configuration checked them when it was read).
    pub fn new(step: &Step, entry: Option<&TestEntry>, loads: &[String]) -> FileScope {
        let code = (!loads.is_empty()).then(|| {
            let mut b = GlobSetBuilder::new();
            for g in loads.iter().filter_map(|g| Glob::new(g).ok()) {
                b.add(g);
            }
            b.build().unwrap_or_else(|_| GlobSet::empty())
        });
        FileScope {
            files: pack(step).files,
            code,
            test: entry.map(|e| e.path.clone()),
        }
    }

    /// Whether the step lists the tree's files at all.
    pub fn lists(&self) -> bool {
        self.files != Files::Nothing
    }

    /// Whether the step gets `path` in full; `is_test` says whether it is a test path.
    pub fn includes(&self, path: &str, is_test: bool) -> bool {
        let is_entry_test = self.test.as_deref() == Some(path);
        match self.files {
            Files::Nothing | Files::Listed => false,
            Files::Test => is_entry_test,
            Files::CodeAndTest => {
                is_entry_test || (!is_test && self.code.as_ref().is_none_or(|c| c.is_match(path)))
            }
            Files::Migrations => self.code.as_ref().is_some_and(|c| c.is_match(path)),
        }
    }

    /// Whether the step lists `path` (when it lists at all): a migrations step lists only what
    /// it includes; every other step every file but the harness.
    pub fn listed(&self, path: &str, is_harness: bool) -> bool {
        match self.files {
            Files::Migrations => self.includes(path, false),
            _ => !is_harness,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_steps_get_traced_parts_and_design_steps_what_they_build_on() {
        let green = pack(&Step::Green { test: "T1".into() });
        assert_eq!(
            (green.stories, green.spec, green.feature, green.test_list),
            (Part::Traced, Part::Traced, Part::Omit, Part::Omit)
        );
        assert!(green.runner && !green.changes);
        let review = pack(&Step::Review {
            test: "T1".into(),
            round: 0,
        });
        assert!(review.changes && review.files == Files::Test);
        assert_eq!(pack(&Step::Stories).feature, Part::Whole);
        assert!(!pack(&Step::Ux).runner && pack(&Step::TestList).runner);
    }

    #[test]
    fn a_large_tree_is_listed_up_to_the_cap_and_counted_beyond_it() {
        use crate::core::protocol::{NotIncluded, Omission};
        let file = |i: usize, why| NotIncluded {
            path: format!("f{i}"),
            bytes: 10,
            why,
        };
        let mut inputs = AssignmentInputs {
            not_included: (0..MAX_LISTED + 50)
                .map(|i| file(i, Omission::NotInPack))
                .chain([file(9999, Omission::OverLimit)])
                .collect(),
            ..AssignmentInputs::default()
        };
        cap_listing(&mut inputs);
        assert_eq!(inputs.not_included.len(), MAX_LISTED);
        assert_eq!(
            inputs.not_included[0].why,
            Omission::OverLimit,
            "kept first"
        );
        assert_eq!(
            inputs.not_listed,
            Some(crate::core::protocol::NotListed {
                files: 51,
                bytes: 510
            })
        );
        let mut small = AssignmentInputs {
            not_included: vec![file(1, Omission::NotInPack)],
            ..AssignmentInputs::default()
        };
        cap_listing(&mut small);
        assert!(small.not_listed.is_none() && small.not_included.len() == 1);
    }

    #[test]
    fn the_code_scope_is_what_the_runner_loads_plus_the_entry_test() {
        let entry = crate::core::artifact::TestEntry {
            id: "T1".into(),
            ac_id: "S1-AC1".into(),
            description: "d".into(),
            path: "tests/t1.sql".into(),
            test_name: None,
        };
        let green = FileScope::new(
            &Step::Green { test: "T1".into() },
            Some(&entry),
            &["src/**/*.sql".into()],
        );
        assert!(green.includes("src/a.sql", false));
        assert!(!green.includes("README.md", false));
        assert!(green.includes("tests/t1.sql", true));
        assert!(!green.includes("tests/t0.sql", true));
        let any_code = FileScope::new(&Step::Green { test: "T1".into() }, Some(&entry), &[]);
        assert!(any_code.includes("README.md", false));
        let red = FileScope::new(&Step::Red { test: "T1".into() }, Some(&entry), &[]);
        assert!(red.lists() && !red.includes("src/a.sql", false));
        assert!(!FileScope::new(&Step::Stories, None, &[]).lists());
    }
}
