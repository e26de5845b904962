//! The psql runner: SQL code files loaded into the branch, then each SQL test file run in its
//! own `psql` session inside a transaction that is rolled back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use consort_actors::{ExitRecord, TestOutcome, TestStatus};
use globset::{Glob, GlobSet, GlobSetBuilder};

use super::capture::{Capture, OutputLimits};
use super::process::{EnvPolicy, ProcSpec, run as run_process};
use super::{RunContext, RunReport, Suite, SuiteTest, TestRunner, redact, redact_outcomes};

use crate::error::{ConfigError, Error, PsqlFault, Result, TestCommandFault};
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
        b.add(Glob::new(g).map_err(|source| {
            Error::Misconfigured(ConfigError::BadGlob {
                glob: g.clone(),
                source,
            })
        })?);
    }
    b.build()
        .map_err(|e| Error::Misconfigured(ConfigError::GlobSet(e)))
}

/// Every file of the tree as the verifier sees it (the filter's directories left out), as
/// sorted relative paths.
fn list_files(ctx: &RunContext) -> Result<Vec<String>> {
    let listing = consort_actors::WorkTree::open(&ctx.work_tree)
        .map(|t| t.with_filter(ctx.filter.clone()))
        .and_then(|t| t.files());
    listing.map_err(|e| Error::io("list the work tree", std::io::Error::other(e.to_string())))
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
            env: self.cfg.env.build_for(ctx),
            timeout: self.cfg.timeout_per_file,
            jail: ctx.jail.clone(),
        }
    }

    /// The tree's test files: those the test globs match, but no setup file.
    fn test_files<'f>(&self, files: &'f [String]) -> Vec<&'f String> {
        files
            .iter()
            .filter(|f| self.tests.is_match(f) && !self.setup.is_match(f))
            .collect()
    }

    async fn run_inner(&self, ctx: &RunContext) -> Result<RunReport> {
        let limits = self.cfg.limits;
        let files = list_files(ctx)?;
        let setup: Vec<&String> = files.iter().filter(|f| self.setup.is_match(f)).collect();
        let mut tests = self.test_files(&files);
        if let Some(select) = &ctx.select {
            tests.retain(|f| select.contains(f));
        }
        let command = format!(
            "psql -X -q -v ON_ERROR_STOP=1 -c BEGIN -f <test> -c ROLLBACK ({} test file(s) after {} setup file(s) loaded through the protocol)",
            tests.len(),
            setup.len()
        );
        let mut capture = Capture::new(&limits);
        let mut run = TestsRun {
            exit: ExitRecord {
                code: Some(0),
                signal: None,
                timed_out: false,
            },
            outcomes: Vec::with_capacity(tests.len()),
            sessions_lost: Vec::new(),
        };
        let setup_failed = load_setup(ctx, &setup, &mut capture, self.cfg.timeout_per_file).await?;
        if let Some(failure) = &setup_failed {
            run.exit = ExitRecord {
                code: Some(3),
                signal: None,
                timed_out: failure.timed_out,
            };
            if failure.session_lost {
                run.sessions_lost.push(failure.file.clone());
            }
            for f in &tests {
                run.outcomes
                    .push(TestOutcome::new(f.as_str(), TestStatus::Errored));
                capture.push_str(&format!(
                    "== test {f}: not run (setup file {} failed) ==\n",
                    failure.file
                ));
            }
        } else {
            self.run_tests(ctx, &tests, &mut capture, &mut run).await?;
        }
        let done = capture.finish();
        let excerpt = match &setup_failed {
            // Put the reason first so it survives the cap.
            Some(failure) => format!(
                "setup file {} failed; every test is reported errored\n{}",
                failure.file, done.excerpt
            ),
            None => done.excerpt,
        };
        let mut outcomes = run.outcomes;
        redact_outcomes(&mut outcomes, &ctx.conn);
        Ok(RunReport {
            command,
            outcomes,
            exit: run.exit,
            output_digest: done.digest,
            output_excerpt: redact(&excerpt, &ctx.conn),
            output_bytes: done.total,
            sessions_lost: run.sessions_lost,
        })
    }

    /// Each test file in its own confined `psql` session, inside a transaction rolled back. A
    /// session that is no evidence about its test (see [`Evidence`]) is the run's fault.
    async fn run_tests(
        &self,
        ctx: &RunContext,
        tests: &[&String],
        capture: &mut Capture,
        run: &mut TestsRun,
    ) -> Result<()> {
        let limits = self.cfg.limits;
        let base = [
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            SESSION_OPENED_ECHO,
        ]
        .map(String::from);
        for f in tests {
            capture.push_str(&format!("== test {f} ==\n"));
            let mut args = base.to_vec();
            args.extend(["-c", "BEGIN", "-f", f.as_str(), "-c", "ROLLBACK"].map(String::from));
            let r = run_process(&self.spec(ctx, args), capture, &limits).await?;
            let opened = String::from_utf8_lossy(&r.stderr)
                .lines()
                .any(|l| l == SESSION_OPENED);
            let status = match evidence(&r.exit, opened) {
                Evidence::Test(status) => status,
                Evidence::Lost => {
                    run.sessions_lost.push(f.to_string());
                    capture.push_str(&format!("== {f}: its database session broke off ==\n"));
                    TestStatus::Errored
                }
                Evidence::NoSession => {
                    // A branch that does not answer is the database's fault, not the client's.
                    branch_answers(ctx).await?;
                    return Err(fault(ctx, f, PsqlFault::NoSession, capture));
                }
                Evidence::None(why) => return Err(fault(ctx, f, why, capture)),
            };
            capture.push_str(&format!(
                "== {f}: {} (exit {}) ==\n",
                status,
                exit_word(&r.exit)
            ));
            if !r.exit.success() && run.exit.success() {
                run.exit = r.exit.clone();
            }
            let outcome = TestOutcome::new(f.as_str(), status);
            run.outcomes.push(match status {
                TestStatus::Passed | TestStatus::Skipped => outcome,
                _ => outcome.with_message(&what_psql_said(&r.stderr)),
            });
        }
        Ok(())
    }
}

