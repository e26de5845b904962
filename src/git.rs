//! A run in a git repository: its own branch, and one commit per approved design and per
//! accepted RED, GREEN and REFACTOR, made with the `git` program.
//!
//! **Invariant:** the commits are made from the ledger ([`consort_actors::step_commits`]), in a
//! private index, never from what the work tree holds: a sync makes exactly the commits the
//! ledger calls for that the branch does not have yet (found by their `Consort-Receipt` and
//! `Consort-Step` trailers), so a resumed run neither loses nor repeats one. Consort never
//! pushes or rewrites a commit, and merges only a lane's branch into its base, after the lane's
//! merge check ([`crate::lanes`]); `.git/` is harness, no agent's.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use consort_actors::{
    CommitKind, FileChange, MigrationFiles, SchemaPlan, State, StepCommit, WorkTree,
};

mod locks;
mod remote;

pub(crate) use remote::Remote;

/// The e-mail domain of Consort's commit identities (reserved: it never delivers).
const EMAIL_DOMAIN: &str = "consort.invalid";
/// The committer of every commit Consort makes, and the author of a lane's merge.
const CONDUCTOR_NAME: (&str, &str) = ("GIT_COMMITTER_NAME", "Consort");
/// Its e-mail.
const CONDUCTOR_EMAIL: (&str, &str) = ("GIT_COMMITTER_EMAIL", "conductor@consort.invalid");

/// The identity of a commit the conductor itself makes (a lane's merge): author and committer.
pub(crate) fn conductor_identity() -> [(&'static str, &'static str); 4] {
    [
        ("GIT_AUTHOR_NAME", CONDUCTOR_NAME.1),
        ("GIT_AUTHOR_EMAIL", CONDUCTOR_EMAIL.1),
        CONDUCTOR_NAME,
        CONDUCTOR_EMAIL,
    ]
}

/// What went wrong with git.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GitError {
    /// The `git` program could not be started.
    #[error("could not start git: {0}")]
    Start(std::io::Error),
    /// The directory of Consort's private git index could not be made.
    #[error("could not make {}", path.display())]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A git command failed.
    #[error("git {args} failed: {stderr}")]
    Failed {
        /// The arguments, as typed.
        args: String,
        /// What git said.
        stderr: String,
    },
    /// The tree has uncommitted changes and the run would start from them.
    #[error(
        "the repository has uncommitted changes ({}); commit or stash them first, or pass --allow-dirty to start anyway (Consort's commits then hold only its own changes)",
        .paths.join(", ")
    )]
    Dirty {
        /// Some of the changed paths.
        paths: Vec<String>,
    },
    /// A new run's branch exists already.
    #[error(
        "branch {0} exists already; a new run starts its own branch (delete it with `git branch -D {0}`, or give the feature another id)"
    )]
    BranchExists(String),
    /// A lock file a killed git left could not be removed.
    #[error("could not remove {}, a lock file a killed git left", path.display())]
    StaleLock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A git command that talks to a remote ran past its time limit and was killed.
    #[error("git {args} did not end within {secs} s and was stopped (is the remote reachable?)")]
    TimedOut {
        /// The arguments, as typed.
        args: String,
        /// The limit.
        secs: u64,
    },
    /// A lane's push found the remote's branch moved by another process, and this process
    /// no longer holds the feature: nothing was pushed.
    #[error(
        "the remote's {branch} was moved by another process, which now holds the feature; this process pushed nothing"
    )]
    NotHolder {
        /// The lane's branch.
        branch: String,
    },
    /// A resumed run is not on its branch.
    #[error(
        "this run works on branch {expected}, but the repository is on {current}; switch back with `git switch {expected}`"
    )]
    WrongBranch {
        /// The run's branch.
        expected: String,
        /// Where the repository is.
        current: String,
    },
}

/// A project inside a git work tree.
#[derive(Debug, Clone)]
pub struct GitRepo {
    /// The project directory (git runs there).
    dir: PathBuf,
    /// The project's path inside the repository, with a trailing `/` (empty at the top).
    prefix: String,
}

/// One sync at a time in this process (the live thread and the end of a run may overlap; the
/// branch's compare-and-swap update would refuse the second anyway).
static SYNC: Mutex<()> = Mutex::new(());

/// What a sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// The run's branch.
    pub branch: String,
    /// Commits made by this sync.
    pub made: usize,
    /// Consort's commits on the branch now.
    pub total: usize,
    /// The branch's tip after the sync (None while it has no commit).
    pub head: Option<String>,
}

