//! What `consort doctor` checks about the test command before a run relies on it: that its
//! program is installed, and that one collection (or list) run of the tool finds tests.
//!
//! The collection runs the project's own tool in the project directory, unconfined and
//! without a database, exactly as the user would type it; it is a diagnostic, never a
//! verification, and nothing it prints is a receipt.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use consort::config::{ProjectConfig, RunnerConfig};

mod chain;

use chain::Chain;

/// How long a collection run may take.
const COLLECT_LIMIT: Duration = Duration::from_secs(120);

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

/// `word` as the shell reads it back: as it is when it holds nothing the shell treats
/// specially, else in single quotes.
fn quoted(word: &str) -> String {
    if is_plain(word) {
        word.to_string()
    } else {
        consort_lakebase::shell_quote(word)
    }
}

/// Whether `word` holds nothing the shell treats specially, so it needs no quotes.
fn is_plain(word: &str) -> bool {
    !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./=:,+-@%".contains(c))
}

/// Whether `program` can be started: a path that exists, or a name found on `PATH`.
pub fn installed(program: &str, dir: &Path) -> bool {
    chain::installed_on(program, dir, &std::env::var_os("PATH").unwrap_or_default())
}

/// The runner's checks: every program its command starts is installed (read as the shell
/// reads it: builtins, assignments and `&&` chains, on the `PATH` the chain sets), and a
/// collection run of its test tool finds tests; and every program the project's migration
/// tool's command starts is installed.
pub fn check(dir: &Path, config: &ProjectConfig) -> Vec<Finding> {
    let mut out = runner_checks(dir, config);
    out.extend(migration_tool_programs(dir, config));
    out
}

/// Every program `[migrations] tool`'s apply command starts, installed or not.
fn migration_tool_programs(dir: &Path, config: &ProjectConfig) -> Vec<Finding> {
    let Ok(Some(tool)) = config
        .migrations
        .migration_tool(consort_lakebase::EnvPolicy::default())
    else {
        return Vec::new();
    };
    Chain::read(&tool.apply)
        .programs(dir)
        .into_iter()
        .map(|(program, found)| Finding {
            ok: found,
            what: format!("the migration tool's program {program} is installed"),
            hint: format!(
                "install {} (npm install, pip install), or name its command in [migrations] apply",
                tool.name
            ),
        })
        .collect()
}

