//! Scripted replay: deterministic agent outputs read from a JSON or TOML file.
//!
//! The format is documented in the crate docs and in `SCRIPTS.md`. Lookup is **stateless**: an
//! answer is chosen by `(role, step key, attempt)` alone, so a resumed run that asks only for
//! the pending step gets the same answer it would have got in one go.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use consort_actors::{AgentFailure, Artifact, ArtifactKind, Assignment, Role, Step, Usage};
use serde::Deserialize;
use serde_json::Value;

use crate::agent::{ActFuture, Agent, AgentOutput};

/// A script file that cannot be used, with where the problem is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// The file could not be read.
    #[error("cannot read script {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The extension is neither `.json` nor `.toml`.
    #[error("script {path}: unknown format (the file name must end in .json or .toml)")]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },
    /// The file is not valid JSON or TOML, or its top level has the wrong shape.
    #[error("script {source_name}{}: {detail}", at_line(*.line))]
    Syntax {
        /// The file (or `<inline>`).
        source_name: String,
        /// The 1-based line, when known.
        line: Option<usize>,
        /// What is wrong.
        detail: String,
    },
    /// One entry is wrong: bad step key, role that does not own the step, bad artifact,
    /// a duplicate.
    #[error("script {source_name}, entry {entry}{}: {detail}", at_line(*.line))]
    Entry {
        /// The file (or `<inline>`).
        source_name: String,
        /// The 1-based entry number, in file order.
        entry: usize,
        /// The 1-based line where the entry starts, when known (TOML).
        line: Option<usize>,
        /// What is wrong.
        detail: String,
    },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" (line {l})")).unwrap_or_default()
}

/// A step key that may use `*` for a whole segment: `review/*/*`, `refactor/*/0`, `red/T1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPattern {
    text: String,
    segments: Vec<Option<String>>,
    role: Role,
}

impl StepPattern {
    /// Parses a step key or a pattern.
    pub fn parse(text: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.split('/').collect();
        let Some(first) = parts.first().copied() else {
            return Err("empty step".into());
        };
        if first == "*" {
            return Err(format!(
                "step `{text}`: the first segment (the step kind) cannot be a wildcard"
            ));
        }
        // Validate by substituting a well-formed value for every wildcard and parsing the
        // result as a real step key.
        let filled: Vec<String> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| match (*p, first, i) {
                ("*", "spec" | "architecture", 1) => "r0".to_string(),
                ("*", _, 1) => "T0".to_string(),
                ("*", _, _) => "0".to_string(),
                (p, _, _) => p.to_string(),
            })
            .collect();
        let step: Step = filled.join("/").parse().map_err(|e| {
            format!("{e}; a pattern may replace whole segments after the first with *")
        })?;
        Ok(StepPattern {
            text: text.to_string(),
            segments: parts
                .iter()
                .map(|p| (*p != "*").then(|| p.to_string()))
                .collect(),
            role: step.role(),
        })
    }

    /// Whether the pattern has no wildcard.
    pub fn is_exact(&self) -> bool {
        self.segments.iter().all(Option::is_some)
    }

    /// The number of wildcard segments (fewer is more specific).
    pub fn wildcards(&self) -> usize {
        self.segments.iter().filter(|s| s.is_none()).count()
    }

    /// The role whose steps this pattern names.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether the pattern matches a step key.
    pub fn matches(&self, key: &str) -> bool {
        let parts: Vec<&str> = key.split('/').collect();
        parts.len() == self.segments.len()
            && parts
                .iter()
                .zip(&self.segments)
                .all(|(p, s)| s.as_deref().is_none_or(|s| s == *p))
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for StepPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// One scripted answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptEntry {
    /// The role that answers with it.
    pub role: Role,
    /// The step key or pattern it answers.
    pub step: StepPattern,
    /// The attempt it answers, when given.
    pub attempt: Option<u32>,
    /// The answer.
    pub artifact: Artifact,
    /// Its 1-based position in its file.
    pub entry: usize,
    /// Where it came from (`file:line` when the line is known).
    pub origin: String,
}

