//! The psql runner: SQL code files loaded into the branch, then each SQL test file run in its
//! own `psql` session inside a transaction that is rolled back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use consort_actors::worktree::TreeFilter;
use consort_actors::{ExitRecord, TestOutcome, TestStatus};
use globset::{Glob, GlobSet, GlobSetBuilder};

use super::capture::{Capture, OutputLimits};
use super::process::{EnvPolicy, ProcSpec, run};
use super::{RunContext, RunReport, TestRunner, redact};
use crate::error::{Error, Result};
use crate::pgbin::find_psql;
use crate::provider::BoxFuture;

/// How the psql runner finds and runs SQL files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsqlRunnerConfig {
    /// The `psql` program; `None` searches `PATH` and the PostgreSQL directories.
    pub psql: Option<PathBuf>,
    /// Code files loaded into the branch before the tests, in sorted path order
    /// (e.g. `src/**/*.sql`). They are committed to the branch.
    pub setup_globs: Vec<String>,
    /// Test files (e.g. `tests/**/*.sql`); every match in the tree is run.
    pub test_globs: Vec<String>,
    /// Time limit of each `psql` invocation.
    pub timeout_per_file: Duration,
    /// The environment policy.
    pub env: EnvPolicy,
    /// Output limits.
    pub limits: OutputLimits,
    /// The project's extra cache directory names (`[paths] caches`): like the defaults of
    /// [`TreeFilter`], never searched for code or test files, at any depth.
    pub caches: Vec<String>,
}

impl Default for PsqlRunnerConfig {
    fn default() -> Self {
        PsqlRunnerConfig {
            psql: None,
            setup_globs: vec!["src/**/*.sql".into()],
            test_globs: vec!["tests/**/*.sql".into()],
            timeout_per_file: Duration::from_secs(60),
            env: EnvPolicy::default(),
            limits: OutputLimits::default(),
            caches: Vec::new(),
        }
    }
}

/// Runs SQL test files with `psql`; see [`PsqlRunnerConfig`].
#[derive(Debug, Clone)]
pub struct PsqlRunner {
    cfg: PsqlRunnerConfig,
    psql: PathBuf,
    setup: GlobSet,
    tests: GlobSet,
}

fn globset(globs: &[String]) -> Result<GlobSet> {
    let mut b = GlobSetBuilder::new();
    for g in globs {
        b.add(Glob::new(g).map_err(|e| Error::Config(format!("bad glob {g:?}: {e}")))?);
    }
    b.build()
        .map_err(|e| Error::Config(format!("bad globs: {e}")))
}

