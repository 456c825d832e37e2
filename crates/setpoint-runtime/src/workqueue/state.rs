//! The queue's bookkeeping, kept free of async so every rule is a plain state transition.
//!
//! Each tracked key has one [`Entry`]. A key is in at most one of: the ready FIFO, the timer
//! heap, or neither; independently it may be in flight (held by a worker) and, while in
//! flight, `dirty` (run it again as soon as it is released). Both the FIFO and the heap are
//! invalidated lazily: an entry records the sequence number of its live slot, and slots whose
//! number no longer matches are skipped when they surface (and compacted away if they pile
//! up), so moving a key never needs a search.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::Hash;

use tokio::time::{Duration, Instant};

use super::metrics::{QueueMetrics, Sample};
use super::rate_limit::{Backoff, TokenBucket};

/// Stale slots tolerated before compaction; below this, skipping them is cheaper.
const COMPACT_SLACK: usize = 64;

/// How far away "never" is for an `add_after` whose delay overflows `Instant`.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    /// Not queued and not scheduled.
    None,
    /// In the ready FIFO at the slot numbered `seq`.
    Ready { seq: u64 },
    /// In the timer heap at the slot numbered `seq`. `backoff` marks a retry after a
    /// failure: such a time is a floor that plain adds do not bring forward.
    Timer {
        at: Instant,
        seq: u64,
        backoff: bool,
    },
}

#[derive(Debug)]
struct Entry {
    pending: Pending,
    in_flight: bool,
    /// Added while in flight: queue it again on release. Only set while in flight, and
    /// never together with a pending timer (the earlier of the two wins when they meet).
    dirty: bool,
    /// When the key last became ready (or dirty), for the queue-duration histogram.
    since: Instant,
    /// Consecutive failures, the exponent of the next backoff.
    failures: u32,
}

impl Entry {
    fn new(now: Instant) -> Self {
        Self {
            pending: Pending::None,
            in_flight: false,
            dirty: false,
            since: now,
            failures: 0,
        }
    }

    /// Nothing left to remember: the entry can go (keeps memory bounded by live keys).
    fn is_idle(&self) -> bool {
        !self.in_flight && self.pending == Pending::None && self.failures == 0
    }
}

#[derive(Debug)]
struct Timer<K> {
    at: Instant,
    seq: u64,
    key: K,
}

// The heap orders timers by (at, seq) only, reversed so that `BinaryHeap` (a max-heap)
// yields the earliest first; seq breaks ties in scheduling order. Keys need no `Ord`.
impl<K> PartialEq for Timer<K> {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.seq == other.seq
    }
}
impl<K> Eq for Timer<K> {}
impl<K> PartialOrd for Timer<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Timer<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Which waiters to wake once the lock is released.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Wake {
    /// Keys that became ready: wake that many waiting workers.
    pub(crate) ready: usize,
    /// The earliest timer moved earlier (or the queue shut down): every waiter must
    /// re-read its deadline.
    pub(crate) all: bool,
    /// Shutting down and the last in-flight key was released.
    pub(crate) drained: bool,
}

/// The FIFO, the timer heap and their counters; separate from the entry map so both can
/// be borrowed mutably at once.
#[derive(Debug)]
struct Slots<K> {
    ready: VecDeque<(K, u64)>,
    /// Live slots in `ready` (the rest are stale).
    ready_len: usize,
    timers: BinaryHeap<Timer<K>>,
    /// Live slots in `timers`.
    live_timers: usize,
    seq: u64,
    wake: Wake,
    metrics: Option<QueueMetrics>,
}

impl<K: Clone> Slots<K> {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Drops whatever slot the entry holds (the slot itself goes stale).
    fn vacate(&mut self, e: &mut Entry) {
        match e.pending {
            Pending::None => {}
            Pending::Ready { .. } => self.ready_len -= 1,
            Pending::Timer { .. } => self.live_timers -= 1,
        }
        e.pending = Pending::None;
    }

    fn push_ready(&mut self, key: &K, e: &mut Entry, since: Instant) {
        self.vacate(e);
        let seq = self.next_seq();
        e.pending = Pending::Ready { seq };
        e.since = since;
        self.ready.push_back((key.clone(), seq));
        self.ready_len += 1;
        self.wake.ready += 1;
    }

