//! An event recorder: controllers tell users what they did (and what failed) through core/v1
//! Events about the objects involved, as `kubectl describe` shows them.
//!
//! ```no_run
//! # async fn demo(client: setpoint_runtime::Client, rs: k8s_openapi::api::apps::v1::ReplicaSet) {
//! use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
//!
//! let recorder = EventRecorder::new(client, Reporter::new("replicaset-controller"));
//! // Returns at once; the write happens on a background task.
//! recorder.publish(&rs.object_reference(), EventType::Normal, "SuccessfulCreate", "Created pod: web-7x2k");
//! // Tests wait for the writes before looking.
//! recorder.flush().await;
//! # }
//! ```
//!
//! # Semantics
//!
//! - **Fire and forget.** [`EventRecorder::publish`] never waits: it checks the rate limit,
//!   then hands the event to a background task through a bounded queue. A full queue drops
//!   the event. Write failures are logged. A reconcile is never slowed down or failed by its
//!   events.
//! - **Aggregation.** The same (object, type, reason, message) seen again within
//!   [`EventRecorderConfig::aggregation_window`] of its last occurrence updates the Event
//!   already written (`count` + 1, `lastTimestamp`) with a merge patch instead of creating
//!   another, as client-go's event correlator does. What was written is remembered in a
//!   bounded LRU (4096 entries by default); an Event the server has since deleted is created
//!   again.
//! - **Rate limit.** Each involved object has a token bucket (burst 25, one token back every
//!   5 minutes by default — client-go's spam filter), so a controller stuck in a hot loop
//!   cannot flood the API. Repeats count too, because each one is a write. Drops are counted
//!   in [`EventRecorder::dropped`] and, if configured, `event_recorder_dropped_total{reason}`.
//! - **Where.** Events live in the involved object's namespace; events about cluster-scoped
//!   objects go to `default`, as the API server requires.
//! - **Names** are `<object-name>.<16 random hex digits>`, as upstream (made a valid DNS
//!   subdomain if the object's name is not, e.g. `system:` cluster roles).

mod lru;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use self::lru::Lru;
use crate::client::{Api, Client, ClientError, DynamicObject, Patch, PatchParams, PostParams};
use crate::metrics::EventMetrics;
use crate::object::Object;

/// `Normal` for routine progress, `Warning` for something a human may need to look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Routine progress (`type: Normal`).
    Normal,
    /// Something a human may need to look at (`type: Warning`).
    Warning,
}

impl EventType {
    /// The Event's `type` text: `Normal` or `Warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Who reports: `source.component` / `reportingComponent` and `reportingInstance`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reporter {
    /// The controller, e.g. `replicaset-controller`.
    pub component: String,
    /// This replica of it, e.g. `replicaset-controller-<hostname>`.
    pub instance: String,
}

impl Reporter {
    /// `component`, with an instance named after it and the host.
    pub fn new(component: &str) -> Self {
        Reporter {
            component: component.into(),
            instance: format!("{component}-{}", crate::leader::hostname()),
        }
    }
}

/// Limits of a recorder. The defaults follow client-go.
#[derive(Clone, Debug)]
pub struct EventRecorderConfig {
    /// Events waiting to be written; beyond this, `publish` drops.
    pub queue_capacity: usize,
    /// Objects remembered for aggregation and for rate limiting.
    pub cache_size: usize,
    /// A repeat later than this after the previous occurrence starts a new Event.
    pub aggregation_window: Duration,
    /// Events per object allowed at once.
    pub burst: u32,
    /// Time for one more event per object to be allowed after the burst is spent.
    pub refill_interval: Duration,
    /// Counts drops in `event_recorder_dropped_total{reason}`.
    pub metrics: Option<EventMetrics>,
}

impl Default for EventRecorderConfig {
    fn default() -> Self {
        EventRecorderConfig {
            queue_capacity: 1000,
            cache_size: 4096,
            aggregation_window: Duration::from_secs(600),
            burst: 25,
            refill_interval: Duration::from_secs(300),
            metrics: None,
        }
    }
}

