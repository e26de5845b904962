//! The page around the sections: escaping, the document shell and its inline style.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::RenderOptions;
use super::model::Model;

/// `text` made safe to place in HTML text or in a double- or single-quoted attribute: `&`,
/// `<`, `>`, `"` and `'` become character references, so nothing in it can open a tag, end
/// an attribute or start an entity.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `items`, each escaped, as the inside of one `<code>` list: `a</code>, <code>b` (the
/// caller writes the outer tags).
pub(super) fn code_list(items: &[String]) -> String {
    items
        .iter()
        .map(|item| escape(item))
        .collect::<Vec<_>>()
        .join("</code>, <code>")
}

/// `template` with each `{}` in it replaced, in turn, by the next of `fields`, escaped: one
/// row of untrusted text in one call. A `{}` with no field left stays as it is; a field with no
/// `{}` left is not written.
pub(super) fn fill(template: &str, fields: &[&str]) -> String {
    let mut holes = template.split("{}");
    let mut out = holes.next().unwrap_or_default().to_owned();
    let mut fields = fields.iter();
    for rest in holes {
        match fields.next() {
            Some(field) => out.push_str(&escape(field)),
            None => out.push_str("{}"),
        }
        out.push_str(rest);
    }
    out
}

/// A time as people read it, in UTC.
pub(super) fn time(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A duration in milliseconds as people read it: `840 ms`, `3.2 s`.
pub(super) fn millis(ms: u64) -> String {
    consort_actors::duration_text(std::time::Duration::from_millis(ms))
}

/// `<pre>` around escaped text, collapsed under `summary` when it is long.
pub(super) fn pre_block(summary: &str, text: &str) -> String {
    let body = format!("<pre>{}</pre>", escape(text));
    if text.lines().count() > 12 {
        format!(
            "<details><summary>{}</summary>{body}</details>",
            escape(summary)
        )
    } else {
        body
    }
}

/// The whole document.
pub(super) fn page(model: &Model, opts: &RenderOptions) -> String {
    let title = model
        .state
        .feature
        .as_ref()
        .map_or_else(|| model.feature_id.clone(), |f| f.title.clone());
    let mut out = String::new();
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    if let Some(secs) = opts.live_refresh_secs {
        let _ = writeln!(out, "<meta http-equiv=\"refresh\" content=\"{secs}\">");
    }
    let _ = writeln!(
        out,
        "<title>Consort report: {}</title>\n<style>{STYLE}</style>\n</head>\n<body>",
        escape(&title)
    );
    if let Some(banner) = &opts.banner_html {
        out.push_str(banner);
        out.push('\n');
    }
    for section in [
        super::sections::header(model, &title),
        super::sections::lanes(model),
        super::sections::request(model),
        super::sections::stories(model),
        super::sections::design(model),
        super::sections::approvals(model),
        super::timeline::build_lane(model),
        super::sections::release(model),
        super::sections::changes(model),
        super::sections::usage(model),
        super::lifecycle::diagram(model.state.phase()),
    ] {
        out.push_str(&section);
        out.push('\n');
    }
    out.push_str("<footer>Written by consort report from the feature's ledger; every hash and receipt here is the ledger's.</footer>\n</body>\n</html>\n");
    out
}

/// The page's style: no fonts, images or anything fetched.
const STYLE: &str = r#"
:root { --fg:#1d2330; --muted:#5b6475; --line:#d6dbe4; --bg:#f6f7fa; --card:#fff;
  --red:#c0392b; --green:#1e8449; --blue:#2457a6; --amber:#b9770e; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
  background: var(--bg); margin: 0 auto; max-width: 1200px; padding: 1.5rem; line-height: 1.45; }
h1 { margin: 0 0 .3rem; font-size: 1.6rem; }
h2 { margin: 2rem 0 .6rem; font-size: 1.2rem; border-bottom: 1px solid var(--line); padding-bottom: .3rem; }
h3 { margin: .2rem 0 .4rem; font-size: 1rem; }
section { margin-bottom: 1rem; }
.meta { color: var(--muted); font-size: .9rem; }
.badge { display: inline-block; padding: .1rem .5rem; border-radius: .8rem; font-size: .8rem;
  background: var(--line); font-weight: 600; }
.badge.done { background: #d4efdf; color: var(--green); }
.badge.halted, .badge.stopped { background: #f9d6d1; color: var(--red); }
code, pre, .hash { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: .85rem; }
pre { background: #eef0f5; padding: .6rem; overflow-x: auto; white-space: pre-wrap; margin: .3rem 0; }
table { border-collapse: collapse; width: 100%; background: var(--card); font-size: .9rem; }
th, td { border: 1px solid var(--line); padding: .3rem .5rem; text-align: left; vertical-align: top; }
th { background: #eceff5; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: .4rem; padding: .8rem; margin: .6rem 0; }
.criteria li { margin: .2rem 0; }
.lane { display: flex; flex-wrap: wrap; gap: .5rem; align-items: stretch; }
.step { flex: 1 1 200px; border: 1px solid var(--line); border-left: 5px solid var(--muted);
  border-radius: .3rem; padding: .5rem; background: #fbfcfe; font-size: .85rem; min-width: 200px; }
.step.red { border-left-color: var(--red); }
.step.green, .step.repair { border-left-color: var(--green); }
.step.refactor { border-left-color: var(--blue); }
.step.review { border-left-color: var(--amber); }
.step .kind { font-weight: 700; letter-spacing: .03em; }
.step .arrow { color: var(--muted); }
.receipt { margin-top: .3rem; border-top: 1px dashed var(--line); padding-top: .3rem; }
.pass { color: var(--green); font-weight: 600; }
.fail { color: var(--red); font-weight: 600; }
.note { color: var(--red); }
.lifecycle { display: flex; flex-wrap: wrap; align-items: center; gap: .2rem; }
.phase { border: 2px solid var(--line); border-radius: .4rem; padding: .4rem .6rem; background: var(--card);
  min-width: 7rem; text-align: center; }
.phase .loops { display: block; color: var(--muted); font-size: .7rem; max-width: 12rem; }
.phase.current { border-color: var(--blue); background: #e3ecfa; box-shadow: 0 0 0 3px #c3d5f3; font-weight: 700; }
.edge { color: var(--muted); font-size: .75rem; text-align: center; max-width: 8rem; }
.edge::after { content: " \2192"; font-size: 1rem; }
footer { margin-top: 2rem; color: var(--muted); font-size: .8rem; }
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_leaves_no_markup_of_untrusted_text() {
        let hostile = r#"<script>alert("x")</script><img src=x onerror='y'>&amp;"#;
        let safe = escape(hostile);
        assert_eq!(
            safe,
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img src=x onerror=&#39;y&#39;&gt;&amp;amp;"
        );
        for bad in ['<', '>', '"', '\''] {
            assert!(!safe.contains(bad), "{bad} survives");
        }
        assert_eq!(escape("plain text, ünïcode"), "plain text, ünïcode");
    }

    #[test]
    fn fill_escapes_each_field_into_its_hole_in_turn() {
        assert_eq!(
            fill("<b>{}</b> {}", &["<i>", "a&b"]),
            "<b>&lt;i&gt;</b> a&amp;b"
        );
        assert_eq!(fill("{} and {}", &["one"]), "one and {}");
        assert_eq!(fill("{}", &["one", "two"]), "one");
        assert_eq!(fill("no holes", &[]), "no holes");
    }
}
