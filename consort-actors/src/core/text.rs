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

/// `n` and the noun that counts it: `1 call`, `2 calls`, `0 calls` (`plural` for nouns that
/// do not take an `s`).
pub fn counted(n: impl Into<u64>, singular: &str, plural: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { singular } else { plural })
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
