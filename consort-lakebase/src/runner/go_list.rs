//! What splitting a `go test -json ./...` suite needs: its packages as the unit a selection
//! runs (`go test` runs packages, not files), its listing (`go test -list .`) read from the
//! JSON events, and the `_test.go` file that declares each listed test.

use std::path::Path;

use super::{SuiteTest, read_small_file};

/// The word of a Go command that names every package of the module.
pub(super) const ALL_PACKAGES: &str = "./...";

/// Whether `command` names packages only as one `./...` (a selection replaces that word with
/// the packages it runs; any other package pattern would still run whatever it names).
pub(super) fn names_all_packages(command: &str) -> bool {
    let patterns: Vec<&str> = command
        .split(' ')
        .filter(|w| w.starts_with("./") || w.starts_with("../") || w.contains("..."))
        .collect();
    patterns == [ALL_PACKAGES]
}

/// `command` with its `./...` replaced by `with`.
pub(super) fn replace_all_packages(command: &str, with: &str) -> String {
    command
        .split(' ')
        .map(|w| if w == ALL_PACKAGES { with } else { w })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The package (directory) of a test file: what `go test` runs when the file is selected.
pub(super) fn package_of(file: &str) -> &str {
    file.rsplit_once('/').map_or("", |(dir, _)| dir)
}

/// The package argument of the directory `dir` (`.` for the module's root).
pub(super) fn package_arg(dir: &str) -> String {
    if dir.is_empty() {
        ".".into()
    } else {
        format!("./{dir}")
    }
}

/// One `go test -json` event of a listing (the fields read here).
#[derive(serde::Deserialize)]
struct ListEvent {
    #[serde(rename = "Action")]
    action: String,
    #[serde(rename = "Package", default)]
    package: String,
    #[serde(rename = "Test", default)]
    test: Option<String>,
    #[serde(rename = "Output", default)]
    output: String,
}

/// The suite of a `go test -json -list . ./...` listing: each test, fuzz test and example
/// that `go test` runs (benchmarks are listed but not run), in the `_test.go` file under the
/// first of `roots` with a `go.mod` that declares it. `None` when a listed test cannot be
/// placed in a file (the suite then runs whole).
pub(super) fn listed_tests(stdout: &str, roots: &[&Path]) -> Option<Vec<SuiteTest>> {
    let (root, go_mod) = roots
        .iter()
        .find_map(|r| Some((r, read_small_file(&r.join("go.mod"))?)))?;
    let module = module_path(&go_mod)?;
    let mut suite = Vec::new();
    for line in stdout.lines() {
        let Ok(event) = serde_json::from_str::<ListEvent>(line.trim()) else {
            continue;
        };
        let name = event.output.trim_end();
        if event.action != "output" || event.test.is_some() || !is_run_by_go_test(name) {
            continue;
        }
        let dir = if event.package == module {
            ""
        } else {
            event.package.strip_prefix(&module)?.strip_prefix('/')?
        };
        let file = declaring_file(root, dir, name)?;
        suite.push(SuiteTest {
            file,
            name: name.to_string(),
        });
    }
    Some(suite)
}

/// The module path a `go.mod` declares.
fn module_path(go_mod: &str) -> Option<String> {
    go_mod.lines().find_map(|l| {
        let path = l.trim().strip_prefix("module")?.trim();
        (!path.is_empty()).then(|| path.trim_matches('"').to_string())
    })
}

/// Whether a line of `go test -list` names a function `go test` runs: a test, a fuzz test
/// (its seed corpus) or an example with output.
fn is_run_by_go_test(name: &str) -> bool {
    ["Test", "Fuzz", "Example"]
        .iter()
        .any(|p| name.starts_with(p))
        && name.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// The `_test.go` file of `files` (paths under `root`) that declares the function of the test
/// named `test` (a subtest's name is under its test's: `TestA/case`).
pub(super) fn file_declaring(root: &Path, test: &str, files: &[String]) -> Option<String> {
    let function = test.split('/').next()?;
    files
        .iter()
        .filter(|f| f.ends_with("_test.go"))
        .find(|f| declares(&root.join(f), function))
        .cloned()
}

/// The `_test.go` file in the directory `dir` under `root` that declares `function`.
fn declaring_file(root: &Path, dir: &str, function: &str) -> Option<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join(dir))
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with("_test.go"))
        .collect();
    names.sort();
    let rel = |n: &String| match dir {
        "" => n.clone(),
        d => format!("{d}/{n}"),
    };
    names
        .iter()
        .map(rel)
        .find(|f| declares(&root.join(f), function))
}

