//! The work queue every controller pulls keys from: de-duplicating, one worker per key,
//! per-key exponential backoff plus an overall token bucket, timed requeues, graceful
//! shutdown and optional Prometheus metrics.
//!
//! Informer events only say "key K changed"; the queue turns a storm of such hints into at
//! most one pending reconcile per key, and guarantees a key is never reconciled by two
//! workers at once.
//!
//! ```
//! use std::time::Duration;
//! use setpoint_runtime::workqueue::WorkQueue;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let queue: WorkQueue<String> = WorkQueue::builder("replicaset")
//!     .backoff(Duration::from_millis(5), Duration::from_secs(1000))
//!     .rate_limit(10.0, 100)
//!     .build();
//!
//! // Event handlers add keys; duplicates collapse into one.
//! queue.add("default/web".to_string());
//! queue.add("default/web".to_string());
//!
//! // A worker loop. Dropping the item releases the key, so it cannot be leaked by an
//! // early return or a `?`.
//! let worker = {
//!     let queue = queue.clone();
//!     tokio::spawn(async move {
//!         let mut reconciled = 0;
//!         while let Some(item) = queue.get().await {
//!             let ok = !item.key().is_empty(); // reconcile(item.key()) goes here
//!             reconciled += 1;
//!             if ok {
//!                 item.forget(); // success resets the key's backoff
//!                 item.done();
//!             } else {
//!                 item.retry(); // try again after the key's backoff
//!             }
//!         }
//!         reconciled
//!     })
//! };
//!
//! tokio::time::sleep(Duration::from_millis(10)).await;
//! queue.shutdown_with_drain().await;
//! assert_eq!(worker.await.unwrap(), 1);
//! # });
//! ```
//!
//! # Semantics
//!
//! - **Dedup**: a key is queued at most once. Adding a key that is in flight marks it to
//!   run again right after its worker releases it; it is never handed to a second worker
//!   meanwhile.
//! - **Backoff**: [`WorkQueue::add_rate_limited`] (or [`WorkItem::retry`]) counts a failure
//!   and schedules the key `base * 2^(failures before this one)` later (5 ms, 10 ms, 20 ms,
//!   … capped at 1000 s by default), or later still if the token bucket says so.
//!   [`WorkQueue::forget`] resets the count on success. A scheduled retry is a floor: a
//!   plain [`add`](WorkQueue::add) or an [`add_after`](WorkQueue::add_after) for a key
//!   waiting out its backoff changes nothing (it neither runs the key earlier nor counts
//!   as a failure). This deliberately differs from client-go, where an event runs the key
//!   at once: a failing object that keeps changing must not be hammered. A reconcile is
//!   level-triggered, so the retry sees every change the skipped events announced.
//! - **Timed requeues**: [`WorkQueue::add_after`] queues the key after a delay; if it is
//!   already queued, in flight and marked to rerun, or scheduled earlier, the earlier
//!   time wins. A plain `add` supersedes such a timer (an event means "look now").
//! - **Token bucket**: shared by all keys of the queue, consulted by every rate-limited
//!   add (10 qps, burst 100 by default; [`WorkQueueBuilder::no_rate_limit`] turns it off).
//!   The delay is the larger of the key's backoff and the bucket's wait.
//! - **Shutdown**: [`WorkQueue::shutdown`] stops the queue at once: keys waiting in it or
//!   on a timer are dropped (a controller that stops relists on its next start, so nothing
//!   is lost), later adds are ignored, and every pending and future
//!   [`get`](WorkQueue::get) returns `None`. Workers finish the item they hold.
//!   [`WorkQueue::shutdown_with_drain`] does the same and then waits until every item in
//!   flight has been released.
//! - **Memory**: a key takes memory only while it is queued, scheduled, in flight, or has
//!   a failure count that has not been forgotten.
//! - **Time** comes from `tokio::time`, so tests run under a paused clock. There is no
//!   background task: workers waiting in `get` sleep until the earliest timer, and timers
//!   that fall due while every worker is busy are picked up by the next `get` (with their
//!   original time, so queue-duration metrics stay exact).

mod metrics;
mod rate_limit;
mod state;

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::pin::pin;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::{Duration, Instant};

pub use self::metrics::WorkQueueMetrics;
use self::metrics::{Probe, Sample};
use self::rate_limit::{Backoff, TokenBucket};
use self::state::{State, Wake};

