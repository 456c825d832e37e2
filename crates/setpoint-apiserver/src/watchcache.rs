//! The watch cache: per storage resource, the current objects plus a window of recent events,
//! all fed by one store watch on `/registry/`.
//!
//! LIST (without a limit) and WATCH are served from here. A watch that starts at a revision
//! inside the window replays the missed events from it; one older than the window gets 410.
//! A starting server loads the caches as of a recent past revision and replays the store's
//! events since, so the window already holds them and the clients of a server that restarted
//! resume where they were instead of all relisting at once.
//! Every cache advances to the store revision of each watch response under its own lock, so a
//! snapshot taken under that lock is exactly "the state at revision R" and a watch from R
//! continues it without gaps or duplicates.
//!
//! Each watcher's queue of events not yet taken by its connection is bounded in bytes
//! ([`CacheConfig::watcher_buffer_bytes`]); a watcher that falls further behind is dropped (its
//! stream ends) instead of growing memory, and it resumes from its last revision like any
//! client. A watch's initial events are the cache's own versions, shared, and are written out
//! only as the connection takes them (see [`WatchHandle`] for what bounds what they pin).
//!
//! Each object version is held as its stored JSON, plus the few attributes filters read
//! ([`Attrs`]: namespace, name, labels, selectable fields), not as a parsed tree: a parsed pod
//! takes about ten times its JSON, and the cache holds every object and a window of old
//! versions. The stored bytes are the store's own (shared, not copied); the one thing they lack,
//! `metadata.resourceVersion`, is spliced in when the object is written out
//! ([`CachedObject::write_json`]). Consumers that need the tree parse it
//! ([`CachedObject::object`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use parking_lot::RwLock;
use serde_json::Value;
use setpoint_api::packed::{self, Strings};
use setpoint_api::ApiError;
use setpoint_store::{compression, Event, RangeRequest, Revision, Store, StoreError};
use tokio::sync::{mpsc, watch};

use crate::metrics::Metrics;

/// One object version as the cache holds it: its stored value (JSON, compressed when that made it
/// smaller), shared by every LIST and watcher that sends it (and with the store), and the
/// attributes filters read.
#[derive(Debug)]
pub struct CachedObject {
    /// The object's store key.
    pub key: Arc<str>,
    /// The revision that wrote this version (its `resourceVersion`).
    pub revision: Revision,
    /// What label and field selectors read.
    pub attrs: Attrs,
    json: Json,
}

/// The JSON of a cached object.
#[derive(Debug)]
enum Json {
    /// The stored value, which lacks `metadata.resourceVersion`: it goes at byte `at` (just
    /// before the closing brace of `metadata`), after a comma when `metadata` has other fields.
    /// `metadata` itself starts at byte `metadata`. Offsets are into the plain JSON; `bytes`
    /// may be compressed (`setpoint_store::compression`), and is read through
    /// [`with_plain`], which decoding has checked succeeds.
    Stored {
        bytes: Bytes,
        metadata: usize,
        at: usize,
        comma: bool,
    },
    /// Complete JSON, built when the stored value cannot be spliced safely.
    Built(Bytes),
}

impl CachedObject {
    /// Decodes a stored value (see [`decode_object`]); `None` if it is not a JSON object.
    /// `kind` is the stored kind (group, kind) whose selectable fields [`Attrs`] records.
    pub fn decode(
        key: Arc<str>,
        value: &Bytes,
        revision: Revision,
        kind: StoredKind,
    ) -> Option<Self> {
        compression::with_plain(value, |plain| {
            Self::decode_plain(key, value, plain, revision, kind)
        })
        .ok()
        .flatten()
    }

    /// [`Self::decode`] given the value's plain form too.
    fn decode_plain(
        key: Arc<str>,
        value: &Bytes,
        plain: &[u8],
        revision: Revision,
        kind: StoredKind,
    ) -> Option<Self> {
        let (json, attrs) = match resource_version_slot(plain) {
            Some(Slot {
                metadata,
                at,
                comma,
            }) => {
                let stored = Json::Stored {
                    bytes: value.clone(),
                    metadata,
                    at,
                    comma,
                };
                (stored, Attrs::of_stored(plain, kind)?)
            }
            None => {
                let obj = decode_plain_object(plain, revision)?;
                let built = Json::Built(Bytes::from(serde_json::to_vec(&obj).unwrap_or_default()));
                (built, Attrs::of(&obj, kind))
            }
        };
        Some(CachedObject {
            key,
            revision,
            attrs,
            json,
        })
    }

    /// The length of [`Self::write_json`]'s output.
    pub fn json_len(&self) -> usize {
        match &self.json {
            Json::Stored { bytes, comma, .. } => {
                compression::plain_len(bytes)
                    + usize::from(*comma)
                    + "\"resourceVersion\":\"\"".len()
                    + decimal_digits(self.revision)
            }
            Json::Built(b) => b.len(),
        }
    }

    /// Appends the object as JSON, `metadata.resourceVersion` included.
    pub fn write_json(&self, out: &mut BytesMut) {
        match &self.json {
            Json::Stored {
                bytes, at, comma, ..
            } => with_plain(bytes, |plain| {
                splice_resource_version(out, plain, *at, *comma, self.revision)
            }),
            Json::Built(b) => out.extend_from_slice(b),
        }
    }

    /// Appends the object's `metadata` as JSON, `resourceVersion` included: what
    /// [`Self::metadata`] serializes to, cut from the stored bytes without parsing them (a
    /// metadata-only watch sends one of these per event).
    pub fn write_metadata_json(&self, out: &mut BytesMut) {
        match &self.json {
            Json::Stored {
                bytes,
                metadata,
                at,
                comma,
            } => with_plain(bytes, |plain| {
                out.extend_from_slice(&plain[*metadata..*at]);
                write_resource_version(out, self.revision, *comma);
                out.extend_from_slice(b"}");
            }),
            Json::Built(_) => {
                let _ = serde_json::to_writer(bytes::BufMut::writer(out), &self.metadata());
            }
        }
    }

    /// The object as JSON (a fresh buffer).
    pub fn json(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(self.json_len());
        self.write_json(&mut b);
        b.freeze()
    }

    /// The object, parsed (a fresh tree the caller owns).
    pub fn object(&self) -> Value {
        match &self.json {
            Json::Stored { bytes, .. } => {
                decode_object(bytes, self.revision).unwrap_or(Value::Null)
            }
            Json::Built(b) => serde_json::from_slice(b).unwrap_or(Value::Null),
        }
    }

