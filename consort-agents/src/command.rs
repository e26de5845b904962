//! The external-command backend: a program (for example a coding CLI) plays the role.
//!
//! For each assignment the agent materialises `assignment.inputs.files` into a fresh scratch
//! directory, runs the program there with the assignment as JSON on stdin, and reads the
//! answer:
//! - the artifact as JSON on stdout (`{"kind": …, "body": …}` or the bare body), or
//! - for change-set steps, when stdout holds no artifact, the difference between the scratch
//!   directory after the run and the files it was given, as a [`ChangeSet`].
//!
//! Limits: a time limit that kills the whole process group, a cap on stdout and stderr, and an
//! environment reduced to an allow-list plus `CONSORT_STEP`, `CONSORT_ROLE`,
//! `CONSORT_ATTEMPT` and `CONSORT_ANSWER_WITH`.
//!
//! **The scratch copy is a convention, not a sandbox**: the program runs with this process's
//! privileges. What is enforced is that nothing it produces can name a path outside the work
//! tree: a symlink in the scratch copy that points out, an absolute path or a `..` in a stdout
//! change set are refused with [`CommandError::PathEscape`]. The conductor then applies the
//! change set under its usual rules.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use consort_actors::TreeFilter;
use consort_actors::normalise_relative;
use consort_actors::{
    AgentFailure, Artifact, ArtifactKind, Assignment, ChangeSet, FileChange, Role, Usage,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::agent::{ActFuture, Agent, AgentOutput};
use crate::openai::extract_json;
use crate::validate::parse_artifact;

/// Why an external agent run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// A path in the assignment's files is not a plain relative path.
    #[error("input file {path:?} refused: {reason}")]
    InputPath {
        /// The path.
        path: String,
        /// Why.
        reason: String,
    },
    /// Preparing or reading the scratch copy failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The program could not be started.
    #[error("cannot start {program:?}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The program ran past its time limit and was killed with its process group.
    #[error("{program:?} ran past its time limit of {limit_ms} ms and was killed")]
    Timeout {
        /// The program.
        program: String,
        /// The limit.
        limit_ms: u64,
    },
    /// The program wrote more than the cap on stdout.
    #[error("{program:?} wrote more than {cap} bytes on stdout")]
    OutputTooLarge {
        /// The program.
        program: String,
        /// The cap.
        cap: usize,
    },
    /// The program exited unsuccessfully.
    #[error("{program:?} failed ({status}); stderr: {stderr}")]
    Exit {
        /// The program.
        program: String,
        /// The exit code or signal.
        status: String,
        /// The start of its stderr.
        stderr: String,
    },
    /// The program's output names a path outside its scratch copy (a symlink pointing out, an
    /// absolute path, a `..`).
    #[error("path {path:?} escapes the scratch copy: {reason}")]
    PathEscape {
        /// The path.
        path: String,
        /// How.
        reason: String,
    },
    /// Something in the scratch copy cannot be expressed as a change (a symlink, a fifo, a
    /// file that is not UTF-8 text).
    #[error("{path:?} cannot be part of a change set: {reason}")]
    Unrepresentable {
        /// The path.
        path: String,
        /// Why.
        reason: String,
    },
    /// The program's stdout holds no valid artifact for this step.
    #[error("{program:?} printed no valid artifact: {detail}")]
    BadOutput {
        /// The program.
        program: String,
        /// What is wrong.
        detail: String,
    },
}

impl CommandError {
    /// The failure the role actor reports for this error.
    pub fn to_failure(&self) -> AgentFailure {
        match self {
            CommandError::Timeout { limit_ms, .. } => AgentFailure::Timeout {
                secs: limit_ms.div_ceil(1000),
            },
            other => AgentFailure::CommandFailed {
                detail: other.to_string(),
            },
        }
    }
}

/// How to run the program.
///
/// Deserialisable, so it can sit in a configuration file:
///
/// ```toml
/// program = "my-coding-agent"
/// args = ["--headless"]
/// timeout_ms = 900000
/// env_allow = ["PATH", "HOME", "MY_AGENT_TOKEN"]
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommandConfig {
    /// The program: a name looked up in `PATH`, or a path (a relative path with a slash is
    /// taken relative to the current directory when the agent is built).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// The time limit of one run, in milliseconds. Default 600 000 (10 min).
    pub timeout_ms: u64,
    /// The most bytes read from stdout (more is an error) and kept from stderr. Default 4 MiB.
    pub output_cap_bytes: usize,
    /// The environment variables passed through from this process, by name. Default `PATH`,
    /// `HOME`, `LANG`, `LC_ALL`, `TMPDIR`.
    pub env_allow: Vec<String>,
    /// Fixed variables set for the program.
    pub env_set: BTreeMap<String, String>,
    /// Extra cache directory names (on top of the defaults of [`TreeFilter`]: `__pycache__`,
    /// `target`, `node_modules`, …) whose contents in the scratch copy are never part of the
    /// diff, at any depth. `consort` adds the project's `[paths] caches` here.
    pub caches: Vec<String>,
}

