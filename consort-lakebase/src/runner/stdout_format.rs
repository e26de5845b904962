//! Per-test outcomes from what a test tool prints on standard output, for tools whose own
//! stable forms are not TAP: Rust's libtest (`cargo test`) and `go test -json`.

use consort_actors::{TestOutcome, TestStatus};
use serde::{Deserialize, Serialize};

/// Which form the command's standard output is read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StdoutFormat {
    /// TAP (the default; see [`crate::parse_tap`]).
    #[default]
    Tap,
    /// libtest's lines, `test <name> ... ok|FAILED|ignored` (`cargo test`).
    Libtest,
    /// `go test -json` events, one JSON object per line.
    GoTestJson,
}

impl StdoutFormat {
    /// The outcomes standard output `text` holds in this form; None when it holds no test
    /// result at all. `stderr` is read only for what the tool prints there of a failed
    /// build (`go test` before Go 1.24).
    pub fn parse(self, text: &str, stderr: &str) -> Option<Vec<TestOutcome>> {
        match self {
            StdoutFormat::Tap => crate::parse_tap(text),
            StdoutFormat::Libtest => parse_libtest(text),
            StdoutFormat::GoTestJson => parse_go_test_json(text, stderr),
        }
    }
}

/// Parses libtest's per-test lines. A test that panicked is `FAILED`; `ignored` (with or
/// without a reason) is skipped; bench lines pass. Lines between are ignored (the failures'
/// output, the summaries of each test binary).
pub fn parse_libtest(text: &str) -> Option<Vec<TestOutcome>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim_end().strip_prefix("test ") else {
            continue;
        };
        let Some((name, result)) = rest.rsplit_once(" ... ") else {
            continue;
        };
        let status = match result {
            "ok" => TestStatus::Passed,
            "FAILED" => TestStatus::Failed,
            r if r == "ignored" || r.starts_with("ignored, ") => TestStatus::Skipped,
            r if r.starts_with("bench:") => TestStatus::Passed,
            _ => continue,
        };
        out.push(TestOutcome::new(name.trim(), status));
    }
    if out.is_empty() {
        return None;
    }
    for (name, said) in libtest_failure_sections(text) {
        if let Some(o) = out
            .iter_mut()
            .find(|o| o.name == name && o.message.is_none() && o.is_failure())
        {
            *o = o.clone().with_message(&said);
        }
    }
    Some(out)
}

/// The `---- <name> stdout ----` sections libtest prints for failed tests: the panic message
/// with its location, and what the test printed.
fn libtest_failure_sections(text: &str) -> Vec<(String, String)> {
    let mut sections: Vec<(String, String)> = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        let header = line
            .strip_prefix("---- ")
            .and_then(|r| r.strip_suffix(" stdout ----"));
        let ends = line.trim_end() == "failures:" || line.starts_with("test result:");
        if header.is_some() || ends {
            sections.extend(current.take());
        }
        if let Some(name) = header {
            current = Some((name.trim().to_string(), String::new()));
        } else if let Some((_, body)) = &mut current {
            body.push_str(line);
            body.push('\n');
        }
    }
    sections.extend(current);
    sections
}

/// One `go test -json` event (the fields read here).
#[derive(Deserialize)]
struct GoEvent {
    #[serde(rename = "Action")]
    action: String,
    #[serde(rename = "Package", default)]
    package: Option<String>,
    /// Go 1.24 and later: the package a `build-output` or `build-fail` event is about.
    #[serde(rename = "ImportPath", default)]
    import_path: Option<String>,
    #[serde(rename = "Test", default)]
    test: Option<String>,
    #[serde(rename = "Output", default)]
    output: Option<String>,
}

/// The packages of a `go test -json` run that did not build, in the order the run named
/// them, with what the compiler said of each.
#[derive(Default)]
struct FailedBuilds {
    packages: Vec<String>,
    said: std::collections::HashMap<String, String>,
}

impl FailedBuilds {
    /// `package` did not build.
    fn failed(&mut self, package: &str) {
        if !self.packages.iter().any(|p| p == package) {
            self.packages.push(package.to_string());
        }
    }

    /// The compiler said `line` of `package`.
    fn said(&mut self, package: &str, line: &str) {
        let kept = self.said.entry(package.to_string()).or_default();
        if kept.len() < TestOutcome::MESSAGE_CAP {
            kept.push_str(line);
            if !line.ends_with('\n') {
                kept.push('\n');
            }
        }
    }

    /// Reads Go's build errors on standard error (before Go 1.24): a section per package,
    /// each headed `# <package>` or `# <package> [<package>.test]`.
    fn read_stderr(&mut self, stderr: &str) {
        let mut current = None;
        for line in stderr.lines() {
            if let Some(header) = line.strip_prefix("# ") {
                current = Some(build_package(header).to_string());
            }
            if let Some(package) = &current {
                let package = package.clone();
                self.said(&package, line);
            }
        }
    }

