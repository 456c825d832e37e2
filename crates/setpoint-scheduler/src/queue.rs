//! The scheduling queue: which pending pods to try next.
//!
//! Like kube-scheduler's, it has three parts. *Active* pods are tried in FIFO order.
//! *Backoff* pods failed to bind (or were moved out of unschedulable before their backoff
//! ran out) and wait `initial × 2^(attempts-1)`, capped. *Unschedulable* pods fit nowhere
//! and wait for a cluster event that may change that (a node added or changed, a pod
//! leaving a node), which [`SchedulingQueue::move_all_unschedulable`] signals; the move
//! itself happens on the scheduling loop's next pop, so a burst of events costs one pass.
//! Pods left unschedulable longer than `max_unschedulable` are retried anyway, in case an
//! event was missed.
//!
//! A pod is in at most one part, and a pod handed out by [`SchedulingQueue::pop`] is
//! *processing* until the loop reports how the attempt ended.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use parking_lot::Mutex;
use setpoint_runtime::ObjectKey;
use tokio::sync::Notify;
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Active,
    Backoff(Instant),
    Unschedulable(Instant),
    Processing,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    place: Place,
    /// Failed attempts so far (sets the backoff).
    attempts: u32,
    /// When the last attempt ended.
    last_attempt: Option<Instant>,
    /// Changed while processing: try again rather than park as unschedulable.
    dirty: bool,
}

#[derive(Default)]
struct State {
    active: VecDeque<ObjectKey>,
    /// `(due, key)`; stale rows (the key moved since) are skipped when popped.
    backoff: BinaryHeap<Reverse<(Instant, ObjectKey)>>,
    unschedulable: HashSet<ObjectKey>,
    entries: HashMap<ObjectKey, Entry>,
    move_requested: bool,
    /// When to next look for pods left unschedulable too long.
    next_scan: Option<Instant>,
    closed: bool,
}

/// Backoff and retry timing of the queue.
#[derive(Clone, Copy, Debug)]
pub struct QueueTiming {
    /// Backoff after the first failed attempt.
    pub initial_backoff: Duration,
    /// The longest backoff.
    pub max_backoff: Duration,
    /// Unschedulable pods are retried at least this often even without cluster events.
    pub max_unschedulable: Duration,
}

/// The queue; share it behind an `Arc`.
pub struct SchedulingQueue {
    state: Mutex<State>,
    notify: Notify,
    timing: QueueTiming,
}

impl SchedulingQueue {
    /// An empty queue.
    pub fn new(timing: QueueTiming) -> SchedulingQueue {
        SchedulingQueue {
            state: Mutex::new(State::default()),
            notify: Notify::new(),
            timing,
        }
    }

    fn backoff_for(&self, attempts: u32) -> Duration {
        let shift = attempts.saturating_sub(1).min(20);
        self.timing
            .initial_backoff
            .saturating_mul(1 << shift)
            .min(self.timing.max_backoff)
    }

    /// A pending pod appeared: queue it unless it is already somewhere.
    pub fn add(&self, key: ObjectKey) {
        let mut s = self.state.lock();
        if s.closed || s.entries.contains_key(&key) {
            return;
        }
        s.entries.insert(
            key.clone(),
            Entry {
                place: Place::Active,
                attempts: 0,
                last_attempt: None,
                dirty: false,
            },
        );
        s.active.push_back(key);
        drop(s);
        self.notify.notify_one();
    }

    /// A pending pod's spec changed: it may fit now, so an unschedulable one is tried again
    /// (after its backoff), and one being processed is not parked as unschedulable.
    pub fn update(&self, key: ObjectKey) {
        let now = Instant::now();
        let mut s = self.state.lock();
        match s.entries.get(&key).map(|e| e.place) {
            None => {
                drop(s);
                self.add(key);
            }
            Some(Place::Unschedulable(_)) => {
                s.unschedulable.remove(&key);
                self.leave_unschedulable(&mut s, key, now);
                drop(s);
                self.notify.notify_one();
            }
            Some(Place::Processing) => {
                if let Some(e) = s.entries.get_mut(&key) {
                    e.dirty = true;
                }
            }
            Some(Place::Active | Place::Backoff(_)) => {}
        }
    }

    /// The pod is gone or no longer pending (bound, deleted).
    pub fn remove(&self, key: &ObjectKey) {
        let mut s = self.state.lock();
        if s.entries.remove(key).is_some() {
            s.unschedulable.remove(key);
            // Rows in `active` and `backoff` are skipped lazily.
        }
    }

    /// Something changed that may let unschedulable pods fit; they move on the next pop.
    pub fn move_all_unschedulable(&self) {
        let mut s = self.state.lock();
        if s.unschedulable.is_empty() {
            return;
        }
        s.move_requested = true;
        drop(s);
        self.notify.notify_one();
    }

