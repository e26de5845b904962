//! RFC 3339 timestamps as the service writes them (`2026-11-29T12:00:00.123Z`), through
//! `chrono`.

use std::time::SystemTime;

use chrono::{DateTime, SecondsFormat, Utc};

/// Parses an RFC 3339 timestamp (`Z` or `±hh:mm` offset, optional fraction); `None` when it
/// is not one or lies before 1970.
pub(super) fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let t = DateTime::parse_from_rfc3339(s.trim()).ok()?;
    (t.timestamp() >= 0).then(|| SystemTime::from(t))
}

/// Formats a time as RFC 3339 in UTC with milliseconds: `2026-11-29T12:00:00.123Z`.
pub(super) fn format_rfc3339(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(secs: u64, nanos: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(secs, nanos)
    }

    #[test]
    fn parses_known_instants() {
        for (text, secs, nanos) in [
            ("1970-01-01T00:00:00Z", 0, 0),
            // date -u -d 2026-11-29T12:34:56Z +%s
            ("2026-11-29T12:34:56Z", 1_795_955_696, 0),
            ("2026-11-29T12:34:56.5Z", 1_795_955_696, 500_000_000),
            (
                "2026-11-29T14:34:56.123456789+02:00",
                1_795_955_696,
                123_456_789,
            ),
            ("2000-02-29T00:00:00-01:00", 951_786_000, 0),
        ] {
            assert_eq!(parse_rfc3339(text), Some(at(secs, nanos)), "{text}");
        }
    }

    #[test]
    fn refuses_garbage() {
        for bad in [
            "",
            "yesterday",
            "2026-11-29",
            "2026-11-29T12:34:56",
            "2026-13-01T00:00:00Z",
            "2026-11-29T25:00:00Z",
            "2026-11-29T12:34:56.Z",
            "2026-11-29T12:34:56+0200",
            "1969-12-31T23:59:59Z",
            "2026-11-29T12:34:5éZ",
            "2026-11-29T12:34:56+0é00",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn format_round_trips() {
        let t = at(1_795_955_696, 123_000_000);
        assert_eq!(format_rfc3339(t), "2026-11-29T12:34:56.123Z");
        assert_eq!(parse_rfc3339(&format_rfc3339(t)), Some(t));
        let leap = at(951_782_400, 0);
        assert_eq!(format_rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }
}
