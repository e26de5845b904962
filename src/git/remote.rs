//! Code through a git remote (`[git] remote`): a lane's branch is pushed after each of
//! Consort's commits and fetched when the lane is made or resumed on another machine; the
//! merge check fetches the base and every lane's branch before it merges, and pushes the
//! base only if the remote's base did not move meanwhile (a push with lease).
//!
//! Git runs with its own configuration and credential helpers; it is never asked to prompt,
//! and a remote's credentials are cut from every message
//! ([`super::without_credentials`]).

use super::{GitError, GitRepo, branch_name};

/// A remote of a repository, by name (`[git] remote`).
#[derive(Debug, Clone)]
pub(crate) struct Remote {
    repo: GitRepo,
    name: String,
}

/// One fetch or push at a time in this process: git updates the remote-tracking refs of a
/// repository on both, and the lanes of one process share their repository.
static NETWORK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Git must not wait for a person typing a password: a remote that needs credentials gets
/// them from git's configuration or fails.
const NO_PROMPT: [(&str, &str); 2] = [("GIT_TERMINAL_PROMPT", "0"), ("GIT_ASKPASS", "")];

impl Remote {
    /// The remote `name` of `repo`.
    pub(crate) fn new(repo: GitRepo, name: String) -> Remote {
        Remote { repo, name }
    }

    /// Where the remote's copy of `branch` is kept here.
    fn tracking(&self, branch: &str) -> String {
        format!("refs/remotes/{}/{branch}", self.name)
    }

    /// Fetches the remote's `branch`; its tip, or None when the remote has no such branch.
    pub(crate) fn fetch(&self, branch: &str) -> Result<Option<String>, GitError> {
        let _one = one_at_a_time();
        let has = self.repo.git_env(
            &[
                "ls-remote",
                "--heads",
                &self.name,
                &format!("refs/heads/{branch}"),
            ],
            &NO_PROMPT,
            None,
        )?;
        if has.trim().is_empty() {
            return Ok(None);
        }
        let spec = format!("+refs/heads/{branch}:{}", self.tracking(branch));
        self.repo
            .git_env(&["fetch", "-q", &self.name, &spec], &NO_PROMPT, None)?;
        self.repo.rev(&self.tracking(branch))
    }

    /// Fetches every lane's branch (`consort/*`) the remote has, for the merge check to see
    /// which features reached the base.
    pub(crate) fn fetch_lanes(&self) -> Result<(), GitError> {
        let _one = one_at_a_time();
        let spec = format!("+refs/heads/consort/*:{}", self.tracking("consort/*"));
        self.repo
            .git_env(&["fetch", "-q", &self.name, &spec], &NO_PROMPT, None)?;
        Ok(())
    }

    /// The tip of feature's branch as last fetched from the remote.
    pub(crate) fn lane_tip(&self, feature_id: &str) -> Option<String> {
        self.repo
            .rev(&self.tracking(&branch_name(feature_id)))
            .ok()
            .flatten()
    }

    /// Pushes feature's branch (a fast-forward only: a branch another machine moved on is
    /// not overwritten).
    pub(crate) fn push_lane(&self, feature_id: &str) -> Result<(), GitError> {
        let _one = one_at_a_time();
        let branch = branch_name(feature_id);
        let spec = format!("refs/heads/{branch}:refs/heads/{branch}");
        self.repo
            .git_env(&["push", "-q", &self.name, &spec], &NO_PROMPT, None)?;
        Ok(())
    }

    /// Pushes `commit` as the remote's `base` only if the remote's base is still `seen` (None:
    /// the remote had none); false when it moved meanwhile, and nothing changed there.
    pub(crate) fn push_base(
        &self,
        base: &str,
        commit: &str,
        seen: Option<&str>,
    ) -> Result<bool, GitError> {
        let lease = format!(
            "--force-with-lease=refs/heads/{base}:{}",
            seen.unwrap_or("")
        );
        let spec = format!("{commit}:refs/heads/{base}");
        match self
            .repo
            .git_env(&["push", "-q", &lease, &self.name, &spec], &NO_PROMPT, None)
        {
            Ok(_) => Ok(true),
            Err(GitError::Failed { stderr, .. })
                if stderr.contains("stale info") || stderr.contains("rejected") =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    NETWORK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
