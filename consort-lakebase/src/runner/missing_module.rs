//! Load failures that name a missing module of the project: what lets the first test of a new
//! module be a RED.
//!
//! A test written as people write it in their stack imports the module it is about
//! (`import { placeOrder } from '../src/orders.js'`, `from app.orders import place_order`);
//! before the feature's code exists, the test file fails to load and its tests are never
//! reported. [`read`] finds such failures in a run's outcomes, by the words the runners use
//! (vitest 1: `Failed to load url …`; vitest 2 and 3, Node: `Cannot find module '…' imported
//! from …`; jest: `Cannot find module '…' from '…'`; pytest: `No module named '…'`, `cannot
//! import name '…' from '…'`), and keeps only those the tree confirms: the test file is a file
//! of the tree, and the module it imports is a path inside the tree that does not exist, or a
//! Python module of the project's own package that lacks the name imported. A bare package
//! (`import 'left-pad'`, `Cannot find package`), a Python module outside the project's
//! packages, and a syntax error are none. Whether the module is the project's *code* (not a
//! test, not the harness) is the state machine's to judge, by the path policy.
//!
//! The outcomes are the run's: untrusted text. What a test prints can at most name a module
//! that really is missing; the RED still needs GREEN to make the test pass.

use std::path::{Component, Path, PathBuf};

use consort_actors::{MissingModule, TestOutcome};

/// The Python of a project's own virtual environment, by its path in the project: what
/// `consort init` names in a pytest command when the project has one.
pub const PROJECT_PYTHON: &str = ".venv/bin/python";

/// The module a Python said it could not find (`No module named pytest` from `python -m`,
/// `No module named 'psycopg'` from an import), as it named it.
pub fn python_lacks(output: &str) -> Option<&str> {
    let rest = output.split("No module named ").nth(1)?;
    let name = rest
        .split(char::is_whitespace)
        .next()?
        .trim_matches(|c| c == '\'' || c == '"');
    (!name.is_empty()).then_some(name)
}

/// Whether `project` keeps its own environment (`.venv/`) that `command` does not start.
pub fn unused_project_python(project: &Path, command: &str) -> bool {
    project.join(PROJECT_PYTHON).exists() && !command.contains(PROJECT_PYTHON)
}

/// What to do when the Python a test command starts lacks `module`: start the command with
/// the project's own environment's Python when it has one the command does not start (see
/// [`unused_project_python`]), else install the packages where that Python looks.
pub fn python_lacks_advice(module: &str, unused_project_python: bool) -> String {
    if unused_project_python {
        format!(
            "the command's Python has no `{module}`, and the project keeps its own environment in .venv/: start `[runner] command` with `{PROJECT_PYTHON}` (what `consort init` writes when .venv/ exists)"
        )
    } else {
        format!(
            "the command's Python has no `{module}`: install the project's packages where it looks, or start `[runner] command` with the Python of the environment that has them"
        )
    }
}

/// The extensions a JavaScript import may leave out (jest, CommonJS).
const JS_EXTENSIONS: [&str; 8] = ["js", "mjs", "cjs", "ts", "mts", "cts", "jsx", "tsx"];

/// Where a Python project's own packages may start.
const PYTHON_ROOTS: [&str; 2] = ["", "src"];

/// The failed outcomes of a run of `tree` that failed to load for a missing module of the
/// project (see the module documentation). A run that failed naming no test (its
/// [`TestOutcome::WHOLE_RUN`] outcome: jest's report leaves out a file that did not load) is
/// read from its `output`.
pub(crate) fn read(tree: &Path, outcomes: &[TestOutcome], output: &str) -> Vec<MissingModule> {
    outcomes
        .iter()
        .filter(|o| o.is_failure())
        .flat_map(|o| {
            let message = match o.message.as_deref() {
                Some(message) => message,
                None if o.name == TestOutcome::WHOLE_RUN => output,
                None => "",
            };
            found_in(tree, message)
                .into_iter()
                .map(|((test_file, module), stops_every_test)| MissingModule {
                    outcome: o.name.clone(),
                    test_file,
                    module,
                    stops_every_test,
                })
        })
        .collect()
}

