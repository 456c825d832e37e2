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

/// `metadata.name` (`""` when absent).
pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name")
}
/// `metadata.namespace` (`""` when absent, as for cluster-scoped objects).
pub fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace")
}
/// `metadata.uid` (`""` when absent, as before the server assigns one).
pub fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid")
}
/// `metadata.resourceVersion` (`""` when absent).
pub fn resource_version(obj: &Value) -> &str {
    meta_str(obj, "resourceVersion")
}
/// `metadata.generateName`, the prefix the server completes into a name (`""` when absent).
pub fn generate_name(obj: &Value) -> &str {
    meta_str(obj, "generateName")
}
/// `metadata.creationTimestamp` as its RFC 3339 text (`""` when absent).
pub fn creation_timestamp(obj: &Value) -> &str {
    meta_str(obj, "creationTimestamp")
}
/// `metadata.deletionTimestamp` as its RFC 3339 text; `None` unless the object is being
/// deleted (or the field is not a string).
pub fn deletion_timestamp(obj: &Value) -> Option<&str> {
    metadata(obj)
        .and_then(|m| m.get("deletionTimestamp"))
        .and_then(Value::as_str)
}
/// `metadata.generation` (0 when absent or not an integer).
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

/// Whether two objects are equal once the `ignored` metadata fields are removed from both (as
/// [`remove_meta`] would: a missing `metadata` counts as an empty one), without copying
/// either. Write paths ask this of every update, so it must not clone whole objects.
pub fn eq_ignoring_meta(a: &Value, b: &Value, ignored: &[&str]) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    if ignored.is_empty() {
        return a == b;
    }
    let others = |m: &Map<String, Value>| m.len() - usize::from(m.contains_key("metadata"));
    if others(a) != others(b)
        || !a
            .iter()
            .filter(|(k, _)| *k != "metadata")
            .all(|(k, v)| b.get(k) == Some(v))
    {
        return false;
    }
    let empty = Map::new();
    let ma = a
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mb = b
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let kept = |m: &Map<String, Value>| {
        m.iter()
            .filter(|(k, _)| !ignored.contains(&k.as_str()))
            .count()
    };
    kept(ma) == kept(mb)
        && ma
            .iter()
            .filter(|(k, _)| !ignored.contains(&k.as_str()))
            .all(|(k, v)| mb.get(k) == Some(v))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The definition `eq_ignoring_meta` must agree with: copy, remove, compare.
    fn by_copy(a: &Value, b: &Value, ignored: &[&str]) -> bool {
        let (mut a, mut b) = (a.clone(), b.clone());
        for f in ignored {
            remove_meta(&mut a, f);
            remove_meta(&mut b, f);
        }
        a == b
    }

    #[test]
    fn eq_ignoring_meta_agrees_with_removing_the_fields() {
        let objects = [
            json!({}),
            json!({"metadata": {}}),
            json!({"metadata": "not an object"}),
            json!({"metadata": {"resourceVersion": "1"}}),
            json!({"metadata": {"resourceVersion": "2", "name": "a"}}),
            json!({"metadata": {"name": "a", "resourceVersion": "3"}}),
            json!({"metadata": {"name": "a", "managedFields": [1]}}),
            json!({"metadata": {"name": "a"}, "spec": {"x": 1}}),
            json!({"spec": {"x": 1}, "metadata": {"name": "a", "resourceVersion": "9"}}),
            json!({"spec": {"x": 2}, "metadata": {"name": "a"}}),
            json!({"spec": {"x": 1}}),
            json!({"spec": {"x": 1}, "status": {}}),
        ];
        for ignored in [
            &["resourceVersion"][..],
            &["managedFields", "resourceVersion"],
            &[],
        ] {
            for a in &objects {
                for b in &objects {
                    assert_eq!(
                        eq_ignoring_meta(a, b, ignored),
                        by_copy(a, b, ignored),
                        "{a} vs {b} ignoring {ignored:?}"
                    );
                }
            }
        }
        // Not objects at all: plain equality.
        assert!(eq_ignoring_meta(&json!(1), &json!(1), &["resourceVersion"]));
        assert!(!eq_ignoring_meta(
            &json!(1),
            &json!({}),
            &["resourceVersion"]
        ));
    }
}
