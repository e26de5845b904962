//! Tests that try to break the runner-harness rule: scripts hidden behind `./`, quotes, `&&`
//! and wrappers; words that only look like files; tool configuration inside and outside the
//! test paths; dependency manifests; runner test globs the test paths do not cover.

use std::path::Path;

use consort_actors::{ChangeSet, FileChange, FileHashes};
use consort_actors::{RuleViolation, Writer, check_change_set};

use super::*;
use crate::config::{ConfigError, ProjectConfig, Sandbox};

use crate::config::tests::MINIMAL;

fn tests_policy(globs: &[&str]) -> PathPolicy {
    PathPolicy::new(globs, &[]).expect("globs")
}

fn command(cmd: &str) -> RunnerConfig {
    command_with(cmd, true, None)
}

/// A command runner of `cmd`, its output read as TAP or not, with `single_test` as the
/// command for one test.
fn command_with(cmd: &str, tap: bool, single_test: Option<String>) -> RunnerConfig {
    RunnerConfig::Command {
        command: cmd.into(),
        junit: None,
        tap,
        single_test,
        timeout_secs: 60,
        pass_env: Vec::new(),
        collects: None,
        sandbox: Sandbox::Landlock,
        view: None,
        env_set: Default::default(),
        stdout: Default::default(),
        shards: None,
        split_above_secs: None,
        per_step: Default::default(),
    }
}

/// The harness of a command runner with `tests/**` as the test paths.
fn harness_of(cmd: &str) -> RunnerHarness {
    RunnerHarness::of(&command(cmd), &tests_policy(&["tests/**"]))
}

fn files_of(cmd: &str) -> Vec<String> {
    harness_of(cmd).files.into_iter().map(|f| f.path).collect()
}

/// A whole configuration with `[paths]` and `[runner]` bodies.
fn config(paths: &str, runner: &str) -> Result<ProjectConfig, ConfigError> {
    let text = format!("{MINIMAL}\n[paths]\n{paths}\n\n[runner]\n{runner}\n");
    ProjectConfig::parse(&text, Path::new("consort.toml"))
}

/// The path policy of a configuration that loads, with `[paths]` and `[runner]` bodies.
/// Asserts that `p` counts every path of `harness` as harness and none of `not`.
fn assert_harness(p: &PathPolicy, harness: &[&str], not: &[&str]) {
    for f in harness {
        assert!(p.is_harness(f), "{f} should be harness");
    }
    for f in not {
        assert!(!p.is_harness(f), "{f} should not be harness");
    }
}

fn policy_of(paths: &str, runner: &str) -> PathPolicy {
    config(paths, runner)
        .expect("loads")
        .path_policy()
        .expect("policy")
}

fn words(line: &str) -> Vec<Vec<String>> {
    simple_commands(line)
        .into_iter()
        .map(|c| c.into_iter().map(|w| w.text).collect())
        .collect()
}

#[test]
fn commands_split_into_words_as_sh_reads_them() {
    assert_eq!(
        words("cd a&&./run.sh 'x y' \"q\\\"t\"; pytest -q|tee out # note\nmake"),
        vec![
            vec!["cd", "a"],
            vec!["./run.sh", "x y", "q\"t"],
            vec!["pytest", "-q"],
            vec!["tee", "out"],
            vec!["make"],
        ]
    );
    assert_eq!(
        words("a\\ b 2>&1 >log || (c) & d"),
        vec![vec!["a b", "2", "1", "log"], vec!["c"], vec!["d"]]
    );
    let w = simple_commands("sh $(echo a; echo b) \"${X}/run.sh\" tests/*.sh 'lit*'");
    assert_eq!(w.len(), 1, "a substitution splits nothing: {w:?}");
    assert!(w[0][1].dynamic && w[0][2].dynamic);
    assert!(w[0][3].pattern && !w[0][3].dynamic);
    assert!(!w[0][4].pattern, "a quoted star is literal");
}

#[test]
fn broken_command_lines_never_panic() {
    for line in [
        "'unterminated",
        "\"unterminated \\",
        "$(",
        "`",
        "${",
        "\\",
        "sh -c",
        "sh -c \"sh -c 'sh -c \\\"sh -c ./deep.sh\\\"'\"",
        "ünïcödé/ßcript.sh ✓",
        "timeout",
        "env -u",
        "-- - + +o",
        "",
    ] {
        let h = harness_of(line);
        let _ = h.outside_test_globs();
        let _ = h.describe();
    }
}

