//! The server's own HTML: the banner on the live report, the approval panel with its form, and
//! the short pages for refusals and a run that is still starting. The report itself is
//! [`crate::report::render`]'s.

use consort_actors::{GateKind, GateRequest};

use crate::report::escape;

/// Where on the report what a gate approves is shown.
fn evidence_anchor(gate: GateKind) -> (&'static str, &'static str) {
    match gate {
        GateKind::Design => (
            "#design",
            "the design below: stories, spec, migrations and tests",
        ),
        GateKind::Deploy => (
            "#release",
            "the release evidence below: every test's receipts",
        ),
        GateKind::Promote => (
            "#changes",
            "the migrations below, to be applied to the parent",
        ),
    }
}

const PANEL_STYLE: &str = "<style>.gatepanel{background:#fff8e1;border:2px solid #b9770e;border-radius:.4rem;padding:1rem;margin-bottom:1rem}\
.gatepanel label{display:block;margin:.4rem 0}.gatepanel input[type=text],.gatepanel textarea{width:100%;max-width:40rem;font:inherit;padding:.3rem}\
.gatepanel button{font:inherit;padding:.4rem 1rem;margin-right:.6rem}.notice{background:#e3ecfa;border:1px solid #2457a6;border-radius:.4rem;padding:.6rem;margin-bottom:1rem}</style>";

/// The banner on the live report: what waits, with a link to decide it.
pub(super) fn report_banner(pending: Option<&GateRequest>, notice: Option<&str>) -> String {
    let mut out = String::from(PANEL_STYLE);
    if let Some(n) = notice {
        out.push_str(&format!(
            "<div class=\"notice\" id=\"notice\">{}</div>",
            escape(n)
        ));
    }
    if let Some(r) = pending {
        out.push_str(&format!(
            "<div class=\"gatepanel\" id=\"waiting\"><strong>The {gate} gate waits for a decision.</strong> \
             {summary} <a href=\"/approve\" id=\"decide-link\">Review and decide</a></div>",
            gate = r.gate,
            summary = escape(&r.summary),
        ));
    }
    out
}

/// The approval panel: the gate, its hash and what it approves, and the form bound to that
/// hash and to the session's token.
pub(super) fn approval_panel(pending: Option<&GateRequest>, token: &str) -> String {
    let Some(r) = pending else {
        return format!(
            "{PANEL_STYLE}<div class=\"gatepanel\" id=\"nothing-waits\"><strong>No gate waits for a decision now.</strong> \
             <a href=\"/\">Back to the live report</a></div>"
        );
    };
    let (anchor, what) = evidence_anchor(r.gate);
    format!(
        "{PANEL_STYLE}<div class=\"gatepanel\" id=\"gate\">\
<h2>The {gate} gate</h2>\
<p>{summary}</p>\
<p>Deciding for exactly this hash: <code class=\"hash\" id=\"gate-hash\">{hash}</code></p>\
<p>What it approves: <a href=\"{anchor}\">{what}</a>.</p>\
<form method=\"post\" action=\"/decide\" id=\"decide\">\
<input type=\"hidden\" name=\"token\" value=\"{token}\">\
<input type=\"hidden\" name=\"gate\" value=\"{gate}\">\
<input type=\"hidden\" name=\"hash\" value=\"{hash}\">\
<label>Your name <input type=\"text\" name=\"name\" id=\"name\" required maxlength=\"100\"></label>\
<label>A note (a rejection needs one) <textarea name=\"note\" id=\"note\" rows=\"2\" maxlength=\"2000\"></textarea></label>\
<button type=\"submit\" name=\"decision\" value=\"approve\" id=\"approve\">Approve</button>\
<button type=\"submit\" name=\"decision\" value=\"reject\" id=\"reject\">Reject</button>\
</form></div>",
        gate = r.gate,
        summary = escape(&r.summary),
        hash = r.hash,
        token = escape(token),
    )
}

/// A short page of its own: a refusal, or a run that has not written its ledger yet.
pub(super) fn plain_page(title: &str, message: &str, refresh: bool) -> String {
    let meta = if refresh {
        "<meta http-equiv=\"refresh\" content=\"1\">"
    } else {
        ""
    };
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">{meta}<title>{t}</title></head>\
<body style=\"font-family:system-ui,sans-serif;max-width:50rem;margin:2rem auto\"><h1>{t}</h1><p id=\"message\">{m}</p>\
<p><a href=\"/\">The live report</a> · <a href=\"/approve\">The approval page</a></p></body></html>\n",
        t = escape(title),
        m = escape(message),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use consort_actors::ContentHash;

    #[test]
    fn the_form_is_bound_to_the_hash_and_the_token_and_untrusted_text_is_escaped() {
        let r = GateRequest {
            gate: GateKind::Design,
            hash: ContentHash::of_bytes(b"x"),
            summary: "<script>alert(1)</script>".into(),
        };
        let panel = approval_panel(Some(&r), "t0ken");
        assert!(panel.contains(&format!("name=\"hash\" value=\"{}\"", r.hash)));
        assert!(panel.contains("name=\"token\" value=\"t0ken\""));
        assert!(!panel.contains("<script>"));
        assert!(!report_banner(Some(&r), Some("<b>")).contains("<script>"));
        assert!(!report_banner(None, Some("<b>x</b>")).contains("<b>x"));
        assert!(approval_panel(None, "t").contains("No gate waits"));
    }
}