/// A parsed script: the scripted answers of one ensemble (or of some of its roles).
///
/// Cheap to clone; every role's [`ScriptedAgent`] can share one.
#[derive(Debug, Clone, Default)]
pub struct Script {
    entries: Arc<Vec<ScriptEntry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    #[serde(default)]
    role: Option<Role>,
    step: String,
    #[serde(default)]
    attempt: Option<u32>,
    artifact: Artifact,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTomlScript {
    #[serde(default)]
    role: Option<Role>,
    #[serde(default)]
    entry: Vec<toml::Spanned<toml::Value>>,
}

impl Script {
    /// Reads a script file; the format is chosen by the extension (`.json` or `.toml`).
    pub fn from_path(path: impl AsRef<Path>) -> Result<Script, ScriptError> {
        let path = path.as_ref();
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let name = path.display().to_string();
        match ext.as_deref() {
            Some("json") => Script::parse_json(&text, &name),
            Some("toml") => Script::parse_toml(&text, &name),
            _ => Err(ScriptError::UnknownFormat {
                path: path.to_path_buf(),
            }),
        }
    }

    /// Reads several script files (for example one per role) into one script.
    pub fn from_paths<P: AsRef<Path>>(
        paths: impl IntoIterator<Item = P>,
    ) -> Result<Script, ScriptError> {
        let scripts = paths
            .into_iter()
            .map(Script::from_path)
            .collect::<Result<Vec<_>, _>>()?;
        Script::combine(scripts)
    }

    /// Parses a TOML script held in memory.
    pub fn from_toml_str(text: &str) -> Result<Script, ScriptError> {
        Script::parse_toml(text, "<inline>")
    }

    /// Parses a JSON script held in memory.
    pub fn from_json_str(text: &str) -> Result<Script, ScriptError> {
        Script::parse_json(text, "<inline>")
    }

    /// Joins scripts into one; an answer given twice for the same role, step and attempt is
    /// an error.
    pub fn combine(scripts: impl IntoIterator<Item = Script>) -> Result<Script, ScriptError> {
        let mut all = Vec::new();
        for s in scripts {
            all.extend(s.entries.iter().cloned());
        }
        check_duplicates(&all)?;
        Ok(Script {
            entries: Arc::new(all),
        })
    }

    /// Every entry, in file order.
    pub fn entries(&self) -> &[ScriptEntry] {
        &self.entries
    }

    /// The roles that have at least one entry.
    pub fn roles(&self) -> std::collections::BTreeSet<Role> {
        self.entries.iter().map(|e| e.role).collect()
    }

    /// The agent that answers for `role` from this script.
    pub fn agent(&self, role: Role) -> ScriptedAgent {
        ScriptedAgent {
            role,
            script: self.clone(),
        }
    }