/// What `message` says is missing, each with whether it kept every test from running: a
/// JavaScript or Python module, a Go package's name, a Rust crate's item (nothing of a cargo
/// run runs when a test target does not compile).
fn found_in(tree: &Path, message: &str) -> Vec<((String, String), bool)> {
    if let Some(one) = js_missing(tree, message).or_else(|| python_missing(tree, message)) {
        return vec![(one, false)];
    }
    let go = go_missing(tree, message);
    if !go.is_empty() {
        return go.into_iter().map(|m| (m, false)).collect();
    }
    rust_missing(tree, message)
        .into_iter()
        .map(|m| (m, true))
        .collect()
}

/// A Go package that did not build only because its test files name what its code does not
/// define yet (`undefined: Most`; `c.Most undefined (type … has no field or method Most)`):
/// (test file, package directory) for each test file the compiler named; nothing when any
/// error is of another kind or in a file that is not a test file of the tree. The package's
/// other tests are not run because of the RED: they are in its other outcomes, or none.
fn go_missing(tree: &Path, message: &str) -> Vec<(String, String)> {
    let errors = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && *l != "too many errors");
    let mut files: Vec<String> = Vec::new();
    for line in errors {
        let Some((file, error)) = go_error(line) else {
            return Vec::new();
        };
        let undefined =
            error.starts_with("undefined: ") || error.contains("has no field or method ");
        match in_tree(tree, file) {
            Some((rel, _)) if undefined && rel.ends_with("_test.go") => {
                if !files.contains(&rel) {
                    files.push(rel);
                }
            }
            _ => return Vec::new(),
        }
    }
    let package = |f: &String| match Path::new(f).parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_string_lossy().into_owned(),
        _ => ".".to_string(),
    };
    let Some(first) = files.first().map(package) else {
        return Vec::new();
    };
    if files.iter().any(|f| package(f) != first) {
        return Vec::new();
    }
    files.into_iter().map(|f| (f, first.clone())).collect()
}

/// The rustc errors that name an item the code does not define (yet): cannot find a value,
/// function, type or struct; an unresolved import or path; no such method or associated item.
const RUST_MISSING_ITEM: [&str; 6] = ["E0412", "E0422", "E0425", "E0432", "E0433", "E0599"];

/// A Rust integration test target (a file under a crate's `tests/`) that did not compile only
/// because it names what the crate does not define yet: (test file, the crate's `src/lib.rs`)
/// for each test file rustc named; nothing when any error is of another kind or elsewhere.
fn rust_missing(tree: &Path, output: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = output.lines().collect();
    let mut found: Vec<(String, String)> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.strip_prefix("error") else {
            continue;
        };
        let Some((code, _)) = rest.strip_prefix('[').and_then(|r| r.split_once("]: ")) else {
            // cargo's own summary of the same failure, or another error.
            if rest.starts_with(": could not compile") || rest.starts_with(": aborting") {
                continue;
            }
            return Vec::new();
        };
        let at = lines
            .get(i + 1)
            .and_then(|l| l.trim_start().strip_prefix("--> "))
            .and_then(|at| at.split(':').next());
        let test = at.and_then(|file| in_tree(tree, file)).map(|(rel, _)| rel);
        let crate_dir = test.as_deref().and_then(|t| {
            let (dir, _) = t.rsplit_once("tests/")?;
            (dir.is_empty() || dir.ends_with('/')).then(|| dir.to_string())
        });
        match (RUST_MISSING_ITEM.contains(&code), test, crate_dir) {
            (true, Some(test), Some(dir)) if test.ends_with(".rs") => {
                let pair = (test, format!("{dir}src/lib.rs"));
                if !found.contains(&pair) {
                    found.push(pair);
                }
            }
            _ => return Vec::new(),
        }
    }
    found
}

/// A compiler error line, `<file>.go:<line>:<column>: <error>`: (file, error).
fn go_error(line: &str) -> Option<(&str, &str)> {
    let end = line.find(".go:")? + ".go".len();
    let (file, rest) = line.split_at(end);
    let mut parts = rest[1..].splitn(3, ':');
    let numbers = [parts.next()?, parts.next()?];
    let error = parts.next()?.strip_prefix(' ')?;
    numbers
        .iter()
        .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .then_some((file, error))
}