/// What psql printed on standard error about a test that failed (the server's `ERROR:` and its
/// `DETAIL`, `HINT` and `CONTEXT` lines), without Consort's session marker.
fn what_psql_said(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| *l != SESSION_OPENED && !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// What psql prints once its session with the branch is open (`\\warn`, before any statement
/// of the test): a psql that exits without it never reached the test. It goes to standard
/// error, where psql's errors go, so the run's output keeps one order however the two streams
/// arrive.
const SESSION_OPENED: &str = "consort: psql session opened";

/// The command that prints [`SESSION_OPENED`].
const SESSION_OPENED_ECHO: &str = "\\warn consort: psql session opened";

/// psql's exit code when a statement failed with `ON_ERROR_STOP` set: an error the server
/// raised in the test's own statements.
const PSQL_STATEMENT_FAILED: i32 = 3;

/// What one psql session says about its test.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Evidence {
    /// A verdict on the test: it passed (exit 0 after the session opened), failed (exit 3: the
    /// server raised an error in its statements) or ran out of time (errored).
    Test(TestStatus),
    /// The session opened, then its connection broke off (exit 2): the verifier decides whose
    /// fault that was.
    Lost,
    /// No session opened (exit 2 before any command ran): the branch, or the client.
    NoSession,
    /// No evidence about the test: the client's own fault.
    None(PsqlFault),
}

