//! Code through a git remote (`[git] remote`): a lane's branch is pushed after each of
//! Consort's commits and fetched when the lane is made or resumed on another machine; the
//! merge check fetches the base and every lane's branch before it merges, and pushes the
//! base only if the remote's base did not move meanwhile (a push with lease).
//!
//! Git runs with its own configuration and credential helpers; it is never asked to prompt
//! (ssh runs in batch mode unless the user names their own ssh command), a remote that refuses
//! a push (a hook, a protected branch) is an error rather than a base that moved, and a
//! remote's credentials are cut from every message
//! ([`super::without_credentials`]).

use super::{GitError, GitRepo, branch_name};

/// A remote of a repository, by name (`[git] remote`).
#[derive(Debug, Clone)]
pub(crate) struct Remote {
    repo: GitRepo,
    name: String,
    /// How long one fetch or push may take before git is stopped.
    limit: std::time::Duration,
}

/// How long a fetch or a push may take: a remote that stops answering must not hold a lane (or
/// the merge lock) for ever.
const NETWORK_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// One fetch or push at a time in this process: git updates the remote-tracking refs of a
/// repository on both, and the lanes of one process share their repository.
static NETWORK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Git must not wait for a person typing a password: a remote that needs credentials gets
/// them from git's configuration or fails.
const NO_PROMPT: [(&str, &str); 2] = [("GIT_TERMINAL_PROMPT", "0"), ("GIT_ASKPASS", "")];

/// ssh as git runs it for Consort when the user has not said how: in batch mode, so a
/// passphrase, a password or an unknown host key fails at once instead of waiting on a
/// terminal while the merge lock is held.
const BATCH_SSH: &str = "ssh -o BatchMode=yes";

impl Remote {
    /// The remote `name` of `repo`.
    pub(crate) fn new(repo: GitRepo, name: String) -> Remote {
        Remote {
            repo,
            name,
            limit: NETWORK_LIMIT,
        }
    }

    /// Runs git with `args` for the network: never prompting, and ssh in batch mode unless
    /// the user chose their own ssh command (`GIT_SSH_COMMAND`, `GIT_SSH`, `core.sshCommand`).
    fn git_net(&self, args: &[&str]) -> Result<String, GitError> {
        self.repo
            .git_within(args, &self.net_env(), None, Some(self.limit))
    }

    /// The environment git runs in for the network (see [`Remote::git_net`]).
    fn net_env(&self) -> Vec<(&'static str, &'static str)> {
        let chose_own = ["GIT_SSH_COMMAND", "GIT_SSH"]
            .iter()
            .any(|k| std::env::var_os(k).is_some())
            || self
                .repo
                .git(&["config", "--get", "core.sshCommand"], None)
                .is_ok_and(|v| !v.trim().is_empty());
        let mut env = NO_PROMPT.to_vec();
        if !chose_own {
            env.push(("GIT_SSH_COMMAND", BATCH_SSH));
        }
        env
    }

    /// Where the remote's copy of `branch` is kept here.
    fn tracking(&self, branch: &str) -> String {
        format!("refs/remotes/{}/{branch}", self.name)
    }

    /// Fetches the remote's `branch`; its tip, or None when the remote has no such branch.
    pub(crate) fn fetch(&self, branch: &str) -> Result<Option<String>, GitError> {
        let _one = one_at_a_time();
        let has = self.git_net(&[
            "ls-remote",
            "--heads",
            &self.name,
            &format!("refs/heads/{branch}"),
        ])?;
        if has.trim().is_empty() {
            return Ok(None);
        }
        let spec = format!("+refs/heads/{branch}:{}", self.tracking(branch));
        self.git_net(&["fetch", "-q", &self.name, &spec])?;
        self.repo.rev(&self.tracking(branch))
    }

    /// Fetches every lane's branch (`consort/*`) the remote has, for the merge check to see
    /// which features reached the base.
    pub(crate) fn fetch_lanes(&self) -> Result<(), GitError> {
        let _one = one_at_a_time();
        let spec = format!("+refs/heads/consort/*:{}", self.tracking("consort/*"));
        self.git_net(&["fetch", "-q", &self.name, &spec])?;
        Ok(())
    }

    /// The tip of feature's branch as last fetched from the remote.
    pub(crate) fn lane_tip(&self, feature_id: &str) -> Option<String> {
        self.repo
            .rev(&self.tracking(&branch_name(feature_id)))
            .ok()
            .flatten()
    }

