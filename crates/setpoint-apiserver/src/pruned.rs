//! Parsing only chosen parts of a JSON object.
//!
//! The watch cache extracts a few attributes from every stored object version it receives
//! (name, namespace, labels, the kind's selectable fields), and building the whole tree of a
//! pod to read them cost more than all the rest of keeping the cache. [`parse_keeping`] builds
//! only the subtrees at the given paths; everything else is skipped unbuilt, though still
//! checked to be well-formed JSON.
//! For example, keeping `metadata.name` and `spec.nodeName` of
//! `{"metadata": {"name": "p", "uid": "u"}, "spec": {"nodeName": "n", "containers": []}}`
//! gives `{"metadata": {"name": "p"}, "spec": {"nodeName": "n"}}` (the test
//! `keeps_only_the_paths_asked_for` below).

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use setpoint_api::jsonkey::Key;

/// Parses `json`, keeping only the subtrees at `paths` (dotted, through objects). Objects on
/// the way to a kept path keep just what leads there; a value on the way that is not an object
/// is kept whole, so that reading a path gives what it would in the whole document.
pub fn parse_keeping(json: &[u8], paths: &[&str]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let value = Keep { paths }.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// The paths still to keep below the current value, relative to it.
struct Keep<'a> {
    paths: &'a [&'a str],
}

impl<'de> DeserializeSeed<'de> for Keep<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Keep<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Value>()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let mut below: Vec<&str> = Vec::new();
        while let Some(Key(key)) = map.next_key::<Key>()? {
            below.clear();
            let mut whole = false;
            for path in self.paths {
                if *path == key {
                    whole = true;
                    break;
                }
                if let Some(rest) = path.strip_prefix(&*key).and_then(|r| r.strip_prefix('.')) {
                    below.push(rest);
                }
            }
            if whole {
                out.insert(key.into_owned(), map.next_value::<Value>()?);
            } else if !below.is_empty() {
                let value = map.next_value_seed(Keep { paths: &below })?;
                out.insert(key.into_owned(), value);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_the_paths_asked_for() {
        let json = br#"{"metadata": {"name": "p", "uid": "u"}, "spec": {"nodeName": "n", "containers": []}}"#;
        let kept = parse_keeping(json, &["metadata.name", "spec.nodeName"]).unwrap();
        assert_eq!(
            kept,
            serde_json::json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n"}})
        );
    }
    use serde_json::json;

    #[test]
    fn keeps_exactly_the_paths_asked_for() {
        let doc = json!({
            "metadata": {"name": "p", "namespace": "d", "labels": {"a": "b"}, "managedFields": [{"x": 1}]},
            "spec": {"nodeName": "n", "containers": [{"name": "c"}], "hostNetwork": false},
            "status": {"podIPs": [{"ip": "1"}], "phase": "Running"},
            "other": 1.5
        });
        let bytes = serde_json::to_vec(&doc).unwrap();
        let kept = parse_keeping(
            &bytes,
            &[
                "metadata.name",
                "metadata.labels",
                "spec.hostNetwork",
                "status.podIPs",
                "absent.x",
            ],
        )
        .unwrap();
        assert_eq!(
            kept,
            json!({
                "metadata": {"name": "p", "labels": {"a": "b"}},
                "spec": {"hostNetwork": false},
                "status": {"podIPs": [{"ip": "1"}]}
            })
        );
        // A non-object on the way is kept whole; escaped keys match; the last duplicate wins.
        let odd =
            br#"{"spec": [1, {"nodeName": "n"}], "meta\u0064ata": {"name": "a", "name": "b"}}"#;
        let kept = parse_keeping(odd, &["spec.nodeName", "metadata.name"]).unwrap();
        assert_eq!(
            kept,
            json!({"spec": [1, {"nodeName": "n"}], "metadata": {"name": "b"}})
        );
    }

    #[test]
    fn malformed_json_is_an_error_even_where_skipped() {
        assert!(parse_keeping(br#"{"a": 1, "b": [1, 2}"#, &["a"]).is_err());
        assert!(parse_keeping(br#"{"a": 1} x"#, &["a"]).is_err());
        assert!(parse_keeping(b"", &["a"]).is_err());
    }
}
