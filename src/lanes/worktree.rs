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
        let record: LaneRecord =
            serde_json::from_str(&text).map_err(|e| bad(format!("not a lane record: {e}")))?;
        record.check().map_err(bad)?;
        Ok(Some(record))
    }

    /// Whether the record can be what Consort wrote (it reaches git's command line, and may
    /// have come from another machine through the store): its base a plain branch name, its
    /// commit an object id.
    fn check(&self) -> Result<(), String> {
        if !is_branch_name(&self.base) {
            return Err(format!("its base {:?} is no branch name", self.base));
        }
        let hex = self.started_from.chars().all(|c| c.is_ascii_hexdigit());
        if !(hex && matches!(self.started_from.len(), 40 | 64)) {
            return Err(format!(
                "its started_from {:?} is no commit id",
                self.started_from
            ));
        }
        Ok(())
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
        crate::replace_file::replace_file(&path, text.as_bytes()).map_err(|e| bad(e.to_string()))
    }
}

/// Whether `name` is a branch name as git's `check-ref-format --branch` takes one, and not an
/// option: no empty or dot-led component, no `..`, `@{`, `//`, control or special characters,
/// no leading `-`, no trailing `/`, `.` or `.lock`.
fn is_branch_name(name: &str) -> bool {
    let special = |c: char| c.is_ascii_control() || " ~^:?*[\\".contains(c);
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('-')
        && !name.ends_with('.')
        && !name.ends_with(".lock")
        && name != "@"
        && !name.contains("..")
        && !name.contains("@{")
        && !name.chars().any(special)
        && name
            .split('/')
            .all(|part| !part.is_empty() && !part.starts_with('.') && !part.ends_with(".lock"))
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
/// or a lane whose worktree a crash lost) is checked out as it stands. With a remote, the
/// feature's branch there (pushed by a machine that drove it before) is fetched first, and
/// the lane goes on from it when it is ahead of the branch here.
pub(crate) fn ensure(
    dir: &Path,
    feature: &Feature,
    remote: Option<&crate::git::Remote>,
) -> Result<LaneRecord, LaneError> {
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
    let root = lanes_dir_made(&repo)?.join(crate::backlog::lane_name(&feature.id));
    let pushed = match remote {
        Some(remote) => remote
            .fetch(&branch_name(&feature.id))
            .map_err(git("fetched"))?,
        None => None,
    };
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
    // The caller holds the feature's lock: what a git killed in this lane left is recovered.
    repo.recover_branch_lock(&feature.id)
        .map_err(git("recovered"))?;
    if let Some(lane) = GitRepo::detect(&root).filter(|_| root.join(".git").is_file()) {
        lane.recover_stale_locks(&feature.id)
            .map_err(git("recovered"))?;
    }
    if !repo.has_branch(&feature.id).map_err(git("made"))? {
        match (&pushed, remote) {
            (Some(tip), _) => {
                repo.git(&["branch", &branch_name(&feature.id), tip], None)
                    .map_err(git("made"))?;
            }
            // Started on another machine from a base commit this clone has not fetched yet.
            (None, Some(remote))
                if repo
                    .rev(&format!("{}^{{commit}}", record.started_from))
                    .ok()
                    .flatten()
                    .is_none() =>
            {
                remote.fetch(&record.base).map_err(git("made"))?;
            }
            _ => {}
        }
    }
    if !root.join(".git").is_file() {
        add_worktree(&repo, &root, feature, &record).map_err(git("made"))?;
    }
    if let Some(tip) = &pushed {
        catch_up(&root, tip).map_err(git("brought up to the remote's branch"))?;
    }
    super::deps::link_dependencies(&repo.top(), &root).map_err(|e| LaneError::Dependencies {
        feature: feature.id.clone(),
        detail: e.to_string(),
    })?;
    Ok(record)
}

/// Moves the lane's worktree at `root` on to `tip` (the remote's branch) when `tip` is ahead of
/// it; a worktree ahead of or beside the remote's stays as it is.
fn catch_up(root: &Path, tip: &str) -> Result<(), crate::git::GitError> {
    let Some(lane) = GitRepo::detect(root) else {
        return Ok(());
    };
    let ahead = lane
        .git(&["merge-base", "--is-ancestor", "HEAD", tip], None)
        .is_ok();
    if ahead && lane.rev("HEAD")?.as_deref() != Some(tip) {
        lane.git(&["merge", "--ff-only", "-q", tip], None)?;
    }
    Ok(())
}

/// The lanes' directory of `repo` (see [`super::lanes_dir`]), made when missing.
fn lanes_dir_made(repo: &GitRepo) -> Result<PathBuf, LaneError> {
    let lanes = super::lanes_dir(repo).ok_or_else(|| LaneError::Place {
        dir: repo.top(),
        detail: "a repository at the file system's root has no place beside it".into(),
    })?;
    std::fs::create_dir_all(&lanes).map_err(|e| LaneError::Place {
        dir: lanes.clone(),
        detail: e.to_string(),
    })?;
    Ok(lanes)
}

/// Makes the worktree of feature's lane at `root`: moved there when an earlier Consort made
/// it inside the project, else checked out on the feature's branch (made from where the lane
/// started when it has none yet).
fn add_worktree(
    repo: &GitRepo,
    root: &Path,
    feature: &Feature,
    record: &LaneRecord,
) -> Result<(), crate::git::GitError> {
    let path = root.to_string_lossy();
    let legacy = super::legacy_lane_root(repo.dir(), &feature.id);
    if legacy.join(".git").is_file() {
        repo.git(
            &["worktree", "move", &legacy.to_string_lossy(), &path],
            None,
        )?;
        return Ok(());
    }
    // A worktree a crash left half made is forgotten first.
    repo.git(&["worktree", "prune"], None)?;
    let branch = branch_name(&feature.id);
    if repo.has_branch(&feature.id)? {
        repo.git(&["worktree", "add", "-q", &path, &branch], None)?;
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
        )?;
    }
    Ok(())
}

