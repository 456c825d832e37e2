//! Fault injection for tests: a server started with `--enable-fault-injection` serves
//! [`FAULTS_PATH`], through which a test harness (`setpoint chaos`) makes the server misbehave
//! the way a real one does at its worst, without killing it:
//!
//! - every open watch ends at once, its connection cut as a restarting server's would be;
//! - the next watches (a number of them, or all for a while) that name a resourceVersion are
//!   answered `410 Expired` ("too old resource version"), as after a compaction or a restart
//!   whose watch cache no longer reaches that far back;
//! - every request waits a given latency before it is handled, for a while.
//!
//! Without the flag the endpoint does not exist (404) and nothing here runs. With it but no
//! fault active, a request pays one atomic load. The endpoint is a non-resource URL that no
//! bootstrap role grants: only cluster-admin (`*` on non-resource URLs) may use it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{Method, StatusCode};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use setpoint_api::ApiError;
use tokio::sync::watch;
use tokio::time::Instant;

/// The endpoint: `POST` injects (a [`FaultRequest`]), `GET` reads what is active, `DELETE`
/// ends every fault; each answers the [`FaultState`] after it.
pub const FAULTS_PATH: &str = "/debug/setpoint/faults";

/// The longest latency one request may be given.
pub const MAX_LATENCY: Duration = Duration::from_secs(30);
/// The longest a fault may last.
pub const MAX_FAULT_DURATION: Duration = Duration::from_secs(3600);

/// What a `POST` injects; each part is optional and replaces the same fault if active.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultRequest {
    /// End every open watch now.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drop_watches: bool,
    /// Answer watches that name a resourceVersion with 410 Expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_watches: Option<Expiry>,
    /// Delay every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
}

/// Which watches get 410: the next `count`, or all for `seconds` (exactly one of the two).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Expiry {
    /// The next this many watches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Every watch for this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<u64>,
}

/// `milliseconds` added to every request for `seconds`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Latency {
    /// The delay of each request.
    pub milliseconds: u64,
    /// How long the latency stays.
    pub seconds: u64,
}

/// What is active, as the endpoint answers it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultState {
    /// Watches this request ended (a `POST` with `dropWatches`; 0 otherwise).
    pub watches_dropped: u64,
    /// Watches still to be answered 410, when a count was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiring_watches: Option<u64>,
    /// Milliseconds for which every watch is answered 410, when a duration was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiring_for_ms: Option<u64>,
    /// The latency added to each request, while active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u64>,
    /// Milliseconds the latency stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_for_ms: Option<u64>,
}

/// A request refused: the message of its 400.
fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(format!("fault injection: {}", message.into()))
}

impl FaultRequest {
    /// Checks the request's bounds: what is asked for must be possible and bounded.
    pub fn validate(&self) -> Result<(), ApiError> {
        let max_seconds = MAX_FAULT_DURATION.as_secs();
        if let Some(e) = self.expire_watches {
            match (e.count, e.seconds) {
                (Some(0), None) | (None, Some(0)) => {
                    return Err(invalid("expireWatches: count or seconds must be positive"))
                }
                (Some(_), None) => {}
                (None, Some(s)) if s <= max_seconds => {}
                (None, Some(_)) => {
                    return Err(invalid(format!(
                        "expireWatches.seconds: at most {max_seconds}"
                    )))
                }
                _ => {
                    return Err(invalid(
                        "expireWatches: exactly one of count and seconds is required",
                    ))
                }
            }
        }
        if let Some(l) = self.latency {
            if l.milliseconds == 0 || l.seconds == 0 {
                return Err(invalid(
                    "latency: milliseconds and seconds must be positive",
                ));
            }
            if l.milliseconds > MAX_LATENCY.as_millis() as u64 {
                return Err(invalid(format!(
                    "latency.milliseconds: at most {}",
                    MAX_LATENCY.as_millis()
                )));
            }
            if l.seconds > max_seconds {
                return Err(invalid(format!("latency.seconds: at most {max_seconds}")));
            }
        }
        Ok(())
    }
}

/// The faults active now.
#[derive(Debug, Default)]
struct Active {
    expire_count: u64,
    expire_until: Option<Instant>,
    latency: Duration,
    latency_until: Option<Instant>,
}