/// Writes `.consort/.gitignore` (ignoring everything in Consort's state directory: the
/// ledger, locks, transcripts) unless it is there.
pub fn keep_state_out_of_git(project: &Path) -> std::io::Result<()> {
    let state = project.join(consort_actors::STATE_DIR);
    let ignore = state.join(".gitignore");
    if ignore.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(&state)?;
    std::fs::write(
        ignore,
        "# Consort's run state (ledger, locks, transcripts): not for version control.\n*\n",
    )
}

/// The branch a feature's run works on: `consort/<feature-id>`, the id kept to the characters
/// a branch name may hold.
pub fn branch_name(feature_id: &str) -> String {
    let mut slug = String::new();
    for c in feature_id.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
            slug.push(c);
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug = slug.trim_matches('-');
    format!("consort/{}", if slug.is_empty() { "feature" } else { slug })
}

/// The top of the work tree whose directory `dir` lies at `prefix` (as [`GitRepo::prefix`]
/// gives it) in it.
pub(crate) fn without_prefix(dir: &Path, prefix: &str) -> PathBuf {
    let mut top = dir.to_path_buf();
    for _ in prefix.split('/').filter(|c| !c.is_empty()) {
        top.pop();
    }
    top
}

impl GitRepo {
    /// The repository `dir` lies in; None when it lies in none, or git is not installed.
    pub fn detect(dir: &Path) -> Option<GitRepo> {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["rev-parse", "--is-inside-work-tree", "--show-prefix"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        let mut lines = text.lines();
        if !out.status.success() || lines.next() != Some("true") {
            return None;
        }
        Some(GitRepo {
            dir: dir.to_path_buf(),
            prefix: lines.next().unwrap_or("").to_string(),
        })
    }

    /// Makes `dir` a git repository on branch `main` with one commit of everything in it
    /// (what `.gitignore` files leave out excepted), authored as `who`. For examples and
    /// tests that start from a fresh directory.
    pub fn init_with_commit(dir: &Path, who: &str, message: &str) -> Result<GitRepo, GitError> {
        let bare = GitRepo {
            dir: dir.to_path_buf(),
            prefix: String::new(),
        };
        bare.git(&["init", "-q", "-b", "main"], None)?;
        keep_state_out_of_git(dir).map_err(GitError::Start)?;
        bare.git(&["add", "-A"], None)?;
        let email = format!("{}@{EMAIL_DOMAIN}", who.to_lowercase().replace(' ', "-"));
        let ident = [
            ("GIT_AUTHOR_NAME", who),
            ("GIT_AUTHOR_EMAIL", email.as_str()),
            ("GIT_COMMITTER_NAME", who),
            ("GIT_COMMITTER_EMAIL", email.as_str()),
        ];
        bare.git_env(&["commit", "-q", "-m", message], &ident, None)?;
        Ok(bare)
    }

    /// Starts a new run's branch `consort/<feature-id>` from the current HEAD and switches
    /// to it. A tree with uncommitted changes (outside `.consort/`) is refused unless
    /// `allow_dirty`.
    ///
    /// `caches` names the cache directories a dirty tree may hold without counting.
    pub fn start(
        &self,
        feature_id: &str,
        allow_dirty: bool,
        caches: &consort_actors::TreeFilter,
    ) -> Result<String, GitError> {
        let branch = branch_name(feature_id);
        keep_state_out_of_git(&self.dir).map_err(GitError::Start)?;
        if !allow_dirty {
            let dirty = self.dirty(caches)?;
            if !dirty.is_empty() {
                return Err(GitError::Dirty { paths: dirty });
            }
        }
        if self.current_branch()? == branch {
            return Ok(branch);
        }
        if self.has_branch(feature_id)? {
            return Err(GitError::BranchExists(branch));
        }
        self.git(&["switch", "-q", "-c", &branch], None)?;
        Ok(branch)
    }

    /// Checks that a resumed run's repository is on the run's branch; its state directory is
    /// kept out of git as a new run's is (a run taken over on another machine has none yet).
    /// The lock files a git killed with the last run left on what is the feature's alone are
    /// removed first (see `locks.rs`): the caller holds the feature's run lock.
    pub fn check_resume(&self, feature_id: &str) -> Result<String, GitError> {
        self.recover_stale_locks(feature_id)?;
        let branch = branch_name(feature_id);
        let current = self.current_branch()?;
        if current != branch {
            return Err(GitError::WrongBranch {
                expected: branch,
                current,
            });
        }
        keep_state_out_of_git(&self.dir).map_err(|source| GitError::StateDir {
            path: self.dir.join(consort_actors::STATE_DIR),
            source,
        })?;
        Ok(branch)
    }

    /// The directory git runs in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The project's path inside the repository, with a trailing `/` (empty at the top).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The top of the repository's work tree: the project directory without its prefix.
    pub fn top(&self) -> PathBuf {
        without_prefix(&self.dir, &self.prefix)
    }

    /// Whether a run of `feature_id` has begun here: its branch exists.
    pub fn has_branch(&self, feature_id: &str) -> Result<bool, GitError> {
        let branch = branch_name(feature_id);
        Ok(!self
            .git(&["branch", "--list", &branch], None)?
            .trim()
            .is_empty())
    }

    /// The tip of a feature's run branch, if it has one.
    pub fn tip(&self, feature_id: &str) -> Option<String> {
        self.rev(&format!("refs/heads/{}", branch_name(feature_id)))
            .ok()
            .flatten()
    }

    /// The commit id of each of Consort's commits for `feature_id` on its run branch, by the
    /// key the ledger's commit is found by ([`StepCommit::key`]: the receipt's hash, or
    /// `design`); empty when the branch has none.
    pub fn commit_ids(&self, feature_id: &str) -> BTreeMap<String, String> {
        let Some(tip) = self.tip(feature_id) else {
            return BTreeMap::new();
        };
        let format = "--format=%H%x1f%(trailers:key=Consort-Feature,valueonly=true,separator=%x2C)%x1f%(trailers:key=Consort-Receipt,valueonly=true,separator=%x2C)%x1f%(trailers:key=Consort-Step,valueonly=true,separator=%x2C)%x1e";
        let out = match self.git(&["log", format, &tip], None) {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the run branch's commits; the report shows none");
                return BTreeMap::new();
            }
        };
        let mut ids = BTreeMap::new();
        for record in out.split('\u{1e}') {
            let fields: Vec<&str> = record
                .trim_start_matches('\n')
                .split('\u{1f}')
                .map(str::trim)
                .collect();
            let [sha, feature, receipt, step] = fields[..] else {
                continue;
            };
            if feature != feature_id {
                continue;
            }
            let key = match (receipt, step) {
                ("", "design") => "design".to_string(),
                ("", _) => continue,
                (r, _) => r.to_string(),
            };
            ids.entry(key).or_insert_with(|| sha.to_string());
        }
        ids
    }

