//! Reading and writing object metadata on untyped JSON objects.
//!
//! The API server handles every kind (built-in and custom) as `serde_json::Value`; these helpers
//! keep the field paths in one place.

use serde_json::{Map, Value};

/// `metadata` of an object, if it is an object.
pub fn metadata(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata")?.as_object()
}

/// `metadata` of an object, created if missing (the object itself must be a JSON object).
pub fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    let map = obj.as_object_mut().expect("object");
    let m = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    m.as_object_mut().expect("metadata object")
}

/// A string field of `metadata` (`""` when absent or not a string).
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    metadata(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name")
}
pub fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace")
}
pub fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid")
}
pub fn resource_version(obj: &Value) -> &str {
    meta_str(obj, "resourceVersion")
}
pub fn generate_name(obj: &Value) -> &str {
    meta_str(obj, "generateName")
}
pub fn creation_timestamp(obj: &Value) -> &str {
    meta_str(obj, "creationTimestamp")
}
pub fn deletion_timestamp(obj: &Value) -> Option<&str> {
    metadata(obj)
        .and_then(|m| m.get("deletionTimestamp"))
        .and_then(Value::as_str)
}
pub fn generation(obj: &Value) -> i64 {
    metadata(obj)
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// A string map of `metadata` (`labels`, `annotations`) as (key, value) pairs.
pub fn string_map<'a>(obj: &'a Value, field: &str) -> Vec<(&'a str, &'a str)> {
    metadata(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v)))
                .collect()
        })
        .unwrap_or_default()
}

/// Looks up one label.
pub fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    metadata(obj)?.get("labels")?.get(key)?.as_str()
}

/// `metadata.finalizers` as strings.
pub fn finalizers(obj: &Value) -> Vec<&str> {
    metadata(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Sets a metadata field.
pub fn set_meta(obj: &mut Value, field: &str, value: Value) {
    metadata_mut(obj).insert(field.to_string(), value);
}

/// Removes a metadata field.
pub fn remove_meta(obj: &mut Value, field: &str) {
    metadata_mut(obj).remove(field);
}

/// Follows a dotted path of object keys (`spec.template.metadata`).
pub fn path<'a>(obj: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(obj, |v, k| v.get(k))
}

/// `apiVersion` and `kind` of an object.
pub fn type_meta(obj: &Value) -> (&str, &str) {
    (
        obj.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
        obj.get("kind").and_then(Value::as_str).unwrap_or(""),
    )
}
