//! The runner facts: how the project's tests run, as the Test Strategist, the Navigator and
//! the Driver are told in every assignment ([`consort_actors::RunnerFacts`]), and which files
//! the runner collects as tests (a test-list entry anywhere else is refused in the design lane).

use consort_actors::{RunnerFacts, TestIdentity};
use consort_lakebase::{BRANCH_ENV, StdoutFormat};

use crate::config::{ProjectConfig, RunnerConfig};

/// What every run starts from, whatever the runner.
const BEFORE_TESTS: &str = "Every run gets a fresh branch of the database; the schema plan's migrations (those of the stories up to the current test's) are applied to it first, then the runner loads the setup files and runs the tests. The run may read the work tree but not change it: a run that writes there is refused.";

/// What a step's run covers under `[runner] per_step = "feature"`.
const FEATURE_STEPS: &str = " A build step's run covers this feature's own tests up to the current entry; the whole suite (every earlier feature's tests and the project's own) runs at the GREEN and REFACTOR of each story's last entry, and a failure there is that step's to repair.";

/// What every run starts from, with the project's existing migrations when they are applied.
fn before_tests(config: &ProjectConfig) -> String {
    let scope = match config.runner.per_step() {
        consort_actors::StepScope::Feature => FEATURE_STEPS,
        consort_actors::StepScope::Whole => "",
    };
    format!("{}{scope}", before_tests_whole(config))
}

/// [`before_tests`] for a run of the whole suite.
fn before_tests_whole(config: &ProjectConfig) -> String {
    if config.migrations.apply_existing {
        format!(
            "{BEFORE_TESTS} The project's existing migrations (the other .sql files in {}/) are applied before the schema plan's. The test files the project had when the build lane opened are frozen like accepted ones: no role changes them, and every run must keep them passing.",
            config.migrations.dir
        )
    } else {
        format!(
            "{BEFORE_TESTS} The test files the project had when the build lane opened are frozen like accepted ones: no role changes them, and every run must keep them passing."
        )
    }
}

/// The runner facts of `config`.
pub fn runner_facts(config: &ProjectConfig) -> RunnerFacts {
    match &config.runner {
        RunnerConfig::Psql { setup, tests, .. } => RunnerFacts {
            runner: "psql".into(),
            command: "psql -X -q -v ON_ERROR_STOP=1 -c BEGIN -f <test file> -c ROLLBACK, one session per test file, after the setup files are loaded in sorted path order".into(),
            collects: tests.clone(),
            loads: setup.clone(),
            pass_rule: "A test file passes when psql exits 0; with ON_ERROR_STOP any SQL error or RAISE EXCEPTION fails it. Each test's changes are rolled back.".into(),
            before_tests: before_tests(config),
            environment: BRANCH_ENV.map(String::from).to_vec(),
            test_names: test_identity(config).form().into(),
        },
        RunnerConfig::Command {
            command,
            junit,
            tap,
            stdout,
            pass_env,
            env_set,
            ..
        } => RunnerFacts {
            runner: "command".into(),
            command: format!(
                "sh -c {} {}",
                consort_lakebase::shell_quote(command),
                where_it_runs(config)
            ),
            collects: collected_by_command(config).unwrap_or_default(),
            loads: Vec::new(),
            pass_rule: command_pass_rule(junit.is_some(), tap.then_some(*stdout)),
            before_tests: before_tests(config),
            environment: BRANCH_ENV
                .iter()
                .map(|v| v.to_string())
                .chain(["CONSORT_JUNIT", "CONSORT_REPORT_DIR"].map(String::from))
                .chain(pass_env.iter().cloned())
                .chain(env_set.keys().cloned())
                .collect(),
            test_names: test_identity(config).form().into(),
        },
    }
}

/// Where the test command's processes start, as an agent is told it.
fn where_it_runs(config: &ProjectConfig) -> &'static str {
    if runs_in_a_view(config) {
        "in a fresh view of the work tree (its files as links, read-only; the tool may create files of its own there, thrown away with the run), as the current directory"
    } else {
        "in the work tree, as the current directory (read-only to the run)"
    }
}

/// The command runner's command and how its results are read: its JUnit report, whether it
/// reads its standard output and in which form. None for psql.
fn reporting(
    config: &ProjectConfig,
) -> Option<(&str, &Option<std::path::PathBuf>, &bool, &StdoutFormat)> {
    match &config.runner {
        RunnerConfig::Command {
            command,
            junit,
            tap,
            stdout,
            ..
        } => Some((command, junit, tap, stdout)),
        RunnerConfig::Psql { .. } => None,
    }
}

