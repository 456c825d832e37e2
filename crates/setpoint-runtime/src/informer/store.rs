//! The cache behind an informer: objects by key, plus indexes.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::RwLock;
use serde_json::Value;
use setpoint_api::packed::Strings;
use tokio::sync::watch;

use super::{Event, InformerError};
use crate::client::DynamicObject;
use crate::object::{Object, ObjectKey};

/// An index function: the values under which an object is filed (none, one or many).
pub type IndexFn<K> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

/// Built-in index: the object's namespace.
pub const NAMESPACE_INDEX: &str = "namespace";
/// Built-in index: the `uid` of each of the object's `ownerReferences`.
pub const OWNER_INDEX: &str = "owner";
/// Built-in index: `spec.nodeName` (pods; any object that has the field when dynamic).
pub const NODE_INDEX: &str = "node";
/// Built-in index: one `key=value` entry per label.
pub const LABEL_INDEX: &str = "label";
/// Built-in index: the namespace of objects no controller owns (candidates for adoption).
pub const ORPHAN_INDEX: &str = "orphan";

/// A cache of `Arc<K>` keyed by [`ObjectKey`], with indexes; cheap to clone (clones share it).
///
/// An informer owns the writes; everyone else reads. Reads take a shared lock for as long as
/// it takes to copy out `Arc`s, so they are cheap and never see a half-applied change (a
/// relist is applied as one step).
pub struct Store<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Store {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<K> {
    state: RwLock<State<K>>,
    sync: watch::Sender<SyncState>,
}

#[derive(Clone, Copy, Debug, Default)]
struct SyncState {
    synced: bool,
    stopped: bool,
}

struct State<K> {
    /// Counts [`Store::compact_idle`] passes; an entry records the pass during which it was
    /// last written or read, so a pass can tell which objects sat idle since the one before.
    epoch: u32,
    // Ordered so that `list()` is deterministic, which keeps controllers' behaviour and test
    // output reproducible.
    // Keys are shared with the indexes: an object is filed under several index values (a pod:
    // its namespace, owner, node and each label), and a copy of its key in each was a good part
    // of what caching it cost.
    entries: BTreeMap<Arc<ObjectKey>, Entry<K>>,
    indexers: Vec<(String, IndexFn<K>)>,
    /// Aligned with `indexers`: value → keys filed under it.
    indices: Vec<HashMap<String, BTreeSet<Arc<ObjectKey>>>>,
}

struct Entry<K> {
    object: Slot<K>,
    /// The values each indexer returned when the object was stored, aligned with `indexers`.
    /// Kept so removal does not depend on index functions being pure.
    values: IndexValues,
    /// When the object was last written or read, and how often it was read then ([`Use`];
    /// atomic: reads record it under the shared lock).
    used: AtomicU32,
}

/// What a read copies out under the lock, to be decoded after it is released.
struct Read<K> {
    slot: Slot<K>,
    /// Set for a packed object read [`UNPACK_READS`] times in one period: it is in use after
    /// all, so the decoded object replaces the packed one.
    unpack: Option<Arc<ObjectKey>>,
}

/// How an entry holds its object.
enum Slot<K> {
    /// Decoded, as handed out.
    Object(Arc<K>),
    /// Packed by [`Store::compact_idle`]: the JSON the object serializes to, LZ4-compressed
    /// ([`pack`]), decoded again on each read. A decoded pod takes about four times the memory
    /// of its JSON (k8s-openapi's types are mostly inline `Option`s of large structs), and its
    /// JSON about 1.7 times that of the compressed form.
    Packed(Arc<[u8]>),
}

// Derived `Clone` would require `K: Clone`; cloning only bumps a reference count.
impl<K> Clone for Slot<K> {
    fn clone(&self) -> Self {
        match self {
            Slot::Object(o) => Slot::Object(o.clone()),
            Slot::Packed(b) => Slot::Packed(b.clone()),
        }
    }
}

impl<K: Object> Slot<K> {
    /// The object; None only if packed JSON fails to decode, which a type whose serde
    /// round-trips never does (logged, because the object then looks absent).
    fn object(&self) -> Option<Arc<K>> {
        match self {
            Slot::Object(o) => Some(o.clone()),
            Slot::Packed(packed) => match unpack::<K>(packed) {
                Ok(o) => Some(Arc::new(o)),
                Err(e) => {
                    tracing::error!(error = %e, "a compacted cache entry does not decode; the type's serde does not round-trip");
                    None
                }
            },
        }
    }
}

impl<K: Object> Default for Store<K> {
    fn default() -> Self {
        Store::new()
    }
}

impl<K: Object> Store<K> {
    /// An empty, not yet synced store with the built-in indexes.
    pub fn new() -> Self {
        Store::with_node_fallback(false)
    }

    /// A synced store holding `objects` and nothing else: a fixture for testing code that reads
    /// caches (reconcilers), without an API server.
    pub fn from_objects(objects: impl IntoIterator<Item = K>) -> Self {
        let store = Store::new();
        store.replace(objects.into_iter().collect());
        store.mark_synced();
        store
    }

