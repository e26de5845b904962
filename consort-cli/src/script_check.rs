//! What `consort doctor` says about the scripted agents: every configured script parsed and
//! explained — the steps it answers, in order; the design and build steps its roles have no
//! entry for; the entries that still hold the skeleton's placeholders; and parse errors with
//! the file and entry.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use consort_actors::{Artifact, Role, Step};
use consort_agents::{AgentConfig, Script, ScriptEntry, placeholders};

use consort::config::ProjectConfig;

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// A check that passed.
    Ok(String),
    /// A check that failed, with how to fix it; `consort doctor` then exits non-zero.
    Fail {
        /// What is wrong (file, entry, field).
        what: String,
        /// How to fix it.
        fix: String,
    },
    /// Something worth knowing that does not stop a run from starting.
    Note(String),
    /// A detail of the line before (an indented list line).
    Detail(String),
}

impl Finding {
    /// Whether this finding fails the doctor.
    pub fn is_failure(&self) -> bool {
        matches!(self, Finding::Fail { .. })
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Ok(t) => write!(f, "ok    {t}"),
            Finding::Fail { what, fix } => write!(f, "FAIL  {what}\n      fix: {fix}"),
            Finding::Note(t) => write!(f, "note  {t}"),
            Finding::Detail(t) => write!(f, "        {t}"),
        }
    }
}

/// The roles played by scripts, grouped by the files they read (usually one group). A path
/// with `{feature}` (a script per feature of a backlog) stands for one file per feature still
/// to run: its roles are a group for each.
fn script_groups(config: &ProjectConfig, dir: &Path) -> BTreeMap<Vec<PathBuf>, Vec<Role>> {
    let features = features_to_run(config, dir);
    let mut groups: BTreeMap<Vec<PathBuf>, Vec<Role>> = BTreeMap::new();
    for role in Role::ALL {
        if let AgentConfig::Script { path, paths } = config.agents.for_role(role) {
            let spelled: Vec<String> = path
                .iter()
                .chain(paths)
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            let per_feature = spelled.iter().any(|p| p.contains(FEATURE));
            let ids: &[String] = if per_feature { &features } else { &[] };
            for id in ids.iter().map(Some).chain((!per_feature).then_some(None)) {
                let files = spelled
                    .iter()
                    .map(|p| dir.join(id.map_or_else(|| p.clone(), |id| p.replace(FEATURE, id))))
                    .collect();
                groups.entry(files).or_default().push(role);
            }
        }
    }
    groups
}

/// What `{feature}` in a script path stands for.
const FEATURE: &str = "{feature}";

/// The ids of the backlog's features that are neither done nor stopped, in order (the
/// configuration's feature when the backlog cannot be read).
fn features_to_run(config: &ProjectConfig, dir: &Path) -> Vec<String> {
    use consort::backlog::FeatureState;
    let listed = consort::project::Project::open(dir).and_then(|project| {
        let mut ids = Vec::new();
        for f in project.backlog()? {
            if !matches!(
                project.state_of(&f)?,
                FeatureState::Done | FeatureState::Stopped
            ) {
                ids.push(f.id);
            }
        }
        Ok(ids)
    });
    listed.unwrap_or_else(|_| vec![config.feature.id.clone()])
}

