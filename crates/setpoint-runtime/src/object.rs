//! [`Object`]: what the runtime needs to read from any object, typed or dynamic, and
//! [`ObjectKey`], the `namespace/name` that work queues carry.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::de::DeserializeOwned;
use serde::Deserialize as _;
use serde::Serialize;
use serde_json::Value;

use crate::client::DynamicObject;

/// The identity of an object within its resource: namespace (None for cluster-scoped) and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The object's `metadata.namespace`; None for cluster-scoped objects (never `Some("")`).
    pub namespace: Option<String>,
    /// The object's `metadata.name`.
    pub name: String,
}

impl ObjectKey {
    /// A key from its parts; an empty namespace counts as none.
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        ObjectKey {
            namespace: namespace.filter(|n| !n.is_empty()).map(String::from),
            name: name.into(),
        }
    }
    /// The key of an object.
    pub fn of<K: Object>(obj: &K) -> Self {
        ObjectKey::new(obj.namespace().as_deref(), &obj.name())
    }
}

impl fmt::Display for ObjectKey {
    /// `namespace/name`, or `name` for cluster-scoped objects.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

/// Metadata access shared by typed objects (k8s-openapi types and user types with an
/// `ObjectMeta`) and [`DynamicObject`].
pub trait Object: Clone + DeserializeOwned + Serialize + Send + Sync + 'static {
    /// `metadata.name`, or empty when unset.
    fn name(&self) -> String;
    /// `metadata.namespace`; None when unset or empty.
    fn namespace(&self) -> Option<String>;
    /// `metadata.uid`, once the server has assigned one.
    fn uid(&self) -> Option<String>;
    /// `metadata.resourceVersion`, as read from the server.
    fn resource_version(&self) -> Option<String>;
    /// `metadata.labels`; empty when unset.
    fn labels(&self) -> std::collections::BTreeMap<String, String>;
    /// `metadata.ownerReferences`; empty when unset.
    fn owner_references(&self) -> Vec<OwnerReference>;
    /// Whether `metadata.deletionTimestamp` is set: the object is being deleted and waits only for
    /// its finalizers.
    fn deletion_timestamp_set(&self) -> bool;
    /// `metadata.generation`: bumped by the server on every change of the spec (anything outside
    /// metadata and status).
    fn generation(&self) -> Option<i64>;
    /// Removes `metadata.managedFields` (see `InformerOptions::strip_managed_fields`).
    fn strip_managed_fields(&mut self);
    /// The uids of the owner references: what the owner index files an object under. Typed
    /// objects read them without copying the references (indexes run on every change).
    fn owner_uids(&self) -> Vec<String> {
        self.owner_references().into_iter().map(|r| r.uid).collect()
    }
    /// Whether one of the owner references is the object's controller.
    fn has_controller(&self) -> bool {
        self.owner_references()
            .iter()
            .any(|r| r.controller == Some(true))
    }
    /// Each label as `key=value`: what the label index files an object under.
    fn label_pairs(&self) -> Vec<String> {
        self.labels()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    }
}

impl<K> Object for K
where
    K: k8s_openapi::Metadata<Ty = ObjectMeta>
        + Clone
        + DeserializeOwned
        + Serialize
        + Send
        + Sync
        + 'static,
{
    fn name(&self) -> String {
        self.metadata().name.clone().unwrap_or_default()
    }
    fn namespace(&self) -> Option<String> {
        self.metadata().namespace.clone().filter(|n| !n.is_empty())
    }
    fn uid(&self) -> Option<String> {
        self.metadata().uid.clone()
    }
    fn resource_version(&self) -> Option<String> {
        self.metadata().resource_version.clone()
    }
    fn labels(&self) -> std::collections::BTreeMap<String, String> {
        self.metadata().labels.clone().unwrap_or_default()
    }
    fn owner_references(&self) -> Vec<OwnerReference> {
        self.metadata().owner_references.clone().unwrap_or_default()
    }
    fn deletion_timestamp_set(&self) -> bool {
        self.metadata().deletion_timestamp.is_some()
    }
    fn generation(&self) -> Option<i64> {
        self.metadata().generation
    }
    fn owner_uids(&self) -> Vec<String> {
        let refs = self.metadata().owner_references.iter().flatten();
        refs.map(|r| r.uid.clone()).collect()
    }
    fn has_controller(&self) -> bool {
        let mut refs = self.metadata().owner_references.iter().flatten();
        refs.any(|r| r.controller == Some(true))
    }
    fn label_pairs(&self) -> Vec<String> {
        let labels = self.metadata().labels.iter().flatten();
        labels.map(|(k, v)| format!("{k}={v}")).collect()
    }
    fn strip_managed_fields(&mut self) {
        self.metadata_mut().managed_fields = None;
    }
}