    /// `node_fallback`: derive `spec.nodeName` from the serialized object for types the node
    /// index does not know (set for pod-like resources only, because serializing each object
    /// on every change costs more than the rest of the indexing together).
    pub(crate) fn with_node_fallback(node_fallback: bool) -> Self {
        let namespace: IndexFn<K> = Arc::new(|o: &K| o.namespace().into_iter().collect());
        let owner: IndexFn<K> = Arc::new(|o: &K| o.owner_uids());
        let node: IndexFn<K> =
            Arc::new(move |o: &K| node_name(o, node_fallback).into_iter().collect());
        let label: IndexFn<K> = Arc::new(|o: &K| o.label_pairs());
        let orphan: IndexFn<K> = Arc::new(|o: &K| {
            if o.has_controller() {
                Vec::new()
            } else {
                vec![o.namespace().unwrap_or_default()]
            }
        });
        let indexers = vec![
            (NAMESPACE_INDEX.to_string(), namespace),
            (OWNER_INDEX.to_string(), owner),
            (NODE_INDEX.to_string(), node),
            (LABEL_INDEX.to_string(), label),
            (ORPHAN_INDEX.to_string(), orphan),
        ];
        let indices = indexers.iter().map(|_| HashMap::new()).collect();
        let state = State {
            epoch: 0,
            entries: BTreeMap::new(),
            indexers,
            indices,
        };
        Store {
            shared: Arc::new(Shared {
                state: RwLock::new(state),
                sync: watch::channel(SyncState::default()).0,
            }),
        }
    }

    /// The object with this key.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<K>> {
        let read = {
            let state = self.shared.state.read();
            let (key, entry) = state.entries.get_key_value(key)?;
            state.read(key, entry)
        };
        let mut object = None;
        self.materialize([read], |o| object = Some(o));
        object
    }

    /// Every object, in key order.
    pub fn list(&self) -> Vec<Arc<K>> {
        let reads: Vec<Read<K>> = {
            let state = self.shared.state.read();
            state
                .entries
                .iter()
                .map(|(k, e)| state.read(k, e))
                .collect()
        };
        let mut objects = Vec::with_capacity(reads.len());
        self.materialize(reads, |o| objects.push(o));
        objects
    }

    /// Every key, in order.
    pub fn keys(&self) -> Vec<ObjectKey> {
        let state = self.shared.state.read();
        state.entries.keys().map(|k| ObjectKey::clone(k)).collect()
    }

    /// How many objects the cache holds.
    pub fn len(&self) -> usize {
        self.shared.state.read().entries.len()
    }

