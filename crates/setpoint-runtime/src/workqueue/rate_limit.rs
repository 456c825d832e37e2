//! The two delay sources behind `add_rate_limited`: per-key exponential backoff and one
//! token bucket shared by every key of a queue.

use tokio::time::{Duration, Instant};

/// Per-key exponential backoff: the `n`-th consecutive failure (counting from 0) waits
/// `base * 2^n`, never more than `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) base: Duration,
    pub(crate) max: Duration,
}

impl Backoff {
    /// Delay for a key that has already failed `failures` times before this failure.
    pub(crate) fn delay(&self, failures: u32) -> Duration {
        // Computed in u128 nanoseconds so that neither the shift nor the multiply can
        // overflow before the cap is applied; anything at or past 2^64 is over any cap.
        if failures >= 64 {
            return self.max;
        }
        let nanos = self.base.as_nanos().saturating_mul(1u128 << failures);
        if nanos >= self.max.as_nanos() {
            self.max
        } else {
            // Below `max`, so it fits a Duration.
            Duration::from_nanos(nanos as u64)
        }
    }
}

/// A token bucket holding up to `burst` tokens, refilled at `qps` tokens per second.
///
/// Instead of a fractional token count it keeps the instant at which the bucket would be
/// full again (`full_at`), which keeps the arithmetic in whole nanoseconds: with 10 qps
/// the 101st reservation of a burst-100 bucket is due exactly 100 ms later, not 99.999…
/// Reservations may go into debt (like `rate.Limiter::Reserve` in Go): each one takes a
/// token and says how long to wait until that token exists.
#[derive(Clone, Debug)]
pub(crate) struct TokenBucket {
    /// Time to produce one token.
    interval: Duration,
    /// Time to refill the whole bucket from empty (`interval * burst`).
    window: Duration,
    /// When the bucket is (or was) full; `None` until the first reservation, which is the
    /// same as "full now".
    full_at: Option<Instant>,
}

impl TokenBucket {
    pub(crate) fn new(qps: f64, burst: u32) -> Self {
        assert!(
            qps.is_finite() && qps > 0.0,
            "work queue rate limit must be a positive, finite number of adds per second, got {qps}"
        );
        assert!(burst > 0, "work queue rate limit burst must be at least 1");
        let interval = Duration::from_secs_f64(1.0 / qps);
        Self {
            interval,
            window: interval.saturating_mul(burst),
            full_at: None,
        }
    }

    /// Takes one token and returns how long the caller must wait before using it.
    pub(crate) fn reserve(&mut self, now: Instant) -> Duration {
        let full_at = self.full_at.map_or(now, |at| at.max(now)) + self.interval;
        self.full_at = Some(full_at);
        // The token exists once the bucket is at most `window` away from full.
        let available_from = now + self.window;
        full_at.saturating_duration_since(available_from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps_without_overflow() {
        let b = Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
        };
        let got: Vec<_> = (0..5).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(got, [5, 10, 20, 40, 80]);
        // 5 ms * 2^17 = 655.36 s, 2^18 would be 1310.72 s: capped.
        assert_eq!(b.delay(17), Duration::from_millis(655_360));
        assert_eq!(b.delay(18), Duration::from_secs(1000));
        for n in [31, 32, 63, 64, 1000, u32::MAX] {
            assert_eq!(b.delay(n), Duration::from_secs(1000), "failures={n}");
        }
    }

    #[test]
    fn backoff_with_huge_base_is_capped() {
        let b = Backoff {
            base: Duration::MAX,
            max: Duration::from_secs(7),
        };
        assert_eq!(b.delay(0), Duration::from_secs(7));
        assert_eq!(b.delay(40), Duration::from_secs(7));
    }

    #[test]
    fn bucket_allows_burst_then_spaces_at_qps() {
        let now = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 3);
        let delays: Vec<_> = (0..6).map(|_| bucket.reserve(now).as_millis()).collect();
        assert_eq!(delays, [0, 0, 0, 100, 200, 300]);
    }

    #[test]
    fn bucket_refills_over_time() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 2);
        assert_eq!(bucket.reserve(start), Duration::ZERO);
        assert_eq!(bucket.reserve(start), Duration::ZERO);
        assert_eq!(bucket.reserve(start), Duration::from_millis(100));
        // Long after the debt is paid the bucket is full again, but never fuller.
        let later = start + Duration::from_secs(60);
        assert_eq!(bucket.reserve(later), Duration::ZERO);
        assert_eq!(bucket.reserve(later), Duration::ZERO);
        assert_eq!(bucket.reserve(later), Duration::from_millis(100));
    }

    #[test]
    #[should_panic(expected = "positive")]
    fn bucket_rejects_zero_qps() {
        let _ = TokenBucket::new(0.0, 1);
    }
}