fn role_list(roles: &[Role]) -> String {
    roles
        .iter()
        .map(Role::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The report on every script the configuration names, for the project in `dir`.
pub fn script_report(dir: &Path, config: &ProjectConfig) -> Vec<Finding> {
    let groups = script_groups(config, dir);
    let mut out = Vec::new();
    let mut parsed: BTreeMap<PathBuf, Option<Script>> = BTreeMap::new();
    for (files, roles) in &groups {
        if files.is_empty() {
            out.push(Finding::Fail {
                what: format!("{}: a script backend names no file", role_list(roles)),
                fix: "set `path` (or `paths`) under [agents]".into(),
            });
        }
        for file in files {
            if parsed.contains_key(file) {
                continue;
            }
            let script = explain_file(file, &mut out);
            parsed.insert(file.clone(), script);
        }
    }
    let all: Vec<Script> = parsed.values().flatten().cloned().collect();
    let tests = test_ids(&all);
    for (files, roles) in &groups {
        let scripts: Option<Vec<Script>> = files
            .iter()
            .map(|f| parsed.get(f).cloned().flatten())
            .collect();
        let Some(scripts) = scripts.filter(|s| !s.is_empty()) else {
            continue;
        };
        match Script::combine(scripts) {
            Ok(script) => missing_steps(&script, roles, tests.as_deref(), &mut out),
            Err(e) => out.push(Finding::Fail {
                what: format!(
                    "the scripts of {}: {}",
                    role_list(roles),
                    consort_actors::error_chain(&e)
                ),
                fix: "keep one answer per role, step and attempt".into(),
            }),
        }
    }
    out
}

/// Parses one file and explains it; `None` when it cannot be used.
fn explain_file(file: &Path, out: &mut Vec<Finding>) -> Option<Script> {
    let shown = file.display();
    if !file.exists() {
        out.push(Finding::Fail {
            what: format!("script {shown} does not exist"),
            fix:
                "write the script (`consort init` writes a skeleton) or fix the path under [agents]"
                    .into(),
        });
        return None;
    }
    let script = match Script::from_path(file) {
        Ok(s) => s,
        Err(e) => {
            out.push(Finding::Fail {
                what: consort_actors::error_chain(&e),
                fix: "fix the entry named above".into(),
            });
            return None;
        }
    };
    let entries = script.entries();
    out.push(Finding::Ok(format!(
        "script {shown} parses: {} entr{}",
        entries.len(),
        if entries.len() == 1 { "y" } else { "ies" }
    )));
    if !entries.is_empty() {
        let answers: Vec<String> = entries.iter().map(answer_text).collect();
        out.push(Finding::Detail(format!(
            "answers, in order: {}",
            answers.join(", ")
        )));
    }
    for entry in entries {
        placeholder_finding(entry, out);
    }
    Some(script)
}

/// `spec/r0`, `green/T2 (attempt 1)`.
fn answer_text(entry: &ScriptEntry) -> String {
    match entry.attempt {
        Some(n) => format!("{} (attempt {n})", entry.step),
        None => entry.step.to_string(),
    }
}

fn placeholder_finding(entry: &ScriptEntry, out: &mut Vec<Finding>) {
    let holes = match placeholders(&entry.artifact) {
        Ok(h) => h,
        Err(e) => {
            out.push(Finding::Fail {
                what: format!(
                    "entry {} ({}) cannot be read: {e}",
                    entry.entry, entry.origin
                ),
                fix: "rewrite the entry".into(),
            });
            return;
        }
    };
    if holes.is_empty() {
        return;
    }
    let fields = consort_agents::field_list(&holes);
    out.push(Finding::Fail {
        what: format!(
            "entry {} for {} ({}) still holds the skeleton's placeholders: {fields}",
            entry.entry, entry.step, entry.origin
        ),
        fix: "replace every \"FILL IN: …\" value (docs/ARTIFACTS.md says what each field means; delete optional fields you do not need)".into(),
    });
}

/// The test-list entry ids the scripts' `test-list` answer names, when it has a filled-in one.
fn test_ids(scripts: &[Script]) -> Option<Vec<String>> {
    let step = Step::TestList;
    scripts.iter().find_map(|s| {
        let entry = s.lookup(step.role(), &step, 0).ok()?;
        let Artifact::TestList(list) = &entry.artifact else {
            return None;
        };
        if placeholders(&entry.artifact).map_or(true, |h| !h.is_empty()) {
            return None;
        }
        Some(list.entries.iter().map(|e| e.id.clone()).collect())
    })
}

/// The design steps (and, when the test list is known, the build steps) of `roles` that the
/// script does not answer on a first attempt.
fn missing_steps(
    script: &Script,
    roles: &[Role],
    tests: Option<&[String]>,
    out: &mut Vec<Finding>,
) {
    let mut steps = Step::design_lane().to_vec();
    if let Some(tests) = tests {
        steps.extend(tests.iter().flat_map(|t| Step::build_cycle(t)));
    }
    steps.retain(|s| roles.contains(&s.role()));
    let missing: Vec<String> = steps
        .iter()
        .filter(|s| script.lookup(s.role(), s, 0).is_err())
        .map(|s| match s {
            Step::Ux => "ux (asked only when a story is user-facing)".to_string(),
            other => other.to_string(),
        })
        .collect();
    let whose = role_list(roles);
    // A group of build roles only, with no test list to name their steps, has nothing to
    // list here; the note below says so.
    if !steps.is_empty() && missing.is_empty() {
        out.push(Finding::Ok(format!(
            "every design step{} of {whose} has an entry",
            if tests.is_some() {
                " and every build step"
            } else {
                ""
            }
        )));
    } else if !missing.is_empty() {
        out.push(Finding::Note(format!(
            "steps of {whose} with no entry (a run halts there): {}",
            missing.join(", ")
        )));
    }
    if tests.is_none()
        && roles
            .iter()
            .any(|r| matches!(r, Role::Navigator | Role::Driver))
    {
        out.push(Finding::Note(
            "the build steps are checked once the script has a filled-in test-list answer".into(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::config_template;
    use consort::config::CONFIG_FILE;

    /// A script answering the stories step, with no story.
    const STORIES_SCRIPT: &str = "[[entry]]\nstep = \"stories\"\nartifact = { kind = \"stories\", body = { feature_id = \"F1\", stories = [] } }\n";

    /// `{feature}` in a script path (a script per feature of a backlog, as the guide gives
    /// it) is each feature still to run, not a file of that name.
    #[test]
    fn a_script_path_with_feature_is_read_for_each_feature_to_run() {
        let text = config_template("F1", ".consort/agents/{feature}.toml");
        let tmp = consort_testkit::disk::tree_of(&[
            (CONFIG_FILE, &text),
            (".consort/agents/F1.toml", STORIES_SCRIPT),
        ]);
        let dir = tmp.path();
        let report = report_of(dir, &text);
        let file = dir.join(".consort/agents/F1.toml").display().to_string();
        assert!(
            report.contains(&format!("ok    script {file} parses: 1 entry")),
            "{report:#?}"
        );
        assert!(
            !report.iter().any(|l| l.contains("{feature}")),
            "{report:#?}"
        );
    }

    #[test]
    fn per_role_files_are_explained_each_and_missing_steps_are_per_role_group() {
        let driver = r#"{"role": "driver", "entry": [
            {"step": "green/*", "artifact": {"kind": "change-set", "body": {"changes": []}}},
            {"step": "refactor/T1/0", "attempt": 1, "artifact": {"kind": "change-set", "body": {"changes": [], "summary": "FILL IN: summary"}}}
        ]}"#;
        let tmp = consort_testkit::disk::tree_of(&[
            ("design.toml", STORIES_SCRIPT),
            ("driver.json", driver),
        ]);
        let dir = tmp.path();
        let text = config_template("F1", "design.toml").replace(
            "# [agents.roles.driver]         # an OpenAI-compatible model for one role\n# backend = \"openai\"",
            "[agents.roles.driver]\nbackend = \"script\"\npath = \"driver.json\"\n# backend = \"openai\"",
        );
        let report = report_of(dir, &text);
        let design_file = dir.join("design.toml").display().to_string();
        let driver_file = dir.join("driver.json").display().to_string();
        assert!(
            report.contains(&format!("ok    script {design_file} parses: 1 entry")),
            "{report:#?}"
        );
        assert!(report.contains(&"        answers, in order: stories".to_string()));
        assert!(
            report.contains(
                &"        answers, in order: green/*, refactor/T1/0 (attempt 1)".to_string()
            ),
            "{report:#?}"
        );
        let fail = format!(
            "FAIL  entry 2 for refactor/T1/0 ({driver_file}#2) still holds the skeleton's placeholders: body.summary"
        );
        assert!(report.iter().any(|l| l.starts_with(&fail)), "{report:#?}");
        // The driver's group has no design steps to miss; the others miss all but stories.
        assert!(
            report.iter().any(|l| l
                == "note  steps of product-owner, spec-author, architect-reviewer, dba, test-strategist, ux-designer, navigator with no entry (a run halts there): spec/r0, architecture/r0, schema, test-list, ux (asked only when a story is user-facing)"
                && !l.contains("driver")),
            "{report:#?}"
        );
        assert!(
            !report.iter().any(|l| l.contains("step of driver")),
            "{report:#?}"
        );
        assert!(
            report.contains(&"note  the build steps are checked once the script has a filled-in test-list answer".to_string()),
            "{report:#?}"
        );
    }

    /// The script report's lines for the project in `dir` configured by `text`.
    fn report_of(dir: &std::path::Path, text: &str) -> Vec<String> {
        let config = ProjectConfig::parse(text, &dir.join(CONFIG_FILE)).expect("loads");
        script_report(dir, &config)
            .iter()
            .map(ToString::to_string)
            .collect()
    }
}
