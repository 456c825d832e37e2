//! The in-memory revisioned state both backends serve reads and watches from.
//!
//! [`Core`] holds the latest value of every key, the log of every event since the compaction
//! point (each with the value it replaced), and the registered watchers. Backends differ only in
//! how a write becomes durable before it is applied here:
//! - the memory backend evaluates and applies a write under one lock ([`Core::write_one`]);
//! - the embedded backend's committer evaluates a whole batch ([`Core::prepare`]), persists it,
//!   and only then applies it ([`Core::apply`]), which publishes it to watchers.
//!
//! The log is dense: every revision in `(compacted, current]` has exactly one event, because a
//! revision is consumed only by a successful single-key write. Event `r` therefore lives at index
//! `r - compacted - 1`, which makes replay and historical reads index lookups rather than scans.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::{
    Event, KeyValue, Precondition, RangeRequest, RangeResponse, Result, Revision, StoreError,
    WatchResponse, WatchStream,
};

/// How many log entries a replaying watcher scans per lock acquisition, so that a watch from far
/// back never holds the lock long enough to stall writers.
const REPLAY_SCAN_CHUNK: usize = 1024;

/// A single-key write, before it has been given a revision.
#[derive(Clone, Debug)]
pub(crate) enum WriteOp {
    Put {
        key: String,
        value: Bytes,
        precondition: Precondition,
    },
    Delete {
        key: String,
        precondition: Precondition,
    },
}

impl WriteOp {
    pub(crate) fn key(&self) -> &str {
        match self {
            WriteOp::Put { key, .. } | WriteOp::Delete { key, .. } => key,
        }
    }
}

/// The new key-value of a put's event (what `Store::put` returns).
pub(crate) fn put_result(event: Event) -> KeyValue {
    match event {
        Event::Put { kv, .. } => kv,
        // `evaluate` builds a put event for every put.
        Event::Delete { prev, .. } => prev,
    }
}

/// The deleted key-value and the deletion revision of a delete's event.
pub(crate) fn delete_result(event: Event) -> (KeyValue, Revision) {
    match event {
        Event::Delete { prev, revision, .. } => (prev, revision),
        // `evaluate` builds a delete event for every delete.
        Event::Put { kv, .. } => {
            let revision = kv.mod_revision;
            (kv, revision)
        }
    }
}

/// The value a key had just before `event` (None if it did not exist).
pub(crate) fn value_before(event: &Event) -> Option<&KeyValue> {
    match event {
        Event::Put { prev, .. } => prev.as_ref(),
        Event::Delete { prev, .. } => Some(prev),
    }
}

/// A registered live watcher.
struct Watcher {
    prefix: String,
    /// Only events with a revision above this are sent on the channel: everything up to it is
    /// either replayed from the log by the stream itself or was not asked for.
    after: Revision,
    tx: mpsc::Sender<Result<WatchResponse>>,
}

/// Outcome of offering a response to a watcher.
enum Delivery {
    Sent,
    /// The watcher is gone (its stream was dropped) or was just dropped for lagging.
    Remove,
}

impl Watcher {
    /// Queues `resp` without ever blocking. The channel has one slot more than the configured
    /// buffer; that last slot is kept for the `WatcherLagged` error so the watcher always learns
    /// why its stream ended. Only the core sends on the channel (under its lock), so the capacity
    /// seen here cannot shrink before `try_send`.
    fn deliver(&self, id: u64, resp: WatchResponse) -> Delivery {
        if self.tx.is_closed() {
            return Delivery::Remove;
        }
        if self.tx.capacity() > 1 {
            match self.tx.try_send(Ok(resp)) {
                Ok(()) => Delivery::Sent,
                Err(_) => Delivery::Remove,
            }
        } else {
            warn!(watcher = id, prefix = %self.prefix, "watcher fell behind; dropping it");
            let _ = self.tx.try_send(Err(StoreError::WatcherLagged));
            Delivery::Remove
        }
    }
}

struct Inner {
    kvs: BTreeMap<String, KeyValue>,
    /// Events with revisions `compacted + 1 ..= current`, in order.
    log: VecDeque<Event>,
    current: Revision,
    compacted: Revision,
    watchers: HashMap<u64, Watcher>,
    closed: bool,
}