/// How the configured runner names the tests it reports (see [`TestIdentity`]): a test-list
/// entry under another name is refused in the design lane, since no run could report it.
pub fn test_identity(config: &ProjectConfig) -> TestIdentity {
    let Some((command, junit, tap, stdout)) = reporting(config) else {
        return TestIdentity::FilePath;
    };
    if junit.is_some() {
        return match tool_named(command) {
            Some(Tool::Pytest) => TestIdentity::JunitModule,
            Some(Tool::Vitest) => TestIdentity::JunitFile,
            Some(Tool::Jest) if command.contains(JEST_FILE_CLASSNAME) => TestIdentity::JunitFile,
            _ => TestIdentity::Junit,
        };
    }
    match (tap, stdout) {
        (true, StdoutFormat::Libtest) => TestIdentity::Libtest,
        (true, StdoutFormat::GoTestJson) => TestIdentity::GoTest,
        _ => TestIdentity::Described,
    }
}

/// How the test command runs a selection of its test files and lists its suite, when its
/// tool can and its results name the tests as the listing does: pytest with a JUnit report,
/// `vitest run` with one (vitest 1, which cannot list, then runs whole), jest with
/// jest-junit naming each case's class by its file, and `go test -json ./...` read as Go's
/// events.
pub fn selector(config: &ProjectConfig) -> Option<consort_lakebase::Selector> {
    use consort_lakebase::Selector;
    let (command, junit, tap, stdout) = reporting(config)?;
    match (tool_named(command)?, junit, tap, stdout) {
        (Tool::Pytest, Some(_), ..) => Some(Selector::Pytest),
        (Tool::Vitest, Some(_), ..) => Selector::vitest(command),
        (Tool::Jest, Some(_), ..) => Selector::jest(command),
        (Tool::GoTest, None, true, StdoutFormat::GoTestJson) => Selector::go(command),
        _ => None,
    }
}

/// Whether the command runner starts its processes in a view of the tree (`[runner] view`,
/// by default only for vitest, whose vite writes beside its configuration).
pub fn runs_in_a_view(config: &ProjectConfig) -> bool {
    match &config.runner {
        RunnerConfig::Command { view, command, .. } => {
            view.unwrap_or_else(|| tool_named(command) == Some(Tool::Vitest))
        }
        RunnerConfig::Psql { .. } => false,
    }
}

pub use consort_lakebase::JEST_FILE_CLASSNAME;

/// The test tools whose defaults Consort knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tool {
    Pytest,
    GoTest,
    Vitest,
    Jest,
}

/// The test tool the command names, if it names one Consort knows.
fn tool_named(command: &str) -> Option<Tool> {
    let words: Vec<&str> = command
        .split(|c: char| c.is_whitespace() || c == ';' || c == '&' || c == '|')
        .filter(|w| !w.is_empty())
        .collect();
    let names = |w: &str| words.iter().any(|x| x.rsplit('/').next() == Some(w));
    if names("pytest") || names("py.test") {
        Some(Tool::Pytest)
    } else if names("go") && names("test") {
        Some(Tool::GoTest)
    } else if names("vitest") {
        Some(Tool::Vitest)
    } else if names("jest") {
        Some(Tool::Jest)
    } else {
        None
    }
}

fn command_pass_rule(junit: bool, stdout: Option<StdoutFormat>) -> String {
    let per_test = match (junit, stdout) {
        (true, _) => {
            "Each test's result is read from the JUnit report the command writes to $CONSORT_JUNIT"
        }
        (false, Some(StdoutFormat::Tap)) => {
            "Each test's result is read from the TAP the command prints"
        }
        (false, Some(StdoutFormat::Libtest)) => {
            "Each test's result is read from the `test <name> ... ok` lines cargo test prints (the test's name is its path in the crate, such as `tests::adds` or, in tests/x.rs, `adds`)"
        }
        (false, Some(StdoutFormat::GoTestJson)) => {
            "Each test's result is read from the events `go test -json` prints (the test's name is its function, such as `TestAdds`, or `TestAdds/case` for a subtest)"
        }
        (false, None) => "There are no per-test results",
    };
    format!(
        "{per_test}; when there are none, exit status 0 passes every expected test and any other fails them."
    )
}

/// The globs of the files the runner collects as tests, when known: `[runner] collects`, else
/// the default of the test tool the command names (pytest, go test, vitest, jest). None when
/// unknown: then every test path counts as collected.
pub fn collected(config: &ProjectConfig) -> Option<Vec<String>> {
    match &config.runner {
        RunnerConfig::Psql { tests, .. } => Some(tests.clone()),
        RunnerConfig::Command { .. } => collected_by_command(config),
    }
}

