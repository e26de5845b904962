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
    /// The outcomes `text` holds in this form; None when it holds no test result at all.
    pub fn parse(self, text: &str) -> Option<Vec<TestOutcome>> {
        match self {
            StdoutFormat::Tap => crate::parse_tap(text),
            StdoutFormat::Libtest => parse_libtest(text),
            StdoutFormat::GoTestJson => parse_go_test_json(text),
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
    #[serde(rename = "Test", default)]
    test: Option<String>,
    #[serde(rename = "Output", default)]
    output: Option<String>,
}

/// Parses `go test -json`: each test's (and subtest's) final `pass`, `fail` or `skip`. A
/// package that fails without a failing test (a build error) gives an errored `(package)`
/// outcome; text without a single event is not this form (None).
pub fn parse_go_test_json(text: &str) -> Option<Vec<TestOutcome>> {
    let mut out = Vec::new();
    let mut package_failed = false;
    let mut any = false;
    // What each test printed (`t.Errorf`'s lines with their file and line), and the
    // package's own lines (a build error).
    let mut printed: std::collections::HashMap<Option<String>, String> = Default::default();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<GoEvent>(line.trim()) else {
            continue;
        };
        any = true;
        let status = match event.action.as_str() {
            "pass" => TestStatus::Passed,
            "fail" => TestStatus::Failed,
            "skip" => TestStatus::Skipped,
            "output" => {
                let kept = printed.entry(event.test).or_default();
                if kept.len() < 4 * TestOutcome::MESSAGE_CAP {
                    kept.push_str(event.output.as_deref().unwrap_or(""));
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
            None if status == TestStatus::Failed => package_failed = true,
            None => {}
        }
    }
    if package_failed && !out.iter().any(|o| o.status == TestStatus::Failed) {
        let said = printed.get(&None).map(String::as_str).unwrap_or("");
        out.push(TestOutcome::new("(package)", TestStatus::Errored).with_message(said));
    }
    (any && !out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(o: &[TestOutcome]) -> Vec<(&str, TestStatus)> {
        o.iter().map(|o| (o.name.as_str(), o.status)).collect()
    }

    #[test]
    fn libtest_lines_become_outcomes() {
        let text = "\nrunning 4 tests\ntest tests::adds ... ok\ntest tests::subtracts ... FAILED\ntest slow ... ignored, needs a db\ntest tests::x ... ignored\n\nfailures:\n\n---- tests::subtracts stdout ----\nthread 'tests::subtracts' panicked\ntest result: FAILED. 1 passed; 1 failed\n";
        let got = parse_libtest(text).expect("outcomes");
        assert_eq!(
            pairs(&got),
            vec![
                ("tests::adds", TestStatus::Passed),
                ("tests::subtracts", TestStatus::Failed),
                ("slow", TestStatus::Skipped),
                ("tests::x", TestStatus::Skipped),
            ]
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
        let got = parse_go_test_json(text).expect("outcomes");
        assert_eq!(
            pairs(&got),
            vec![
                ("TestA", TestStatus::Passed),
                ("TestB/sub", TestStatus::Failed),
                ("TestB", TestStatus::Failed),
                ("TestC", TestStatus::Skipped),
            ]
        );
        let said = got[2].message.as_deref().expect("TestB's lines");
        assert_eq!(said, "orders_test.go:12: got 2, want 3");
        let build_error = r#"{"Action":"output","Package":"p","Output":"x.go:1: syntax error"}
{"Action":"fail","Package":"p","Elapsed":0}
"#;
        let got = parse_go_test_json(build_error).expect("a failed package");
        assert_eq!(
            pairs(&got),
            vec![("(package)", TestStatus::Errored)],
            "no test ran"
        );
        assert_eq!(got[0].message.as_deref(), Some("x.go:1: syntax error"));
        assert_eq!(parse_go_test_json("ok  p 0.1s\n"), None);
    }

    #[test]
    fn a_package_that_fails_without_a_failing_test_is_an_error() {
        let text = r#"{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"fail","Package":"p","Elapsed":0}
"#;
        let got = parse_go_test_json(text).expect("outcomes");
        assert_eq!(got.last().map(|o| o.status), Some(TestStatus::Errored));
    }
}
