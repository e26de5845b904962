//! The command runner: the project's own test command, run by `sh -c` in the work tree.

use std::path::{Path, PathBuf};
use std::time::Duration;

use consort_actors::{TestOutcome, TestStatus};
use tracing::warn;

use super::capture::{Capture, OutputLimits};
use super::junit::parse_junit;
use super::process::{EnvPolicy, ProcOutcome, ProcSpec, run, shell_quote, tree_path};
use super::select::Selector;
use super::{RunContext, RunReport, Suite, TestRunner, redact, redact_outcomes};
use crate::error::{Error, Refusal, Result, TestCommandFault};
use crate::provider::BoxFuture;

/// How the command runner runs and reads the project's tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRunnerConfig {
    /// The test command, run with `sh -c` in the work tree (`cargo test`, `pytest -q`, …).
    pub command: String,
    /// A JUnit XML report the command writes, relative to the run's private report directory
    /// (never the work tree): the command finds the directory in `$CONSORT_REPORT_DIR` and the
    /// full path in `$CONSORT_JUNIT` (e.g. `pytest --junitxml="$CONSORT_JUNIT"`). Each run has
    /// a fresh directory, so a stale report is never read.
    pub junit_path: Option<PathBuf>,
    /// How a JUnit case is named: `{classname}` and `{name}` are replaced.
    pub junit_name_format: String,
    /// Read per-test results from standard output when there is no JUnit report.
    pub tap: bool,
    /// The form standard output is read in when `tap` is on (default TAP; also libtest's
    /// lines and `go test -json`).
    pub stdout_format: crate::runner::StdoutFormat,
    /// A command that runs one test, with `{test}` replaced by the (shell-quoted) test name.
    /// Used when the output gives no per-test outcomes: it is run for each expected test when
    /// the suite fails, so RED can show that the new test fails and the others pass.
    pub single_test_command: Option<String>,
    /// Time limit of each command; the whole process group is killed at the limit.
    pub timeout: Duration,
    /// Start each process in a fresh view of the work tree ([`RunContext::view`]), where the
    /// test tool may create files beside its configuration, discarded with the run; otherwise
    /// in the work tree, which is read-only to it.
    pub view: bool,
    /// The environment policy.
    pub env: EnvPolicy,
    /// Output limits.
    pub limits: OutputLimits,
    /// How the command's tool runs a selection of test files and lists the whole suite, when
    /// it can (a suite split over branches needs both); `None` runs it whole.
    pub select: Option<Selector>,
}

impl CommandRunnerConfig {
    /// A configuration for `command` with defaults (TAP detection on, 10-minute limit).
    pub fn new(command: impl Into<String>) -> Self {
        CommandRunnerConfig {
            command: command.into(),
            junit_path: None,
            junit_name_format: "{classname}::{name}".into(),
            tap: true,
            stdout_format: crate::runner::StdoutFormat::Tap,
            single_test_command: None,
            timeout: Duration::from_secs(600),
            view: false,
            env: EnvPolicy::default(),
            limits: OutputLimits::default(),
            select: None,
        }
    }
}

/// Runs the configured command; see [`CommandRunnerConfig`].
#[derive(Debug, Clone)]
pub struct CommandRunner {
    cfg: CommandRunnerConfig,
}

impl CommandRunner {
    /// A runner with this configuration.
    pub fn new(cfg: CommandRunnerConfig) -> Self {
        CommandRunner { cfg }
    }

    fn spec(&self, ctx: &RunContext, command: &str, junit: Option<&PathBuf>) -> Result<ProcSpec> {
        let mut env = self.cfg.env.build_for(ctx);
        if let Some(j) = junit {
            env.push(("CONSORT_JUNIT".into(), j.display().to_string()));
        }
        Ok(ProcSpec {
            program: PathBuf::from("sh"),
            args: vec!["-c".into(), command.to_string()],
            cwd: if self.cfg.view {
                ctx.process_view()?
            } else {
                ctx.work_tree.clone()
            },
            env,
            timeout: self.cfg.timeout,
            jail: ctx.jail.clone(),
        })
    }