    /// Whether `metadata.deletionTimestamp` is set, read without building the object.
    pub fn is_being_deleted(&self) -> bool {
        #[derive(serde::Deserialize)]
        struct Metadata {
            #[serde(rename = "deletionTimestamp")]
            deletion_timestamp: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Object {
            metadata: Option<Metadata>,
        }
        let bytes = match &self.json {
            Json::Stored { bytes, .. } | Json::Built(bytes) => bytes,
        };
        with_plain(bytes, |plain| {
            serde_json::from_slice::<Object>(plain)
                .ok()
                .and_then(|o| o.metadata)
                .is_some_and(|m| m.deletion_timestamp.is_some())
        })
    }

    /// The object's `metadata`, parsed, `resourceVersion` included (`null` if it has none).
    pub fn metadata(&self) -> Value {
        #[derive(serde::Deserialize)]
        struct MetadataOnly {
            #[serde(default)]
            metadata: Value,
        }
        let (bytes, stored) = match &self.json {
            Json::Stored { bytes, .. } => (bytes, true),
            Json::Built(b) => (b, false),
        };
        let mut metadata = with_plain(bytes, |plain| {
            serde_json::from_slice::<MetadataOnly>(plain)
                .map(|m| m.metadata)
                .unwrap_or(Value::Null)
        });
        if stored {
            if let Some(m) = metadata.as_object_mut() {
                m.insert(
                    "resourceVersion".into(),
                    Value::String(self.revision.to_string()),
                );
            }
        }
        metadata
    }
}

fn decimal_digits(mut n: Revision) -> usize {
    let mut digits = 1;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    digits
}

/// A stored value as served at `revision`, `metadata.resourceVersion` spliced in: what parsing
/// it, setting the field and serializing would give, without the parse. `None` when it cannot
/// be spliced safely (see [`resource_version_slot`]).
pub fn served_json(stored: &[u8], revision: Revision) -> Option<Bytes> {
    compression::with_plain(stored, |plain| {
        let slot = resource_version_slot(plain)?;
        let mut out = BytesMut::with_capacity(plain.len() + 44);
        splice_resource_version(&mut out, plain, slot.at, slot.comma, revision);
        Some(out.freeze())
    })
    .ok()
    .flatten()
}

/// Calls `f` with the plain form of a value [`CachedObject::decode`] accepted. Decoding
/// decompressed these very bytes, so this cannot fail; if it did, the answer is `R`'s default
/// (nothing written) rather than a panic.
fn with_plain<R: Default>(value: &[u8], f: impl FnOnce(&[u8]) -> R) -> R {
    compression::with_plain(value, f).unwrap_or_default()
}

/// Appends `stored` with `"resourceVersion":"<revision>"` inserted at byte `at`.
fn splice_resource_version(
    out: &mut BytesMut,
    stored: &[u8],
    at: usize,
    comma: bool,
    revision: Revision,
) {
    out.extend_from_slice(&stored[..at]);
    write_resource_version(out, revision, comma);
    out.extend_from_slice(&stored[at..]);
}

/// Appends `"resourceVersion":"<revision>"`, after a comma if asked.
fn write_resource_version(out: &mut BytesMut, revision: Revision, comma: bool) {
    if comma {
        out.extend_from_slice(b",");
    }
    out.extend_from_slice(b"\"resourceVersion\":\"");
    out.extend_from_slice(revision.to_string().as_bytes());
    out.extend_from_slice(b"\"");
}

/// Where `metadata.resourceVersion` can be spliced into a stored value so that the result
/// is what parsing it and setting the field would serialize to: just before the closing
/// brace of the top-level `metadata` object (where an inserted key lands), with whether a
/// comma must precede it. `None` when that is not certain to be right: no `metadata`
/// object, duplicate keys, or a `resourceVersion` already present (the stored form never has
/// one, but the check is cheap next to a wrong answer).
///
/// This runs for every write's response and every event the cache takes in, so it scans the
/// bytes structurally (strings, nesting) instead of parsing: stored values are JSON the server
/// wrote. Input that is not well-formed where the scan looks gives `None`.
fn resource_version_slot(value: &[u8]) -> Option<Slot> {
    let b = value;
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    let mut metadata = None;
    if b.get(i) != Some(&b'}') {
        loop {
            if b.get(i) != Some(&b'"') {
                return None;
            }
            let key_end = skip_string(b, i)?;
            let key = &b[i + 1..key_end - 1];
            if key.contains(&b'\\') {
                // An escaped key might spell `metadata`; not worth decoding.
                return None;
            }
            i = skip_ws(b, key_end);
            if b.get(i) != Some(&b':') {
                return None;
            }
            i = skip_ws(b, i + 1);
            let end = skip_value(b, i)?;
            if key == b"metadata" {
                if metadata.is_some() || b[i] != b'{' {
                    return None;
                }
                metadata = Some((i, end));
            }
            i = skip_ws(b, end);
            match b.get(i)? {
                b',' => i = skip_ws(b, i + 1),
                b'}' => break,
                _ => return None,
            }
        }
    }
    if skip_ws(b, i + 1) != b.len() {
        return None;
    }
    let (start, end) = metadata?;
    let inner = &b[start + 1..end - 1];
    const RV: &[u8] = b"\"resourceVersion\"";
    if inner.windows(RV.len()).any(|w| w == RV) {
        return None;
    }
    Some(Slot {
        metadata: start,
        at: end - 1,
        comma: skip_ws(inner, 0) != inner.len(),
    })
}

/// The first index at or after `i` that is not JSON whitespace.
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i
}

/// The index just past the string whose opening quote is at `i`.
fn skip_string(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        match b.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

/// The index just past the JSON value that starts at `i`.
fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match b.get(j)? {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let end = b[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'))
                .map_or(b.len(), |n| i + n);
            (end > i).then_some(end)
        }
    }
}

/// Where [`resource_version_slot`] found `metadata` in a stored value.
struct Slot {
    /// The offset of `metadata`'s opening brace.
    metadata: usize,
    /// The offset of its closing brace, where `resourceVersion` goes.
    at: usize,
    /// Whether a comma must precede `resourceVersion`.
    comma: bool,
}

/// The (group, kind) of a stored resource when it is a built-in kind, whose selectable fields
/// beyond `metadata.name` and `metadata.namespace` [`Attrs`] then records; `None` for custom
/// resources, which select on those two only.
pub type StoredKind = Option<(&'static str, &'static str)>;

/// The built-in kind stored under a storage prefix (`/registry/<group or core>/<plural>/`).
pub fn stored_kind(prefix: &str) -> StoredKind {
    let rest = prefix.strip_prefix(REGISTRY_PREFIX)?;
    let mut parts = rest.split('/');
    let group = match parts.next()? {
        "core" => "",
        g => g,
    };
    let plural = parts.next()?;
    setpoint_kinds::BUILTIN
        .iter()
        .find(|k| k.group == group && k.plural == plural)
        .map(|k| (k.group, k.kind))
}

/// What list and watch filters look at, extracted once per object version.
///
/// The cache holds one for every version it keeps (each object's latest and the event
/// window), so the strings are packed: the namespace, the name, each label's key and value,
/// then each set field's value, one after another in one string, found by where each ends.
/// As separate boxed strings they cost about three times as much.
#[derive(Default, PartialEq, Eq)]
pub struct Attrs {
    /// In the order above.
    strings: Strings,
    /// The kind's selectable fields (`setpoint_kinds::fields::supported_fields`).
    field_names: &'static [&'static str],
    /// Bit `i` set: `field_names[i]` has a non-empty value, stored after the labels in the
    /// order of the bits. Name and namespace are never among them (they come first).
    present: u64,
}

impl Attrs {
    /// The attributes of `obj`, stored as `kind`.
    pub fn of(obj: &Value, kind: StoredKind) -> Attrs {
        let mut strings = packed::Builder::default();
        strings.push(setpoint_api::meta::namespace(obj));
        strings.push(setpoint_api::meta::name(obj));
        let labels = obj
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        for (k, v) in labels.into_iter().flatten() {
            if let Some(v) = v.as_str() {
                strings.push(k);
                strings.push(v);
            }
        }
        let mut present = 0u64;
        let field_names = match kind {
            Some((group, kind)) => setpoint_kinds::fields::supported_fields(group, kind),
            None => &[],
        };
        if let Some((group, kind)) = kind {
            // A kind lists a handful of fields; a bit each (a test checks every kind fits).
            for (i, f) in field_names.iter().enumerate().take(u64::BITS as usize) {
                if matches!(*f, "metadata.name" | "metadata.namespace") {
                    continue;
                }
                let v = setpoint_kinds::fields::value(group, kind, obj, f);
                if !v.is_empty() {
                    present |= 1 << i;
                    strings.push(&v);
                }
            }
        }
        Attrs {
            strings: strings.finish(),
            field_names,
            present,
        }
    }

    /// The `i`th packed string ("" past the end, as in a default `Attrs`).
    fn string(&self, i: usize) -> &str {
        self.strings.get(i).unwrap_or("")
    }

    /// The object's namespace ("" for cluster-scoped objects).
    pub fn namespace(&self) -> &str {
        self.string(0)
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        self.string(1)
    }

    fn label_count(&self) -> usize {
        self.strings
            .len()
            .saturating_sub(2 + self.present.count_ones() as usize)
            / 2
    }

