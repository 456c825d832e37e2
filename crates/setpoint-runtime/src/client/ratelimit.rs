//! A token bucket for client-side rate limiting.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Allows `qps` requests per second on average with bursts of up to `burst`.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    /// A full bucket. A `burst` of 0 counts as 1, and a `qps` of zero or less as the smallest
    /// positive rate.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps: qps.max(f64::MIN_POSITIVE),
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Reserves a token and returns how long to wait before using it.
    pub fn reserve(&self) -> Duration {
        let mut s = self.state.lock();
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(s.1).as_secs_f64();
        s.0 = (s.0 + elapsed * self.qps).min(self.burst);
        s.1 = now;
        s.0 -= 1.0;
        if s.0 >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-s.0 / self.qps)
        }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        let d = self.reserve();
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn spreads_requests_beyond_the_burst() {
        let b = TokenBucket::new(10.0, 2);
        assert_eq!(b.reserve(), Duration::ZERO);
        assert_eq!(b.reserve(), Duration::ZERO);
        let d = b.reserve();
        assert!((d.as_secs_f64() - 0.1).abs() < 1e-6, "{d:?}");
        let d = b.reserve();
        assert!((d.as_secs_f64() - 0.2).abs() < 1e-6, "{d:?}");
    }
}
