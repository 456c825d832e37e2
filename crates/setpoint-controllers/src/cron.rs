//! Cron schedules as CronJobs write them: five fields (minute, hour, day of month, month, day
//! of week) with lists, ranges, steps and names, or a macro (`@hourly`, `@daily`, …); times
//! in UTC.
//!
//! ```
//! use setpoint_controllers::cron::Schedule;
//! let s: Schedule = "*/15 9-17 * * MON-FRI".parse().unwrap();
//! let t = chrono::DateTime::parse_from_rfc3339("2026-11-20T17:50:00Z").unwrap().to_utc();
//! // Friday 17:50 → the next run is Monday 09:00.
//! assert_eq!(s.next_after(t).unwrap().to_rfc3339(), "2026-11-23T09:00:00+00:00");
//! ```

use std::str::FromStr;

use chrono::{DateTime, Datelike, Duration, TimeZone, Timelike, Utc};

/// A parsed schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Day of month or day of week was written as `*` (then both must match; otherwise
    /// either may, as in Vixie cron).
    day_star: bool,
}

/// Why a schedule could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid schedule {schedule:?}: {reason}")]
pub struct CronError {
    pub schedule: String,
    pub reason: String,
}

const MONTHS: &[&str] = &[
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAYS: &[&str] = &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

fn value(s: &str, min: u32, max: u32, names: &[&str], name_base: u32) -> Result<u32, String> {
    if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
        return Ok(i as u32 + name_base);
    }
    let v: u32 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v < min || v > max {
        return Err(format!("{v} is out of range {min}-{max}"));
    }
    Ok(v)
}

/// Parses one field into a bit set; returns it and whether it was a bare `*` / `?`.
fn field(
    text: &str,
    min: u32,
    max: u32,
    names: &[&str],
    name_base: u32,
) -> Result<(u64, bool), String> {
    let mut bits = 0u64;
    let mut star = false;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s.parse().map_err(|_| format!("bad step {s:?}"))?;
                if step == 0 {
                    return Err("step must be positive".into());
                }
                (r, Some(step))
            }
            None => (part, None),
        };
        let (lo, hi) = if range == "*" || range == "?" {
            if step.is_none() {
                star = true;
            }
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (
                value(a, min, max, names, name_base)?,
                value(b, min, max, names, name_base)?,
            )
        } else {
            let v = value(range, min, max, names, name_base)?;
            // `a/n` means from a to the end in steps of n.
            (v, if step.is_some() { max } else { v })
        };
        if lo > hi {
            return Err(format!("range {lo}-{hi} is backwards"));
        }
        let step = step.unwrap_or(1);
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok((bits, star))
}

impl FromStr for Schedule {
    type Err = CronError;

    fn from_str(s: &str) -> Result<Self, CronError> {
        let err = |reason: String| CronError {
            schedule: s.to_string(),
            reason,
        };
        let text = match s.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            t if t.starts_with('@') => return Err(err(format!("unknown descriptor {t}"))),
            t if t.starts_with("TZ=") || t.starts_with("CRON_TZ=") => {
                return Err(err(
                    "time zones go in spec.timeZone, not the schedule".into()
                ))
            }
            t => t,
        };
        let parts: Vec<&str> = text.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(err(format!("expected 5 fields, found {}", parts.len())));
        }
        let (minutes, _) = field(parts[0], 0, 59, &[], 0).map_err(&err)?;
        let (hours, _) = field(parts[1], 0, 23, &[], 0).map_err(&err)?;
        let (days, dom_star) = field(parts[2], 1, 31, &[], 0).map_err(&err)?;
        let (months, _) = field(parts[3], 1, 12, MONTHS, 1).map_err(&err)?;
        let (mut weekdays, dow_star) = field(parts[4], 0, 7, DAYS, 0).map_err(&err)?;
        // 7 is Sunday too.
        if weekdays & (1 << 7) != 0 {
            weekdays |= 1;
        }
        Ok(Schedule {
            minutes,
            hours,
            days,
            months,
            weekdays,
            day_star: dom_star || dow_star,
        })
    }
}

