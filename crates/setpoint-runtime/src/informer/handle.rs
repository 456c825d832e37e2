//! [`Informer`]: a reflector feeding a [`Store`], and the handlers it notifies.
//!
//! Locking: the dispatch lock (a mutex over the handler list) is held while the reflector
//! applies a change to the store *and* delivers the resulting events, while a resync
//! redelivers, and while a new subscriber receives its snapshot and joins. So every handler
//! sees one serial history: a late subscriber's snapshot is exactly the cache state between
//! two applied changes, and every later change reaches it as a live event — none lost, none
//! twice. The store's own lock is taken inside and released before handlers run, so handlers
//! may read the store (lock order: dispatch, then store).

use std::cell::Cell;
use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::Instrument;

use super::backoff::Backoff;
use super::reflector::{self, ReflectorConfig, Sink};
use super::store::{IndexFn, Store};
use super::{Event, Handler, HandlerId, InformerError};
use crate::client::{Api, ApiResource, Undecodable};
use crate::metrics::InformerMetrics;
use crate::object::{Object, ObjectKey};

/// How an informer lists and watches.
#[derive(Clone, Debug)]
pub struct InformerOptions {
    /// Only objects matching this label selector.
    pub label_selector: Option<String>,
    /// Only objects matching this field selector.
    pub field_selector: Option<String>,
    /// LIST page size (`limit`); `None` lists in one page.
    pub page_size: Option<u32>,
    /// Server-side watch timeout; the watch is then resumed from the last resourceVersion.
    pub watch_timeout: Duration,
    /// Delay between failed list/watch attempts.
    pub backoff: Backoff,
    /// Default resync period of subscribers that do not choose one (none: no resync).
    pub resync: Option<Duration>,
    /// Drop `metadata.managedFields` from every object before it is cached or handed to
    /// handlers. Field ownership is often the largest part of an object and controllers rarely
    /// read it; an update that omits it keeps the server's copy, so writes lose nothing. Off
    /// by default: a controller that extracts its own applied configuration needs it.
    pub strip_managed_fields: bool,
    /// Every period, hold the objects nobody has written (or holds outside the cache) since
    /// the previous period as the JSON they serialize to, about a quarter of a decoded pod's
    /// memory; reads decode them again (a few microseconds each), writes replace them. For
    /// large caches of mostly idle objects (pods on a busy cluster). Off by default: the
    /// type's serde must round-trip (k8s-openapi types and dynamic objects do), and reads of
    /// idle objects cost a decode.
    pub compact_idle: Option<Duration>,
    /// Where skipped objects are counted: an object that does not decode as the informer's
    /// type is left out of the cache (and logged once per object) rather than failing the
    /// whole LIST; see [`InformerMetrics`]. `None`: counted nowhere.
    pub metrics: Option<InformerMetrics>,
}

impl InformerOptions {
    /// The options Setpoint's own components use, as Kubernetes' keep their caches: without
    /// `managedFields`, and with objects idle for 5 to 10 seconds packed
    /// ([`InformerOptions::compact_idle`]). A pod is busy for the second or two from create
    /// to Running; a longer period only keeps more finished pods decoded (at 150,000 pods,
    /// 10 s held about 250 MiB more at the peak for no measurable CPU).
    pub fn lean() -> Self {
        InformerOptions {
            strip_managed_fields: true,
            compact_idle: Some(Duration::from_secs(5)),
            ..InformerOptions::default()
        }
    }
}

impl Default for InformerOptions {
    fn default() -> Self {
        InformerOptions {
            label_selector: None,
            field_selector: None,
            page_size: Some(500),
            watch_timeout: Duration::from_secs(290),
            backoff: Backoff::default(),
            resync: None,
            strip_managed_fields: false,
            compact_idle: None,
            metrics: None,
        }
    }
}

