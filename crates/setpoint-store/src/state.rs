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
//!
//! # Values of older events
//!
//! Held in memory, the log would keep every version of every object written since the last
//! compaction: with compaction every few minutes, several times the size of the latest state.
//! A backend that can read values back ([`HistoryReader`], the embedded one from its history
//! table) gives the core a byte budget instead. Only the newest events whose values fit in it
//! keep them; older events keep their keys and revisions but drop their values (*stripped*),
//! and the rare reads that need one (a watch replaying from far back, a `range` at an old
//! revision) fetch it by its `mod_revision`. Live watchers are never affected: they are sent
//! each event before it is logged.
//!
//! The reader is asked for a view while the core's lock is held, so the view sees every
//! revision the core has applied (writes are durable before they are applied), and compaction
//! moves the core's compaction point before it deletes rows, so no row a view may need goes away
//! under it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use futures::StreamExt;
use parking_lot::{Mutex, RwLock};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::chunked::ChunkedDeque;
use crate::{
    Event, KeyValue, Precondition, RangeRequest, RangeResponse, Result, Revision, StoreError,
    WatchResponse, WatchStream,
};

/// How many log entries a replaying watcher scans per lock acquisition, so that a watch from far
/// back never holds the lock long enough to stall writers.
const REPLAY_SCAN_CHUNK: usize = 1024;

/// Reads values of stripped log events back (see "Values of older events" in the module docs).
pub(crate) trait HistoryReader: Send + Sync {
    /// A consistent view of the stored history. The core calls this while it holds its lock, so
    /// the view must include every write already applied to the core.
    fn view(&self) -> Result<Box<dyn HistoryView + '_>>;
}

/// One consistent view of the stored history.
pub(crate) trait HistoryView {
    /// The value the put at `mod_revision` wrote. The core only asks for puts that are logged
    /// events, or values those events replaced, so the row must exist.
    fn value(&self, mod_revision: Revision) -> Result<Bytes>;
}

/// How a durable backend lets the core drop values of older events.
pub(crate) struct HistoryValues {
    /// Where stripped values are read back from.
    pub(crate) reader: Arc<dyn HistoryReader>,
    /// At most this many bytes of values are kept for the newest events.
    pub(crate) memory_bytes: usize,
}

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

/// The key-values an event carries (its new value and the one it replaced), mutably.
fn key_values_mut(event: &mut Event) -> impl Iterator<Item = &mut KeyValue> {
    let (kv, prev) = match event {
        Event::Put { kv, prev } => (Some(kv), prev.as_mut()),
        Event::Delete { prev, .. } => (None, Some(prev)),
    };
    kv.into_iter().chain(prev)
}

