//! The report's sections besides the build lane and the lifecycle: the feature, its stories,
//! the design and its approvals, the release, what changed and what it cost.

use std::fmt::Write as _;

use consort_actors::{GateDecision, HumanDecision, Phase, RunStatus};

use super::html::{code_list, escape, fill, millis, pre_block, time};
use super::model::{Decision, Model};

/// The title, the feature, where the run stands.
pub(super) fn header(model: &Model, title: &str) -> String {
    let phase = model.state.phase();
    let mut out = format!(
        "<header id=\"summary\"><h1>{}</h1><p class=\"meta\">feature <code>{}</code> · phase <span class=\"badge {}\" id=\"phase\">{}</span> · {} ledger entries",
        escape(title),
        escape(&model.feature_id),
        phase.as_str(),
        phase.as_str(),
        model.entries
    );
    if let Some((first, last)) = &model.span {
        let _ = write!(out, " · from {} to {}", time(first), time(last));
    }
    out.push_str("</p>");
    if let RunStatus::Halted { escalation, .. } = &model.state.status {
        let _ = write!(
            out,
            "<p class=\"note\">halted at {}: {}</p>",
            escape(&escalation.step),
            escape(&escalation.detail)
        );
    }
    out.push_str(&baseline(model));
    out.push_str("</header>");
    out
}

/// What the baseline found before any agent acted, and what people quarantined.
fn baseline(model: &Model) -> String {
    let mut out = String::new();
    if let Some(b) = &model.state.baseline {
        let _ = write!(
            out,
            "<p id=\"baseline\">baseline (req-{}): {}</p>",
            b.request.0,
            if b.failing.is_empty() {
                "every test of the project passed before the feature".to_string()
            } else {
                format!(
                    "{} failed before the feature, no agent charged: <code>{}</code>",
                    b.failing.len(),
                    code_list(&b.failing)
                )
            }
        );
    }
    for q in model.state.quarantines() {
        let _ = write!(
            out,
            "<p class=\"note quarantined\">quarantined: <code>{}</code> by {}: {} (its failures judge nothing)</p>",
            escape(&q.test),
            escape(&q.by),
            escape(&q.reason)
        );
    }
    out
}

/// The project's lanes, when it has any: each one's phase and step, the gate it waits at
/// with the hash a person approves, what it spent and its last receipt.
pub(super) fn lanes(model: &Model) -> String {
    if model.lanes.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "<section id=\"lanes\"><h2>Lanes</h2><table><tr><th>feature</th><th>phase</th><th>step</th><th>waits for</th><th>tokens</th><th>last receipt</th></tr>",
    );
    for lane in &model.lanes {
        let waits = match (&lane.pending_gate, &lane.halted) {
            (Some(g), _) => format!("a person at the {} gate ({})", g.gate, g.hash),
            (None, Some(h)) => format!("a person: halted ({}): {}", h.reason, h.detail),
            (None, None) => "its agents and runs".into(),
        };
        let receipt = lane.last_receipt.as_ref().map_or_else(String::new, |r| {
            format!(
                "req-{}: {} passed, {} not passed",
                r.request, r.passed, r.failed
            )
        });
        out.push_str(&fill(
            "<tr data-lane=\"{}\"><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            &[
                &lane.feature,
                &lane.feature,
                lane.phase.as_str(),
                lane.step.as_deref().unwrap_or("—"),
                &waits,
                &lane.usage.tokens().to_string(),
                &receipt,
            ],
        ));
    }
    out.push_str("</table></section>");
    out
}

/// The feature request as it was given.
pub(super) fn request(model: &Model) -> String {
    let Some(feature) = &model.state.feature else {
        return String::new();
    };
    format!(
        "<section id=\"request\"><h2>Request</h2>{}</section>",
        pre_block("the whole request", &feature.body)
    )
}