/// The `involvedObject` of an event about `self`.
pub trait ToObjectReference {
    /// An `ObjectReference` naming this object: apiVersion, kind, namespace, name, uid and
    /// resourceVersion.
    fn object_reference(&self) -> ObjectReference;
}

impl<K: k8s_openapi::Resource + Object> ToObjectReference for K {
    fn object_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(K::API_VERSION.into()),
            kind: Some(K::KIND.into()),
            name: Some(self.name()),
            namespace: self.namespace(),
            uid: self.uid(),
            resource_version: self.resource_version(),
            field_path: None,
        }
    }
}

impl ToObjectReference for DynamicObject {
    fn object_reference(&self) -> ObjectReference {
        let s = |f: &str| self.0.get(f).and_then(Value::as_str).map(String::from);
        ObjectReference {
            api_version: s("apiVersion"),
            kind: s("kind"),
            name: Some(self.name()),
            namespace: self.namespace(),
            uid: self.uid(),
            resource_version: self.resource_version(),
            field_path: None,
        }
    }
}

/// Writes Events in the background; cheap to clone. The background task ends once every
/// clone is dropped and the queue is drained.
#[derive(Clone)]
pub struct EventRecorder {
    inner: Arc<Inner>,
}

struct Inner {
    tx: mpsc::Sender<Command>,
    limiter: Mutex<Lru<String, Bucket>>,
    burst: f64,
    refill_interval: Duration,
    dropped: AtomicU64,
    metrics: Option<EventMetrics>,
}

enum Command {
    Record(Box<Pending>),
    Flush(oneshot::Sender<()>),
}

struct Pending {
    regarding: ObjectReference,
    object: String,
    type_: EventType,
    reason: String,
    message: String,
    at: Instant,
    wall: Timestamp,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl EventRecorder {
    /// A recorder with the default limits. Spawns its writer, so it needs a Tokio runtime.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        EventRecorder::with_config(client, reporter, EventRecorderConfig::default())
    }

    /// A recorder with chosen limits.
    pub fn with_config(client: Client, reporter: Reporter, config: EventRecorderConfig) -> Self {
        let (tx, rx) = mpsc::channel(config.queue_capacity.max(1));
        let writer = Writer {
            client,
            reporter,
            window: config.aggregation_window,
            written: Lru::new(config.cache_size),
        };
        tokio::spawn(writer.run(rx));
        EventRecorder {
            inner: Arc::new(Inner {
                tx,
                limiter: Mutex::new(Lru::new(config.cache_size)),
                burst: f64::from(config.burst),
                refill_interval: config.refill_interval,
                dropped: AtomicU64::new(0),
                metrics: config.metrics,
            }),
        }
    }

    /// Records an event about `regarding`; returns at once (see the module docs).
    pub fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        message: &str,
    ) {
        let object = object_key(regarding);
        if !self.inner.allow(&object) {
            self.inner.drop_event("rate_limited", regarding, reason);
            return;
        }
        let pending = Pending {
            regarding: regarding.clone(),
            object,
            type_,
            reason: reason.into(),
            message: truncate(message, MAX_MESSAGE_BYTES),
            at: Instant::now(),
            wall: now(),
        };
        match self.inner.tx.try_send(Command::Record(Box::new(pending))) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.inner.drop_event("queue_full", regarding, reason)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.inner.drop_event("closed", regarding, reason)
            }
        }
    }

    /// Waits until every event published before this call has been written (or has failed).
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.inner.tx.send(Command::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }

    /// Events dropped so far (rate limited, queue full).
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }
}

/// Longer messages are cut: events.k8s.io's limit for `note`, and protection against a
/// controller pasting a whole response body into every event.
const MAX_MESSAGE_BYTES: usize = 1024;