/// Default base of the per-key exponential backoff.
pub const DEFAULT_BASE_DELAY: Duration = Duration::from_millis(5);
/// Default cap of the per-key exponential backoff.
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(1000);
/// Default refill rate of the queue-wide token bucket, in rate-limited adds per second.
pub const DEFAULT_QPS: f64 = 10.0;
/// Default size of the queue-wide token bucket.
pub const DEFAULT_BURST: u32 = 100;

/// What a queue key must be. Blanket-implemented; controllers use an object key.
pub trait QueueKey: Clone + Eq + Hash + Send + Sync + fmt::Debug + 'static {}

impl<T: Clone + Eq + Hash + Send + Sync + fmt::Debug + 'static> QueueKey for T {}

/// Configures and builds a [`WorkQueue`]. Start from [`WorkQueue::builder`].
pub struct WorkQueueBuilder<K> {
    name: String,
    backoff: Backoff,
    rate_limit: Option<(f64, u32)>,
    metrics: Option<WorkQueueMetrics>,
    // The key type is fixed by the builder so that `WorkQueue::builder(..)` infers it
    // from how the built queue is used.
    _key: PhantomData<fn() -> K>,
}

// Manual impls: derives would demand `K: Clone`/`K: Debug`, which the builder never needs.
impl<K> Clone for WorkQueueBuilder<K> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            backoff: self.backoff,
            rate_limit: self.rate_limit,
            metrics: self.metrics.clone(),
            _key: PhantomData,
        }
    }
}

impl<K> fmt::Debug for WorkQueueBuilder<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkQueueBuilder")
            .field("name", &self.name)
            .field("backoff", &self.backoff)
            .field("rate_limit", &self.rate_limit)
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}

impl<K: QueueKey> WorkQueueBuilder<K> {
    /// Starts with the defaults: backoff 5 ms doubling to 1000 s, token bucket 10 qps
    /// with a burst of 100, no metrics. `name` labels the queue's metrics.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            backoff: Backoff {
                base: DEFAULT_BASE_DELAY,
                max: DEFAULT_MAX_DELAY,
            },
            rate_limit: Some((DEFAULT_QPS, DEFAULT_BURST)),
            metrics: None,
            _key: PhantomData,
        }
    }

    /// Per-key backoff: the first retry waits `base`, each further consecutive failure
    /// doubles it, never beyond `max`.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = Backoff { base, max };
        self
    }

    /// The queue-wide token bucket: `burst` rate-limited adds at once, then `qps` per
    /// second.
    ///
    /// # Panics
    ///
    /// If `qps` is not a positive finite number or `burst` is 0.
    pub fn rate_limit(mut self, qps: f64, burst: u32) -> Self {
        // Validate here, where the caller's mistake is, rather than at `build`.
        let _ = TokenBucket::new(qps, burst);
        self.rate_limit = Some((qps, burst));
        self
    }

    /// No queue-wide limit: rate-limited adds wait only for the per-key backoff.
    pub fn no_rate_limit(mut self) -> Self {
        self.rate_limit = None;
        self
    }

    /// Records this queue's metrics, labelled with its name, in `metrics`.
    pub fn metrics(mut self, metrics: &WorkQueueMetrics) -> Self {
        self.metrics = Some(metrics.clone());
        self
    }

    /// Builds the queue. It needs no runtime until it is used.
    pub fn build(self) -> WorkQueue<K> {
        let bucket = self
            .rate_limit
            .map(|(qps, burst)| TokenBucket::new(qps, burst));
        let queue_metrics = self.metrics.as_ref().map(|m| m.for_queue(&self.name));
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(self.backoff, bucket, queue_metrics)),
            notify: Notify::new(),
            drained: Notify::new(),
            name: self.name,
        });
        if let Some(m) = &self.metrics {
            let weak: Weak<Shared<K>> = Arc::downgrade(&shared);
            m.attach(&shared.name, weak);
        }
        WorkQueue { shared }
    }
}

/// A work queue handle. Clones share the queue.
pub struct WorkQueue<K: QueueKey> {
    shared: Arc<Shared<K>>,
}

impl<K: QueueKey> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K: QueueKey> fmt::Debug for WorkQueue<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.state.lock();
        f.debug_struct("WorkQueue")
            .field("name", &self.shared.name)
            .field("ready", &st.ready_len())
            .field("in_flight", &st.in_flight())
            .field("shutting_down", &st.is_shutting_down())
            .finish()
    }
}

impl<K: QueueKey> WorkQueue<K> {
    /// A queue with the default backoff (5 ms doubling to 1000 s) and token bucket
    /// (10 qps, burst 100), without metrics.
    pub fn new(name: impl Into<String>) -> Self {
        Self::builder(name).build()
    }

