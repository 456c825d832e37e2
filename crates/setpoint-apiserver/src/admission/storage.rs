//! Storage admission: `DefaultStorageClass` (a claim that names no class gets the default one)
//! and `StorageObjectInUseProtection` (every new claim and volume carries its protection
//! finalizer, so neither disappears while in use; the protection controllers remove them).

use serde_json::Value;
use setpoint_api::storage;

use crate::registry::ResourceDef;
use crate::state::ApiServer;
use crate::watchcache::Filter;

impl ApiServer {
    /// Runs the storage admission steps on a new claim or volume.
    pub(crate) fn admit_storage(&self, res: &ResourceDef, obj: &mut Value) {
        if !res.group.is_empty() {
            return;
        }
        match res.plural.as_str() {
            "persistentvolumeclaims" => {
                if !storage::claim_names_class(obj) {
                    if let Some(class) = default_class(&self.storage_classes()) {
                        if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                            spec.insert("storageClassName".into(), Value::from(class));
                        }
                    }
                }
                add_finalizer(obj, storage::PVC_PROTECTION_FINALIZER);
            }
            "persistentvolumes" => add_finalizer(obj, storage::PV_PROTECTION_FINALIZER),
            _ => {}
        }
    }

    /// Every StorageClass, from the watch cache.
    fn storage_classes(&self) -> Vec<Value> {
        let Some(def) = self
            .registry()
            .get("storage.k8s.io", "v1", "storageclasses")
            .cloned()
        else {
            return vec![];
        };
        self.caches
            .get(&def.storage_prefix())
            .list(&def.namespace_prefix(None), &Filter::all())
            .0
            .iter()
            .map(|o| o.object())
            .collect()
    }
}

/// The default class among `classes`: of several marked default, the newest, then the first
/// by name, as upstream's `GetDefaultClass` picks since 1.26.
pub(crate) fn default_class(classes: &[Value]) -> Option<String> {
    classes
        .iter()
        .filter(|c| storage::is_default_class(c))
        .max_by(|a, b| {
            let created = |c: &Value| {
                c.pointer("/metadata/creationTimestamp")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            let name = |c: &Value| {
                c.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            // Newest first; between equals, the smaller name wins (so it compares greater).
            created(a)
                .cmp(&created(b))
                .then_with(|| name(b).cmp(&name(a)))
        })
        .and_then(|c| c.pointer("/metadata/name").and_then(Value::as_str))
        .map(str::to_string)
}

fn add_finalizer(obj: &mut Value, finalizer: &str) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let list = meta
        .entry("finalizers")
        .or_insert_with(|| Value::Array(vec![]));
    if !list.is_array() {
        // A malformed list is left for validation to report.
        return;
    }
    if let Some(items) = list.as_array_mut() {
        if !items.iter().any(|f| f.as_str() == Some(finalizer)) {
            items.push(Value::from(finalizer));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(name: &str, created: &str, default: bool) -> Value {
        json!({"metadata": {"name": name, "creationTimestamp": created,
            "annotations": {storage::DEFAULT_CLASS_ANNOTATION: default.to_string()}}})
    }

    #[test]
    fn newest_default_class_wins() {
        let classes = [
            class("a", "2026-01-01T00:00:00Z", true),
            class("b", "2026-01-02T00:00:00Z", true),
            class("c", "2026-01-03T00:00:00Z", false),
        ];
        assert_eq!(default_class(&classes).as_deref(), Some("b"));
        assert_eq!(default_class(&classes[2..]), None);
    }

    #[test]
    fn finalizer_added_once() {
        let mut obj = json!({"metadata": {"finalizers": ["x"]}});
        add_finalizer(&mut obj, "y");
        add_finalizer(&mut obj, "y");
        assert_eq!(obj["metadata"]["finalizers"], json!(["x", "y"]));
    }
}
