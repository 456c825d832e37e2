//! Timestamps as Kubernetes writes them.
//!
//! `metav1.Time` is RFC 3339 in UTC with whole seconds (`2026-01-01T00:00:00Z`);
//! `metav1.MicroTime` has exactly six fractional digits (`2026-01-01T00:00:00.000000Z`). Clients
//! may send either with any fraction and any offset (kopf sends `…636911+00:00`), so parsing is
//! lenient and output is normalized.

use chrono::{DateTime, FixedOffset, SecondsFormat, Utc};

/// A timestamp that is not RFC 3339.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("parsing time {input:?} as RFC 3339: {reason}")]
pub struct TimeError {
    /// The text that failed to parse, as given.
    pub input: String,
    /// Why it is not RFC 3339 (the parser's message).
    pub reason: String,
}

/// The current time as a `metav1.Time` string.
pub fn now_rfc3339() -> String {
    format_time(Utc::now())
}

/// The current time as a `metav1.MicroTime` string.
pub fn now_micro() -> String {
    format_micro_time(Utc::now())
}

/// `2026-01-01T00:00:00Z`: whole seconds (the fraction is truncated, as Go's marshaller does).
pub fn format_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `2026-01-01T00:00:00.123456Z`: exactly six fractional digits (truncated, not rounded).
pub fn format_micro_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Parses RFC 3339 with any number of fractional digits and any offset (`Z`, `z`, `+00:00`,
/// `-07:00`), converted to UTC.
pub fn parse_time(s: &str) -> Result<DateTime<Utc>, TimeError> {
    // chrono's RFC 3339 parser also takes a space for the `T`; Go's does not, so refuse it to
    // keep the same inputs valid on both.
    if s.as_bytes()
        .get(10)
        .is_some_and(|&c| c != b'T' && c != b't')
    {
        return Err(TimeError {
            input: s.to_string(),
            reason: "expected 'T' between date and time".into(),
        });
    }
    DateTime::<FixedOffset>::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| TimeError {
            input: s.to_string(),
            reason: e.to_string(),
        })
}

/// Re-renders a client's timestamp as a `metav1.Time` string.
pub fn normalize_time(s: &str) -> Result<String, TimeError> {
    parse_time(s).map(format_time)
}

/// Re-renders a client's timestamp as a `metav1.MicroTime` string.
pub fn normalize_micro_time(s: &str) -> Result<String, TimeError> {
    parse_time(s).map(format_micro_time)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    #[test]
    fn formats() {
        let t = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(format_time(t), "2026-01-01T00:00:00Z");
        assert_eq!(format_micro_time(t), "2026-01-01T00:00:00.000000Z");
        let t = t + chrono::Duration::nanoseconds(636_911_999);
        assert_eq!(format_time(t), "2026-01-01T00:00:00Z");
        assert_eq!(format_micro_time(t), "2026-01-01T00:00:00.636911Z");
    }

    #[test]
    fn parses_offsets_and_fractions() {
        let t = parse_time("2026-11-22T01:19:32.636911+00:00").unwrap();
        assert_eq!(format_micro_time(t), "2026-11-22T01:19:32.636911Z");
        assert_eq!(
            normalize_time("2026-11-22T03:19:32+02:00").unwrap(),
            "2026-11-22T01:19:32Z"
        );
        assert_eq!(
            normalize_time("2026-11-22T01:19:32.5Z").unwrap(),
            "2026-11-22T01:19:32Z"
        );
        assert_eq!(
            normalize_micro_time("2026-11-22T01:19:32.1234567891Z").unwrap(),
            "2026-11-22T01:19:32.123456Z"
        );
        assert_eq!(
            normalize_time("2026-01-01T00:00:00z").unwrap(),
            "2026-01-01T00:00:00Z"
        );
    }

    #[test]
    fn rejects_non_rfc3339() {
        for bad in [
            "",
            "2026-01-01",
            "2026-01-01 00:00:00Z",
            "2026-01-01T00:00:00",
            "yesterday",
            "2026-13-01T00:00:00Z",
        ] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
        let e = parse_time("nope").unwrap_err();
        assert!(e.to_string().starts_with("parsing time \"nope\""));
    }

    #[test]
    fn now_is_well_formed() {
        let s = now_rfc3339();
        assert_eq!(s.len(), 20);
        assert!(s.ends_with('Z'));
        assert_eq!(normalize_time(&s).unwrap(), s);
        let m = now_micro();
        assert_eq!(m.len(), 27);
        assert_eq!(normalize_micro_time(&m).unwrap(), m);
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(secs in 0i64..4_000_000_000, micros in 0u32..1_000_000) {
            let t = Utc.timestamp_opt(secs, micros * 1000).unwrap();
            prop_assert_eq!(parse_time(&format_micro_time(t)).unwrap(), t);
            prop_assert_eq!(parse_time(&format_time(t)).unwrap().timestamp(), secs);
        }
    }
}
