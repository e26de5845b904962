//! Where a feature's lane lives, as the project sees it: its work tree, and what its test runs
//! may not read. Driving lanes is [`crate::lanes`]' part; this is what a [`Project`] needs to
//! find a lane by its feature's id alone.

use std::path::{Path, PathBuf};

use crate::backlog::LANES_DIR;
use crate::git::GitError;
use crate::project::Project;

/// Why a lane could not be made, found or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaneError {
    /// Lanes are git worktrees: the project must lie in a repository.
    #[error(
        "lanes need a git repository, and {} lies in none (`git init` and a first commit make one)",
        dir.display()
    )]
    NotInGit {
        /// The project.
        dir: PathBuf,
    },
    /// A lane merges into the branch the project's tree is on; there is none.
    #[error(
        "lanes merge into the branch the project's tree is on, and it is on {0}; switch to a branch first"
    )]
    NoBaseBranch(String),
    /// Git refused to make, check or remove a lane's worktree.
    #[error("the lane of feature {feature} could not be {what}")]
    Git {
        /// The feature.
        feature: String,
        /// What was being done.
        what: &'static str,
        /// Why.
        #[source]
        source: GitError,
    },
    /// A feature that runs in a lane is driven as a lane, behind its merge check.
    #[error(
        "feature {feature} runs in a lane of its own; drive it with `consort run --parallel N` (or `--parallel 1 --feature {feature}`), so that its merge check comes before its promotion"
    )]
    DriveAsLane {
        /// The feature.
        feature: String,
    },
    /// A lane's task ended without a report (a panic in Consort).
    #[error("a lane's task failed: {detail}")]
    Task {
        /// Why.
        detail: String,
    },
    /// A lane's record (`lane.json`) is unreadable or could not be written.
    #[error("lane record {}: {detail}", path.display())]
    Record {
        /// The file.
        path: PathBuf,
        /// Why.
        detail: String,
    },
}

/// The work tree of feature `id`'s lane, when it has one: `.consort/lanes/<id>` (a git
/// worktree), joined with the project's path inside its repository.
pub fn work_tree_of(dir: &Path, id: &str) -> Option<PathBuf> {
    let root = dir.join(crate::backlog::lane_dir(id));
    if !root.join(".git").is_file() {
        return None;
    }
    let prefix = crate::git::GitRepo::detect(dir)
        .map(|repo| repo.prefix().to_string())
        .unwrap_or_default();
    Some(root.join(prefix))
}

/// A feature's lane record, `lane.json` in its record: written when its lane is made, kept
/// after (see [`crate::lanes::LaneRecord`]).
pub(crate) fn record_path(dir: &Path, feature: &crate::backlog::Feature) -> PathBuf {
    dir.join(&feature.record_dir).join("lane.json")
}

/// Whether `feature` runs or ran in a lane: its record holds `lane.json`.
pub(crate) fn ran_in_a_lane(dir: &Path, feature: &crate::backlog::Feature) -> bool {
    record_path(dir, feature).is_file()
}

/// What a lane's test runs may not read besides their own tree: every entry of the project's
/// `.consort/` (the records of every feature, the cluster, the backlog) but the lanes, and the
/// other lanes. Empty for a feature that runs in the project's own tree (its `.consort/` is
/// hidden already).
pub fn hidden_from_lane(project: &Project) -> Vec<PathBuf> {
    if !project.in_lane() {
        return Vec::new();
    }
    let state = project.dir.join(consort_actors::STATE_DIR);
    let lanes = project.dir.join(LANES_DIR);
    let own = project
        .dir
        .join(crate::backlog::lane_dir(project.feature_id()));
    let mut hidden = Vec::new();
    for (dir, keep) in [(&state, &lanes), (&lanes, &own)] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        hidden.extend(entries.flatten().map(|e| e.path()).filter(|p| p != keep));
    }
    hidden.sort();
    hidden
}