/// Removes feature's lane worktree, when it has one (its branch and record stay).
pub(crate) fn remove(dir: &Path, feature: &Feature) -> Result<bool, LaneError> {
    let Some(work_tree) = super::work_tree_of(dir, &feature.id) else {
        return Ok(false);
    };
    let _lock = worktrees_lock(dir)?;
    let (repo, _) = base_of(dir)?;
    let root = crate::git::without_prefix(&work_tree, repo.prefix());
    let path = root.to_string_lossy();
    repo.git(&["worktree", "remove", "--force", &path], None)
        .map_err(|source| LaneError::Git {
            feature: feature.id.clone(),
            what: "removed",
            source,
        })?;
    remove_if_empty(&repo);
    Ok(true)
}

/// A throwaway lane: a detached worktree of the project's repository at one commit, in the
/// lanes' directory, with the project's installed dependencies linked as a lane's are;
/// removed when dropped. The merge check merges and runs the tests in one; `consort doctor`
/// tries the test command in one.
#[derive(Debug)]
pub struct ScratchLane {
    root: PathBuf,
    prefix: String,
    repo: GitRepo,
    project_dir: PathBuf,
}

impl ScratchLane {
    /// Makes the scratch lane `name` of the project at `dir` at `commit` (any that a lane's
    /// name may be; one a killed process left is made again).
    pub fn make(dir: &Path, name: &str, commit: &str) -> Result<ScratchLane, LaneError> {
        let _lock = worktrees_lock(dir)?;
        let (repo, _) = base_of(dir)?;
        let git = |what: &'static str| {
            let feature = name.to_string();
            move |source| LaneError::Git {
                feature,
                what,
                source,
            }
        };
        let root = lanes_dir_made(&repo)?.join(name);
        let path = root.to_string_lossy().into_owned();
        let _ = repo.git(&["worktree", "remove", "--force", &path], None);
        let _ = std::fs::remove_dir_all(&root);
        let _ = repo.git(&["worktree", "prune"], None);
        repo.git(&["worktree", "add", "-q", "--detach", &path, commit], None)
            .map_err(git("made"))?;
        let lane = ScratchLane {
            prefix: repo.prefix().to_string(),
            root,
            repo,
            project_dir: dir.to_path_buf(),
        };
        super::deps::link_dependencies(&lane.repo.top(), &lane.root).map_err(|e| {
            LaneError::Dependencies {
                feature: name.to_string(),
                detail: e.to_string(),
            }
        })?;
        Ok(lane)
    }

    /// Makes this process's own scratch lane for `purpose` (`+<purpose>-<pid>`) at `commit`,
    /// so two processes at once (two `consort doctor`s) never make or remove each other's;
    /// the ones a killed process of the same purpose left are removed first.
    pub fn make_own(dir: &Path, purpose: &str, commit: &str) -> Result<ScratchLane, LaneError> {
        let (repo, _) = base_of(dir)?;
        if let Some(lanes) = super::lanes_dir(&repo) {
            remove_orphans(dir, &repo, &lanes, purpose)?;
        }
        Self::make(dir, &format!("+{purpose}-{}", std::process::id()), commit)
    }

    /// The top of its worktree.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The project's directory in it.
    pub fn work_tree(&self) -> PathBuf {
        self.root.join(&self.prefix)
    }
}