    /// Records this queue's metrics in `metrics` from now on (instead of where its builder
    /// said), labelled with its name.
    pub fn record_metrics(&self, metrics: &WorkQueueMetrics) {
        self.shared
            .state
            .lock()
            .set_metrics(Some(metrics.for_queue(&self.shared.name)));
        let weak: Weak<Shared<K>> = Arc::downgrade(&self.shared);
        metrics.attach(&self.shared.name, weak);
    }

    /// Starts configuring a queue; `name` labels its metrics.
    pub fn builder(name: impl Into<String>) -> WorkQueueBuilder<K> {
        WorkQueueBuilder::new(name)
    }

    /// The name the queue was built with.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Queues `key` now, unless it is already queued or waiting out a failure backoff (see
    /// the module docs). A key in flight runs again after its worker releases it. Ignored
    /// after shutdown.
    pub fn add(&self, key: K) {
        self.shared.with(|st| st.add(key, Instant::now()));
    }

    /// Queues `key` after `delay` (a timed re-check); an earlier pending time wins. A zero
    /// delay is a plain [`add`](Self::add). Ignored after shutdown.
    pub fn add_after(&self, key: K, delay: Duration) {
        self.shared
            .with(|st| st.add_after(key, delay, Instant::now()));
    }

    /// Records a failure of `key` and queues it after its backoff (or the token bucket's
    /// delay, whichever is longer). Ignored after shutdown.
    pub fn add_rate_limited(&self, key: K) {
        self.shared
            .with(|st| st.add_rate_limited(key, Instant::now()));
    }

    /// Resets the failure count of `key`, so its next backoff starts from the base. Call
    /// it when the key was processed successfully. An already scheduled retry keeps its
    /// time.
    pub fn forget(&self, key: &K) {
        self.shared.with(|st| st.forget(key));
    }

    /// How many failures of `key` have been recorded since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.shared.state.lock().num_requeues(key)
    }

    /// Waits for a key and hands it out, or returns `None` once the queue is shutting
    /// down. The key stays reserved for the returned [`WorkItem`] until it is released.
    ///
    /// Cancel-safe: dropping the future never loses a key or a wake-up.
    pub async fn get(&self) -> Option<WorkItem<K>> {
        loop {
            // Register for wake-ups before looking at the state, so an add that lands
            // between the look and the wait still wakes us.
            let mut notified = pin!(self.shared.notify.notified());
            notified.as_mut().enable();
            let step = self.shared.with(|st| {
                if st.is_shutting_down() {
                    return Step::Closed;
                }
                let now = Instant::now();
                st.promote_due(now);
                match st.pop_ready(now) {
                    Some((key, id)) => Step::Item(key, id),
                    None => Step::Wait(st.next_deadline()),
                }
            });
            match step {
                Step::Closed => return None,
                Step::Item(key, id) => return Some(WorkItem::new(&self.shared, key, id)),
                Step::Wait(None) => notified.await,
                Step::Wait(Some(deadline)) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
            }
        }
    }

    /// Hands out a key if one is ready now, without waiting. `None` when nothing is ready
    /// or the queue is shutting down.
    pub fn try_get(&self) -> Option<WorkItem<K>> {
        let (key, id) = self.shared.with(|st| {
            if st.is_shutting_down() {
                return None;
            }
            let now = Instant::now();
            st.promote_due(now);
            st.pop_ready(now)
        })?;
        Some(WorkItem::new(&self.shared, key, id))
    }

    /// Keys ready to be handed out: queued (including those whose timer is due), not in
    /// flight and not waiting for a timer.
    pub fn len(&self) -> usize {
        self.shared.with(|st| {
            st.promote_due(Instant::now());
            st.ready_len()
        })
    }

    /// Whether no key is ready to be handed out (see [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys currently held by workers.
    pub fn in_flight(&self) -> usize {
        self.shared.state.lock().in_flight()
    }

    /// Stops the queue: drops the keys that are queued or scheduled, ignores later adds,
    /// and makes every waiting and future [`get`](Self::get) return `None`. Items in flight
    /// can still be released normally. Idempotent.
    pub fn shutdown(&self) {
        self.shared.with(|st| st.shutdown());
    }

    /// [`shutdown`](Self::shutdown), then waits until every item in flight has been
    /// released (its worker finished it). Wrap it in `tokio::time::timeout` to bound the
    /// wait. Cancel-safe: dropping the future leaves the queue shut down.
    pub async fn shutdown_with_drain(&self) {
        self.shutdown();
        loop {
            let mut drained = pin!(self.shared.drained.notified());
            drained.as_mut().enable();
            if self.shared.state.lock().in_flight() == 0 {
                return;
            }
            drained.await;
        }
    }

    /// Whether [`shutdown`](Self::shutdown) has been called.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.state.lock().is_shutting_down()
    }
}