#[test]
fn the_script_a_command_runs_is_harness_however_it_is_spelt() {
    assert_eq!(
        files_of("sh scripts/run-tests.sh"),
        ["scripts/run-tests.sh"]
    );
    assert_eq!(files_of("./run-tests.sh"), ["run-tests.sh"]);
    assert_eq!(files_of("bash -e ci/test.sh --fast"), ["ci/test.sh"]);
    assert_eq!(files_of("python tools/run.py"), ["tools/run.py"]);
    assert_eq!(files_of("python3 -u tools/run.py -v"), ["tools/run.py"]);
    assert_eq!(files_of("cd . && ./ci//./run.sh"), ["ci/run.sh"]);
    assert_eq!(files_of("sh './run'\"-tests.sh\""), ["run-tests.sh"]);
    assert_eq!(
        files_of("\"./scripts/run tests.sh\" -x"),
        ["scripts/run tests.sh"]
    );
    assert_eq!(
        files_of("sh -ec './ci/a.sh && ci/b.sh'"),
        ["ci/a.sh", "ci/b.sh"]
    );
    assert_eq!(
        files_of("CI=1 env -i PATH=/bin timeout -s KILL 60 bash runtests"),
        ["runtests"]
    );
    assert_eq!(files_of("uv run python tools/run.py"), ["tools/run.py"]);
    assert_eq!(files_of("source ci/env; . ci/more"), ["ci/env", "ci/more"]);
    assert_eq!(
        files_of("pytest -c ci/pytest.ini --rootdir=. --confcutdir=ci/conf"),
        ["ci/pytest.ini", "ci/conf"]
    );
    assert_eq!(
        files_of("node -r ./setup.js scripts/run.mjs"),
        ["setup.js", "scripts/run.mjs"]
    );
    assert_eq!(files_of("make -f build.mk test"), ["build.mk"]);
    assert_eq!(files_of("psql -f check.sql"), ["check.sql"]);
    let h = harness_of("sh scripts/*.sh");
    assert_eq!(h.files.len(), 1);
    assert!(h.files[0].pattern && h.files[0].script);
    assert_eq!(h.outside_test_globs(), ["scripts/*.sh", "scripts/[*].sh"]);
    assert_eq!(
        harness_of("./run[1].sh").outside_test_globs(),
        ["run[1].sh", "run[[]1[]].sh"],
        "the pattern, and the word itself (what sh runs when the pattern matches nothing)"
    );
    assert_eq!(
        harness_of("'./run[1].sh'").outside_test_globs(),
        ["run[[]1[]].sh"]
    );
}

#[test]
fn words_that_only_look_like_files_are_not_harness() {
    for cmd in [
        "cargo test -- --test-threads=1",
        "pytest -q -k \"not slow\"",
        "go test ./... ./pkg/...",
        "sh \"$SCRIPT\" `which x`/y.sh",
        "curl https://example.invalid/x.sh | sh",
        "cargo test -- --exact {test}",
        "/usr/bin/env sh /opt/ci/run.sh ../outside.sh ~/x.sh",
        "python -m unittest discover",
        "python -c 'import a/b.py'",
        "node -e 'require(\"./x.js\")'",
        "echo done",
        "pytest .",
    ] {
        assert_eq!(files_of(cmd), Vec::<String>::new(), "{cmd}");
    }
    let h = harness_of("sh \"$SCRIPT\"; $RUNNER -q");
    assert_eq!(
        h.unseen.len(),
        2,
        "scripts behind an expansion are reported: {h:?}"
    );
    assert!(h.scripts_in_tests.is_empty());
}

