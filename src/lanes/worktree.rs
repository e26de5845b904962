//! A lane's git worktree and its record: made on the feature's branch from the base, found
//! again after a crash, removed when the feature is finished.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::LaneError;
use crate::backlog::Feature;
use crate::git::{GitRepo, branch_name};
use crate::runlock::{LockScope, RunLock};

/// The largest `lane.json` read.
const MAX_RECORD_BYTES: u64 = 16 * 1024;

/// What a lane records beside its feature's ledger (`lane.json`), written when the lane is
/// made and read as untrusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneRecord {
    /// The branch the lane merges into: the one the project's tree was on when it was made.
    pub base: String,
    /// The base's commit the lane started from.
    pub started_from: String,
}

impl LaneRecord {
    /// The record's file (its presence says the feature ran in a lane).
    pub fn path(project_dir: &Path, feature: &Feature) -> PathBuf {
        crate::project::lane::record_path(project_dir, feature)
    }

    /// Reads a feature's record (None: it has never run in a lane).
    pub fn read(project_dir: &Path, feature: &Feature) -> Result<Option<LaneRecord>, LaneError> {
        use std::io::Read;
        let path = Self::path(project_dir, feature);
        let bad = |detail: String| LaneError::Record {
            path: path.clone(),
            detail,
        };
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(bad(e.to_string())),
        };
        let mut text = String::new();
        file.take(MAX_RECORD_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| bad(e.to_string()))?;
        if text.len() as u64 > MAX_RECORD_BYTES {
            return Err(bad(format!("larger than {MAX_RECORD_BYTES} bytes")));
        }
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| bad(format!("not a lane record: {e}")))
    }

    fn write(&self, project_dir: &Path, feature: &Feature) -> Result<(), LaneError> {
        let path = Self::path(project_dir, feature);
        let bad = |detail: String| LaneError::Record {
            path: path.clone(),
            detail,
        };
        let text = serde_json::to_string_pretty(self).map_err(|e| bad(e.to_string()))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| bad(e.to_string()))?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text).map_err(|e| bad(e.to_string()))?;
        std::fs::rename(&tmp, &path).map_err(|e| bad(e.to_string()))
    }
}

/// The project's repository and the branch its tree is on: what a new lane starts from.
pub(crate) fn base_of(dir: &Path) -> Result<(GitRepo, String), LaneError> {
    let repo = GitRepo::detect(dir).ok_or_else(|| LaneError::NotInGit {
        dir: dir.to_path_buf(),
    })?;
    let base = repo
        .git(&["symbolic-ref", "--short", "-q", "HEAD"], None)
        .map(|b| b.trim().to_string())
        .map_err(|_| LaneError::NoBaseBranch("a detached HEAD".into()))?;
    Ok((repo, base))
}

/// How long a process waits for another to finish making or removing a lane.
const WORKTREES_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Holds the project's worktree lock: git's worktree list is one for every process.
pub(super) fn worktrees_lock(dir: &Path) -> Result<RunLock, LaneError> {
    let path = dir.join(consort_actors::STATE_DIR).join("lanes.lock");
    RunLock::wait_at(
        path.clone(),
        LockScope::Worktrees,
        "a lane's worktree",
        WORKTREES_PATIENCE,
    )
    .map_err(|e| LaneError::Record {
        detail: consort_actors::error_chain(&e),
        path,
    })
}

/// Makes feature's lane (its worktree on `consort/<id>`, and its record) unless it has one;
/// returns its record. A branch the feature already has (a run begun in the project's tree,
/// or a lane whose worktree a crash lost) is checked out as it stands.
pub(crate) fn ensure(dir: &Path, feature: &Feature) -> Result<LaneRecord, LaneError> {
    let _lock = worktrees_lock(dir)?;
    let git = |what: &'static str| {
        let feature = feature.id.clone();
        move |source| LaneError::Git {
            feature,
            what,
            source,
        }
    };
    let (repo, base) = base_of(dir)?;
    let root = dir.join(crate::backlog::lane_dir(&feature.id));
    let record = match LaneRecord::read(dir, feature)? {
        Some(record) => record,
        None => {
            let started_from = repo
                .rev("HEAD")
                .map_err(git("started"))?
                .ok_or_else(|| LaneError::NoBaseBranch(format!("{base}, which has no commit")))?;
            let record = LaneRecord { base, started_from };
            record.write(dir, feature)?;
            record
        }
    };
    if root.join(".git").is_file() {
        return Ok(record);
    }
    // A worktree a crash left half made is forgotten first.
    repo.git(&["worktree", "prune"], None)
        .map_err(git("made"))?;
    let branch = branch_name(&feature.id);
    let path = root.to_string_lossy();
    if repo.has_branch(&feature.id).map_err(git("made"))? {
        repo.git(&["worktree", "add", "-q", &path, &branch], None)
    } else {
        repo.git(
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                &branch,
                &path,
                &record.started_from,
            ],
            None,
        )
    }
    .map_err(git("made"))?;
    Ok(record)
}

/// Removes feature's lane worktree, when it has one (its branch and record stay).
pub(crate) fn remove(dir: &Path, feature: &Feature) -> Result<bool, LaneError> {
    let root = dir.join(crate::backlog::lane_dir(&feature.id));
    if !root.exists() {
        return Ok(false);
    }
    let _lock = worktrees_lock(dir)?;
    let (repo, _) = base_of(dir)?;
    let path = root.to_string_lossy();
    repo.git(&["worktree", "remove", "--force", &path], None)
        .map_err(|source| LaneError::Git {
            feature: feature.id.clone(),
            what: "removed",
            source,
        })?;
    Ok(true)
}
