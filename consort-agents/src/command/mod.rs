//! The external-command backend: a program (for example a coding CLI) plays the role.
//!
//! For each assignment the agent materialises `assignment.inputs.files` into a fresh scratch
//! directory and runs the program there. A plain command gets the assignment as JSON on stdin,
//! with the role's prompt (`role_prompt`), the artifact kind (`answer_with`) and the rendered
//! prompt text (`prompt`) beside its fields. A [`Preset`] (`claude-code`, `codex`, `aider`)
//! runs a coding-agent CLI with its documented non-interactive command line instead, the
//! prompt of [`cli_prompt`] (role prompt, how to answer, the assignment) as its argument and
//! nothing on stdin. The answer is:
//! - the artifact as JSON in the final message (stdout for a plain command, the CLI's final
//!   message for a preset; `{"kind": …, "body": …}` or the bare body), or
//! - for change-set steps, when the final message holds no change set, the difference between
//!   the scratch directory after the run and the files it was given, as a [`ChangeSet`].
//!
//! Limits: a time limit that kills the whole process group, a cap on stdout and stderr, and an
//! environment reduced to `pass_env` (by name, from this process), `env_set` (fixed values),
//! and `CONSORT_STEP`, `CONSORT_ROLE`, `CONSORT_ATTEMPT` and `CONSORT_ANSWER_WITH`; nothing
//! else of this process's environment (another role's API key, say) reaches the program.
//! With a transcript directory (`consort` sets `.consort/transcripts/`), every run leaves a
//! transcript there — the command line, the prompt, how it ended, its stderr and stdout —
//! whether it succeeded or not.
//!
//! **The scratch copy is a convention, not a sandbox**: the program runs with this process's
//! privileges. What is enforced is that nothing it produces can name a path outside the work
//! tree: a symlink in the scratch copy that points out, an absolute path or a `..` in a stdout
//! change set are refused with [`CommandError::PathEscape`]. The conductor then applies the
//! change set under its usual rules (the role's path rules included).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use consort_actors::TreeFilter;
use consort_actors::normalise_relative;
use consort_actors::{
    AgentFailure, Artifact, ArtifactKind, Assignment, ChangeSet, FileChange, PathIoError, Role,
    Usage,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::agent::{ActFuture, Agent, AgentOutput};
use crate::openai::extract_json;
use crate::validate::parse_artifact;

mod presets;
mod prompt;
mod transcript;

pub use presets::{FILES_PLACEHOLDER, PROMPT_PLACEHOLDER, Preset};
pub use prompt::cli_prompt;
pub(crate) use transcript::transcript_stem;
pub use transcript::{TRANSCRIPT_STREAM_CAP, transcript_file_name};

use presets::{FinalMessage, OutputFormat, ReadError, final_message};

/// Why an external agent run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// A path in the assignment's files is not a plain relative path.
    #[error("input file `{path}` refused: {reason}")]
    InputPath {
        /// The path.
        path: String,
        /// Why.
        reason: String,
    },
    /// Preparing or reading the scratch copy failed.
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// The program could not be started.
    #[error("cannot start `{program}`")]
    Spawn {
        /// The program.
        program: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The program ran past its time limit and was killed with its process group.
    #[error("`{program}` ran past its time limit of {limit_ms} ms and was killed")]
    Timeout {
        /// The program.
        program: String,
        /// The limit.
        limit_ms: u64,
    },
    /// The program wrote more than the cap on stdout.
    #[error("`{program}` wrote more than {cap} bytes on stdout")]
    OutputTooLarge {
        /// The program.
        program: String,
        /// The cap.
        cap: usize,
    },
    /// The program exited unsuccessfully.
    #[error("`{program}` failed ({status}); stderr: {stderr}")]
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
    #[error("path `{path}` escapes the scratch copy: {reason}")]
    PathEscape {
        /// The path.
        path: String,
        /// How.
        reason: String,
    },
    /// Something in the scratch copy cannot be expressed as a change (a symlink, a fifo, a
    /// file that is not UTF-8 text).
    #[error("`{path}` cannot be part of a change set: {reason}")]
    Unrepresentable {
        /// The path.
        path: String,
        /// Why.
        reason: String,
    },
    /// The program's stdout holds no valid artifact for this step.
    #[error("`{program}` printed no valid artifact: {detail}")]
    BadOutput {
        /// The program.
        program: String,
        /// What is wrong.
        detail: String,
    },
    /// The program exited cleanly but its output says the run failed (a CLI's error result).
    #[error("`{program}` reported a failure: {detail}")]
    Reported {
        /// The program.
        program: String,
        /// What it reported.
        detail: String,
    },
    /// The assignment could not be encoded for the program.
    #[error("cannot encode the assignment")]
    Encode(#[source] serde_json::Error),
}

impl CommandError {
    /// The failure the role actor reports for this error.
    pub fn to_failure(&self) -> AgentFailure {
        match self {
            CommandError::Timeout { limit_ms, .. } => AgentFailure::Timeout {
                secs: limit_ms.div_ceil(1000),
            },
            other => AgentFailure::CommandFailed {
                detail: consort_actors::error_chain(other),
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
/// pass_env = ["PATH", "HOME", "MY_AGENT_TOKEN"]
/// env_set = { MY_AGENT_MODE = "batch" }
/// ```
///
/// or, for a coding-agent CLI:
///
/// ```toml
/// preset = "claude-code"
/// args = ["--model", "sonnet"]
/// pass_env = ["PATH", "HOME", "ANTHROPIC_API_KEY"]
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommandConfig {
    /// A coding-agent CLI whose documented command line to use (see [`Preset`]); `program`
    /// then defaults to the CLI's name and `args` are added to its options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<Preset>,
    /// The program: a name looked up in `PATH`, or a path (a relative path with a slash is
    /// taken relative to the current directory when the agent is built). May be empty with a
    /// preset.
    pub program: String,
    /// Its arguments (with a preset: extra arguments after the preset's options). An argument
    /// `{prompt}` is replaced by the prompt of [`cli_prompt`]; an argument `{files}` by the
    /// paths of the step's files, one argument each.
    pub args: Vec<String>,
    /// The time limit of one run, in milliseconds. Default 600 000 (10 min).
    pub timeout_ms: u64,
    /// The most bytes read from stdout (more is an error) and kept from stderr. Default 4 MiB.
    pub output_cap_bytes: usize,
    /// The environment variables passed through from this process, by name (`env_allow` is
    /// accepted as the old name). Default `PATH`, `HOME`, `LANG`, `LC_ALL`, `TMPDIR`; a
    /// preset adds nothing, so name the CLI's key (`ANTHROPIC_API_KEY`, `OPENAI_API_KEY`, …)
    /// here. Nothing else of this process's environment reaches the program.
    #[serde(alias = "env_allow")]
    pub pass_env: Vec<String>,
    /// Fixed variables set for the program (they win over `pass_env`).
    pub env_set: BTreeMap<String, String>,
    /// Extra cache directory names (on top of the defaults of [`TreeFilter`]: `__pycache__`,
    /// `target`, `node_modules`, …) whose contents in the scratch copy are never part of the
    /// diff, at any depth. `consort` adds the project's `[paths] caches` here.
    pub caches: Vec<String>,
    /// Where each run's transcript is written (see [`transcript_file_name`]); none when
    /// unset. Not read from configuration files: `consort` sets the project's
    /// `.consort/transcripts/`.
    #[serde(skip)]
    pub transcript_dir: Option<PathBuf>,
}

impl Default for CommandConfig {
    fn default() -> Self {
        CommandConfig {
            preset: None,
            program: String::new(),
            args: Vec::new(),
            timeout_ms: 600_000,
            output_cap_bytes: 4 << 20,
            pass_env: ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"]
                .map(String::from)
                .to_vec(),
            env_set: BTreeMap::new(),
            caches: Vec::new(),
            transcript_dir: None,
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

    /// A configuration running a coding-agent CLI's preset, other fields default.
    pub fn preset(preset: Preset) -> Self {
        CommandConfig {
            preset: Some(preset),
            ..CommandConfig::default()
        }
    }

    /// The same configuration with another time limit.
    pub fn with_timeout(mut self, limit: Duration) -> Self {
        self.timeout_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// The program that runs: `program`, or the preset's CLI when `program` is empty.
    pub fn effective_program(&self) -> &str {
        match (self.program.trim().is_empty(), self.preset) {
            (true, Some(p)) => p.program(),
            _ => &self.program,
        }
    }

    /// The argument template: the preset's command line with `args` in it, or `args`.
    pub fn arg_template(&self) -> Vec<String> {
        match self.preset {
            Some(p) => p.args(&self.args),
            None => self.args.clone(),
        }
    }

    /// Where the transcript of this assignment's run goes, when a directory is set.
    pub fn transcript_path(&self, assignment: &Assignment) -> Option<PathBuf> {
        self.transcript_dir.as_ref().map(|d| {
            d.join(transcript_file_name(
                &assignment.step.to_string(),
                assignment.attempt,
            ))
        })
    }
}

/// An [`Agent`] that runs an external program in a scratch copy of the work tree.
#[derive(Debug, Clone)]
pub struct ExternalCommandAgent {
    role: Role,
    config: CommandConfig,
}

/// What one run of the program left: how it ended and what it wrote.
struct Ran {
    /// The exit status, or why there is none (not started, timed out, not waited for).
    ended: Result<std::process::ExitStatus, CommandError>,
    stdout: Vec<u8>,
    stdout_overflow: bool,
    stderr: Vec<u8>,
}

/// The program's command line and input for one assignment.
struct Invocation {
    /// The arguments, placeholders replaced.
    args: Vec<String>,
    /// The arguments as configured (for the transcript).
    template: Vec<String>,
    /// The rendered prompt, when an argument carries it.
    prompt: Option<String>,
    /// What stdin gets: the assignment's JSON for a plain command, nothing for a preset.
    stdin: Option<Vec<u8>>,
}

impl ExternalCommandAgent {
    /// An agent for `role` running `config.program` (or the preset's CLI).
    pub fn new(role: Role, mut config: CommandConfig) -> Self {
        config.program = config.effective_program().to_string();
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

    /// Its configuration (the program resolved).
    pub fn config(&self) -> &CommandConfig {
        &self.config
    }

    /// Runs the program for one assignment.
    pub async fn run(&self, assignment: &Assignment) -> Result<AgentOutput, CommandError> {
        let started = Instant::now();
        let scratch = tempfile::Builder::new()
            .prefix("consort-scratch-")
            .tempdir()
            .map_err(PathIoError::at(
                "create scratch directory",
                std::env::temp_dir().display(),
            ))?;
        let root = scratch
            .path()
            .canonicalize()
            .map_err(PathIoError::at("resolve", scratch.path().display()))?;
        let given = materialise(&root, &assignment.inputs.files)?;
        let invocation = self.invocation(assignment, &given)?;
        let ran = self.execute(&root, assignment, &invocation).await;
        let outcome = outcome_line(&ran.ended);
        let verdict = self.judge(ran.ended, &ran.stdout, ran.stdout_overflow, &ran.stderr);
        let kept = self.keep_transcript(
            assignment,
            &invocation,
            outcome,
            started,
            (&ran.stderr, &ran.stdout),
        );
        let stdout = match (verdict, kept) {
            (Ok(stdout), Ok(())) => stdout,
            (Ok(_), Err(e)) => return Err(e),
            (Err(e), kept) => {
                if let Err(t) = kept {
                    tracing::warn!(role = %self.role, error = %t, "transcript not kept");
                }
                return Err(e);
            }
        };
        let format = self
            .config
            .preset
            .map_or(OutputFormat::Artifact, Preset::output);
        let program = self.config.program.clone();
        let FinalMessage { text, usage } = final_message(format, &stdout).map_err(|e| match e {
            ReadError::Format(detail) => CommandError::BadOutput { program, detail },
            ReadError::Reported(detail) => CommandError::Reported { program, detail },
        })?;
        let artifact = self.answer(&root, given, assignment, &text).await?;
        drop(scratch);
        Ok(AgentOutput::new(artifact).with_usage(Usage {
            calls: 1,
            wall_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            ..usage
        }))
    }

    /// The artifact in the final message or, for a change-set step without one, the diff of
    /// the scratch copy.
    async fn answer(
        &self,
        root: &Path,
        given: BTreeMap<String, String>,
        assignment: &Assignment,
        message: &str,
    ) -> Result<Artifact, CommandError> {
        let expected = assignment.expected_kind();
        let program = self.config.program.clone();
        let from_message = extract_json(message)
            .ok()
            .and_then(|v| parse_artifact(expected, v).ok());
        match (from_message, expected) {
            (Some(Artifact::ChangeSet(cs)), _) => {
                for change in &cs.changes {
                    normalise_relative(change.path()).map_err(|e| CommandError::PathEscape {
                        path: change.path().to_string(),
                        reason: e.to_string(),
                    })?;
                }
                Ok(Artifact::ChangeSet(cs))
            }
            (Some(other), _) => Ok(other),
            (None, ArtifactKind::ChangeSet) => {
                let root2 = root.to_path_buf();
                let filter = TreeFilter::new(&self.config.caches);
                let changes = tokio::task::spawn_blocking(move || diff(&root2, &given, &filter))
                    .await
                    .map_err(|e| {
                        let failed = io::Error::other(e.to_string());
                        PathIoError::new("compare scratch copy", root.display(), failed)
                    })??;
                Ok(Artifact::ChangeSet(ChangeSet {
                    summary: format!("{} by {}", assignment.step, program_name(&program)),
                    changes,
                }))
            }
            (None, _) => {
                let detail = match extract_json(message) {
                    Err(e) => e,
                    Ok(v) => parse_artifact(expected, v)
                        .err()
                        .unwrap_or_else(|| "unreadable".into()),
                };
                Err(CommandError::BadOutput { program, detail })
            }
        }
    }

    /// The command line (placeholders replaced) and stdin for one assignment.
    fn invocation(
        &self,
        assignment: &Assignment,
        given: &BTreeMap<String, String>,
    ) -> Result<Invocation, CommandError> {
        let template = self.config.arg_template();
        let prompt = cli_prompt(assignment);
        let mut files: Vec<String> = given.keys().cloned().collect();
        if let Some(t) = &assignment.inputs.test
            && let Ok(path) = normalise_relative(&t.path)
            && !files.contains(&path)
        {
            files.push(path);
        }
        let mut args = Vec::with_capacity(template.len() + files.len());
        for a in &template {
            if a == FILES_PLACEHOLDER {
                // A path that looks like an option is given as `./-x`.
                args.extend(files.iter().map(|f| {
                    if f.starts_with('-') {
                        format!("./{f}")
                    } else {
                        f.clone()
                    }
                }));
            } else {
                args.push(a.replace(PROMPT_PLACEHOLDER, &prompt));
            }
        }
        let stdin = match self.config.preset {
            Some(_) => None,
            None => Some(prompt::stdin_json(assignment, &prompt).map_err(CommandError::Encode)?),
        };
        let uses_prompt = template.iter().any(|a| a.contains(PROMPT_PLACEHOLDER));
        Ok(Invocation {
            args,
            template,
            prompt: uses_prompt.then_some(prompt),
            stdin,
        })
    }

    /// The process, its environment reduced to `pass_env`, `env_set` and the step's variables.
    fn command(
        &self,
        root: &Path,
        assignment: &Assignment,
        invocation: &Invocation,
    ) -> tokio::process::Command {
        let cfg = &self.config;
        let mut cmd = tokio::process::Command::new(&cfg.program);
        cmd.args(&invocation.args)
            .current_dir(root)
            .env_clear()
            .stdin(if invocation.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        for name in &cfg.pass_env {
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
        cmd
    }

    /// Runs the program to its end or its time limit; keeps what it wrote either way.
    async fn execute(&self, root: &Path, assignment: &Assignment, invocation: &Invocation) -> Ran {
        let cfg = &self.config;
        let program = cfg.program.clone();
        let mut ran = Ran {
            ended: Err(CommandError::Timeout {
                program: program.clone(),
                limit_ms: cfg.timeout_ms,
            }),
            stdout: Vec::new(),
            stdout_overflow: false,
            stderr: Vec::new(),
        };
        let mut child = match self.command(root, assignment, invocation).spawn() {
            Ok(c) => c,
            Err(source) => {
                ran.ended = Err(CommandError::Spawn { program, source });
                return ran;
            }
        };
        let mut group = GroupGuard(child.id().and_then(|id| i32::try_from(id).ok()));
        tracing::debug!(role = %self.role, %program, step = %assignment.step, "external agent started");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let cap = cfg.output_cap_bytes;
        // Only written when stdin is a pipe, that is when there is something to write.
        let input: &[u8] = match &invocation.stdin {
            Some(bytes) => bytes,
            None => &[],
        };
        let (out_buf, err_buf) = (&mut ran.stdout, &mut ran.stderr);
        let work = async {
            let feed = async {
                if let Some(mut s) = stdin {
                    // A program that does not read its stdin closes the pipe: not an error.
                    let _ = s.write_all(input).await;
                    let _ = s.shutdown().await;
                }
            };
            let (_, out, err, status) = tokio::join!(
                feed,
                read_capped(stdout, out_buf, cap, true),
                read_capped(stderr, err_buf, cap, false),
                child.wait()
            );
            (out, err, status)
        };
        let limit = Duration::from_millis(cfg.timeout_ms);
        let finished = tokio::time::timeout(limit, work).await;
        // Leftover background children of the program die with their group (and all of it
        // when the limit passed).
        group.kill();
        let Ok((out, err, status)) = finished else {
            return ran;
        };
        let io_err = |op| PathIoError::at(op, &program);
        ran.ended = match (out, err, status) {
            (Ok(overflow), Ok(_), Ok(status)) => {
                ran.stdout_overflow = overflow;
                Ok(status)
            }
            (Err(e), _, _) => Err(io_err("read stdout of")(e).into()),
            (_, Err(e), _) => Err(io_err("read stderr of")(e).into()),
            (_, _, Err(e)) => Err(io_err("wait for")(e).into()),
        };
        ran
    }

    /// The program's stdout, if it ran within its limits and exited cleanly.
    fn judge(
        &self,
        ended: Result<std::process::ExitStatus, CommandError>,
        stdout: &[u8],
        overflow: bool,
        stderr: &[u8],
    ) -> Result<String, CommandError> {
        let program = self.config.program.clone();
        let status = ended?;
        if overflow {
            return Err(CommandError::OutputTooLarge {
                program,
                cap: self.config.output_cap_bytes,
            });
        }
        if !status.success() {
            // A CLI that says why it failed on stdout (Claude Code's error result, Codex's
            // `turn.failed`) is reported with its own words.
            if let Some(p) = self.config.preset
                && let Ok(text) = std::str::from_utf8(stdout)
                && let Err(ReadError::Reported(detail)) = final_message(p.output(), text)
            {
                return Err(CommandError::Reported { program, detail });
            }
            return Err(CommandError::Exit {
                program,
                status: status_text(status),
                stderr: excerpt(&String::from_utf8_lossy(stderr)),
            });
        }
        String::from_utf8(stdout.to_vec()).map_err(|_| CommandError::BadOutput {
            program,
            detail: "stdout is not UTF-8 text".into(),
        })
    }

    /// Writes the run's transcript when a transcript directory is set.
    fn keep_transcript(
        &self,
        assignment: &Assignment,
        invocation: &Invocation,
        outcome: String,
        started: Instant,
        (stderr, stdout): (&[u8], &[u8]),
    ) -> Result<(), CommandError> {
        let Some(dir) = &self.config.transcript_dir else {
            return Ok(());
        };
        let record = transcript::Record {
            step: assignment.step.to_string(),
            attempt: assignment.attempt,
            role: self.role.as_str(),
            program: &self.config.program,
            args: &invocation.template,
            prompt: invocation.prompt.as_deref(),
            outcome,
            wall_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            stderr,
            stdout,
        };
        let path = transcript::write(dir, &record)?;
        tracing::debug!(role = %self.role, path = %path.display(), "transcript kept");
        Ok(())
    }
}

fn status_text(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "unknown status".into(),
    }
}

/// How a run ended, in a transcript's words.
fn outcome_line(ended: &Result<std::process::ExitStatus, CommandError>) -> String {
    match ended {
        Ok(status) => status_text(*status),
        Err(e) => consort_actors::error_chain(e),
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

/// Reads a stream into `buf` up to `cap` bytes. With `stop_at_cap`, stops reading past the
/// cap (the writer then gets a broken pipe); otherwise drains and discards the rest. Returns
/// whether the cap was passed. What was read stays in `buf` if the read is abandoned.
async fn read_capped<R: AsyncRead + Unpin>(
    stream: Option<R>,
    buf: &mut Vec<u8>,
    cap: usize,
    stop_at_cap: bool,
) -> io::Result<bool> {
    let Some(mut r) = stream else {
        return Ok(false);
    };
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
    Ok(overflow)
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
            std::fs::create_dir_all(parent).map_err(PathIoError::at("create directory", &norm))?;
        }
        std::fs::write(&full, content).map_err(PathIoError::at("write", &norm))?;
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
    let io_err = |op, p: &Path| PathIoError::at(op, p.display().to_string());
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
                let transcript = self
                    .config
                    .transcript_path(assignment)
                    .map(|p| p.display().to_string());
                tracing::warn!(role = %self.role, error = %consort_actors::error_chain(&e), transcript, "external agent failed");
                e.to_failure()
            })
        })
    }

    fn describe(&self) -> String {
        match self.config.preset {
            Some(p) => format!("command({p}: {})", program_name(&self.config.program)),
            None => format!("command({})", program_name(&self.config.program)),
        }
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
