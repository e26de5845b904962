//! How a test command's tool runs a selection of the suite's test files, and how it lists the
//! whole suite: what a suite split over branches needs of a tool ([`Selector`]).

use std::path::Path;

use super::process::shell_quote;
use super::{Suite, SuiteTest, go_list, jest_list};

/// A tool whose command can run a selection of test files and list the whole suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selector {
    /// pytest: the files as arguments after `--`; `--collect-only` lists the node ids, named
    /// in the JUnit report as pytest names them (the file's dotted path and the classes as
    /// the class name, the function with its parameters as the name).
    Pytest,
    /// vitest 2 or later, started as `vitest run`: the files as arguments (vitest runs every
    /// test file whose path holds one, ignoring case: `Selector::reaches`); `vitest list
    /// --json` lists each test's file and its name as the JUnit report names it (the file's
    /// path as the class name, the suites and the test joined by ` > ` as the name). vitest 1
    /// has no listing: its suites run whole.
    Vitest,
    /// `go test -json ./...`: a selection runs the packages (directories) of its files in
    /// place of `./...`, so a file reaches every file of its package; `go test -list .` lists
    /// each test, fuzz test and example it runs, placed in the `_test.go` file declaring it.
    Go,
    /// jest with jest-junit naming each case's class by its file: a selection runs exactly
    /// the files named (`--runTestsByPath`); the listing is a run that skips every test
    /// (`jest_list.rs`).
    Jest,
}

/// The collection's exit codes that list what was collected: 0 (all collected), 5 (no tests).
const PYTEST_LISTED: [i32; 2] = [0, 5];

/// The collection's exit codes when some files failed to load (`--continue-on-collection-errors`
/// lists the rest): listed only when each such file is named by an `ERROR <file>` line.
const PYTEST_SOME_UNLOADED: [i32; 2] = [1, 2];

impl Selector {
    /// The selector of a command that runs vitest (`vitest run`, so that its listing is
    /// `vitest list`), or `None`.
    pub fn vitest(command: &str) -> Option<Selector> {
        vitest_run(command).map(|_| Selector::Vitest)
    }

    /// The selector of a jest command whose jest-junit report names each case's class by its
    /// file and keeps its default names, or `None`.
    pub fn jest(command: &str) -> Option<Selector> {
        jest_list::names_as_listed(command).then_some(Selector::Jest)
    }

    /// The selector of a `go test -json` command that names its packages as one `./...`,
    /// or `None`.
    pub fn go(command: &str) -> Option<Selector> {
        go_list::names_all_packages(command).then_some(Selector::Go)
    }

    /// `command` run on `files` only.
    pub(crate) fn select(self, command: &str, files: &[String]) -> String {
        let quoted = |args: &[String]| {
            let words: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
            words.join(" ")
        };
        match self {
            Selector::Pytest => format!("{command} -- {}", quoted(files)),
            Selector::Vitest => format!("{command} {}", quoted(files)),
            Selector::Jest => format!("{command} --runTestsByPath {}", quoted(files)),
            Selector::Go => {
                let mut packages: Vec<String> = files
                    .iter()
                    .map(|f| go_list::package_arg(go_list::package_of(f)))
                    .collect();
                packages.sort();
                packages.dedup();
                go_list::replace_all_packages(command, &quoted(&packages))
            }
        }
    }

    /// `command` asked to list the whole suite without running it.
    pub(crate) fn collect(self, command: &str) -> String {
        match self {
            Selector::Pytest => {
                format!("{command} --collect-only --verbosity=-1 --continue-on-collection-errors")
            }
            Selector::Vitest => match vitest_run(command) {
                Some(at) => format!("{}list{} --json", &command[..at], &command[at + 3..]),
                None => command.to_string(),
            },
            Selector::Jest => format!("{command} {}", jest_list::LIST_ARGS),
            Selector::Go => go_list::replace_all_packages(
                command,
                &format!("-list . {}", go_list::ALL_PACKAGES),
            ),
        }
    }

    /// Whether a selection naming the file `selected` runs the file `other` as well.
    pub(crate) fn reaches(self, selected: &str, other: &str) -> bool {
        match self {
            Selector::Pytest | Selector::Jest => selected == other,
            Selector::Vitest => other.to_lowercase().contains(&selected.to_lowercase()),
            Selector::Go => go_list::package_of(selected) == go_list::package_of(other),
        }
    }

