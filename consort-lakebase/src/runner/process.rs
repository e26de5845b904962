//! Running one test process: scrubbed environment, own process group, time limit that kills
//! the whole group, output streamed into a [`Capture`].

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use consort_actors::ExitRecord;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tracing::debug;

use super::RunContext;
use super::capture::{Capture, OutputLimits};
use super::sandbox::Jail;
use crate::error::{ConfigError, Error, Result};
use crate::provider::ConnectInfo;

/// The environment variables passed through by default (when set in this process).
pub const DEFAULT_ENV_ALLOW: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LANGUAGE",
    "TERM",
    "TZ",
    "TMPDIR",
    "USER",
    "LOGNAME",
    "SHELL",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
];

/// Which environment a test process gets: the allow-listed variables of this process, fixed
/// extra ones, and the branch's credentials. Everything else is scrubbed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvPolicy {
    /// Variables copied from this process when set.
    pub allow: Vec<String>,
    /// Variables set to fixed values.
    pub set: Vec<(String, String)>,
    /// The branch under the project's own names (`[branch_env]`), set after the branch's
    /// own variables.
    pub branch: crate::BranchEnv,
}

impl Default for EnvPolicy {
    fn default() -> Self {
        EnvPolicy {
            allow: DEFAULT_ENV_ALLOW.iter().map(|s| s.to_string()).collect(),
            set: Vec::new(),
            branch: crate::BranchEnv::default(),
        }
    }
}

impl EnvPolicy {
    /// The full environment for a child: allowed, fixed, then the branch's credentials, under
    /// their own names and the project's.
    pub fn build(&self, conn: &ConnectInfo) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .allow
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v)))
            .collect();
        env.extend(self.set.iter().cloned());
        env.extend(conn.env().into_iter().map(|(k, v)| (k.to_string(), v)));
        let mapped = self.branch.render(conn);
        env.retain(|(k, _)| !mapped.iter().any(|(m, _)| m == k));
        env.extend(mapped);
        env.push(("PGCONNECT_TIMEOUT".into(), "10".into()));
        env
    }

    /// The environment of a process of this run: [`EnvPolicy::build`] with
    /// [`NON_INTERACTIVE`] where the configuration sets neither, then the run's scratch
    /// directory (`HOME`, `TMPDIR`, …) and the pinned session settings (`PGOPTIONS`), which
    /// nothing configured can override.
    pub fn build_for(&self, ctx: &RunContext) -> Vec<(String, String)> {
        let mut env = self.build(&ctx.conn);
        for (k, v) in NON_INTERACTIVE {
            if !env.iter().any(|(set, _)| set == k) {
                env.push((k.to_string(), v.to_string()));
            }
        }
        continue_past_files_that_do_not_load(&mut env);
        let fixed = ctx.scratch.env();
        env.retain(|(k, _)| k != "PGOPTIONS" && !fixed.iter().any(|(f, _)| f == k));
        env.extend(fixed);
        env.push(("PGOPTIONS".into(), ctx.pinned.pgoptions()));
        env
    }
}

/// pytest's flag that runs the rest of the suite when a test file fails to load.
const PYTEST_CONTINUE: &str = "--continue-on-collection-errors";

/// pytest runs every test file that loads when one does not (as jest, vitest and go do), so a
/// RED whose new file imports a module not written yet, or a GREEN that breaks one file's
/// import, is judged with every other test still run and reported: `PYTEST_ADDOPTS` gains
/// `--continue-on-collection-errors` (after what the configuration sets in it). Without it,
/// pytest stops at collection and reports no test at all. Other programs ignore the variable.
fn continue_past_files_that_do_not_load(env: &mut Vec<(String, String)>) {
    match env.iter_mut().find(|(k, _)| k == "PYTEST_ADDOPTS") {
        Some((_, v)) if v.split_whitespace().any(|w| w == PYTEST_CONTINUE) => {}
        Some((_, v)) => {
            v.push(' ');
            v.push_str(PYTEST_CONTINUE);
        }
        None => env.push(("PYTEST_ADDOPTS".into(), PYTEST_CONTINUE.into())),
    }
}

/// What every run's environment says unless the configuration says otherwise: no test tool
/// waits for input or watches files (`CI=true`: vitest and jest run once), and no package
/// manager reaches for a registry (a confined run cannot reach one, so a program that is not
/// installed fails at once instead of after the network's time-outs and retries): `npx` never
/// installs (`npm_config_yes=false`) and npm works offline (`npm_config_offline=true`, or npx
/// still asks the registry for the package first), Go uses no module proxy (`GOPROXY=off`),
/// pip no index (`PIP_NO_INDEX=1`), uv stays offline (`UV_OFFLINE=1`).
pub const NON_INTERACTIVE: [(&str, &str); 6] = [
    ("CI", "true"),
    ("npm_config_yes", "false"),
    ("npm_config_offline", "true"),
    ("GOPROXY", "off"),
    ("PIP_NO_INDEX", "1"),
    ("UV_OFFLINE", "1"),
];

/// One process to run.
#[derive(Debug, Clone)]
pub(crate) struct ProcSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    /// The confinement every process of the run gets.
    pub jail: Jail,
}

/// How it went.
#[derive(Debug, Clone)]
pub(crate) struct ProcOutcome {
    pub exit: ExitRecord,
    /// Standard output alone, up to the parse limit (for TAP).
    pub stdout: Vec<u8>,
    /// Standard error alone, up to the parse limit (psql's session marker).
    pub stderr: Vec<u8>,
    /// The output limit was hit and the process group was killed.
    pub over_cap: bool,
}

