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
    for line in text.lines() {
        let line = line.trim_end();
        if line.starts_with(char::is_whitespace) {
            continue;
        }
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
        out.push(TestOutcome { name, status });
    }
    if plan.is_none() && points == 0 && !bailed {
        return None;
    }
    if bailed {
        out.push(TestOutcome {
            name: "(bail out)".into(),
            status: TestStatus::Errored,
        });
    }
    if let Some(n) = plan
        && points < n
    {
        out.push(TestOutcome {
            name: "(tap plan)".into(),
            status: TestStatus::Errored,
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_directives_and_plans() {
        let tap = "TAP version 13\n1..5\nok 1 - adds\nnot ok 2 - subtracts\n  ok 1 - inner\nok 3 # SKIP no db\nnot ok 4 - later # TODO not yet\nok 5\n";
        let got = parse_tap(tap).expect("tap");
        let pairs: Vec<(&str, TestStatus)> =
            got.iter().map(|o| (o.name.as_str(), o.status)).collect();
        assert_eq!(
            pairs,
            vec![
                ("adds", TestStatus::Passed),
                ("subtracts", TestStatus::Failed),
                ("test 3", TestStatus::Skipped),
                ("later", TestStatus::Skipped),
                ("test 5", TestStatus::Passed),
            ]
        );
        assert_eq!(parse_tap("compiling...\nall good\n"), None);
        let short = parse_tap("1..3\nok 1 - a\n").expect("tap");
        assert_eq!(short.last().map(|o| o.status), Some(TestStatus::Errored));
        let bail = parse_tap("1..2\nok 1 - a\nBail out! db gone\n").expect("tap");
        assert!(bail.iter().any(|o| o.name == "(bail out)"));
    }
}
