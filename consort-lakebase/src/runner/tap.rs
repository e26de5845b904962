//! Per-test outcomes from TAP (Test Anything Protocol) on standard output.

use consort_actors::{TestOutcome, TestStatus};

/// Parses TAP. Returns `None` when the text has no plan and no test line (it is not TAP).
///
/// `ok`/`not ok` lines become outcomes named by their description (`test <n>` when there is
/// none); `# SKIP` marks a test skipped and `# TODO` a failing test as skipped (TAP does not
/// count it as a failure). Indented lines (subtests) are ignored. `Bail out!` adds an errored
/// `(bail out)` outcome, and a plan that promises more tests than were reported adds an errored
/// `(tap plan)` outcome.
pub fn parse_tap(text: &str) -> Option<Vec<TestOutcome>> {
    let mut out = Vec::new();
    let mut plan: Option<usize> = None;
    let mut points = 0usize;
    let mut bailed = false;
    // The diagnostics under the last failing point (its indented YAML block, `#` lines).
    let mut said: Option<(usize, String)> = None;
    for line in text.lines() {
        let line = line.trim_end();
        if line.starts_with(char::is_whitespace) || line.starts_with('#') {
            if let Some((_, text)) = &mut said {
                text.push_str(line);
                text.push('\n');
            }
            continue;
        }
        flush_said(&mut out, &mut said);
        if let Some(rest) = line.strip_prefix("1..") {
            let n: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            if let Ok(n) = n.parse() {
                plan = Some(n);
            }
            continue;
        }
        if line.starts_with("Bail out!") {
            bailed = true;
            continue;
        }
        let (ok, rest) = if let Some(r) = line.strip_prefix("not ok") {
            (false, r)
        } else if let Some(r) = line.strip_prefix("ok") {
            (true, r)
        } else {
            continue;
        };
        if !(rest.is_empty() || rest.starts_with(' ')) {
            continue; // "okay", "nothing"
        }
        points += 1;
        let rest = rest.trim_start();
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        // TAP: a test point without a number is numbered by its position.
        let number = digits.parse::<usize>().ok().unwrap_or(points);
        let rest = rest[digits.len()..].trim_start();
        let rest = rest.strip_prefix("- ").unwrap_or(rest);
        let (desc, directive) = match rest
            .find(" # ")
            .or_else(|| rest.strip_prefix("# ").map(|_| 0))
        {
            Some(i) => (&rest[..i], rest[i..].trim_start_matches([' ', '#']).trim()),
            None => (rest, ""),
        };
        let upper = directive.to_ascii_uppercase();
        let status = if upper.starts_with("SKIP") {
            TestStatus::Skipped
        } else if upper.starts_with("TODO") {
            if ok {
                TestStatus::Passed
            } else {
                TestStatus::Skipped
            }
        } else if ok {
            TestStatus::Passed
        } else {
            TestStatus::Failed
        };
        let desc = desc.trim();
        let name = if desc.is_empty() {
            format!("test {number}")
        } else {
            desc.to_string()
        };
        if status == TestStatus::Failed {
            said = Some((out.len(), String::new()));
        }
        out.push(TestOutcome::new(name, status));
    }
    flush_said(&mut out, &mut said);
    if plan.is_none() && points == 0 && !bailed {
        return None;
    }
    if bailed {
        out.push(TestOutcome::new("(bail out)", TestStatus::Errored));
    }
    if let Some(n) = plan
        && points < n
    {
        out.push(TestOutcome::new("(tap plan)", TestStatus::Errored));
    }
    Some(out)
}

/// Gives the failing point its diagnostics, if it had any.
fn flush_said(out: &mut [TestOutcome], said: &mut Option<(usize, String)>) {
    if let Some((i, text)) = said.take()
        && let Some(o) = out.get_mut(i)
    {
        *o = o.clone().with_message(&text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::outcomes_text;

    #[test]
    fn points_directives_and_plans() {
        assert_eq!(
            parse_tap("compiling...\nall good\n"),
            None,
            "no TAP, no outcomes"
        );
        let tap = "TAP version 13\n1..5\nok 1 - adds\nnot ok 2 - subtracts\n  ok 1 - inner\nok 3 # SKIP no db\nnot ok 4 - later # TODO not yet\nok 5\n";
        let got = parse_tap(tap).expect("tap");
        assert_eq!(
            outcomes_text(&got),
            "adds passed, subtracts failed, test 3 skipped, later skipped, test 5 passed"
        );
        let short = parse_tap("1..3\nok 1 - a\n").expect("tap");
        assert_eq!(short.last().map(|o| o.status), Some(TestStatus::Errored));
        assert_eq!(got[1].message.as_deref(), Some("ok 1 - inner"));
        let yaml = "1..2\nnot ok 1 - places an order\n  ---\n  message: expected 3, got 2\n  at: test/orders.js:7:3\n  ...\n# a note\nok 2 - lists\n# tests 2\n";
        let got = parse_tap(yaml).expect("tap");
        let said = got[0].message.as_deref().expect("diagnostics");
        assert!(
            said.contains("expected 3, got 2") && said.contains("test/orders.js:7:3"),
            "{said}"
        );
        assert_eq!(got[1].message, None, "a passing point keeps no diagnostics");
        let bail = parse_tap("1..2\nok 1 - a\nBail out! db gone\n").expect("tap");
        assert!(bail.iter().any(|o| o.name == "(bail out)"));
    }
}