    /// The labels, as (key, value).
    fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        (0..self.label_count()).map(|j| (self.string(2 + 2 * j), self.string(3 + 2 * j)))
    }

    /// The set fields other than name and namespace, as (field, value), in the kind's order.
    fn fields(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let first = 2 + 2 * self.label_count();
        self.field_names
            .iter()
            .enumerate()
            .filter(|(i, _)| *i < u64::BITS as usize && self.present & (1 << i) != 0)
            .enumerate()
            .map(move |(rank, (_, f))| (*f, self.string(first + rank)))
    }

    /// The attributes of a stored object (JSON), stored as `kind`, parsing only what they are
    /// read from. `None` if it is not a JSON object.
    pub fn of_stored(value: &[u8], kind: StoredKind) -> Option<Attrs> {
        const META: [&str; 3] = ["metadata.name", "metadata.namespace", "metadata.labels"];
        let sources = match kind {
            Some((group, kind)) => setpoint_kinds::fields::value_sources(group, kind),
            None => Some(&[][..]),
        };
        let obj: Value = match sources {
            Some(sources) => {
                let paths: Vec<&str> = META.iter().chain(sources).copied().collect();
                crate::pruned::parse_keeping(value, &paths).ok()?
            }
            None => serde_json::from_slice(value).ok()?,
        };
        obj.is_object().then(|| Attrs::of(&obj, kind))
    }

    /// A label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// A selectable field's value as field selectors compare it (`""` when unset).
    pub fn field(&self, field: &str) -> &str {
        match field {
            "metadata.name" => self.name(),
            "metadata.namespace" => self.namespace(),
            _ => self
                .fields()
                .find(|(f, _)| *f == field)
                .map_or("", |(_, v)| v),
        }
    }
}

impl std::fmt::Debug for Attrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attrs")
            .field("namespace", &self.namespace())
            .field("name", &self.name())
            .field("labels", &self.labels().collect::<Vec<_>>())
            .field("fields", &self.fields().collect::<Vec<_>>())
            .finish()
    }
}

/// The type of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// The object appeared (or, for this watcher, came into its selection).
    Added,
    /// The object changed.
    Modified,
    /// The object is gone (or, for this watcher, left its selection).
    Deleted,
}

impl EventType {
    /// The event's `type` on the wire: `ADDED`, `MODIFIED` or `DELETED`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// A change as the cache records it. For deletions `object` is the last state, carrying the
/// deletion's revision.
#[derive(Debug)]
pub struct CacheEvent {
    /// What happened.
    pub kind: EventType,
    /// The new version (for a deletion, the last one).
    pub object: Arc<CachedObject>,
    /// The version before, if the cache held one (selectors compare both).
    pub prev: Option<Arc<CachedObject>>,
    /// The revision of the change.
    pub revision: Revision,
}

/// What a watcher receives.
#[derive(Clone, Debug)]
pub enum WatchItem {
    /// An event, with the type as this watcher sees it (selectors can turn a MODIFIED into an
    /// ADDED or DELETED).
    Event(EventType, Arc<CachedObject>),
    /// "You have seen everything up to this revision".
    Bookmark(Revision),
}

/// A test on one object's attributes (label and field selectors).
pub type Predicate = Box<dyn Fn(&Attrs) -> bool + Send + Sync>;

/// Decides which objects a list or watch sees.
pub struct Filter {
    /// Only objects in this namespace.
    pub namespace: Option<String>,
    /// Only the object of this name (`metadata.name=` field selectors).
    pub name: Option<String>,
    /// The label and field selectors, when there are any.
    pub predicate: Option<Predicate>,
}

impl Filter {
    /// Everything.
    pub fn all() -> Self {
        Filter {
            namespace: None,
            name: None,
            predicate: None,
        }
    }
    /// Whether an object with these attributes passes the filter.
    pub fn matches(&self, attrs: &Attrs) -> bool {
        if let Some(ns) = &self.namespace {
            if attrs.namespace() != ns {
                return false;
            }
        }
        if let Some(n) = &self.name {
            if attrs.name() != n {
                return false;
            }
        }
        match &self.predicate {
            Some(p) => p(attrs),
            None => true,
        }
    }
    /// How an event looks through this filter, or None if the watcher shouldn't see it.
    fn translate(&self, ev: &CacheEvent) -> Option<EventType> {
        let now = self.matches(&ev.object.attrs);
        match ev.kind {
            EventType::Added => now.then_some(EventType::Added),
            EventType::Deleted => now.then_some(EventType::Deleted),
            EventType::Modified => {
                let before = ev.prev.as_ref().is_some_and(|p| self.matches(&p.attrs));
                match (before, now) {
                    (true, true) => Some(EventType::Modified),
                    (false, true) => Some(EventType::Added),
                    (true, false) => Some(EventType::Deleted),
                    (false, false) => None,
                }
            }
        }
    }
}

struct Watcher {
    id: u64,
    filter: Filter,
    /// Only events after this revision (a watch from a revision the cache has not reached yet).
    after: Revision,
    bookmarks: bool,
    tx: mpsc::UnboundedSender<WatchItem>,
    /// What is queued on `tx` and not yet taken, in [`charge`] bytes.
    queued: Arc<AtomicUsize>,
    /// The revision of the next replayed event the watcher has not taken yet (`i64::MAX` once
    /// none is left): while it is in the event window, the window holds that event anyway.
    replay_next: Arc<AtomicI64>,
}

/// Bytes charged for a line's framing (`{"type":"MODIFIED","object":…}` and a newline).
const EVENT_FRAMING: usize = 32;

/// What queueing an item costs a watcher's budget: the JSON it will be written as.
fn charge(item: &WatchItem) -> usize {
    match item {
        WatchItem::Event(_, o) => o.json_len() + EVENT_FRAMING,
        WatchItem::Bookmark(_) => EVENT_FRAMING,
    }
}

struct Inner {
    objects: BTreeMap<Arc<str>, Arc<CachedObject>>,
    events: VecDeque<Arc<CacheEvent>>,
    /// Every event with a revision greater than this is in `events`.
    window_start: Revision,
    /// The cache reflects the store exactly as of this revision.
    revision: Revision,
    watchers: Vec<Watcher>,
}

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchStart {
    /// Synthetic ADDED events for the current state, then changes (`resourceVersion` unset or "0").
    CurrentState,
    /// Only changes after this revision.
    After(Revision),
}

/// The cache of one storage resource.
pub struct WatchCache {
    /// The storage prefix the cache mirrors.
    pub prefix: String,
    /// The built-in kind stored under the prefix, if any (for [`Attrs`]).
    pub kind: StoredKind,
    inner: RwLock<Inner>,
    capacity: usize,
    watcher_buffer_bytes: usize,
    next_id: AtomicU64,
    metrics: Metrics,
    resource_label: String,
    /// The last [`WatchCache::parsed`] answer: the cache's [`WatchCache::last_change`] it was
    /// made at, the key prefix asked for, and the objects.
    parsed: parking_lot::Mutex<Option<(Revision, String, Parsed)>>,
}

/// Objects of a cache parsed, in key order, shared by every reader until the cache changes
/// (see [`WatchCache::parsed`]).
#[derive(Clone, Debug, Default)]
pub struct Parsed(Arc<Vec<Value>>);

impl std::ops::Deref for Parsed {
    type Target = [Value];

    fn deref(&self) -> &[Value] {
        &self.0
    }
}

impl<'a> IntoIterator for &'a Parsed {
    type Item = &'a Value;
    type IntoIter = std::slice::Iter<'a, Value>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// A started watch: the events to send first, then the live ones, taken one at a time with
/// [`WatchHandle::next`] as the connection has room for them.
///
/// The initial events are pointers to versions the cache holds (its objects, or its event
/// window for a replay), as upstream's watch cache lists them: a few dozen bytes per object,
/// not the objects' bytes, and nothing is serialized before the connection asks. A version
/// the cache lets go of while a watcher still has it queued stays alive for that watcher
/// only, so what it pins is bounded too: an object of a snapshot is replaced or deleted only
/// by an event this watcher is sent, which is charged to its budget; a replayed event that
/// leaves the event window before the watcher has taken it ends the watch.
pub struct WatchHandle {
    initial: std::vec::IntoIter<WatchItem>,
    live: mpsc::UnboundedReceiver<WatchItem>,
    queued: Arc<AtomicUsize>,
    /// Set for a replay of the event window (a watch from a revision), whose progress the
    /// cache checks against the window.
    replay_next: Option<Arc<AtomicI64>>,
    /// The cache revision at registration (used for the initial-events-end bookmark).
    pub revision: Revision,
    cache: Arc<WatchCache>,
    id: u64,
}

impl WatchHandle {
    /// The next initial event, if any is left.
    pub fn next_initial(&mut self) -> Option<WatchItem> {
        let item = self.initial.next();
        if let Some(replay_next) = &self.replay_next {
            let next = match self.initial.as_slice().first() {
                Some(WatchItem::Event(_, o)) => o.revision,
                _ => i64::MAX,
            };
            replay_next.store(next, Ordering::Release);
        }
        item
    }