impl Default for CommandConfig {
    fn default() -> Self {
        CommandConfig {
            program: String::new(),
            args: Vec::new(),
            timeout_ms: 600_000,
            output_cap_bytes: 4 << 20,
            env_allow: ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"]
                .map(String::from)
                .to_vec(),
            env_set: BTreeMap::new(),
            caches: Vec::new(),
        }
    }
}

impl CommandConfig {
    /// A configuration running `program` with `args`, other fields default.
    pub fn new<S: Into<String>>(
        program: impl Into<String>,
        args: impl IntoIterator<Item = S>,
    ) -> Self {
        CommandConfig {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            ..CommandConfig::default()
        }
    }

    /// The same configuration with another time limit.
    pub fn with_timeout(mut self, limit: Duration) -> Self {
        self.timeout_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        self
    }
}

/// An [`Agent`] that runs an external program in a scratch copy of the work tree.
#[derive(Debug, Clone)]
pub struct ExternalCommandAgent {
    role: Role,
    config: CommandConfig,
}

impl ExternalCommandAgent {
    /// An agent for `role` running `config.program`.
    pub fn new(role: Role, mut config: CommandConfig) -> Self {
        let p = Path::new(&config.program);
        if p.is_relative()
            && config.program.contains('/')
            && let Ok(abs) = std::path::absolute(p)
        {
            config.program = abs.display().to_string();
        }
        ExternalCommandAgent { role, config }
    }

    /// The role it plays.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Runs the program for one assignment.
    pub async fn run(&self, assignment: &Assignment) -> Result<AgentOutput, CommandError> {
        let started = Instant::now();
        let scratch = tempfile::Builder::new()
            .prefix("consort-scratch-")
            .tempdir()
            .map_err(|source| CommandError::Io {
                op: "create scratch directory",
                path: std::env::temp_dir().display().to_string(),
                source,
            })?;
        let root = scratch
            .path()
            .canonicalize()
            .map_err(|source| CommandError::Io {
                op: "resolve",
                path: scratch.path().display().to_string(),
                source,
            })?;
        let given = materialise(&root, &assignment.inputs.files)?;
        let stdout = self.execute(&root, assignment).await?;
        let expected = assignment.expected_kind();
        let program = self.config.program.clone();

        let from_stdout = extract_json(&stdout)
            .ok()
            .and_then(|v| parse_artifact(expected, v).ok());
        let artifact = match (from_stdout, expected) {
            (Some(Artifact::ChangeSet(cs)), _) => {
                for change in &cs.changes {
                    normalise_relative(change.path()).map_err(|e| CommandError::PathEscape {
                        path: change.path().to_string(),
                        reason: e.to_string(),
                    })?;
                }
                Artifact::ChangeSet(cs)
            }
            (Some(other), _) => other,
            (None, ArtifactKind::ChangeSet) => {
                let root2 = root.clone();
                let filter = TreeFilter::new(&self.config.caches);
                let changes = tokio::task::spawn_blocking(move || diff(&root2, &given, &filter))
                    .await
                    .map_err(|e| CommandError::Io {
                        op: "compare scratch copy",
                        path: root.display().to_string(),
                        source: io::Error::other(e.to_string()),
                    })??;
                Artifact::ChangeSet(ChangeSet {
                    summary: format!("{} by {}", assignment.step, program_name(&program)),
                    changes,
                })
            }
            (None, _) => {
                let detail = match extract_json(&stdout) {
                    Err(e) => e,
                    Ok(v) => parse_artifact(expected, v)
                        .err()
                        .unwrap_or_else(|| "unreadable".into()),
                };
                return Err(CommandError::BadOutput { program, detail });
            }
        };
        drop(scratch);
        Ok(AgentOutput::new(artifact).with_usage(Usage {
            calls: 1,
            wall_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            ..Usage::default()
        }))
    }