/// The stories and their acceptance criteria.
pub(super) fn stories(model: &Model) -> String {
    let Some(stories) = &model.state.stories else {
        return "<section id=\"stories\"><h2>Stories</h2><p class=\"meta\">not written yet</p></section>".into();
    };
    let mut out = String::from("<section id=\"stories\"><h2>Stories</h2>");
    for story in &stories.stories {
        out.push_str(&fill(
            "<div class=\"card story\" data-story=\"{}\"><h3>{} {}</h3><p>As {}, I want {}, so that {}.",
            &[&story.id, &story.id, &story.title, &story.as_a, &story.i_want, &story.so_that],
        ));
        if story.user_facing {
            out.push_str(" <span class=\"badge\">user-facing</span>");
        }
        out.push_str("</p><ul class=\"criteria\">");
        out.extend(story.acceptance_criteria.iter().map(|ac| {
            fill(
                "<li data-ac=\"{}\"><code>{}</code> <b>given</b> {} <b>when</b> {} <b>then</b> {}</li>",
                &[&ac.id, &ac.id, &ac.given, &ac.when, &ac.then],
            )
        }));
        out.push_str("</ul></div>");
    }
    out.push_str("</section>");
    out
}

/// The design's hash, its migrations and its test list.
pub(super) fn design(model: &Model) -> String {
    let s = &model.state;
    let mut out = String::from("<section id=\"design\"><h2>Design</h2>");
    match (&s.frozen, s.design_bundle()) {
        (Some(frozen), _) => {
            let _ = write!(
                out,
                "<p>frozen design <span class=\"hash\" id=\"design-hash\">{}</span></p>",
                escape(&frozen.hash.to_string())
            );
        }
        (None, Some(bundle)) => {
            let _ = write!(
                out,
                "<p>design awaiting approval: <span class=\"hash\" id=\"design-hash\">{}</span></p>",
                escape(&bundle.hash().to_string())
            );
        }
        (None, None) => out.push_str("<p class=\"meta\">the design is not complete yet</p>"),
    }
    if let Some(plan) = &s.schema {
        out.push_str("<h3>Migrations</h3>");
        for m in &plan.migrations {
            out.push_str(&fill(
                "<div class=\"card migration\"><b>{}</b> (story {}): {}",
                &[&m.version, &m.story_id, &m.description],
            ));
            out.push_str(&pre_block("the SQL", &m.sql));
            out.push_str("</div>");
        }
    }
    if let Some(list) = &s.test_list {
        out.push_str("<h3>Test list</h3><table id=\"test-list\"><tr><th>test</th><th>criterion</th><th>what it checks</th><th>path</th></tr>");
        for e in &list.entries {
            out.push_str(&fill(
                "<tr data-test=\"{}\"><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td><code>{}</code></td></tr>",
                &[&e.id, &e.id, &e.ac_id, &e.description, &e.path],
            ));
        }
        out.push_str("</table>");
    }
    out.push_str("</section>");
    out
}

/// Who approved or rejected which gate, when, and every retry or stop.
pub(super) fn approvals(model: &Model) -> String {
    let mut out = String::from(
        "<section id=\"approvals\"><h2>Approvals</h2><table><tr><th>when</th><th>gate</th><th>decision</th><th>by</th><th>hash</th><th>note</th></tr>",
    );
    for d in &model.decisions {
        let row = match d {
            Decision::Gate(a) => {
                let (decision, note) = match &a.decision {
                    GateDecision::Approve => ("approved", a.note.clone()),
                    GateDecision::Reject { reason } => ("rejected", reason.clone()),
                };
                format!(
                    "<tr class=\"approval {decision}\" data-gate=\"{}\"><td>{}</td><td>{}</td><td>{decision}</td><td>{}</td><td class=\"hash\">{}</td><td>{}</td></tr>",
                    a.gate,
                    time(&a.at),
                    a.gate,
                    escape(&a.approver),
                    a.hash.short(),
                    escape(&note)
                )
            }
            Decision::Human { decision, by, at } => {
                let what = match decision {
                    HumanDecision::Retry => "retry",
                    HumanDecision::Stop => "stop",
                };
                format!(
                    "<tr class=\"human\"><td>{}</td><td>(run)</td><td>{what}</td><td>{}</td><td></td><td></td></tr>",
                    time(at),
                    escape(by)
                )
            }
            Decision::Harness { change, at } => format!(
                "<tr class=\"harness\"><td>{}</td><td>(harness)</td><td>changed consort.toml</td><td>{}</td><td class=\"hash\">{}</td><td>{}</td></tr>",
                time(at),
                escape(&change.by),
                change.to.hash().short(),
                escape(&change.summary())
            ),
        };
        out.push_str(&row);
    }
    if model.decisions.is_empty() {
        out.push_str("<tr><td colspan=\"6\" class=\"meta\">no decision yet</td></tr>");
    }
    out.push_str("</table></section>");
    out
}