    /// The outcomes the command's JUnit report holds (None without one configured, or when it
    /// is unreadable, which `capture` then says), or the test command's fault: a program that is
    /// not there, no report, a report without a test while tests are expected. A command
    /// Consort stopped at its time or output limit is never the test command's fault.
    fn report_outcomes(
        &self,
        ctx: &RunContext,
        main: &ProcOutcome,
        junit: Option<&PathBuf>,
        capture: &mut Capture,
    ) -> std::result::Result<Option<Vec<TestOutcome>>, TestCommandFault> {
        if main.exit.timed_out || main.over_cap {
            return Ok(junit
                .and_then(|path| std::fs::read_to_string(path).ok())
                .and_then(|xml| parse_junit(&xml, &self.cfg.junit_name_format).ok()));
        }
        if let Some(code @ (126 | 127)) = main.exit.code {
            return Err(TestCommandFault::ProgramNotFound { code });
        }
        let Some(path) = junit else {
            return Ok(None);
        };
        let Ok(xml) = std::fs::read_to_string(path) else {
            let path = path.display().to_string();
            return Err(TestCommandFault::NoReport { path });
        };
        match parse_junit(&xml, &self.cfg.junit_name_format) {
            Ok(o) if o.is_empty() && !ctx.expected().is_empty() => {
                Err(TestCommandFault::CollectedNothing {
                    expected: ctx.expected().len(),
                })
            }
            Ok(o) => Ok(Some(o)),
            Err(e) => {
                warn!(error = %e, "unreadable JUnit report");
                capture.push_str(&format!("\n[consort: {e}]\n"));
                Ok(None)
            }
        }
    }

    /// The JUnit report's path in the run's private report directory, when one is configured.
    fn junit(&self, ctx: &RunContext) -> Result<Option<PathBuf>> {
        match &self.cfg.junit_path {
            Some(p) => Ok(Some(tree_path(&ctx.scratch.reports(), p)?)),
            None => Ok(None),
        }
    }

    /// The command of this run: the configured one, on the selected files only when the run is
    /// a shard.
    fn command(&self, ctx: &RunContext) -> String {
        match (&ctx.select, self.cfg.select) {
            (Some(files), Some(selector)) => selector.select(&self.cfg.command, files),
            _ => self.cfg.command.clone(),
        }
    }

    /// The whole suite as the tool lists it (see [`Selector::collect`]).
    async fn collect_inner(&self, ctx: &RunContext) -> Result<Option<Suite>> {
        let Some(selector) = self.cfg.select else {
            return Ok(None);
        };
        let limits = self.cfg.limits;
        let mut capture = Capture::new(&limits);
        let junit = self.junit(ctx)?;
        let spec = self.spec(ctx, &selector.collect(&self.cfg.command), junit.as_ref())?;
        let listed = run(&spec, &mut capture, &limits).await?;
        let suite = selector.parse(
            listed.exit.code,
            &String::from_utf8_lossy(&listed.stdout),
            &self.cfg.junit_name_format,
            &[spec.cwd.as_path(), ctx.work_tree.as_path()],
        );
        if suite.is_none() {
            warn!(exit = ?listed.exit.code, "the test command could not list its suite; it runs whole");
        }
        Ok(suite)
    }