    fn schedule(&mut self, key: &K, e: &mut Entry, at: Instant, backoff: bool) {
        self.vacate(e);
        let seq = self.next_seq();
        // Waiters sleep until the heap's top; a new earlier top must wake them to re-read
        // it. (A stale top is never later than the true earliest, so comparing against
        // it can only wake too often, never too rarely.)
        if self.timers.peek().is_none_or(|top| at < top.at) {
            self.wake.all = true;
        }
        e.pending = Pending::Timer { at, seq, backoff };
        self.timers.push(Timer {
            at,
            seq,
            key: key.clone(),
        });
        self.live_timers += 1;
    }

    fn count_add(&self) {
        if let Some(m) = &self.metrics {
            m.adds.inc();
        }
    }

    fn count_retry(&self) {
        if let Some(m) = &self.metrics {
            m.retries.inc();
        }
    }
}

/// Everything behind the queue's lock.
#[derive(Debug)]
pub(crate) struct State<K> {
    entries: HashMap<K, Entry>,
    slots: Slots<K>,
    /// Start time of every item in flight, by item id.
    processing: HashMap<u64, Instant>,
    shutting_down: bool,
    backoff: Backoff,
    bucket: Option<TokenBucket>,
}

impl<K: Clone + Eq + Hash> State<K> {
    /// Where the queue records its counters and histograms from now on.
    pub(crate) fn set_metrics(&mut self, metrics: Option<QueueMetrics>) {
        self.slots.metrics = metrics;
    }

    pub(crate) fn new(
        backoff: Backoff,
        bucket: Option<TokenBucket>,
        metrics: Option<QueueMetrics>,
    ) -> Self {
        Self {
            entries: HashMap::new(),
            slots: Slots {
                ready: VecDeque::new(),
                ready_len: 0,
                timers: BinaryHeap::new(),
                live_timers: 0,
                seq: 0,
                wake: Wake::default(),
                metrics,
            },
            processing: HashMap::new(),
            shutting_down: false,
            backoff,
            bucket,
        }
    }

    pub(crate) fn take_wake(&mut self) -> Wake {
        std::mem::take(&mut self.slots.wake)
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Keys ready to be handed out now.
    pub(crate) fn ready_len(&self) -> usize {
        self.slots.ready_len
    }

    /// Keys held by workers.
    pub(crate) fn in_flight(&self) -> usize {
        self.processing.len()
    }

    pub(crate) fn num_requeues(&self, key: &K) -> u32 {
        self.entries.get(key).map_or(0, |e| e.failures)
    }

    /// A plain add ("this key changed"). Queues the key now unless it is already queued,
    /// or waiting out a failure backoff (which it must neither shorten nor lengthen); a
    /// pending `add_after` timer is superseded by running now. A key in flight is marked
    /// to run again after release instead.
    pub(crate) fn add(&mut self, key: K, now: Instant) {
        if self.shutting_down {
            return;
        }
        let slots = &mut self.slots;
        let e = self
            .entries
            .entry(key.clone())
            .or_insert_with(|| Entry::new(now));
        match e.pending {
            Pending::Ready { .. } | Pending::Timer { backoff: true, .. } => {}
            Pending::None | Pending::Timer { backoff: false, .. } => {
                if e.in_flight {
                    if !e.dirty {
                        slots.vacate(e);
                        e.dirty = true;
                        e.since = now;
                        slots.count_add();
                    }
                } else {
                    slots.push_ready(&key, e, now);
                    slots.count_add();
                }
            }
        }
        self.maybe_compact();
    }

    /// Queues the key once `delay` has passed, unless it is due earlier anyway (queued,
    /// dirty, scheduled earlier, or waiting out a backoff, whose floor holds).
    pub(crate) fn add_after(&mut self, key: K, delay: Duration, now: Instant) {
        if self.shutting_down {
            return;
        }
        self.slots.count_retry();
        if delay.is_zero() {
            return self.add(key, now);
        }
        let at = now.checked_add(delay).unwrap_or(now + FAR_FUTURE);
        let slots = &mut self.slots;
        let e = self
            .entries
            .entry(key.clone())
            .or_insert_with(|| Entry::new(now));
        match e.pending {
            Pending::Ready { .. } | Pending::Timer { backoff: true, .. } => {}
            Pending::Timer {
                at: current,
                backoff: false,
                ..
            } => {
                if at < current {
                    slots.schedule(&key, e, at, false);
                }
            }
            Pending::None => {
                if !e.dirty {
                    slots.schedule(&key, e, at, false);
                }
            }
        }
        self.maybe_compact();
    }

    /// A failure: counts it and schedules the key after the larger of its exponential
    /// backoff and the token bucket's delay. That time is a floor: it replaces an earlier
    /// ready slot, timer or dirty mark, and only a later backoff moves it.
    pub(crate) fn add_rate_limited(&mut self, key: K, now: Instant) {
        if self.shutting_down {
            return;
        }
        self.slots.count_retry();
        let slots = &mut self.slots;
        let e = self
            .entries
            .entry(key.clone())
            .or_insert_with(|| Entry::new(now));
        let mut delay = self.backoff.delay(e.failures);
        e.failures = e.failures.saturating_add(1);
        if let Some(bucket) = &mut self.bucket {
            delay = delay.max(bucket.reserve(now));
        }
        let at = now.checked_add(delay).unwrap_or(now + FAR_FUTURE);
        match e.pending {
            Pending::Timer {
                at: current,
                backoff: true,
                ..
            } if current >= at => {}
            _ => {
                e.dirty = false;
                slots.schedule(&key, e, at, true);
            }
        }
        self.maybe_compact();
    }

    /// Resets the key's failure count (its next backoff starts from the base again). A
    /// retry already scheduled keeps its time.
    pub(crate) fn forget(&mut self, key: &K) {
        if let Some(e) = self.entries.get_mut(key) {
            e.failures = 0;
            if e.is_idle() {
                self.entries.remove(key);
            }
        }
    }

    /// Moves every timer that is due to the ready FIFO (or marks its key dirty when the key
    /// is in flight). Called lazily by whoever looks at the queue; the time a key became
    /// ready is its timer's time, not the time of this call, so metrics stay exact.
    pub(crate) fn promote_due(&mut self, now: Instant) {
        while let Some(top) = self.slots.timers.peek() {
            if top.at > now {
                break;
            }
            let Some(t) = self.slots.timers.pop() else {
                break;
            };
            let Some(e) = self.entries.get_mut(&t.key) else {
                continue;
            };
            if !matches!(e.pending, Pending::Timer { seq, .. } if seq == t.seq) {
                continue;
            }
            self.slots.vacate(e);
            if e.in_flight {
                e.dirty = true;
                e.since = t.at;
            } else {
                self.slots.push_ready(&t.key, e, t.at);
            }
            self.slots.count_add();
        }
    }

    /// The earliest live timer, dropping stale ones found on top of the heap.
    pub(crate) fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(top) = self.slots.timers.peek() {
            let live = self
                .entries
                .get(&top.key)
                .is_some_and(|e| matches!(e.pending, Pending::Timer { seq, .. } if seq == top.seq));
            if live {
                return Some(top.at);
            }
            self.slots.timers.pop();
        }
        None
    }

