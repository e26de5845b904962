//! What splitting a jest suite needs: a selection by exact paths (`--runTestsByPath`), and a
//! listing of every test by name. jest has no listing command, so the whole suite runs with a
//! test-name pattern nothing matches: each file is loaded and its tests reported skipped (no
//! test body or hook runs), in `--json`'s report, named as jest-junit names them.

use std::path::Path;

use super::{Suite, SuiteTest, read_small_file};

/// What jest-junit is told for its class names to be the test file's path
/// (`JEST_JUNIT_CLASSNAME`), as `consort init` writes it.
pub const JEST_FILE_CLASSNAME: &str = "JEST_JUNIT_CLASSNAME=\"{filepath}\"";

/// The settings of jest-junit's case names other than its class: with any of them changed
/// the listing's names would not be the report's.
const NAME_SETTINGS: [&str; 2] = ["JEST_JUNIT_TITLE", "JEST_JUNIT_ANCESTOR_SEPARATOR"];

/// Whether `command` runs jest with jest-junit naming its cases as the listing does.
pub(super) fn names_as_listed(command: &str) -> bool {
    command.contains(JEST_FILE_CLASSNAME) && !NAME_SETTINGS.iter().any(|s| command.contains(s))
}

/// What the listing adds to the command: its report as JSON on standard output, and a test
/// name pattern no name matches (`a^`: nothing comes before the start).
pub(super) const LIST_ARGS: &str = "--json --testNamePattern='a^' --passWithNoTests";

/// jest's `--json` report (the fields read here).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    test_results: Vec<FileResult>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileResult {
    name: String,
    /// `failed` for a file that failed to load (every test is skipped in a listing, so no
    /// other file fails).
    #[serde(default)]
    status: String,
    assertion_results: Vec<Assertion>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Assertion {
    ancestor_titles: Vec<String>,
    title: String,
}

/// The suite of the listing's `--json` report on `stdout`, each test named with
/// `name_format` as jest-junit names it (the describe blocks and the title joined by spaces),
/// its file relative to the first of `roots` that holds it, and the files that failed to load.
/// `None` when there is no report, a file is outside `roots`, or the project's `package.json`
/// sets jest-junit's names.
pub(super) fn listed_tests(stdout: &str, name_format: &str, roots: &[&Path]) -> Option<Suite> {
    if roots.iter().any(|r| sets_junit_names(r)) {
        return None;
    }
    let report: Report = stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line.trim()).ok())?;
    let mut suite = Suite::default();
    for file in report.test_results {
        let rel = roots.iter().find_map(|root| {
            let rel = Path::new(&file.name).strip_prefix(root).ok()?;
            rel.to_str().map(String::from)
        })?;
        if file.status == "failed" {
            suite.unloaded.push(rel);
            continue;
        }
        for a in file.assertion_results {
            let title = format!("{} {}", a.ancestor_titles.join(" "), a.title);
            let name = name_format
                .replace("{classname}", &rel)
                .replace("{name}", title.trim());
            suite.tests.push(SuiteTest {
                file: rel.clone(),
                name,
            });
        }
    }
    Some(suite)
}

/// Whether the `package.json` in `root` configures jest-junit's case names.
fn sets_junit_names(root: &Path) -> bool {
    let Some(text) = read_small_file(&root.join("package.json")) else {
        return false;
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return false;
    };
    json.get("jest-junit").is_some_and(|c| {
        ["titleTemplate", "ancestorSeparator"]
            .iter()
            .any(|k| c.get(k).is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: &str = "{classname}::{name}";

    #[test]
    fn a_listing_names_each_test_as_jest_junit_does() {
        let report = r#"{"numTotalTests":3,"testResults":[{"name":"/v/1/tests/a.test.js","assertionResults":[{"ancestorTitles":["group","inner"],"title":"n 1","status":"pending"},{"ancestorTitles":[],"title":"top","status":"pending"}]},{"name":"/tree/src/b.test.ts","assertionResults":[{"ancestorTitles":[],"title":"b","status":"pending"}]}]}"#;
        let stdout = format!("printed by a test file\n{report}\n");
        let roots = [Path::new("/v/1"), Path::new("/tree")];
        let suite = listed_tests(&stdout, FORMAT, &roots).expect("listed");
        let names: Vec<(&str, &str)> = suite
            .tests
            .iter()
            .map(|t| (t.file.as_str(), t.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("tests/a.test.js", "tests/a.test.js::group inner n 1"),
                ("tests/a.test.js", "tests/a.test.js::top"),
                ("src/b.test.ts", "src/b.test.ts::b"),
            ]
        );
        assert!(suite.unloaded.is_empty());
        assert_eq!(listed_tests("no report", FORMAT, &roots), None);
        let broken = r#"{"testResults":[{"name":"/tree/tests/ok.test.js","status":"passed","assertionResults":[{"ancestorTitles":[],"title":"ok","status":"pending"}]},{"name":"/tree/tests/gone.test.js","status":"failed","message":"Cannot find module '../src/gone' from 'tests/gone.test.js'","assertionResults":[]}]}"#;
        let suite = listed_tests(broken, FORMAT, &roots).expect("listed");
        assert_eq!(
            suite.unloaded,
            vec!["tests/gone.test.js"],
            "a file that failed to load is kept, to be run"
        );
        assert_eq!(suite.tests.len(), 1);
        assert_eq!(
            listed_tests(report, FORMAT, &[Path::new("/elsewhere")]),
            None
        );
    }

    #[test]
    fn names_set_otherwise_are_not_listed() {
        assert!(names_as_listed(&format!(
            "{JEST_FILE_CLASSNAME} npx jest --ci"
        )));
        assert!(!names_as_listed("npx jest --ci"));
        assert!(!names_as_listed(&format!(
            "{JEST_FILE_CLASSNAME} JEST_JUNIT_TITLE=\"{{title}}\" npx jest"
        )));
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            tmp.path().join("package.json"),
            r#"{"jest-junit":{"titleTemplate":"{title}"}}"#,
        )
        .expect("write");
        let report = r#"{"testResults":[]}"#;
        assert_eq!(listed_tests(report, FORMAT, &[tmp.path()]), None);
        std::fs::write(tmp.path().join("package.json"), r#"{"name":"x"}"#).expect("write");
        assert_eq!(
            listed_tests(report, FORMAT, &[tmp.path()]),
            Some(Suite::default())
        );
    }
}
