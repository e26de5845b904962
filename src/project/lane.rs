//! Where a feature's lane lives, as the project sees it: its work tree, and what its test runs
//! may not read. Driving lanes is [`crate::lanes`]' part; this is what a [`Project`] needs to
//! find a lane by its feature's id alone.

use std::path::{Path, PathBuf};

use crate::git::{GitError, GitRepo};
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
    /// The lanes' directory beside the repository could not be made.
    #[error(
        "lanes live beside the repository, and {} cannot be made there: {detail}",
        dir.display()
    )]
    Place {
        /// The directory.
        dir: PathBuf,
        /// Why.
        detail: String,
    },
    /// The project's installed dependencies could not be linked into a lane.
    #[error(
        "the dependencies installed in the project could not be linked into the lane of feature {feature}: {detail}"
    )]
    Dependencies {
        /// The feature.
        feature: String,
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

/// What ends the name of the lanes' directory, beside the repository's own.
const LANES_SUFFIX: &str = ".consort-lanes";

/// Where the lanes of the repository `repo` live: `<name>.consort-lanes/` beside the top of
/// its work tree (`~/code/shop` has its lanes in `~/code/shop.consort-lanes/`). Outside the
/// project's tree, so that no tool the project runs (its test runner, its linters, its own
/// scripts) collects or scans a lane's copy of its files, and out of the repository, so that
/// no git command in the project sees them. None for a repository at the file system's root.
pub fn lanes_dir(repo: &GitRepo) -> Option<PathBuf> {
    let top = std::path::absolute(repo.top()).ok()?;
    let name = top.file_name()?.to_string_lossy().into_owned();
    Some(top.with_file_name(format!("{name}{LANES_SUFFIX}")))
}

/// The root of feature `id`'s lane (a git worktree of the whole repository), whether or not
/// it exists.
pub(crate) fn lane_root(repo: &GitRepo, id: &str) -> Option<PathBuf> {
    lanes_dir(repo).map(|d| d.join(crate::backlog::lane_name(id)))
}

/// Where an earlier Consort made feature `id`'s lane: `.consort/lanes/<slug>` in the project.
pub(crate) fn legacy_lane_root(dir: &Path, id: &str) -> PathBuf {
    dir.join(consort_actors::STATE_DIR)
        .join("lanes")
        .join(crate::backlog::lane_name(id))
}

/// The work tree of feature `id`'s lane, when it has one: its root in [`lanes_dir`] joined
/// with the project's path inside its repository (a lane an earlier Consort made inside the
/// project is found too, until its driver moves it).
pub fn work_tree_of(dir: &Path, id: &str) -> Option<PathBuf> {
    let repo = GitRepo::detect(dir)?;
    [lane_root(&repo, id), Some(legacy_lane_root(dir, id))]
        .into_iter()
        .flatten()
        .find(|root| root.join(".git").is_file())
        .map(|root| root.join(repo.prefix()))
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

/// What a feature's test runs may not read besides what every run hides (the `.consort/` of
/// the tree they run in): the lanes' directory, so that no run sees a lane's workspace, its
/// own lane's tree excepted (a run's work tree is always readable, see the sandbox of
/// `consort-lakebase`), whatever lane is made after it started; and for a lane, the project's
/// `.consort/` (the records of every feature, the cluster, the backlog).
pub fn hidden_from_lane(project: &Project) -> Vec<PathBuf> {
    let mut hidden: Vec<PathBuf> = GitRepo::detect(&project.dir)
        .as_ref()
        .and_then(lanes_dir)
        .into_iter()
        .collect();
    if project.in_lane() {
        hidden.push(project.dir.join(consort_actors::STATE_DIR));
    }
    hidden
}