    /// Paths with uncommitted changes (at most 10), leaving out what Consort never hashes nor
    /// commits: its own `.consort/`, and every cache directory `caches` skips (`target/`,
    /// `node_modules/`, `__pycache__/`, … at any depth) when no `.gitignore` does.
    fn dirty(&self, caches: &consort_actors::TreeFilter) -> Result<Vec<String>, GitError> {
        // `-z`: paths as they are, never quoted (git quotes a path with a space or a byte
        // above ASCII otherwise, and a quoted path matches no cache directory).
        let out = self.git(
            &["status", "--porcelain=v1", "-z", "--untracked-files=all"],
            None,
        )?;
        let state = format!("{}{}/", self.prefix, consort_actors::STATE_DIR);
        Ok(status_paths(&out)
            .into_iter()
            .filter(|p| !p.starts_with(&state))
            .filter(|p| {
                let inside = p.strip_prefix(self.prefix.as_str()).unwrap_or(p);
                let mut parts: Vec<&str> = inside.split('/').collect();
                // The last part is a file's name, or empty after a directory (`target/`).
                parts.pop();
                !parts.iter().any(|d| caches.skips(d))
            })
            .take(10)
            .map(str::to_string)
            .collect())
    }

    pub(crate) fn current_branch(&self) -> Result<String, GitError> {
        match self.git(&["symbolic-ref", "--short", "-q", "HEAD"], None) {
            Ok(name) => Ok(name.trim().to_string()),
            Err(_) => Ok("a detached HEAD".into()),
        }
    }