    async fn execute(&self, root: &Path, assignment: &Assignment) -> Result<String, CommandError> {
        let cfg = &self.config;
        let program = cfg.program.clone();
        let mut cmd = tokio::process::Command::new(&cfg.program);
        cmd.args(&cfg.args)
            .current_dir(root)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        for name in &cfg.env_allow {
            if let Some(v) = std::env::var_os(name) {
                cmd.env(name, v);
            }
        }
        cmd.envs(&cfg.env_set)
            .env("CONSORT_STEP", assignment.step.to_string())
            .env("CONSORT_ROLE", self.role.as_str())
            .env("CONSORT_ATTEMPT", assignment.attempt.to_string())
            .env(
                "CONSORT_ANSWER_WITH",
                assignment.expected_kind().to_string(),
            );
        let mut child = cmd.spawn().map_err(|source| CommandError::Spawn {
            program: program.clone(),
            source,
        })?;
        let mut group = GroupGuard(child.id().and_then(|id| i32::try_from(id).ok()));
        tracing::debug!(role = %self.role, %program, step = %assignment.step, "external agent started");

        let input = serde_json::to_vec(assignment).unwrap_or_default();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let cap = cfg.output_cap_bytes;
        let work = async {
            let feed = async {
                if let Some(mut s) = stdin {
                    // A program that does not read its stdin closes the pipe: not an error.
                    let _ = s.write_all(&input).await;
                    let _ = s.shutdown().await;
                }
            };
            let (_, out, err, status) = tokio::join!(
                feed,
                read_capped(stdout, cap, true),
                read_capped(stderr, cap, false),
                child.wait()
            );
            (out, err, status)
        };
        let limit = Duration::from_millis(cfg.timeout_ms);
        let Ok((out, err, status)) = tokio::time::timeout(limit, work).await else {
            group.kill();
            return Err(CommandError::Timeout {
                program,
                limit_ms: cfg.timeout_ms,
            });
        };
        // Leftover background children of the program die with their group.
        group.kill();
        let io_err = |op: &'static str| {
            let path = program.clone();
            move |source| CommandError::Io { op, path, source }
        };
        let status = status.map_err(io_err("wait for"))?;
        let (out, overflow) = out.map_err(io_err("read stdout of"))?;
        let (err, _) = err.map_err(io_err("read stderr of"))?;
        if overflow {
            return Err(CommandError::OutputTooLarge { program, cap });
        }
        if !status.success() {
            use std::os::unix::process::ExitStatusExt;
            let status = match (status.code(), status.signal()) {
                (Some(c), _) => format!("exit code {c}"),
                (None, Some(s)) => format!("killed by signal {s}"),
                _ => "unknown status".into(),
            };
            return Err(CommandError::Exit {
                program,
                status,
                stderr: excerpt(&String::from_utf8_lossy(&err)),
            });
        }
        String::from_utf8(out).map_err(|_| CommandError::BadOutput {
            program,
            detail: "stdout is not UTF-8 text".into(),
        })
    }
}

fn program_name(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

fn excerpt(s: &str) -> String {
    crate::validate::clip(s.trim(), 2000)
}

/// Kills the program's process group (its id is the leader's pid) when asked or dropped.
struct GroupGuard(Option<i32>);

impl GroupGuard {
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // ESRCH (already gone) is the normal case after a clean exit.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads a stream up to `cap` bytes. With `stop_at_cap`, stops reading past the cap (the
/// writer then gets a broken pipe); otherwise drains and discards the rest. Returns the bytes
/// and whether the cap was passed.
async fn read_capped<R: AsyncRead + Unpin>(
    stream: Option<R>,
    cap: usize,
    stop_at_cap: bool,
) -> io::Result<(Vec<u8>, bool)> {
    let Some(mut r) = stream else {
        return Ok((Vec::new(), false));
    };
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    let mut overflow = false;
    loop {
        let n = r.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        let room = cap.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..n.min(room)]);
        if n > room {
            overflow = true;
            if stop_at_cap {
                break;
            }
        }
    }
    Ok((buf, overflow))
}