impl Active {
    /// Forgets what has run out by `now`.
    fn expire(&mut self, now: Instant) {
        if self.expire_until.is_some_and(|t| t <= now) {
            self.expire_until = None;
        }
        if self.latency_until.is_some_and(|t| t <= now) {
            self.latency_until = None;
            self.latency = Duration::ZERO;
        }
    }

    fn any(&self) -> bool {
        self.expire_count > 0 || self.expire_until.is_some() || self.latency_until.is_some()
    }

    fn state(&self, now: Instant, dropped: u64) -> FaultState {
        let left = |t: Instant| t.saturating_duration_since(now).as_millis() as u64;
        FaultState {
            watches_dropped: dropped,
            expiring_watches: (self.expire_count > 0).then_some(self.expire_count),
            expiring_for_ms: self.expire_until.map(left),
            latency_ms: self.latency_until.map(|_| self.latency.as_millis() as u64),
            latency_for_ms: self.latency_until.map(left),
        }
    }
}

/// The switch a server with fault injection enabled holds.
#[derive(Debug)]
pub struct Faults {
    /// Whether a latency or an expiry may be active: the hot path's only check.
    active: AtomicBool,
    state: Mutex<Active>,
    /// Bumped by each drop: every watch that subscribed before ends.
    drops: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            active: AtomicBool::new(false),
            state: Mutex::new(Active::default()),
            drops: watch::channel(0).0,
        }
    }
}

impl Faults {
    /// Applies a validated request.
    pub fn inject(&self, request: &FaultRequest) -> FaultState {
        let now = Instant::now();
        let dropped = if request.drop_watches {
            // Every open watch holds a receiver; the count is how many the send reaches.
            let open = self.drops.receiver_count() as u64;
            self.drops.send_modify(|n| *n += 1);
            open
        } else {
            0
        };
        let mut s = self.state.lock();
        if let Some(e) = request.expire_watches {
            s.expire_count = e.count.unwrap_or(0);
            s.expire_until = e.seconds.map(|secs| now + Duration::from_secs(secs));
        }
        if let Some(l) = request.latency {
            s.latency = Duration::from_millis(l.milliseconds);
            s.latency_until = Some(now + Duration::from_secs(l.seconds));
        }
        self.active.store(s.any(), Ordering::Release);
        s.state(now, dropped)
    }

    /// What is active now.
    pub fn state(&self) -> FaultState {
        let now = Instant::now();
        let mut s = self.state.lock();
        s.expire(now);
        s.state(now, 0)
    }

    /// Ends every fault (watches already dropped stay dropped).
    pub fn clear(&self) -> FaultState {
        let mut s = self.state.lock();
        *s = Active::default();
        self.active.store(false, Ordering::Release);
        s.state(Instant::now(), 0)
    }

    /// Runs `f` on the active faults, when any may be.
    fn with_active<T>(&self, f: impl FnOnce(&mut Active, Instant) -> T) -> Option<T> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let now = Instant::now();
        let mut s = self.state.lock();
        s.expire(now);
        let out = f(&mut s, now);
        if !s.any() {
            self.active.store(false, Ordering::Release);
        }
        Some(out)
    }

    /// Waits out the injected latency, if any is active.
    pub async fn delay(&self) {
        let latency = self.with_active(|s, _| s.latency).filter(|l| !l.is_zero());
        if let Some(l) = latency {
            tokio::time::sleep(l).await;
        }
    }

    /// Whether this watch (one that names a resourceVersion) is to be answered 410; counts
    /// it against a number given.
    pub fn expire_watch(&self) -> bool {
        self.with_active(|s, _| {
            if s.expire_until.is_some() {
                true
            } else if s.expire_count > 0 {
                s.expire_count -= 1;
                true
            } else {
                false
            }
        })
        .unwrap_or(false)
    }

    /// `body` that ends, with an error that cuts its connection (or HTTP/2 stream), at the
    /// next drop.
    pub fn droppable<S>(
        &self,
        body: S,
    ) -> impl Stream<Item = Result<Bytes, WatchDropped>> + Send + 'static
    where
        S: Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + Unpin + 'static,
    {
        let mut drops = self.drops.subscribe();
        let dropped = Box::pin(async move {
            // An error means the server is gone: the watch ends either way.
            let _ = drops.changed().await;
        });
        futures::stream::unfold((body, Some(dropped)), |(mut body, dropped)| async move {
            let mut dropped = dropped?;
            tokio::select! {
                biased;
                _ = &mut dropped => Some((Err(WatchDropped), (body, None))),
                line = body.next() => {
                    let line = line?;
                    Some((line.map_err(|e| match e {}), (body, Some(dropped))))
                }
            }
        })
    }
}

