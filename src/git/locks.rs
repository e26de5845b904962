//! Lock files a killed git left behind.
//!
//! git guards a ref or an index by creating `<file>.lock` with `O_EXCL` and renaming it over the
//! file when done; a git killed in between (a SIGKILL of the whole run, an out-of-memory kill)
//! leaves the lock, and every later git that needs that file fails with "Unable to create
//! '….lock': File exists" — a run that could never finish. Consort recovers only the locks of
//! what is the feature's alone, and only while it holds the feature's run lock, so no git of
//! Consort's can be working there: the feature's branch ref (`refs/heads/consort/<id>.lock`) and
//! the index and HEAD of the work tree the feature runs in. A lock younger than [`GRACE`] is
//! given that long first (a person's own git in that tree finishes in less). The commit a
//! removed lock guarded is made again by the next sync, from the ledger, once.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::{GitError, GitRepo, branch_name};

/// How old a lock must be to be taken for a dead git's.
pub(crate) const GRACE: Duration = Duration::from_secs(2);

/// The locks of a work tree's own files, in its git directory.
const WORK_TREE_LOCKS: [&str; 4] = [
    "index.lock",
    "HEAD.lock",
    "ORIG_HEAD.lock",
    "AUTO_MERGE.lock",
];

impl GitRepo {
    /// Removes the lock of `feature_id`'s branch that a killed git left, and returns it.
    /// Only for a caller that holds the feature's run lock.
    pub(crate) fn recover_branch_lock(&self, feature_id: &str) -> Result<Vec<PathBuf>, GitError> {
        let common = self.git_path("--git-common-dir")?;
        let lock = common.join(format!("refs/heads/{}.lock", branch_name(feature_id)));
        recover(&[lock])
    }

    /// Removes the locks of this work tree's index and HEAD that a killed git left, and the
    /// feature's branch lock ([`GitRepo::recover_branch_lock`]); returns what it removed. Only
    /// for a caller that holds the run lock of the feature this tree is.
    pub(crate) fn recover_stale_locks(&self, feature_id: &str) -> Result<Vec<PathBuf>, GitError> {
        let own = self.git_path("--git-dir")?;
        let locks: Vec<PathBuf> = WORK_TREE_LOCKS.iter().map(|l| own.join(l)).collect();
        let mut removed = recover(&locks)?;
        removed.extend(self.recover_branch_lock(feature_id)?);
        Ok(removed)
    }

    /// An absolute path `git rev-parse` gives for `what` (`--git-dir`, `--git-common-dir`).
    fn git_path(&self, what: &str) -> Result<PathBuf, GitError> {
        let out = self.git(&["rev-parse", "--path-format=absolute", what], None)?;
        Ok(PathBuf::from(out.trim_end_matches(['\n', '\r'])))
    }
}

/// Removes each of `locks` that exists and stays past [`GRACE`]; returns those removed.
fn recover(locks: &[PathBuf]) -> Result<Vec<PathBuf>, GitError> {
    let mut removed = Vec::new();
    for lock in locks {
        let Some(old) = age(lock) else { continue };
        if let Some(wait) = GRACE.checked_sub(old) {
            std::thread::sleep(wait);
            if age(lock).is_none() {
                continue;
            }
        }
        match std::fs::remove_file(lock) {
            Ok(()) => {
                tracing::warn!(
                    lock = %lock.display(),
                    "removed a git lock file that a killed git left (this process holds the feature, so no git of Consort's works there)"
                );
                removed.push(lock.clone());
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(GitError::StaleLock {
                    path: lock.clone(),
                    source,
                });
            }
        }
    }
    Ok(removed)
}

/// How long ago `lock` was last written; None when it is not there. A modification time in
/// the future (another machine's clock) counts as new.
fn age(lock: &Path) -> Option<Duration> {
    let modified = std::fs::symlink_metadata(lock).ok()?.modified().ok()?;
    Some(
        SystemTime::now()
            .duration_since(modified)
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_with_branch(dir: &Path, branch_of: &str) -> GitRepo {
        std::fs::write(dir.join("README"), "a project").expect("write");
        let repo = match GitRepo::init_with_commit(dir, "ada", "start") {
            Ok(r) => r,
            Err(e) => panic!("git init: {e}"),
        };
        let branch = branch_name(branch_of);
        if let Err(e) = repo.git(&["switch", "-q", "-c", &branch], None) {
            panic!("switch: {e}");
        }
        repo
    }

    /// Writes `path` as a killed git would have left it, `ago` in the past.
    fn plant(path: &Path, ago: Duration) {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("dir");
        }
        let file = std::fs::File::create(path).expect("lock");
        file.set_modified(SystemTime::now() - ago).expect("mtime");
    }

    /// A repository on branch `F1`, and `locks` (paths in its `.git`) as a killed git left
    /// them a minute ago.
    fn with_old_locks(locks: &[&str]) -> (tempfile::TempDir, GitRepo, Vec<std::path::PathBuf>) {
        let tmp = tempfile::tempdir().expect("tmp");
        let repo = repo_with_branch(tmp.path(), "F1");
        let locks: Vec<_> = locks
            .iter()
            .map(|l| tmp.path().join(".git").join(l))
            .collect();
        for lock in &locks {
            plant(lock, Duration::from_secs(60));
        }
        (tmp, repo, locks)
    }

    fn commit(repo: &GitRepo, name: &str) -> Result<String, GitError> {
        std::fs::write(repo.dir().join(name), name).expect("write");
        repo.git(&["add", name], None)?;
        repo.git_env(
            &["commit", "-q", "-m", name],
            &super::super::conductor_identity(),
            None,
        )
    }

    #[test]
    fn locks_a_killed_git_left_are_removed_and_git_works_again() {
        let (_tmp, repo, locks) = with_old_locks(&["refs/heads/consort/F1.lock", "index.lock"]);
        let refused = commit(&repo, "a.txt").expect_err("git refuses while the locks stand");
        assert!(refused.to_string().contains(".lock"), "{refused}");

        let removed = repo.recover_stale_locks("F1").expect("recover");
        assert_eq!(removed.len(), 2, "{removed:?}");
        assert!(!locks.iter().any(|lock| lock.exists()), "{locks:?}");
        commit(&repo, "b.txt").expect("git works again");
    }

    #[test]
    fn another_feature_s_branch_lock_and_shared_locks_stay() {
        let (_tmp, repo, locks) = with_old_locks(&[
            "refs/heads/consort/F2.lock",
            "packed-refs.lock",
            "refs/heads/main.lock",
        ]);
        assert!(repo.recover_stale_locks("F1").expect("recover").is_empty());
        assert!(locks.iter().all(|lock| lock.exists()), "{locks:?}");
    }

    #[test]
    fn a_lock_that_goes_within_the_grace_is_not_counted_and_a_new_one_waits_it_out() {
        let tmp = tempfile::tempdir().expect("tmp");
        let repo = repo_with_branch(tmp.path(), "F1");
        let index_lock = tmp.path().join(".git/index.lock");
        plant(&index_lock, Duration::ZERO);
        let holder = {
            let lock = index_lock.clone();
            std::thread::spawn(move || {
                std::thread::sleep(GRACE / 4);
                std::fs::remove_file(lock)
            })
        };
        assert!(repo.recover_stale_locks("F1").expect("recover").is_empty());
        holder
            .join()
            .expect("thread")
            .expect("the live holder removes its own lock");

        plant(&index_lock, Duration::ZERO);
        let removed = repo.recover_stale_locks("F1").expect("recover");
        assert_eq!(
            removed,
            vec![index_lock.clone()],
            "kept past the grace: a dead git's"
        );
    }
}