    /// Pushes feature's branch, fenced against a process that lost the feature: the push
    /// replaces the remote's branch only where it is still the tip this clone last saw there
    /// (fetched at takeover, or its own last push). Where it moved, `still_holds` asks the
    /// store: the holder fetches what the other process pushed and replaces it (the ledger
    /// makes its commits again); a process that lost the feature pushes nothing. So an old
    /// holder that checked its lease, paused, and pushed after a takeover wins at most one
    /// push that the new holder's next push replaces, and never blocks the new holder.
    pub(crate) fn push_lane(
        &self,
        feature_id: &str,
        still_holds: impl Fn() -> bool,
    ) -> Result<(), GitError> {
        let branch = branch_name(feature_id);
        let spec = format!("refs/heads/{branch}:refs/heads/{branch}");
        for _ in 0..LANE_PUSH_TRIES {
            let seen = self.lane_tip(feature_id);
            let lease = format!(
                "--force-with-lease=refs/heads/{branch}:{}",
                seen.as_deref().unwrap_or("")
            );
            let pushed = {
                let _one = one_at_a_time();
                self.git_net(&["push", "-q", &lease, &self.name, &spec])
            };
            match pushed {
                Ok(_) => return Ok(()),
                Err(GitError::Failed { stderr, .. }) if base_moved(&stderr) => {
                    if !still_holds() {
                        return Err(GitError::NotHolder { branch });
                    }
                    self.fetch(&branch)?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(GitError::Failed {
            args: format!("push {} {spec}", self.name),
            stderr: format!("the remote's branch moved under each of {LANE_PUSH_TRIES} pushes"),
        })
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
        match self.git_net(&["push", "-q", &lease, &self.name, &spec]) {
            Ok(_) => Ok(true),
            Err(GitError::Failed { stderr, .. }) if base_moved(&stderr) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// How often a lane's push is tried when the remote's branch moved under it.
const LANE_PUSH_TRIES: usize = 4;

/// Whether a refused push of the base says the remote's base moved (the lease went stale, or
/// it is no fast-forward any more) — not that the remote refused it (a hook, a protected
/// branch: `[remote rejected]`), which no retry mends.
fn base_moved(stderr: &str) -> bool {
    !stderr.contains("[remote rejected]")
        && (stderr.contains("stale info")
            || stderr.contains("[rejected]")
            || stderr.contains("fetch first")
            || stderr.contains("non-fast-forward"))
}

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    NETWORK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clone of a bare remote whose main has one commit; the remote's directory too.
    fn clone_of_remote(tmp: &std::path::Path) -> (GitRepo, std::path::PathBuf) {
        let bare = tmp.join("remote.git");
        let run = |args: &[&str]| {
            let ok = std::process::Command::new("git")
                .args(args)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "git {args:?}");
        };
        run(&[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            &bare.to_string_lossy(),
        ]);
        let here = tmp.join("here");
        std::fs::create_dir_all(&here).expect("dir");
        std::fs::write(here.join("a.txt"), "a").expect("write");
        let repo = GitRepo::init_with_commit(&here, "ada", "start").expect("init");
        repo.git(&["remote", "add", "origin", &bare.to_string_lossy()], None)
            .expect("remote");
        repo.git(&["push", "-q", "origin", "main"], None)
            .expect("push");
        (repo, bare)
    }

    #[test]
    fn a_base_that_moved_is_told_apart_from_a_remote_that_refuses() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (repo, bare) = clone_of_remote(tmp.path());
        let seen = repo.rev("main").expect("rev");
        let commit = lane_commit(&repo, "b.txt");
        let remote = Remote::new(repo.clone(), "origin".into());

        let stale = "0000000000000000000000000000000000000001";
        assert_eq!(
            remote.push_base("main", &commit, Some(stale)).ok(),
            Some(false)
        );

        let hook = bare.join("hooks/pre-receive");
        std::fs::write(&hook, "#!/bin/sh\necho protected branch >&2\nexit 1\n").expect("hook");
        let mut perms = std::fs::metadata(&hook).expect("meta").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&hook, perms).expect("chmod");
        match remote.push_base("main", &commit, seen.as_deref()) {
            Err(GitError::Failed { stderr, .. }) => {
                assert!(
                    stderr.contains("protected branch"),
                    "the hook's own words: {stderr}"
                )
            }
            other => panic!("a hook's refusal is an error, not a moved base: {other:?}"),
        }

        std::fs::remove_file(&hook).expect("unhook");
        assert_eq!(
            remote.push_base("main", &commit, seen.as_deref()).ok(),
            Some(true)
        );
    }

    /// A commit of a new file `file` on the branch checked out in `repo`.
    fn lane_commit(repo: &GitRepo, file: &str) -> String {
        std::fs::write(repo.dir().join(file), file).expect("write");
        repo.git(&["add", file], None).expect("add");
        repo.git_env(
            &["commit", "-q", "-m", file],
            &crate::git::conductor_identity(),
            None,
        )
        .expect("commit");
        repo.rev("HEAD").expect("rev").expect("a commit")
    }

    /// Issue 49, item 6: an old holder that checked its lease, paused past it and pushed after
    /// a takeover does not block the new holder, and once it knows it lost, pushes nothing.
    #[test]
    fn a_lane_push_is_fenced_against_a_process_that_lost_the_feature() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (old_repo, bare) = clone_of_remote(tmp.path());
        old_repo
            .git(&["switch", "-q", "-c", "consort/F"], None)
            .expect("lane branch");
        lane_commit(&old_repo, "x.txt");
        let old = Remote::new(old_repo.clone(), "origin".into());
        old.push_lane("F", || true)
            .expect("the first holder pushes");
        // A takeover in another clone: the lane fetched, a commit made again from the ledger.
        let new_dir = tmp.path().join("new");
        let cloned = std::process::Command::new("git")
            .args(["clone", "-q", "-b", "consort/F"])
            .arg(&bare)
            .arg(&new_dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(cloned, "clone");
        let new_repo = GitRepo::detect(&new_dir).expect("a repository");
        let new = Remote::new(new_repo.clone(), "origin".into());
        new.fetch("consort/F").expect("fetched at takeover");
        let theirs = lane_commit(&new_repo, "y.txt");
        // The old holder, resumed after its check, pushes first: it saw the remote's tip.
        lane_commit(&old_repo, "z.txt");
        old.push_lane("F", || true)
            .expect("a stale push lands once");
        // The new holder's push is not refused for good: it replaces the stale one.
        new.push_lane("F", || true).expect("the holder's push");
        assert_eq!(new.fetch("consort/F").expect("fetch"), Some(theirs.clone()));
        // The old holder's next push, asking the store now, pushes nothing.
        lane_commit(&old_repo, "w.txt");
        match old.push_lane("F", || false) {
            Err(GitError::NotHolder { branch }) => assert_eq!(branch, "consort/F"),
            other => panic!("a process that lost the feature pushes nothing: {other:?}"),
        }
        assert_eq!(new.fetch("consort/F").expect("fetch"), Some(theirs));
    }

    /// Issue 49, item 11: git never prompts, and ssh runs in batch mode unless the user named
    /// an ssh command of their own.
    #[test]
    fn git_never_prompts_and_ssh_runs_in_batch_mode_unless_the_user_chose_their_own() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (repo, _) = clone_of_remote(tmp.path());
        let remote = Remote::new(repo.clone(), "origin".into());
        let env = remote.net_env();
        assert!(env.contains(&("GIT_TERMINAL_PROMPT", "0")), "{env:?}");
        let users_own = ["GIT_SSH_COMMAND", "GIT_SSH"]
            .iter()
            .any(|k| std::env::var_os(k).is_some());
        assert_eq!(
            env.contains(&("GIT_SSH_COMMAND", BATCH_SSH)),
            !users_own,
            "batch mode unless this process's environment names an ssh: {env:?}"
        );
        repo.git(&["config", "core.sshCommand", "ssh -i my-key"], None)
            .expect("the user's own ssh");
        let env = remote.net_env();
        assert!(
            !env.iter().any(|(k, _)| *k == "GIT_SSH_COMMAND"),
            "the user's own ssh command is left as it is: {env:?}"
        );
        assert!(env.contains(&("GIT_TERMINAL_PROMPT", "0")), "{env:?}");
    }

    #[test]
    fn a_remote_that_never_answers_is_given_up_on_in_time() {
        let tmp = tempfile::tempdir().expect("tmp");
        let (repo, _) = clone_of_remote(tmp.path());
        // An ssh remote whose "ssh" (the user's own, so left as it is) hangs.
        for args in [
            &["remote", "add", "hung", "ssh://nowhere.invalid/x.git"][..],
            &["config", "core.sshCommand", "sh -c 'sleep 30'"][..],
        ] {
            repo.git(args, None).expect("configured");
        }
        let remote = Remote {
            limit: std::time::Duration::from_millis(500),
            ..Remote::new(repo, "hung".into())
        };
        let started = std::time::Instant::now();
        match remote.fetch("main") {
            Err(GitError::TimedOut { args, .. }) => assert!(args.contains("ls-remote"), "{args}"),
            other => panic!("stopped for its time: {other:?}"),
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "not the sleep's 30 s"
        );
    }
}
