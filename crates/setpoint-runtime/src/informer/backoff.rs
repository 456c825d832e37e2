//! The delay between failed list/watch attempts.

use std::time::Duration;

use crate::client::ClientError;

/// Exponential backoff between failed list or watch attempts: `initial`, doubling up to `max`,
/// each delay plus a random extra of up to `jitter` times itself so that many informers that
/// failed together (an API server restart) do not come back together.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// The delay after the first failure.
    pub initial: Duration,
    /// The longest delay, however many failures in a row.
    pub max: Duration,
    /// Fraction of the delay added at random, `0.0..=1.0`.
    pub jitter: f64,
}

impl Default for Backoff {
    /// 800 ms doubling to 30 s, plus up to 50 %: client-go's reflector figures, so a mixed
    /// fleet of controllers treats a struggling server the same way.
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(800),
            max: Duration::from_secs(30),
            jitter: 0.5,
        }
    }
}

/// The running state of a [`Backoff`].
#[derive(Debug)]
pub(crate) struct BackoffState {
    config: Backoff,
    next: Duration,
}

impl BackoffState {
    pub(crate) fn new(config: Backoff) -> Self {
        BackoffState {
            config,
            next: config.initial,
        }
    }

    /// The delay before the next attempt; each call doubles the following one.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.next.min(self.config.max);
        self.next = base.saturating_mul(2).min(self.config.max);
        let jitter = self.config.jitter.clamp(0.0, 1.0);
        base + base.mul_f64(rand::random::<f64>() * jitter)
    }

    /// Back to `initial` (after a successful list or watch).
    pub(crate) fn reset(&mut self) {
        self.next = self.config.initial;
    }

    /// The delay before retrying after `error`: the next doubled one, except after a refused
    /// connection, which waits the first delay (with its jitter) and doubles nothing. Nothing
    /// listens then (a server restarting): retrying costs it nothing, and a doubled delay
    /// would keep the client waiting long after the server is back.
    pub(crate) fn delay_after(&mut self, error: &ClientError) -> Duration {
        if refused(error) {
            let base = self.config.initial.min(self.config.max);
            let jitter = self.config.jitter.clamp(0.0, 1.0);
            return base + base.mul_f64(rand::random::<f64>() * jitter);
        }
        self.next_delay()
    }
}

/// Whether `error` is a connection the server's host refused, or reset while it was being
/// made (a server going down or coming up): the request never reached a server. The
/// transports report the connector's error as text (`ConnectionRefused`, `Connection
/// refused`; a reset as `Error(Connect, … ConnectionReset …)`).
pub(crate) fn refused(error: &ClientError) -> bool {
    match error {
        ClientError::Transport(text) => {
            let text = text.to_ascii_lowercase();
            text.contains("connection refused")
                || text.contains("connectionrefused")
                || (text.contains("error(connect") && text.contains("connectionreset"))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_with_bounded_jitter_and_resets() {
        let mut b = BackoffState::new(Backoff::default());
        let bases = [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000];
        for base in bases {
            let d = b.next_delay();
            let base = Duration::from_millis(base);
            assert!(
                d >= base && d <= base.mul_f64(1.5),
                "{d:?} not in [{base:?}, 1.5×]"
            );
        }
        b.reset();
        assert!(b.next_delay() < Duration::from_millis(1201));
    }

    #[test]
    fn a_refused_connection_is_retried_after_the_first_delay_without_doubling() {
        let mut b = BackoffState::new(Backoff::default());
        let connect = ClientError::Transport(
            "Error { kind: Connect, source: Some(ConnectError(\"tcp connect error\", Os { code: 111, kind: ConnectionRefused, message: \"Connection refused\" })) }".into(),
        );
        for _ in 0..5 {
            let d = b.delay_after(&connect);
            assert!(
                d >= Duration::from_millis(800) && d <= Duration::from_millis(1200),
                "{d:?}"
            );
        }
        // Other failures double as before, from where they were.
        let reset = ClientError::Transport("connection reset by peer".into());
        assert!(b.delay_after(&reset) < Duration::from_millis(1201));
        assert!(b.delay_after(&reset) >= Duration::from_millis(1600));
        let busy = ClientError::Api(setpoint_api::ApiError::new(429, "TooManyRequests", "busy"));
        assert!(!refused(&busy));
        // Reset while connecting (the server going down or coming up): the same.
        assert!(refused(&ClientError::Transport(
            "hyper_util::client::legacy::Error(Connect, ConnectError(\"tcp connect error\", 127.0.0.1:1, Os { code: 104, kind: ConnectionReset, message: \"Connection reset by peer\" }))".into()
        )));
        assert!(refused(&ClientError::Transport(
            "injected: connection refused".into()
        )));
    }

    #[test]
    fn no_jitter_is_exact() {
        let mut b = BackoffState::new(Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(25),
            jitter: 0.0,
        });
        let got: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, [10, 20, 25, 25]);
    }
}