    /// Whether the cache holds no objects.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Objects filed under `value` in the index `name`, in key order. Empty for an unknown
    /// index (see [`Store::has_index`]).
    pub fn by_index(&self, name: &str, value: &str) -> Vec<Arc<K>> {
        let reads: Vec<Read<K>> = {
            let state = self.shared.state.read();
            let Some(i) = state.index_position(name) else {
                return Vec::new();
            };
            state.indices[i]
                .get(value)
                .map(|keys| {
                    keys.iter()
                        .filter_map(|k| state.entries.get(k).map(|e| state.read(k, e)))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut objects = Vec::with_capacity(reads.len());
        self.materialize(reads, |o| objects.push(o));
        objects
    }

    /// Keys filed under `value` in the index `name`.
    pub fn index_keys(&self, name: &str, value: &str) -> Vec<ObjectKey> {
        let state = self.shared.state.read();
        state
            .index_position(name)
            .and_then(|i| state.indices[i].get(value))
            .map(|keys| keys.iter().map(|k| ObjectKey::clone(k)).collect())
            .unwrap_or_default()
    }

    /// The values present in the index `name` (e.g. every node that has pods).
    pub fn index_values(&self, name: &str) -> Vec<String> {
        let state = self.shared.state.read();
        let mut values: Vec<String> = state
            .index_position(name)
            .map(|i| state.indices[i].keys().cloned().collect())
            .unwrap_or_default();
        values.sort();
        values
    }

    /// Whether an index of that name is registered.
    pub fn has_index(&self, name: &str) -> bool {
        self.shared.state.read().index_position(name).is_some()
    }

    /// Objects in a namespace.
    pub fn by_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        self.by_index(NAMESPACE_INDEX, namespace)
    }

    /// Objects with an owner reference to this uid.
    pub fn by_owner(&self, owner_uid: &str) -> Vec<Arc<K>> {
        self.by_index(OWNER_INDEX, owner_uid)
    }

    /// Objects in `namespace` (`""` for cluster-scoped ones) that no controller owns: what a
    /// controller may adopt, without scanning the whole namespace.
    pub fn orphans_in(&self, namespace: &str) -> Vec<Arc<K>> {
        self.by_index(ORPHAN_INDEX, namespace)
    }

    /// Objects whose `spec.nodeName` is `node`.
    pub fn by_node(&self, node: &str) -> Vec<Arc<K>> {
        self.by_index(NODE_INDEX, node)
    }

    /// Objects carrying the label `key=value`.
    pub fn by_label(&self, key: &str, value: &str) -> Vec<Arc<K>> {
        self.by_index(LABEL_INDEX, &format!("{key}={value}"))
    }

    /// Registers an index. Objects already cached are indexed at once, so this is safe at any
    /// time, though registering before the informer starts avoids that pass.
    pub fn add_index(&self, name: &str, f: IndexFn<K>) -> Result<(), InformerError> {
        let mut state = self.shared.state.write();
        if state.index_position(name).is_some() {
            return Err(InformerError::IndexExists(name.to_string()));
        }
        let mut index: HashMap<String, BTreeSet<Arc<ObjectKey>>> = HashMap::new();
        for (key, entry) in state.entries.iter_mut() {
            let values = entry.object.object().map(|o| f(&o)).unwrap_or_default();
            for v in &values {
                file(&mut index, v, key);
            }
            let mut all: Vec<Vec<String>> = entry
                .values
                .groups()
                .map(|g| g.map(String::from).collect())
                .collect();
            all.push(values);
            entry.values = IndexValues::new(&all);
        }
        state.indexers.push((name.to_string(), f));
        state.indices.push(index);
        Ok(())
    }

    /// Whether the first LIST has been applied.
    pub fn has_synced(&self) -> bool {
        self.shared.sync.borrow().synced
    }

    /// Waits until the first LIST has been applied; fails if the informer stops first.
    pub async fn wait_synced(&self) -> Result<(), InformerError> {
        let mut rx = self.shared.sync.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let state = *rx
            .wait_for(|s| s.synced || s.stopped)
            .await
            .map_err(|_| InformerError::Stopped)?;
        if state.synced {
            Ok(())
        } else {
            Err(InformerError::Stopped)
        }
    }

    /// Waits until the informer filling this store has stopped.
    pub(crate) async fn wait_stopped(&self) {
        let mut rx = self.shared.sync.subscribe();
        let _ = rx.wait_for(|s| s.stopped).await;
    }

    pub(crate) fn mark_synced(&self) {
        self.shared
            .sync
            .send_if_modified(|s| !std::mem::replace(&mut s.synced, true));
    }

    pub(crate) fn mark_stopped(&self) {
        self.shared
            .sync
            .send_if_modified(|s| !std::mem::replace(&mut s.stopped, true));
    }

    /// Stores an added or modified object. Returns the event it amounts to: none when the
    /// cache already holds this `resourceVersion` (a replayed event).
    pub(crate) fn upsert(&self, object: K) -> Option<Event<K>> {
        let key = ObjectKey::of(&object);
        self.shared.state.write().put(key, object)
    }

    /// Removes a deleted object; the event carries the object as the server last sent it.
    /// None when the cache did not hold it.
    pub(crate) fn delete(&self, object: K) -> Option<Event<K>> {
        let key = ObjectKey::of(&object);
        let mut state = self.shared.state.write();
        state.remove(&key)?;
        Some(Event::Deleted(Arc::new(object)))
    }

    /// Removes `key` when only its identity is known (its current state did not decode);
    /// the event carries the last state the cache held.
    pub(crate) fn delete_key(&self, key: &ObjectKey) -> Option<Event<K>> {
        let mut state = self.shared.state.write();
        let old = state.remove(key)?.object()?;
        Some(Event::Deleted(old))
    }

    /// Replaces the whole content with a fresh LIST, as one step, and returns exactly the
    /// differences: Added for new keys, Updated for a changed `resourceVersion`, Deleted (with
    /// the last cached state) for keys the list no longer has. Unchanged objects keep their
    /// cached allocation and produce no event.
    pub(crate) fn replace(&self, items: Vec<K>) -> Vec<Event<K>> {
        let mut state = self.shared.state.write();
        let mut events = Vec::new();
        let mut seen = BTreeSet::new();
        for object in items {
            let key = ObjectKey::of(&object);
            seen.insert(key.clone());
            events.extend(state.put(key, object));
        }
        let gone: Vec<Arc<ObjectKey>> = state
            .entries
            .keys()
            .filter(|k| !seen.contains(k.as_ref()))
            .cloned()
            .collect();
        for key in gone {
            if let Some(old) = state.remove(&key).and_then(|slot| slot.object()) {
                events.push(Event::Deleted(old));
            }
        }
        events
    }

    /// Decodes what reads copied out (outside the lock, so the informer is not held up), and
    /// keeps decoded the packed objects read [`UNPACK_READS`] times in one period.
    /// Each object goes to `out`, in order (a sink rather than a `Vec`, so `get` allocates
    /// nothing for the common case of an object held decoded).
    fn materialize(&self, reads: impl IntoIterator<Item = Read<K>>, mut out: impl FnMut(Arc<K>)) {
        let mut unpacked = Vec::new();
        for read in reads {
            let Some(object) = read.slot.object() else {
                continue;
            };
            if let (Some(key), Slot::Packed(json)) = (read.unpack, read.slot) {
                unpacked.push((key, json, object.clone()));
            }
            out(object);
        }
        if !unpacked.is_empty() {
            let mut state = self.shared.state.write();
            for (key, json, object) in unpacked {
                if let Some(entry) = state.entries.get_mut(&key) {
                    // Not if a write replaced it meanwhile.
                    if matches!(&entry.object, Slot::Packed(j) if Arc::ptr_eq(j, &json)) {
                        entry.object = Slot::Object(object);
                    }
                }
            }
        }
    }

    /// Packs every object that has been neither written nor read since the previous call and
    /// that nobody outside the cache holds into the JSON it serializes to (see
    /// `Slot::Packed`). A read decodes it again; a third read in one period, or a write,
    /// puts a decoded object back. Called periodically (`InformerOptions::compact_idle`), an
    /// object is packed after sitting idle for between one and two periods. Serializing
    /// happens outside the lock. Returns how many objects were packed.
    pub(crate) fn compact_idle(&self) -> usize {
        let (epoch, idle) = {
            let state = self.shared.state.read();
            let idle: Vec<(Arc<ObjectKey>, Arc<K>)> = state
                .entries
                .iter()
                .filter(|(_, e)| !Use(e.used.load(Ordering::Relaxed)).in_epoch(state.epoch))
                .filter_map(|(k, e)| match &e.object {
                    // Someone else holding the object would keep its memory alive anyway.
                    Slot::Object(o) if Arc::strong_count(o) == 1 => Some((k.clone(), o.clone())),
                    _ => None,
                })
                .collect();
            (state.epoch, idle)
        };
        let mut count = 0;
        let mut json = Vec::new();
        // A chunk at a time, so a pass never holds both forms of many objects at once (that
        // would raise the peak by the size of everything it packs), nor the lock for long.
        let mut idle = idle.into_iter().peekable();
        while idle.peek().is_some() {
            // (key, the object picked, its packed form)
            let packed: Vec<_> = idle
                .by_ref()
                .take(PACK_CHUNK)
                .filter_map(|(k, o)| {
                    let p = pack(o.as_ref(), &mut json)?;
                    Some((k, o, p))
                })
                .collect();
            let mut state = self.shared.state.write();
            for (key, object, packed) in packed {
                let Some(entry) = state.entries.get_mut(&key) else {
                    continue;
                };
                // Unchanged and unread since it was picked, and held only by the entry and by us.
                let unused = !Use(entry.used.load(Ordering::Relaxed)).in_epoch(epoch);
                if unused
                    && matches!(&entry.object, Slot::Object(o) if Arc::ptr_eq(o, &object) && Arc::strong_count(o) == 2)
                {
                    entry.object = Slot::Packed(packed);
                    count += 1;
                }
            }
        }
        self.shared.state.write().epoch = epoch.wrapping_add(1);
        count
    }

    /// How many objects are held packed (see [`InformerOptions::compact_idle`]).
    ///
    /// [`InformerOptions::compact_idle`]: super::InformerOptions::compact_idle
    pub fn packed_len(&self) -> usize {
        let state = self.shared.state.read();
        state
            .entries
            .values()
            .filter(|e| matches!(e.object, Slot::Packed(_)))
            .count()
    }
}

/// Reads of a packed object in one period that make the cache keep it decoded. Not two: a
/// controller that writes what it reconciles is woken again by its own write, and its second
/// pass reads the same objects (a ReplicaSet, its status patched, reads its pods again);
/// unpacking on that read kept every pod of a busy ReplicaSet decoded, about eight times its
/// packed size, for a period or two.
const UNPACK_READS: u32 = 3;

/// An entry's last use: the compaction epoch in which it was last written or read (high 30
/// bits, wrapping; only compared for equality) and the reads in that epoch (low 2 bits,
/// saturating at 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Use(u32);

impl Use {
    const READ_BITS: u32 = 2;
    const READS: u32 = (1 << Self::READ_BITS) - 1;

    /// Written in `epoch`, not read since.
    fn written(epoch: u32) -> Use {
        Use(epoch << Self::READ_BITS)
    }

    fn in_epoch(self, epoch: u32) -> bool {
        self.0 >> Self::READ_BITS == (epoch << Self::READ_BITS) >> Self::READ_BITS
    }

    fn reads(self) -> u32 {
        self.0 & Self::READS
    }

    /// This use followed by a read in `epoch`.
    fn read_in(self, epoch: u32) -> Use {
        let reads = if self.in_epoch(epoch) {
            (self.reads() + 1).min(Self::READS)
        } else {
            1
        };
        Use(Use::written(epoch).0 | reads)
    }
}

/// Objects packed per turn of [`Store::compact_idle`].
const PACK_CHUNK: usize = 256;

/// An object's packed form: its JSON, LZ4-compressed (`size ++ block`). LZ4 because a read of a
/// packed object must stay cheap: decompressing a pod takes about a microsecond, a fraction of
/// decoding its JSON. `json` is a scratch buffer reused across calls.
fn pack<K: serde::Serialize>(object: &K, json: &mut Vec<u8>) -> Option<Arc<[u8]>> {
    json.clear();
    serde_json::to_writer(&mut *json, object).ok()?;
    Some(Arc::from(lz4_flex::compress_prepend_size(json)))
}

/// Decodes a packed object (see [`pack`]).
fn unpack<K: serde::de::DeserializeOwned>(packed: &[u8]) -> Result<K, String> {
    let json = lz4_flex::decompress_size_prepended(packed).map_err(|e| e.to_string())?;
    serde_json::from_slice(&json).map_err(|e| e.to_string())
}

impl<K: Object> State<K> {
    /// Stores an object under its key and returns the event that amounts to: none when the
    /// cache holds this version already.
    fn put(&mut self, key: ObjectKey, object: K) -> Option<Event<K>> {
        let Some(entry) = self.entries.get(&key) else {
            let new = Arc::new(object);
            self.insert(key, new.clone());
            return Some(Event::Added(new));
        };
        // None only for a packed state that did not decode (logged): no old state to report.
        let old = entry.object.object();
        if old
            .as_ref()
            .is_some_and(|old| same_version(old.as_ref(), &object))
        {
            return None;
        }
        let new = Arc::new(object);
        self.update(&key, new.clone());
        Some(match old {
            Some(old) => Event::Updated { old, new },
            None => Event::Added(new),
        })
    }
}

impl<K> State<K> {
    /// Records a read of `entry` and copies out what it needs.
    fn read(&self, key: &Arc<ObjectKey>, entry: &Entry<K>) -> Read<K> {
        let epoch = self.epoch;
        let before = entry
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(Use(u).read_in(epoch).0)
            })
            .unwrap_or_else(|u| u);
        let reads = Use(before).read_in(epoch).reads();
        let unpack =
            (reads >= UNPACK_READS && matches!(entry.object, Slot::Packed(_))).then(|| key.clone());
        Read {
            slot: entry.object.clone(),
            unpack,
        }
    }