impl Inner {
    fn check_open(&self) -> Result<()> {
        if self.closed {
            Err(StoreError::Closed)
        } else {
            Ok(())
        }
    }

    /// The event at `revision`, which must be in `(compacted, current]`.
    fn event_at(&self, revision: Revision) -> &Event {
        &self.log[(revision - self.compacted - 1) as usize]
    }

    /// Checks `op` against the state (`kvs` overlaid with `pending`, the earlier writes of the
    /// same batch) and, if it may proceed, builds the event it produces at `revision`.
    fn evaluate(
        &self,
        op: &WriteOp,
        pending: &HashMap<&str, Option<KeyValue>>,
        revision: Revision,
    ) -> Result<Event> {
        let key = op.key();
        let current = match pending.get(key) {
            Some(v) => v.as_ref(),
            None => self.kvs.get(key),
        };
        match op {
            WriteOp::Put {
                value,
                precondition,
                ..
            } => {
                match (precondition, current) {
                    (Precondition::None, _) | (Precondition::NotExists, None) => {}
                    (Precondition::NotExists, Some(_)) => {
                        return Err(StoreError::AlreadyExists {
                            key: key.to_owned(),
                        });
                    }
                    (Precondition::ModRevision(r), Some(cur)) if cur.mod_revision == *r => {}
                    (Precondition::ModRevision(_), cur) => {
                        return Err(StoreError::Conflict {
                            key: key.to_owned(),
                            current: cur.cloned().map(Box::new),
                        });
                    }
                }
                let kv = KeyValue {
                    key: key.to_owned(),
                    value: value.clone(),
                    create_revision: current.map_or(revision, |c| c.create_revision),
                    mod_revision: revision,
                    version: current.map_or(1, |c| c.version + 1),
                };
                Ok(Event::Put {
                    kv,
                    prev: current.cloned(),
                })
            }
            WriteOp::Delete { precondition, .. } => {
                let Some(cur) = current else {
                    return Err(StoreError::NotFound {
                        key: key.to_owned(),
                    });
                };
                match precondition {
                    Precondition::None => {}
                    Precondition::ModRevision(r) if cur.mod_revision == *r => {}
                    Precondition::ModRevision(_) => {
                        return Err(StoreError::Conflict {
                            key: key.to_owned(),
                            current: Some(Box::new(cur.clone())),
                        });
                    }
                    Precondition::NotExists => {
                        return Err(StoreError::Backend(
                            "invalid precondition: NotExists cannot guard a delete".to_owned(),
                        ));
                    }
                }
                Ok(Event::Delete {
                    key: key.to_owned(),
                    revision,
                    prev: cur.clone(),
                })
            }
        }
    }

    /// Makes `events` (consecutive revisions following `current`) the latest state, then offers
    /// them to every watcher whose prefix matches, as one response per watcher.
    fn apply(&mut self, events: Vec<Event>) {
        let Some(last) = events.last().map(Event::revision) else {
            return;
        };
        for event in &events {
            debug_assert_eq!(
                event.revision(),
                self.current + 1,
                "revisions must be dense"
            );
            self.current = event.revision();
            match event {
                Event::Put { kv, .. } => {
                    self.kvs.insert(kv.key.clone(), kv.clone());
                }
                Event::Delete { key, .. } => {
                    self.kvs.remove(key);
                }
            }
        }
        self.watchers.retain(|id, w| {
            let matching: Vec<Event> = events
                .iter()
                .filter(|e| e.revision() > w.after && e.key().starts_with(&w.prefix))
                .cloned()
                .collect();
            if matching.is_empty() {
                // Nothing to say, but still forget watchers whose stream is gone.
                return !w.tx.is_closed();
            }
            matches!(
                w.deliver(
                    *id,
                    WatchResponse {
                        events: matching,
                        revision: last
                    }
                ),
                Delivery::Sent
            )
        });
        self.log.extend(events);
    }

    fn check_readable_revision(&self, requested: Revision) -> Result<()> {
        if requested > self.current {
            return Err(StoreError::FutureRevision {
                requested,
                current: self.current,
            });
        }
        if requested < self.compacted {
            return Err(StoreError::Compacted {
                requested,
                compacted: self.compacted,
            });
        }
        Ok(())
    }