/// One resource (in one namespace or all, optionally filtered by selectors), cached and
/// watched. Cheap to clone: clones are handles to the same informer.
///
/// Usually obtained from [`SharedInformers`](super::SharedInformers); [`Informer::new`] +
/// [`Informer::start`] build a private one (e.g. over a special client).
pub struct Informer<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Informer<K> {
    fn clone(&self) -> Self {
        Informer {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<K> {
    api: Api<K>,
    options: InformerOptions,
    store: Store<K>,
    dispatch: Mutex<Dispatcher<K>>,
    /// Wakes the resync loop when the schedule changes (a subscriber joined or left).
    resync_changed: Notify,
    stop: watch::Sender<bool>,
    started: AtomicBool,
    /// The keys whose latest state did not decode: each is logged when it joins, not again
    /// while it stays (a bad object can be relisted and modified many times).
    undecodable: Mutex<HashSet<ObjectKey>>,
    /// The resource as metrics and logs name it (`deployments.apps`, `pods`).
    resource_label: String,
}

struct Dispatcher<K> {
    subscribers: Vec<Subscriber<K>>,
    next_id: u64,
}

struct Subscriber<K> {
    id: HandlerId,
    handler: Handler<K>,
    resync: Option<Duration>,
    next_resync: Option<Instant>,
}

thread_local! {
    /// Set while this thread delivers events under the dispatch lock, to turn a handler that
    /// subscribes (which would deadlock on that lock) into a clear panic.
    static DISPATCHING: Cell<bool> = const { Cell::new(false) };
}

struct DispatchGuard;

impl DispatchGuard {
    fn enter() -> Self {
        DISPATCHING.with(|d| d.set(true));
        DispatchGuard
    }
}

impl Drop for DispatchGuard {
    fn drop(&mut self) {
        DISPATCHING.with(|d| d.set(false));
    }
}

fn assert_not_dispatching(what: &str) {
    if DISPATCHING.with(Cell::get) {
        panic!(
            "Informer::{what} called from inside an event handler; handlers must only enqueue work"
        );
    }
}

/// Calls one handler. A panicking handler is logged and skipped rather than killing the
/// informer, which every other subscriber depends on.
fn deliver<K>(handler: &Handler<K>, event: &Event<K>) {
    if std::panic::catch_unwind(AssertUnwindSafe(|| handler(event))).is_err() {
        tracing::error!("an informer event handler panicked; the event was skipped for it");
    }
}

impl<K> Dispatcher<K> {
    fn deliver_all(&self, events: &[Event<K>]) {
        if events.is_empty() || self.subscribers.is_empty() {
            return;
        }
        let _guard = DispatchGuard::enter();
        for event in events {
            for s in &self.subscribers {
                deliver(&s.handler, event);
            }
        }
    }

    fn next_resync(&self) -> Option<Instant> {
        self.subscribers.iter().filter_map(|s| s.next_resync).min()
    }
}

impl<K: Object> Informer<K> {
    /// An informer over `api` (its resource and namespace), not started yet.
    pub fn new(api: Api<K>, options: InformerOptions) -> Self {
        // Pods are the one built-in kind with `spec.nodeName`; for a user type standing in
        // for them, read it from the serialized object.
        let store = Store::with_node_fallback(api.resource().kind == "Pod");
        let resource_label = match api.resource().group.as_str() {
            "" => api.resource().plural.clone(),
            group => format!("{}.{group}", api.resource().plural),
        };
        Informer {
            inner: Arc::new(Inner {
                api,
                options,
                store,
                dispatch: Mutex::new(Dispatcher {
                    subscribers: Vec::new(),
                    next_id: 1,
                }),
                resync_changed: Notify::new(),
                stop: watch::channel(false).0,
                started: AtomicBool::new(false),
                undecodable: Mutex::new(HashSet::new()),
                resource_label,
            }),
        }
    }

    /// Starts listing and watching on a new task (once; later calls do nothing). Must be
    /// called within a Tokio runtime.
    pub fn start(&self) {
        if *self.inner.stop.borrow() || self.inner.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let inner = self.inner.clone();
        let span = tracing::info_span!(
            "informer",
            resource = %inner.api.resource().plural,
            namespace = ?inner.api.namespace(),
            labels = ?inner.options.label_selector,
            fields = ?inner.options.field_selector,
        );
        tokio::spawn(run(inner).instrument(span));
    }

    /// Signals the informer to stop; its watch ends shortly after. See [`Informer::shutdown`]
    /// to wait for that.
    pub fn stop(&self) {
        self.inner.stop.send_replace(true);
        if !self.inner.started.load(Ordering::SeqCst) {
            // No task will ever mark it, and `wait_synced` callers must not hang.
            self.inner.store.mark_stopped();
        }
    }

    /// Stops the informer and waits until its task has ended (its watch is closed).
    pub async fn shutdown(&self) {
        self.stop();
        // The task marks the store stopped when it ends (`stop` does it if none ever ran).
        self.inner.store.wait_stopped().await;
    }

    /// The cache.
    pub fn store(&self) -> Store<K> {
        self.inner.store.clone()
    }

    /// Registers a handler with the informer's default resync period. It first receives
    /// every cached object as [`Event::Added`], then every change — atomically, so nothing
    /// is missed or repeated in between. The snapshot is delivered on the caller's thread,
    /// before this returns.
    pub fn subscribe(&self, handler: Handler<K>) -> HandlerId {
        self.subscribe_with_resync(handler, self.inner.options.resync)
    }

    /// Like [`Informer::subscribe`], with this handler's own resync period: every `resync`
    /// it receives each cached object again as `Updated { old, new }` with `old` and `new`
    /// the same `Arc`.
    pub fn subscribe_with_resync(
        &self,
        handler: Handler<K>,
        resync: Option<Duration>,
    ) -> HandlerId {
        assert_not_dispatching("subscribe");
        let resync = resync.filter(|r| !r.is_zero());
        let mut dispatch = self.inner.dispatch.lock();
        {
            let _guard = DispatchGuard::enter();
            for object in self.inner.store.list() {
                deliver(&handler, &Event::Added(object));
            }
        }
        let id = HandlerId(dispatch.next_id);
        dispatch.next_id += 1;
        dispatch.subscribers.push(Subscriber {
            id,
            handler,
            resync,
            next_resync: resync.map(|r| Instant::now() + r),
        });
        drop(dispatch);
        if resync.is_some() {
            self.inner.resync_changed.notify_one();
        }
        id
    }

    /// Removes a handler; returns whether it was registered. Once this returns, the handler
    /// is not called again.
    pub fn unsubscribe(&self, id: HandlerId) -> bool {
        assert_not_dispatching("unsubscribe");
        let mut dispatch = self.inner.dispatch.lock();
        let before = dispatch.subscribers.len();
        dispatch.subscribers.retain(|s| s.id != id);
        let removed = dispatch.subscribers.len() != before;
        drop(dispatch);
        self.inner.resync_changed.notify_one();
        removed
    }

    /// Registers an index on the cache (see [`Store::add_index`]).
    pub fn add_index(&self, name: &str, f: IndexFn<K>) -> Result<(), InformerError> {
        self.inner.store.add_index(name, f)
    }

    /// Whether the first LIST has been applied (and its events delivered).
    pub fn has_synced(&self) -> bool {
        self.inner.store.has_synced()
    }

    /// Waits for the first LIST; fails if the informer stops first.
    pub async fn wait_synced(&self) -> Result<(), InformerError> {
        self.inner.store.wait_synced().await
    }

    /// The resource this informer watches.
    pub fn resource(&self) -> &ApiResource {
        self.inner.api.resource()
    }

    /// The namespace it watches (None: all namespaces, or a cluster-scoped resource).
    pub fn namespace(&self) -> Option<&str> {
        self.inner.api.namespace()
    }

    /// The options it was built with.
    pub fn options(&self) -> &InformerOptions {
        &self.inner.options
    }

    /// Whether two handles are the same informer.
    pub fn ptr_eq(&self, other: &Informer<K>) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl<K: Object> Inner<K> {
    /// Applies one watch event to the store and delivers what it amounts to, under the
    /// dispatch lock.
    fn publish(&self, apply: impl FnOnce(&Store<K>) -> Option<Event<K>>) {
        let dispatch = self.dispatch.lock();
        let event = apply(&self.store);
        dispatch.deliver_all(event.as_slice());
    }

    /// Redelivers every cached object to the subscribers whose resync is due.
    fn resync_due(&self) {
        let now = Instant::now();
        let mut dispatch = self.dispatch.lock();
        let synced = self.store.has_synced();
        let mut snapshot = None;
        let _guard = DispatchGuard::enter();
        for s in dispatch.subscribers.iter_mut() {
            let (Some(at), Some(period)) = (s.next_resync, s.resync) else {
                continue;
            };
            if at > now {
                continue;
            }
            s.next_resync = Some(now + period);
            // Before the first list the cache is partial; its events are on their way anyway.
            if !synced {
                continue;
            }
            let objects = snapshot.get_or_insert_with(|| self.store.list());
            for o in objects.iter() {
                deliver(
                    &s.handler,
                    &Event::Updated {
                        old: o.clone(),
                        new: o.clone(),
                    },
                );
            }
        }
    }

    async fn resync_loop(&self) {
        loop {
            let next = self.dispatch.lock().next_resync();
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => self.resync_due(),
                        _ = self.resync_changed.notified() => {}
                    }
                }
                None => self.resync_changed.notified().await,
            }
        }
    }
}

/// The cache key of an object that did not decode.
fn key_of(object: &Undecodable) -> ObjectKey {
    ObjectKey::new(object.namespace.as_deref(), &object.name)
}

impl<K: Object> Inner<K> {
    /// Counts a skipped object and logs it if its key was not already known to be bad. Never
    /// logs the object's content: it may hold anything, secrets included.
    fn skipped(&self, object: &Undecodable, bad: &mut HashSet<ObjectKey>) -> ObjectKey {
        if let Some(m) = &self.options.metrics {
            m.decode_error(&self.resource_label);
        }
        let key = key_of(object);
        if !bad.contains(&key) {
            tracing::warn!(
                resource = %self.resource_label,
                namespace = object.namespace.as_deref().unwrap_or(""),
                name = %object.name,
                error = %object.error,
                "object does not decode; skipped until it changes"
            );
            bad.insert(key.clone());
        }
        key
    }