    /// Hands the oldest ready key to a worker: returns it with a fresh item id.
    pub(crate) fn pop_ready(&mut self, now: Instant) -> Option<(K, u64)> {
        while let Some((key, seq)) = self.slots.ready.pop_front() {
            let Some(e) = self.entries.get_mut(&key) else {
                continue;
            };
            if e.pending != (Pending::Ready { seq }) {
                continue;
            }
            self.slots.vacate(e);
            e.in_flight = true;
            if let Some(m) = &self.slots.metrics {
                m.queue_duration
                    .observe(now.saturating_duration_since(e.since).as_secs_f64());
            }
            let id = self.slots.next_seq();
            self.processing.insert(id, now);
            return Some((key, id));
        }
        None
    }

    /// A worker releases the key it holds (item `id`): it is queued again at once if it was
    /// added meanwhile, and forgotten entirely if nothing else is pending for it.
    pub(crate) fn done(&mut self, key: &K, id: u64, now: Instant) {
        let Some(started) = self.processing.remove(&id) else {
            return;
        };
        if let Some(m) = &self.slots.metrics {
            m.work_duration
                .observe(now.saturating_duration_since(started).as_secs_f64());
        }
        if let Some(e) = self.entries.get_mut(key) {
            e.in_flight = false;
            if e.dirty {
                e.dirty = false;
                let since = e.since;
                self.slots.push_ready(key, e, since);
            }
            if e.is_idle() {
                self.entries.remove(key);
            }
        }
        if self.shutting_down && self.processing.is_empty() {
            self.slots.wake.drained = true;
        }
    }

    /// Stops the queue: drops every key that is not in flight (queued, scheduled, or only
    /// remembered for its failure count) and ignores adds from now on.
    pub(crate) fn shutdown(&mut self) {
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        self.slots.ready.clear();
        self.slots.ready_len = 0;
        self.slots.timers.clear();
        self.slots.live_timers = 0;
        self.entries.retain(|_, e| e.in_flight);
        for e in self.entries.values_mut() {
            e.pending = Pending::None;
            e.dirty = false;
            e.failures = 0;
        }
        self.slots.wake.all = true;
        if self.processing.is_empty() {
            self.slots.wake.drained = true;
        }
    }