    /// The suite the listing of [`Selector::collect`] shows, each test named as the JUnit
    /// report names it with `name_format`, its file relative to the first of `roots` (the
    /// listing's directory, then the work tree) that holds it, with the test files that failed
    /// to load (a shard runs them, so their failure is seen); `None` when the listing ended as
    /// no listing does, or a file failed to load that the listing does not name (the suite
    /// then runs whole). vitest and Go list only a tree whose every file loads (a package that
    /// does not build fails `go test -list`): otherwise they run whole.
    pub(crate) fn parse(
        self,
        exit: Option<i32>,
        stdout: &str,
        name_format: &str,
        roots: &[&Path],
    ) -> Option<Suite> {
        let exit = exit?;
        match self {
            Selector::Pytest => pytest_suite(exit, stdout, name_format),
            Selector::Vitest => (exit == 0)
                .then(|| vitest_tests(stdout, name_format, roots))
                .flatten()
                .map(Suite::of),
            Selector::Go => (exit == 0)
                .then(|| go_list::listed_tests(stdout, roots))
                .flatten()
                .map(Suite::of),
            // 1: a file failed to load; the report names it.
            Selector::Jest => {
                let suite = jest_list::listed_tests(stdout, name_format, roots)?;
                match exit {
                    0 => Some(suite),
                    1 if !suite.unloaded.is_empty() => Some(suite),
                    _ => None,
                }
            }
        }
    }
}

/// Where the word `run` after a word that names vitest starts in `command`.
fn vitest_run(command: &str) -> Option<usize> {
    let mut at = 0;
    let mut words = command.split(' ').map(|w| {
        let start = at;
        at += w.len() + 1;
        (start, w)
    });
    let mut previous = "";
    for (start, word) in words.by_ref() {
        if word == "run" && previous.rsplit('/').next() == Some("vitest") {
            return Some(start);
        }
        if !word.is_empty() {
            previous = word;
        }
    }
    None
}

/// One test of `vitest list --json`.
#[derive(serde::Deserialize)]
struct VitestListed {
    name: String,
    file: String,
}

/// The tests of `vitest list --json`'s output, named with `name_format`; `None` when it is
/// not such a listing or names a file outside `roots`.
fn vitest_tests(stdout: &str, name_format: &str, roots: &[&Path]) -> Option<Vec<SuiteTest>> {
    let json = &stdout[stdout.find('[')?..];
    let listed: Vec<VitestListed> = serde_json::from_str(json.trim_end()).ok()?;
    listed
        .into_iter()
        .map(|t| {
            let file = roots.iter().find_map(|root| {
                let rel = Path::new(&t.file).strip_prefix(root).ok()?;
                rel.to_str().map(String::from)
            })?;
            let name = name_format
                .replace("{classname}", &file)
                .replace("{name}", &t.name);
            Some(SuiteTest { file, name })
        })
        .collect()
}

impl Selector {
    /// The test file among `files` (paths under `tree`) of the test named `name` (with
    /// `name_format`), when the name tells: pytest's class name is the file's dotted path,
    /// then any classes; vitest's is the file; Go's names a function its file declares.
    pub(crate) fn file_of(
        self,
        name: &str,
        files: &[String],
        name_format: &str,
        tree: &Path,
    ) -> Option<String> {
        match self {
            Selector::Go => go_list::file_declaring(tree, name, files),
            Selector::Vitest | Selector::Jest => {
                let (before, after) = name_format.split_once("{classname}")?;
                let classname = name.strip_prefix(before)?;
                let end = after.split("{name}").next().filter(|s| !s.is_empty())?;
                let file = &classname[..classname.find(end)?];
                files.iter().find(|f| *f == file).cloned()
            }
            Selector::Pytest => {
                let (before, after) = name_format.split_once("{classname}")?;
                let classname = name.strip_prefix(before)?;
                let end = after.split("{name}").next().filter(|s| !s.is_empty())?;
                let classname = &classname[..classname.find(end)?];
                let parts: Vec<&str> = classname.split('.').collect();
                (1..=parts.len()).rev().find_map(|k| {
                    let path = format!("{}.py", parts[..k].join("/"));
                    files.iter().find(|f| **f == path).cloned()
                })
            }
        }
    }
}