    /// Makes the commits `commits` calls for that the run's branch does not have yet, in
    /// order, on top of its tip; returns what it did.
    ///
    /// When the branch is checked out, the index is brought to the new tip for the paths the
    /// commits touched (the files on disk are the conductor's already); `refresh` does that
    /// for every path of the run's commits, as after a crash mid-sync.
    pub fn sync(&self, run: &RunHistory<'_>, refresh: bool) -> Result<SyncReport, GitError> {
        let _one = SYNC.lock().map_err(|_| GitError::Failed {
            args: "sync".into(),
            stderr: "an earlier sync panicked".into(),
        })?;
        let branch = branch_name(run.feature);
        let reference = format!("refs/heads/{branch}");
        let mut tip = self.rev(&reference)?;
        let recorded = self.recorded(tip.as_deref(), run.feature, run.commits.len())?;
        let mut made = 0;
        let mut paths = BTreeSet::new();
        for commit in run.commits {
            if recorded.contains(&commit.key()) {
                if refresh {
                    let files = run.files_of(commit).into_iter();
                    paths.extend(files.map(|(p, _)| format!("{}{p}", self.prefix)));
                }
                continue;
            }
            let next = self.commit(commit, run, tip.as_deref(), &mut paths)?;
            let old = tip.clone().unwrap_or_default();
            self.git(&["update-ref", &reference, &next, &old], None)?;
            tip = Some(next);
            made += 1;
        }
        if !paths.is_empty() && self.current_branch()? == branch {
            let mut args = vec!["reset", "-q", "--"];
            args.extend(paths.iter().map(String::as_str));
            self.git(&args, None)?;
            if refresh {
                self.check_out_missing(&paths)?;
            }
        }
        Ok(SyncReport {
            branch,
            made,
            total: run.commits.len(),
            head: tip,
        })
    }

    /// Writes each of `paths` that the tip holds and the disk lacks (commits this sync made of
    /// work done on another machine, which a taken-over run resumes from); a file on disk is
    /// never overwritten.
    fn check_out_missing(&self, paths: &BTreeSet<String>) -> Result<(), GitError> {
        let top = self.top();
        let missing: Vec<&str> = paths
            .iter()
            .filter(|p| !top.join(p).exists())
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let mut args = vec!["ls-tree", "-r", "--name-only", "-z", "HEAD", "--"];
        args.extend(&missing);
        let held = self.git(&args, None)?;
        let mut checkout = vec!["checkout", "-q", "HEAD", "--"];
        checkout.extend(held.split('\0').filter(|p| !p.is_empty()));
        if checkout.len() > 4 {
            self.git(&checkout, None)?;
        }
        Ok(())
    }