/// What a psql session that ended with `exit`, having printed [`SESSION_OPENED`] or not
/// (`opened`), says about its test.
fn evidence(exit: &ExitRecord, opened: bool) -> Evidence {
    if exit.timed_out {
        return Evidence::Test(TestStatus::Errored);
    }
    match exit.code {
        Some(0) if opened => Evidence::Test(TestStatus::Passed),
        Some(0) => Evidence::None(PsqlFault::RanNothing),
        Some(PSQL_STATEMENT_FAILED) if opened => Evidence::Test(TestStatus::Failed),
        Some(PSQL_CONNECTION_LOST) if opened => Evidence::Lost,
        Some(PSQL_CONNECTION_LOST) => Evidence::NoSession,
        Some(1) => Evidence::None(PsqlFault::OwnError { code: 1 }),
        Some(c) => Evidence::None(PsqlFault::Ended {
            how: format!("exit {c}"),
        }),
        None => Evidence::None(PsqlFault::Ended {
            how: exit_word(exit),
        }),
    }
}

/// The run's fault for the test file `file`, with what psql printed.
fn fault(ctx: &RunContext, file: &str, fault: PsqlFault, capture: &Capture) -> Error {
    Error::TestCommand {
        command: "psql -X -q -v ON_ERROR_STOP=1 -c BEGIN -f <test> -c ROLLBACK".into(),
        fault: TestCommandFault::Psql {
            file: file.to_string(),
            fault: Box::new(fault),
        },
        output: redact(&capture.clone().finish().excerpt, &ctx.conn),
    }
}

/// `Ok` when the branch answers a query; its connection error when it does not.
async fn branch_answers(ctx: &RunContext) -> Result<()> {
    let cfg = crate::pgconn::config_of(&ctx.conn);
    let client =
        crate::pgconn::connect_config(&cfg, ctx.conn.sslmode, ctx.conn.ca_file.as_deref()).await?;
    client
        .simple_query("SELECT 1")
        .await
        .map_err(|e| Error::from_pg("ask the branch whether it answers", e))?;
    Ok(())
}

/// What the test files of one run came to.
struct TestsRun {
    exit: ExitRecord,
    outcomes: Vec<TestOutcome>,
    sessions_lost: Vec<String>,
}

fn exit_word(exit: &ExitRecord) -> String {
    match (exit.code, exit.signal) {
        (Some(c), _) => c.to_string(),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => "unknown".into(),
    }
}

/// psql's exit code when the connection to the server went bad (could not be made, or broke
/// during the session).
const PSQL_CONNECTION_LOST: i32 = 2;

/// A setup file that did not load.
struct SetupFailure {
    file: String,
    session_lost: bool,
    timed_out: bool,
}

/// Loads the setup (code) files into the branch through the protocol, one session, in sorted
/// order, with the pinned settings: a code file is SQL, never a psql script (no
/// meta-commands such as `\!`).
async fn load_setup(
    ctx: &RunContext,
    files: &[&String],
    capture: &mut Capture,
    limit: Duration,
) -> Result<Option<SetupFailure>> {
    if files.is_empty() {
        return Ok(None);
    }
    let mut cfg = crate::pgconn::config_of(&ctx.conn);
    cfg.options(ctx.pinned.pgoptions());
    let client =
        crate::pgconn::connect_config(&cfg, ctx.conn.sslmode, ctx.conn.ca_file.as_deref()).await?;
    for f in files {
        capture.push_str(&format!("== setup {f} ==\n"));
        let sql = std::fs::read_to_string(ctx.work_tree.join(f))
            .map_err(|e| Error::io(format!("read the setup file {f}"), e))?;
        let failure = |session_lost, timed_out| SetupFailure {
            file: f.to_string(),
            session_lost,
            timed_out,
        };
        match tokio::time::timeout(limit, client.batch_execute(&sql)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let lost = e.is_closed()
                    || e.as_db_error()
                        .is_none_or(|db| matches!(db.severity(), "FATAL" | "PANIC"));
                capture.push_str(&format!("{}\n", describe_sql_error(&e)));
                capture.push_str(&format!(
                    "\n[consort: setup file {f} failed; no test ran]\n"
                ));
                return Ok(Some(failure(lost, false)));
            }
            Err(_) => {
                capture.push_str(&format!(
                    "\n[consort: setup file {f} took longer than {} s; no test ran]\n",
                    limit.as_secs()
                ));
                return Ok(Some(failure(false, true)));
            }
        }
    }
    Ok(None)
}