    fn index_position(&self, name: &str) -> Option<usize> {
        self.indexers.iter().position(|(n, _)| n == name)
    }

    fn index_values(&self, object: &K) -> Vec<Vec<String>> {
        self.indexers.iter().map(|(_, f)| f(object)).collect()
    }

    fn insert(&mut self, key: ObjectKey, object: Arc<K>) {
        let key = Arc::new(key);
        let values = self.index_values(&object);
        for (index, vals) in self.indices.iter_mut().zip(&values) {
            for v in vals {
                file(index, v, &key);
            }
        }
        let used = AtomicU32::new(Use::written(self.epoch).0);
        self.entries.insert(
            key,
            Entry {
                object: Slot::Object(object),
                values: IndexValues::new(&values),
                used,
            },
        );
    }

    /// Replaces the object under a key the store holds. Only the index values that changed are
    /// re-filed: most updates (a status change) leave every one as it was.
    fn update(&mut self, key: &ObjectKey, object: Arc<K>) {
        let values = self.index_values(&object);
        let Some((key, _)) = self.entries.get_key_value(key) else {
            return;
        };
        let key = key.clone();
        let Some(entry) = self.entries.get_mut(&key) else {
            return;
        };
        for ((index, old), new) in self
            .indices
            .iter_mut()
            .zip(entry.values.groups())
            .zip(&values)
        {
            if old.clone().eq(new.iter().map(String::as_str)) {
                continue;
            }
            for v in old.clone().filter(|v| !new.iter().any(|n| n == v)) {
                unfile(index, v, &key);
            }
            for v in new.iter().filter(|v| !old.clone().any(|o| o == v.as_str())) {
                file(index, v, &key);
            }
        }
        *entry = Entry {
            object: Slot::Object(object),
            values: IndexValues::new(&values),
            used: AtomicU32::new(Use::written(self.epoch).0),
        };
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<Slot<K>> {
        let entry = self.entries.remove(key)?;
        for (index, vals) in self.indices.iter_mut().zip(entry.values.groups()) {
            for v in vals {
                unfile(index, v, key);
            }
        }
        Some(entry.object)
    }
}

/// The values each indexer returned for an object, packed ([`Strings`]). A pod is filed under
/// its namespace, owner, node and each label, and a `Vec` of `String`s per indexer cost a dozen
/// allocations per cached object.
#[derive(Debug, Default)]
struct IndexValues {
    /// Every indexer's values, one indexer after another.
    values: Strings,
    /// Per indexer, how many values the indexers up to and including it returned.
    group_ends: Box<[u32]>,
}

impl IndexValues {
    fn new(values: &[Vec<String>]) -> Self {
        let group_ends = values
            .iter()
            .scan(0, |n, g| {
                *n += g.len();
                Some(u32::try_from(*n).unwrap_or(u32::MAX))
            })
            .collect();
        IndexValues {
            values: values.iter().flatten().collect(),
            group_ends,
        }
    }