    /// Each of the `expected` tests by the single-test command `single`: passed when it exits
    /// 0, errored at its time limit, failed otherwise; a program the shell could not find or
    /// run (126, 127) is no verdict on the test but the command's fault.
    async fn per_test(
        &self,
        ctx: &RunContext,
        single: &str,
        expected: &[String],
        capture: &mut Capture,
    ) -> Result<Vec<TestOutcome>> {
        let limits = self.cfg.limits;
        let mut per_test = Vec::new();
        for t in expected {
            let cmd = single.replace("{test}", &shell_quote(t));
            capture.push_str(&format!("\n== consort: single test {t} ==\n"));
            let spec = self.spec(ctx, &cmd, None)?;
            let one = run(&spec, capture, &limits).await?;
            if let Some(code @ (126 | 127)) = one.exit.code {
                return Err(Error::TestCommand {
                    command: redact(single, &ctx.conn),
                    fault: TestCommandFault::ProgramNotFound { code },
                    output: redact(&capture.clone().finish().excerpt, &ctx.conn),
                });
            }
            let status = if one.exit.success() {
                TestStatus::Passed
            } else if one.exit.timed_out {
                TestStatus::Errored
            } else {
                TestStatus::Failed
            };
            per_test.push(TestOutcome::new(t, status));
        }
        Ok(per_test)
    }

    async fn run_inner(&self, ctx: &RunContext) -> Result<RunReport> {
        let limits = self.cfg.limits;
        let mut capture = Capture::new(&limits);
        let junit = self.junit(ctx)?;
        let mut command = self.command(ctx);
        let spec = self.spec(ctx, &command, junit.as_ref())?;
        let main = run(&spec, &mut capture, &limits).await?;
        if !main.exit.success()
            && let Some(package) = npm_package_not_installed(&capture.clone().finish().excerpt)
        {
            return Err(Error::TestCommand {
                command: redact(&self.cfg.command, &ctx.conn),
                fault: TestCommandFault::NotInstalled { package },
                output: redact(&capture.finish().excerpt, &ctx.conn),
            });
        }

        let mut outcomes = match self.report_outcomes(ctx, &main, junit.as_ref(), &mut capture) {
            Ok(o) => o,
            Err(fault) => {
                let output = capture.finish().excerpt;
                return Err(Error::TestCommand {
                    command: redact(&self.cfg.command, &ctx.conn),
                    fault: python_lacking(fault, &output, &ctx.work_tree, &self.cfg.command),
                    output: redact(&output, &ctx.conn),
                });
            }
        };
        if outcomes.is_none() && self.cfg.tap {
            outcomes = self.cfg.stdout_format.parse(
                &String::from_utf8_lossy(&main.stdout),
                &String::from_utf8_lossy(&main.stderr),
            );
        }
        let mut outcomes = match outcomes {
            Some(o) => o,
            None => {
                let expected = ctx.expected();
                if main.exit.success() {
                    if expected.is_empty() {
                        vec![TestOutcome::new("(suite)", TestStatus::Passed)]
                    } else {
                        expected
                            .iter()
                            .map(|t| TestOutcome::new(t, TestStatus::Passed))
                            .collect()
                    }
                } else if let (Some(single), false) = (
                    &self.cfg.single_test_command,
                    main.exit.timed_out || main.over_cap,
                ) {
                    if !expected.is_empty() {
                        command = format!("{command}; then per test: {single}");
                    }
                    self.per_test(ctx, single, &expected, &mut capture).await?
                } else {
                    Vec::new()
                }
            }
        };
        if let Some(refusal) = refusal(ctx, &main, &outcomes) {
            return Err(Error::TestCommand {
                command: redact(&self.cfg.command, &ctx.conn),
                fault: TestCommandFault::Refused {
                    refusal: Box::new(refusal),
                },
                output: redact(&capture.finish().excerpt, &ctx.conn),
            });
        }
        // A run that did not succeed must show a failure somewhere.
        if !main.exit.success()
            && !outcomes
                .iter()
                .any(|o| matches!(o.status, TestStatus::Failed | TestStatus::Errored))
        {
            outcomes.push(TestOutcome::new(
                TestOutcome::WHOLE_RUN,
                TestStatus::Errored,
            ));
        }
        let done = capture.finish();
        redact_outcomes(&mut outcomes, &ctx.conn);
        Ok(RunReport {
            command: redact(&command, &ctx.conn),
            outcomes,
            exit: main.exit,
            output_digest: done.digest,
            output_excerpt: redact(&done.excerpt, &ctx.conn),
            output_bytes: done.total,
            sessions_lost: Vec::new(),
        })
    }
}

