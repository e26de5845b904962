//! A project's backlog: the feature `consort.toml` names, then every feature `consort feature
//! add` appended, in that order. Each feature keeps its own record — ledger, frozen design,
//! apply journal, transcripts — in `.consort/features/<id>/`.
//!
//! **Invariant:** a feature's record is found by its id alone, and nothing moves it. A project
//! made before backlogs existed keeps its single feature's record where it was, in `.consort/`
//! itself (the *legacy* record): it is read there, and every later feature goes to
//! `.consort/features/<id>/`.

use std::path::{Path, PathBuf};

use consort_actors::{
    EarlierMigration, EarlierTest, GateKind, Inherited, MigrationFiles, Phase, State,
};
use serde::{Deserialize, Serialize};

use crate::config::ProjectConfig;

/// The backlog file, relative to the project: the features added after the first.
pub const BACKLOG_FILE: &str = ".consort/backlog.json";
/// Where each feature's record lives, relative to the project.
pub const FEATURES_DIR: &str = ".consort/features";
/// The longest feature id, in bytes.
const MAX_ID: usize = 64;

/// Why the backlog could not be read or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BacklogError {
    /// A feature id is not usable as a directory and branch name.
    #[error(
        "feature id `{id}` is not usable: {why} (use letters, digits, '-', '_' and '.', at most 64, starting with a letter or digit)"
    )]
    BadId {
        /// The id.
        id: String,
        /// What is wrong.
        why: &'static str,
    },
    /// The id is taken.
    #[error("the project already has a feature `{id}`; give the new one another id (--id)")]
    Duplicate {
        /// The id.
        id: String,
    },
    /// No feature has this id.
    #[error("the project has no feature `{id}` (`consort feature list` lists them)")]
    Unknown {
        /// The id.
        id: String,
    },
    /// A request file is unusable.
    #[error("feature request {}: {detail}", path.display())]
    Request {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
    /// The backlog file is unreadable or malformed, or could not be written.
    #[error("backlog {}: {detail}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
}

impl BacklogError {
    /// Whether the person at the command line asked for something wrong (an id, a request
    /// file): exit 2 like any usage error. A broken backlog file is not theirs.
    pub fn is_usage(&self) -> bool {
        !matches!(self, BacklogError::File { .. })
    }
}

/// One feature of the backlog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feature {
    /// Its id.
    pub id: String,
    /// Its request file, relative to the project.
    pub request: PathBuf,
    /// Where its record is kept, relative to the project (`.consort/features/<id>`, or
    /// `.consort` for a legacy project's feature).
    pub record_dir: String,
}

impl Feature {
    /// Its ledger, relative to the project.
    pub fn ledger(&self) -> String {
        format!("{}/ledger.jsonl", self.record_dir)
    }

    /// Its frozen design file, relative to the project.
    pub fn design_file(&self) -> String {
        format!("{}/design.json", self.record_dir)
    }

    /// Where its agents' transcripts are kept, relative to the project.
    pub fn transcript_dir(&self) -> String {
        format!("{}/transcripts", self.record_dir)
    }

    /// Its lock, relative to the project: held by the process that drives the feature.
    pub fn lock_file(&self) -> String {
        format!("{}/feature.lock", self.record_dir)
    }

    /// Its mailbox for roles played through `consort mcp`, relative to the project.
    pub fn mailbox_dir(&self) -> String {
        format!("{}/mcp", self.record_dir)
    }
}

/// Where a feature stands, as `consort feature list` shows it (serialised as `waiting`,
/// `designing`, `at-design-gate`, `building`, `halted`, `done`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeatureState {
    /// Not started.
    Waiting,
    /// In the design lane.
    Designing,
    /// Waiting at a gate.
    AtGate(GateKind),
    /// In the build lane, the deploy run or the promotion.
    Building,
    /// Halted for a human (`consort retry` or `consort stop`).
    Halted,
    /// Done: built, deployed and promoted.
    Done,
    /// Stopped by a human.
    Stopped,
}