    /// An errored outcome per package that did not build, named `<package> [build failed]`,
    /// whose message is what the compiler said of it.
    fn outcomes(self) -> impl Iterator<Item = TestOutcome> {
        let FailedBuilds { packages, said } = self;
        packages.into_iter().map(move |p| {
            let message = said
                .get(&p)
                .cloned()
                .unwrap_or_else(|| format!("FAIL {p} [build failed]"));
            TestOutcome::new(format!("{p} {BUILD_FAILED}"), TestStatus::Errored)
                .with_message(message.trim_end())
        })
    }
}

/// What `go test` prints after a package that did not build.
const BUILD_FAILED: &str = "[build failed]";

/// The package a build header or import path names: `example.com/a_test
/// [example.com/a.test]` is package `example.com/a`'s test build.
fn build_package(header: &str) -> &str {
    let header = header.trim();
    match header.split_once(" [") {
        Some((_, built)) => built.trim_end_matches(']').trim_end_matches(".test"),
        None => header,
    }
}

/// Parses `go test -json`: each test's (and subtest's) final `pass`, `fail` or `skip`. A
/// package that did not build gives an errored `<package> [build failed]` outcome whose
/// message is the compiler's errors (from the JSON events since Go 1.24, from `stderr`
/// before); a package that fails without a failing test otherwise gives an errored
/// `(package)` outcome. Text without a single event is not this form (None).
pub fn parse_go_test_json(text: &str, stderr: &str) -> Option<Vec<TestOutcome>> {
    let mut out = Vec::new();
    let mut package_failed = false;
    let mut any = false;
    let mut builds = FailedBuilds::default();
    // What each test printed (`t.Errorf`'s lines with their file and line), and the
    // package's own lines.
    let mut printed: std::collections::HashMap<Option<String>, String> = Default::default();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<GoEvent>(line.trim()) else {
            // Before Go 1.24, a package that did not build is this line, not an event.
            if let Some(package) = line
                .strip_prefix("FAIL\t")
                .and_then(|l| l.trim_end().strip_suffix(BUILD_FAILED))
            {
                any = true;
                builds.failed(package.trim());
            }
            continue;
        };
        any = true;
        let status = match event.action.as_str() {
            "pass" => TestStatus::Passed,
            "fail" => TestStatus::Failed,
            "skip" => TestStatus::Skipped,
            "build-output" | "build-fail" => {
                let package = build_package(event.import_path.as_deref().unwrap_or(""));
                match event.output.as_deref() {
                    Some(said) => builds.said(package, said),
                    None => builds.failed(package),
                }
                continue;
            }
            "output" => {
                let said = event.output.as_deref().unwrap_or("");
                if let (None, Some(package)) = (&event.test, &event.package)
                    && said.trim_end().ends_with(BUILD_FAILED)
                {
                    builds.failed(package);
                }
                let kept = printed.entry(event.test).or_default();
                if kept.len() < 4 * TestOutcome::MESSAGE_CAP {
                    kept.push_str(said);
                }
                continue;
            }
            _ => continue,
        };
        match event.test {
            Some(name) => {
                let said = printed.get(&Some(name.clone())).map(String::as_str);
                let outcome = TestOutcome::new(name, status);
                out.push(match said {
                    Some(said) if status == TestStatus::Failed => outcome.with_message(said),
                    _ => outcome,
                });
            }
            None if status == TestStatus::Failed => {
                let package = event.package.as_deref().unwrap_or("");
                package_failed |= !builds.packages.iter().any(|p| p == package);
            }
            None => {}
        }
    }
    if !builds.packages.is_empty() {
        builds.read_stderr(stderr);
    }
    if package_failed && !out.iter().any(|o| o.status == TestStatus::Failed) {
        let said = printed.get(&None).map(String::as_str).unwrap_or("");
        out.push(TestOutcome::new("(package)", TestStatus::Errored).with_message(said));
    }
    out.extend(builds.outcomes());
    (any && !out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::outcomes_text;

    #[test]
    fn libtest_lines_become_outcomes() {
        let text = "\nrunning 4 tests\ntest tests::adds ... ok\ntest tests::subtracts ... FAILED\ntest slow ... ignored, needs a db\ntest tests::x ... ignored\n\nfailures:\n\n---- tests::subtracts stdout ----\nthread 'tests::subtracts' panicked\ntest result: FAILED. 1 passed; 1 failed\n";
        let got = parse_libtest(text).expect("outcomes");
        assert_eq!(
            outcomes_text(&got),
            "tests::adds passed, tests::subtracts failed, slow skipped, tests::x skipped"
        );
        let said = got[1]
            .message
            .as_deref()
            .expect("the panic reaches the outcome");
        assert_eq!(said, "thread 'tests::subtracts' panicked");
        assert_eq!(got[0].message, None);
        assert_eq!(parse_libtest("error[E0425]: cannot find value\n"), None);
        assert_eq!(parse_libtest("test result: ok. 0 passed\n"), None);
    }

    #[test]
    fn go_test_json_events_become_outcomes() {
        let text = r#"{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"--- PASS"}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0}
{"Action":"fail","Package":"p","Test":"TestB/sub","Elapsed":0}
{"Action":"output","Package":"p","Test":"TestB","Output":"    orders_test.go:12: got 2, want 3\n"}
{"Action":"fail","Package":"p","Test":"TestB","Elapsed":0}
{"Action":"skip","Package":"p","Test":"TestC","Elapsed":0}
{"Action":"fail","Package":"p","Elapsed":0}
not json
"#;
        let got = parse_go_test_json(text, "").expect("outcomes");
        assert_eq!(
            outcomes_text(&got),
            "TestA passed, TestB/sub failed, TestB failed, TestC skipped"
        );
        let said = got[2].message.as_deref().expect("TestB's lines");
        assert_eq!(said, "orders_test.go:12: got 2, want 3");
        let build_error = r#"{"Action":"output","Package":"p","Output":"x.go:1: syntax error"}
{"Action":"fail","Package":"p","Elapsed":0}
"#;
        let got = parse_go_test_json(build_error, "").expect("a failed package");
        assert_eq!(outcomes_text(&got), "(package) errored", "no test ran");
        assert_eq!(got[0].message.as_deref(), Some("x.go:1: syntax error"));
        assert_eq!(parse_go_test_json("ok  p 0.1s\n", ""), None);
    }

    #[test]
    fn a_package_that_fails_without_a_failing_test_is_an_error() {
        let text = r#"{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"fail","Package":"p","Elapsed":0}
"#;
        let got = parse_go_test_json(text, "").expect("outcomes");
        assert_eq!(got.last().map(|o| o.status), Some(TestStatus::Errored));
    }

    #[test]
    fn a_package_that_did_not_build_is_named_with_the_compiler_s_words() {
        // Go 1.19 to 1.23: a plain line on standard output, the errors on standard error.
        let stdout = "FAIL\texample.com/gx/a [build failed]\n{\"Action\":\"pass\",\"Package\":\"example.com/gx/b\",\"Test\":\"TestB\"}\n{\"Action\":\"pass\",\"Package\":\"example.com/gx/b\"}\n";
        let stderr =
            "# example.com/gx/a [example.com/gx/a.test]\na/a_test.go:4:33: undefined: Two\n";
        let got = parse_go_test_json(stdout, stderr).expect("outcomes");
        assert_eq!(
            outcomes_text(&got),
            "TestB passed, example.com/gx/a [build failed] errored"
        );
        assert_eq!(
            got[1].message.as_deref(),
            Some("# example.com/gx/a [example.com/gx/a.test]\na/a_test.go:4:33: undefined: Two")
        );
        // Go 1.24 and later: all of it in events.
        let events = r##"{"ImportPath":"example.com/gx/a [example.com/gx/a.test]","Action":"build-output","Output":"# example.com/gx/a [example.com/gx/a.test]\n"}
{"ImportPath":"example.com/gx/a [example.com/gx/a.test]","Action":"build-output","Output":"a/a_test.go:4:33: undefined: Two\n"}
{"ImportPath":"example.com/gx/a [example.com/gx/a.test]","Action":"build-fail"}
{"Action":"start","Package":"example.com/gx/a"}
{"Action":"output","Package":"example.com/gx/a","Output":"FAIL\texample.com/gx/a [build failed]\n"}
{"Action":"fail","Package":"example.com/gx/a","Elapsed":0,"FailedBuild":"example.com/gx/a [example.com/gx/a.test]"}
"##;
        let got = parse_go_test_json(events, "").expect("outcomes");
        assert_eq!(
            outcomes_text(&got),
            "example.com/gx/a [build failed] errored",
            "the build failure, and no (package) beside it"
        );
        assert_eq!(
            got[0].message.as_deref(),
            Some("# example.com/gx/a [example.com/gx/a.test]\na/a_test.go:4:33: undefined: Two")
        );
        assert_eq!(
            parse_go_test_json("FAIL\tp [build failed]\n", "")
                .expect("one package")
                .len(),
            1,
            "a run in which nothing built still reports its package"
        );
    }
}