    fn range(&self, req: &RangeRequest) -> Result<RangeResponse> {
        let revision = match req.revision {
            None => self.current,
            Some(r) => {
                self.check_readable_revision(r)?;
                r
            }
        };
        let prefix = req.prefix.as_str();
        // Start at the prefix, or just after `start_after` when that lies beyond it.
        let lower: Bound<&str> = match req.start_after.as_deref() {
            Some(after) if after >= prefix => Bound::Excluded(after),
            _ => Bound::Included(prefix),
        };
        let in_range = |k: &str| {
            k.starts_with(prefix)
                && match lower {
                    Bound::Excluded(a) => k > a,
                    _ => true,
                }
        };
        let latest = self
            .kvs
            .range::<str, _>((lower, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_str(), Some(v)));

        // For a historical read, every key written after `revision` had, at `revision`, the value
        // its first later event replaced. Those values override the latest state.
        let mut overrides: BTreeMap<&str, Option<&KeyValue>> = BTreeMap::new();
        for r in revision + 1..=self.current {
            let event = self.event_at(r);
            if in_range(event.key()) {
                overrides.entry(event.key()).or_insert(value_before(event));
            }
        }

        let limit = req.limit.unwrap_or(usize::MAX);
        let mut resp = RangeResponse {
            kvs: Vec::new(),
            more: false,
            count: 0,
            revision,
        };
        let mut emit = |kv: Option<&KeyValue>| {
            if let Some(kv) = kv {
                resp.count += 1;
                if resp.kvs.len() < limit {
                    resp.kvs.push(kv.clone());
                } else {
                    resp.more = true;
                }
            }
        };
        // Merge the two key-ordered sequences; an override wins over the latest value.
        let mut latest = latest.peekable();
        let mut overrides = overrides.into_iter().peekable();
        loop {
            match (latest.peek(), overrides.peek()) {
                (None, None) => break,
                (Some(_), None) => emit(latest.next().and_then(|(_, v)| v)),
                (None, Some(_)) => emit(overrides.next().and_then(|(_, v)| v)),
                (Some((lk, _)), Some((ok, _))) => {
                    if lk < ok {
                        emit(latest.next().and_then(|(_, v)| v));
                    } else {
                        if lk == ok {
                            latest.next();
                        }
                        emit(overrides.next().and_then(|(_, v)| v));
                    }
                }
            }
        }
        Ok(resp)
    }
}

/// The shared state of a store: latest values, event log since compaction, and watchers.
pub(crate) struct Core {
    inner: Mutex<Inner>,
    /// Responses a watcher may have queued before it is dropped as lagging.
    watch_buffer: usize,
    next_watcher_id: AtomicU64,
}

impl Core {
    /// An empty store at revision 0.
    pub(crate) fn new(watch_buffer: usize) -> Self {
        Self::from_parts(BTreeMap::new(), VecDeque::new(), 0, 0, watch_buffer)
    }

    /// A store restored from durable state. `log` must hold exactly the revisions
    /// `compacted + 1 ..= current`, and `kvs` must be the state at `current`.
    pub(crate) fn from_parts(
        kvs: BTreeMap<String, KeyValue>,
        log: VecDeque<Event>,
        current: Revision,
        compacted: Revision,
        watch_buffer: usize,
    ) -> Self {
        debug_assert_eq!(log.len() as i64, current - compacted);
        Core {
            inner: Mutex::new(Inner {
                kvs,
                log,
                current,
                compacted,
                watchers: HashMap::new(),
                closed: false,
            }),
            watch_buffer: watch_buffer.max(1),
            next_watcher_id: AtomicU64::new(1),
        }
    }

    pub(crate) fn current_revision(&self) -> Result<Revision> {
        let inner = self.inner.lock();
        inner.check_open()?;
        Ok(inner.current)
    }

    pub(crate) fn compacted_revision(&self) -> Result<Revision> {
        let inner = self.inner.lock();
        inner.check_open()?;
        Ok(inner.compacted)
    }