/// A JavaScript load failure: (test file, missing module), both relative to the tree.
fn js_missing(tree: &Path, message: &str) -> Option<(String, String)> {
    let (spec, importer) = between(message, "Failed to load url ", " ")
        .zip(between(message, ") in ", ". Does the file exist?"))
        .or_else(|| {
            let spec = between(message, "Cannot find module '", "'")?;
            let rest = &message[message.find(spec)? + spec.len() + 1..];
            let importer = rest
                .strip_prefix(" imported from ")
                .or_else(|| rest.strip_prefix(" from "))?;
            let importer = importer.trim_start_matches('\'');
            Some((spec, importer.split(['\'', '\n']).next()?.trim()))
        })?;
    let (test_file, prefix) = in_tree(tree, importer)?;
    let module = if spec.starts_with("./") || spec.starts_with("../") {
        let dir = Path::new(&test_file).parent()?;
        normalise(&dir.join(spec))?
    } else if let Some(rest) = Path::new(spec)
        .is_absolute()
        .then(|| Path::new(spec).strip_prefix(&prefix).ok())
        .flatten()
    {
        normalise(rest)?
    } else {
        // A package, not a module of the project.
        return None;
    };
    let full = tree.join(&module);
    let exists = full.exists()
        || JS_EXTENSIONS
            .iter()
            .any(|e| full.with_extension(e).exists() || full.join(format!("index.{e}")).exists());
    (!exists).then(|| (test_file, module.to_string_lossy().into_owned()))
}

/// A Python load failure: (test file, the module missing or lacking the name imported).
fn python_missing(tree: &Path, message: &str) -> Option<(String, String)> {
    let importer = between(message, "while importing test module '", "'")?;
    let (test_file, _) = in_tree(tree, importer)?;
    let (name, must_exist) = match between(message, "No module named '", "'") {
        Some(name) => (name, false),
        None => {
            let at = message.find("cannot import name '")?;
            (between(&message[at..], "' from '", "'")?, true)
        }
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || !p.chars().all(|c| c.is_alphanumeric() || c == '_'))
    {
        return None;
    }
    PYTHON_ROOTS.iter().find_map(|root| {
        let root = Path::new(root);
        // The project's own package: its first directory is in the tree.
        if !tree.join(root).join(parts[0]).is_dir() {
            return None;
        }
        let base = root.join(parts.join("/"));
        let file = base.with_extension("py");
        let package = base.join("__init__.py");
        let found = [&file, &package]
            .into_iter()
            .find(|p| tree.join(p).is_file());
        let module = match (found, must_exist) {
            (None, false) => file,
            (Some(p), true) => p.clone(),
            _ => return None,
        };
        Some((test_file.clone(), module.to_string_lossy().into_owned()))
    })
}

/// The text between `start` and the next `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.find(start)? + start.len();
    let len = text[from..].find(end)?;
    Some(&text[from..from + len])
}

/// The tree-relative path of a test file a runner named (relative to the tree, or absolute:
/// in the tree, or in a view of it, whose directory differs), with the directory that stood
/// for the tree in its name.
fn in_tree(tree: &Path, named: &str) -> Option<(String, PathBuf)> {
    let named = Path::new(named.trim());
    let parts: Vec<Component<'_>> = named.components().collect();
    // The longest tail of the name that is a file of the tree.
    (0..parts.len()).find_map(|skip| {
        let tail: PathBuf = parts[skip..].iter().collect();
        let rel = normalise(&tail)?;
        tree.join(&rel).is_file().then(|| {
            let prefix: PathBuf = parts[..skip].iter().collect();
            (rel.to_string_lossy().into_owned(), prefix)
        })
    })
}

