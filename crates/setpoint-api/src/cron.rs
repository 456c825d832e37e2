//! Cron schedules as Kubernetes reads them, for both the CronJob validation and the CronJob
//! controller: one parser, so a schedule that validates is a schedule that runs.
//!
//! Kubernetes parses `spec.schedule` with `robfig/cron`'s standard parser: five fields
//! (minute, hour, day of month, month, day of week) with lists, ranges, steps and names, or a
//! descriptor (`@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`,
//! `@hourly`, `@every <duration>`), optionally after a `TZ=<zone>` or `CRON_TZ=<zone>` prefix.
//! Error texts are that parser's.
//!
//! Times are computed in the schedule's zone (its prefix, else the one given with
//! [`Schedule::in_zone`], else UTC), from the IANA time zone database that the `chrono-tz`
//! crate compiles in: every node and build then knows the same zones, whatever tzdata the
//! machine has. A local time that a daylight-saving change skips does not run that day; one
//! it repeats runs once, at its first occurrence.
//!
//! ```
//! use setpoint_api::cron::Schedule;
//! let s = Schedule::parse("*/15 9-17 * * MON-FRI").unwrap();
//! let t = chrono::DateTime::parse_from_rfc3339("2026-11-20T17:50:00Z").unwrap().to_utc();
//! // Friday 17:50 → the next run is Monday 09:00.
//! assert_eq!(s.next_after(t).unwrap().to_rfc3339(), "2026-11-23T09:00:00+00:00");
//! ```

use chrono::offset::LocalResult;
use chrono::{DateTime, Datelike, Duration, NaiveDate, NaiveDateTime, TimeZone, Timelike, Utc};
use chrono_tz::Tz;

/// A parsed schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The zone of a `TZ=`/`CRON_TZ=` prefix, as written.
    pub zone: Option<String>,
    /// The zone the times are computed in.
    tz: Tz,
    when: When,
}

