//! Small pieces of text for people, shared by every crate that prints.

use std::time::Duration;

/// A duration for people: `250 ms`, `3 s`, `2.5 s`.
pub fn duration_text(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// A run's length in whole seconds, as a time limit is said: `600 s` (milliseconds rounded).
pub(crate) fn whole_seconds(ms: u64) -> String {
    format!("{} s", ms.saturating_add(500) / 1000)
}

/// `n` and the noun that counts it: `1 call`, `2 calls`, `0 calls` (`plural` for nouns that
/// do not take an `s`).
pub fn counted(n: impl Into<u64>, singular: &str, plural: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { singular } else { plural })
}

/// The first `shown` of `items` joined by `, `, then how many more there are:
/// `a, b and 3 more`.
pub fn first_and_more<S: AsRef<str>>(items: &[S], shown: usize) -> String {
    let mut text = items
        .iter()
        .take(shown)
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > shown {
        text.push_str(&format!(" and {} more", items.len() - shown));
    }
    text
}

/// `value`'s text, or `none` when there is none.
pub(crate) fn or_none<T: std::fmt::Display>(value: &Option<T>) -> String {
    value.as_ref().map_or_else(|| "none".into(), T::to_string)
}

/// `text` when it has at most `max` characters; else its first and last `max / 2`, with the
/// number left out between them.
pub(crate) fn head_and_tail(text: &str, max: usize) -> String {
    let total = text.chars().count();
    if total <= max {
        return text.to_string();
    }
    let half = max / 2;
    let head: String = text.chars().take(half).collect();
    let tail: String = text.chars().skip(total - half).collect();
    format!(
        "{head}\n[… {} characters left out …]\n{tail}",
        total - 2 * half
    )
}

/// `text` when it has at most `max` characters; else its last `max`, with the number left out
/// before them: where a run that was stopped printed its last words.
pub(crate) fn tail(text: &str, max: usize) -> String {
    let total = text.chars().count();
    if total <= max {
        return text.to_string();
    }
    let tail: String = text.chars().skip(total - max).collect();
    format!("[… {} characters left out …]\n{tail}", total - max)
}

/// An error and its causes on one line, joined by `: `: what a person reads where only one
/// line is kept (a terminal's error line, an infrastructure failure's detail, a log line).
/// Every error of the workspace either returns its cause from `source()` or says it in its
/// own text, never both, so each cause appears once.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("handshake failed")]
    struct Middle(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("connection refused")]
    struct Inner;

    #[derive(Debug, thiserror::Error)]
    #[error(transparent)]
    struct Forwarding(#[from] Outer);

    #[test]
    fn each_cause_appears_once_in_order() {
        assert_eq!(
            error_chain(&Outer(Middle(Inner))),
            "cannot connect: handshake failed: connection refused"
        );
        assert_eq!(error_chain(&Inner), "connection refused");
        // A transparent wrapper forwards its text and its source: nothing is said twice.
        assert_eq!(
            error_chain(&Forwarding(Outer(Middle(Inner)))),
            "cannot connect: handshake failed: connection refused"
        );
        // A cause's words are never dropped, even when the message already holds them.
        #[derive(Debug, thiserror::Error)]
        #[error("connection refused")]
        struct Echo(#[source] Inner);
        assert_eq!(
            error_chain(&Echo(Inner)),
            "connection refused: connection refused"
        );
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(duration_text(Duration::from_millis(250)), "250 ms");
        assert_eq!(duration_text(Duration::from_secs(3)), "3 s");
        assert_eq!(duration_text(Duration::from_millis(2500)), "2.5 s");
        assert_eq!(counted(1u32, "call", "calls"), "1 call");
        assert_eq!(counted(0u32, "call", "calls"), "0 calls");
        assert_eq!(or_none(&None::<u32>), "none");
        assert_eq!(or_none(&Some(7)), "7");
    }

    #[test]
    fn a_long_list_says_how_many_more() {
        assert_eq!(first_and_more(&["a", "b"], 2), "a, b");
        assert_eq!(first_and_more(&["a", "b", "c", "d"], 2), "a, b and 2 more");
        assert_eq!(first_and_more::<&str>(&[], 2), "");
    }
}