    pub(crate) fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let inner = self.inner.lock();
        inner.check_open()?;
        Ok(inner.kvs.get(key).cloned())
    }

    pub(crate) fn range(&self, req: &RangeRequest) -> Result<RangeResponse> {
        let inner = self.inner.lock();
        inner.check_open()?;
        inner.range(req)
    }

    /// Evaluates and applies one write atomically (the memory backend's whole write path).
    pub(crate) fn write_one(&self, op: &WriteOp) -> Result<Event> {
        let mut inner = self.inner.lock();
        inner.check_open()?;
        let event = inner.evaluate(op, &HashMap::new(), inner.current + 1)?;
        inner.apply(vec![event.clone()]);
        Ok(event)
    }

    /// Evaluates a batch of writes in order, as if each earlier successful one had been applied,
    /// assigning consecutive revisions after the current one to the successful ones. Nothing
    /// changes until [`Core::apply`] is called with the successful events, in order; the caller
    /// must be the only writer in between.
    pub(crate) fn prepare<'a>(
        &self,
        ops: impl IntoIterator<Item = &'a WriteOp>,
    ) -> Result<Vec<Result<Event>>> {
        let inner = self.inner.lock();
        inner.check_open()?;
        let ops: Vec<&WriteOp> = ops.into_iter().collect();
        // Only keys written more than once in the batch need their pending values tracked.
        let mut seen = HashSet::with_capacity(ops.len());
        let repeated: HashSet<&str> = ops
            .iter()
            .map(|op| op.key())
            .filter(|k| !seen.insert(*k))
            .collect();
        let mut pending: HashMap<&str, Option<KeyValue>> = HashMap::new();
        let mut next = inner.current + 1;
        let outcomes = ops
            .into_iter()
            .map(|op| {
                let event = inner.evaluate(op, &pending, next)?;
                next += 1;
                if repeated.contains(op.key()) {
                    let after = match &event {
                        Event::Put { kv, .. } => Some(kv.clone()),
                        Event::Delete { .. } => None,
                    };
                    pending.insert(op.key(), after);
                }
                Ok(event)
            })
            .collect();
        Ok(outcomes)
    }

    /// Makes prepared events visible and publishes them to watchers.
    pub(crate) fn apply(&self, events: Vec<Event>) {
        self.inner.lock().apply(events);
    }

    /// Checks that history through `revision` may be compacted. Returns the events that
    /// compaction would drop (empty when it is a no-op), so that a durable backend can work out
    /// which of its rows they make obsolete before calling [`Core::compact`].
    pub(crate) fn compaction_plan(&self, revision: Revision) -> Result<Vec<Event>> {
        let inner = self.inner.lock();
        inner.check_open()?;
        if revision > inner.current {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current: inner.current,
            });
        }
        if revision <= inner.compacted {
            return Ok(Vec::new());
        }
        Ok(inner
            .log
            .iter()
            .take((revision - inner.compacted) as usize)
            .cloned()
            .collect())
    }

    /// Discards the log through `revision`. Compacting to or below the current compaction point
    /// is a no-op.
    pub(crate) fn compact(&self, revision: Revision) -> Result<()> {
        let mut inner = self.inner.lock();
        inner.check_open()?;
        if revision > inner.current {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current: inner.current,
            });
        }
        if revision <= inner.compacted {
            return Ok(());
        }
        let drop = (revision - inner.compacted) as usize;
        inner.log.drain(..drop);
        inner.compacted = revision;
        debug!(revision, "compacted");
        Ok(())
    }

    /// Marks the store closed: every later call fails with `Closed` and every watch stream ends
    /// once it has drained what it was already sent.
    pub(crate) fn close(&self) {
        let mut inner = self.inner.lock();
        inner.closed = true;
        inner.watchers.clear();
    }

    /// Starts a watch. The watcher is registered for live events at once, under the same lock
    /// that reads the current revision, so the stream replays `(after, current]` from the log and
    /// then continues with the channel, with neither gap nor overlap.
    pub(crate) fn watch(self: &Arc<Self>, prefix: &str, after: Revision) -> Result<WatchStream> {
        let id = self.next_watcher_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(self.watch_buffer + 1);
        let replay_until = {
            let mut inner = self.inner.lock();
            inner.check_open()?;
            if after < inner.compacted {
                return Err(StoreError::Compacted {
                    requested: after,
                    compacted: inner.compacted,
                });
            }
            let replay_until = inner.current;
            // A watch may start in the future (as in etcd): live events up to `after` are skipped.
            let live_after = after.max(replay_until);
            inner.watchers.retain(|_, w| !w.tx.is_closed());
            inner.watchers.insert(
                id,
                Watcher {
                    prefix: prefix.to_owned(),
                    after: live_after,
                    tx,
                },
            );
            replay_until
        };
        let replay = Replay {
            core: Arc::downgrade(self),
            prefix: prefix.to_owned(),
            next_after: after,
            until: replay_until,
        };
        let stream =
            futures::stream::unfold(WatchState::Replaying(replay, rx), |state| async move {
                state.next().await
            });
        let weak = Arc::downgrade(self);
        let progress = move || {
            if let Some(core) = weak.upgrade() {
                core.request_progress(id);
            }
        };
        Ok(WatchStream::new(stream.boxed(), Some(Box::new(progress))))
    }

    /// Queues a progress notification for watcher `id`. Everything up to the current revision
    /// has already been queued ahead of it (or will be replayed before the channel is read), so
    /// the notification is truthful when the watcher reaches it.
    fn request_progress(&self, id: u64) {
        let mut inner = self.inner.lock();
        let current = inner.current;
        let Some(w) = inner.watchers.get(&id) else {
            return;
        };
        let resp = WatchResponse {
            events: Vec::new(),
            revision: current,
        };
        if let Delivery::Remove = w.deliver(id, resp) {
            inner.watchers.remove(&id);
        }
    }

    /// Up to [`REPLAY_SCAN_CHUNK`] log entries after `after` (and at most through `until`),
    /// filtered by prefix. Returns the matching events and the last revision scanned.
    fn replay_chunk(
        &self,
        prefix: &str,
        after: Revision,
        until: Revision,
    ) -> Result<(Vec<Event>, Revision)> {
        let inner = self.inner.lock();
        inner.check_open()?;
        if after < inner.compacted {
            return Err(StoreError::Compacted {
                requested: after,
                compacted: inner.compacted,
            });
        }
        let end = until.min(after + REPLAY_SCAN_CHUNK as Revision);
        let events = (after + 1..=end)
            .map(|r| inner.event_at(r))
            .filter(|e| e.key().starts_with(prefix))
            .cloned()
            .collect();
        Ok((events, end))
    }
}