    /// The answer for `role` at `step`, attempt `attempt`.
    ///
    /// 1. an exact entry with `attempt = n`;
    /// 2. else the n-th (0-based) exact entry for the step that has no `attempt`, in file
    ///    order;
    /// 3. else a wildcard entry with `attempt = n`, else the last wildcard entry without
    ///    `attempt` (among matching wildcards, the one with the fewest `*` wins, then the one
    ///    listed last).
    ///
    /// No entry for the step at all is [`AgentFailure::ScriptMismatch`]; entries that do not
    /// reach attempt `n` (and no wildcard) is [`AgentFailure::ScriptExhausted`].
    pub fn lookup(
        &self,
        role: Role,
        step: &Step,
        attempt: u32,
    ) -> Result<&ScriptEntry, AgentFailure> {
        let key = step.to_string();
        let mine = || self.entries.iter().filter(|e| e.role == role);
        let exact: Vec<&ScriptEntry> = mine()
            .filter(|e| e.step.is_exact() && e.step.as_str() == key)
            .collect();
        if let Some(e) = exact.iter().find(|e| e.attempt == Some(attempt)) {
            return Ok(e);
        }
        if let Some(e) = exact
            .iter()
            .filter(|e| e.attempt.is_none())
            .nth(attempt as usize)
        {
            return Ok(e);
        }
        let wild: Vec<&ScriptEntry> = mine()
            .filter(|e| !e.step.is_exact() && e.step.matches(&key))
            .collect();
        let best = |pred: &dyn Fn(&&ScriptEntry) -> bool| -> Option<&ScriptEntry> {
            wild.iter()
                .copied()
                .filter(|e| pred(e))
                // min_by_key keeps the first minimum; reverse so the last listed wins ties.
                .rev()
                .min_by_key(|e| e.step.wildcards())
        };
        if let Some(e) = best(&|e| e.attempt == Some(attempt)) {
            return Ok(e);
        }
        if let Some(e) = best(&|e| e.attempt.is_none()) {
            return Ok(e);
        }
        let wanted = format!("{role} {key} (attempt {attempt})");
        if exact.is_empty() && wild.is_empty() {
            let mut steps: Vec<&str> = Vec::new();
            for e in mine() {
                if !steps.contains(&e.step.as_str()) {
                    steps.push(e.step.as_str());
                }
            }
            let found = if steps.is_empty() {
                format!("no entries for {role}")
            } else {
                let list = consort_actors::first_and_more(&steps, 12);
                format!("entries for {role} answer only: {list}")
            };
            return Err(AgentFailure::ScriptMismatch { wanted, found });
        }
        Err(AgentFailure::ScriptExhausted {
            wanted: format!(
                "{wanted}: the script has {} entr{} for that step and no wildcard for this attempt; attempt {attempt} follows {attempt} refused answer{}: fix the answer that was refused, or add an entry for the retry (a human `consort retry` starts again at attempt 0 and gets the same answers)",
                exact.len() + wild.len(),
                if exact.len() + wild.len() == 1 {
                    "y"
                } else {
                    "ies"
                },
                if attempt == 1 { "" } else { "s" },
            ),
        })
    }

    fn parse_toml(text: &str, name: &str) -> Result<Script, ScriptError> {
        let raw: RawTomlScript = toml::from_str(text).map_err(|e| ScriptError::Syntax {
            source_name: name.to_string(),
            line: e.span().map(|s| line_of(text, s.start)),
            detail: e.message().trim().to_string(),
        })?;
        let mut entries = Vec::with_capacity(raw.entry.len());
        for (i, spanned) in raw.entry.into_iter().enumerate() {
            let line = line_of(text, spanned.span().start);
            let value = spanned.into_inner();
            let step_hint = value
                .get("step")
                .and_then(|v| v.as_str())
                .map(str::to_string);
            let entry_err = |detail: String| ScriptError::Entry {
                source_name: name.to_string(),
                entry: i + 1,
                line: Some(line),
                detail: with_step(step_hint.as_deref(), detail),
            };
            let artifact = value
                .get("artifact")
                .and_then(|a| serde_json::to_value(a).ok());
            let parsed: RawEntry = value.try_into().map_err(|e: toml::de::Error| {
                entry_err(with_field(
                    artifact.as_ref(),
                    e.message().trim().to_string(),
                ))
            })?;
            entries.push(
                finish_entry(parsed, raw.role, i + 1, format!("{name}:{line}"))
                    .map_err(entry_err)?,
            );
        }
        check_duplicates(&entries)?;
        Ok(Script {
            entries: Arc::new(entries),
        })
    }