    /// Each indexer's values, in order.
    fn groups(&self) -> impl Iterator<Item = impl Iterator<Item = &str> + Clone> {
        (0..self.group_ends.len()).map(move |i| {
            let start = match i {
                0 => 0,
                _ => self.group_ends[i - 1] as usize,
            };
            (start..self.group_ends[i] as usize).map(move |j| self.values.get(j).unwrap_or(""))
        })
    }
}

/// Files `key` under `value` in one index.
fn file(index: &mut HashMap<String, BTreeSet<Arc<ObjectKey>>>, value: &str, key: &Arc<ObjectKey>) {
    match index.get_mut(value) {
        Some(keys) => {
            keys.insert(key.clone());
        }
        None => {
            index.insert(value.to_owned(), BTreeSet::from([key.clone()]));
        }
    }
}

/// Takes `key` out of `value` in one index.
fn unfile(index: &mut HashMap<String, BTreeSet<Arc<ObjectKey>>>, value: &str, key: &ObjectKey) {
    if let Some(keys) = index.get_mut(value) {
        keys.remove(key);
        // Drop empty sets so `index_values` lists only live values and the map does not grow
        // with every node or owner ever seen.
        if keys.is_empty() {
            index.remove(value);
        }
    }
}

/// Two states of one object are the same version when their `resourceVersion`s are equal
/// (opaque strings: compared, never ordered). Objects without one always count as changed.
fn same_version<K: Object>(a: &K, b: &K) -> bool {
    match (a.resource_version(), b.resource_version()) {
        (Some(a), Some(b)) => !a.is_empty() && a == b,
        _ => false,
    }
}

/// `spec.nodeName`, read directly for the types that carry it in practice and, when asked,
/// from the serialized form of any other type.
fn node_name<K: Object>(object: &K, serialize_fallback: bool) -> Option<String> {
    let any = object as &dyn Any;
    let name = if let Some(pod) = any.downcast_ref::<Pod>() {
        pod.spec.as_ref().and_then(|s| s.node_name.clone())
    } else if let Some(d) = any.downcast_ref::<DynamicObject>() {
        d.0.pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .map(String::from)
    } else if serialize_fallback {
        serde_json::to_value(object).ok().and_then(|v| {
            v.pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .map(String::from)
        })
    } else {
        None
    };
    name.filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn cm(ns: &str, name: &str, rv: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.namespace = Some(ns.into());
        c.metadata.name = Some(name.into());
        c.metadata.resource_version = Some(rv.into());
        c
    }

    fn describe(events: &[Event<ConfigMap>]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Added(o) => format!(
                    "added {}@{}",
                    ObjectKey::of(o.as_ref()),
                    o.metadata.resource_version.as_deref().unwrap_or("")
                ),
                Event::Updated { old, new } => format!(
                    "updated {}@{}->{}",
                    ObjectKey::of(new.as_ref()),
                    old.metadata.resource_version.as_deref().unwrap_or(""),
                    new.metadata.resource_version.as_deref().unwrap_or("")
                ),
                Event::Deleted(o) => format!(
                    "deleted {}@{}",
                    ObjectKey::of(o.as_ref()),
                    o.metadata.resource_version.as_deref().unwrap_or("")
                ),
            })
            .collect()
    }

    #[test]
    fn relist_emits_exactly_the_differences() {
        let store = Store::new();
        let first = store.replace(vec![
            cm("a", "keep", "1"),
            cm("a", "change", "2"),
            cm("b", "vanish", "3"),
        ]);
        assert_eq!(
            describe(&first),
            ["added a/keep@1", "added a/change@2", "added b/vanish@3"]
        );
        let kept = store.get(&ObjectKey::new(Some("a"), "keep")).unwrap();

        let second = store.replace(vec![
            cm("a", "keep", "1"),
            cm("a", "change", "7"),
            cm("c", "new", "8"),
        ]);
        assert_eq!(
            describe(&second),
            [
                "updated a/change@2->7",
                "added c/new@8",
                "deleted b/vanish@3"
            ]
        );
        // Unchanged objects keep their allocation: no copy, no event.
        assert!(Arc::ptr_eq(
            &kept,
            &store.get(&ObjectKey::new(Some("a"), "keep")).unwrap()
        ));
        assert_eq!(store.len(), 3);
        assert!(store.by_namespace("b").is_empty());
        assert!(store.index_values(NAMESPACE_INDEX) == ["a", "c"]);
    }

    #[test]
    fn replayed_watch_events_are_ignored() {
        let store = Store::new();
        assert!(matches!(
            store.upsert(cm("a", "x", "1")),
            Some(Event::Added(_))
        ));
        assert!(store.upsert(cm("a", "x", "1")).is_none());
        assert!(matches!(
            store.upsert(cm("a", "x", "2")),
            Some(Event::Updated { .. })
        ));
        assert!(matches!(
            store.delete(cm("a", "x", "3")),
            Some(Event::Deleted(_))
        ));
        assert!(store.delete(cm("a", "x", "3")).is_none());
        assert!(store.is_empty());
    }

    #[test]
    fn indexes_follow_updates_and_deletes() {
        let store = Store::new();
        let mut a = cm("ns1", "a", "1");
        a.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        a.metadata.owner_references = Some(vec![OwnerReference {
            uid: "u1".into(),
            ..Default::default()
        }]);
        store.upsert(a.clone());
        assert_eq!(store.by_label("app", "web").len(), 1);
        assert_eq!(store.by_owner("u1").len(), 1);

        a.metadata.resource_version = Some("2".into());
        a.metadata.labels = Some([("app".to_string(), "db".to_string())].into());
        a.metadata.owner_references = None;
        store.upsert(a.clone());
        assert!(store.by_label("app", "web").is_empty());
        assert_eq!(store.by_label("app", "db").len(), 1);
        assert!(store.by_owner("u1").is_empty());
        assert_eq!(store.index_values(LABEL_INDEX), ["app=db"]);

        store
            .add_index(
                "data-keys",
                Arc::new(|c: &ConfigMap| c.data.iter().flat_map(|d| d.keys().cloned()).collect()),
            )
            .unwrap();
        assert_eq!(
            store.add_index("data-keys", Arc::new(|_: &ConfigMap| Vec::new())),
            Err(InformerError::IndexExists("data-keys".into()))
        );
        let mut b = cm("ns1", "b", "3");
        b.data = Some([("k".to_string(), "v".to_string())].into());
        store.upsert(b);
        assert_eq!(
            store.index_keys("data-keys", "k"),
            [ObjectKey::new(Some("ns1"), "b")]
        );
        store.delete(a);
        assert_eq!(store.index_values(LABEL_INDEX), Vec::<String>::new());
        assert!(store.by_index("no-such-index", "x").is_empty());
    }

    /// Every index, as (index, value, keys), for comparing two stores.
    fn all_indexes(store: &Store<ConfigMap>) -> Vec<(String, String, Vec<ObjectKey>)> {
        let names: Vec<String> = {
            let state = store.shared.state.read();
            state.indexers.iter().map(|(n, _)| n.clone()).collect()
        };
        let mut out = Vec::new();
        for name in names {
            for value in store.index_values(&name) {
                let keys = store.index_keys(&name, &value);
                out.push((name.clone(), value, keys));
            }
        }
        out
    }

    proptest::proptest! {
        /// However objects change (labels, owners, controller flags come and go), a store kept up
        /// to date by updates indexes exactly as one built from scratch with the same objects.
        #[test]
        fn updated_indexes_equal_rebuilt_ones(
            ops in proptest::collection::vec(
                (0..4usize, 0..2usize, proptest::option::of(0..3usize), proptest::option::of((0..2usize, proptest::bool::ANY)), proptest::bool::weighted(0.15)),
                1..40,
            )
        ) {
            let store = Store::new();
            let mut live: BTreeMap<usize, ConfigMap> = BTreeMap::new();
            for (rv, (name, ns, label, owner, delete)) in ops.into_iter().enumerate() {
                let mut c = cm(["a", "b"][ns], &format!("o{name}"), &(rv + 1).to_string());
                // The namespace is part of the key: keep one per name.
                c.metadata.namespace = Some(["a", "b"][name % 2].into());
                if delete {
                    store.delete(c);
                    live.remove(&name);
                } else {
                    c.metadata.labels = label
                        .map(|l| [("app".to_string(), format!("v{l}")), ("tier".to_string(), "x".to_string())].into());
                    c.metadata.owner_references = owner.map(|(uid, controller)| vec![OwnerReference {
                        uid: format!("u{uid}"),
                        controller: Some(controller),
                        ..Default::default()
                    }]);
                    store.upsert(c.clone());
                    live.insert(name, c);
                }
                let rebuilt = Store::from_objects(live.values().cloned());
                proptest::prop_assert_eq!(all_indexes(&store), all_indexes(&rebuilt));
                proptest::prop_assert_eq!(store.keys(), rebuilt.keys());
            }
        }
    }

    #[test]
    fn node_index_for_typed_and_dynamic_pods() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some("n1".into()),
            ..Default::default()
        });
        let typed = Store::from_objects([pod]);
        assert!(typed.has_synced());
        assert_eq!(typed.by_node("n1").len(), 1);

        let dynamic = Store::from_objects([DynamicObject(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n2"}
        }))]);
        assert_eq!(dynamic.by_node("n2").len(), 1);
    }

    #[test]
    fn orphans_are_indexed_by_namespace() {
        let obj = |name: &str, ns: &str, controller: Option<bool>| {
            DynamicObject(serde_json::json!({"metadata": {
                "name": name, "namespace": ns,
                "ownerReferences": controller.map(|c| vec![serde_json::json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": c})]),
            }}))
        };
        let store = Store::from_objects([
            obj("owned", "a", Some(true)),
            obj("weakly-owned", "a", Some(false)),
            obj("free", "a", None),
            obj("elsewhere", "b", None),
        ]);
        let mut names: Vec<String> = store.orphans_in("a").iter().map(|o| o.name()).collect();
        names.sort();
        assert_eq!(names, vec!["free", "weakly-owned"]);
        assert_eq!(store.orphans_in("b").len(), 1);
        assert_eq!(store.by_owner("u").len(), 2);
    }

    #[test]
    fn idle_objects_are_packed_after_a_whole_period_and_read_back_unchanged() {
        let store = Store::new();
        let mut a = cm("ns", "a", "1");
        a.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
        store.upsert(a.clone());
        store.upsert(cm("ns", "b", "2"));
        // Written during this period: not idle yet.
        assert_eq!(store.compact_idle(), 0);
        store.upsert(cm("ns", "b", "3"));
        // `a` sat through a whole period; `b` was written in it.
        assert_eq!(store.compact_idle(), 1);
        assert_eq!(store.packed_len(), 1);
        assert_eq!(store.compact_idle(), 1);
        assert_eq!(store.packed_len(), 2);

        let key = ObjectKey::new(Some("ns"), "a");
        assert_eq!(*store.get(&key).unwrap(), a);
        assert_eq!(*store.by_label("app", "web")[0], a);
        assert_eq!(store.list().len(), 2);

        // A write replaces the packed form; the event's `old` is the packed state.
        let events = store.upsert(cm("ns", "a", "4"));
        assert_eq!(describe(events.as_slice()), ["updated ns/a@1->4"]);
        assert_eq!(store.packed_len(), 1);
        // A replayed event for a packed object is still recognised.
        assert!(store.upsert(cm("ns", "b", "3")).is_none());
        // A relist sees packed objects as they were.
        let events = store.replace(vec![cm("ns", "a", "4")]);
        assert_eq!(describe(&events), ["deleted ns/b@3"]);
    }

    #[test]
    fn a_pass_packs_every_idle_object_however_many_chunks_it_takes() {
        let n = 2 * PACK_CHUNK + 3;
        let objects: Vec<_> = (0..n).map(|i| cm("ns", &format!("c{i}"), "1")).collect();
        let store = Store::from_objects(objects.clone());
        assert_eq!(store.compact_idle(), 0);
        store.upsert(cm("ns", "c0", "2"));
        // Every object but the one written in the period, across three chunks.
        assert_eq!(store.compact_idle(), n - 1);
        assert_eq!(store.packed_len(), n - 1);
        assert_eq!(store.compact_idle(), 1);
        for o in &objects[1..] {
            let key = ObjectKey::new(Some("ns"), o.metadata.name.as_deref().unwrap());
            assert_eq!(*store.get(&key).unwrap(), *o);
        }
    }

    #[test]
    fn packed_index_values_read_back_as_given() {
        let cases: Vec<Vec<Vec<String>>> = vec![
            vec![],
            vec![vec![]],
            vec![
                vec!["".into()],
                vec![],
                vec!["a".into(), "".into(), "ccc".into()],
            ],
            vec![
                vec!["ns".into()],
                vec!["uid-1".into()],
                vec!["app=web".into(), "x=y".into()],
            ],
        ];
        for values in cases {
            let packed = IndexValues::new(&values);
            let back: Vec<Vec<String>> = packed
                .groups()
                .map(|g| g.map(String::from).collect())
                .collect();
            assert_eq!(back, values);
        }
    }

    #[test]
    fn objects_held_outside_the_cache_stay_decoded() {
        let store = Store::new();
        store.upsert(cm("ns", "a", "1"));
        store.compact_idle();
        let held = store.get(&ObjectKey::new(Some("ns"), "a")).unwrap();
        // Read in this period, then idle for a whole one; but packing would free nothing while
        // `held` keeps the object alive.
        store.compact_idle();
        assert_eq!(store.compact_idle(), 0);
        drop(held);
        assert_eq!(store.compact_idle(), 1);
    }

    #[test]
    fn reads_keep_objects_decoded_and_a_third_read_in_a_period_unpacks() {
        let store = Store::new();
        let key = ObjectKey::new(Some("ns"), "a");
        store.upsert(cm("ns", "a", "1"));
        store.compact_idle();
        // Read in every period: never idle.
        for _ in 0..3 {
            assert!(store.get(&key).is_some());
            assert_eq!(store.compact_idle(), 0);
        }
        store.compact_idle();
        assert_eq!(store.packed_len(), 1);
        // Two reads decode a copy each and leave the object packed...
        let first = store.get(&key).unwrap();
        assert_eq!(store.packed_len(), 1);
        assert_eq!(store.by_namespace("ns").pop().unwrap(), first);
        assert_eq!(store.packed_len(), 1);
        // ...a third one in the same period keeps the decoded object.
        let third = store.by_namespace("ns").pop().unwrap();
        assert_eq!(store.packed_len(), 0);
        assert_eq!(first, third);
        assert!(Arc::ptr_eq(&third, &store.get(&key).unwrap()));
        // Reads in a new period count from one again.
        drop((first, third));
        store.compact_idle();
        store.compact_idle();
        assert_eq!(store.packed_len(), 1);
        for _ in 0..2 {
            store.get(&key).unwrap();
            assert_eq!(store.packed_len(), 1);
        }
        store.compact_idle();
        store.get(&key).unwrap();
        assert_eq!(store.packed_len(), 1);
    }

    #[test]
    fn an_entry_use_counts_reads_per_epoch_and_wraps() {
        let u = Use::written(7);
        assert!(u.in_epoch(7) && !u.in_epoch(8));
        assert_eq!(u.reads(), 0);
        let u = u.read_in(7).read_in(7);
        assert_eq!(u.reads(), 2);
        assert_eq!(u.read_in(7).read_in(7).read_in(7).reads(), 3);
        assert_eq!(u.read_in(8).reads(), 1);
        assert!(u.read_in(8).in_epoch(8));
        // Epochs wrap: only equality matters, also past the bits kept.
        let late = u32::MAX - 1;
        assert!(Use::written(late).read_in(late).in_epoch(late));
        assert!(!Use::written(late).in_epoch(late.wrapping_add(1)));
        assert!(Use::written(u32::MAX).in_epoch(u32::MAX));
        assert!(!Use::written(u32::MAX).in_epoch(0));
    }

    #[test]
    fn packed_pods_and_dynamic_objects_round_trip() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "5", "uid": "u",
                "labels": {"app": "web"}, "creationTimestamp": "2026-01-02T03:04:05Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                    "uid": "o", "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                "ports": [{"containerPort": 80, "protocol": "TCP"}]}],
                "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": 300}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True",
                    "lastTransitionTime": "2026-01-02T03:04:06Z"}],
                "containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": true,
                    "restartCount": 0, "started": true,
                    "state": {"running": {"startedAt": "2026-01-02T03:04:06Z"}}}]}
        }))
        .unwrap();
        let pods = Store::from_objects([pod.clone()]);
        pods.compact_idle();
        assert_eq!(pods.compact_idle(), 1);
        assert_eq!(*pods.by_node("n1")[0], pod);

        let object = DynamicObject(serde_json::json!({
            "apiVersion": "example.com/v1", "kind": "Thing",
            "metadata": {"name": "t", "namespace": "ns", "resourceVersion": "9"},
            "spec": {"nested": {"list": [1, 2.5, "x", null, true]}, "empty": {}}
        }));
        let things = Store::from_objects([object.clone()]);
        things.compact_idle();
        assert_eq!(things.compact_idle(), 1);
        assert_eq!(
            things.get(&ObjectKey::new(Some("ns"), "t")).unwrap().0,
            object.0
        );
    }

    #[test]
    fn a_packed_state_that_does_not_decode_is_replaced_by_the_next_write() {
        let store = Store::new();
        let mut a = cm("ns", "a", "1");
        a.metadata.labels = Some([("app".to_string(), "old".to_string())].into());
        store.upsert(a.clone());
        let key = ObjectKey::new(Some("ns"), "a");
        store
            .shared
            .state
            .write()
            .entries
            .get_mut(&key)
            .unwrap()
            .object = Slot::Packed(Arc::from(lz4_flex::compress_prepend_size(b"{not json")));
        assert!(store.get(&key).is_none());
        a.metadata.resource_version = Some("2".into());
        a.metadata.labels = Some([("app".to_string(), "new".to_string())].into());
        let events = store.upsert(a.clone());
        assert_eq!(describe(events.as_slice()), ["added ns/a@2"]);
        assert_eq!(*store.get(&key).unwrap(), a);
        assert!(store.by_label("app", "old").is_empty());
        assert_eq!(all_indexes(&store), all_indexes(&Store::from_objects([a])));
    }

    #[test]
    fn indexes_added_later_cover_packed_objects() {
        let store = Store::new();
        let mut c = cm("ns", "a", "1");
        c.data = Some([("k".to_string(), "v".to_string())].into());
        store.upsert(c);
        store.compact_idle();
        assert_eq!(store.compact_idle(), 1);
        store
            .add_index(
                "data-keys",
                Arc::new(|c: &ConfigMap| c.data.iter().flat_map(|d| d.keys().cloned()).collect()),
            )
            .unwrap();
        assert_eq!(store.by_index("data-keys", "k").len(), 1);
    }

    #[tokio::test]
    async fn wait_synced_fails_once_stopped() {
        let store: Store<ConfigMap> = Store::new();
        store.mark_stopped();
        assert_eq!(store.wait_synced().await, Err(InformerError::Stopped));
        store.mark_synced();
        assert_eq!(store.wait_synced().await, Ok(()));
    }
}