/// The catch-up part of a watch: reads the log in chunks rather than copying it all up front, so
/// a watch from far back costs bounded memory and never holds the lock for long.
struct Replay {
    core: Weak<Core>,
    prefix: String,
    next_after: Revision,
    until: Revision,
}

enum WatchState {
    Replaying(Replay, mpsc::Receiver<Result<WatchResponse>>),
    Live(mpsc::Receiver<Result<WatchResponse>>),
    Done,
}

impl WatchState {
    async fn next(self) -> Option<(Result<WatchResponse>, WatchState)> {
        match self {
            WatchState::Replaying(mut replay, rx) => {
                while replay.next_after < replay.until {
                    // A store that is gone or closed ends the stream, like a closed channel.
                    let core = replay.core.upgrade()?;
                    match core.replay_chunk(&replay.prefix, replay.next_after, replay.until) {
                        Ok((events, scanned)) => {
                            replay.next_after = scanned;
                            if !events.is_empty() {
                                let resp = WatchResponse {
                                    events,
                                    revision: scanned,
                                };
                                return Some((Ok(resp), WatchState::Replaying(replay, rx)));
                            }
                        }
                        Err(StoreError::Closed) => return None,
                        Err(e) => return Some((Err(e), WatchState::Done)),
                    }
                }
                Self::live(rx).await
            }
            WatchState::Live(rx) => Self::live(rx).await,
            WatchState::Done => None,
        }
    }

    async fn live(
        mut rx: mpsc::Receiver<Result<WatchResponse>>,
    ) -> Option<(Result<WatchResponse>, WatchState)> {
        match rx.recv().await? {
            Ok(resp) => Some((Ok(resp), WatchState::Live(rx))),
            // An error (a lagged watcher) is the stream's last item.
            Err(e) => Some((Err(e), WatchState::Done)),
        }
    }
}
