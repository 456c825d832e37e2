//! JSON forms of `meta.v1.Time`, `meta.v1.MicroTime` and `meta.v1.Duration`.

use chrono::{DateTime, Datelike, Utc};

/// `Time` → `2006-01-02T15:04:05Z`; `MicroTime` → `2006-01-02T15:04:05.000000Z` (truncated).
pub(crate) fn format_time(seconds: i64, nanos: i64, micro: bool) -> Result<String, String> {
    let nanos = u32::try_from(nanos)
        .ok()
        .filter(|n| *n < 1_000_000_000)
        .ok_or_else(|| format!("nanos {nanos} out of range"))?;
    let t: DateTime<Utc> = DateTime::from_timestamp(seconds, nanos)
        .ok_or_else(|| format!("timestamp {seconds}s out of range"))?;
    if !(0..=9999).contains(&t.year()) {
        return Err(format!("timestamp {seconds}s is outside years 0-9999"));
    }
    let base = t.format("%Y-%m-%dT%H:%M:%S");
    Ok(if micro {
        format!("{base}.{:06}Z", nanos / 1000)
    } else {
        format!("{base}Z")
    })
}

/// Go's `time.Duration.String()`: `1h2m3.5s`, `1m0s`, `1.5ms`, `2µs`, `0s`, `-3s`.
pub(crate) fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    if nanos < 0 {
        out.push('-');
    }
    let n = nanos.unsigned_abs();
    if n < 1_000_000_000 {
        let (unit, scale, digits) = match n {
            0..1_000 => ("ns", 1, 0),
            1_000..1_000_000 => ("µs", 1_000, 3),
            _ => ("ms", 1_000_000, 6),
        };
        push_decimal(&mut out, n / scale, n % scale, digits);
        out.push_str(unit);
        return out;
    }
    let total_seconds = n / 1_000_000_000;
    let minutes = total_seconds / 60;
    let hours = minutes / 60;
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if minutes > 0 {
        out.push_str(&format!("{}m", minutes % 60));
    }
    push_decimal(&mut out, total_seconds % 60, n % 1_000_000_000, 9);
    out.push('s');
    out
}

/// Writes `int.frac` with `frac` zero-padded to `digits` digits, trailing zeros (and a bare
/// point) dropped.
fn push_decimal(out: &mut String, int: u64, frac: u64, digits: usize) {
    out.push_str(&int.to_string());
    if frac != 0 {
        let f = format!("{frac:0digits$}");
        out.push('.');
        out.push_str(f.trim_end_matches('0'));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_match_go() {
        let cases: &[(i64, &str)] = &[
            (0, "0s"),
            (1, "1ns"),
            (1_100, "1.1µs"),
            (2_000, "2µs"),
            (1_500_000, "1.5ms"),
            (1_000_000_000, "1s"),
            (1_500_000_000, "1.5s"),
            (60_000_000_000, "1m0s"),
            (90_000_000_000, "1m30s"),
            (3_600_000_000_000, "1h0m0s"),
            (3_723_000_000_001, "1h2m3.000000001s"),
            (-90_000_000_000, "-1m30s"),
            (i64::MIN, "-2562047h47m16.854775808s"),
            (i64::MAX, "2562047h47m16.854775807s"),
        ];
        for (n, want) in cases {
            assert_eq!(go_duration(*n), *want, "{n}");
        }
    }

    #[test]
    fn times() {
        assert_eq!(
            format_time(1_767_225_600, 0, false).unwrap(),
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(
            format_time(1_767_225_600, 123_456_789, false).unwrap(),
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(
            format_time(1_767_225_600, 123_456_789, true).unwrap(),
            "2026-01-01T00:00:00.123456Z"
        );
        assert_eq!(
            format_time(0, 0, true).unwrap(),
            "1970-01-01T00:00:00.000000Z"
        );
        assert!(format_time(0, -1, false).is_err());
        assert!(format_time(0, 1_000_000_000, false).is_err());
        assert!(format_time(i64::MAX, 0, false).is_err());
        assert!(format_time(300_000_000_000, 0, false).is_err()); // year > 9999
    }
}