impl FeatureState {
    /// The state of a feature whose ledger replays to `state` (None: no ledger yet).
    pub fn of(state: Option<&State>) -> Self {
        let Some(state) = state else {
            return FeatureState::Waiting;
        };
        match state.phase() {
            Phase::Idle => FeatureState::Waiting,
            Phase::Design => FeatureState::Designing,
            Phase::DesignGate => FeatureState::AtGate(GateKind::Design),
            Phase::DeployGate => FeatureState::AtGate(GateKind::Deploy),
            Phase::PromoteGate => FeatureState::AtGate(GateKind::Promote),
            Phase::Build | Phase::Deploy | Phase::Promote => FeatureState::Building,
            Phase::Halted => FeatureState::Halted,
            Phase::Done => FeatureState::Done,
            Phase::Stopped => FeatureState::Stopped,
        }
    }

    /// Whether `consort run` would take it up (it is neither done nor stopped).
    pub fn is_unfinished(self) -> bool {
        !matches!(self, FeatureState::Done | FeatureState::Stopped)
    }
}

impl FeatureState {
    /// The state's name in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            FeatureState::Waiting => "waiting",
            FeatureState::Designing => "designing",
            FeatureState::AtGate(GateKind::Design) => "at-design-gate",
            FeatureState::AtGate(GateKind::Deploy) => "at-deploy-gate",
            FeatureState::AtGate(GateKind::Promote) => "at-promote-gate",
            FeatureState::Building => "building",
            FeatureState::Halted => "halted",
            FeatureState::Done => "done",
            FeatureState::Stopped => "stopped",
        }
    }
}

impl Serialize for FeatureState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl std::fmt::Display for FeatureState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FeatureState::Waiting => f.write_str("waiting"),
            FeatureState::Designing => f.write_str("designing"),
            FeatureState::AtGate(gate) => write!(f, "at the {gate} gate"),
            FeatureState::Building => f.write_str("building"),
            FeatureState::Halted => f.write_str("halted"),
            FeatureState::Done => f.write_str("done"),
            FeatureState::Stopped => f.write_str("stopped"),
        }
    }
}

/// `.consort/backlog.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BacklogFile {
    /// The features added, in order.
    features: Vec<Added>,
}

/// A feature `consort feature add` appended; its request is copied to its record.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Added {
    id: String,
}

/// The project's features in backlog order: `consort.toml`'s first, then the ones `consort
/// feature add` appended to `.consort/backlog.json`.
pub fn features(dir: &Path, config: &ProjectConfig) -> Result<Vec<Feature>, BacklogError> {
    let added = read_file(dir)?.features.into_iter().map(|a| a.id).collect();
    Ok(listed(dir, config, added))
}

/// The backlog of `consort.toml`'s feature then the `added` ids (checked by the caller), in
/// order: each feature with its record directory and request.
pub fn listed(dir: &Path, config: &ProjectConfig, added: Vec<String>) -> Vec<Feature> {
    let first = &config.feature.id;
    let mut out = Vec::new();
    let mut first_record = record_dir(first);
    match legacy_feature(dir) {
        // A legacy record of another feature than `consort.toml` names now: that one came
        // first, and its request lives in its ledger.
        Some(Some(id)) if id != *first => out.push(Feature {
            id,
            request: PathBuf::new(),
            record_dir: consort_actors::STATE_DIR.to_string(),
        }),
        Some(_) => first_record = consort_actors::STATE_DIR.to_string(),
        None => {}
    }
    out.push(Feature {
        id: first.clone(),
        request: config.feature.request.clone(),
        record_dir: first_record,
    });
    for id in added {
        let record_dir = record_dir(&id);
        out.push(Feature {
            request: PathBuf::from(format!("{record_dir}/request.md")),
            record_dir,
            id,
        });
    }
    out
}

/// The legacy record's feature: None without one; Some(None) when its ledger does not say
/// (unreadable: it is then taken as `consort.toml`'s feature's, whose `verify` reports why).
fn legacy_feature(dir: &Path) -> Option<Option<String>> {
    let path = dir.join(consort_actors::DEFAULT_LEDGER_PATH);
    if !path.is_file() {
        return None;
    }
    let entries = consort_actors::Ledger::<consort_actors::Event>::read(&path).ok();
    Some(
        entries.and_then(|entries| match entries.first().map(|e| &e.event) {
            Some(consort_actors::Event::Start { feature, .. }) => Some(feature.id.clone()),
            _ => None,
        }),
    )
}