fn truncate(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_string();
    }
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_string()
}

impl Inner {
    /// Takes a token from the object's bucket.
    fn allow(&self, object: &str) -> bool {
        let now = Instant::now();
        let mut limiter = self.limiter.lock();
        let key = object.to_string();
        if limiter.get_mut(&key).is_none() {
            limiter.insert(
                key.clone(),
                Bucket {
                    tokens: self.burst,
                    at: now,
                },
            );
        }
        let Some(b) = limiter.get_mut(&key) else {
            return true;
        };
        let refill = if self.refill_interval.is_zero() {
            f64::INFINITY
        } else {
            now.saturating_duration_since(b.at).as_secs_f64() / self.refill_interval.as_secs_f64()
        };
        b.tokens = (b.tokens + refill).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn drop_event(&self, why: &str, regarding: &ObjectReference, reason: &str) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.dropped(why);
        }
        tracing::debug!(
            object = %object_key(regarding),
            %reason,
            "event dropped: {why}"
        );
    }
}

/// Identifies the involved object across events: its uid, or its coordinates if it has none.
fn object_key(r: &ObjectReference) -> String {
    let field = r.field_path.as_deref().unwrap_or("");
    match r.uid.as_deref().filter(|u| !u.is_empty()) {
        Some(uid) => format!("{uid}#{field}"),
        None => format!(
            "{}/{}/{}/{}#{field}",
            r.api_version.as_deref().unwrap_or(""),
            r.kind.as_deref().unwrap_or(""),
            r.namespace.as_deref().unwrap_or(""),
            r.name.as_deref().unwrap_or("")
        ),
    }
}

