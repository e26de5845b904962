//! Per-test outcomes from a JUnit XML report (pytest, vitest, cargo-nextest, Maven, …).

use consort_actors::{TestOutcome, TestStatus};

use crate::error::{Error, Result};

/// Parses a JUnit XML report. Each `<testcase>` becomes one outcome named by `name_format`
/// (`{classname}` and `{name}` are replaced; when the case has no class name, just `{name}`).
/// A case with `<failure>` failed, with `<error>` errored, with `<skipped>` was skipped.
pub fn parse_junit(xml: &str, name_format: &str) -> Result<Vec<TestOutcome>> {
    let doc = roxmltree::Document::parse(xml)
        .map_err(|e| Error::Runner(format!("the JUnit report is not valid XML: {e}")))?;
    let mut out = Vec::new();
    for case in doc
        .descendants()
        .filter(|n| n.is_element() && n.tag_name().name() == "testcase")
    {
        // A case without a name (or class) has the empty one, which no expected test has.
        let name = case.attribute("name").unwrap_or("").trim();
        let class = case.attribute("classname").unwrap_or("").trim();
        let full = if class.is_empty() {
            name.to_string()
        } else {
            name_format
                .replace("{classname}", class)
                .replace("{name}", name)
        };
        let child = |tag: &str| {
            case.children()
                .any(|c| c.is_element() && c.tag_name().name() == tag)
        };
        let status = if child("failure") {
            TestStatus::Failed
        } else if child("error") {
            TestStatus::Errored
        } else if child("skipped") {
            TestStatus::Skipped
        } else {
            TestStatus::Passed
        };
        out.push(TestOutcome { name: full, status });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_names() {
        let xml = r#"<?xml version="1.0"?>
<testsuites><testsuite name="s">
  <testcase classname="tests.test_a" name="test_ok" time="0.1"/>
  <testcase classname="tests.test_a" name="test_bad"><failure message="x">boom</failure></testcase>
  <testcase name="bare"><error/></testcase>
  <testcase classname="c" name="later"><skipped/></testcase>
</testsuite></testsuites>"#;
        let got = parse_junit(xml, "{classname}::{name}").expect("parse");
        let pairs: Vec<(&str, TestStatus)> =
            got.iter().map(|o| (o.name.as_str(), o.status)).collect();
        assert_eq!(
            pairs,
            vec![
                ("tests.test_a::test_ok", TestStatus::Passed),
                ("tests.test_a::test_bad", TestStatus::Failed),
                ("bare", TestStatus::Errored),
                ("c::later", TestStatus::Skipped),
            ]
        );
        assert!(parse_junit("<testsuite><testcase", "{name}").is_err());
        assert!(parse_junit("<!DOCTYPE x [<!ENTITY a 'b'>]><x>&a;</x>", "{name}").is_err());
    }
}