    /// The keys of Consort's commits for `feature` at the tip of the branch (newest first,
    /// up to `limit` + 1 commits).
    fn recorded(
        &self,
        tip: Option<&str>,
        feature: &str,
        limit: usize,
    ) -> Result<BTreeSet<String>, GitError> {
        let Some(tip) = tip else {
            return Ok(BTreeSet::new());
        };
        let format = "--format=%(trailers:key=Consort-Feature,valueonly=true,separator=%x2C)%x1f%(trailers:key=Consort-Receipt,valueonly=true,separator=%x2C)%x1f%(trailers:key=Consort-Step,valueonly=true,separator=%x2C)%x1e";
        let n = format!("-n{}", limit + 1);
        let out = self.git(&["log", format, &n, tip], None)?;
        let mut keys = BTreeSet::new();
        for record in out.split('\u{1e}') {
            let mut fields = record.trim_start_matches('\n').split('\u{1f}');
            let (Some(f), Some(receipt), Some(step)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if f.trim() != feature {
                break;
            }
            match receipt.trim() {
                "" if step.trim() == "design" => keys.insert("design".to_string()),
                "" => false,
                r => keys.insert(r.to_string()),
            };
        }
        Ok(keys)
    }

    /// The commit `reference` names, None when it names none (a branch without a commit).
    pub fn rev(&self, reference: &str) -> Result<Option<String>, GitError> {
        match self.git(&["rev-parse", "-q", "--verify", reference], None) {
            Ok(sha) => Ok(Some(sha.trim().to_string())),
            Err(_) => Ok(None),
        }
    }

    /// Builds one commit in a private index on top of `parent`; returns its id.
    fn commit(
        &self,
        commit: &StepCommit,
        run: &RunHistory<'_>,
        parent: Option<&str>,
        paths: &mut BTreeSet<String>,
    ) -> Result<String, GitError> {
        let state = self.dir.join(consort_actors::STATE_DIR);
        // A lane resumed on another machine has no state directory yet.
        std::fs::create_dir_all(&state).map_err(|source| GitError::StateDir {
            path: state.clone(),
            source,
        })?;
        let index = state.join("git-index");
        // Only a sync uses this index, one at a time under the run lock: a lock file left by
        // a killed sync is stale.
        let _ = std::fs::remove_file(index.with_extension("lock"));
        let index = index.to_string_lossy().into_owned();
        let env = [("GIT_INDEX_FILE", index.as_str())];
        match parent {
            Some(p) => self.git_env(&["read-tree", p], &env, None)?,
            None => self.git_env(&["read-tree", "--empty"], &env, None)?,
        };
        for (path, bytes) in run.files_of(commit) {
            let full = format!("{}{path}", self.prefix);
            match bytes {
                Some(bytes) => {
                    let blob =
                        self.git_env(&["hash-object", "-w", "--stdin"], &env, Some(&bytes))?;
                    let mode = self.mode_of(&full, &env)?;
                    let info = format!("{mode},{},{full}", blob.trim());
                    self.git_env(&["update-index", "--add", "--cacheinfo", &info], &env, None)?;
                }
                None => {
                    self.git_env(&["update-index", "--force-remove", "--", &full], &env, None)?;
                }
            }
            paths.insert(full);
        }
        let tree = self.git_env(&["write-tree"], &env, None)?;
        let message = run.message(commit);
        let mut args = vec!["commit-tree", tree.trim()];
        if let Some(p) = parent {
            args.extend(["-p", p]);
        }
        args.extend(["-F", "-"]);
        let who = format!("Consort {}", role_title(commit.role));
        let email = format!("{}@{EMAIL_DOMAIN}", commit.role.as_str());
        let ident = [
            ("GIT_AUTHOR_NAME", who.as_str()),
            ("GIT_AUTHOR_EMAIL", email.as_str()),
            CONDUCTOR_NAME,
            CONDUCTOR_EMAIL,
        ];
        let sha = self.git_env(&args, &ident, Some(message.as_bytes()))?;
        Ok(sha.trim().to_string())
    }

    /// The mode a file keeps in the private index (new files: a regular file).
    fn mode_of(&self, path: &str, env: &[(&str, &str)]) -> Result<String, GitError> {
        let out = self.git_env(&["ls-files", "-s", "--", path], env, None)?;
        Ok(match out.split_whitespace().next() {
            Some(mode @ ("100644" | "100755")) => mode.to_string(),
            _ => "100644".into(),
        })
    }

    pub(crate) fn git(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<String, GitError> {
        self.git_env(args, &[], stdin)
    }

    pub(crate) fn git_env(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
        stdin: Option<&[u8]>,
    ) -> Result<String, GitError> {
        self.git_within(args, env, stdin, None)
    }

    /// [`GitRepo::git_env`], with git killed when it has not ended within `limit` (a remote
    /// that does not answer, an ssh waiting for what it will never get).
    pub(crate) fn git_within(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
        stdin: Option<&[u8]>,
        limit: Option<std::time::Duration>,
    ) -> Result<String, GitError> {
        let mut cmd = Command::new("git");
        cmd.arg("-C").arg(&self.dir).args(args);
        if limit.is_some() {
            // Its own process group, so that a timeout stops what git started too (ssh).
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(GitError::Start)?;
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(bytes).map_err(GitError::Start)?;
        }
        let out = match limit {
            None => child.wait_with_output().map_err(GitError::Start)?,
            Some(limit) => waited(child, limit).map_err(|e| match e {
                Waited::Io(e) => GitError::Start(e),
                Waited::Out => GitError::TimedOut {
                    args: without_credentials(&args.join(" ")),
                    secs: limit.as_secs(),
                },
            })?,
        };
        if !out.status.success() {
            return Err(GitError::Failed {
                args: without_credentials(&args.join(" ")),
                stderr: without_credentials(String::from_utf8_lossy(&out.stderr).trim()),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

enum Waited {
    Io(std::io::Error),
    Out,
}

/// `child`'s output, its pipes read on threads of their own while it runs; killed (and its
/// output dropped) when it runs past `limit`.
fn waited(
    mut child: std::process::Child,
    limit: std::time::Duration,
) -> Result<std::process::Output, Waited> {
    use std::io::Read;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(Waited::Io)? {
            break status;
        }
        if started.elapsed() >= limit {
            let group = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = child.kill();
            let _ = child.wait();
            return Err(Waited::Out);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// A role's name as a commit author's: `Navigator`, `Driver`, `DBA`, …
/// `text` with the user information of every URL in it (`https://user:token@host`) replaced
/// by `***`: a remote's credentials stay in git's configuration, never in a message.
pub(crate) fn without_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (before, after) = rest.split_at(at + 3);
        out.push_str(before);
        let authority_end = after
            .find(|c: char| c == '/' || c.is_whitespace() || c == '\'' || c == '"')
            .unwrap_or(after.len());
        match after[..authority_end].rfind('@') {
            Some(userinfo_end) => {
                out.push_str("***");
                rest = &after[userinfo_end..];
            }
            None => rest = after,
        }
    }
    out.push_str(rest);
    out
}

fn role_title(role: consort_actors::Role) -> &'static str {
    use consort_actors::Role;
    match role {
        Role::ProductOwner => "Product Owner",
        Role::SpecAuthor => "Spec Author",
        Role::ArchitectReviewer => "Architect Reviewer",
        Role::Dba => "DBA",
        Role::TestStrategist => "Test Strategist",
        Role::UxDesigner => "UX Designer",
        Role::Navigator => "Navigator",
        Role::Driver => "Driver",
    }
}

/// A run's history and what its commits need: the feature, the state (for test titles and
/// the plan), the work tree (to find the file a path reaches) and where migrations go.
#[derive(Debug)]
pub struct RunHistory<'a> {
    /// The feature id.
    pub feature: &'a str,
    /// The commits the ledger calls for.
    pub commits: &'a [StepCommit],
    /// The replayed state.
    pub state: &'a State,
    /// The work tree.
    pub work: &'a WorkTree,
    /// Where the design's migrations are written.
    pub migrations: Option<&'a MigrationFiles>,
}

impl RunHistory<'_> {
    /// Each path a commit writes (with its bytes) or removes (None), relative to the work
    /// tree as physically resolved, in order.
    fn files_of(&self, commit: &StepCommit) -> Vec<(String, Option<Vec<u8>>)> {
        if commit.kind == CommitKind::Design {
            let (Some(files), Some(plan)) = (self.migrations, self.state.schema.as_deref()) else {
                return Vec::new();
            };
            return files
                .planned(plan)
                .into_iter()
                .map(|(p, m)| (p, Some(m.sql.clone().into_bytes())))
                .collect();
        }
        commit
            .changes
            .iter()
            .map(|c| {
                let path = self
                    .work
                    .resolve(c.path())
                    .unwrap_or_else(|_| c.path().to_string());
                let bytes = match c {
                    FileChange::Delete { .. } => None,
                    other => other.bytes().map(|b| b.into_owned()),
                };
                (path, bytes)
            })
            .collect()
    }

    /// The commit message: a subject, a paragraph, the trailers.
    fn message(&self, commit: &StepCommit) -> String {
        let (subject, body) = match (&commit.test, commit.kind) {
            (None, _) | (_, CommitKind::Design) => self.design_text(),
            (Some(test), kind) => self.step_text(commit, test, kind),
        };
        let mut m = format!("{subject}\n\n{body}\n");
        if !commit.summaries.is_empty() {
            m.push('\n');
            for s in &commit.summaries {
                m.push_str(&format!("- {s}\n"));
            }
        }
        m.push_str(&format!(
            "\nConsort-Feature: {}\nConsort-Step: {}\n",
            self.feature, commit.step
        ));
        if let Some(r) = &commit.receipt {
            m.push_str(&format!(
                "Consort-Receipt: {}\nConsort-Branch: {}\n",
                commit.key(),
                r.branch_id
            ));
        }
        m.push_str(&format!("Consort-Design: {}\n", commit.design.to_hex()));
        m
    }

    fn design_text(&self) -> (String, String) {
        let plan: Option<&SchemaPlan> = self.state.schema.as_deref();
        let files = match (self.migrations, plan) {
            (Some(f), Some(p)) => f.planned(p).into_iter().map(|(p, _)| p).collect(),
            _ => Vec::new(),
        };
        let subject = format!("design approved: {} migration file(s)", files.len());
        let mut body = String::from(
            "The frozen design (design.json in the feature's record under .consort/) was approved at the design gate; its migrations are files from now on:",
        );
        for f in &files {
            body.push_str(&format!("\n- {f}"));
        }
        if files.is_empty() {
            body.push_str("\n(none)");
        }
        (subject, body)
    }

    fn step_text(&self, commit: &StepCommit, test: &str, kind: CommitKind) -> (String, String) {
        let entry = self
            .state
            .test_list
            .as_ref()
            .and_then(|l| l.entries.iter().find(|e| e.id == test));
        let title = entry.map_or(String::new(), |e| format!(": {}", e.description));
        let subject = format!("{} {test}{title}", kind.label());
        let (passed, failed) = commit.receipt.as_ref().map_or((0, 0), |r| {
            let passed = r
                .outcomes
                .iter()
                .filter(|o| o.status == consort_actors::TestStatus::Passed)
                .count();
            (passed, r.outcomes.len() - passed)
        });
        let branch = commit.receipt.as_ref().map_or("", |r| r.branch_id.as_str());
        let body = match kind {
            CommitKind::Red => format!(
                "The Navigator's failing test for {test}; the run on database branch {branch} failed it as required ({passed} passed, {failed} failed)."
            ),
            CommitKind::Green => format!(
                "The Driver's code for {test}; every test passed on database branch {branch} ({passed} passed)."
            ),
            _ => format!(
                "The Driver's restructuring after {test}; every test still passed on database branch {branch} ({passed} passed)."
            ),
        };
        (subject, body)
    }
}

/// Two observers, both told of every append; either may stop the conductor.
#[derive(Debug)]
pub struct BothObservers(
    /// Told first.
    pub Arc<dyn consort_actors::AppendObserver>,
    /// Told second.
    pub Arc<dyn consort_actors::AppendObserver>,
);

impl consort_actors::AppendObserver for BothObservers {
    fn appended(&self, index: u64) -> std::ops::ControlFlow<()> {
        self.0.appended(index)?;
        self.1.appended(index)
    }
}

/// The paths of `git status --porcelain=v1 -z`: each entry's, a rename's or copy's source
/// (the field after it) left out.
fn status_paths(out: &str) -> Vec<&str> {
    let mut fields = out.split('\0');
    let mut paths = Vec::new();
    while let Some(entry) = fields.next() {
        let Some(path) = entry.get(3..).filter(|p| !p.is_empty()) else {
            continue;
        };
        if entry.starts_with(['R', 'C']) {
            fields.next();
        }
        paths.push(path);
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::{GitRepo, status_paths, without_credentials};

    #[test]
    fn status_paths_are_read_unquoted_with_renames_once() {
        let out = "?? .venv/lib/launcher manifest.xml\0R  new name.py\0old name.py\0 M src/é.py\0";
        assert_eq!(
            status_paths(out),
            [".venv/lib/launcher manifest.xml", "new name.py", "src/é.py"]
        );
    }

    #[test]
    fn a_cache_with_spaces_or_non_ascii_in_its_names_is_no_uncommitted_change() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.py"), "x = 1\n").expect("write");
        let repo = GitRepo::init_with_commit(dir.path(), "T", "first").expect("repo");
        consort_testkit::disk::write_tree(
            dir.path(),
            &[
                (".venv/lib/launcher manifest.xml", "cache"),
                ("target/débug/out.txt", "cache"),
                ("node_modules/a b/index.js", "cache"),
            ],
        );
        let filter = consort_actors::TreeFilter::default();
        assert_eq!(repo.dirty(&filter).expect("status"), Vec::<String>::new());
        std::fs::write(dir.path().join("my notes é.md"), "mine").expect("write");
        assert_eq!(repo.dirty(&filter).expect("status"), ["my notes é.md"]);
    }

    #[test]
    fn a_remotes_credentials_never_reach_a_message() {
        assert_eq!(
            without_credentials(
                "fatal: unable to access 'https://ada:ghp_s3cret@example.com/shop.git/': 403"
            ),
            "fatal: unable to access 'https://***@example.com/shop.git/': 403"
        );
        assert_eq!(
            without_credentials("push https://tok@h/x and ssh://git@h:22/y"),
            "push https://***@h/x and ssh://***@h:22/y"
        );
        let plain = "fatal: 'origin' does not appear to be a git repository";
        assert_eq!(without_credentials(plain), plain);
        assert_eq!(
            without_credentials("file:///tmp/remote.git"),
            "file:///tmp/remote.git"
        );
    }
}