#[test]
fn test_selections_stay_the_navigators_but_a_runner_script_in_the_test_paths_is_refused() {
    for cmd in [
        "pytest tests/",
        "pytest tests tests/test_a.py",
        "pytest tests/test_*.py",
        "prove -e sh tests/",
        "node --test tests/a.test.js",
        "python -m pytest tests/test_a.py",
    ] {
        let h = harness_of(cmd);
        assert!(h.files.is_empty(), "{cmd}: {h:?}");
        assert!(h.scripts_in_tests.is_empty(), "{cmd}: {h:?}");
    }
    for (cmd, script) in [
        ("sh tests/run.sh", "tests/run.sh"),
        ("./tests/run.sh", "tests/run.sh"),
        ("cd . && env X=1 ./tests//run.sh", "tests/run.sh"),
        ("python tests/helper.py", "tests/helper.py"),
        ("bash -c 'sh tests/run.sh'", "tests/run.sh"),
        ("sh tests/*.sh", "tests/*.sh"),
    ] {
        let h = harness_of(cmd);
        let found: Vec<&str> = h.scripts_in_tests.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(found, [script], "{cmd}");
        let e = check_runner(&command(cmd), &tests_policy(&["tests/**"])).expect_err("refused");
        assert!(
            matches!(&e, RunnerConfigError::ScriptInTestPaths { key: "runner.command", path } if path == script),
            "{cmd}: {e}"
        );
    }
}

#[test]
fn tools_are_detected_from_the_words() {
    for (tools, commands) in [
        (
            vec![Tool::Python],
            &[
                "pytest -q",
                "python -m pytest",
                ".venv/bin/pytest tests",
                "uv run pytest",
                "tox -e py312",
            ][..],
        ),
        (
            vec![Tool::Cargo],
            &["cargo nextest run", "cargo test --workspace"],
        ),
        (
            vec![Tool::Node],
            &[
                "npx vitest run",
                "pnpm test",
                "yarn jest --ci",
                "sh -c 'npm test'",
            ],
        ),
        (vec![Tool::Go], &["go test ./..."]),
        (vec![Tool::Make], &["make -C sub test"]),
        (vec![Tool::Cargo, Tool::Make], &["make && cargo test"]),
        (vec![], &["sh run.sh", "./gopher.sh"]),
    ] {
        for cmd in commands {
            assert_eq!(harness_of(cmd).tools, tools, "{cmd}");
        }
    }
    let psql = RunnerConfig::default();
    assert_eq!(
        RunnerHarness::of(&psql, &tests_policy(&["tests/**"])),
        RunnerHarness::default(),
        "the psql runner reads no configuration file"
    );
}

#[test]
fn the_single_test_command_counts_too() {
    let runner = command_with("pytest -q", false, Some("sh ci/one.sh {test}".into()));
    let h = RunnerHarness::of(&runner, &tests_policy(&["tests/**"]));
    assert_eq!(h.files.len(), 1);
    assert_eq!(
        (h.files[0].key, h.files[0].path.as_str()),
        ("runner.single_test", "ci/one.sh")
    );
}

#[test]
fn a_conftest_outside_the_test_paths_is_harness_and_inside_them_a_test() {
    let p = policy_of(
        "tests = [\"tests/**\"]",
        "kind = \"command\"\ncommand = \"pytest -q\"",
    );
    assert_harness(
        &p,
        &[
            "conftest.py",
            "src/pkg/conftest.py",
            "pyproject.toml",
            "pkg/sub/pyproject.toml",
            "pytest.ini",
            "setup.cfg",
            "tox.ini",
            "requirements-dev.txt",
            "uv.lock",
        ],
        // setup.py is code.
        &["tests/conftest.py", "src/app.py", "setup.py"],
    );
    assert!(p.is_test("tests/conftest.py"));
    // With narrower test paths the same file is harness.
    let narrow = policy_of(
        "tests = [\"tests/**/test_*.py\"]",
        "kind = \"command\"\ncommand = \"pytest -q\"",
    );
    assert!(narrow.is_harness("tests/conftest.py"));
    // The Navigator may write one in RED, beside the entry's test file.
    let red = ChangeSet {
        summary: "red".into(),
        changes: vec![write("tests/conftest.py"), write("tests/test_a.py")],
    };
    let p = policy_of(
        "tests = [\"tests/**\"]",
        "kind = \"command\"\ncommand = \"pytest\"",
    );
    let writer = Writer::Red {
        must_write: "tests/test_a.py",
    };
    assert!(check_change_set(&red, writer, &p, &FileHashes::new()).is_ok());
}