fn meta_str(v: &Value, f: &str) -> Option<String> {
    v.get("metadata")?.get(f)?.as_str().map(String::from)
}

impl Object for DynamicObject {
    fn name(&self) -> String {
        meta_str(&self.0, "name").unwrap_or_default()
    }
    fn namespace(&self) -> Option<String> {
        meta_str(&self.0, "namespace").filter(|n| !n.is_empty())
    }
    fn uid(&self) -> Option<String> {
        meta_str(&self.0, "uid")
    }
    fn resource_version(&self) -> Option<String> {
        meta_str(&self.0, "resourceVersion")
    }
    fn labels(&self) -> std::collections::BTreeMap<String, String> {
        self.0
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default()
    }
    fn owner_references(&self) -> Vec<OwnerReference> {
        // Decoded from the tree in place: the garbage collector asks this of every event.
        self.0
            .pointer("/metadata/ownerReferences")
            .and_then(|v| Vec::<OwnerReference>::deserialize(v).ok())
            .unwrap_or_default()
    }
    fn deletion_timestamp_set(&self) -> bool {
        self.0
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|v| !v.is_null())
    }
    fn generation(&self) -> Option<i64> {
        self.0
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
    }
    fn strip_managed_fields(&mut self) {
        if let Some(meta) = self.0.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_metadata_for_both_kinds_of_object() {
        let mut cm = k8s_openapi::api::core::v1::ConfigMap::default();
        cm.metadata.name = Some("a".into());
        cm.metadata.namespace = Some("ns".into());
        assert_eq!(ObjectKey::of(&cm).to_string(), "ns/a");
        let d =
            DynamicObject(serde_json::json!({"metadata": {"name": "n1", "labels": {"x": "y"}}}));
        assert_eq!(ObjectKey::of(&d).to_string(), "n1");
        assert_eq!(d.labels().get("x").map(String::as_str), Some("y"));
    }

    #[test]
    fn index_values_read_in_place_equal_those_from_copies() {
        let meta = serde_json::json!({"metadata": {"name": "p", "namespace": "ns",
            "labels": {"app": "web", "tier": "a=b"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1", "controller": true},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u2"}]}});
        let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(meta.clone()).unwrap();
        let dynamic = DynamicObject(meta);
        let bare = k8s_openapi::api::core::v1::Pod::default();
        fn from_copies(o: &impl Object) -> (Vec<String>, bool, Vec<String>) {
            (
                o.owner_references().into_iter().map(|r| r.uid).collect(),
                o.owner_references()
                    .iter()
                    .any(|r| r.controller == Some(true)),
                o.labels()
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect(),
            )
        }
        fn in_place(o: &impl Object) -> (Vec<String>, bool, Vec<String>) {
            (o.owner_uids(), o.has_controller(), o.label_pairs())
        }
        assert_eq!(in_place(&typed), from_copies(&typed));
        assert_eq!(in_place(&dynamic), from_copies(&dynamic));
        assert_eq!(in_place(&typed), in_place(&dynamic));
        assert_eq!(in_place(&bare), (vec![], false, vec![]));
        assert_eq!(
            in_place(&typed),
            (
                vec!["u1".to_string(), "u2".to_string()],
                true,
                vec!["app=web".to_string(), "tier=a=b".to_string()]
            )
        );
    }

    #[test]
    fn strip_managed_fields_keeps_the_rest_of_the_metadata() {
        let mut typed: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "a", "managedFields": [{"manager": "m"}]}}),
        )
        .unwrap();
        assert!(typed.metadata.managed_fields.is_some());
        typed.strip_managed_fields();
        assert_eq!(typed.metadata.managed_fields, None);
        assert_eq!(typed.name(), "a");

        let mut dynamic = DynamicObject(serde_json::json!(
            {"metadata": {"name": "b", "managedFields": [{"manager": "m"}]}, "data": {"k": "v"}}
        ));
        dynamic.strip_managed_fields();
        assert_eq!(
            dynamic.0,
            serde_json::json!({"metadata": {"name": "b"}, "data": {"k": "v"}})
        );
        // No metadata at all is not an error.
        let mut bare = DynamicObject(serde_json::json!({}));
        bare.strip_managed_fields();
        assert_eq!(bare.0, serde_json::json!({}));
    }
}