/// Whether the Go file at `path` declares the function `function` at the start of a line.
fn declares(path: &Path, function: &str) -> bool {
    let head = format!("func {function}(");
    read_small_file(path).is_some_and(|text| text.lines().any(|l| l.starts_with(&head)))
}

#[cfg(test)]
mod tests {
    use super::*;

    use consort_testkit::disk::tree_of as module;

    #[test]
    fn a_listing_places_each_test_in_the_file_that_declares_it_and_leaves_out_benchmarks() {
        let tmp = module(&[
            ("go.mod", "module example.com/shelf\n\ngo 1.19\n"),
            (
                "a_test.go",
                "package shelf\n\nfunc TestA(t *testing.T) {}\nfunc BenchmarkB(b *testing.B) {}\n",
            ),
            (
                "b_test.go",
                "package shelf\n\nfunc ExampleD() {\n\t// Output:\n}\n",
            ),
            (
                "sub/s_test.go",
                "package sub\n\nfunc TestS(t *testing.T) {}\n",
            ),
        ]);
        let listing = [
            r#"{"Action":"output","Package":"example.com/shelf","Output":"TestA\n"}"#,
            r#"{"Action":"output","Package":"example.com/shelf","Output":"BenchmarkB\n"}"#,
            r#"{"Action":"output","Package":"example.com/shelf","Output":"ExampleD\n"}"#,
            r#"{"Action":"output","Package":"example.com/shelf","Output":"ok  \texample.com/shelf\t0.008s\n"}"#,
            r#"{"Action":"pass","Package":"example.com/shelf","Elapsed":0.008}"#,
            r#"{"Action":"output","Package":"example.com/shelf/sub","Output":"TestS\n"}"#,
        ]
        .join("\n");
        let suite = listed_tests(&listing, &[tmp.path()]).expect("listed");
        let pairs: Vec<(&str, &str)> = suite
            .iter()
            .map(|t| (t.file.as_str(), t.name.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("a_test.go", "TestA"),
                ("b_test.go", "ExampleD"),
                ("sub/s_test.go", "TestS")
            ]
        );
        let files = ["sub/s_test.go".to_string(), "a_test.go".to_string()];
        assert_eq!(
            file_declaring(tmp.path(), "TestA/case_1", &files).as_deref(),
            Some("a_test.go")
        );
        assert_eq!(file_declaring(tmp.path(), "TestGone", &files), None);
    }

    #[test]
    fn a_test_no_file_declares_or_a_package_outside_the_module_is_no_suite() {
        let tmp = module(&[
            ("go.mod", "module example.com/shelf\n"),
            ("a_test.go", "package shelf\n"),
        ]);
        let ghost = r#"{"Action":"output","Package":"example.com/shelf","Output":"TestGhost\n"}"#;
        assert_eq!(listed_tests(ghost, &[tmp.path()]), None);
        let other = r#"{"Action":"output","Package":"example.org/other","Output":"TestA\n"}"#;
        assert_eq!(listed_tests(other, &[tmp.path()]), None);
        assert_eq!(listed_tests("", &[Path::new("/nonexistent")]), None);
    }

    #[test]
    fn a_pipe_among_the_test_files_is_not_read() {
        let tmp = module(&[
            ("go.mod", "module example.com/shelf\n"),
            (
                "b_test.go",
                "package shelf\n\nfunc TestB(t *testing.T) {}\n",
            ),
        ]);
        let made = std::process::Command::new("mkfifo")
            .arg(tmp.path().join("a_test.go"))
            .status()
            .expect("mkfifo");
        assert!(made.success());
        let listing = r#"{"Action":"output","Package":"example.com/shelf","Output":"TestB\n"}"#;
        let suite = listed_tests(listing, &[tmp.path()]).expect("listed");
        assert_eq!(suite[0].file, "b_test.go");
    }

    #[test]
    fn the_package_word_is_replaced_only_when_there_is_one() {
        assert!(names_all_packages("go test -json ./..."));
        assert!(!names_all_packages("go test -json ./cmd/... ./..."));
        assert!(!names_all_packages("go test -json ./... ./..."));
        assert_eq!(
            replace_all_packages("go test -json ./... -count=1", ". ./sub"),
            "go test -json . ./sub -count=1"
        );
        assert_eq!(package_arg(package_of("a_test.go")), ".");
        assert_eq!(package_arg(package_of("x/y/a_test.go")), "./x/y");
    }
}
