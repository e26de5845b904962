//! RFC 3339 timestamps as the service writes them (`2026-11-29T12:00:00.123Z`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn digits(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Parses an RFC 3339 timestamp (`Z` or `±hh:mm` offset, optional fraction); `None` when it
/// is not one or lies before 1970.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    if s.len() < 20 || !s.is_char_boundary(10) || !s.is_char_boundary(19) {
        return None;
    }
    let (date, rest) = s.split_at(10);
    let sep = rest.as_bytes().first().copied()?;
    if !matches!(sep, b'T' | b't' | b' ') {
        return None;
    }
    let (time, zone) = rest[1..].split_at(8);
    let mut dp = date.split('-');
    let (y, mo, d) = (
        digits(dp.next()?)?,
        digits(dp.next()?)?,
        digits(dp.next()?)?,
    );
    let mut tp = time.split(':');
    let (h, mi, se) = (
        digits(tp.next()?)?,
        digits(tp.next()?)?,
        digits(tp.next()?)?,
    );
    if dp.next().is_some() || tp.next().is_some() {
        return None;
    }
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    // Fraction, then the zone.
    let (nanos, zone) = match zone.strip_prefix('.') {
        Some(frac_and_zone) => {
            let end = frac_and_zone
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(frac_and_zone.len());
            let (frac, zone) = frac_and_zone.split_at(end);
            if frac.is_empty() {
                return None;
            }
            let mut nanos: u32 = 0;
            for (i, b) in frac.bytes().take(9).enumerate() {
                nanos += u32::from(b - b'0') * 10u32.pow(8 - i as u32);
            }
            (nanos, zone)
        }
        None => (0, zone),
    };
    let offset_secs: i64 = match zone {
        "Z" | "z" => 0,
        z if z.len() == 6
            && z.is_ascii()
            && (z.starts_with('+') || z.starts_with('-'))
            && &z[3..4] == ":" =>
        {
            let oh = i64::from(digits(&z[1..3])?);
            let om = i64::from(digits(&z[4..6])?);
            let off = oh * 3600 + om * 60;
            if z.starts_with('-') { -off } else { off }
        }
        _ => return None,
    };
    let days = days_from_civil(i64::from(y), mo, d);
    let secs =
        days * 86_400 + i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(se) - offset_secs;
    let secs = u64::try_from(secs).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
}

/// Formats a time as RFC 3339 in UTC with milliseconds: `2026-11-29T12:00:00.123Z`.
pub fn format_rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (y, m, day) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        sod / 3600,
        (sod % 3600) / 60,
        sod % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, nanos: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(secs, nanos)
    }

    #[test]
    fn parses_known_instants() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(at(0, 0)));
        // date -u -d 2026-11-29T12:34:56Z +%s
        assert_eq!(
            parse_rfc3339("2026-11-29T12:34:56Z"),
            Some(at(1_795_955_696, 0))
        );
        assert_eq!(
            parse_rfc3339("2026-11-29T12:34:56.5Z"),
            Some(at(1_795_955_696, 500_000_000))
        );
        assert_eq!(
            parse_rfc3339("2026-11-29T14:34:56.123456789+02:00"),
            Some(at(1_795_955_696, 123_456_789))
        );
        assert_eq!(
            parse_rfc3339("2000-02-29T00:00:00-01:00"),
            Some(at(951_786_000, 0))
        );
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