    /// What the scrape-time gauges report.
    pub(crate) fn sample(&mut self, now: Instant) -> Sample {
        self.promote_due(now);
        let mut sample = Sample {
            depth: i64::try_from(self.slots.ready_len).unwrap_or(i64::MAX),
            ..Sample::default()
        };
        for started in self.processing.values() {
            let age = now.saturating_duration_since(*started).as_secs_f64();
            sample.unfinished_seconds += age;
            sample.longest_running_seconds = sample.longest_running_seconds.max(age);
        }
        sample
    }

    /// Rebuilds the FIFO or heap when stale slots outnumber live ones, so a key that is
    /// rescheduled over and over cannot grow them without bound.
    fn maybe_compact(&mut self) {
        let entries = &self.entries;
        let slots = &mut self.slots;
        if slots.ready.len() > 2 * slots.ready_len + COMPACT_SLACK {
            slots.ready.retain(|(key, seq)| {
                entries
                    .get(key)
                    .is_some_and(|e| e.pending == Pending::Ready { seq: *seq })
            });
        }
        if slots.timers.len() > 2 * slots.live_timers + COMPACT_SLACK {
            slots.timers.retain(|t| {
                entries.get(&t.key).is_some_and(
                    |e| matches!(e.pending, Pending::Timer { seq, .. } if seq == t.seq),
                )
            });
        }
    }

    /// Internal sizes, for tests of the memory bound.
    #[cfg(test)]
    fn footprint(&self) -> (usize, usize, usize) {
        (
            self.entries.len(),
            self.slots.ready.len(),
            self.slots.timers.len(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State<&'static str> {
        State::new(
            Backoff {
                base: Duration::from_millis(5),
                max: Duration::from_secs(1000),
            },
            None,
            None,
        )
    }

    #[test]
    fn entries_are_dropped_once_nothing_is_pending() {
        let mut s = state();
        let now = Instant::now();
        for _ in 0..3 {
            s.add("a", now);
        }
        s.add("b", now);
        let (a, id) = s.pop_ready(now).unwrap();
        assert_eq!(a, "a");
        s.done(&a, id, now);
        let (b, id) = s.pop_ready(now).unwrap();
        s.done(&b, id, now);
        assert_eq!(s.footprint(), (0, 0, 0));
    }

    #[test]
    fn failure_count_keeps_an_entry_until_forget() {
        let mut s = state();
        let now = Instant::now();
        s.add_rate_limited("a", now);
        let later = now + Duration::from_millis(5);
        s.promote_due(later);
        let (a, id) = s.pop_ready(later).unwrap();
        s.done(&a, id, later);
        assert_eq!(s.footprint().0, 1);
        assert_eq!(s.num_requeues(&"a"), 1);
        s.forget(&"a");
        assert_eq!(s.footprint(), (0, 0, 0));
    }

    #[test]
    fn rescheduling_one_key_forever_keeps_slots_bounded() {
        let mut s = state();
        let now = Instant::now();
        for i in 0..10_000u64 {
            // Each cycle strands one heap slot (the timer superseded by the add) and one
            // FIFO slot (the ready slot superseded by the backoff).
            s.add_after("a", Duration::from_secs(3600 + i), now);
            s.add("a", now);
            s.add_rate_limited("a", now);
            s.forget(&"a");
            // Let the backoff lapse so the next add is not blocked by its floor.
            let later = now + Duration::from_millis(10);
            s.promote_due(later);
            let (k, id) = s.pop_ready(later).unwrap();
            s.done(&k, id, later);
        }
        let (entries, ready, timers) = s.footprint();
        assert_eq!(entries, 0);
        assert!(ready <= 2 * COMPACT_SLACK, "ready slots: {ready}");
        assert!(timers <= 2 * COMPACT_SLACK, "timer slots: {timers}");
    }

    #[test]
    fn shutdown_keeps_only_in_flight_keys() {
        let mut s = state();
        let now = Instant::now();
        s.add("a", now);
        s.add("b", now);
        s.add_after("c", Duration::from_secs(1), now);
        s.add_rate_limited("d", now);
        let (a, id) = s.pop_ready(now).unwrap();
        s.take_wake();
        s.shutdown();
        assert!(!s.take_wake().drained);
        assert_eq!(s.footprint(), (1, 0, 0));
        s.add("a", now);
        s.done(&a, id, now);
        assert!(s.take_wake().drained);
        assert_eq!(s.footprint(), (0, 0, 0));
        assert_eq!(s.pop_ready(now), None);
    }
}