fn runner_checks(dir: &Path, config: &ProjectConfig) -> Vec<Finding> {
    match &config.runner {
        RunnerConfig::Psql { tests, .. } => vec![psql_collects(dir, config, tests)],
        RunnerConfig::Command { command, .. } => {
            let chain = Chain::read(command);
            let programs = chain.programs(dir);
            if programs.is_empty() {
                return vec![Finding {
                    ok: false,
                    what: "the test command starts no program".into(),
                    hint: "set [runner] command".into(),
                }];
            }
            let mut out: Vec<Finding> = programs
                .iter()
                .map(|(program, found)| Finding {
                    ok: *found,
                    what: format!("the test command's program {program} is installed"),
                    hint: format!("install {program}, or put it on PATH"),
                })
                .collect();
            if programs.iter().all(|(_, found)| *found) {
                out.extend(collection(dir, &chain));
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
            what: format!("listing the project: {}", consort_actors::error_chain(&e)),
            hint: "check the directory's permissions".into(),
        },
        (_, Err(e)) => Finding {
            ok: false,
            what: format!("the test globs: {e}"),
            hint: "fix [runner] tests".into(),
        },
    }
}

/// Counts the tests a list run printed (its standard output) or wrote (its JUnit report).
type Counter = fn(&Listed) -> usize;

/// What a list run left: its standard output, and the JUnit report when it wrote one.
struct Listed {
    stdout: String,
    junit: Option<String>,
}

/// A tool's own list run: its command line, how to count what it lists, and the exit code
/// with which it says it found no test (pytest's 5), which a project without tests yet is.
struct ListRun {
    command: String,
    count: Counter,
    none_found: Option<i32>,
    /// What it counts: tests, or (jest) test files.
    noun: (&'static str, &'static str),
}

impl ListRun {
    fn new(command: impl Into<String>, count: Counter) -> Option<ListRun> {
        Some(ListRun {
            command: command.into(),
            count,
            none_found: None,
            noun: ("test", "tests"),
        })
    }
}

/// Lines of standard output that satisfy `keep`.
fn lines_where(listed: &Listed, keep: fn(&str) -> bool) -> usize {
    listed.stdout.lines().filter(|l| keep(l)).count()
}

/// The tests one line of pytest's `--collect-only` output names, at any verbosity: a node id
/// (`-q`), a file's count (`-qq`: `tests/test_a.py: 2`), or a `<Function …>` item.
fn pytest_collected(line: &str) -> usize {
    let line = line.trim();
    if line.starts_with("<Function ") || (line.contains("::") && !line.contains(' ')) {
        return 1;
    }
    line.rsplit_once(": ")
        .filter(|(file, _)| file.ends_with(".py"))
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or(0)
}

/// A test name no test has: a vitest run filtered by it collects every test file (and reports
/// each test skipped) without running a test; vitest 1 has no `list` command.
const MATCHES_NO_TEST: &str = "'^consort doctor: collect only$'";

/// The tool's own list run, made from the configured command so that its own arguments
/// (directories, configuration, reporters) count: pytest `--collect-only`, vitest filtered by
/// a name no test has (its JUnit report then lists every test, skipped), jest `--listTests`,
/// cargo's `--list`, `go test -list`.
fn list_command(command: &str) -> Option<ListRun> {
    let words = shell_words(command);
    let has = |w: &str| {
        words
            .iter()
            .any(|x| x == w || x.ends_with(&format!("/{w}")))
    };
    if has("pytest") {
        let no_cache = if command.contains("no:cacheprovider") {
            ""
        } else {
            " -p no:cacheprovider"
        };
        return Some(ListRun {
            command: format!("{command} --collect-only{no_cache}"),
            count: |l| l.stdout.lines().map(pytest_collected).sum(),
            none_found: Some(5),
            noun: ("test", "tests"),
        });
    }
    if has("cargo") {
        // In the project's own target directory, as the user builds: a run's scratch one
        // (`--target-dir "$TMPDIR/…"`) would build everything again, and outside a run has
        // no meaning.
        let mut kept: Vec<String> = Vec::new();
        let mut skip_next = false;
        for w in &words {
            if std::mem::take(&mut skip_next) || w.starts_with("--target-dir=") {
                continue;
            }
            skip_next = w == "--target-dir";
            if !skip_next {
                kept.push(quoted(w));
            }
        }
        let kept = kept.join(" ");
        let list = if words.iter().any(|w| w == "--") {
            format!("{kept} --list")
        } else {
            format!("{kept} -- --list")
        };
        return ListRun::new(list, |l| lines_where(l, |l| l.ends_with(": test")));
    }
    if has("go") {
        return ListRun::new("go test -list . ./...", |l| {
            lines_where(l, |l| l.starts_with("Test"))
        });
    }
    if has("vitest") && command.contains("junit") {
        return ListRun::new(format!("{command} -t {MATCHES_NO_TEST}"), |l| {
            l.junit
                .as_deref()
                .map_or(0, |x| x.matches("<testcase").count())
        });
    }
    if has("vitest") {
        return ListRun::new("npx vitest list", |l| {
            lines_where(l, |l| !l.trim().is_empty())
        });
    }
    if has("jest") {
        return Some(ListRun {
            noun: ("test file", "test files"),
            ..ListRun::new(format!("{command} --listTests"), |l| {
                lines_where(l, |l| !l.trim().is_empty())
            })?
        });
    }
    None
}

/// [`check`] in a scratch lane of the project at its `HEAD`, its installed dependencies linked
/// as every lane's are: what a lane's runs will find. None when the project can have no lane
/// (it lies in no git repository, or one without a commit); Err when the scratch lane could
/// not be made.
pub fn check_in_a_lane(dir: &Path, config: &ProjectConfig) -> Option<Result<Vec<Finding>, String>> {
    let repo = consort::git::GitRepo::detect(dir)?;
    repo.rev("HEAD").ok().flatten()?;
    // `+` is in no feature's lane name; the pid in this one keeps two doctors apart.
    let lane = match consort::lanes::ScratchLane::make_own(dir, "doctor", "HEAD") {
        Ok(lane) => lane,
        Err(e) => return Some(Err(consort_actors::error_chain(&e))),
    };
    let findings = check(&lane.work_tree(), config)
        .into_iter()
        .map(|f| Finding {
            what: format!("in a lane: {}", f.what),
            ..f
        })
        .collect();
    Some(Ok(findings))
}

/// `npx X` runs X from the project's `node_modules/.bin`, or tries the registry, which a run
/// cannot reach: a package that is not installed fails every run.
fn npx_target_missing(dir: &Path, command: &str) -> Option<Finding> {
    let words = shell_words(command);
    let target = words
        .iter()
        .skip_while(|w| w.as_str() != "npx")
        .skip(1)
        .find(|w| !w.starts_with('-'))?;
    let bin = dir.join("node_modules/.bin").join(target);
    (!bin.exists()).then(|| Finding {
        ok: false,
        what: format!(
            "`npx {target}` does not run: there is no {target} in node_modules/.bin, and a test run cannot install it (it reaches no registry)"
        ),
        hint: format!("check the command for a typo, or install it: npm install --save-dev {target}"),
    })
}

/// The collection check of the chain's test tool: its first simple command for which a list
/// run is known, run after the setup commands before it (`export`, `cd`); the programs before
/// it that are not setup (a schema script for a database doctor does not have) are left out,
/// and the finding says so.
fn collection(dir: &Path, chain: &Chain) -> Option<Finding> {
    let tool = chain.commands().iter().enumerate().find_map(|(i, simple)| {
        let text = simple.text();
        list_command(&text).map(|run| (i, text, run))
    });
    let Some((i, text, mut run)) = tool else {
        if let Some(missing) = chain
            .commands()
            .iter()
            .find_map(|s| npx_target_missing(dir, &s.text()))
        {
            return Some(missing);
        }
        let programs: Vec<&str> = chain
            .commands()
            .iter()
            .filter_map(|s| s.program())
            .collect();
        return Some(Finding {
            ok: true,
            what: format!(
                "no collection run is known for {}; the first run will show what it collects",
                programs.join(", ")
            ),
            hint: String::new(),
        });
    };
    if let Some(missing) = npx_target_missing(dir, &text) {
        return Some(missing);
    }
    run.command = format!("{}{}", chain.setup_before(i), run.command);
    let left_out = chain.left_out_before(i);
    let mut finding = list_run(dir, &run);
    if !left_out.is_empty() && finding.ok {
        finding.what.push_str(&format!(
            " (not run before it: {}, which may need the database; every test run runs the whole command)",
            left_out.join(", ")
        ));
    }
    Some(finding)
}

/// Runs a list run in `dir` and says what it found.
fn list_run(dir: &Path, run: &ListRun) -> Finding {
    let list = &run.command;
    let started = Instant::now();
    let out = run_limited(dir, list, COLLECT_LIMIT);
    let took = started.elapsed().as_secs_f64();
    let found = |what: String| Finding {
        ok: true,
        what,
        hint: String::new(),
    };
    match out {
        Ok(Ran::TimedOut) => Finding {
            ok: false,
            what: format!(
                "`{list}` did not finish in {} s (stopped, with everything it started)",
                COLLECT_LIMIT.as_secs()
            ),
            hint: "a test tool that waits (watch mode, a prompt) never finishes a run: make the command run once".into(),
        },
        Ok(Ran::Exited(Some(code @ (126 | 127)), listed, stderr)) => Finding {
            ok: false,
            what: format!(
                "`{list}` does not run (exit {code}): {}",
                tail(&format!("{}{stderr}", listed.stdout))
            ),
            hint: "check the test command for a typo, and that its program is installed".into(),
        },
        Ok(Ran::Exited(Some(0), listed, _)) => found(format!(
            "`{list}` collects {} ({took:.1} s)",
            consort_actors::counted((run.count)(&listed) as u64, run.noun.0, run.noun.1)
        )),
        Ok(Ran::Exited(code, _, _)) if code.is_some() && code == run.none_found => found(format!(
            "`{list}` finds no test yet ({took:.1} s): the feature's tests will be the first"
        )),
        Ok(Ran::Exited(_, listed, stderr)) => {
            let said = format!("{}{stderr}", listed.stdout);
            Finding {
                ok: false,
                what: format!("`{list}` failed: {}", tail(&said)),
                hint: collect_hint(dir, list, &said),
            }
        }
        Err(e) => Finding {
            ok: false,
            what: format!("`{list}` could not run: {e}"),
            hint: "check the runner's program".into(),
        },
    }
}

/// How to fix a collection that failed: a Python without the project's packages is named with
/// the module it lacks (and the project's own `.venv/`, when the command does not start it).
fn collect_hint(dir: &Path, list: &str, said: &str) -> String {
    match consort_lakebase::python_lacks(said) {
        Some(module) => consort_lakebase::python_lacks_advice(
            module,
            consort_lakebase::unused_project_python(dir, list),
        ),
        None => "make the project's tests collect as you would run them yourself".into(),
    }
}

/// What stands for output whose reader thread failed.
const UNREAD: &str = "(its output could not be read)";

/// How a list run ended.
enum Ran {
    /// It exited (code, what it listed, its standard error).
    Exited(Option<i32>, Listed, String),
    /// It passed its time limit and was killed with its whole process group.
    TimedOut,
}

/// Runs `command` with `sh -c` in `dir` as a run would (`CI=true`, so no tool watches or
/// prompts; `npm_config_yes=false`; `$CONSORT_JUNIT` a private report path), in a process
/// group of its own that is killed whole at `limit`.
fn run_limited(dir: &Path, command: &str, limit: Duration) -> std::io::Result<Ran> {
    use std::os::unix::process::CommandExt;
    let reports = tempfile::tempdir()?;
    let junit = reports.path().join("junit.xml");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(dir)
        .envs(consort_lakebase::NON_INTERACTIVE)
        .env("CONSORT_JUNIT", &junit)
        .env("CONSORT_REPORT_DIR", reports.path())
        .env("TMPDIR", reports.path())
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    // Read both pipes while the command runs: one that fills a pipe would wait forever.
    let stdout = read_in_background(child.stdout.take());
    let stderr = read_in_background(child.stderr.take());
    let started = Instant::now();
    let mut status = None;
    while status.is_none() && started.elapsed() <= limit {
        status = child.try_wait()?;
        if status.is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // The command's group goes whole: at the limit, and whatever it left running after it.
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    let (stdout, stderr) = (stdout.join(), stderr.join());
    let Some(status) = status else {
        return Ok(Ran::TimedOut);
    };
    let listed = Listed {
        stdout: stdout.unwrap_or_else(|_| UNREAD.into()),
        junit: std::fs::read_to_string(&junit).ok(),
    };
    Ok(Ran::Exited(
        status.code(),
        listed,
        stderr.unwrap_or_else(|_| UNREAD.into()),
    ))
}

/// A thread that reads `pipe` to its end, as text.
fn read_in_background<R: std::io::Read + Send + 'static>(
    pipe: Option<R>,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// What a tool said went wrong: its own message (the first lines from the first that names
/// an error: `Could not resolve a module for a custom reporter. / Module name: jest-junit`),
/// then its last lines, stack frames left out of both (`at …`, `File "…", line …`).
fn tail(text: &str) -> String {
    const ERROR_WORDS: [&str; 7] = [
        "error",
        "could not",
        "cannot",
        "not found",
        "no module named",
        "failed",
        "exception",
    ];
    let is_frame = |l: &str| {
        l.starts_with("at ")
            || l.starts_with("File \"")
            || l.starts_with('^')
            || l == "Traceback (most recent call last):"
    };
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !is_frame(l))
        .collect();
    let first = lines.iter().position(|l| {
        let lower = l.to_ascii_lowercase();
        ERROR_WORDS.iter().any(|w| lower.contains(w))
    });
    let mut said: Vec<&str> =
        first.map_or(Vec::new(), |i| lines[i..].iter().take(3).copied().collect());
    for l in &lines[lines.len().saturating_sub(3)..] {
        if !said.contains(l) {
            said.push(l);
        }
    }
    said.join(" / ")
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_tool_s_own_error_is_kept_and_its_stack_left_out() {
        let jest = "● Validation Error:\n\n  Could not resolve a module for a custom reporter.\n  Module name: jest-junit\n\n  Configuration Documentation:\n  https://jestjs.io/docs/configuration\n\n    at /p/node_modules/jest-config/build/utils.js:95:13\n    at Array.map (<anonymous>)\n    at normalize (/p/node_modules/jest-config/build/normalize.js:3:1)\n    at readConfig (/p/node_modules/jest-config/build/index.js:2:2)\n";
        let said = tail(jest);
        assert!(
            said.starts_with("● Validation Error: / Could not resolve a module for a custom reporter. / Module name: jest-junit"),
            "{said}"
        );
        assert!(!said.contains("Array.map"), "{said}");
        let python = "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    import nope\nModuleNotFoundError: No module named 'nope'\n";
        assert_eq!(
            tail(python),
            "ModuleNotFoundError: No module named 'nope' / import nope"
        );
    }

    /// A Python without the project's packages is named with its module; where the project
    /// keeps a `.venv/` the command does not start, the hint is that environment's Python.
    #[test]
    fn a_python_without_the_project_s_packages_is_told_where_they_are() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path();
        let bare = "/usr/bin/python3: No module named pytest\n";
        let import = "E   ModuleNotFoundError: No module named 'psycopg'\n";
        assert_eq!(consort_lakebase::python_lacks(bare), Some("pytest"));
        assert_eq!(consort_lakebase::python_lacks(import), Some("psycopg"));
        assert_eq!(consort_lakebase::python_lacks("1 error"), None);
        let hint = collect_hint(dir, "python3 -m pytest", bare);
        assert!(hint.contains("has no `pytest`: install"), "{hint}");
        assert!(!hint.contains(".venv"), "{hint}");
        std::fs::create_dir_all(dir.join(".venv/bin")).expect("venv");
        std::fs::write(dir.join(consort_lakebase::PROJECT_PYTHON), "").expect("python");
        let hint = collect_hint(dir, "python3 -m pytest", import);
        assert!(
            hint.contains("has no `psycopg`") && hint.contains("with `.venv/bin/python`"),
            "{hint}"
        );
        let hint = collect_hint(dir, ".venv/bin/python -m pytest", import);
        assert!(hint.contains("install the project's packages"), "{hint}");
        assert!(
            collect_hint(dir, "python3 -m pytest", "SyntaxError").contains("as you would run them")
        );
    }

    fn listed(stdout: &str) -> Listed {
        Listed {
            stdout: stdout.into(),
            junit: None,
        }
    }

    #[test]
    fn list_runs_are_made_from_the_configured_command() {
        let pytest = list_command("python3 -m pytest -q tests/unit").expect("pytest");
        assert_eq!(
            pytest.command, "python3 -m pytest -q tests/unit --collect-only -p no:cacheprovider",
            "the command's own arguments count"
        );
        let own = list_command("pytest -p no:cacheprovider").expect("pytest");
        assert_eq!(own.command, "pytest -p no:cacheprovider --collect-only");
        for (verbosity, out) in [
            (
                "-q",
                "tests/test_a.py::test_x\ntests/test_a.py::test_y\n\n2 tests collected in 0.01s\n",
            ),
            ("-qq", "tests/test_a.py: 1\ntests/test_b.py: 1\n"),
            (
                "",
                "<Module tests/test_a.py>\n  <Function test_x>\n  <Function test_y>\n",
            ),
        ] {
            assert_eq!((pytest.count)(&listed(out)), 2, "{verbosity}");
        }
        let cargo = list_command("cargo test --offline").expect("cargo");
        assert_eq!(cargo.command, "cargo test --offline -- --list");
        let scratch =
            list_command("cargo test --offline --target-dir \"$TMPDIR/target\" --workspace")
                .expect("cargo");
        assert_eq!(
            scratch.command, "cargo test --offline --workspace -- --list",
            "built where the user builds, never in a run's scratch"
        );
        assert_eq!(
            (cargo.count)(&listed("tests::a: test\nb: test\nc: bench\n")),
            2
        );
        let threads = list_command("cargo test -- --test-threads=1").expect("cargo");
        assert_eq!(threads.command, "cargo test -- --test-threads=1 --list");
        let go = list_command("go test -json ./...").expect("go");
        assert_eq!((go.count)(&listed("TestA\nTestB\nok  x 0.1s\n")), 2);
        assert_eq!(pytest.none_found, Some(5), "pytest's exit code for no test");
        assert_eq!(cargo.none_found, None);
        // vitest 1 has no `list`: the configured run, filtered by a name no test has, reports
        // every test (skipped) in its JUnit report.
        let vitest = list_command(
            "npx vitest run --reporter=junit --outputFile=\"$CONSORT_JUNIT\" --dir test",
        )
        .expect("vitest");
        assert!(
            vitest.command.contains("--dir test -t '^consort doctor"),
            "{}",
            vitest.command
        );
        let report = Listed {
            stdout: String::new(),
            junit: Some("<testsuite><testcase name=\"a\"><skipped/></testcase><testcase name=\"b\"/></testsuite>".into()),
        };
        assert_eq!((vitest.count)(&report), 2);
        let jest = list_command("npx jest --ci").expect("jest");
        assert_eq!(jest.command, "npx jest --ci --listTests");
        assert!(list_command("make check").is_none());
    }

    #[test]
    fn a_command_that_waits_is_stopped_at_the_limit_with_everything_it_started() {
        let tmp = tempfile::tempdir().expect("tmp");
        let marker = tmp.path().join("grandchild");
        let command = format!("(sleep 30; touch {}) & sleep 30", marker.display());
        let ran = run_limited(tmp.path(), &command, Duration::from_millis(300)).expect("runs");
        assert!(matches!(ran, Ran::TimedOut));
        let ran =
            run_limited(tmp.path(), "echo \"ci=$CI\"", Duration::from_secs(10)).expect("runs");
        let Ran::Exited(Some(0), listed, _) = ran else {
            panic!("exits");
        };
        assert_eq!(listed.stdout, "ci=true\n", "never in watch mode");
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !marker.exists(),
            "the background process went with its group"
        );
    }

    #[test]
    fn a_command_whose_program_does_not_run_fails_the_doctor() {
        let tmp = tempfile::tempdir().expect("tmp");
        let collect = |command: &str| collection(tmp.path(), &Chain::read(command));
        let typo = collect("npx vitset run --reporter=junit").expect("a finding");
        assert!(!typo.ok);
        assert!(
            typo.what.contains("no vitset in node_modules/.bin"),
            "{}",
            typo.what
        );
        std::fs::create_dir_all(tmp.path().join("node_modules/.bin")).expect("mkdir");
        std::fs::write(tmp.path().join("node_modules/.bin/vitset"), "").expect("write");
        assert!(npx_target_missing(tmp.path(), "npx vitset").is_none());
        let missing = collect("no-such-tool-consort test");
        assert!(
            missing.is_some_and(|f| f.ok),
            "an unknown tool is left to the first run"
        );
        let ran = run_limited(tmp.path(), "no-such-tool-consort", Duration::from_secs(10))
            .expect("sh runs");
        assert!(matches!(ran, Ran::Exited(Some(127), _, _)));
    }

    /// A chain is read as the shell reads it: the test tool is found after a schema script,
    /// its collection runs after the chain's `export` and leaves the script out, saying so.
    #[test]
    fn the_test_tool_of_a_chain_is_collected_after_its_setup() {
        let tmp = tempfile::tempdir().expect("tmp");
        let bin = tmp.path().join("bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        // A stand-in "go" that lists two tests only when the chain's export reached it.
        let go = bin.join("go");
        std::fs::write(
            &go,
            "#!/bin/sh\n[ \"$CONSORT_DOCTOR_PROBE\" = set ] || exit 3\necho TestA\necho TestB\n",
        )
        .expect("write");
        std::fs::set_permissions(&go, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        let command = "export CONSORT_DOCTOR_PROBE=set PATH=\"$PWD/bin:$PATH\" && psql -f schema.sql && go test ./...";
        let found = collection(tmp.path(), &Chain::read(command)).expect("a finding");
        assert!(found.ok, "{}", found.what);
        assert!(found.what.contains("collects 2 tests"), "{}", found.what);
        assert!(
            found.what.contains("not run before it: psql"),
            "{}",
            found.what
        );
    }
}