    /// Moves a key out of unschedulable: to backoff if it is still backing off, else active.
    fn leave_unschedulable(&self, s: &mut State, key: ObjectKey, now: Instant) {
        let Some(e) = s.entries.get(&key).copied() else {
            return;
        };
        let due = e
            .last_attempt
            .map(|t| t + self.backoff_for(e.attempts))
            .unwrap_or(now);
        let place = if due > now {
            s.backoff.push(Reverse((due, key.clone())));
            Place::Backoff(due)
        } else {
            s.active.push_back(key.clone());
            Place::Active
        };
        if let Some(e) = s.entries.get_mut(&key) {
            e.place = place;
        }
    }

    /// The attempt ended with the pod placed (its bind is under way): stop tracking it.
    pub fn done(&self, key: &ObjectKey) {
        self.remove(key);
    }

    /// The attempt ended with the pod fitting nowhere: park it until a cluster event.
    pub fn unschedulable(&self, key: ObjectKey) {
        let now = Instant::now();
        let mut s = self.state.lock();
        let Some(e) = s.entries.get_mut(&key) else {
            return;
        };
        e.attempts += 1;
        e.last_attempt = Some(now);
        if std::mem::take(&mut e.dirty) {
            self.leave_unschedulable(&mut s, key, now);
        } else {
            e.place = Place::Unschedulable(now);
            s.unschedulable.insert(key);
        }
    }

    /// The attempt failed (e.g. the bind was refused): retry after a backoff. Also for pods
    /// no longer tracked (their attempt ended with [`done`](Self::done)).
    pub fn backoff(&self, key: ObjectKey) {
        let now = Instant::now();
        let mut s = self.state.lock();
        if s.closed {
            return;
        }
        let e = s.entries.entry(key.clone()).or_insert(Entry {
            place: Place::Processing,
            attempts: 0,
            last_attempt: None,
            dirty: false,
        });
        if e.place == Place::Active || matches!(e.place, Place::Backoff(_)) {
            return;
        }
        e.attempts += 1;
        e.last_attempt = Some(now);
        e.dirty = false;
        let due = now + self.backoff_for(e.attempts);
        e.place = Place::Backoff(due);
        s.unschedulable.remove(&key);
        s.backoff.push(Reverse((due, key)));
        drop(s);
        self.notify.notify_one();
    }

    /// Puts a popped pod back at the end of the active queue unchanged (e.g. leadership was
    /// lost before it was tried).
    pub fn requeue(&self, key: ObjectKey) {
        let mut s = self.state.lock();
        if let Some(e) = s.entries.get_mut(&key) {
            if e.place == Place::Processing {
                e.place = Place::Active;
                s.active.push_back(key);
            }
        }
    }

    /// Stops the queue: `pop` returns `None` from now on.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// Pods tracked (active, backing off, unschedulable or processing).
    pub fn len(&self) -> usize {
        self.state.lock().entries.len()
    }

    /// Whether no pod is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pods parked as unschedulable.
    pub fn unschedulable_len(&self) -> usize {
        self.state.lock().unschedulable.len()
    }

    /// Moves what is due, then takes up to `max` active pods; `None` when it is empty.
    fn take(&self, s: &mut State, max: usize, now: Instant) -> Vec<ObjectKey> {
        if std::mem::take(&mut s.move_requested) {
            let keys: Vec<ObjectKey> = s.unschedulable.drain().collect();
            for k in keys {
                self.leave_unschedulable(s, k, now);
            }
        } else if !s.unschedulable.is_empty() && s.next_scan.is_none_or(|t| now >= t) {
            s.next_scan = Some(now + self.timing.max_unschedulable / 4);
            let limit = self.timing.max_unschedulable;
            let overstayed = |since: Instant| now.duration_since(since) >= limit;
            let stale: Vec<ObjectKey> = s
                .unschedulable
                .iter()
                .filter(|k| {
                    matches!(s.entries.get(*k).map(|e| e.place),
                        Some(Place::Unschedulable(since)) if overstayed(since))
                })
                .cloned()
                .collect();
            for k in stale {
                s.unschedulable.remove(&k);
                self.leave_unschedulable(s, k, now);
            }
        }
        while let Some(Reverse((due, _))) = s.backoff.peek() {
            if *due > now {
                break;
            }
            let Some(Reverse((due, key))) = s.backoff.pop() else {
                break;
            };
            if let Some(e) = s.entries.get_mut(&key) {
                if e.place == Place::Backoff(due) {
                    e.place = Place::Active;
                    s.active.push_back(key);
                }
            }
        }
        let mut out = Vec::new();
        while out.len() < max {
            let Some(key) = s.active.pop_front() else {
                break;
            };
            if let Some(e) = s.entries.get_mut(&key) {
                if e.place == Place::Active {
                    e.place = Place::Processing;
                    out.push(key);
                }
            }
        }
        out
    }