/// The IANA time zone `name`, as Go's `time.LoadLocation` finds it (case-sensitive; `UTC`
/// and the empty name are UTC). `Err` holds Go's message: `unknown time zone <name>`.
pub fn time_zone(name: &str) -> Result<Tz, String> {
    if name.is_empty() {
        return Ok(Tz::UTC);
    }
    if !plausible_zone(name) {
        return Err(format!("unknown time zone {name}"));
    }
    name.parse::<Tz>()
        .map_err(|_| format!("unknown time zone {name}"))
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum When {
    /// Five fields as bit sets.
    Fields {
        minutes: u64,
        hours: u64,
        days: u64,
        months: u64,
        weekdays: u64,
        /// Day of month or day of week was `*` or `?` (then both must match; otherwise
        /// either may, as in Vixie cron).
        day_star: bool,
    },
    /// `@every <duration>`: whole seconds, at least one.
    Every(u64),
}

struct Bounds {
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTES: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
};
const HOURS: Bounds = Bounds {
    min: 0,
    max: 23,
    names: &[],
};
const DOM: Bounds = Bounds {
    min: 1,
    max: 31,
    names: &[],
};
// Names index from the minimum: jan = 1, sun = 0.
const MONTHS: Bounds = Bounds {
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
const DOW: Bounds = Bounds {
    min: 0,
    max: 6,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

impl Schedule {
    /// Parses a schedule; `Err` holds the parser's message, as Kubernetes reports it.
    pub fn parse(spec: &str) -> Result<Schedule, String> {
        let mut spec = spec.trim();
        if spec.is_empty() {
            return Err("empty spec string".into());
        }
        let mut zone = None;
        if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
            let eq = spec.find('=').unwrap_or(0);
            match spec.find(' ') {
                Some(i) => {
                    let name = &spec[eq + 1..i];
                    let found = time_zone(name)
                        .map_err(|e| format!("provided bad location {name}: {e}"))?;
                    zone = Some((name.to_owned(), found));
                    spec = spec[i..].trim();
                }
                None => return Err(format!("provided bad location {spec}: unknown time zone")),
            }
        }
        let when = match spec.strip_prefix('@') {
            Some(descriptor) => parse_descriptor(descriptor, spec)?,
            None => parse_fields(spec)?,
        };
        let tz = zone.as_ref().map_or(Tz::UTC, |(_, tz)| *tz);
        Ok(Schedule {
            zone: zone.map(|(name, _)| name),
            tz,
            when,
        })
    }

    /// The schedule with its times computed in `tz` (a CronJob's `spec.timeZone`), unless its
    /// own `TZ=` prefix names a zone, which wins as upstream's.
    pub fn in_zone(mut self, tz: Tz) -> Schedule {
        if self.zone.is_none() {
            self.tz = tz;
        }
        self
    }

    /// The first scheduled time strictly after `t`, in UTC (within the next five years for
    /// field schedules; `None` when there is none, as for `0 0 31 2 *`). The fields are
    /// matched against the local time of the schedule's zone.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let (minutes, hours, days, months, weekdays, day_star) = match &self.when {
            When::Every(secs) => {
                // Whole seconds from `t`, as robfig's constant-delay schedule.
                let whole = t.with_nanosecond(0)?;
                return whole.checked_add_signed(Duration::seconds(i64::try_from(*secs).ok()?));
            }
            When::Fields {
                minutes,
                hours,
                days,
                months,
                weekdays,
                day_star,
            } => (*minutes, *hours, *days, *months, *weekdays, *day_star),
        };
        let day_matches = |c: &NaiveDateTime| {
            let dom = has(days, c.day());
            let dow = has(weekdays, c.weekday().num_days_from_sunday());
            if day_star {
                dom && dow
            } else {
                dom || dow
            }
        };
        let local = t.with_timezone(&self.tz).naive_local();
        let start = local.with_second(0)?.with_nanosecond(0)? + Duration::minutes(1);
        let limit = start + Duration::days(5 * 366);
        let mut c = start;
        while c < limit {
            if !has(months, c.month()) {
                // First minute of the next month.
                let (y, m) = if c.month() == 12 {
                    (c.year() + 1, 1)
                } else {
                    (c.year(), c.month() + 1)
                };
                c = NaiveDate::from_ymd_opt(y, m, 1)?.and_hms_opt(0, 0, 0)?;
                continue;
            }
            if !day_matches(&c) {
                c = (c + Duration::days(1)).with_hour(0)?.with_minute(0)?;
                continue;
            }
            if !has(hours, c.hour()) {
                c = (c + Duration::hours(1)).with_minute(0)?;
                continue;
            }
            if !has(minutes, c.minute()) {
                c += Duration::minutes(1);
                continue;
            }
            let at = match self.tz.from_local_datetime(&c) {
                LocalResult::Single(at) => Some(at),
                // Clocks went back: the first of the two still ahead.
                LocalResult::Ambiguous(first, second) => {
                    Some(if first.to_utc() > t { first } else { second })
                }
                // Clocks went forward over it: this minute does not exist that day.
                LocalResult::None => None,
            };
            match at.map(|a| a.to_utc()).filter(|a| *a > t) {
                Some(at) => return Some(at),
                None => c += Duration::minutes(1),
            }
        }
        None
    }
}

/// A zone name as Go's `time.LoadLocation` could find one: slash-separated parts of letters,
/// digits and `.-_+`, none `.`, `..` or starting with `-`. (Whether the zone exists is not
/// known without a zone database; see the CronJob controller for what it supports.)
pub fn plausible_zone(name: &str) -> bool {
    !name.is_empty()
        && name.split('/').all(|p| {
            p != "."
                && p != ".."
                && !p.starts_with('-')
                && (1..=14).contains(&p.len())
                && p.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b".-_+".contains(&c))
        })
}

fn has(bits: u64, v: u32) -> bool {
    bits & (1 << v) != 0
}

fn parse_fields(spec: &str) -> Result<When, String> {
    let fields: Vec<&str> = spec.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(format!(
            "expected exactly 5 fields, found {}: [{}]",
            fields.len(),
            fields.join(" ")
        ));
    }
    let (minutes, _) = field(fields[0], &MINUTES)?;
    let (hours, _) = field(fields[1], &HOURS)?;
    let (days, dom_star) = field(fields[2], &DOM)?;
    let (months, _) = field(fields[3], &MONTHS)?;
    let (weekdays, dow_star) = field(fields[4], &DOW)?;
    Ok(When::Fields {
        minutes,
        hours,
        days,
        months,
        weekdays,
        day_star: dom_star || dow_star,
    })
}