fn has(bits: u64, v: u32) -> bool {
    bits & (1 << v) != 0
}

impl Schedule {
    fn day_matches(&self, t: &DateTime<Utc>) -> bool {
        let dom = has(self.days, t.day());
        let dow = has(self.weekdays, t.weekday().num_days_from_sunday());
        if self.day_star {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The first scheduled time strictly after `t` (within the next five years).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let start = t.with_second(0)?.with_nanosecond(0)? + Duration::minutes(1);
        let limit = start + Duration::days(5 * 366);
        let mut c = start;
        while c < limit {
            if !has(self.months, c.month()) {
                // First minute of the next month.
                let (y, m) = if c.month() == 12 {
                    (c.year() + 1, 1)
                } else {
                    (c.year(), c.month() + 1)
                };
                c = Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0).single()?;
                continue;
            }
            if !self.day_matches(&c) {
                c = (c + Duration::days(1)).with_hour(0)?.with_minute(0)?;
                continue;
            }
            if !has(self.hours, c.hour()) {
                c = (c + Duration::hours(1)).with_minute(0)?;
                continue;
            }
            if !has(self.minutes, c.minute()) {
                c += Duration::minutes(1);
                continue;
            }
            return Some(c);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn next(schedule: &str, after: &str) -> String {
        let s: Schedule = schedule.parse().unwrap();
        s.next_after(t(after)).unwrap().to_rfc3339()
    }

    #[test]
    fn common_schedules() {
        assert_eq!(
            next("*/1 * * * *", "2026-01-01T10:00:30Z"),
            "2026-01-01T10:01:00+00:00"
        );
        assert_eq!(
            next("0 2 * * *", "2026-01-01T02:00:00Z"),
            "2026-01-02T02:00:00+00:00"
        );
        assert_eq!(
            next("0 2 * * *", "2026-01-01T01:59:59Z"),
            "2026-01-01T02:00:00+00:00"
        );
        assert_eq!(
            next("30 */6 * * *", "2026-01-01T06:31:00Z"),
            "2026-01-01T12:30:00+00:00"
        );
        assert_eq!(
            next("0 0 1 JAN *", "2026-03-01T00:00:00Z"),
            "2027-01-01T00:00:00+00:00"
        );
        assert_eq!(
            next("@hourly", "2026-01-01T10:59:00Z"),
            "2026-01-01T11:00:00+00:00"
        );
        assert_eq!(
            next("@weekly", "2026-11-22T00:00:00Z"),
            "2026-11-29T00:00:00+00:00"
        );
        assert_eq!(
            next("0 0 29 2 *", "2026-03-01T00:00:00Z"),
            "2028-02-29T00:00:00+00:00"
        );
        assert_eq!(
            next("5,10-12 * * * *", "2026-01-01T00:10:00Z"),
            "2026-01-01T00:11:00+00:00"
        );
        assert_eq!(
            next("0 12 * * 7", "2026-11-22T13:00:00Z"),
            "2026-11-29T12:00:00+00:00"
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
    }

    #[test]
    fn invalid_schedules() {
        for bad in [
            "* * * *",
            "60 * * * *",
            "* 24 * * *",
            "*/0 * * * *",
            "@every 5m",
            "5-1 * * * *",
            "x * * * *",
            "TZ=UTC 0 * * * *",
        ] {
            assert!(bad.parse::<Schedule>().is_err(), "{bad}");
        }
        let e = "* * *".parse::<Schedule>().unwrap_err();
        assert!(e.to_string().contains("expected 5 fields"));
    }

    #[test]
    fn impossible_schedules_have_no_next_time() {
        let s: Schedule = "0 0 31 2 *".parse().unwrap();
        assert_eq!(s.next_after(t("2026-01-01T00:00:00Z")), None);
    }
}