fn write(path: &str) -> FileChange {
    FileChange::Write {
        path: path.into(),
        content: "x".into(),
    }
}

#[test]
fn a_driver_touching_a_dependency_manifest_is_refused_with_the_typed_reason_and_the_hint() {
    for (cmd, manifest) in [
        ("pytest -q", "pyproject.toml"),
        ("python -m pytest", "./pyproject.toml"),
        ("cargo test", "Cargo.toml"),
        ("cargo test", "crates/x/Cargo.toml"),
        ("cargo test", "Cargo.lock"),
        ("npm test", "package.json"),
        ("npx jest", "package-lock.json"),
        ("go test ./...", "go.mod"),
    ] {
        let c = config(
            "tests = [\"tests/**\"]",
            &format!("kind = \"command\"\ncommand = \"{cmd}\""),
        )
        .expect("loads");
        let policy = c.machine_config().expect("machine").paths;
        let set = ChangeSet {
            summary: "add a dependency".into(),
            changes: vec![write("src/app.py"), write(manifest)],
        };
        let v =
            check_change_set(&set, Writer::Code, &policy, &FileHashes::new()).expect_err("refused");
        let normalised = normalise_relative(manifest).expect("plain");
        assert_eq!(
            v,
            RuleViolation::TouchesHarness {
                path: normalised.clone()
            },
            "{cmd}"
        );
        let text = v.to_string();
        assert!(text.contains(&normalised), "{text}");
        assert!(text.contains("new dependency"), "{text}");
        assert!(text.contains("a human's change"), "{text}");
    }
}

#[test]
fn a_named_script_is_refused_to_the_driver_by_what_it_reaches_not_its_spelling() {
    let policy = policy_of(
        "tests = [\"tests/**\"]",
        "kind = \"command\"\ncommand = \"cd . && ./scripts/run-tests.sh\"",
    );
    for spelling in [
        "scripts/run-tests.sh",
        "./scripts/run-tests.sh",
        "scripts//run-tests.sh",
    ] {
        let set = ChangeSet {
            summary: "c".into(),
            changes: vec![write(spelling)],
        };
        assert_eq!(
            check_change_set(&set, Writer::Code, &policy, &FileHashes::new()),
            Err(RuleViolation::TouchesHarness {
                path: "scripts/run-tests.sh".into()
            }),
            "{spelling}"
        );
    }
}

#[test]
fn runner_test_globs_the_test_paths_cover_load() {
    for (paths, runner_tests) in [
        ("[\"tests/**\"]", "[\"tests/**/*.sql\"]"),
        (
            "[\"tests/**\"]",
            "[\"tests/*.sql\", \"tests/unit/**/*.sql\"]",
        ),
        ("[\"tests/**/*.sql\"]", "[\"tests/**/*.sql\"]"),
        ("[\"db/tests/**\", \"tests/**\"]", "[\"db/tests/**/*.sql\"]"),
        ("[\"**/*_test.sql\"]", "[\"sql/**/*_test.sql\"]"),
        ("[\"tests/**/*.sql\"]", "[\"tests/smoke/*.sql\"]"),
    ] {
        config(
            &format!("tests = {paths}"),
            &format!("kind = \"psql\"\ntests = {runner_tests}"),
        )
        .unwrap_or_else(|e| panic!("{paths} / {runner_tests}: {e}"));
    }
}

#[test]
fn runner_test_globs_the_test_paths_do_not_cover_are_refused_naming_both_keys() {
    for (paths, runner_tests) in [
        ("[\"tests/**\"]", "[\"**/*.sql\"]"),
        ("[\"tests/**\"]", "[\"src/**/*.sql\"]"),
        ("[\"tests/**\"]", "[\"tests/**/*.sql\", \"test*/*.sql\"]"),
        ("[\"tests/**/*.sql\"]", "[\"tests/**\"]"),
        ("[\"tests/**/*_test.sql\"]", "[\"tests/**/*.sql\"]"),
        ("[\"tests/**\"]", "[\"{tests,src}/*.sql\"]"),
    ] {
        let e = config(
            &format!("tests = {paths}"),
            &format!("kind = \"psql\"\ntests = {runner_tests}"),
        )
        .expect_err("refused");
        let text = e.to_string();
        assert!(
            matches!(&e, ConfigError::Invalid { key, .. } if key == "runner.tests"),
            "{text}"
        );
        assert!(
            text.contains("`runner.tests`") && text.contains("`paths.tests`"),
            "{text}"
        );
        assert!(!text.contains("\\\""), "no Debug quoting: {text}");
    }
    // The default psql runner with narrowed test paths is refused too.
    let e = config("tests = [\"spec/**\"]", "kind = \"psql\"").expect_err("refused");
    assert!(e.to_string().contains("tests/**/*.sql"), "{e}");
}