    fn parse_json(text: &str, name: &str) -> Result<Script, ScriptError> {
        let syntax = |line: Option<usize>, detail: String| ScriptError::Syntax {
            source_name: name.to_string(),
            line,
            detail,
        };
        let value: Value =
            serde_json::from_str(text).map_err(|e| syntax(Some(e.line()), e.to_string()))?;
        let (default_role, items) = match value {
            Value::Array(items) => (None, items),
            Value::Object(mut map) => {
                let role = match map.remove("role") {
                    None | Some(Value::Null) => None,
                    Some(r) => Some(
                        serde_json::from_value::<Role>(r)
                            .map_err(|e| syntax(None, format!("top-level role: {e}")))?,
                    ),
                };
                let items = match (map.remove("entry"), map.remove("entries")) {
                    (Some(Value::Array(a)), None) | (None, Some(Value::Array(a))) => a,
                    (None, None) => Vec::new(),
                    _ => {
                        return Err(syntax(
                            None,
                            "`entry` (or `entries`) must be one array of entries".into(),
                        ));
                    }
                };
                if let Some(k) = map.keys().next() {
                    return Err(syntax(
                        None,
                        format!("unknown top-level key `{k}` (expected role, entry)"),
                    ));
                }
                (role, items)
            }
            _ => {
                return Err(syntax(
                    None,
                    "a script is an array of entries or an object with `entry`".into(),
                ));
            }
        };
        let mut entries = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            let step_hint = item.get("step").and_then(Value::as_str).map(str::to_string);
            let entry_err = |detail: String| ScriptError::Entry {
                source_name: name.to_string(),
                entry: i + 1,
                line: None,
                detail: with_step(step_hint.as_deref(), detail),
            };
            let artifact = item.get("artifact").cloned();
            let parsed: RawEntry = serde_json::from_value(item)
                .map_err(|e| entry_err(with_field(artifact.as_ref(), e.to_string())))?;
            entries.push(
                finish_entry(parsed, default_role, i + 1, format!("{name}#{}", i + 1))
                    .map_err(entry_err)?,
            );
        }
        check_duplicates(&entries)?;
        Ok(Script {
            entries: Arc::new(entries),
        })
    }
}

fn with_step(step: Option<&str>, detail: String) -> String {
    match step {
        Some(s) => format!("(step {s}) {detail}"),
        None => detail,
    }
}

/// The error of an entry, with the field of its artifact's body it is about when that can
/// be found: the artifact is a tagged union, whose errors carry no path, so the body is read
/// again as its kind's type alone.
fn with_field(artifact: Option<&Value>, detail: String) -> String {
    match artifact.and_then(body_field_error) {
        Some(field) => format!("{field} (fields: docs/ARTIFACTS.md)"),
        None => detail,
    }
}

fn body_field_error(artifact: &Value) -> Option<String> {
    fn at<T: serde::de::DeserializeOwned>(body: &Value) -> Option<String> {
        let e = serde_path_to_error::deserialize::<_, T>(body).err()?;
        let path = e.path().to_string();
        let path = if path == "." {
            "body".to_string()
        } else {
            format!("body.{path}")
        };
        Some(format!("{path}: {}", e.inner()))
    }
    use consort_actors as a;
    let kind: ArtifactKind = serde_json::from_value(artifact.get("kind")?.clone()).ok()?;
    let body = artifact.get("body")?;
    match kind {
        ArtifactKind::Stories => at::<a::Stories>(body),
        ArtifactKind::Spec => at::<a::Spec>(body),
        ArtifactKind::ArchitectureVerdict => at::<a::ArchitectureVerdict>(body),
        ArtifactKind::SchemaPlan => at::<a::SchemaPlan>(body),
        ArtifactKind::TestList => at::<a::TestList>(body),
        ArtifactKind::UxDesign => at::<a::UxDesign>(body),
        ArtifactKind::ChangeSet => at::<a::ChangeSet>(body),
        ArtifactKind::ReviewVerdict => at::<a::ReviewVerdict>(body),
        ArtifactKind::TestRunReceipt => at::<a::TestRunReceipt>(body),
    }
}

fn finish_entry(
    raw: RawEntry,
    default_role: Option<Role>,
    entry: usize,
    origin: String,
) -> Result<ScriptEntry, String> {
    let step = StepPattern::parse(&raw.step)?;
    let role = match raw.role.or(default_role) {
        Some(r) if r != step.role() => {
            return Err(format!(
                "step {} belongs to the {}, not the {r}",
                step,
                step.role()
            ));
        }
        _ => step.role(),
    };
    Ok(ScriptEntry {
        role,
        step,
        attempt: raw.attempt,
        artifact: raw.artifact,
        entry,
        origin,
    })
}

fn check_duplicates(entries: &[ScriptEntry]) -> Result<(), ScriptError> {
    for (i, e) in entries.iter().enumerate() {
        let Some(n) = e.attempt else { continue };
        if let Some(first) = entries[..i]
            .iter()
            .find(|o| o.role == e.role && o.step == e.step && o.attempt == Some(n))
        {
            return Err(ScriptError::Entry {
                source_name: e.origin.clone(),
                entry: e.entry,
                line: None,
                detail: format!(
                    "a second answer for {} {} attempt {n} (the first is {})",
                    e.role, e.step, first.origin
                ),
            });
        }
    }
    Ok(())
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map(|t| t.matches('\n').count() + 1)
        .unwrap_or(1)
}