/// Adds to `inherited` what the done feature `id`, whose ledger replays to `state`, leaves to
/// the features after it: the earlier tests it retired leave the suite; its own test-list
/// entries join it, its quarantines hold on, and its schema plan's migrations (with their
/// files, when `files` says where migrations are written) are promoted ones from now on.
pub fn inherit(inherited: &mut Inherited, id: &str, state: &State, files: Option<&MigrationFiles>) {
    inherited
        .quarantined
        .extend(state.quarantined.iter().cloned());
    inherited
        .tests
        .retain(|t| !state.retired.iter().any(|r| r.retires(t)));
    // A file this feature added tests to (beside an earlier feature's, judged test by test) now
    // stands as this feature froze it, for the earlier tests in it too.
    for t in &mut inherited.tests {
        if let Some(hash) = state.build.frozen_tests.get(&t.path) {
            t.hash = Some(*hash);
        }
    }
    for entry in state.test_list.iter().flat_map(|l| l.entries.iter()) {
        inherited.tests.push(EarlierTest {
            feature: id.to_string(),
            test: entry.id.clone(),
            path: entry.path.clone(),
            runner_name: entry.runner_name().to_string(),
            hash: state.build.frozen_tests.get(&entry.path).copied(),
        });
    }
    let Some(plan) = state.schema.as_deref() else {
        return;
    };
    let paths: Vec<Option<String>> = match files {
        Some(files) => files
            .planned(plan)
            .into_iter()
            .map(|(p, _)| Some(p))
            .collect(),
        None => vec![None; plan.migrations.len()],
    };
    for (m, path) in plan.migrations.iter().zip(paths) {
        inherited.migrations.push(EarlierMigration {
            feature: id.to_string(),
            migration: m.clone(),
            path,
        });
    }
}

/// The record directory of a feature, relative to the project: `.consort/features/<slug>`,
/// the slug being the id with anything but letters, digits, `-`, `_` and `.` made `-`.
pub fn record_dir(id: &str) -> String {
    format!("{FEATURES_DIR}/{}", slug(id))
}

/// The name of a feature's lane in the lanes' directory (see [`crate::lanes::lanes_dir`]): the
/// slug of [`record_dir`].
pub fn lane_name(id: &str) -> String {
    slug(id)
}

fn slug(id: &str) -> String {
    let s: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    match s.trim_start_matches('.') {
        "" => "feature".into(),
        rest => rest.to_string(),
    }
}

/// Checks an id given to `consort feature add`.
pub fn check_id(id: &str) -> Result<(), BacklogError> {
    let bad = |why| {
        Err(BacklogError::BadId {
            id: id.to_string(),
            why,
        })
    };
    if id.is_empty() {
        return bad("it is empty");
    }
    if id.len() > MAX_ID {
        return bad("it is too long");
    }
    if !id.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return bad("it must start with a letter or a digit");
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return bad("it holds a character other than a letter, a digit, '-', '_' or '.'");
    }
    Ok(())
}