#[test]
fn the_report_must_be_a_plain_relative_path() {
    let runner =
        |junit: &str| format!("kind = \"command\"\ncommand = \"cargo test\"\njunit = \"{junit}\"");
    config("tests = [\"tests/**\"]", &runner("./reports//junit.xml")).expect("loads");
    for (junit, why) in [
        ("../junit.xml", "plain relative"),
        ("/tmp/j.xml", "plain relative"),
    ] {
        let e = config("tests = [\"tests/**\"]", &runner(junit)).expect_err("refused");
        assert!(
            matches!(&e, ConfigError::Invalid { key, .. } if key == "runner.junit"),
            "{e}"
        );
        assert!(e.to_string().contains(why), "{e}");
    }
}

#[test]
fn a_runner_script_in_the_test_paths_is_a_configuration_error() {
    let e = config(
        "tests = [\"tests/**\"]",
        "kind = \"command\"\ncommand = \"pytest\"\nsingle_test = \"./tests/one.sh {test}\"",
    )
    .expect_err("refused");
    assert!(
        matches!(&e, ConfigError::Invalid { key, .. } if key == "runner.single_test"),
        "{e}"
    );
    assert!(e.to_string().contains("tests/one.sh") && e.to_string().contains("`paths.tests`"));
}

#[test]
fn the_defaults_load() {
    ProjectConfig::parse(MINIMAL, Path::new("consort.toml")).expect("the defaults load");
}

#[test]
fn describe_lists_what_is_protected_for_people() {
    let c = config(
        "tests = [\"tests/**\"]",
        "kind = \"command\"\ncommand = \"sh scripts/run.sh && pytest -c ci/pytest.ini\"\njunit = \"out/junit.xml\"",
    )
    .expect("loads");
    let lines = c.runner_harness().expect("harness").describe();
    assert_eq!(
        lines[..2],
        [
            "scripts/run.sh (run by runner.command)",
            "ci/pytest.ini (named by runner.command)",
        ]
    );
    assert!(lines[2].starts_with(
        "Python configuration, at any depth outside the test paths: pyproject.toml, "
    ));
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines.iter().all(|l| !l.contains('"')), "{lines:?}");
}

#[test]
fn the_table_globs_compile_and_name_each_file_at_any_depth() {
    for tool in Tool::ALL {
        for g in tool.globs() {
            assert!(g.starts_with("**/"), "{g}");
            check_glob(&g).unwrap_or_else(|e| panic!("{tool}: {e}"));
        }
        assert!(!tool.words().is_empty() && !tool.files().is_empty());
    }
    let p = PathPolicy::new(&["tests/**"], &[])
        .and_then(|p| p.with_harness_outside_tests(&Tool::Node.globs().collect::<Vec<_>>()))
        .expect("globs");
    assert_harness(
        &p,
        &[
            "jest.config.ts",
            "web/vite.config.mjs",
            ".mocharc.yml",
            "tsconfig.build.json",
        ],
        &["src/index.ts"],
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    /// Any command line is read without a panic, and what it adds always compiles.
    #[test]
    fn any_command_line_is_read_without_a_panic(
        line in "[ -~\\n\\t\\u{e9}\\u{2713}]{0,80}",
        single in proptest::option::of("[ -~]{0,40}"),
    ) {
        let runner = command_with(&line, true, single);
        let tests = tests_policy(&["tests/**"]);
        let h = RunnerHarness::of(&runner, &tests);
        let globs = h.outside_test_globs();
        proptest::prop_assert!(tests.clone().with_harness_outside_tests(&globs).is_ok());
        let _ = check_runner(&runner, &tests);
        let _ = h.describe();
    }
}