/// What the confinement refused a run that failed, as its output and its failures' messages
/// show (see `denial.rs`): a failure so is no verdict.
fn refusal(ctx: &RunContext, main: &ProcOutcome, outcomes: &[TestOutcome]) -> Option<Refusal> {
    let failed = outcomes.iter().filter(|o| o.is_failure());
    if main.exit.success() && failed.clone().next().is_none() {
        return None;
    }
    let mut text = String::from_utf8_lossy(&main.stdout).into_owned();
    text.push('\n');
    text.push_str(&String::from_utf8_lossy(&main.stderr));
    for message in failed.filter_map(|o| o.message.as_deref()) {
        text.push('\n');
        text.push_str(message);
    }
    ctx.jail.refusal(&text)
}

/// The package npm reports it could not find offline (`code ENOTCACHED`, "request to
/// https://registry…/<package> failed"): what `npx <tool>` says when the tool is not installed
/// where a run starts.
/// A command that wrote no report because the Python it starts lacks a module
/// (`No module named pytest`) is named so, with what to do; any other fault stays as it is.
fn python_lacking(
    fault: TestCommandFault,
    output: &str,
    work_tree: &Path,
    command: &str,
) -> TestCommandFault {
    match (fault, super::python_lacks(output)) {
        (TestCommandFault::NoReport { .. }, Some(module)) => TestCommandFault::PythonLacks {
            advice: super::python_lacks_advice(
                module,
                super::unused_project_python(work_tree, command),
            ),
        },
        (fault, _) => fault,
    }
}

fn npm_package_not_installed(output: &str) -> Option<String> {
    if !output.contains("ENOTCACHED") {
        return None;
    }
    let line = output
        .lines()
        .find(|l| l.contains("request to ") && l.contains(" failed"))?;
    let url = line.split("request to ").nth(1)?.split(" failed").next()?;
    let package = url.trim_end_matches('/').rsplit('/').next()?;
    let package = package.replace("%2f", "/").replace("%2F", "/");
    (!package.is_empty()).then_some(package)
}

impl TestRunner for CommandRunner {
    fn name(&self) -> &'static str {
        "command"
    }

    fn run<'a>(&'a self, ctx: &'a RunContext) -> BoxFuture<'a, Result<RunReport>> {
        Box::pin(self.run_inner(ctx))
    }

    fn collect<'a>(&'a self, ctx: &'a RunContext) -> BoxFuture<'a, Result<Option<Suite>>> {
        Box::pin(self.collect_inner(ctx))
    }

    fn selects(&self) -> bool {
        self.cfg.select.is_some()
    }

    fn selection_reaches(&self, selected: &str, other: &str) -> bool {
        match self.cfg.select {
            Some(selector) => selector.reaches(selected, other),
            None => selected == other,
        }
    }

    fn file_of(&self, test: &str, files: &[String], tree: &Path) -> Option<String> {
        self.cfg
            .select?
            .file_of(test, files, &self.cfg.junit_name_format, tree)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npx_of_a_package_that_is_not_installed_is_named() {
        let npm10 = "npm error code ENOTCACHED\nnpm error request to https://registry.npmjs.org/vitest failed: cache mode is 'only-if-cached' but no cached response is available.\n";
        assert_eq!(npm_package_not_installed(npm10).as_deref(), Some("vitest"));
        let scoped = "npm ERR! code ENOTCACHED\nnpm ERR! request to https://registry.npmjs.org/@vitest%2fui failed: cache mode is 'only-if-cached'\n";
        assert_eq!(
            npm_package_not_installed(scoped).as_deref(),
            Some("@vitest/ui")
        );
        assert_eq!(
            npm_package_not_installed("FAIL tests/a.test.js\nrequest to the server failed\n"),
            None,
            "a failing test that mentions a request is no install problem"
        );
    }
}