    /// `object` decodes (or is gone): it may be logged again if it breaks again.
    fn recovered(&self, object: &K) {
        let mut bad = self.undecodable.lock();
        // The common case, on every watch event: nothing is bad, and no key is built.
        if bad.is_empty() {
            return;
        }
        let key = ObjectKey::of(object);
        if bad.remove(&key) {
            tracing::info!(resource = %self.resource_label, key = %key, "object decodes again");
        }
    }
}

impl<K: Object> Sink<K> for Inner<K> {
    fn relisted(&self, items: Vec<K>, skipped: Vec<Undecodable>) {
        {
            let mut bad = self.undecodable.lock();
            // Keys bad before and still bad are not logged again; the others are fixed or gone.
            let still: HashSet<ObjectKey> = skipped.iter().map(key_of).collect();
            bad.retain(|k| still.contains(k));
            for u in &skipped {
                self.skipped(u, &mut bad);
            }
        }
        let dispatch = self.dispatch.lock();
        // A skipped object is not in `items`, so a cached copy of it is removed here.
        let events = self.store.replace(items);
        dispatch.deliver_all(&events);
        // After delivery and still under the lock: once `wait_synced` returns, every
        // subscriber has had the initial list's events.
        self.store.mark_synced();
    }

    fn upserted(&self, object: K) {
        self.recovered(&object);
        self.publish(|store| store.upsert(object));
    }