    /// The next live event; `None` once the watcher was dropped (too slow, or the cache was
    /// reset) and everything queued before that was taken.
    pub async fn next_live(&mut self) -> Option<WatchItem> {
        let item = self.live.recv().await?;
        self.queued.fetch_sub(charge(&item), Ordering::AcqRel);
        Some(item)
    }

    /// The next live event if one is queued now, without waiting.
    pub fn try_next_live(&mut self) -> Option<WatchItem> {
        let item = self.live.try_recv().ok()?;
        self.queued.fetch_sub(charge(&item), Ordering::AcqRel);
        Some(item)
    }

    /// How many initial events are left to take.
    pub fn initial_len(&self) -> usize {
        self.initial.len()
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.cache.remove_watcher(self.id);
    }
}

impl WatchCache {
    fn new(prefix: String, capacity: usize, watcher_buffer_bytes: usize, metrics: Metrics) -> Self {
        let resource_label = prefix
            .trim_start_matches("/registry/")
            .trim_end_matches('/')
            .replace("core/", "");
        WatchCache {
            kind: stored_kind(&prefix),
            prefix,
            inner: RwLock::new(Inner {
                objects: BTreeMap::new(),
                events: VecDeque::new(),
                window_start: 0,
                revision: 0,
                watchers: Vec::new(),
            }),
            capacity,
            watcher_buffer_bytes,
            next_id: AtomicU64::new(1),
            metrics,
            resource_label,
            parsed: parking_lot::Mutex::new(None),
        }
    }

    /// Every object under `key_prefix`, parsed, in key order; the same parsed objects until
    /// the cache next changes. For the small configuration caches read on every write (the
    /// admission policies, their bindings, the webhook configurations), whose objects would
    /// otherwise be decompressed and parsed for each request; not for large ones, as parsed
    /// trees take about ten times the memory of the bytes the cache keeps.
    pub fn parsed(&self, key_prefix: &str) -> Parsed {
        // The mark is read before the objects: a change between the two leaves an answer
        // newer than its mark, which the next call makes again, never one older.
        let mark = self.last_change();
        if let Some((at, prefix, objects)) = &*self.parsed.lock() {
            if *at == mark && prefix == key_prefix {
                return objects.clone();
            }
        }
        let (cached, _) = self.list(key_prefix, &Filter::all());
        let objects = Parsed(Arc::new(cached.iter().map(|o| o.object()).collect()));
        *self.parsed.lock() = Some((mark, key_prefix.to_string(), objects.clone()));
        objects
    }

    /// The revision this cache is current through.
    pub fn revision(&self) -> Revision {
        self.inner.read().revision
    }

    /// The revision of the last change to an object under this prefix (or of the last
    /// reset): unlike [`WatchCache::revision`], which every store event advances, it moves
    /// only when this cache's contents do, so what is derived from them can be kept until it
    /// moves.
    pub fn last_change(&self) -> Revision {
        let inner = self.inner.read();
        inner
            .events
            .back()
            .map_or(inner.window_start, |e| e.revision)
    }

