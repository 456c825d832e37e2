//! Conversion between resources that share storage. `events.k8s.io/v1` Events are stored as
//! core/v1 Events (as in Kubernetes, both APIs show the same objects); these functions map
//! the renamed fields each way.

use serde_json::{Map, Value};

use crate::registry::ResourceDef;

/// (core/v1 field, events.k8s.io/v1 field) pairs that only differ in name.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// Fields with the same name in both versions.
const EVENT_SHARED: &[&str] = &[
    "metadata",
    "reason",
    "type",
    "action",
    "eventTime",
    "series",
    "related",
    "reportingInstance",
];

fn rename(obj: Value, api_version: &str, to_v1: bool) -> Value {
    let Value::Object(src) = obj else { return obj };
    let mut out = Map::new();
    out.insert("kind".into(), Value::String("Event".into()));
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    for f in EVENT_SHARED {
        if let Some(v) = src.get(*f) {
            out.insert((*f).into(), v.clone());
        }
    }
    for (core, v1) in EVENT_FIELDS {
        let (from, to) = if to_v1 { (core, v1) } else { (v1, core) };
        if let Some(v) = src.get(*from) {
            out.insert((*to).into(), v.clone());
        }
    }
    Value::Object(out)
}

/// A stored object as the (converted) resource shows it.
pub fn from_storage(res: &ResourceDef, obj: Value) -> Value {
    if res.custom.is_some() {
        crate::crd::to_version(res, obj)
    } else if res.group == "events.k8s.io" {
        rename(obj, "events.k8s.io/v1", true)
    } else {
        obj
    }
}

/// A request body of the (converted) resource as it is stored.
pub fn to_storage(res: &ResourceDef, obj: Value) -> Value {
    if res.custom.is_some() {
        crate::crd::to_storage(res, obj)
    } else if res.group == "events.k8s.io" {
        let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if !av.is_empty() && av != "events.k8s.io/v1" {
            return obj;
        }
        rename(obj, "v1", false)
    } else {
        obj
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use serde_json::json;

    #[test]
    fn events_round_trip() {
        let reg = Registry::builtin();
        let res = reg.get("events.k8s.io", "v1", "events").unwrap();
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
                        "regarding": {"kind": "Pod", "name": "p"}, "note": "hi", "reason": "X", "type": "Normal",
                        "reportingController": "c", "reportingInstance": "i", "action": "A", "eventTime": "2026-01-01T00:00:00.000000Z"});
        let core = to_storage(res, v1.clone());
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "hi");
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(from_storage(res, core), v1);
    }
}
