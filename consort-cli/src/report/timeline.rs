//! The build lane as a timeline: per test-list entry, RED → GREEN (and its repairs) →
//! REFACTOR → REVIEW, each step with its author and the receipt of the run that judged it.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use consort_actors::{Step, TestRunReceipt, TestStatus};

use super::html::{code_list, escape, fill, millis, time};
use super::model::{Model, StepRecord};

/// The build lane section.
pub(super) fn build_lane(model: &Model) -> String {
    let mut out = String::from("<section id=\"timeline\"><h2>Build lane</h2>");
    let Some(list) = &model.state.test_list else {
        out.push_str("<p class=\"meta\">no test list yet</p></section>");
        return out;
    };
    let quarantined = model.state.quarantined_names();
    for entry in &list.entries {
        out.push_str(&fill(
            "<div class=\"card test\" data-test=\"{}\"><h3><code>{}</code> {}</h3><p class=\"meta\">criterion <code>{}</code> · <code>{}</code></p><div class=\"lane\">",
            &[&entry.id, &entry.id, &entry.description, &entry.ac_id, &entry.path],
        ));
        let mut any = false;
        for (i, record) in model.steps_of(&entry.id).enumerate() {
            if i > 0 {
                out.push_str("<span class=\"arrow\" aria-hidden=\"true\">→</span>");
            }
            out.push_str(&step_html(record, &quarantined));
            any = true;
        }
        if !any {
            out.push_str("<p class=\"meta\">not started</p>");
        }
        out.push_str("</div></div>");
    }
    out.push_str("</section>");
    out
}

/// `(css class, label)` of a build step.
fn kind_of(step: &Step) -> (&'static str, String) {
    match step {
        Step::Red { .. } => ("red", "RED".into()),
        Step::Green { .. } => ("green", "GREEN".into()),
        Step::Repair { round, .. } => ("repair", format!("GREEN repair {round}")),
        Step::Refactor { round, .. } => ("refactor", refactor_label("REFACTOR", *round)),
        Step::Review { round, .. } => ("review", refactor_label("REVIEW", *round)),
        _ => ("design", step.to_string()),
    }
}

fn refactor_label(name: &str, round: u32) -> String {
    if round == 0 {
        name.into()
    } else {
        format!("{name} round {}", round + 1)
    }
}

fn step_html(r: &StepRecord, quarantined: &[String]) -> String {
    let (class, label) = kind_of(&r.step);
    let mut out = format!(
        "<div class=\"step {class}\" data-kind=\"{class}\" data-step=\"{}\"><div class=\"kind\">{}</div>",
        escape(&r.step.to_string()),
        escape(&label)
    );
    match (&r.author, &r.at) {
        (Some(a), Some(at)) => {
            let _ = write!(
                out,
                "<div class=\"meta\">by <span class=\"author\">{}</span> at {}</div>",
                escape(&a.to_string()),
                time(at)
            );
        }
        _ => out.push_str("<div class=\"meta\">no answer accepted yet</div>"),
    }
    if !r.summary.is_empty() {
        let _ = write!(out, "<div>{}</div>", escape(&r.summary));
    }
    if !r.files.is_empty() {
        let _ = write!(
            out,
            "<div class=\"meta\">writes <code>{}</code></div>",
            code_list(&r.files)
        );
    }
    if r.usage.tokens() > 0 || r.usage.wall_ms > 0 {
        let _ = write!(
            out,
            "<div class=\"meta\">{}</div>",
            escape(&crate::ui::usage_text(&r.usage))
        );
    }
    for note in &r.notes {
        let _ = write!(out, "<div class=\"note\">{}</div>", escape(note));
    }
    if let Some((at, receipt)) = &r.receipt {
        out.push_str(&receipt_html(at, receipt, quarantined));
    }
    out.push_str("</div>");
    out
}