    /// Objects under `key_prefix` that pass `filter`, in key order, and the revision of the
    /// snapshot.
    pub fn list(&self, key_prefix: &str, filter: &Filter) -> (Vec<Arc<CachedObject>>, Revision) {
        let inner = self.inner.read();
        let items = inner
            .objects
            .range::<str, _>((
                std::ops::Bound::Included(key_prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(key_prefix))
            .filter(|(_, o)| filter.matches(&o.attrs))
            .map(|(_, o)| o.clone())
            .collect();
        (items, inner.revision)
    }

    /// One object by key.
    pub fn get(&self, key: &str) -> Option<Arc<CachedObject>> {
        self.inner.read().objects.get(key).cloned()
    }

    /// How many objects the cache holds.
    pub fn len(&self) -> usize {
        self.inner.read().objects.len()
    }

    /// Whether the cache holds no objects.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers a watcher. Fails with 410 if `start` is older than the event window.
    pub fn watch(
        self: &Arc<Self>,
        start: WatchStart,
        filter: Filter,
        bookmarks: bool,
    ) -> Result<WatchHandle, ApiError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.inner.write();
        let mut initial = Vec::new();
        let after = match start {
            WatchStart::CurrentState => {
                for o in inner.objects.values() {
                    if filter.matches(&o.attrs) {
                        initial.push(WatchItem::Event(EventType::Added, o.clone()));
                    }
                }
                inner.revision
            }
            WatchStart::After(rv) => {
                if rv < inner.window_start {
                    return Err(ApiError::too_old_resource_version(
                        rv,
                        inner.window_start + 1,
                    ));
                }
                for ev in inner.events.iter().filter(|e| e.revision > rv) {
                    if let Some(t) = filter.translate(ev) {
                        initial.push(WatchItem::Event(t, ev.object.clone()));
                    }
                }
                rv.max(inner.revision)
            }
        };
        let revision = inner.revision;
        let min_after = match start {
            WatchStart::After(rv) => rv,
            WatchStart::CurrentState => revision,
        };
        let _ = after;
        let queued = Arc::new(AtomicUsize::new(0));
        let replay_next = Arc::new(AtomicI64::new(match (start, initial.first()) {
            (WatchStart::After(_), Some(WatchItem::Event(_, o))) => o.revision,
            _ => i64::MAX,
        }));
        inner.watchers.push(Watcher {
            id,
            filter,
            after: min_after,
            bookmarks,
            tx,
            queued: queued.clone(),
            replay_next: replay_next.clone(),
        });
        drop(inner);
        self.metrics.watchers_changed(&self.resource_label, 1);
        Ok(WatchHandle {
            initial: initial.into_iter(),
            live: rx,
            queued,
            replay_next: matches!(start, WatchStart::After(_)).then_some(replay_next),
            revision,
            cache: self.clone(),
            id,
        })
    }

    fn remove_watcher(&self, id: u64) {
        let mut inner = self.inner.write();
        if let Some(pos) = inner.watchers.iter().position(|w| w.id == id) {
            inner.watchers.swap_remove(pos);
            drop(inner);
            self.metrics.watchers_changed(&self.resource_label, -1);
        }
    }

    /// Number of registered watchers.
    pub fn watcher_count(&self) -> usize {
        self.inner.read().watchers.len()
    }

    /// Replaces the whole state (initial load or a relist after the store watch was lost).
    /// Existing watchers are dropped: they resume from their last revision and get 410 if it
    /// predates the new window.
    fn reset(&self, objects: Vec<Arc<CachedObject>>, revision: Revision) {
        let mut inner = self.inner.write();
        inner.objects = objects.into_iter().map(|o| (o.key.clone(), o)).collect();
        inner.events.clear();
        inner.window_start = revision;
        inner.revision = revision;
        let dropped = inner.watchers.len();
        inner.watchers.clear();
        drop(inner);
        if dropped > 0 {
            self.metrics
                .watchers_changed(&self.resource_label, -(dropped as i64));
        }
    }

    /// Applies a batch of events (all under this cache's prefix) and advances to `revision`.
    fn apply(&self, events: Vec<CacheEvent>, revision: Revision) {
        let mut inner = self.inner.write();
        for mut ev in events {
            if ev.kind == EventType::Modified {
                // The version this write replaced is the one the cache holds: the cache is the
                // store's state as of the previous revision, so no second decode is needed.
                ev.prev = inner.objects.get(&ev.object.key).cloned();
            }
            let ev = Arc::new(ev);
            match ev.kind {
                EventType::Deleted => {
                    inner.objects.remove(&ev.object.key);
                }
                _ => {
                    inner
                        .objects
                        .insert(ev.object.key.clone(), ev.object.clone());
                }
            }
            inner.events.push_back(ev.clone());
            let mut dead = Vec::new();
            while inner.events.len() > self.capacity {
                if let Some(old) = inner.events.pop_front() {
                    inner.window_start = old.revision;
                    // A replay that has not reached this event yet would hold it (and what
                    // follows) on its own: it cannot keep up, so it ends.
                    for w in &inner.watchers {
                        if w.replay_next.load(Ordering::Acquire) <= old.revision {
                            dead.push(w.id);
                        }
                    }
                }
            }
            for w in &inner.watchers {
                if ev.revision <= w.after || dead.contains(&w.id) {
                    continue;
                }
                if let Some(t) = w.filter.translate(&ev) {
                    let item = WatchItem::Event(t, ev.object.clone());
                    if !self.enqueue(w, item) {
                        dead.push(w.id);
                    }
                }
            }
            if !dead.is_empty() {
                dead.sort_unstable();
                dead.dedup();
                inner.watchers.retain(|w| !dead.contains(&w.id));
                self.metrics
                    .watchers_changed(&self.resource_label, -(dead.len() as i64));
                self.metrics
                    .watchers_dropped(&self.resource_label, dead.len() as u64);
            }
        }
        if revision > inner.revision {
            inner.revision = revision;
        }
    }

    fn advance(&self, revision: Revision) {
        let mut inner = self.inner.write();
        if revision > inner.revision {
            inner.revision = revision;
        }
    }

    /// Queues `item` for `w` within its budget; false if it does not fit (the watcher is too
    /// slow) or its connection is gone.
    fn enqueue(&self, w: &Watcher, item: WatchItem) -> bool {
        let cost = charge(&item);
        let before = w.queued.fetch_add(cost, Ordering::AcqRel);
        if before + cost > self.watcher_buffer_bytes {
            w.queued.fetch_sub(cost, Ordering::AcqRel);
            return false;
        }
        w.tx.send(item).is_ok()
    }

    /// Sends a bookmark with the current revision to every watcher that asked for them.
    fn bookmark(&self) {
        let inner = self.inner.read();
        for w in inner.watchers.iter().filter(|w| w.bookmarks) {
            // A watcher with events queued is busy with them and learns the revision from
            // them; skipping its bookmark is fine and keeps a stalled one from collecting them.
            if w.queued.load(Ordering::Acquire) == 0 {
                self.enqueue(w, WatchItem::Bookmark(inner.revision.max(w.after)));
            }
        }
    }
}

/// Decodes a stored value (plain or compressed) into the API object: JSON with
/// `metadata.resourceVersion` set.
pub fn decode_object(value: &[u8], revision: Revision) -> Option<Value> {
    compression::with_plain(value, |plain| decode_plain_object(plain, revision))
        .ok()
        .flatten()
}

/// [`decode_object`] of a plain value.
fn decode_plain_object(plain: &[u8], revision: Revision) -> Option<Value> {
    let mut obj: Value = serde_json::from_slice(plain).ok()?;
    if !obj.is_object() {
        return None;
    }
    setpoint_api::meta::set_meta(
        &mut obj,
        "resourceVersion",
        Value::String(revision.to_string()),
    );
    Some(obj)
}

/// All caches, one per storage resource, and the task that feeds them.
pub struct Caches {
    /// One cache per `/registry/<group>/<plural>/` prefix, created the first time a key under
    /// it is seen or a request asks for it — so custom resources get caches as they appear.
    by_prefix: parking_lot::RwLock<HashMap<String, Arc<WatchCache>>>,
    config: CacheConfig,
    metrics: Metrics,
    revision: watch::Sender<Revision>,
    /// Asks the store watch for a progress notification. A consistent read waits for the
    /// store's current revision, and on a store shared beyond `/registry/` (another cluster
    /// under another etcd prefix) that revision can move without any event reaching this
    /// watch; only a progress notification then brings the caches up to it.
    progress: tokio::sync::Notify,
}

/// Tunables of the watch cache.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Events kept per resource for watches that resume from an older revision.
    pub window: usize,
    /// Bytes of events (as they will be written) queued per watcher and not yet taken by its
    /// connection, beyond which the watcher is dropped as too slow.
    pub watcher_buffer_bytes: usize,
    /// How often idle watchers that asked for bookmarks get one.
    pub bookmark_interval: Duration,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            // A burst of writes should not push a watcher that is a little behind out of the
            // window (it would have to relist everything), but every old version in it is
            // held in memory: 20,000 balances the two for clusters of tens of thousands of
            // objects.
            window: 20_000,
            // 8 MiB: about 2,000 pods of 4 KiB, so a burst of writes to one resource that a
            // healthy client drains a moment later fits (a client reading at 100 Mbit/s
            // takes under a second for all of it), while a stalled client costs at most this
            // much before it is dropped: 100 stalled watches, 800 MiB at most, and only while
            // the resource changes under them. Counted in bytes, not events, because objects
            // range from a few hundred bytes to megabytes: 4,096 events of 1 MiB objects
            // could pin 4 GiB. Queued events share the cache's versions, so for objects the
            // cache still holds this is an upper bound on what the watcher adds.
            watcher_buffer_bytes: 8 << 20,
            bookmark_interval: Duration::from_secs(5),
        }
    }
}

const REGISTRY_PREFIX: &str = "/registry/";

/// How many revisions before the store's current one a starting cache loads from and replays,
/// so its event window already holds them: clients that watched the previous server (a
/// restart) resume from the revision they last saw instead of being answered 410 and
/// relisting everything at once. Informers are only a few revisions behind across a restart
/// (the server's own writes as it starts); replaying this many costs little at start.
const PRIMED_REVISIONS: Revision = 1_000;

/// How long a starting server waits for its caches to replay [`PRIMED_REVISIONS`] before it
/// is ready anyway (consistent reads wait for the cache to be current regardless).
const PRIMING_DEADLINE: Duration = Duration::from_secs(30);

