//! What `consort doctor` checks about the test command before a run relies on it: that its
//! program is installed, and that one collection (or list) run of the tool finds tests.
//!
//! The collection runs the project's own tool in the project directory, unconfined and
//! without a database, exactly as the user would type it; it is a diagnostic, never a
//! verification, and nothing it prints is a receipt.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::{ProjectConfig, RunnerConfig};

/// How long a collection run may take.
const COLLECT_LIMIT: Duration = Duration::from_secs(300);

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Whether it passed.
    pub ok: bool,
    /// What was checked and what came of it.
    pub what: String,
    /// How to fix it, when it failed.
    pub hint: String,
}

/// The program a shell command starts: its first word that is not a `NAME=value`
/// assignment.
pub fn program_of(command: &str) -> Option<String> {
    let words = shell_words(command);
    words
        .into_iter()
        .find(|w| !is_assignment(w))
        .filter(|w| !w.is_empty())
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// The command's words, quotes removed (enough for finding the program; `;`, `&&` and `|`
/// end the first command).
fn shell_words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    for c in command.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => quote = Some(c),
            (None, ';' | '&' | '|') => break,
            (None, c) if c.is_whitespace() => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            (None, c) => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

/// Whether `program` can be started: a path that exists, or a name found on `PATH`.
pub fn installed(program: &str, dir: &Path) -> bool {
    if program.contains('/') {
        return dir.join(program).is_file();
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|p| p.join(program).is_file()))
}

/// The runner's checks: its program is installed, and a collection run finds tests.
pub fn check(dir: &Path, config: &ProjectConfig) -> Vec<Finding> {
    match &config.runner {
        RunnerConfig::Psql { tests, .. } => vec![psql_collects(dir, config, tests)],
        RunnerConfig::Command { command, .. } => {
            let Some(program) = program_of(command) else {
                return vec![Finding {
                    ok: false,
                    what: "the test command names no program".into(),
                    hint: "set [runner] command".into(),
                }];
            };
            let found = installed(&program, dir);
            let mut out = vec![Finding {
                ok: found,
                what: format!("the test command's program {program} is installed"),
                hint: format!("install {program}, or put it on PATH"),
            }];
            if found {
                out.extend(collection(dir, command, &program));
            }
            out
        }
    }
}

fn psql_collects(dir: &Path, config: &ProjectConfig, globs: &[String]) -> Finding {
    let policy = match config.path_policy() {
        Ok(p) => p,
        Err(e) => {
            return Finding {
                ok: false,
                what: format!("the test globs: {e}"),
                hint: "fix [runner] tests".into(),
            };
        }
    };
    let files = consort_actors::WorkTree::open(dir)
        .map(|w| w.with_filter(policy.tree_filter().clone()))
        .and_then(|w| w.files());
    let matcher = consort_actors::PathPolicy::new(globs, &[]);
    match (files, matcher) {
        (Ok(files), Ok(matcher)) => {
            let n = files.iter().filter(|f| matcher.is_test(f)).count();
            Finding {
                ok: true,
                what: format!(
                    "the psql runner collects {} ({})",
                    consort_actors::counted(n as u64, "test file", "test files"),
                    globs.join(", ")
                ),
                hint: String::new(),
            }
        }
        (Err(e), _) => Finding {
            ok: false,
            what: format!("listing the project: {e}"),
            hint: "check the directory's permissions".into(),
        },
        (_, Err(e)) => Finding {
            ok: false,
            what: format!("the test globs: {e}"),
            hint: "fix [runner] tests".into(),
        },
    }
}

/// Counts the tests a list run printed.
type Counter = fn(&str) -> usize;

/// A tool's own list run: its command line, how to count what it prints, and the exit code
/// with which it says it found no test (pytest's 5), which a project without tests yet is.
struct ListRun {
    command: String,
    count: Counter,
    none_found: Option<i32>,
}

impl ListRun {
    fn new(command: impl Into<String>, count: Counter) -> Option<ListRun> {
        Some(ListRun {
            command: command.into(),
            count,
            none_found: None,
        })
    }
}