/// A receipt: the branch, the counts, the durations, and the output when something failed (a
/// test among `quarantined` said to judge nothing).
pub(super) fn receipt_html(
    at: &DateTime<Utc>,
    r: &TestRunReceipt,
    quarantined: &[String],
) -> String {
    let passed = r
        .outcomes
        .iter()
        .filter(|o| o.status == TestStatus::Passed)
        .count();
    let failed = r.outcomes.len() - passed;
    let mut out = format!(
        "<div class=\"receipt\" data-passed=\"{passed}\" data-failed=\"{failed}\"><div>{} on branch <code class=\"branch\">{}</code> ({})</div><div><span class=\"pass\">{passed} passed</span>, <span class=\"{}\">{failed} not passed</span> · {}</div><div class=\"meta\">branch {} · migrations {} · tests {} · at {}</div>",
        escape(&r.request_id.to_string()),
        escape(&r.branch_id),
        escape(&r.provider),
        if failed > 0 { "fail" } else { "meta" },
        escape(&r.exit.to_string()),
        millis(r.timings.acquire_ms),
        millis(r.timings.migrate_ms),
        millis(r.timings.run_ms),
        time(at)
    );
    let not_passed: Vec<String> = r
        .outcomes
        .iter()
        .filter(|o| o.status != TestStatus::Passed)
        .map(|o| {
            let why = if quarantined.contains(&o.name) {
                " (quarantined: judges nothing)"
            } else {
                ""
            };
            format!("<code>{}</code>{why}", escape(&o.name))
        })
        .collect();
    let _ = write!(
        out,
        "<div class=\"covered\">covered {}</div>",
        escape(&consort::project::coverage(r))
    );
    out.push_str(&confinement_html(r.confinement));
    out.push_str(&shards_html(r));
    if !r.flaky.is_empty() {
        let _ = write!(
            out,
            "<div>flaky: <code>{}</code> (failed on a first run, passed on this fresh branch)</div>",
            code_list(&r.flaky)
        );
    }
    if !not_passed.is_empty() {
        let _ = write!(
            out,
            "<div>not passed: {}</div><details class=\"excerpt\"><summary>the failing output</summary><pre>{}</pre></details>",
            not_passed.join(", "),
            escape(&r.output_excerpt)
        );
    }
    out.push_str("</div>");
    out
}

/// The shards of a split run, one row each: its branch, files, outcomes, how it ended and its
/// time, and the command it ran.
fn shards_html(r: &TestRunReceipt) -> String {
    if r.shards.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<details class=\"shards\"><summary>the shards</summary><table><tr><th>branch</th><th>files</th><th>tests</th><th>ended</th><th>run</th><th>command</th></tr>",
    );
    for s in &r.shards {
        let ended = match &s.exit {
            Some(exit) => exit.to_string(),
            None => "stopped: another shard's failure settled the verdict".into(),
        };
        let files: Vec<String> = s.files.iter().map(|f| escape(f)).collect();
        let _ = write!(
            out,
            "<tr class=\"shard\"><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            escape(&s.branch_id),
            files.join("<br>"),
            s.outcomes,
            escape(&ended),
            millis(s.run_ms),
            escape(&s.command)
        );
    }
    out.push_str("</table></details>");
    out
}

/// How the receipt's run was confined; an unconfined run stands out.
fn confinement_html(c: consort_actors::Confinement) -> String {
    let class = if c.is_confined() { "meta" } else { "fail" };
    format!(
        "<div class=\"{class} confinement\">confinement: {}</div>",
        escape(&c.to_string())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use consort_actors::{ExitRecord, ShardRun};
    use consort_testkit::verify::assert_contains;

    #[test]
    fn a_split_receipt_shows_each_shard_and_a_stopped_one_says_so() {
        let shard = |branch: &str, exit: Option<ExitRecord>| ShardRun {
            branch_id: branch.into(),
            command: "pytest -- 'tests/<a>.py'".into(),
            files: vec!["tests/<a>.py".into()],
            outcomes: 2,
            exit,
            run_ms: 1500,
        };
        let mut r = consort_testkit::artifacts::receipt_with(
            consort_actors::RequestId(1),
            consort_actors::ContentHash::of_bytes(b"tree"),
            &[("tests.a::t", TestStatus::Failed)],
            1,
            "",
        );
        r.shards = vec![
            shard(
                "consort-1",
                Some(ExitRecord {
                    code: Some(1),
                    signal: None,
                    timed_out: false,
                }),
            ),
            shard("consort-2", None),
        ];
        let html = receipt_html(&Utc::now(), &r, &[]);
        assert_eq!(html.matches("<tr class=\"shard\">").count(), 2, "{html}");
        assert_contains(&html, "stopped: another shard");
        assert!(html.contains("tests/&lt;a&gt;.py"), "escaped: {html}");
        assert_contains(&html, "covered the suite split over 2 branches, 1 stopped");
        assert_contains(&html, "not passed: <code>tests.a::t</code></div>");
        let set_aside = receipt_html(&Utc::now(), &r, &["tests.a::t".to_string()]);
        assert!(
            set_aside.contains("not passed: <code>tests.a::t</code> (quarantined: judges nothing)"),
            "every receipt says which failure a quarantine sets aside: {set_aside}"
        );
        r.shards.clear();
        r.confinement = consort_actors::Confinement::Off;
        let whole = receipt_html(&Utc::now(), &r, &[]);
        assert!(
            whole.contains(
                "<div class=\"fail confinement\">confinement: off (sandbox = &quot;off&quot;)</div>"
            ),
            "an unconfined run stands out: {whole}"
        );
        assert!(!whole.contains("class=\"shards\"") && whole.contains("covered the whole suite"));
    }
}