impl Caches {
    /// Loads every storage prefix from the store and starts the task that keeps the caches
    /// current. Returns once the initial load is done (the server is ready then).
    pub async fn start(
        store: Arc<dyn Store>,
        prefixes: Vec<String>,
        config: CacheConfig,
        metrics: Metrics,
        stop: watch::Receiver<bool>,
    ) -> Result<Arc<Caches>, StoreError> {
        let (tx, _) = watch::channel(0);
        let caches = Arc::new(Caches {
            by_prefix: parking_lot::RwLock::new(HashMap::new()),
            config: config.clone(),
            metrics,
            revision: tx,
            progress: tokio::sync::Notify::new(),
        });
        for p in prefixes {
            caches.get(&p);
        }
        // Loaded as of a recent past revision, then brought up to date by replaying the store's
        // events from there: those events are then in the window (see PRIMED_REVISIONS).
        let current = store.current_revision().await?;
        // Never revision 0 of a written store: etcd reads that as "the latest".
        let base = current
            .saturating_sub(PRIMED_REVISIONS)
            .max(store.compacted_revision().await?)
            .max(1)
            .min(current);
        let rev = match caches.load_at(&*store, base).await {
            Err(StoreError::Compacted { .. }) => caches.load(&*store).await?,
            r => r?,
        };
        let c = caches.clone();
        tokio::spawn(async move {
            let mut stop = stop;
            tokio::select! {
                _ = c.run(store, rev, config.bookmark_interval) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        });
        if rev < current && !caches.wait_for(current, PRIMING_DEADLINE).await {
            tracing::warn!(
                from = rev,
                to = current,
                "the watch cache has not replayed the store's recent revisions yet; serving anyway"
            );
        }
        Ok(caches)
    }

    /// The cache for a storage prefix, created (empty, current through the revision every
    /// cache has reached) if nothing under the prefix was seen yet. That is exact: a key under
    /// the prefix would have created the cache when the store reported it. Watches on a new
    /// cache cannot resume from before its creation (410, so clients relist).
    pub fn get(&self, prefix: &str) -> Arc<WatchCache> {
        if let Some(c) = self.by_prefix.read().get(prefix) {
            return c.clone();
        }
        let mut map = self.by_prefix.write();
        map.entry(prefix.to_string())
            .or_insert_with(|| {
                let c = WatchCache::new(
                    prefix.to_string(),
                    self.config.window,
                    self.config.watcher_buffer_bytes,
                    self.metrics.clone(),
                );
                c.reset(Vec::new(), self.revision());
                Arc::new(c)
            })
            .clone()
    }

    /// The revision all caches are current through.
    pub fn revision(&self) -> Revision {
        *self.revision.borrow()
    }

    /// Waits until every cache has reached `revision`, or the timeout passes (false).
    pub async fn wait_for(&self, revision: Revision, timeout: Duration) -> bool {
        let mut rx = self.revision.subscribe();
        if *rx.borrow() < revision {
            self.progress.notify_one();
        }
        let fut = async {
            loop {
                if *rx.borrow_and_update() >= revision {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(timeout, fut).await.is_ok()
    }

    /// The cache a stored key belongs to (`/registry/<group>/<plural>/...`), created if new;
    /// keys outside that layout (such as the compaction guard) belong to none.
    fn cache_for_key(&self, key: &str) -> Option<Arc<WatchCache>> {
        let rest = key.strip_prefix(REGISTRY_PREFIX)?;
        let mut parts = rest.splitn(3, '/');
        let g = parts.next()?;
        let p = parts.next()?;
        parts.next()?;
        if g.is_empty() || p.is_empty() {
            return None;
        }
        Some(self.get(&format!("{REGISTRY_PREFIX}{g}/{p}/")))
    }

    /// Lists everything at the store's current revision and resets every cache to it.
    async fn load(&self, store: &dyn Store) -> Result<Revision, StoreError> {
        let rev = store.current_revision().await?;
        self.load_at(store, rev).await
    }

    /// Lists everything as of revision `rev` and resets every cache to it.
    async fn load_at(&self, store: &dyn Store, rev: Revision) -> Result<Revision, StoreError> {
        let mut per: HashMap<String, Vec<Arc<CachedObject>>> = HashMap::new();
        let mut start_after = None;
        loop {
            let resp = store
                .range(RangeRequest {
                    prefix: REGISTRY_PREFIX.into(),
                    start_after: start_after.clone(),
                    revision: Some(rev),
                    limit: Some(10_000),
                })
                .await?;
            for kv in &resp.kvs {
                if let Some(cache) = self.cache_for_key(&kv.key) {
                    if let Some(o) =
                        CachedObject::decode(kv.key.clone(), &kv.value, kv.mod_revision, cache.kind)
                    {
                        per.entry(cache.prefix.clone())
                            .or_default()
                            .push(Arc::new(o));
                    }
                }
            }
            if !resp.more || resp.kvs.is_empty() {
                break;
            }
            start_after = resp.kvs.last().map(|kv| kv.key.to_string());
        }
        for (prefix, cache) in self.by_prefix.read().iter() {
            cache.reset(per.remove(prefix).unwrap_or_default(), rev);
        }
        self.revision.send_replace(rev);
        Ok(rev)
    }

    async fn run(
        self: Arc<Self>,
        store: Arc<dyn Store>,
        mut rev: Revision,
        bookmark_interval: Duration,
    ) {
        let mut ticker = tokio::time::interval(bookmark_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let mut stream = match store.watch(REGISTRY_PREFIX, rev).await {
                Ok(s) => s,
                Err(StoreError::Compacted { .. }) => {
                    tracing::warn!("watch cache fell behind compaction; relisting");
                    match self.load(&*store).await {
                        Ok(r) => rev = r,
                        Err(e) => {
                            tracing::error!(error = %e, "relist failed");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                    continue;
                }
                Err(StoreError::Closed) => return,
                Err(e) => {
                    tracing::error!(error = %e, "store watch failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            loop {
                tokio::select! {
                    item = stream.next() => match item {
                        Some(Ok(resp)) => {
                            self.apply(resp.events, resp.revision);
                            rev = rev.max(resp.revision);
                        }
                        Some(Err(StoreError::Closed)) | None => {
                            if store.current_revision().await.is_err() {
                                return;
                            }
                            break;
                        }
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "store watch ended; resuming");
                            break;
                        }
                    },
                    _ = self.progress.notified() => stream.request_progress(),
                    _ = ticker.tick() => {
                        stream.request_progress();
                        let caches: Vec<_> = self.by_prefix.read().values().cloned().collect();
                        for c in caches {
                            c.bookmark();
                        }
                    }
                }
            }
        }
    }

    fn apply(&self, events: Vec<Event>, revision: Revision) {
        let mut per: HashMap<String, Vec<CacheEvent>> = HashMap::new();
        for ev in events {
            let Some(cache) = self.cache_for_key(ev.key()) else {
                continue;
            };
            let ce = match ev {
                Event::Put { kv, prev } => {
                    let Some(obj) =
                        CachedObject::decode(kv.key, &kv.value, kv.mod_revision, cache.kind)
                    else {
                        continue;
                    };
                    CacheEvent {
                        kind: if prev.is_some() {
                            EventType::Modified
                        } else {
                            EventType::Added
                        },
                        object: Arc::new(obj),
                        // Filled in from the cache's current version when applied.
                        prev: None,
                        revision: kv.mod_revision,
                    }
                }
                Event::Delete {
                    key,
                    revision,
                    prev,
                } => {
                    // The last state, carrying the deletion's revision.
                    let Some(obj) = CachedObject::decode(key, &prev.value, revision, cache.kind)
                    else {
                        continue;
                    };
                    CacheEvent {
                        kind: EventType::Deleted,
                        object: Arc::new(obj),
                        prev: None,
                        revision,
                    }
                }
            };
            per.entry(cache.prefix.clone()).or_default().push(ce);
        }
        let caches: Vec<_> = self
            .by_prefix
            .read()
            .iter()
            .map(|(p, c)| (p.clone(), c.clone()))
            .collect();
        for (prefix, cache) in caches {
            match per.remove(prefix.as_str()) {
                Some(evs) => cache.apply(evs, revision),
                None => cache.advance(revision),
            }
        }
        self.revision.send_if_modified(|r| {
            if revision > *r {
                *r = revision;
                true
            } else {
                false
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What the cache must serve: the stored value parsed, with the revision set, serialized.
    fn expected(stored: &[u8], revision: Revision) -> Value {
        decode_object(stored, revision).unwrap()
    }

    fn cached(stored: &[u8], revision: Revision) -> CachedObject {
        let kind = stored_kind("/registry/core/pods/");
        CachedObject::decode("k".into(), &Bytes::copy_from_slice(stored), revision, kind).unwrap()
    }

    /// Attributes from the parts a kind's fields are read from equal those from the whole
    /// object, for every built-in kind and for custom resources.
    #[test]
    fn attributes_from_the_parsed_parts_equal_those_from_the_whole_object() {
        let objects = [
            json!({"metadata": {"name": "p", "namespace": "d", "labels": {"app": "x", "t": "y"},
                                "managedFields": [{"manager": "m"}]},
                   "spec": {"nodeName": "n1", "restartPolicy": "Never", "schedulerName": "s",
                            "serviceAccountName": "sa", "hostNetwork": true,
                            "containers": [{"name": "c", "image": "i"}], "unschedulable": true,
                            "clusterIP": "10.96.0.1", "type": "NodePort", "replicas": 3},
                   "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.2"}],
                              "nominatedNodeName": "n2", "replicas": 2, "succeeded": 4},
                   "type": "Opaque",
                   "involvedObject": {"kind": "Pod", "name": "p", "namespace": "d", "uid": "u"},
                   "reason": "Started", "source": {"component": "kubelet"}, "reportingComponent": "r"}),
            json!({"metadata": {"name": "only"}}),
            json!({"metadata": {"name": "p", "labels": {"a": "1"}}, "spec": null, "status": [1]}),
        ];
        let mut kinds: Vec<StoredKind> = setpoint_kinds::BUILTIN
            .iter()
            .map(|k| Some((k.group, k.kind)))
            .collect();
        kinds.push(None);
        for obj in &objects {
            let bytes = serde_json::to_vec(obj).unwrap();
            for kind in &kinds {
                let whole = Attrs::of(obj, *kind);
                assert_eq!(
                    Attrs::of_stored(&bytes, *kind),
                    Some(whole),
                    "{kind:?} {obj}"
                );
            }
        }
        assert_eq!(Attrs::of_stored(b"[1]", None), None);
        assert_eq!(Attrs::of_stored(b"{\"metadata\": ", None), None);
    }

    #[test]
    fn packed_attributes_read_back_as_extracted() {
        let pod = json!({
            "metadata": {"name": "web-1", "namespace": "prod",
                         "labels": {"app": "web", "tier": "", "n": 1, "pod-template-hash": "abc"}},
            "spec": {"nodeName": "n1", "restartPolicy": "Always"},
            "status": {"phase": "Running"}
        });
        let a = Attrs::of(&pod, Some(("", "Pod")));
        assert_eq!((a.namespace(), a.name()), ("prod", "web-1"));
        assert_eq!(a.label("app"), Some("web"));
        // An empty value is a value; a non-string one is not a label.
        assert_eq!(a.label("tier"), Some(""));
        assert_eq!(a.label("n"), None);
        assert_eq!(a.label("pod-template-hash"), Some("abc"));
        assert_eq!(a.field("metadata.name"), "web-1");
        assert_eq!(a.field("metadata.namespace"), "prod");
        assert_eq!(a.field("spec.nodeName"), "n1");
        assert_eq!(a.field("spec.restartPolicy"), "Always");
        assert_eq!(a.field("status.phase"), "Running");
        assert_eq!(a.field("status.podIP"), "");
        assert_eq!(a.field("no.such"), "");

        let bare = Attrs::of(&json!({"metadata": {"name": "n"}}), None);
        assert_eq!(
            (bare.namespace(), bare.name(), bare.label("a")),
            ("", "n", None)
        );
        let none = Attrs::default();
        assert_eq!(
            (none.namespace(), none.name(), none.field("x")),
            ("", "", "")
        );

        // Every selectable field of every kind has a bit.
        for k in setpoint_kinds::BUILTIN {
            assert!(setpoint_kinds::fields::supported_fields(k.group, k.kind).len() <= 64);
        }
    }

    #[test]
    fn spliced_json_is_what_serializing_the_parsed_object_gives() {
        let stored = [
            // As the server stores objects: compact, no resourceVersion.
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "n",
                "labels": {"x": "}{\"resourceVersion\""}}, "spec": {"nodeName": "n1"}}),
            json!({"metadata": {"name": "b", "annotations": {"a": "{\"metadata\":{}}"}},
                "spec": {"template": {"metadata": {"labels": {"y": "z"}}}}}),
            json!({"metadata": {}, "data": {"k": "é\u{1F600}\\\n"}}),
            json!({"kind": "Pod", "spec": {}}),
            json!({"metadata": 5}),
            json!({"metadata": {"name": "c", "resourceVersion": "7"}}),
            json!({"spec": {"x": [1, 2.5, -3e40]}, "metadata": {"name": "d"}, "status": {}}),
            json!({"metadata": {"name": "e", "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            json!({"metadata": {"name": "f", "deletionTimestamp": null}}),
            json!({"metadata": {"name": "g", "deletionTimestamp": 7}}),
        ];
        // Each case as stored plain, and compressed (made long enough to be worth it).
        let forms = stored.iter().flat_map(|v| {
            let mut long = v.clone();
            long["padding"] = json!("spliced ".repeat(40));
            let compressed = compression::compress(&serde_json::to_vec(&long).unwrap());
            assert!(compression::is_compressed(&compressed));
            [serde_json::to_vec(v).unwrap(), compressed.to_vec()]
        });
        for (i, bytes) in forms.enumerate() {
            for revision in [1, 9, 10, 12345678901] {
                let c = cached(&bytes, revision);
                let want = serde_json::to_vec(&expected(&bytes, revision)).unwrap();
                assert_eq!(
                    String::from_utf8(c.json().to_vec()).unwrap(),
                    String::from_utf8(want).unwrap(),
                    "case {i} at {revision}"
                );
                assert_eq!(c.json_len(), c.json().len(), "case {i} at {revision}");
                if let Some(served) = served_json(&bytes, revision) {
                    assert_eq!(served, c.json(), "case {i} at {revision}");
                }
                assert_eq!(c.object(), expected(&bytes, revision), "case {i}");
                assert_eq!(
                    c.is_being_deleted(),
                    setpoint_api::meta::deletion_timestamp(&expected(&bytes, revision)).is_some(),
                    "case {i}"
                );
                assert_eq!(
                    c.metadata(),
                    expected(&bytes, revision)["metadata"],
                    "case {i}"
                );
                let mut written = BytesMut::new();
                c.write_metadata_json(&mut written);
                assert_eq!(
                    String::from_utf8(written.to_vec()).unwrap(),
                    serde_json::to_string(&c.metadata()).unwrap(),
                    "case {i} at {revision}"
                );
            }
        }
    }

    #[test]
    fn values_that_cannot_be_spliced_are_served_whole_and_still_correct() {
        for stored in [
            // Whitespace a serializer would not write, a duplicate key, a later metadata.
            &b"{ \"metadata\" : { } , \"spec\" : { \"a\" : 1 } }"[..],
            &b"{\"metadata\":{\"name\":\"a\"},\"metadata\":{\"name\":\"b\"}}"[..],
            &b"{\"spec\":{},\"metadata\":{\"name\":\"a\"}}"[..],
        ] {
            let c = cached(stored, 42);
            let served: Value = serde_json::from_slice(&c.json()).unwrap();
            assert_eq!(
                served,
                expected(stored, 42),
                "{}",
                String::from_utf8_lossy(stored)
            );
            assert_eq!(c.json_len(), c.json().len());
            let mut written = BytesMut::new();
            c.write_metadata_json(&mut written);
            let metadata: Value = serde_json::from_slice(&written).unwrap();
            assert_eq!(metadata, served["metadata"]);
        }
    }

    /// The slot as a full parse finds it: `metadata`'s exact text within the value.
    fn slot_by_parsing(value: &[u8]) -> Option<(usize, usize, bool)> {
        #[derive(serde::Deserialize)]
        struct Shell<'a> {
            #[serde(borrow)]
            metadata: &'a serde_json::value::RawValue,
        }
        let shell: Shell = serde_json::from_slice(value).ok()?;
        let raw = shell.metadata.get();
        let inner = raw.strip_prefix('{')?.strip_suffix('}')?;
        if inner.contains("\"resourceVersion\"") {
            return None;
        }
        let start = raw.as_ptr() as usize - value.as_ptr() as usize;
        Some((start, start + raw.len() - 1, !inner.trim().is_empty()))
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let text = proptest::sample::select(vec![
            "",
            "a",
            "metadata",
            "resourceVersion",
            "\"",
            "\\",
            "}",
            "{\"metadata\":{",
            "]",
            "é",
            "\"resourceVersion\"",
        ]);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            text.clone().prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::vec((text.clone(), inner), 0..5).prop_map(
                    |kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                ),
            ]
        })
    }

    proptest::proptest! {
        /// The structural scan finds exactly the slot a full parse finds, in compact and in
        /// pretty-printed JSON, wherever `metadata` is and whatever the strings hold.
        #[test]
        fn the_slot_scan_agrees_with_a_full_parse(
            top in proptest::collection::vec(
                (proptest::sample::select(vec!["apiVersion", "kind", "spec", "status", "metadata", "data"]), json_value()),
                0..6,
            ),
            pretty: bool,
        ) {
            let obj: serde_json::Map<String, Value> =
                top.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            let bytes = if pretty {
                serde_json::to_vec_pretty(&obj).unwrap()
            } else {
                serde_json::to_vec(&obj).unwrap()
            };
            let scanned = resource_version_slot(&bytes).map(|s| (s.metadata, s.at, s.comma));
            proptest::prop_assert_eq!(scanned, slot_by_parsing(&bytes));
        }
    }

    #[test]
    fn malformed_values_have_no_slot() {
        for bad in [
            &b""[..],
            b"{",
            b"{\"metadata\":{}",
            b"{\"metadata\":{}}x",
            b"{\"metadata\":{\"a\":\"}}",
            b"[{\"metadata\":{}}]",
            b"{\"metadata\" {}}",
            b"{\"metadata\":{},}",
            b"{\"meta\\u0064ata\":{}}",
        ] {
            assert!(
                resource_version_slot(bad).is_none(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_stored_bytes_are_shared_not_copied() {
        let plain =
            serde_json::to_vec(&json!({"metadata": {"name": "a"}, "data": {"k": "v".repeat(200)}}))
                .unwrap();
        for stored in [Bytes::from(plain.clone()), compression::compress(&plain)] {
            let c = CachedObject::decode("k".into(), &stored, 3, None).unwrap();
            match &c.json {
                Json::Stored { bytes, .. } => assert_eq!(bytes.as_ptr(), stored.as_ptr()),
                Json::Built(_) => panic!("a stored value should be spliced"),
            }
            assert_eq!(c.attrs.name(), "a");
        }
    }

    #[test]
    fn a_corrupt_compressed_value_is_not_cached() {
        let mut stored = compression::compress(
            &serde_json::to_vec(
                &json!({"metadata": {"name": "a"}, "data": {"k": "v".repeat(200)}}),
            )
            .unwrap(),
        )
        .to_vec();
        stored.truncate(stored.len() - 4);
        assert!(CachedObject::decode("k".into(), &Bytes::from(stored.clone()), 3, None).is_none());
        assert!(served_json(&stored, 3).is_none());
        assert!(decode_object(&stored, 3).is_none());
    }

    /// A cache of configmaps whose watchers may queue `budget` bytes, holding `window` events.
    fn bounded_cache(budget: usize, window: usize) -> Arc<WatchCache> {
        let c = WatchCache::new(
            "/registry/core/configmaps/".into(),
            window,
            budget,
            Metrics::default(),
        );
        c.reset(Vec::new(), 1);
        Arc::new(c)
    }

    /// An ADDED event of a configmap `name` whose data is `size` bytes, at `revision`.
    fn added(name: &str, size: usize, revision: Revision) -> CacheEvent {
        let value = serde_json::to_vec(&json!({
            "metadata": {"name": name, "namespace": "d"},
            "data": {"k": "x".repeat(size)},
        }))
        .unwrap();
        let key: Arc<str> = format!("/registry/core/configmaps/d/{name}").into();
        let object = CachedObject::decode(key, &Bytes::from(value), revision, None).unwrap();
        CacheEvent {
            kind: EventType::Added,
            object: Arc::new(object),
            prev: None,
            revision,
        }
    }

    #[test]
    fn a_watcher_is_dropped_when_its_queue_would_pass_the_byte_budget() {
        let budget = 10_000;
        let cache = bounded_cache(budget, 1000);
        let mut reader = cache
            .watch(WatchStart::CurrentState, Filter::all(), false)
            .unwrap();
        let mut stalled = cache
            .watch(WatchStart::CurrentState, Filter::all(), false)
            .unwrap();
        let one = charge(&WatchItem::Event(
            EventType::Added,
            added("probe", 1000, 2).object,
        ));
        let fit = budget / one;
        assert!(fit >= 2);
        for i in 0..fit {
            let rev = 2 + i as Revision;
            cache.apply(vec![added(&format!("o{i}"), 1000, rev)], rev);
            // The reader takes each event as it comes.
            assert!(reader.try_next_live().is_some());
            assert!(stalled.queued.load(Ordering::SeqCst) <= budget);
        }
        assert_eq!(cache.watcher_count(), 2, "everything so far fits");
        let rev = 2 + fit as Revision;
        cache.apply(vec![added("over", 1000, rev)], rev);
        assert_eq!(cache.watcher_count(), 1, "the stalled watcher is dropped");
        assert!(reader.try_next_live().is_some());
        // The dropped watcher still gets what was queued before, in order, then its end.
        let mut got = 0;
        while let Some(WatchItem::Event(_, o)) = stalled.try_next_live() {
            assert_eq!(o.attrs.name(), format!("o{got}"));
            got += 1;
        }
        assert_eq!(got, fit);
        assert!(futures::executor::block_on(stalled.next_live()).is_none());
        assert_eq!(stalled.queued.load(Ordering::SeqCst), 0);
    }

    /// A server restarted on the same store: its caches replay the store's recent revisions,
    /// so a watcher of the previous server resumes from the revision it saw, with exactly the
    /// events after it; one from before the store's compaction still gets 410.
    #[tokio::test]
    async fn a_starting_cache_replays_recent_revisions_so_watchers_resume() {
        use setpoint_store::Precondition;
        let store: Arc<dyn Store> = Arc::new(setpoint_store::memory::MemoryStore::new());
        let prefix = "/registry/core/configmaps/";
        let put = |name: &str, v: &str| {
            let store = store.clone();
            let key = format!("{prefix}d/{name}");
            let value = serde_json::to_vec(
                &json!({"metadata": {"name": name, "namespace": "d"}, "data": {"v": v}}),
            )
            .unwrap();
            async move {
                store
                    .put(&key, value.into(), Precondition::None)
                    .await
                    .unwrap()
                    .mod_revision
            }
        };
        let seen = put("a", "1").await;
        put("b", "1").await;
        put("a", "2").await;
        let (_, gone) = store
            .delete(&format!("{prefix}d/b"), Precondition::None)
            .await
            .unwrap();
        let (_stop, stop_rx) = watch::channel(false);
        let caches = Caches::start(
            store.clone(),
            vec![prefix.to_string()],
            CacheConfig::default(),
            Metrics::default(),
            stop_rx,
        )
        .await
        .unwrap();
        assert_eq!(caches.revision(), gone, "ready once current");
        let cache = caches.get(prefix);
        let mut resumed = cache
            .watch(WatchStart::After(seen), Filter::all(), false)
            .unwrap();
        let events: Vec<(EventType, String)> = std::iter::from_fn(|| resumed.next_initial())
            .filter_map(|i| match i {
                WatchItem::Event(t, o) => Some((t, o.attrs.name().to_string())),
                WatchItem::Bookmark(_) => None,
            })
            .collect();
        assert_eq!(
            events,
            [
                (EventType::Added, "b".to_string()),
                (EventType::Modified, "a".to_string()),
                (EventType::Deleted, "b".to_string()),
            ]
        );
        // The state is the store's current one.
        assert_eq!(cache.len(), 1);

        // History compacted away cannot be replayed: a watch from before it is told so.
        store.compact(gone - 1).await.unwrap();
        let (_stop, stop_rx) = watch::channel(false);
        let caches = Caches::start(
            store.clone(),
            vec![prefix.to_string()],
            CacheConfig::default(),
            Metrics::default(),
            stop_rx,
        )
        .await
        .unwrap();
        let cache = caches.get(prefix);
        let err = cache
            .watch(WatchStart::After(seen), Filter::all(), false)
            .err()
            .expect("410");
        assert_eq!(err.code, 410);
        assert!(cache
            .watch(WatchStart::After(gone - 1), Filter::all(), false)
            .is_ok());
    }

    #[test]
    fn a_replay_that_falls_out_of_the_window_ends_and_a_snapshot_does_not() {
        let cache = bounded_cache(usize::MAX, 4);
        for rev in 2..=5 {
            cache.apply(vec![added(&format!("o{rev}"), 10, rev)], rev);
        }
        let mut replay = cache
            .watch(WatchStart::After(1), Filter::all(), false)
            .unwrap();
        let mut snapshot = cache
            .watch(WatchStart::CurrentState, Filter::all(), false)
            .unwrap();
        assert_eq!((replay.initial_len(), snapshot.initial_len()), (4, 4));
        // The replay takes two events; the window then moves past the third.
        assert!(replay.next_initial().is_some());
        assert!(replay.next_initial().is_some());
        cache.apply(vec![added("o6", 10, 6)], 6);
        assert_eq!(
            cache.watcher_count(),
            2,
            "the replay's next event is still held"
        );
        cache.apply(vec![added("o7", 10, 7)], 7);
        cache.apply(vec![added("o8", 10, 8)], 8);
        assert_eq!(
            cache.watcher_count(),
            1,
            "the replay fell behind the window"
        );
        // A snapshot's objects are the cache's own; the window does not end it.
        for _ in 0..4 {
            assert!(snapshot.next_initial().is_some());
        }
        let live: Vec<_> = std::iter::from_fn(|| snapshot.try_next_live()).collect();
        assert_eq!(live.len(), 3);
    }
}