fn parse_descriptor(d: &str, spec: &str) -> Result<When, String> {
    let fields = match d {
        "yearly" | "annually" => "0 0 1 1 *",
        "monthly" => "0 0 1 * *",
        "weekly" => "0 0 * * 0",
        "daily" | "midnight" => "0 0 * * *",
        "hourly" => "0 * * * *",
        _ => {
            let Some(dur) = d.strip_prefix("every ") else {
                return Err(format!("unrecognized descriptor: {spec}"));
            };
            let dur = dur.trim();
            return match go_duration_nanos(dur) {
                // Less than a second runs every second; fractions of a second are dropped.
                Some(nanos) => Ok(When::Every(
                    u64::try_from(nanos / 1_000_000_000).unwrap_or(0).max(1),
                )),
                None => Err(format!(
                    "failed to parse duration {spec}: time: invalid duration {dur:?}"
                )),
            };
        }
    };
    parse_fields(fields)
}

/// Go's `time.ParseDuration`: a signed sequence of decimal numbers with units (`1h30m`,
/// `1.5s`, `300ms`), in nanoseconds; `None` when it does not parse or overflows.
pub fn go_duration_nanos(s: &str) -> Option<i128> {
    let (negative, s) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if s == "0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    let mut rest = s;
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let n = rest
            .bytes()
            .take_while(|c| c.is_ascii_digit() || *c == b'.')
            .count();
        let num = &rest[..n];
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
            return None;
        }
        rest = &rest[n..];
        let (unit, nanos): (&str, i128) = [
            ("ns", 1),
            ("us", 1_000),
            ("µs", 1_000),
            ("μs", 1_000),
            ("ms", 1_000_000),
            ("s", 1_000_000_000),
            ("m", 60_000_000_000),
            ("h", 3_600_000_000_000),
        ]
        .into_iter()
        .find(|(u, _)| rest.starts_with(u))?;
        rest = &rest[unit.len()..];
        let whole: i128 = if int.is_empty() { 0 } else { int.parse().ok()? };
        let mut value = whole.checked_mul(nanos)?;
        let mut scale = nanos;
        for d in frac.bytes().take(30) {
            scale /= 10;
            value += i128::from(d - b'0') * scale;
        }
        total = total.checked_add(value)?;
    }
    // Go's limit: the largest int64 of nanoseconds.
    (total <= i128::from(i64::MAX)).then_some(if negative { -total } else { total })
}

/// One field: comma-separated ranges; returns the bits and whether it was a bare `*`/`?` (or
/// one with a step of 1), which robfig marks to match days by both fields.
fn field(text: &str, b: &Bounds) -> Result<(u64, bool), String> {
    let mut bits = 0;
    let mut star = false;
    for expr in text.split(',') {
        let (r, s) = range(expr, b)?;
        bits |= r;
        star |= s;
    }
    Ok((bits, star))
}

fn range(expr: &str, b: &Bounds) -> Result<(u64, bool), String> {
    let range_and_step: Vec<&str> = expr.split('/').collect();
    let low_high: Vec<&str> = range_and_step[0].split('-').collect();
    let single = low_high.len() == 1;
    let mut star = false;
    let (start, mut end) = if low_high[0] == "*" || low_high[0] == "?" {
        star = true;
        (b.min, b.max)
    } else {
        let start = int_or_name(low_high[0], b)?;
        match low_high.len() {
            1 => (start, start),
            2 => (start, int_or_name(low_high[1], b)?),
            _ => return Err(format!("too many hyphens: {expr}")),
        }
    };
    let step = match range_and_step.len() {
        1 => 1,
        2 => {
            let step = must_int(range_and_step[1])?;
            // `N/step` means `N-max/step`.
            if single {
                end = b.max;
            }
            if step > 1 {
                star = false;
            }
            step
        }
        _ => return Err(format!("too many slashes: {expr}")),
    };
    if start < b.min {
        return Err(format!(
            "beginning of range ({start}) below minimum ({}): {expr}",
            b.min
        ));
    }
    if end > b.max {
        return Err(format!(
            "end of range ({end}) above maximum ({}): {expr}",
            b.max
        ));
    }
    if start > end {
        return Err(format!(
            "beginning of range ({start}) beyond end of range ({end}): {expr}"
        ));
    }
    if step == 0 {
        return Err(format!("step of range should be a positive number: {expr}"));
    }
    let mut bits = 0u64;
    let mut v = start;
    while v <= end {
        bits |= 1 << v;
        v += step;
    }
    Ok((bits, star))
}

fn int_or_name(s: &str, b: &Bounds) -> Result<u32, String> {
    let lower = s.to_ascii_lowercase();
    if let Some(i) = b.names.iter().position(|n| *n == lower) {
        return Ok(b.min + i as u32);
    }
    must_int(s)
}