/// Bytes of values an event holds.
fn value_bytes(event: &Event) -> usize {
    match event {
        Event::Put { kv, prev } => kv.value.len() + prev.as_ref().map_or(0, |p| p.value.len()),
        Event::Delete { prev, .. } => prev.value.len(),
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
    kvs: BTreeMap<Arc<str>, KeyValue>,
    /// Events with revisions `compacted + 1 ..= current`, in order (in chunks: see
    /// [`ChunkedDeque`] for why not a `VecDeque`).
    log: ChunkedDeque<Event>,
    current: Revision,
    compacted: Revision,
    /// Events below this revision are stripped: their values are empty placeholders, to be read
    /// back from the [`HistoryReader`]. Always in `compacted + 1 ..= current + 1`.
    values_from: Revision,
    /// Bytes of values held by the unstripped events.
    values_bytes: usize,
    /// Most bytes of values the log may hold; `None` keeps them all (no reader).
    values_budget: Option<usize>,
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

    /// Whether the event at `revision` has had its values stripped.
    fn is_stripped(&self, revision: Revision) -> bool {
        revision < self.values_from
    }

    /// Strips the oldest unstripped events until the rest fit the budget.
    fn strip_to_budget(&mut self) {
        let Some(budget) = self.values_budget else {
            return;
        };
        while self.values_bytes > budget && self.values_from <= self.current {
            let index = (self.values_from - self.compacted - 1) as usize;
            let event = &mut self.log[index];
            self.values_bytes -= value_bytes(event);
            for kv in key_values_mut(event) {
                kv.value = Bytes::new();
            }
            self.values_from += 1;
        }
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
                    // One allocation per key however many versions the log holds.
                    key: current.map_or_else(|| Arc::from(key), |c| c.key.clone()),
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
                    key: cur.key.clone(),
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
        self.values_bytes += events.iter().map(value_bytes).sum::<usize>();
        self.log.extend(events);
        self.strip_to_budget();
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

    /// Reads a range. Returns, besides the response, the indices of the key-values in it whose
    /// values were stripped and must be read back by their `mod_revision`.
    fn range(&self, req: &RangeRequest) -> Result<(RangeResponse, Vec<usize>)> {
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
            .map(|(k, v)| (&**k, Some((v, false))));

        // For a historical read, every key written after `revision` had, at `revision`, the value
        // its first later event replaced. Those values override the latest state; each is marked
        // with whether its event was stripped.
        let mut overrides: BTreeMap<&str, Option<(&KeyValue, bool)>> = BTreeMap::new();
        for r in revision + 1..=self.current {
            let event = self.event_at(r);
            if in_range(event.key()) {
                overrides
                    .entry(event.key())
                    .or_insert(value_before(event).map(|kv| (kv, self.is_stripped(r))));
            }
        }

        let limit = req.limit.unwrap_or(usize::MAX);
        let mut resp = RangeResponse {
            kvs: Vec::new(),
            more: false,
            count: 0,
            revision,
        };
        let mut stripped = Vec::new();
        let mut emit = |kv: Option<(&KeyValue, bool)>| {
            if let Some((kv, is_stripped)) = kv {
                resp.count += 1;
                if resp.kvs.len() < limit {
                    if is_stripped {
                        stripped.push(resp.kvs.len());
                    }
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
        Ok((resp, stripped))
    }
}

/// The shared state of a store: latest values, event log since compaction, and watchers.
pub(crate) struct Core {
    inner: Mutex<Inner>,
    /// Where stripped values are read back from. Taken only while `inner` is locked (never the
    /// other way round) and emptied by [`Core::close`], which waits for the views in use, so a
    /// closed store holds no reference to its backend's files.
    reader: RwLock<Option<Arc<dyn HistoryReader>>>,
    /// Responses a watcher may have queued before it is dropped as lagging.
    watch_buffer: usize,
    next_watcher_id: AtomicU64,
}

impl Core {
    /// An empty store at revision 0 that keeps every value in memory.
    pub(crate) fn new(watch_buffer: usize) -> Self {
        Self::from_parts(BTreeMap::new(), 0, watch_buffer, None)
    }

    /// A store whose state at `compacted`, its compaction point and current revision, is `kvs`,
    /// with no history after it yet: a durable backend restores the history by applying it.
    /// With `history`, older events' values are dropped to fit its budget.
    pub(crate) fn from_parts(
        kvs: BTreeMap<Arc<str>, KeyValue>,
        compacted: Revision,
        watch_buffer: usize,
        history: Option<HistoryValues>,
    ) -> Self {
        let (reader, values_budget) = match history {
            Some(h) => (Some(h.reader), Some(h.memory_bytes)),
            None => (None, None),
        };
        let inner = Inner {
            kvs,
            log: ChunkedDeque::default(),
            current: compacted,
            compacted,
            values_from: compacted + 1,
            values_bytes: 0,
            values_budget,
            watchers: HashMap::new(),
            closed: false,
        };
        Core {
            inner: Mutex::new(inner),
            reader: RwLock::new(reader),
            watch_buffer: watch_buffer.max(1),
            next_watcher_id: AtomicU64::new(1),
        }
    }

    /// Reads back the values of `kvs` (stripped key-values of the log) by their `mod_revision`.
    /// `inner` is the locked state they were taken from; the view is opened before it is
    /// released (see the module docs) and the reads happen after, so writers are not held up.
    fn read_back<'a>(
        &self,
        inner: parking_lot::MutexGuard<'_, Inner>,
        kvs: impl IntoIterator<Item = &'a mut KeyValue>,
    ) -> Result<()> {
        let reader = self.reader.read();
        // Only a core with a reader strips values.
        let reader = reader.as_ref().ok_or(StoreError::Closed)?;
        let view = reader.view()?;
        drop(inner);
        for kv in kvs {
            kv.value = view.value(kv.mod_revision)?;
        }
        Ok(())
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
        let (mut resp, stripped) = inner.range(req)?;
        if !stripped.is_empty() {
            let mut stripped = stripped.into_iter().peekable();
            let kvs = resp.kvs.iter_mut().enumerate().filter_map(|(i, kv)| {
                stripped.next_if_eq(&i)?;
                Some(kv)
            });
            self.read_back(inner, kvs)?;
        }
        Ok(resp)
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

    /// Discards the log through `revision`. Returns `None` when that is a no-op (compacting to or
    /// below the current compaction point); otherwise the revisions of the durable rows the
    /// dropped events made obsolete: each value one of them replaced, and each delete. A durable
    /// backend removes those rows afterwards, never before (see the module docs).
    pub(crate) fn compact(&self, revision: Revision) -> Result<Option<Vec<Revision>>> {
        let mut inner = self.inner.lock();
        inner.check_open()?;
        if revision > inner.current {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current: inner.current,
            });
        }
        if revision <= inner.compacted {
            return Ok(None);
        }
        let drop = (revision - inner.compacted) as usize;
        let mut obsolete = Vec::new();
        for event in inner.log.range(0, drop) {
            if let Some(prev) = value_before(event) {
                obsolete.push(prev.mod_revision);
            }
            if let Event::Delete { revision, .. } = event {
                obsolete.push(*revision);
            }
        }
        let unstripped = (inner.values_from - inner.compacted - 1) as usize;
        let freed: usize = inner
            .log
            .range(unstripped.min(drop), drop)
            .map(value_bytes)
            .sum();
        inner.values_bytes -= freed;
        inner.log.drop_front(drop);
        inner.compacted = revision;
        inner.values_from = inner.values_from.max(revision + 1);
        debug!(revision, "compacted");
        Ok(Some(obsolete))
    }

    /// Marks the store closed: every later call fails with `Closed` and every watch stream ends
    /// once it has drained what it was already sent.
    pub(crate) fn close(&self) {
        {
            let mut inner = self.inner.lock();
            inner.closed = true;
            inner.watchers.clear();
        }
        // Waits for reads in progress; later ones see `closed` first.
        self.reader.write().take();
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
        let mut events: Vec<Event> = (after + 1..=end)
            .map(|r| inner.event_at(r))
            .filter(|e| e.key().starts_with(prefix))
            .cloned()
            .collect();
        let values_from = inner.values_from;
        if events.first().is_some_and(|e| e.revision() < values_from) {
            let kvs = events
                .iter_mut()
                .take_while(|e| e.revision() < values_from)
                .flat_map(key_values_mut);
            self.read_back(inner, kvs)?;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The values of every put ever made, by revision, as a durable backend would have them.
    #[derive(Default)]
    struct AllValues(Mutex<HashMap<Revision, Bytes>>);

    impl HistoryReader for AllValues {
        fn view(&self) -> Result<Box<dyn HistoryView + '_>> {
            Ok(Box::new(self))
        }
    }

    impl HistoryView for &AllValues {
        fn value(&self, mod_revision: Revision) -> Result<Bytes> {
            Ok(self.0.lock()[&mod_revision].clone())
        }
    }

    fn put(core: &Core, values: &AllValues, key: &str, value: &'static str) {
        let op = WriteOp::Put {
            key: key.to_owned(),
            value: Bytes::from_static(value.as_bytes()),
            precondition: Precondition::None,
        };
        let event = core.write_one(&op).unwrap();
        values
            .0
            .lock()
            .insert(event.revision(), put_result(event).value);
    }

    /// The budget holds, and its accounting matches the values the log really holds.
    fn check_budget(core: &Core, budget: usize) {
        let inner = core.inner.lock();
        let held: usize = inner
            .log
            .iter()
            .filter(|e| !inner.is_stripped(e.revision()))
            .map(value_bytes)
            .sum();
        assert_eq!(inner.values_bytes, held);
        assert!(held <= budget, "{held} bytes held, budget {budget}");
        for event in inner.log.iter().filter(|e| inner.is_stripped(e.revision())) {
            assert_eq!(value_bytes(event), 0, "a stripped event holds no values");
        }
    }

    #[test]
    fn older_values_are_dropped_to_the_budget_and_read_back() {
        let values = Arc::new(AllValues::default());
        let budget = 10;
        let core = Core::from_parts(
            BTreeMap::new(),
            0,
            8,
            Some(HistoryValues {
                reader: values.clone(),
                memory_bytes: budget,
            }),
        );
        let mut expected_at = vec![Vec::new()];
        for (i, value) in ["aaaa", "bbbb", "cccc", "dddd", "eeee", "ffff"]
            .into_iter()
            .enumerate()
        {
            put(&core, &values, &format!("/k{}", i % 2), value);
            check_budget(&core, budget);
            let latest = core.range(&RangeRequest::default()).unwrap().kvs;
            expected_at.push(latest);
        }
        // The newest event (4 new + 4 replaced bytes) fits; the others were stripped.
        assert_eq!(core.inner.lock().values_from, 6);
        for (revision, expected) in expected_at.iter().enumerate() {
            let req = RangeRequest {
                revision: Some(revision as Revision),
                ..Default::default()
            };
            assert_eq!(&core.range(&req).unwrap().kvs, expected, "at {revision}");
        }
        let (replayed, _) = core.replay_chunk("", 0, 6).unwrap();
        let replayed_values: Vec<_> = replayed
            .iter()
            .map(|e| match e {
                Event::Put { kv, prev } => {
                    (kv.value.clone(), prev.as_ref().map(|p| p.value.clone()))
                }
                Event::Delete { .. } => unreachable!("only puts were made"),
            })
            .collect();
        assert_eq!(replayed_values[2], ("cccc".into(), Some("aaaa".into())));
        assert_eq!(replayed_values[5], ("ffff".into(), Some("dddd".into())));

        // Compaction releases the accounting of what it drops, stripped or not.
        core.compact(5).unwrap();
        check_budget(&core, budget);
        core.compact(6).unwrap();
        check_budget(&core, budget);
        assert_eq!(core.inner.lock().values_bytes, 0);
        put(&core, &values, "/k0", "gggg");
        check_budget(&core, budget);
        assert_eq!(core.inner.lock().values_bytes, 8);
    }
}