/// The error a dropped watch's body ends with: the server cuts the response off.
#[derive(Debug, thiserror::Error)]
#[error("watch dropped by fault injection")]
pub struct WatchDropped;

/// Serves [`FAULTS_PATH`] (already authorized); `None` for other paths, and for every path
/// when fault injection is off, so the endpoint does not exist then.
pub(crate) fn serve(
    faults: Option<&Faults>,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Option<Result<(StatusCode, FaultState), ApiError>> {
    if path != FAULTS_PATH {
        return None;
    }
    let faults = faults?;
    Some(match *method {
        Method::GET => Ok((StatusCode::OK, faults.state())),
        Method::DELETE => Ok((StatusCode::OK, faults.clear())),
        Method::POST => serde_json::from_slice::<FaultRequest>(body)
            .map_err(|e| invalid(e.to_string()))
            .and_then(|r| {
                r.validate()?;
                tracing::warn!(request = ?r, "injecting faults");
                Ok((StatusCode::OK, faults.inject(&r)))
            }),
        _ => Err(ApiError::method_not_allowed()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: &str) -> Result<FaultRequest, ApiError> {
        let r: FaultRequest = serde_json::from_str(json).map_err(|e| invalid(e.to_string()))?;
        r.validate()?;
        Ok(r)
    }

    #[test]
    fn requests_are_bounded_and_unambiguous() {
        assert!(request(r#"{"dropWatches":true}"#).is_ok());
        assert!(request(r#"{"expireWatches":{"count":3}}"#).is_ok());
        assert!(request(r#"{"expireWatches":{"seconds":3}}"#).is_ok());
        for bad in [
            r#"{"expireWatches":{"count":3,"seconds":1}}"#,
            r#"{"expireWatches":{}}"#,
            r#"{"expireWatches":{"count":0}}"#,
            r#"{"latency":{"milliseconds":100}}"#,
            r#"{"latency":{"milliseconds":100,"seconds":0}}"#,
            r#"{"latency":{"milliseconds":30001,"seconds":1}}"#,
            r#"{"latency":{"milliseconds":1,"seconds":3601}}"#,
            r#"{"dropWatch":true}"#,
        ] {
            let e = request(bad).expect_err(bad);
            assert_eq!(e.code, 400, "{bad}");
            assert!(e.message.starts_with("fault injection: "), "{bad}: {e:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn counted_expiries_run_out_and_timed_faults_end() {
        let f = Faults::default();
        assert!(!f.expire_watch(), "nothing injected");
        f.inject(&request(r#"{"expireWatches":{"count":2}}"#).unwrap());
        assert!(f.expire_watch());
        assert!(f.expire_watch());
        assert!(!f.expire_watch());
        assert!(!f.active.load(Ordering::Acquire), "back to the cheap path");
        let s = f.inject(&request(r#"{"latency":{"milliseconds":50,"seconds":2}}"#).unwrap());
        assert_eq!(s.latency_ms, Some(50));
        let t = Instant::now();
        f.delay().await;
        assert_eq!(t.elapsed(), Duration::from_millis(50));
        tokio::time::advance(Duration::from_secs(2)).await;
        let t = Instant::now();
        f.delay().await;
        assert_eq!(t.elapsed(), Duration::ZERO);
        assert_eq!(f.state(), FaultState::default());
        f.inject(&request(r#"{"expireWatches":{"seconds":1}}"#).unwrap());
        assert!(f.expire_watch() && f.expire_watch());
        f.clear();
        assert!(!f.expire_watch());
    }

    #[tokio::test]
    async fn a_drop_ends_the_watches_open_then() {
        let f = Faults::default();
        let (_tx, rx) =
            futures::channel::mpsc::unbounded::<Result<Bytes, std::convert::Infallible>>();
        let mut open = Box::pin(f.droppable(rx));
        let s = f.inject(&FaultRequest {
            drop_watches: true,
            ..Default::default()
        });
        assert_eq!(s.watches_dropped, 1);
        assert!(matches!(open.next().await, Some(Err(WatchDropped))));
        assert!(open.next().await.is_none());
    }
}