/// The full-suite run and the promotion.
pub(super) fn release(model: &Model) -> String {
    let mut out = String::from("<section id=\"release\"><h2>Release</h2>");
    match &model.deploy {
        Some((at, r)) => {
            out.push_str("<div class=\"card\"><h3>Full-suite deploy run</h3>");
            out.push_str(&super::timeline::receipt_html(
                at,
                r,
                &model.state.quarantined_names(),
            ));
            out.push_str("</div>");
        }
        None => out.push_str("<p class=\"meta\">no deploy run yet</p>"),
    }
    if let Some(p) = &model.state.promotion {
        let _ = write!(
            out,
            "<p>promoted to <code>{}</code>: {}; verified: {}</p>",
            escape(&p.target),
            escape(&p.applied_text()),
            if p.verified { "yes" } else { "no" }
        );
        if let (Some(check), Some(at)) = (&p.merge_check, &model.promoted_at) {
            let _ = write!(
                out,
                "<div class=\"card merge-check\"><h3>Merge check: merged with {}</h3>",
                escape(&check.merged_with.join(", "))
            );
            out.push_str(&super::timeline::receipt_html(
                at,
                &check.receipt,
                &model.state.quarantined_names(),
            ));
            out.push_str("</div>");
        }
    } else if model.state.phase() != Phase::Done {
        out.push_str("<p class=\"meta\">not promoted yet</p>");
    }
    out.push_str("</section>");
    out
}

/// The files, migration files and commits the feature changed.
pub(super) fn changes(model: &Model) -> String {
    let mut out = String::from(
        "<section id=\"changes\"><h2>What changed</h2><h3>Files</h3><ul id=\"files\">",
    );
    out.extend(
        model
            .files
            .iter()
            .map(|f| fill("<li><code>{}</code></li>", &[f])),
    );
    out.push_str("</ul>");
    if !model.migrations.is_empty() {
        out.push_str("<h3>Migration files</h3><ul id=\"migration-files\">");
        for (path, version, description) in &model.migrations {
            out.push_str(&fill(
                "<li><code>{}</code>: {} {}</li>",
                &[path, version, description],
            ));
        }
        out.push_str("</ul>");
    }
    out.push_str(&commits(model));
    out.push_str("</section>");
    out
}

fn commits(model: &Model) -> String {
    let mut out = String::from("<h3>Commits</h3>");
    if let Some(g) = &model.git {
        let _ = write!(
            out,
            "<p>branch <code>{}</code> at <code>{}</code></p>",
            escape(&g.branch),
            escape(g.head.as_deref().unwrap_or("no commit yet"))
        );
    }
    if model.git.is_none() {
        out.push_str("<p class=\"meta\">the project is not in a git repository: these are the commits its ledger calls for</p>");
    }
    out.push_str("<table id=\"commits\"><tr><th>commit</th><th>kind</th><th>step</th><th>by</th><th>what</th></tr>");
    for c in &model.commits {
        let id = model.commit_ids.get(&c.key()).map_or(
            if model.git.is_some() {
                "not in git"
            } else {
                "—"
            },
            |sha| sha.get(..12).unwrap_or(sha),
        );
        let _ = write!(
            out,
            "<tr><td><code>{}</code></td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            escape(id),
            c.kind.label(),
            escape(&c.step),
            c.role,
            escape(&c.summaries.join("; "))
        );
    }
    out.push_str("</table>");
    out
}

/// Tokens, calls and time per role, as `consort status` counts them.
pub(super) fn usage(model: &Model) -> String {
    let mut out = String::from(
        "<section id=\"usage\"><h2>Usage</h2><table><tr><th>role</th><th>steps</th><th>calls</th><th>tool calls</th><th>prompt tokens</th><th>cached</th><th>completion tokens</th><th>agent time</th></tr>",
    );
    let row = |name: &str, t: &consort_actors::Tally| {
        format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(name),
            t.steps,
            t.calls,
            t.tool_calls,
            t.prompt_tokens,
            t.cached_tokens,
            t.completion_tokens,
            millis(t.wall_ms)
        )
    };
    for (role, u) in &model.usage.roles {
        out.push_str(&row(role.as_str(), &u.total));
    }
    out.push_str(&row("total", &model.usage.run()));
    out.push_str("</table>");
    for line in crate::ui::usage_lines(&model.usage) {
        let _ = write!(out, "<p class=\"meta\">{}</p>", escape(&line));
    }
    out.push_str("</section>");
    out
}