/// The suite of pytest's `--collect-only --verbosity=-1 --continue-on-collection-errors`
/// listing that ended with `exit`: its tests, and the files of its `ERROR <file>` lines.
fn pytest_suite(exit: i32, stdout: &str, name_format: &str) -> Option<Suite> {
    let mut suite = Suite::default();
    for line in stdout.lines().map(str::trim_end) {
        if let Some(error) = line.strip_prefix("ERROR ") {
            // A file that failed to load; anything else named (a conftest, a directory, no
            // file at all) is not a test file a shard could run: the suite runs whole.
            let file = pytest_unloaded(error)?;
            if !suite.unloaded.contains(&file) {
                suite.unloaded.push(file);
            }
        } else if let Some(test) = pytest_test(line, name_format) {
            suite.tests.push(test);
        }
    }
    let listed = PYTEST_LISTED.contains(&exit) && suite.unloaded.is_empty()
        || PYTEST_SOME_UNLOADED.contains(&exit) && !suite.unloaded.is_empty();
    listed.then_some(suite)
}

/// The test file an `ERROR` line of pytest's summary names (`tests/test_b.py - ImportError…`,
/// `tests/test_b.py`), when it is one.
fn pytest_unloaded(error: &str) -> Option<String> {
    let file = error.split(" - ").next()?.trim();
    let file = file.split("::").next()?;
    let name = file.rsplit('/').next()?;
    let is_test_file = file.ends_with(".py")
        && !file.starts_with('/')
        && !file.contains(' ')
        && name != "conftest.py";
    is_test_file.then(|| file.to_string())
}