/// An entry that still holds the skeleton's placeholders (see [`crate::script_skeleton`])
/// answers nothing: the run halts at that step, naming the entry and its unfilled fields,
/// instead of sending "FILL IN" text down the lifecycle.
fn refuse_placeholders(entry: &ScriptEntry, step: &Step, attempt: u32) -> Result<(), AgentFailure> {
    let holes = crate::placeholders(&entry.artifact).map_err(|e| AgentFailure::InvalidOutput {
        attempts: 1,
        detail: format!(
            "entry {} ({}) cannot be read: {e}",
            entry.entry, entry.origin
        ),
        usage: consort_actors::Usage::default(),
    })?;
    if holes.is_empty() {
        return Ok(());
    }
    Err(AgentFailure::ScriptMismatch {
        wanted: format!("{} {step} (attempt {attempt})", entry.role),
        found: format!(
            "entry {} ({}) still holds the skeleton's placeholders in {}; fill them in (docs/ARTIFACTS.md) and run `consort doctor`",
            entry.entry,
            entry.origin,
            crate::field_list(&holes)
        ),
    })
}

/// An agent that answers from a [`Script`]: deterministic, no model, no cost.
///
/// It ignores the assignment's inputs and feedback; the answer depends only on the role, the
/// step and the attempt. The attempt is how many answers to the same step were refused
/// before (0 for the first try; a person's `consort retry` starts again at 0), and picks the
/// answer as [`Script::lookup`] says: an entry with that `attempt`; else the n-th entry for
/// the step without one, in file order (so a step's entries, written one after the other, are
/// its first try, its first repair, …); else a wildcard. A refused answer with no entry for the
/// next attempt ends the step with [`AgentFailure::ScriptExhausted`], naming what to add.
#[derive(Debug, Clone)]
pub struct ScriptedAgent {
    role: Role,
    script: Script,
}

impl ScriptedAgent {
    /// An agent answering for `role` from `script`.
    pub fn new(role: Role, script: Script) -> Self {
        ScriptedAgent { role, script }
    }

    /// The role it answers for.
    pub fn role(&self) -> Role {
        self.role
    }
}

/// Most characters of a refusal a script's exhaustion repeats.
const REFUSAL_SAID: usize = 1000;

/// A script exhausted after a refused answer also says what the refusal was (the first line of
/// the step's feedback), so a scripted run halts naming what to fix in the answer, not only that
/// no entry was left.
fn with_refusal(failure: AgentFailure, feedback: &[String]) -> AgentFailure {
    let refusal = feedback
        .last()
        .and_then(|f| consort_actors::refusal_said(f))
        .map(|said| said.chars().take(REFUSAL_SAID).collect::<String>());
    match (failure, refusal) {
        (AgentFailure::ScriptExhausted { wanted }, Some(refusal)) => {
            AgentFailure::ScriptExhausted {
                wanted: format!("{wanted}. The answer was refused: {refusal}"),
            }
        }
        (failure, _) => failure,
    }
}

impl Agent for ScriptedAgent {
    fn act<'a>(&'a self, assignment: &'a Assignment) -> ActFuture<'a> {
        Box::pin(async move {
            let entry = self
                .script
                .lookup(self.role, &assignment.step, assignment.attempt)
                .map_err(|e| with_refusal(e, &assignment.feedback))?;
            refuse_placeholders(entry, &assignment.step, assignment.attempt)?;
            tracing::debug!(
                role = %self.role,
                step = %assignment.step,
                attempt = assignment.attempt,
                origin = %entry.origin,
                "scripted answer"
            );
            Ok(AgentOutput::new(entry.artifact.clone()).with_usage(Usage {
                calls: 1,
                ..Usage::default()
            }))
        })
    }

    fn describe(&self) -> String {
        format!("scripted({})", self.role)
    }
}