    /// Waits for pods to try and takes up to `max` of them; `None` once closed.
    pub async fn pop(&self, max: usize) -> Option<Vec<ObjectKey>> {
        loop {
            let notified = self.notify.notified();
            let wake = {
                let mut s = self.state.lock();
                if s.closed {
                    return None;
                }
                let now = Instant::now();
                let batch = self.take(&mut s, max, now);
                if !batch.is_empty() {
                    return Some(batch);
                }
                // Sleep until the next backoff is due, or until an unschedulable pod
                // overstays (checked at a fraction of the limit).
                let mut wake = s.backoff.peek().map(|Reverse((due, _))| *due);
                if !s.unschedulable.is_empty() {
                    let check = now + self.timing.max_unschedulable / 4;
                    wake = Some(wake.map_or(check, |w| w.min(check)));
                }
                wake
            };
            match wake {
                Some(at) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> SchedulingQueue {
        SchedulingQueue::new(QueueTiming {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            max_unschedulable: Duration::from_secs(60),
        })
    }

    fn k(n: &str) -> ObjectKey {
        ObjectKey::new(Some("ns"), n)
    }

    #[tokio::test(start_paused = true)]
    async fn fifo_and_dedup() {
        let q = q();
        q.add(k("a"));
        q.add(k("b"));
        q.add(k("a"));
        assert_eq!(q.pop(10).await, Some(vec![k("a"), k("b")]));
        // Processing pods are not handed out again.
        q.add(k("a"));
        q.add(k("c"));
        assert_eq!(q.pop(10).await, Some(vec![k("c")]));
        q.done(&k("a"));
        q.done(&k("b"));
        q.done(&k("c"));
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_and_caps() {
        let q = q();
        assert_eq!(q.backoff_for(1), Duration::from_secs(1));
        assert_eq!(q.backoff_for(2), Duration::from_secs(2));
        assert_eq!(q.backoff_for(4), Duration::from_secs(8));
        assert_eq!(q.backoff_for(5), Duration::from_secs(10));
        assert_eq!(q.backoff_for(100), Duration::from_secs(10));
        q.add(k("a"));
        q.pop(1).await.unwrap();
        q.done(&k("a"));
        let start = Instant::now();
        q.backoff(k("a"));
        assert_eq!(q.pop(1).await, Some(vec![k("a")]));
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        q.backoff(k("a"));
        assert_eq!(q.pop(1).await, Some(vec![k("a")]));
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn unschedulable_waits_for_an_event() {
        let q = q();
        q.add(k("a"));
        q.pop(1).await.unwrap();
        q.unschedulable(k("a"));
        assert_eq!(q.unschedulable_len(), 1);
        // No event: nothing to pop for a while.
        let quiet = tokio::time::timeout(Duration::from_secs(5), q.pop(1)).await;
        assert!(quiet.is_err());
        // An event after the backoff ran out: active at once.
        q.move_all_unschedulable();
        let start = Instant::now();
        assert_eq!(q.pop(1).await, Some(vec![k("a")]));
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(q.unschedulable_len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_early_event_still_respects_backoff() {
        let q = q();
        q.add(k("a"));
        q.pop(1).await.unwrap();
        q.unschedulable(k("a"));
        q.move_all_unschedulable();
        let start = Instant::now();
        assert_eq!(q.pop(1).await, Some(vec![k("a")]));
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn unschedulable_pods_are_retried_periodically() {
        let q = q();
        q.add(k("a"));
        q.pop(1).await.unwrap();
        let start = Instant::now();
        q.unschedulable(k("a"));
        assert_eq!(q.pop(1).await, Some(vec![k("a")]));
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(60) && waited <= Duration::from_secs(75),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_spec_change_while_processing_is_not_lost() {
        let q = q();
        q.add(k("a"));
        q.pop(1).await.unwrap();
        q.update(k("a"));
        q.unschedulable(k("a"));
        assert_eq!(q.unschedulable_len(), 0);
        let start = Instant::now();
        assert_eq!(q.pop(1).await, Some(vec![k("a")]));
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        // And an update to a parked pod releases it.
        q.unschedulable(k("a"));
        tokio::time::sleep(Duration::from_secs(5)).await;
        q.update(k("a"));
        assert_eq!(q.pop(1).await, Some(vec![k("a")]));
    }

    #[tokio::test(start_paused = true)]
    async fn removed_pods_are_skipped_and_close_ends_pop() {
        let q = q();
        q.add(k("a"));
        q.add(k("b"));
        q.remove(&k("a"));
        assert_eq!(q.pop(10).await, Some(vec![k("b")]));
        q.unschedulable(k("b"));
        q.remove(&k("b"));
        assert_eq!(q.unschedulable_len(), 0);
        q.close();
        assert_eq!(q.pop(10).await, None);
        q.add(k("c"));
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_puts_a_popped_pod_back() {
        let q = q();
        q.add(k("a"));
        q.pop(1).await.unwrap();
        q.requeue(k("a"));
        assert_eq!(q.pop(1).await, Some(vec![k("a")]));
    }
}