/// The title of a request: its first `# ` line.
pub fn title_of(body: &str) -> Option<&str> {
    body.lines()
        .find_map(|l| l.strip_prefix("# "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Appends the request in `file` to the backlog file as feature `id` (default: the file's
/// name without its extension): the request is copied into the feature's record, so that later
/// edits of `file` do not change what the feature was asked. A duplicate id is refused, and
/// nothing is written then.
pub fn add(
    dir: &Path,
    config: &ProjectConfig,
    file: &Path,
    id: Option<&str>,
) -> Result<Feature, BacklogError> {
    let (feature, _) = prepare_add(dir, &features(dir, config)?, file, id)?;
    let mut backlog = read_file(dir)?;
    backlog.features.push(Added {
        id: feature.id.clone(),
    });
    write_file(dir, &backlog)?;
    Ok(feature)
}

/// What adding the request in `file` as feature `id` to a backlog of `existing` features
/// makes: the feature (its request copied into its record) and the request's text; refused
/// for a request without a title, a bad id or one the backlog has.
pub fn prepare_add(
    dir: &Path,
    existing: &[Feature],
    file: &Path,
    id: Option<&str>,
) -> Result<(Feature, String), BacklogError> {
    let request = |detail: String| BacklogError::Request {
        path: file.to_path_buf(),
        detail,
    };
    let body = std::fs::read_to_string(file).map_err(|e| request(e.to_string()))?;
    if title_of(&body).is_none() {
        return Err(request("needs a `# Title` line".into()));
    }
    let id = match id {
        Some(id) => id.to_string(),
        None => file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .ok_or_else(|| request("has no file name to take an id from; give --id".into()))?,
    };
    check_id(&id)?;
    if existing
        .iter()
        .any(|f| f.id == id || f.record_dir == record_dir(&id))
    {
        return Err(BacklogError::Duplicate { id });
    }
    let record = record_dir(&id);
    let copy = dir.join(&record).join("request.md");
    let io = |path: &Path, e: std::io::Error| BacklogError::File {
        path: path.to_path_buf(),
        detail: e.to_string(),
    };
    std::fs::create_dir_all(dir.join(&record)).map_err(|e| io(&copy, e))?;
    std::fs::write(&copy, &body).map_err(|e| io(&copy, e))?;
    let feature = Feature {
        id,
        request: PathBuf::from(format!("{record}/request.md")),
        record_dir: record,
    };
    Ok((feature, body))
}

fn read_file(dir: &Path) -> Result<BacklogFile, BacklogError> {
    let path = dir.join(BACKLOG_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BacklogFile::default()),
        Err(e) => {
            return Err(BacklogError::File {
                path,
                detail: e.to_string(),
            });
        }
    };
    let file: BacklogFile = serde_json::from_str(&text).map_err(|e| BacklogError::File {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    for added in &file.features {
        check_id(&added.id).map_err(|e| BacklogError::File {
            path: path.clone(),
            detail: e.to_string(),
        })?;
    }
    Ok(file)
}

/// Writes the backlog atomically (a temporary file renamed over it).
fn write_file(dir: &Path, backlog: &BacklogFile) -> Result<(), BacklogError> {
    let path = dir.join(BACKLOG_FILE);
    let err = |detail: String| BacklogError::File {
        path: path.clone(),
        detail,
    };
    let text = serde_json::to_string_pretty(backlog).map_err(|e| err(e.to_string()))?;
    crate::replace_file::replace_file(&path, (text + "\n").as_bytes())
        .map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_and_slugged() {
        assert!(check_id("reorder-alerts").is_ok());
        assert!(check_id("F2.1_x").is_ok());
        for bad in ["", ".hidden", "-x", "a/b", "a b", "ü", &"x".repeat(65)] {
            assert!(check_id(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            record_dir("F1 stock/levels"),
            ".consort/features/F1-stock-levels"
        );
        assert_eq!(record_dir("..."), ".consort/features/feature");
    }

    #[test]
    fn states_read_as_words() {
        assert_eq!(FeatureState::of(None).to_string(), "waiting");
        assert_eq!(
            FeatureState::AtGate(GateKind::Design).to_string(),
            "at the design gate"
        );
        assert!(FeatureState::Halted.is_unfinished() && !FeatureState::Done.is_unfinished());
    }

    #[test]
    fn a_done_feature_leaves_its_quarantines_to_the_next() {
        let quarantine = |test: &str| consort_actors::Quarantine {
            test: test.into(),
            by: "ada".into(),
            reason: "needs a superuser".into(),
        };
        let mut inherited = Inherited::default();
        for (id, test) in [("F1", "a"), ("F2", "b")] {
            let state = State {
                quarantined: vec![quarantine(test)],
                ..State::default()
            };
            inherit(&mut inherited, id, &state, None);
        }
        assert_eq!(
            inherited.quarantined,
            vec![quarantine("a"), quarantine("b")]
        );
        assert!(
            !inherited.is_empty(),
            "recorded in the next feature's start"
        );
    }
}