/// The tool's own list run for the command's tool.
fn list_command(command: &str, program: &str) -> Option<ListRun> {
    let words = shell_words(command);
    let has = |w: &str| {
        words
            .iter()
            .any(|x| x == w || x.ends_with(&format!("/{w}")))
    };
    if has("pytest") {
        let python = if program == "pytest" {
            "pytest".to_string()
        } else {
            format!("{program} -m pytest")
        };
        return Some(ListRun {
            command: format!("{python} --collect-only -q -p no:cacheprovider"),
            count: |out| out.lines().filter(|l| l.contains("::")).count(),
            none_found: Some(5),
        });
    }
    if has("cargo") {
        return ListRun::new("cargo test --offline --quiet -- --list", |out| {
            out.lines().filter(|l| l.ends_with(": test")).count()
        });
    }
    if has("go") {
        return ListRun::new("go test -list . ./...", |out| {
            out.lines().filter(|l| l.starts_with("Test")).count()
        });
    }
    if has("vitest") {
        return ListRun::new("npx vitest list", |out| {
            out.lines().filter(|l| !l.trim().is_empty()).count()
        });
    }
    if has("jest") {
        return ListRun::new("npx jest --listTests", |out| {
            out.lines().filter(|l| !l.trim().is_empty()).count()
        });
    }
    None
}

fn collection(dir: &Path, command: &str, program: &str) -> Option<Finding> {
    let Some(run) = list_command(command, program) else {
        return Some(Finding {
            ok: true,
            what: format!(
                "no collection run is known for {program}; the first run will show what it collects"
            ),
            hint: String::new(),
        });
    };
    let list = &run.command;
    let started = Instant::now();
    let out = run_limited(dir, list);
    let took = started.elapsed().as_secs_f64();
    let found = |what: String| Finding {
        ok: true,
        what,
        hint: String::new(),
    };
    Some(match out {
        Ok((Some(0), stdout, _)) => found(format!(
            "`{list}` collects {} ({took:.1} s)",
            consort_actors::counted((run.count)(&stdout) as u64, "test", "tests")
        )),
        Ok((code, _, _)) if code.is_some() && code == run.none_found => found(format!(
            "`{list}` finds no test yet ({took:.1} s): the feature's tests will be the first"
        )),
        Ok((_, stdout, stderr)) => Finding {
            ok: false,
            what: format!("`{list}` failed: {}", tail(&format!("{stdout}{stderr}"))),
            hint: "make the project's tests collect as you would run them yourself".into(),
        },
        Err(e) => Finding {
            ok: false,
            what: format!("`{list}` could not run: {e}"),
            hint: "check the runner's program".into(),
        },
    })
}

/// Runs `command` with `sh -c` in `dir`, killed at [`COLLECT_LIMIT`]: (exit code, stdout,
/// stderr).
fn run_limited(dir: &Path, command: &str) -> std::io::Result<(Option<i32>, String, String)> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let started = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if started.elapsed() > COLLECT_LIMIT {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output()?;
    Ok((
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The last few lines of a tool's output.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(5)..].join(" / ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_is_the_first_word_that_is_not_an_assignment() {
        assert_eq!(
            program_of("python3 -m pytest -q").as_deref(),
            Some("python3")
        );
        assert_eq!(
            program_of("JEST_JUNIT_OUTPUT_FILE=\"$CONSORT_JUNIT\" npx jest --ci").as_deref(),
            Some("npx")
        );
        assert_eq!(
            program_of("'./run tests.sh' a && b").as_deref(),
            Some("./run tests.sh")
        );
        assert_eq!(program_of("   "), None);
    }

    #[test]
    fn a_program_is_installed_when_path_or_the_project_has_it() {
        let tmp = tempfile::tempdir().expect("tmp");
        assert!(installed("sh", tmp.path()));
        assert!(!installed("no-such-program-consort", tmp.path()));
        std::fs::write(tmp.path().join("run.sh"), "").expect("write");
        assert!(installed("./run.sh", tmp.path()));
        assert!(!installed("./missing.sh", tmp.path()));
    }

    #[test]
    fn list_runs_are_known_for_each_tool() {
        let pytest = list_command("python3 -m pytest -q", "python3").expect("pytest");
        assert_eq!(
            pytest.command,
            "python3 -m pytest --collect-only -q -p no:cacheprovider"
        );
        assert_eq!(
            (pytest.count)(
                "tests/test_a.py::test_x\ntests/test_a.py::test_y\n\n2 tests collected\n"
            ),
            2
        );
        let cargo = list_command("cargo test --offline", "cargo").expect("cargo");
        assert_eq!((cargo.count)("tests::a: test\nb: test\nc: bench\n"), 2);
        let go = list_command("go test -json ./...", "go").expect("go");
        assert_eq!((go.count)("TestA\nTestB\nok  x 0.1s\n"), 2);
        assert_eq!(pytest.none_found, Some(5), "pytest's exit code for no test");
        assert_eq!(cargo.none_found, None);
        assert!(list_command("npx vitest run", "npx").is_some());
        assert!(list_command("make check", "make").is_none());
    }
}