    fn deleted(&self, object: K) {
        self.recovered(&object);
        self.publish(|store| store.delete(object));
    }

    fn undecodable(&self, object: Undecodable, deleted: bool) {
        let key = if deleted {
            let key = key_of(&object);
            if let Some(m) = &self.options.metrics {
                m.decode_error(&self.resource_label);
            }
            // Gone: if it comes back broken, that is news again.
            self.undecodable.lock().remove(&key);
            key
        } else {
            self.skipped(&object, &mut self.undecodable.lock())
        };
        // Its current state is unknown: keeping the cached one would act on a stale copy for
        // as long as the watch lasts. Absent is what the next relist would make it (its LIST
        // leaves it out), so that is what the cache says now.
        self.publish(|store| store.delete_key(&key));
    }
}

/// Marks the store stopped when the task ends however it ends (stop signal, panic, runtime
/// shutdown), so `wait_synced` and `shutdown` never hang.
struct StoppedOnDrop<K: Object>(Store<K>);

impl<K: Object> Drop for StoppedOnDrop<K> {
    fn drop(&mut self) {
        self.0.mark_stopped();
    }
}

/// Packs idle objects every `period` (see [`InformerOptions::compact_idle`]); never returns.
async fn compact_loop<K: Object>(store: Store<K>, period: Option<Duration>) {
    let Some(period) = period else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval(period.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let store = store.clone();
        // Serializing thousands of objects would hold up a runtime thread.
        let pass = tokio::task::spawn_blocking(move || {
            let packed = store.compact_idle();
            // Counting is a pass over the whole cache: only when someone reads it.
            let held =
                tracing::enabled!(tracing::Level::DEBUG).then(|| (store.packed_len(), store.len()));
            (packed, held)
        });
        match pass.await {
            Ok((packed, Some((held_packed, entries)))) => {
                tracing::debug!(packed, held_packed, entries, "compacted idle cache entries")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cache compaction failed"),
        }
    }
}

async fn run<K: Object>(inner: Arc<Inner<K>>) {
    let _stopped = StoppedOnDrop(inner.store.clone());
    let mut stop = inner.stop.subscribe();
    let config = ReflectorConfig {
        label_selector: inner.options.label_selector.clone(),
        field_selector: inner.options.field_selector.clone(),
        page_size: inner.options.page_size,
        watch_timeout: inner.options.watch_timeout,
        backoff: inner.options.backoff,
        strip_managed_fields: inner.options.strip_managed_fields,
    };
    let sink: &dyn Sink<K> = &*inner;
    tokio::select! {
        _ = reflector::run(inner.api.clone(), config, sink) => {}
        _ = inner.resync_loop() => {}
        _ = compact_loop(inner.store.clone(), inner.options.compact_idle) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
    tracing::debug!("informer stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Body, Client, ClientError, Transport};
    use k8s_openapi::api::core::v1::ConfigMap;

    /// The informer is driven through its `Sink` directly; nothing reaches the network.
    struct Unreachable;

    #[async_trait::async_trait]
    impl Transport for Unreachable {
        async fn send(
            &self,
            _: http::Request<bytes::Bytes>,
        ) -> Result<http::Response<Body>, ClientError> {
            Err(ClientError::Transport("unreachable".into()))
        }
    }

    fn informer() -> Informer<ConfigMap> {
        Informer::new(
            Api::namespaced(Client::new(Unreachable), "default"),
            InformerOptions::default(),
        )
    }

    fn cm(name: &str, rv: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.namespace = Some("default".into());
        c.metadata.name = Some(name.into());
        c.metadata.resource_version = Some(rv.into());
        c
    }

    fn recorder() -> (Handler<ConfigMap>, Arc<Mutex<Vec<String>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = log.clone();
        let handler: Handler<ConfigMap> = Arc::new(move |e: &Event<ConfigMap>| {
            let what = match e {
                Event::Added(_) => "added",
                Event::Updated { .. } if e.is_resync() => "resync",
                Event::Updated { .. } => "updated",
                Event::Deleted(_) => "deleted",
            };
            l.lock().push(format!("{what} {}", e.key()));
        });
        (handler, log)
    }

    #[test]
    fn late_subscribers_start_from_a_snapshot_and_unsubscribed_ones_hear_nothing() {
        let inf = informer();
        let (early, early_log) = recorder();
        let early_id = inf.subscribe(early);
        inf.inner
            .relisted(vec![cm("a", "1"), cm("b", "2")], Vec::new());
        assert!(inf.has_synced());
        inf.inner.upserted(cm("a", "3"));

        let (late, late_log) = recorder();
        inf.subscribe(late);
        assert_eq!(*late_log.lock(), ["added default/a", "added default/b"]);
        inf.inner.deleted(cm("b", "4"));
        assert!(inf.unsubscribe(early_id));
        assert!(!inf.unsubscribe(early_id));
        inf.inner.upserted(cm("c", "5"));

        assert_eq!(
            *early_log.lock(),
            [
                "added default/a",
                "added default/b",
                "updated default/a",
                "deleted default/b"
            ]
        );
        assert_eq!(
            *late_log.lock(),
            [
                "added default/a",
                "added default/b",
                "deleted default/b",
                "added default/c"
            ]
        );
    }

    #[test]
    fn a_panicking_or_reentrant_handler_does_not_break_the_others() {
        let inf = informer();
        let again = inf.clone();
        inf.subscribe(Arc::new(|_: &Event<ConfigMap>| panic!("handler bug")));
        // Subscribing from a handler would deadlock; it panics instead, and is contained.
        inf.subscribe(Arc::new(move |_: &Event<ConfigMap>| {
            again.subscribe(Arc::new(|_: &Event<ConfigMap>| {}));
        }));
        let (good, log) = recorder();
        inf.subscribe(good);
        inf.inner.upserted(cm("a", "1"));
        inf.inner.upserted(cm("a", "2"));
        assert_eq!(*log.lock(), ["added default/a", "updated default/a"]);
        assert_eq!(inf.inner.dispatch.lock().subscribers.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn resync_follows_each_subscribers_period() {
        let inf = informer();
        inf.inner.relisted(vec![cm("a", "1")], Vec::new());
        let (fast, fast_log) = recorder();
        let (slow, slow_log) = recorder();
        let (none, none_log) = recorder();
        inf.subscribe_with_resync(fast, Some(Duration::from_secs(10)));
        inf.subscribe_with_resync(slow, Some(Duration::from_secs(25)));
        inf.subscribe(none);
        let resyncs = {
            let inner = inf.inner.clone();
            tokio::spawn(async move { inner.resync_loop().await })
        };
        tokio::time::sleep(Duration::from_secs(31)).await;
        resyncs.abort();
        let count = |log: &Arc<Mutex<Vec<String>>>| {
            log.lock()
                .iter()
                .filter(|l| l.starts_with("resync"))
                .count()
        };
        assert_eq!(count(&fast_log), 3);
        assert_eq!(count(&slow_log), 1);
        assert_eq!(count(&none_log), 0);
    }

    /// Counts the warnings logged on this thread.
    struct Warnings(Arc<std::sync::atomic::AtomicUsize>);

    impl tracing::Subscriber for Warnings {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            if *event.metadata().level() == tracing::Level::WARN {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    fn bad(name: &str, rv: &str) -> Undecodable {
        Undecodable {
            namespace: Some("default".into()),
            name: name.into(),
            resource_version: Some(rv.into()),
            error: "invalid type: string \"x\", expected i32".into(),
        }
    }

    #[test]
    fn undecodable_objects_are_absent_counted_and_logged_once_while_bad() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = InformerMetrics::new(&mut registry);
        let inf = Informer::new(
            Api::namespaced(Client::new(Unreachable), "default"),
            InformerOptions {
                metrics: Some(metrics.clone()),
                ..InformerOptions::default()
            },
        );
        let (handler, log) = recorder();
        inf.subscribe(handler);
        let warnings = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        tracing::subscriber::with_default(Warnings(warnings.clone()), || {
            inf.inner
                .relisted(vec![cm("a", "1"), cm("b", "2")], vec![bad("c", "3")]);
            // Bad again in a relist, then in two watch events: logged once in all.
            inf.inner
                .relisted(vec![cm("a", "1"), cm("b", "2")], vec![bad("c", "3")]);
            inf.inner.undecodable(bad("c", "4"), false);
            inf.inner.undecodable(bad("c", "5"), false);
            assert_eq!(warnings.load(Ordering::SeqCst), 1);
            // A cached object that turns bad leaves the cache.
            inf.inner.undecodable(bad("a", "6"), false);
            assert_eq!(warnings.load(Ordering::SeqCst), 2);
            // Fixed, it comes back; broken again, it is news again.
            inf.inner.upserted(cm("c", "7"));
            inf.inner.undecodable(bad("c", "8"), false);
            assert_eq!(warnings.load(Ordering::SeqCst), 3);
            // A DELETED event that does not decode still removes the key.
            inf.inner.upserted(cm("c", "9"));
            inf.inner.undecodable(bad("c", "10"), true);
        });
        assert_eq!(metrics.decode_errors("configmaps"), 7);
        assert_eq!(inf.store().keys(), [ObjectKey::new(Some("default"), "b")]);
        assert_eq!(
            *log.lock(),
            [
                "added default/a",
                "added default/b",
                "deleted default/a",
                "added default/c",
                "deleted default/c",
                "added default/c",
                "deleted default/c"
            ]
        );
    }

    #[tokio::test]
    async fn stopping_before_start_fails_waiters_instead_of_hanging() {
        let inf = informer();
        inf.stop();
        inf.start();
        assert_eq!(inf.wait_synced().await, Err(InformerError::Stopped));
        inf.shutdown().await;
    }
}