fn collected_by_command(config: &ProjectConfig) -> Option<Vec<String>> {
    let RunnerConfig::Command {
        command, collects, ..
    } = &config.runner
    else {
        return None;
    };
    if let Some(globs) = collects {
        return Some(globs.clone());
    }
    let globs: &[&str] = match tool_named(command)? {
        // pytest's default `python_files`; a project that sets its own lists it in `collects`.
        Tool::Pytest => &["**/test_*.py", "**/*_test.py"],
        Tool::GoTest => &["**/*_test.go"],
        Tool::Vitest | Tool::Jest => &["**/*.test.*", "**/*.spec.*", "**/__tests__/**"],
    };
    Some(globs.iter().map(|g| g.to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(cmd: &str, collects: Option<Vec<String>>) -> ProjectConfig {
        let mut c = crate::config::tests::minimal();
        c.runner = RunnerConfig::Command {
            command: cmd.into(),
            junit: None,
            tap: true,
            single_test: None,
            timeout_secs: 60,
            pass_env: vec!["APP_MODE".into()],
            env_set: [("APP_REGION".to_string(), "test".to_string())].into(),
            collects,
            sandbox: crate::config::Sandbox::Landlock,
            stdout: Default::default(),
            view: None,
            shards: None,
            split_above_secs: None,
            per_step: Default::default(),
        };
        c
    }

    #[test]
    fn the_test_tool_named_by_the_command_says_what_it_collects() {
        let cases: [(&str, Option<&str>); 5] = [
            (
                "pytest -q --junitxml=\"$CONSORT_JUNIT\"",
                Some("**/test_*.py"),
            ),
            ("python -m pytest", Some("**/test_*.py")),
            ("go test ./...", Some("**/*_test.go")),
            ("npx vitest run", Some("**/*.test.*")),
            ("make check", None),
        ];
        for (cmd, first) in cases {
            let got = collected(&command(cmd, None));
            assert_eq!(
                got.as_ref().and_then(|g| g.first()).map(String::as_str),
                first,
                "{cmd}"
            );
        }
        let own = collected(&command("pytest", Some(vec!["checks/**/*.py".into()])));
        assert_eq!(own, Some(vec!["checks/**/*.py".to_string()]));
    }

    #[test]
    fn facts_name_the_runner_the_pass_rule_and_the_environment() {
        let psql = runner_facts(&crate::config::tests::minimal());
        assert_eq!(psql.runner, "psql");
        assert!(psql.pass_rule.contains("exits 0"));
        assert!(!psql.loads.is_empty() && !psql.collects.is_empty());
        let cmd = runner_facts(&command("pytest -q", None));
        assert!(cmd.command.contains("pytest -q"));
        assert!(cmd.environment.iter().any(|v| v == "DATABASE_URL"));
        assert!(cmd.environment.iter().any(|v| v == "APP_MODE"));
        assert!(
            cmd.environment.iter().any(|v| v == "APP_REGION"),
            "env_set names are told"
        );
        assert!(cmd.pass_rule.contains("TAP"));
        assert!(cmd.before_tests.contains("migrations"));
    }

    #[test]
    fn only_vitest_runs_in_a_view_unless_configured() {
        assert!(runs_in_a_view(&command("npx vitest run", None)));
        assert!(!runs_in_a_view(&command("npx jest --ci", None)));
        assert!(!runs_in_a_view(&crate::config::tests::minimal()));
        let mut own = command("npx jest --ci", None);
        if let RunnerConfig::Command { view, .. } = &mut own.runner {
            *view = Some(true);
        }
        assert!(runs_in_a_view(&own));
    }

    #[test]
    fn each_runner_s_test_names_are_known_and_told() {
        let junit = |cmd: &str| {
            let mut c = command(cmd, None);
            if let RunnerConfig::Command { junit, .. } = &mut c.runner {
                *junit = Some("junit.xml".into());
            }
            c
        };
        let stdout = |format: StdoutFormat| {
            let mut c = command("cargo test", None);
            if let RunnerConfig::Command { stdout, .. } = &mut c.runner {
                *stdout = format;
            }
            c
        };
        let cases = [
            (crate::config::tests::minimal(), TestIdentity::FilePath),
            (
                junit("python3 -m pytest --junitxml=x"),
                TestIdentity::JunitModule,
            ),
            (
                junit("npx vitest run --reporter=junit"),
                TestIdentity::JunitFile,
            ),
            (junit("npx jest --ci"), TestIdentity::Junit),
            (
                junit(&format!("{JEST_FILE_CLASSNAME} npx jest --ci")),
                TestIdentity::JunitFile,
            ),
            (junit("mvn test"), TestIdentity::Junit),
            (stdout(StdoutFormat::Libtest), TestIdentity::Libtest),
            (stdout(StdoutFormat::GoTestJson), TestIdentity::GoTest),
            (command("./run-tap.sh", None), TestIdentity::Described),
        ];
        for (config, want) in cases {
            assert_eq!(test_identity(&config), want, "{:?}", config.runner);
            assert_eq!(runner_facts(&config).test_names, want.form());
            assert_eq!(
                config.path_policy().expect("policy").test_identity(),
                want,
                "the design lane judges with it"
            );
        }
    }
}