impl Drop for ScratchLane {
    fn drop(&mut self) {
        let _lock = worktrees_lock(&self.project_dir);
        let path = self.root.to_string_lossy().into_owned();
        if self
            .repo
            .git(&["worktree", "remove", "--force", &path], None)
            .is_err()
        {
            let _ = std::fs::remove_dir_all(&self.root);
            let _ = self.repo.git(&["worktree", "prune"], None);
        }
        remove_if_empty(&self.repo);
    }
}

/// Removes the scratch lanes `+<purpose>-<pid>` in `lanes` whose process is gone.
fn remove_orphans(
    dir: &Path,
    repo: &GitRepo,
    lanes: &Path,
    purpose: &str,
) -> Result<(), LaneError> {
    let Ok(entries) = std::fs::read_dir(lanes) else {
        return Ok(());
    };
    let _lock = worktrees_lock(dir)?;
    let prefix = format!("+{purpose}-");
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let gone = matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        if gone && pid > 0 {
            let path = entry.path().to_string_lossy().into_owned();
            if repo
                .git(&["worktree", "remove", "--force", &path], None)
                .is_err()
            {
                let _ = std::fs::remove_dir_all(entry.path());
                let _ = repo.git(&["worktree", "prune"], None);
            }
        }
    }
    Ok(())
}

/// Removes the lanes' directory when no lane is left in it.
fn remove_if_empty(repo: &GitRepo) {
    if let Some(lanes) = super::lanes_dir(repo) {
        let _ = std::fs::remove_dir(lanes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_s_own_scratch_lane_leaves_a_live_one_s_and_removes_a_dead_one_s() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("shop");
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("a.txt"), "a").expect("write");
        GitRepo::init_with_commit(&dir, "ada", "start").expect("git");
        let dead = {
            let mut child = std::process::Command::new("true").spawn().expect("spawn");
            let pid = child.id();
            child.wait().expect("wait");
            pid
        };
        // The lanes of another doctor still running (pid 1 always is) and of a killed one.
        let live = ScratchLane::make(&dir, "+doctor-1", "HEAD").expect("live");
        let orphan = ScratchLane::make(&dir, &format!("+doctor-{dead}"), "HEAD").expect("orphan");
        let (live_root, orphan_root) = (live.root().to_path_buf(), orphan.root().to_path_buf());
        std::mem::forget(live);
        std::mem::forget(orphan);

        let own = ScratchLane::make_own(&dir, "doctor", "HEAD").expect("own");
        assert!(
            own.root()
                .ends_with(format!("+doctor-{}", std::process::id()))
        );
        assert!(own.work_tree().join("a.txt").is_file());
        assert!(
            live_root.join("a.txt").is_file(),
            "another live process's lane stays"
        );
        assert!(!orphan_root.exists(), "a killed process's lane is removed");
        drop(own);
        assert!(live_root.exists());
    }

    #[test]
    fn a_lane_record_s_base_must_be_a_branch_name_and_its_start_a_commit() {
        let commit = "a".repeat(40);
        let record = |base: &str, started_from: &str| LaneRecord {
            base: base.into(),
            started_from: started_from.into(),
        };
        for good in ["main", "release/2.0", "feature_x-1", "users/ada/wip"] {
            assert!(record(good, &commit).check().is_ok(), "{good}");
        }
        assert!(
            record("main", &"b".repeat(64)).check().is_ok(),
            "sha-256 ids"
        );
        for bad in [
            "",
            "-f",
            "--upload-pack=touch /tmp/x",
            "main..evil",
            "a b",
            "x~1",
            "HEAD^",
            "a:b",
            "a\\b",
            "new\nline",
            "a//b",
            "a/",
            ".hidden",
            "a/.b",
            "x.lock",
            "x@{1}",
            "@",
            "dot.",
        ] {
            assert!(record(bad, &commit).check().is_err(), "{bad:?} taken");
        }
        for bad in ["", "HEAD", "-x", &"g".repeat(40), &"a".repeat(39)] {
            assert!(record("main", bad).check().is_err(), "{bad:?} taken");
        }
    }
}