/// The server's message, detail, hint and position, as psql would print them.
fn describe_sql_error(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        return format!("ERROR: {e}");
    };
    let mut text = format!("{}: {}", db.severity(), db.message());
    if let Some(d) = db.detail() {
        text.push_str(&format!("\nDETAIL: {d}"));
    }
    if let Some(h) = db.hint() {
        text.push_str(&format!("\nHINT: {h}"));
    }
    if let Some(tokio_postgres::error::ErrorPosition::Original(p)) = db.position() {
        text.push_str(&format!("\n(at character {p})"));
    }
    text.push_str(&format!(" (SQLSTATE {})", db.code().code()));
    text
}

impl TestRunner for PsqlRunner {
    fn name(&self) -> &'static str {
        "psql"
    }

    fn run<'a>(&'a self, ctx: &'a RunContext) -> BoxFuture<'a, Result<RunReport>> {
        Box::pin(self.run_inner(ctx))
    }

    fn selects(&self) -> bool {
        true
    }

    /// A test is its file.
    fn file_of(&self, test: &str, files: &[String], _tree: &Path) -> Option<String> {
        files.iter().find(|f| *f == test).cloned()
    }

    /// Every test file is one test, named by its path: the suite is what the globs match.
    fn collect<'a>(&'a self, ctx: &'a RunContext) -> BoxFuture<'a, Result<Option<Suite>>> {
        Box::pin(async move {
            let files = list_files(ctx)?;
            Ok(Some(Suite::of(
                self.test_files(&files)
                    .into_iter()
                    .map(|f| SuiteTest {
                        file: f.clone(),
                        name: f.clone(),
                    })
                    .collect(),
            )))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: Option<i32>, signal: Option<i32>, timed_out: bool) -> ExitRecord {
        ExitRecord {
            code,
            signal,
            timed_out,
        }
    }

    #[test]
    fn only_a_session_that_opened_and_ran_its_statements_judges_the_test() {
        let code = |c| exit(Some(c), None, false);
        assert_eq!(evidence(&code(0), true), Evidence::Test(TestStatus::Passed));
        assert_eq!(
            evidence(&code(3), true),
            Evidence::Test(TestStatus::Failed),
            "an error the server raised in the test's statements"
        );
        assert_eq!(evidence(&code(2), true), Evidence::Lost);
        assert_eq!(
            evidence(&exit(None, Some(9), true), true),
            Evidence::Test(TestStatus::Errored),
            "a time-out"
        );
        // No evidence about the test: the client's fault, never a verdict.
        assert_eq!(
            evidence(&code(1), false),
            Evidence::None(PsqlFault::OwnError { code: 1 }),
            "Debian's wrapper with no client behind it"
        );
        assert_eq!(
            evidence(&code(1), true),
            Evidence::None(PsqlFault::OwnError { code: 1 })
        );
        assert_eq!(evidence(&code(2), false), Evidence::NoSession);
        assert_eq!(
            evidence(&code(0), false),
            Evidence::None(PsqlFault::RanNothing),
            "a wrapper that runs nothing"
        );
        assert_eq!(
            evidence(&code(3), false),
            Evidence::None(PsqlFault::Ended {
                how: "exit 3".into()
            }),
            "exit 3 without a session is no statement's error"
        );
        assert_eq!(
            evidence(&code(127), false),
            Evidence::None(PsqlFault::Ended {
                how: "exit 127".into()
            })
        );
        assert_eq!(
            evidence(&exit(None, Some(9), false), true),
            Evidence::None(PsqlFault::Ended {
                how: "signal 9".into()
            })
        );
    }
}
