//! Per-test outcomes from a JUnit XML report (pytest, vitest, cargo-nextest, Maven, …).

use consort_actors::{TestOutcome, TestStatus};

use crate::error::{Error, Result};

/// Parses a JUnit XML report. Each `<testcase>` becomes one outcome named by `name_format`
/// (`{classname}` and `{name}` are replaced; when the case has no class name, just `{name}`).
/// A case with `<failure>` failed, with `<error>` errored, with `<skipped>` was skipped; a
/// failure's or error's message and text become the outcome's message.
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
                .find(|c| c.is_element() && c.tag_name().name() == tag)
        };
        let (status, said) = if let Some(f) = child("failure") {
            (TestStatus::Failed, Some(what_it_said(f)))
        } else if let Some(e) = child("error") {
            (TestStatus::Errored, Some(what_it_said(e)))
        } else if child("skipped").is_some() {
            (TestStatus::Skipped, None)
        } else {
            (TestStatus::Passed, None)
        };
        let outcome = TestOutcome::new(full, status);
        out.push(match said {
            Some(text) => outcome.with_message(&text),
            None => outcome,
        });
    }
    Ok(out)
}

/// A `<failure>` or `<error>` element's message attribute and its text (the assertion, the
/// stack with the location), the message once when the text repeats it.
fn what_it_said(element: roxmltree::Node<'_, '_>) -> String {
    let message = element.attribute("message").unwrap_or("").trim();
    let text: String = element
        .descendants()
        .filter(|n| n.is_text())
        .filter_map(|n| n.text())
        .collect();
    let text = text.trim();
    if message.is_empty() || text.contains(message) {
        text.to_string()
    } else if text.is_empty() {
        message.to_string()
    } else {
        format!("{message}\n{text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::outcomes_text;

    #[test]
    fn what_a_failure_said_reaches_the_outcome_capped() {
        // vitest's form: the message attribute, then the stack with the file and line.
        let xml = r#"<testsuites><testsuite name="test/orders.test.js">
  <testcase classname="test/orders.test.js" name="places an order">
    <failure message="expected 2 to be 3 // Object.is equality" type="AssertionError">AssertionError: expected 2 to be 3 // Object.is equality
 ❯ test/orders.test.js:7:17</failure>
  </testcase>
  <testcase classname="" name="tests.test_orders"><error message="collection failure">ImportError: No module named &apos;orders&apos;</error></testcase>
</testsuite></testsuites>"#;
        let got = parse_junit(xml, "{classname}::{name}").expect("parse");
        let said = got[0].message.as_deref().expect("a message");
        assert!(
            said.starts_with("AssertionError: expected 2 to be 3"),
            "{said}"
        );
        assert!(
            said.contains("test/orders.test.js:7:17"),
            "the location: {said}"
        );
        assert_eq!(
            said.matches("expected 2 to be 3").count(),
            1,
            "said once: {said}"
        );
        assert_eq!(got[1].name, "tests.test_orders");
        assert_eq!(got[1].status, TestStatus::Errored);
        assert_eq!(
            got[1].message.as_deref(),
            Some("collection failure\nImportError: No module named 'orders'")
        );
        let long = format!(
            "<testsuite><testcase name=\"t\"><failure>{}</failure></testcase></testsuite>",
            "x".repeat(10_000)
        );
        let got = parse_junit(&long, "{name}").expect("parse");
        let n = got[0].message.as_deref().map_or(0, |m| m.chars().count());
        assert!(n < TestOutcome::MESSAGE_CAP + 100, "capped: {n}");
    }

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
        assert_eq!(
            outcomes_text(&got),
            "tests.test_a::test_ok passed, tests.test_a::test_bad failed, bare errored, c::later skipped"
        );
        assert_eq!(got[0].message, None, "a passing test has no message");
        assert_eq!(got[1].message.as_deref(), Some("x\nboom"));
        assert_eq!(got[2].message, None, "an empty error says nothing");
        assert!(parse_junit("<testsuite><testcase", "{name}").is_err());
        assert!(parse_junit("<!DOCTYPE x [<!ENTITY a 'b'>]><x>&a;</x>", "{name}").is_err());
    }
}