enum Step<K> {
    Closed,
    Item(K, u64),
    Wait(Option<Instant>),
}

struct Shared<K> {
    name: String,
    state: Mutex<State<K>>,
    /// Wakes workers waiting in `get`: one per key that became ready, all of them when the
    /// earliest timer moves earlier or the queue shuts down.
    notify: Notify,
    /// Wakes `shutdown_with_drain` when the last item in flight is released.
    drained: Notify,
}

impl<K: QueueKey> Shared<K> {
    /// Runs `f` under the lock, then sends the wake-ups it asked for once the lock is
    /// released (woken tasks would otherwise contend for it at once).
    fn with<R>(&self, f: impl FnOnce(&mut State<K>) -> R) -> R {
        let (out, wake) = {
            let mut st = self.state.lock();
            let out = f(&mut st);
            (out, st.take_wake())
        };
        self.wake(wake);
        out
    }

    fn wake(&self, wake: Wake) {
        if wake.all {
            self.notify.notify_waiters();
        } else {
            // Extra calls only leave one stored permit (a spurious wake-up later), so
            // there is no need to know how many workers are waiting.
            for _ in 0..wake.ready {
                self.notify.notify_one();
            }
        }
        if wake.drained {
            self.drained.notify_waiters();
        }
    }
}

impl<K: QueueKey> Probe for Shared<K> {
    fn sample(&self) -> Sample {
        self.with(|st| st.sample(Instant::now()))
    }
}

/// A key handed out by [`WorkQueue::get`]. While it lives, no other worker gets the same
/// key. Releasing it — by [`done`](Self::done), [`retry`](Self::retry),
/// [`requeue_after`](Self::requeue_after) or simply dropping it — lets the key run again
/// if it was added meanwhile.
#[must_use = "dropping a work item releases its key at once"]
pub struct WorkItem<K: QueueKey> {
    shared: Arc<Shared<K>>,
    key: K,
    id: u64,
    release: Release,
}

/// What to do, atomically with releasing the key.
#[derive(Clone, Copy, Debug)]
enum Release {
    Done,
    Retry,
    After(Duration),
}

impl<K: QueueKey> WorkItem<K> {
    fn new(shared: &Arc<Shared<K>>, key: K, id: u64) -> Self {
        Self {
            shared: Arc::clone(shared),
            key,
            id,
            release: Release::Done,
        }
    }

    /// The key to process.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// Failures recorded for this key since it was last forgotten.
    pub fn num_requeues(&self) -> u32 {
        self.shared.state.lock().num_requeues(&self.key)
    }

    /// Resets this key's failure count (call on success). The key stays held.
    pub fn forget(&self) {
        self.shared.with(|st| st.forget(&self.key));
    }

    /// Releases the key. Same as dropping the item, but says so.
    pub fn done(self) {}

    /// Releases the key and schedules it again after its backoff, counting a failure
    /// (as [`WorkQueue::add_rate_limited`], but atomic with the release, so an add that
    /// arrives in between cannot slip in ahead of the backoff).
    pub fn retry(mut self) {
        self.release = Release::Retry;
    }

    /// Releases the key and queues it again after `delay` (as [`WorkQueue::add_after`]).
    pub fn requeue_after(mut self, delay: Duration) {
        self.release = Release::After(delay);
    }
}

impl<K: QueueKey> Drop for WorkItem<K> {
    fn drop(&mut self) {
        let release = self.release;
        let key = &self.key;
        let id = self.id;
        self.shared.with(|st| {
            let now = Instant::now();
            // Scheduling before releasing means the key is never briefly free of both its
            // worker and its retry time.
            match release {
                Release::Done => {}
                Release::Retry => st.add_rate_limited(key.clone(), now),
                Release::After(delay) => st.add_after(key.clone(), delay, now),
            }
            st.done(key, id, now);
        });
    }
}

impl<K: QueueKey> fmt::Debug for WorkItem<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkItem")
            .field("queue", &self.shared.name)
            .field("key", &self.key)
            .finish()
    }
}