enum Chunk {
    Out(Vec<u8>),
    Err(Vec<u8>),
}

async fn pump<R: tokio::io::AsyncRead + Unpin>(mut r: R, tx: mpsc::Sender<Chunk>, is_out: bool) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let data = buf[..n].to_vec();
                let chunk = if is_out {
                    Chunk::Out(data)
                } else {
                    Chunk::Err(data)
                };
                if tx.send(chunk).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn kill_group(pgid: Option<u32>) {
    if let Some(pid) = pgid {
        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
}

/// Kills a process group when dropped, unless it was reaped first.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}

/// Whatever the leader left behind in its group dies with it, before the run returns.
async fn reap_group(pgid: Option<u32>) {
    kill_group(pgid);
    if let Some(g) = pgid {
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while !crate::procinfo::group_members(g).is_empty() && tokio::time::Instant::now() < until {
            kill_group(pgid);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Says in the output why Consort killed the command, when it did.
fn note_kills(
    capture: &mut Capture,
    limits: &OutputLimits,
    spec: &ProcSpec,
    over_cap: bool,
    timed_out: bool,
) {
    if over_cap {
        capture.push_str(&format!(
            "\n[consort: output exceeded {} bytes; the command was killed]\n",
            limits.max_total
        ));
    }
    if timed_out {
        capture.push_str(&format!(
            "\n[consort: time limit of {} reached; the process group was killed]\n",
            crate::error::duration_text(spec.timeout)
        ));
    }
}

/// Runs `spec`, streaming stdout and stderr (interleaved as they arrive) into `capture`.
/// Returns [`Error::Runner`] only when the program cannot be started.
pub(crate) async fn run(
    spec: &ProcSpec,
    capture: &mut Capture,
    limits: &OutputLimits,
) -> Result<ProcOutcome> {
    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let confined = spec.jail.spawn(cmd).await.map_err(|e| {
        Error::Runner(format!(
            "cannot start {} in {}: {e}",
            spec.program.display(),
            spec.cwd.display()
        ))
    })?;
    let mut child = confined.child;
    let _forwarding = confined.forwarder;
    let pgid = child.id();
    // A run dropped before it ends (a sharded verification stopped early) takes its whole
    // process group with it, not only the leader.
    let mut group = GroupGuard(pgid);
    let (tx, mut rx) = mpsc::channel::<Chunk>(64);
    if let Some(out) = child.stdout.take() {
        tokio::spawn(pump(out, tx.clone(), true));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(pump(err, tx.clone(), false));
    }
    drop(tx);

    let deadline = tokio::time::Instant::now() + spec.timeout;
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let mut status = None;
    let mut timed_out = false;
    let mut over_cap = false;
    let mut streams_open = true;
    let accept = |chunk: Chunk, capture: &mut Capture, kept: &mut (Vec<u8>, Vec<u8>)| {
        let (d, into) = match chunk {
            Chunk::Out(d) => (d, &mut kept.0),
            Chunk::Err(d) => (d, &mut kept.1),
        };
        capture.push(&d);
        let room = limits.max_parsed.saturating_sub(into.len());
        into.extend_from_slice(&d[..room.min(d.len())]);
    };
    let mut kept = (std::mem::take(&mut stdout), std::mem::take(&mut stderr));
    while status.is_none() {
        tokio::select! {
            chunk = rx.recv(), if streams_open => match chunk {
                Some(c) => {
                    accept(c, capture, &mut kept);
                    if capture.total() > limits.max_total && !over_cap {
                        over_cap = true;
                        debug!(program = %spec.program.display(), "output cap reached; killing the process group");
                        kill_group(pgid);
                    }
                }
                None => streams_open = false,
            },
            st = child.wait() => {
                status = Some(st.map_err(|e| Error::Runner(format!("waiting for the test process: {e}")))?);
            }
            _ = tokio::time::sleep_until(deadline), if !timed_out => {
                timed_out = true;
                debug!(program = %spec.program.display(), "time limit reached; killing the process group");
                kill_group(pgid);
            }
        }
    }
    reap_group(pgid).await;
    // Reaped: its number may be reused from now on.
    group.0 = None;
    let grace = tokio::time::Instant::now() + Duration::from_secs(2);
    while streams_open {
        tokio::select! {
            chunk = rx.recv() => match chunk {
                Some(c) => accept(c, capture, &mut kept),
                None => streams_open = false,
            },
            _ = tokio::time::sleep_until(grace) => break,
        }
    }
    let (stdout, stderr) = kept;
    let status = status.ok_or_else(|| Error::Runner("the test process vanished".into()))?;
    note_kills(capture, limits, spec, over_cap, timed_out);
    Ok(ProcOutcome {
        exit: ExitRecord {
            code: status.code(),
            signal: status.signal(),
            timed_out,
        },
        stdout,
        stderr,
        over_cap,
    })
}

/// Quotes a word for `sh`.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Resolves a configured work-tree-relative path, refusing absolute paths and `..`.
pub(crate) fn tree_path(root: &Path, rel: &Path) -> Result<PathBuf> {
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(Error::Misconfigured(ConfigError::OutsideWorkTree {
            path: rel.to_path_buf(),
        }));
    }
    Ok(root.join(rel))
}