fn must_int(s: &str) -> Result<u32, String> {
    let n: i64 = s.parse().map_err(|_| {
        format!("failed to parse int from {s}: strconv.Atoi: parsing {s:?}: invalid syntax")
    })?;
    if n < 0 {
        return Err(format!("negative number ({n}) not allowed: {s}"));
    }
    u32::try_from(n).map_err(|_| {
        format!("failed to parse int from {s}: strconv.Atoi: parsing {s:?}: value out of range")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn next(schedule: &str, after: &str) -> String {
        Schedule::parse(schedule)
            .unwrap()
            .next_after(t(after))
            .unwrap()
            .to_rfc3339()
    }

    #[test]
    fn common_schedules() {
        for (schedule, after, expected) in [
            (
                "*/1 * * * *",
                "2026-01-01T10:00:30Z",
                "2026-01-01T10:01:00+00:00",
            ),
            (
                "0 2 * * *",
                "2026-01-01T02:00:00Z",
                "2026-01-02T02:00:00+00:00",
            ),
            (
                "0 2 * * *",
                "2026-01-01T01:59:59Z",
                "2026-01-01T02:00:00+00:00",
            ),
            (
                "30 */6 * * *",
                "2026-01-01T06:31:00Z",
                "2026-01-01T12:30:00+00:00",
            ),
            (
                "0 0 1 JAN *",
                "2026-03-01T00:00:00Z",
                "2027-01-01T00:00:00+00:00",
            ),
            (
                "@hourly",
                "2026-01-01T10:59:00Z",
                "2026-01-01T11:00:00+00:00",
            ),
            (
                "@weekly",
                "2026-11-22T00:00:00Z",
                "2026-11-29T00:00:00+00:00",
            ),
            (
                "@yearly",
                "2026-11-22T00:00:00Z",
                "2027-01-01T00:00:00+00:00",
            ),
            (
                "0 0 29 2 *",
                "2026-03-01T00:00:00Z",
                "2028-02-29T00:00:00+00:00",
            ),
            (
                "5,10-12 * * * *",
                "2026-01-01T00:10:00Z",
                "2026-01-01T00:11:00+00:00",
            ),
            (
                "0 12 * * 0",
                "2026-11-22T13:00:00Z",
                "2026-11-29T12:00:00+00:00",
            ),
            (
                "5/20 * * * *",
                "2026-01-01T00:26:00Z",
                "2026-01-01T00:45:00+00:00",
            ),
            // `@every` counts from the given time, in whole seconds.
            (
                "@every 1h30m",
                "2026-01-01T00:00:10.5Z",
                "2026-01-01T01:30:10+00:00",
            ),
            (
                "@every 5m",
                "2026-01-01T00:00:00Z",
                "2026-01-01T00:05:00+00:00",
            ),
            (
                "@every 100ms",
                "2026-01-01T00:00:00Z",
                "2026-01-01T00:00:01+00:00",
            ),
            // A zone prefix parses; the times are the fields'.
            (
                "TZ=UTC 0 * * * *",
                "2026-01-01T00:10:00Z",
                "2026-01-01T01:00:00+00:00",
            ),
            (
                "CRON_TZ=Etc/UTC @daily",
                "2026-01-01T00:10:00Z",
                "2026-01-02T00:00:00+00:00",
            ),
        ] {
            assert_eq!(next(schedule, after), expected, "{schedule} after {after}");
        }
        assert_eq!(
            Schedule::parse("TZ=Europe/Paris 0 * * * *")
                .unwrap()
                .zone
                .as_deref(),
            Some("Europe/Paris")
        );
    }

    #[test]
    fn times_in_a_zone_follow_its_clock() {
        let paris = time_zone("Europe/Paris").unwrap();
        let nine = Schedule::parse("0 9 * * *").unwrap().in_zone(paris);
        // 09:00 in Paris is 08:00 UTC in winter, 07:00 UTC in summer.
        assert_eq!(
            nine.next_after(t("2026-01-10T12:00:00Z"))
                .unwrap()
                .to_rfc3339(),
            "2026-01-11T08:00:00+00:00"
        );
        assert_eq!(
            nine.next_after(t("2026-07-10T12:00:00Z"))
                .unwrap()
                .to_rfc3339(),
            "2026-07-11T07:00:00+00:00"
        );
        // A TZ= prefix wins over the zone given.
        let ny = Schedule::parse("TZ=America/New_York 0 9 * * *")
            .unwrap()
            .in_zone(paris);
        assert_eq!(
            ny.next_after(t("2026-01-10T15:00:00Z"))
                .unwrap()
                .to_rfc3339(),
            "2026-01-11T14:00:00+00:00"
        );
        // 02:30 does not exist in Paris on 2026-03-29 (02:00 → 03:00): the next is a day on.
        let skipped = Schedule::parse("30 2 * * *").unwrap().in_zone(paris);
        assert_eq!(
            skipped
                .next_after(t("2026-03-28T12:00:00Z"))
                .unwrap()
                .to_rfc3339(),
            "2026-03-30T00:30:00+00:00"
        );
        // 02:30 happens twice on 2026-10-25: it runs once, at the first.
        let first = skipped.next_after(t("2026-10-24T12:00:00Z")).unwrap();
        assert_eq!(first.to_rfc3339(), "2026-10-25T00:30:00+00:00");
        assert_eq!(
            skipped.next_after(first).unwrap().to_rfc3339(),
            "2026-10-26T01:30:00+00:00"
        );
    }

    #[test]
    fn zones_are_looked_up_as_go_looks_them_up() {
        assert!(time_zone("Asia/Kolkata").is_ok());
        assert_eq!(time_zone("").unwrap(), Tz::UTC);
        assert_eq!(time_zone("Etc/UTC").unwrap(), Tz::Etc__UTC);
        for bad in ["Mars/Olympus", "europe/paris", "../etc/passwd", "Local"] {
            assert_eq!(
                time_zone(bad).unwrap_err(),
                format!("unknown time zone {bad}")
            );
        }
        assert_eq!(
            Schedule::parse("TZ=Mars/Olympus 0 * * * *").unwrap_err(),
            "provided bad location Mars/Olympus: unknown time zone Mars/Olympus"
        );
    }

    #[test]
    fn day_of_month_or_day_of_week() {
        // Both restricted: either matches (the 1st, or any Monday).
        assert_eq!(
            next("0 0 1 * MON", "2026-11-24T00:00:00Z"),
            "2026-11-30T00:00:00+00:00"
        );
        assert_eq!(
            next("0 0 1 * MON", "2026-11-30T00:00:00Z"),
            "2026-12-01T00:00:00+00:00"
        );
        // One is `*`: both must match.
        assert_eq!(
            next("0 0 * * MON", "2026-11-24T00:00:00Z"),
            "2026-11-30T00:00:00+00:00"
        );
        // `*/2` is not a star (robfig clears the mark for steps above 1): either matches.
        assert_eq!(
            next("0 0 */2 * MON", "2026-11-01T12:00:00Z"),
            "2026-11-02T00:00:00+00:00"
        );
    }

    #[test]
    fn upstream_errors() {
        for (bad, msg) in [
            ("", "empty spec string"),
            ("* * *", "expected exactly 5 fields, found 3: [* * *]"),
            ("61 * * * *", "end of range (61) above maximum (59): 61"),
            ("* * 0 * *", "beginning of range (0) below minimum (1): 0"),
            (
                "5-1 * * * *",
                "beginning of range (5) beyond end of range (1): 5-1",
            ),
            (
                "*/0 * * * *",
                "step of range should be a positive number: */0",
            ),
            (
                "x * * * *",
                "failed to parse int from x: strconv.Atoi: parsing \"x\": invalid syntax",
            ),
            ("1-2-3 * * * *", "too many hyphens: 1-2-3"),
            ("1/2/3 * * * *", "too many slashes: 1/2/3"),
            ("@fortnightly", "unrecognized descriptor: @fortnightly"),
            ("* * * * 7", "end of range (7) above maximum (6): 7"),
            (
                "@every 5x",
                "failed to parse duration @every 5x: time: invalid duration \"5x\"",
            ),
            ("TZ=UTC", "provided bad location TZ=UTC: unknown time zone"),
        ] {
            assert_eq!(Schedule::parse(bad), Err(msg.to_string()), "{bad:?}");
        }
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration_nanos("1h30m"), Some(5_400_000_000_000));
        assert_eq!(go_duration_nanos("1.5s"), Some(1_500_000_000));
        assert_eq!(go_duration_nanos("-2ms"), Some(-2_000_000));
        assert_eq!(go_duration_nanos("0"), Some(0));
        assert_eq!(go_duration_nanos(".5h"), Some(1_800_000_000_000));
        for bad in ["", "1", "h", "1.2.3s", "3d", "-"] {
            assert_eq!(go_duration_nanos(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn impossible_schedules_have_no_next_time() {
        let s = Schedule::parse("0 0 31 2 *").unwrap();
        assert_eq!(s.next_after(t("2026-01-01T00:00:00Z")), None);
    }
}
