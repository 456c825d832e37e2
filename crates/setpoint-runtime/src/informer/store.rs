//! The cache behind an informer: objects by key, plus indexes.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::RwLock;
use serde_json::Value;
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
    object: Arc<K>,
    /// The values each indexer returned when the object was stored, aligned with `indexers`.
    /// Kept so removal does not depend on index functions being pure.
    values: Vec<Vec<String>>,
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
        let owner: IndexFn<K> =
            Arc::new(|o: &K| o.owner_references().into_iter().map(|r| r.uid).collect());
        let node: IndexFn<K> =
            Arc::new(move |o: &K| node_name(o, node_fallback).into_iter().collect());
        let label: IndexFn<K> = Arc::new(|o: &K| {
            o.labels()
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        });
        let orphan: IndexFn<K> = Arc::new(|o: &K| {
            let owned = o
                .owner_references()
                .iter()
                .any(|r| r.controller == Some(true));
            if owned {
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
        self.shared
            .state
            .read()
            .entries
            .get(key)
            .map(|e| e.object.clone())
    }

    /// Every object, in key order.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.shared
            .state
            .read()
            .entries
            .values()
            .map(|e| e.object.clone())
            .collect()
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
        let state = self.shared.state.read();
        let Some(i) = state.index_position(name) else {
            return Vec::new();
        };
        state.indices[i]
            .get(value)
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| state.entries.get(k))
                    .map(|e| e.object.clone())
                    .collect()
            })
            .unwrap_or_default()
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
            let values = f(&entry.object);
            for v in &values {
                file(&mut index, v, key);
            }
            entry.values.push(values);
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
        let mut state = self.shared.state.write();
        let old = state.entries.get(&key).map(|e| e.object.clone());
        match old {
            Some(old) if same_version(old.as_ref(), &object) => None,
            Some(old) => {
                let new = Arc::new(object);
                state.update(&key, new.clone());
                Some(Event::Updated { old, new })
            }
            None => {
                let new = Arc::new(object);
                state.insert(key, new.clone());
                Some(Event::Added(new))
            }
        }
    }

    /// Removes a deleted object; the event carries the object as the server last sent it.
    /// None when the cache did not hold it.
    pub(crate) fn delete(&self, object: K) -> Option<Event<K>> {
        let key = ObjectKey::of(&object);
        let mut state = self.shared.state.write();
        state.remove(&key)?;
        Some(Event::Deleted(Arc::new(object)))
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
            let old = state.entries.get(&key).map(|e| e.object.clone());
            match old {
                Some(old) if same_version(old.as_ref(), &object) => {}
                Some(old) => {
                    let new = Arc::new(object);
                    state.update(&key, new.clone());
                    events.push(Event::Updated { old, new });
                }
                None => {
                    let new = Arc::new(object);
                    state.insert(key, new.clone());
                    events.push(Event::Added(new));
                }
            }
        }
        let gone: Vec<Arc<ObjectKey>> = state
            .entries
            .keys()
            .filter(|k| !seen.contains(k.as_ref()))
            .cloned()
            .collect();
        for key in gone {
            if let Some(old) = state.remove(&key) {
                events.push(Event::Deleted(old));
            }
        }
        events
    }
}

impl<K> State<K> {
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
        self.entries.insert(key, Entry { object, values });
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
        for ((index, old), new) in self.indices.iter_mut().zip(&entry.values).zip(&values) {
            if old == new {
                continue;
            }
            for v in old.iter().filter(|v| !new.contains(v)) {
                unfile(index, v, &key);
            }
            for v in new.iter().filter(|v| !old.contains(v)) {
                file(index, v, &key);
            }
        }
        *entry = Entry { object, values };
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<Arc<K>> {
        let entry = self.entries.remove(key)?;
        for (index, vals) in self.indices.iter_mut().zip(&entry.values) {
            for v in vals {
                unfile(index, v, key);
            }
        }
        Some(entry.object)
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

    #[tokio::test]
    async fn wait_synced_fails_once_stopped() {
        let store: Store<ConfigMap> = Store::new();
        store.mark_stopped();
        assert_eq!(store.wait_synced().await, Err(InformerError::Stopped));
        store.mark_synced();
        assert_eq!(store.wait_synced().await, Ok(()));
    }
}