/// `path` without `.` and `..`, relative and inside the tree; None when it is absolute or
/// climbs out.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use consort_actors::TestStatus;

    fn tree() -> tempfile::TempDir {
        consort_testkit::disk::tree_of(&[
            ("test/t1.test.js", ""),
            ("src/counts.js", ""),
            ("tests/test_t1.py", ""),
            ("app/__init__.py", ""),
            ("app/counts.py", ""),
            ("shelf_test.go", ""),
            ("shelf.go", ""),
            ("a/a_test.go", ""),
            ("a/more_test.go", ""),
            ("b/b_test.go", ""),
            ("src/lib.rs", ""),
            ("tests/most.rs", ""),
            ("crates/x/tests/y.rs", ""),
        ])
    }

    /// What a run that failed naming no test (its whole run errored) names in `output`.
    fn read_whole_run(tree: &Path, output: &str) -> Vec<MissingModule> {
        let whole = TestOutcome::new(TestOutcome::WHOLE_RUN, TestStatus::Errored);
        read(tree, std::slice::from_ref(&whole), output)
    }

    /// Asserts that `message` names exactly these (test file, missing module) pairs of `t`.
    fn assert_missing(t: &tempfile::TempDir, message: &str, expected: &[(&str, &str)]) {
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(file, module)| (file.to_string(), module.to_string()))
            .collect();
        assert_eq!(modules(t.path(), message), expected, "{message}");
    }

    fn failed(message: &str) -> TestOutcome {
        TestOutcome {
            name: "load".into(),
            status: TestStatus::Failed,
            message: Some(message.into()),
        }
    }

    fn modules(tree: &Path, message: &str) -> Vec<(String, String)> {
        read(tree, &[failed(message)], "")
            .into_iter()
            .map(|m| (m.test_file, m.module))
            .collect()
    }

    #[test]
    fn each_runner_s_words_for_a_missing_module_of_the_project_are_read() {
        let t = tree();
        let view = "/tmp/consort-scratch-x/views/ab12/test/t1.test.js";
        let want = vec![("test/t1.test.js".to_string(), "src/orders.js".to_string())];
        for message in [
            format!("Failed to load url ../src/orders.js (resolved id: ../src/orders.js) in {view}. Does the file exist?"),
            format!("Cannot find module '../src/orders.js' imported from '{view}'"),
            "Cannot find module '/tmp/consort-scratch-x/views/ab12/src/orders.js' imported from /tmp/consort-scratch-x/views/ab12/test/t1.test.js".to_string(),
            format!("Error: Cannot find module '../src/orders.js' from 'test/t1.test.js'\n\nRequire stack:\n  {view}"),
        ] {
            assert_eq!(modules(t.path(), &message), want, "{message}");
        }
        // jest leaves the extension out.
        assert_missing(
            &t,
            "Cannot find module '../src/orders' from 'test/t1.test.js'",
            &[("test/t1.test.js", "src/orders")],
        );
        let py = "ImportError while importing test module '/tmp/v/tests/test_t1.py'.\nHint: …\nE   ModuleNotFoundError: No module named 'app.orders'";
        assert_missing(&t, py, &[("tests/test_t1.py", "app/orders.py")]);
        let lacks = "ImportError while importing test module '/tmp/v/tests/test_t1.py'.\nE   ImportError: cannot import name 'total_of' from 'app.counts' (/tmp/v/app/counts.py)";
        assert_missing(&t, lacks, &[("tests/test_t1.py", "app/counts.py")]);
    }

    #[test]
    fn packages_syntax_errors_and_modules_that_exist_are_no_missing_module() {
        let t = tree();
        let view = "/tmp/v/test/t1.test.js";
        for message in [
            format!("Cannot find package 'left-pad' imported from '{view}'"),
            format!("Cannot find module 'left-pad' imported from '{view}'"),
            "Failed to parse source for import analysis because the content contains invalid JS syntax.".to_string(),
            format!("Cannot find module '../src/counts.js' imported from '{view}'"),
            format!("Cannot find module '../../../etc/passwd' imported from '{view}'"),
            "Cannot find module '../src/orders.js' imported from '/tmp/v/test/not_in_tree.test.js'".to_string(),
            "ImportError while importing test module '/tmp/v/tests/test_t1.py'.\nE   ModuleNotFoundError: No module named 'hypothesis'".to_string(),
            "ImportError while importing test module '/tmp/v/tests/test_t1.py'.\nE   ImportError: cannot import name 'x' from 'app.orders'".to_string(),
            "ImportError while importing test module '/tmp/v/tests/test_t1.py'.\nE   ModuleNotFoundError: No module named 'app.counts'".to_string(),
            "E   SyntaxError: invalid syntax".to_string(),
        ] {
            assert!(modules(t.path(), &message).is_empty(), "{message}");
        }
        let passed = TestOutcome {
            status: TestStatus::Passed,
            ..failed(&format!(
                "Cannot find module '../src/orders.js' imported from '{view}'"
            ))
        };
        assert!(
            read(t.path(), &[passed], "").is_empty(),
            "a passed outcome is no load failure"
        );
    }

    #[test]
    fn a_go_package_whose_tests_name_what_is_not_written_yet_is_a_missing_module() {
        let t = tree();
        let root = "# example.com/shelf [example.com/shelf.test]\n./shelf_test.go:12:13: undefined: Most\n./shelf_test.go:18:13: undefined: Least";
        assert_missing(&t, root, &[("shelf_test.go", ".")]);
        let method = "# example.com/x/a [example.com/x/a.test]\na/a_test.go:4:7: c.Most undefined (type *Counter has no field or method Most)\na/more_test.go:9:2: undefined: Least\ntoo many errors";
        assert_missing(&t, method, &[("a/a_test.go", "a"), ("a/more_test.go", "a")]);
        for other in [
            // An error in the code, not the test.
            "./shelf.go:3:1: undefined: Most",
            // Another kind of error.
            "./shelf_test.go:3:1: syntax error: unexpected }",
            "./shelf_test.go:3:1: undefined: Most\n./shelf_test.go:4:1: missing return",
            // Two packages.
            "a/a_test.go:4:7: undefined: Most\nb/b_test.go:4:7: undefined: Most",
            // Not in the tree.
            "../elsewhere_test.go:1:1: undefined: Most",
            "",
        ] {
            assert!(modules(t.path(), other).is_empty(), "{other}");
        }
    }

    #[test]
    fn a_run_that_failed_naming_no_test_is_read_from_its_output() {
        let t = tree();
        let jest = "FAIL test/t1.test.js\n  ● Test suite failed to run\n\n    Cannot find module '../src/orders' from 'test/t1.test.js'\n";
        let found = read_whole_run(t.path(), jest);
        assert_eq!(
            found
                .iter()
                .map(|m| (m.outcome.as_str(), m.test_file.as_str(), m.module.as_str()))
                .collect::<Vec<_>>(),
            [(TestOutcome::WHOLE_RUN, "test/t1.test.js", "src/orders")]
        );
        let named = TestOutcome::new("test/t1.test.js::x", TestStatus::Failed);
        assert!(
            read(t.path(), &[named], jest).is_empty(),
            "a test's own failure is read from its own message only"
        );
    }

    #[test]
    fn a_rust_test_target_naming_what_the_crate_lacks_stops_every_test() {
        let t = tree();
        let cargo = "   Compiling shelf v0.1.0 (/tmp/v)\nerror[E0432]: unresolved import `shelf::most`\n --> tests/most.rs:1:5\n  |\n1 | use shelf::most;\n\nerror[E0425]: cannot find function `least` in crate `shelf`\n --> tests/most.rs:5:32\n\nSome errors have detailed explanations: E0425, E0432.\nerror: could not compile `shelf` (test \"most\") due to 2 previous errors\n";
        let found = read_whole_run(t.path(), cargo);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (
                found[0].test_file.as_str(),
                found[0].module.as_str(),
                found[0].stops_every_test
            ),
            ("tests/most.rs", "src/lib.rs", true)
        );
        assert_eq!(
            rust_missing(
                t.path(),
                "error[E0425]: cannot find value `x` in this scope\n --> crates/x/tests/y.rs:2:1\n"
            ),
            [(
                "crates/x/tests/y.rs".to_string(),
                "crates/x/src/lib.rs".to_string()
            )]
        );
        for other in [
            // A type error is no missing item.
            "error[E0308]: mismatched types\n --> tests/most.rs:3:1\n",
            // In the code, not a test target.
            "error[E0425]: cannot find value `x` in this scope\n --> src/lib.rs:2:1\n",
            // Beside another error.
            "error[E0425]: cannot find value `x` in this scope\n --> tests/most.rs:2:1\nerror: linking with `cc` failed\n",
            "",
        ] {
            assert!(rust_missing(t.path(), other).is_empty(), "{other}");
        }
    }
}