/// A test of pytest's `--collect-only --verbosity=-1` listing (`tests/test_a.py::TestC::test_y[1]`),
/// named as pytest's JUnit report names it; `None` for any other line.
fn pytest_test(line: &str, name_format: &str) -> Option<SuiteTest> {
    let (file, rest) = line.split_once("::")?;
    if !file.ends_with(".py") || file.contains(' ') || file.starts_with('/') || rest.is_empty() {
        return None;
    }
    // As pytest's junitxml mangles a node id: the path dotted without `.py`, the parameters
    // kept with the last part.
    let (path, params) = match rest.find('[') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let mut parts: Vec<String> = std::iter::once(file.trim_end_matches(".py").replace('/', "."))
        .chain(path.split("::").map(String::from))
        .collect();
    let last = parts.pop()? + params;
    let name = name_format
        .replace("{classname}", &parts.join("."))
        .replace("{name}", &last);
    Some(SuiteTest {
        file: file.to_string(),
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: &str = "{classname}::{name}";

    #[test]
    fn pytest_node_ids_are_named_as_its_junit_report_names_them() {
        let listing = "tests/test_a.py::test_x\ntests/sub/test_b.py::TestC::test_y[1-a::b]\n\n2 tests collected in 0.01s\n";
        let suite = Selector::Pytest
            .parse(Some(0), listing, FORMAT, &[])
            .expect("listed");
        assert_eq!(
            suite.tests,
            vec![
                SuiteTest {
                    file: "tests/test_a.py".into(),
                    name: "tests.test_a::test_x".into()
                },
                SuiteTest {
                    file: "tests/sub/test_b.py".into(),
                    name: "tests.sub.test_b.TestC::test_y[1-a::b]".into()
                },
            ]
        );
    }

    #[test]
    fn a_pytest_file_that_failed_to_load_is_listed_to_be_run() {
        let listing = "tests/test_a.py::test_x\n\n==== short test summary info ====\nERROR tests/test_own_b.py - ImportError: cannot import name 'gone' from 'app'\nERROR tests/test_c.py\n1 test collected, 2 errors in 0.01s\n";
        for exit in [1, 2] {
            let suite = Selector::Pytest
                .parse(Some(exit), listing, FORMAT, &[])
                .expect("listed");
            assert_eq!(
                suite.unloaded,
                vec!["tests/test_own_b.py", "tests/test_c.py"]
            );
            assert_eq!(suite.tests.len(), 1);
        }
        assert_eq!(
            Selector::Pytest.parse(Some(0), listing, FORMAT, &[]),
            None,
            "an error the exit does not own up to: whole"
        );
        assert_eq!(
            Selector::Pytest.parse(Some(2), "tests/test_a.py::test_x\n", FORMAT, &[]),
            None,
            "errors the listing does not name: whole"
        );
        assert_eq!(
            Selector::Pytest.parse(
                Some(1),
                "tests/test_a.py::test_x\nERROR conftest.py - RuntimeError\n",
                FORMAT,
                &[]
            ),
            None,
            "a conftest is no test file: whole"
        );
    }

    #[test]
    fn a_listing_that_failed_to_load_a_file_it_does_not_name_runs_whole() {
        let report = r#"{"testResults":[]}"#;
        let tmp = tempfile::tempdir().expect("tempdir");
        assert_eq!(
            Selector::Jest.parse(Some(1), report, FORMAT, &[tmp.path()]),
            None
        );
        assert_eq!(
            Selector::Jest.parse(Some(0), report, FORMAT, &[tmp.path()]),
            Some(Suite::default())
        );
    }

    #[test]
    fn a_pytest_name_tells_its_file() {
        let files = [
            "tests/test_a.py".to_string(),
            "tests/sub/test_b.py".to_string(),
        ];
        let of = |name: &str| Selector::Pytest.file_of(name, &files, FORMAT, Path::new("/"));
        assert_eq!(
            of("tests.test_a::test_x").as_deref(),
            Some("tests/test_a.py")
        );
        assert_eq!(
            of("tests.sub.test_b.TestC::test_y[1]").as_deref(),
            Some("tests/sub/test_b.py")
        );
        assert_eq!(of("tests.test_gone::test_x"), None);
        assert_eq!(
            Selector::Pytest.file_of("x", &files, "{name}", Path::new("/")),
            None
        );
    }

    #[test]
    fn a_listing_that_failed_is_no_suite() {
        assert_eq!(
            Selector::Pytest.parse(Some(4), "usage: pytest", FORMAT, &[]),
            None
        );
        assert_eq!(Selector::Pytest.parse(None, "", FORMAT, &[]), None);
        assert_eq!(
            Selector::Pytest.parse(Some(5), "no tests ran", FORMAT, &[]),
            Some(Suite::default())
        );
    }

    #[test]
    fn a_selection_passes_the_files_after_the_options() {
        assert_eq!(
            Selector::Pytest.select("pytest -q", &["tests/a b.py".into(), "tests/c.py".into()]),
            "pytest -q -- 'tests/a b.py' 'tests/c.py'"
        );
    }

    #[test]
    fn a_vitest_run_lists_with_vitest_list_and_selects_by_path() {
        let cmd = "npx vitest run --reporter=junit --outputFile=\"$CONSORT_JUNIT\"";
        assert_eq!(Selector::vitest(cmd), Some(Selector::Vitest));
        assert_eq!(
            Selector::Vitest.collect(cmd),
            "npx vitest list --reporter=junit --outputFile=\"$CONSORT_JUNIT\" --json"
        );
        assert_eq!(
            Selector::Vitest.select(cmd, &["tests/a.test.js".into()]),
            format!("{cmd} 'tests/a.test.js'")
        );
        assert_eq!(Selector::vitest("npx vitest --run"), None);
        assert_eq!(Selector::vitest("npm test"), None);
        assert_eq!(
            Selector::vitest("node_modules/.bin/vitest run"),
            Some(Selector::Vitest)
        );
        assert!(Selector::Vitest.reaches("tests/a.test.js", "src/Tests/A.test.js"));
        assert!(!Selector::Vitest.reaches("tests/a.test.js", "tests/ba.test.js"));
        assert!(!Selector::Pytest.reaches("tests/test_a.py", "x/tests/test_a.py"));
    }

    #[test]
    fn a_vitest_listing_is_named_as_its_junit_report_names_it() {
        let listing = "some noise\n[\n  {\"name\": \"group > two\", \"file\": \"/v/1/tests/a.test.js\"},\n  {\"name\": \"one\", \"file\": \"/tree/src/b.test.ts\"}\n]\n";
        let roots = [Path::new("/v/1"), Path::new("/tree")];
        let suite = Selector::Vitest
            .parse(Some(0), listing, FORMAT, &roots)
            .expect("listed");
        assert_eq!(
            suite.tests,
            vec![
                SuiteTest {
                    file: "tests/a.test.js".into(),
                    name: "tests/a.test.js::group > two".into()
                },
                SuiteTest {
                    file: "src/b.test.ts".into(),
                    name: "src/b.test.ts::one".into()
                },
            ]
        );
        let files = ["tests/a.test.js".to_string()];
        assert_eq!(
            Selector::Vitest
                .file_of(
                    "tests/a.test.js::group > two",
                    &files,
                    FORMAT,
                    Path::new("/")
                )
                .as_deref(),
            Some("tests/a.test.js")
        );
        assert_eq!(
            Selector::Vitest.parse(Some(1), listing, FORMAT, &roots),
            None,
            "vitest 1: an unknown command"
        );
        let outside = "[{\"name\": \"x\", \"file\": \"/elsewhere/a.test.js\"}]";
        assert_eq!(
            Selector::Vitest.parse(Some(0), outside, FORMAT, &roots),
            None
        );
        assert_eq!(
            Selector::Vitest.parse(Some(0), "[not json", FORMAT, &roots),
            None
        );
    }
}
