//! CrashLoopBackOff timing: the first restart of a crashed container is immediate, each
//! later one waits the current delay, which starts at `base` and doubles up to `max`. A run
//! that lasted `reset_after` forgives the history.

use std::time::Duration;

/// The delays a runtime applies between restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffPolicy {
    /// The first non-zero delay (Kubernetes: 10 s).
    pub base: Duration,
    /// The ceiling (Kubernetes: 5 min).
    pub max: Duration,
    /// A run at least this long resets the back-off (Kubernetes: 10 min).
    pub reset_after: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(10),
            max: Duration::from_secs(300),
            reset_after: Duration::from_secs(600),
        }
    }
}

impl BackoffPolicy {
    /// Decides the wait before restarting a container that just exited after running for
    /// `ran_for`, given the delay the previous restart left (`None`: no back-off yet).
    /// Returns the wait and the delay to remember for the next exit.
    pub fn after_exit(&self, current: Option<Duration>, ran_for: Duration) -> (Duration, Duration) {
        let current = if ran_for >= self.reset_after {
            None
        } else {
            current
        };
        match current {
            None => (Duration::ZERO, self.base.min(self.max)),
            Some(delay) => (delay, delay.saturating_mul(2).min(self.max)),
        }
    }
}

/// Formats a delay as Kubernetes does in its back-off messages (`10s`, `2m40s`, `5m0s`).
pub fn format_delay(delay: Duration) -> String {
    let total_ms = delay.as_millis();
    if total_ms < 1000 {
        return format!("{total_ms}ms");
    }
    let secs = delay.as_secs();
    let frac = delay.subsec_millis();
    let (m, s) = (secs / 60, secs % 60);
    let s = if frac == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{frac:03}").trim_end_matches('0'))
    };
    if m == 0 {
        s
    } else {
        format!("{m}m{s}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_start_immediate_then_double_to_the_cap() {
        let p = BackoffPolicy::default();
        let short = Duration::from_secs(1);
        let mut state = None;
        let mut waits = Vec::new();
        for _ in 0..8 {
            let (wait, next) = p.after_exit(state, short);
            waits.push(wait.as_secs());
            state = Some(next);
        }
        assert_eq!(waits, [0, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn a_long_run_resets_the_backoff() {
        let p = BackoffPolicy::default();
        let (wait, next) = p.after_exit(Some(Duration::from_secs(160)), Duration::from_secs(600));
        assert_eq!((wait, next), (Duration::ZERO, Duration::from_secs(10)));
        let (wait, _) = p.after_exit(Some(Duration::from_secs(160)), Duration::from_secs(599));
        assert_eq!(wait, Duration::from_secs(160));
    }

    #[test]
    fn delays_print_like_kubernetes() {
        assert_eq!(format_delay(Duration::from_secs(10)), "10s");
        assert_eq!(format_delay(Duration::from_secs(160)), "2m40s");
        assert_eq!(format_delay(Duration::from_secs(300)), "5m0s");
        assert_eq!(format_delay(Duration::from_millis(200)), "200ms");
        assert_eq!(format_delay(Duration::from_millis(10_500)), "10.5s");
    }
}