fn now() -> Timestamp {
    Timestamp::from_microsecond(chrono::Utc::now().timestamp_micros())
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// `<object-name>.<16 hex digits>`, kept a valid DNS subdomain of at most 253 characters.
fn event_name(object_name: &str) -> String {
    let mut base: String = object_name
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(253 - 17)
        .collect();
    while base.ends_with(['-', '.']) {
        base.pop();
    }
    let base = base.trim_start_matches(['-', '.']);
    let base = if base.is_empty() { "event" } else { base };
    format!("{base}.{:016x}", rand::random::<u64>())
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct AggregateKey {
    object: String,
    type_: EventType,
    reason: String,
    message: String,
}

/// An Event this recorder wrote and may update.
#[derive(Clone)]
struct Written {
    namespace: String,
    name: String,
    count: i32,
    first: Timestamp,
    last_seen: Instant,
}

struct Writer {
    client: Client,
    reporter: Reporter,
    window: Duration,
    written: Lru<AggregateKey, Written>,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        // One write at a time keeps the aggregation simple and correct (two repeats of the
        // same event never race to create two Events), and bounds the load this recorder
        // puts on the API server.
        while let Some(cmd) = rx.recv().await {
            match cmd {
                Command::Record(p) => self.write(*p).await,
                Command::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    async fn write(&mut self, p: Pending) {
        let key = AggregateKey {
            object: p.object.clone(),
            type_: p.type_,
            reason: p.reason.clone(),
            message: p.message.clone(),
        };
        let mut carried = None;
        if let Some(prev) = self.written.get_mut(&key).cloned() {
            if p.at.saturating_duration_since(prev.last_seen) <= self.window {
                match self.update(&prev, &p).await {
                    Ok(()) => {
                        if let Some(w) = self.written.get_mut(&key) {
                            w.count += 1;
                            w.last_seen = p.at;
                        }
                        return;
                    }
                    // Deleted on the server (TTL, or by hand): write it again, keeping the
                    // count and first time so the history is not lost.
                    Err(e) if e.is_not_found() => carried = Some(prev),
                    Err(e) => {
                        tracing::warn!(event = %prev.name, namespace = %prev.namespace, "failed to update event: {e}");
                        return;
                    }
                }
            }
            self.written.remove(&key);
        }
        let (count, first) = carried.map_or((1, p.wall), |c| (c.count.saturating_add(1), c.first));
        match self.create(&p, count, first).await {
            Ok((namespace, name)) => self.written.insert(
                key,
                Written {
                    namespace,
                    name,
                    count,
                    first,
                    last_seen: p.at,
                },
            ),
            Err(e) => tracing::warn!(
                object = %p.object,
                reason = %p.reason,
                "failed to write event: {e}"
            ),
        }
    }

    async fn update(&self, prev: &Written, p: &Pending) -> Result<(), ClientError> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &prev.namespace);
        let last =
            serde_json::to_value(Time(p.wall)).map_err(|e| ClientError::Decode(e.to_string()))?;
        let patch = json!({"count": prev.count.saturating_add(1), "lastTimestamp": last});
        api.patch(&prev.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map(|_| ())
    }

    async fn create(
        &self,
        p: &Pending,
        count: i32,
        first: Timestamp,
    ) -> Result<(String, String), ClientError> {
        let namespace = p
            .regarding
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let name = event_name(p.regarding.name.as_deref().unwrap_or(""));
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: p.regarding.clone(),
            type_: Some(p.type_.as_str().into()),
            reason: Some(p.reason.clone()),
            message: Some(p.message.clone()),
            source: Some(EventSource {
                component: Some(self.reporter.component.clone()),
                host: None,
            }),
            reporting_component: Some(self.reporter.component.clone()),
            reporting_instance: Some(self.reporter.instance.clone()),
            first_timestamp: Some(Time(first)),
            last_timestamp: Some(Time(p.wall)),
            event_time: Some(MicroTime(p.wall)),
            count: Some(count),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        api.create_metadata(&PostParams::default(), &event).await?;
        Ok((namespace, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_are_valid_and_unique() {
        let a = event_name("web-7x2k");
        assert!(
            a.starts_with("web-7x2k.") && a.len() == "web-7x2k.".len() + 16,
            "{a}"
        );
        assert_ne!(a, event_name("web-7x2k"));
        let r = event_name("system:controller:Foo");
        assert!(r.starts_with("system-controller-foo."), "{r}");
        assert!(event_name("").starts_with("event."));
        assert!(event_name(&"x".repeat(400)).len() <= 253);
    }

    #[test]
    fn messages_are_cut_on_a_character_boundary() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("héllo", 3), "hé");
        assert_eq!(truncate("short", 1024), "short");
    }

    #[test]
    fn object_keys_prefer_the_uid() {
        let mut r = ObjectReference {
            kind: Some("Pod".into()),
            name: Some("p".into()),
            namespace: Some("ns".into()),
            ..ObjectReference::default()
        };
        assert_eq!(object_key(&r), "/Pod/ns/p#");
        r.uid = Some("u1".into());
        assert_eq!(object_key(&r), "u1#");
    }

    #[tokio::test(start_paused = true)]
    async fn buckets_refill_over_time() {
        let client = Client::new(crate::client::ServiceTransport::new(tower::service_fn(
            |_req: http::Request<http_body_util::Full<bytes::Bytes>>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
                    bytes::Bytes::from_static(b"{}"),
                )))
            },
        )));
        let config = EventRecorderConfig {
            burst: 2,
            refill_interval: Duration::from_secs(60),
            ..EventRecorderConfig::default()
        };
        let r = EventRecorder::with_config(client, Reporter::new("test"), config);
        assert!(r.inner.allow("o"));
        assert!(r.inner.allow("o"));
        assert!(!r.inner.allow("o"));
        // Another object has its own bucket.
        assert!(r.inner.allow("p"));
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(!r.inner.allow("o"));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(r.inner.allow("o"));
        assert!(!r.inner.allow("o"));
        // Never more than the burst, however long it has been.
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(r.inner.allow("o"));
        assert!(r.inner.allow("o"));
        assert!(!r.inner.allow("o"));
    }
}