/// Every regular file of the tree (not following links), as sorted relative paths; the
/// directories `filter` skips (caches, version control, Consort's state) are not entered, at any
/// depth.
fn list_files(root: &Path, filter: &TreeFilter) -> Result<Vec<String>> {
    fn walk(root: &Path, dir: &Path, filter: &TreeFilter, out: &mut Vec<String>) -> Result<()> {
        let rd =
            std::fs::read_dir(dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
        for entry in rd.filter_map(|e| e.ok()) {
            let path = entry.path();
            let Ok(ft) = entry.file_type() else { continue };
            if ft.is_dir() {
                let name = entry.file_name();
                if filter.skips(&name.to_string_lossy()) {
                    continue;
                }
                walk(root, &path, filter, out)?;
            } else if ft.is_file()
                && let Ok(rel) = path.strip_prefix(root)
            {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, root, filter, &mut out)?;
    out.sort();
    Ok(out)
}

impl PsqlRunner {
    /// A runner with this configuration (finds `psql`, compiles the globs).
    pub fn new(cfg: PsqlRunnerConfig) -> Result<Self> {
        let psql = match &cfg.psql {
            Some(p) => p.clone(),
            None => find_psql()?,
        };
        Ok(PsqlRunner {
            setup: globset(&cfg.setup_globs)?,
            tests: globset(&cfg.test_globs)?,
            psql,
            cfg,
        })
    }

    fn spec(&self, ctx: &RunContext, args: Vec<String>) -> ProcSpec {
        ProcSpec {
            program: self.psql.clone(),
            args,
            cwd: ctx.work_tree.clone(),
            env: self.cfg.env.build(&ctx.conn),
            timeout: self.cfg.timeout_per_file,
        }
    }

    async fn run_inner(&self, ctx: &RunContext) -> Result<RunReport> {
        let limits = self.cfg.limits;
        let files = list_files(&ctx.work_tree, &TreeFilter::new(&self.cfg.caches))?;
        let setup: Vec<&String> = files.iter().filter(|f| self.setup.is_match(f)).collect();
        let tests: Vec<&String> = files
            .iter()
            .filter(|f| self.tests.is_match(f) && !self.setup.is_match(f))
            .collect();
        let base = ["-X", "-q", "-v", "ON_ERROR_STOP=1"].map(String::from);
        let command = format!(
            "psql -X -q -v ON_ERROR_STOP=1 -c BEGIN -f <test> -c ROLLBACK ({} test file(s) after {} setup file(s))",
            tests.len(),
            setup.len()
        );
        let mut capture = Capture::new(&limits);
        let mut exit = ExitRecord {
            code: Some(0),
            signal: None,
            timed_out: false,
        };
        let mut setup_failed: Option<String> = None;
        for f in &setup {
            capture.push_str(&format!("== setup {f} ==\n"));
            let mut args = base.to_vec();
            args.extend(["-f".to_string(), f.to_string()]);
            let r = run(&self.spec(ctx, args), &mut capture, &limits).await?;
            connection_intact(&r.exit, f)?;
            if !r.exit.success() {
                exit = r.exit.clone();
                setup_failed = Some(f.to_string());
                capture.push_str(&format!(
                    "\n[consort: setup file {f} failed (exit {:?}); no test ran]\n",
                    r.exit.code
                ));
                break;
            }
        }
        let mut outcomes = Vec::with_capacity(tests.len());
        for f in &tests {
            if let Some(bad) = &setup_failed {
                outcomes.push(TestOutcome {
                    name: f.to_string(),
                    status: TestStatus::Errored,
                });
                capture.push_str(&format!(
                    "== test {f}: not run (setup file {bad} failed) ==\n"
                ));
                continue;
            }
            capture.push_str(&format!("== test {f} ==\n"));
            let mut args = base.to_vec();
            args.extend(["-c", "BEGIN", "-f", f.as_str(), "-c", "ROLLBACK"].map(String::from));
            let r = run(&self.spec(ctx, args), &mut capture, &limits).await?;
            connection_intact(&r.exit, f)?;
            let status = if r.exit.success() {
                TestStatus::Passed
            } else if r.exit.timed_out {
                // A timeout is no verdict on the test either way.
                TestStatus::Errored
            } else {
                TestStatus::Failed
            };
            capture.push_str(&format!("== {f}: {status:?} (exit {:?}) ==\n", r.exit.code));
            if !r.exit.success() && exit.success() {
                exit = r.exit.clone();
            }
            outcomes.push(TestOutcome {
                name: f.to_string(),
                status,
            });
        }
        let done = capture.finish();
        let excerpt = match &setup_failed {
            // Put the reason first so it survives the cap.
            Some(bad) => format!(
                "setup file {bad} failed; every test is reported errored\n{}",
                done.excerpt
            ),
            None => done.excerpt,
        };
        Ok(RunReport {
            command,
            outcomes,
            exit,
            output_digest: done.digest,
            output_excerpt: redact(&excerpt, &ctx.conn),
            output_bytes: done.total,
        })
    }
}

/// psql's exit code when the connection to the server went bad (could not be made, or broke
/// during the session): the database's fault, never the test's.
const PSQL_CONNECTION_LOST: i32 = 2;

/// A psql session whose connection broke says nothing about the code under test: the run is
/// an infrastructure failure ([`Error::Connect`]), so the verification can be retried on a
/// fresh branch instead of sending working code to a repair.
fn connection_intact(exit: &ExitRecord, file: &str) -> Result<()> {
    if !exit.timed_out && exit.code == Some(PSQL_CONNECTION_LOST) {
        return Err(Error::Connect(format!(
            "psql lost its connection to the branch while running {file} (exit code {PSQL_CONNECTION_LOST})"
        )));
    }
    Ok(())
}

impl TestRunner for PsqlRunner {
    fn name(&self) -> &'static str {
        "psql"
    }

    fn run<'a>(&'a self, ctx: &'a RunContext) -> BoxFuture<'a, Result<RunReport>> {
        Box::pin(self.run_inner(ctx))
    }
}