/// Writes the given files into the scratch root; returns them by normalised path.
fn materialise(
    root: &Path,
    files: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, CommandError> {
    let mut given = BTreeMap::new();
    for (path, content) in files {
        let norm = normalise_relative(path).map_err(|e| CommandError::InputPath {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let full = root.join(&norm);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(|source| CommandError::Io {
                op: "create directory",
                path: norm.clone(),
                source,
            })?;
        }
        std::fs::write(&full, content).map_err(|source| CommandError::Io {
            op: "write",
            path: norm.clone(),
            source,
        })?;
        given.insert(norm, content.clone());
    }
    Ok(given)
}

/// The changes that turn `given` into what the scratch copy holds now (outside the directories
/// `filter` skips: what the program's tools cache there is not its answer).
fn diff(
    root: &Path,
    given: &BTreeMap<String, String>,
    filter: &TreeFilter,
) -> Result<Vec<FileChange>, CommandError> {
    let mut now = BTreeMap::new();
    walk(root, root, filter, &mut now)?;
    let mut changes = Vec::new();
    for (path, content) in &now {
        if given.get(path) != Some(content) {
            changes.push(FileChange::Write {
                path: path.clone(),
                content: content.clone(),
            });
        }
    }
    for path in given.keys() {
        if !now.contains_key(path) {
            changes.push(FileChange::Delete { path: path.clone() });
        }
    }
    Ok(changes)
}

fn walk(
    root: &Path,
    dir: &Path,
    filter: &TreeFilter,
    out: &mut BTreeMap<String, String>,
) -> Result<(), CommandError> {
    let io_err = |op: &'static str, p: &Path| {
        let path = p.display().to_string();
        move |source| CommandError::Io { op, path, source }
    };
    let entries = std::fs::read_dir(dir).map_err(io_err("list", dir))?;
    let mut paths: Vec<PathBuf> = Vec::new();
    for e in entries {
        paths.push(e.map_err(io_err("list", dir))?.path());
    }
    paths.sort();
    for full in paths {
        let rel = full
            .strip_prefix(root)
            .map(|r| r.to_string_lossy().replace('\\', "/"))
            .unwrap_or_else(|_| full.display().to_string());
        let meta = std::fs::symlink_metadata(&full).map_err(io_err("inspect", &full))?;
        let ft = meta.file_type();
        // A cache directory (a virtualenv's links included) is skipped whole, at any depth.
        let name = full.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if ft.is_dir() && filter.skips(name) {
            continue;
        }
        if ft.is_symlink() {
            let target = std::fs::read_link(&full).map_err(io_err("read link", &full))?;
            let resolved = full.parent().unwrap_or(root).join(&target);
            let inside = resolved
                .canonicalize()
                .map(|t| t.starts_with(root))
                .unwrap_or_else(|_| !target.is_absolute() && lexically_inside(&rel, &target));
            return Err(if inside {
                CommandError::Unrepresentable {
                    path: rel,
                    reason: "it is a symbolic link".into(),
                }
            } else {
                CommandError::PathEscape {
                    path: rel,
                    reason: format!("it is a symbolic link to {}", target.display()),
                }
            });
        }
        if ft.is_dir() {
            walk(root, &full, filter, out)?;
        } else if ft.is_file() {
            let bytes = std::fs::read(&full).map_err(io_err("read", &full))?;
            let text = String::from_utf8(bytes).map_err(|_| CommandError::Unrepresentable {
                path: rel.clone(),
                reason: "it is not UTF-8 text".into(),
            })?;
            out.insert(rel, text);
        } else {
            return Err(CommandError::Unrepresentable {
                path: rel,
                reason: "it is not a regular file".into(),
            });
        }
    }
    Ok(())
}

/// Whether a relative link target, followed from `rel`'s directory, stays inside the root
/// (for dangling links, which cannot be resolved on disk).
fn lexically_inside(rel: &str, target: &Path) -> bool {
    let mut depth: i64 = rel.matches('/').count() as i64;
    for comp in target.components() {
        match comp {
            std::path::Component::ParentDir => depth -= 1,
            std::path::Component::Normal(_) => depth += 1,
            std::path::Component::CurDir => {}
            _ => return false,
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

impl Agent for ExternalCommandAgent {
    fn act<'a>(&'a self, assignment: &'a Assignment) -> ActFuture<'a> {
        Box::pin(async move {
            self.run(assignment).await.map_err(|e| {
                tracing::warn!(role = %self.role, error = %e, "external agent failed");
                e.to_failure()
            })
        })
    }

    fn describe(&self) -> String {
        format!("command({})", program_name(&self.config.program))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dangling_links_are_judged_lexically() {
        assert!(lexically_inside("a/link", Path::new("../b")));
        assert!(!lexically_inside("link", Path::new("../b")));
        assert!(!lexically_inside("a/link", Path::new("../../b")));
    }
}
