//! Conversion between resources that share storage. `events.k8s.io/v1` Events are stored as
//! core/v1 Events (as in Kubernetes, both APIs show the same objects); these functions map
//! the renamed fields each way. `autoscaling/v1` HorizontalPodAutoscalers are stored as
//! `autoscaling/v2`: v1's CPU target is v2's Resource `cpu` Utilization metric, and what v1
//! cannot express travels in upstream's `autoscaling.alpha.kubernetes.io/*` annotations.

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

/// v2 metrics v1 has no field for (`spec.metrics` but the CPU utilization target).
const HPA_METRICS: &str = "autoscaling.alpha.kubernetes.io/metrics";
/// v2 `status.currentMetrics` but the CPU utilization.
const HPA_CURRENT_METRICS: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
/// v2 `status.conditions`.
const HPA_CONDITIONS: &str = "autoscaling.alpha.kubernetes.io/conditions";
/// v2 `spec.behavior`.
const HPA_BEHAVIOR: &str = "autoscaling.alpha.kubernetes.io/behavior";

fn is_hpa_v1(res: &ResourceDef) -> bool {
    res.group == "autoscaling" && res.version == "v1" && res.kind == "HorizontalPodAutoscaler"
}

/// Splits v2 metrics into the first CPU one `is_it` picks, as the number at `path` v1 has a
/// field for (`null` when it has none), and the others, which v1 keeps in an annotation.
fn split_cpu(
    metrics: &[Value],
    path: &str,
    is_it: impl Fn(&Value) -> bool,
) -> (Option<Value>, Vec<Value>) {
    let cpu = metrics.iter().position(is_it);
    let value = cpu.map(|i| metrics[i].pointer(path).cloned().unwrap_or(Value::Null));
    let others = metrics
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != cpu)
        .map(|(_, m)| m.clone())
        .collect();
    (value, others)
}

/// Whether a v2 metric (spec or status) is the Resource `cpu` one v1's CPU fields stand for.
fn is_cpu(m: &Value, utilization: &str) -> bool {
    m.get("type").and_then(Value::as_str) == Some("Resource")
        && m.pointer("/resource/name").and_then(Value::as_str) == Some("cpu")
        && m.pointer(utilization).is_some()
}

fn annotate(meta: &mut Map<String, Value>, key: &str, v: Option<Value>) {
    let Some(v) = v else { return };
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(a) = annotations {
        a.insert(key.into(), Value::String(v.to_string()));
    }
}

/// A stored v2 HorizontalPodAutoscaler as autoscaling/v1 shows it.
fn hpa_to_v1(obj: Value) -> Value {
    let Value::Object(mut src) = obj else {
        return obj;
    };
    let mut meta = match src.remove("metadata") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let spec = src.remove("spec").unwrap_or(Value::Null);
    let status = src.remove("status").unwrap_or(Value::Null);
    let mut v1_spec = Map::new();
    for f in ["scaleTargetRef", "minReplicas", "maxReplicas"] {
        if let Some(v) = spec.get(f) {
            v1_spec.insert(f.into(), v.clone());
        }
    }
    let utilization = "/resource/target/averageUtilization";
    let metrics = spec
        .get("metrics")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let (cpu, others) = split_cpu(&metrics, utilization, |m| {
        is_cpu(m, utilization)
            && m.pointer("/resource/target/type").and_then(Value::as_str) == Some("Utilization")
    });
    if let Some(cpu) = cpu {
        v1_spec.insert("targetCPUUtilizationPercentage".into(), cpu);
    }
    annotate(
        &mut meta,
        HPA_METRICS,
        (!others.is_empty()).then_some(Value::Array(others)),
    );
    annotate(
        &mut meta,
        HPA_BEHAVIOR,
        spec.get("behavior").filter(|b| !b.is_null()).cloned(),
    );
    let mut v1_status = Map::new();
    for f in [
        "observedGeneration",
        "lastScaleTime",
        "currentReplicas",
        "desiredReplicas",
    ] {
        if let Some(v) = status.get(f) {
            v1_status.insert(f.into(), v.clone());
        }
    }
    let current_path = "/resource/current/averageUtilization";
    let current = status
        .get("currentMetrics")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let (cpu_now, others) = split_cpu(&current, current_path, |m| is_cpu(m, current_path));
    if let Some(cpu) = cpu_now {
        v1_status.insert("currentCPUUtilizationPercentage".into(), cpu);
    }
    annotate(
        &mut meta,
        HPA_CURRENT_METRICS,
        (!others.is_empty()).then_some(Value::Array(others)),
    );
    annotate(
        &mut meta,
        HPA_CONDITIONS,
        status
            .get("conditions")
            .filter(|c| c.as_array().is_some_and(|a| !a.is_empty()))
            .cloned(),
    );
    let mut out = Map::new();
    out.insert(
        "kind".into(),
        Value::String("HorizontalPodAutoscaler".into()),
    );
    out.insert("apiVersion".into(), Value::String("autoscaling/v1".into()));
    out.insert("metadata".into(), Value::Object(meta));
    out.insert("spec".into(), Value::Object(v1_spec));
    if !status.is_null() {
        out.insert("status".into(), Value::Object(v1_status));
    }
    Value::Object(out)
}

/// Takes an annotation holding JSON off `meta`.
fn take_annotation(meta: &mut Map<String, Value>, key: &str) -> Option<Value> {
    let a = meta.get_mut("annotations")?.as_object_mut()?;
    let v = a.remove(key)?;
    if a.is_empty() {
        meta.remove("annotations");
    }
    serde_json::from_str(v.as_str()?).ok()
}

/// An autoscaling/v1 HorizontalPodAutoscaler as v2 stores it.
fn hpa_to_v2(obj: Value) -> Value {
    let Value::Object(mut src) = obj else {
        return obj;
    };
    let mut meta = match src.remove("metadata") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let spec = src.remove("spec").unwrap_or(Value::Null);
    let status = src.remove("status").unwrap_or(Value::Null);
    let mut v2_spec = Map::new();
    for f in ["scaleTargetRef", "minReplicas", "maxReplicas"] {
        if let Some(v) = spec.get(f) {
            v2_spec.insert(f.into(), v.clone());
        }
    }
    let mut metrics = Vec::new();
    if let Some(cpu) = spec
        .get("targetCPUUtilizationPercentage")
        .filter(|v| !v.is_null())
    {
        metrics.push(
            serde_json::json!({"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": cpu}}}),
        );
    }
    if let Some(Value::Array(others)) = take_annotation(&mut meta, HPA_METRICS) {
        metrics.extend(others);
    }
    if !metrics.is_empty() {
        v2_spec.insert("metrics".into(), Value::Array(metrics));
    }
    if let Some(b) = take_annotation(&mut meta, HPA_BEHAVIOR) {
        v2_spec.insert("behavior".into(), b);
    }
    let mut v2_status = Map::new();
    for f in [
        "observedGeneration",
        "lastScaleTime",
        "currentReplicas",
        "desiredReplicas",
    ] {
        if let Some(v) = status.get(f) {
            v2_status.insert(f.into(), v.clone());
        }
    }
    let mut current = Vec::new();
    if let Some(cpu) = status
        .get("currentCPUUtilizationPercentage")
        .filter(|v| !v.is_null())
    {
        current.push(
            serde_json::json!({"type": "Resource", "resource": {"name": "cpu",
            "current": {"averageUtilization": cpu}}}),
        );
    }
    if let Some(Value::Array(others)) = take_annotation(&mut meta, HPA_CURRENT_METRICS) {
        current.extend(others);
    }
    if !current.is_empty() {
        v2_status.insert("currentMetrics".into(), Value::Array(current));
    }
    if let Some(c) = take_annotation(&mut meta, HPA_CONDITIONS) {
        v2_status.insert("conditions".into(), c);
    }
    if !v2_status.contains_key("desiredReplicas") && !status.is_null() {
        v2_status.insert("desiredReplicas".into(), Value::from(0));
    }
    let mut out = Map::new();
    out.insert(
        "kind".into(),
        Value::String("HorizontalPodAutoscaler".into()),
    );
    out.insert("apiVersion".into(), Value::String("autoscaling/v2".into()));
    out.insert("metadata".into(), Value::Object(meta));
    out.insert("spec".into(), Value::Object(v2_spec));
    if !status.is_null() {
        out.insert("status".into(), Value::Object(v2_status));
    }
    Value::Object(out)
}

/// A stored object as the (converted) resource shows it.
pub fn from_storage(res: &ResourceDef, obj: Value) -> Value {
    if res.custom.is_some() {
        crate::crd::to_version(res, obj)
    } else if res.group == "events.k8s.io" {
        rename(obj, "events.k8s.io/v1", true)
    } else if is_hpa_v1(res) {
        hpa_to_v1(obj)
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
    } else if is_hpa_v1(res) {
        let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if !av.is_empty() && av != "autoscaling/v1" {
            return obj;
        }
        hpa_to_v2(obj)
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
    fn hpa_v1_round_trip() {
        let reg = Registry::builtin();
        let v1 = reg
            .all()
            .iter()
            .find(|r| {
                r.group == "autoscaling"
                    && r.version == "v1"
                    && r.plural == "horizontalpodautoscalers"
            })
            .unwrap()
            .clone();
        assert!(v1.is_converted());
        let stored = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 2, "maxReplicas": 10,
                "metrics": [
                    {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}},
                    {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}}],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}},
            "status": {"currentReplicas": 3, "desiredReplicas": 6,
                "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 140, "averageValue": "140m"}}}],
                "conditions": [{"type": "AbleToScale", "status": "True", "reason": "SucceededRescale"}]}});
        let shown = from_storage(&v1, stored.clone());
        assert_eq!(shown["apiVersion"], "autoscaling/v1");
        assert_eq!(shown["spec"]["targetCPUUtilizationPercentage"], 70);
        assert_eq!(shown["status"]["currentCPUUtilizationPercentage"], 140);
        assert_eq!(shown["status"]["desiredReplicas"], 6);
        let a = &shown["metadata"]["annotations"];
        assert!(a[HPA_METRICS].as_str().unwrap().contains("memory"));
        assert!(a[HPA_BEHAVIOR].as_str().unwrap().contains("60"));
        assert!(a[HPA_CONDITIONS]
            .as_str()
            .unwrap()
            .contains("SucceededRescale"));
        // And back: everything v2 had, the annotations gone.
        let back = to_storage(&v1, shown);
        assert_eq!(back["spec"], stored["spec"]);
        assert_eq!(back["status"]["conditions"], stored["status"]["conditions"]);
        assert_eq!(back["metadata"].get("annotations"), None);
        // kubectl autoscale's object.
        let posted = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 2, "maxReplicas": 10, "targetCPUUtilizationPercentage": 70}});
        let v2 = to_storage(&v1, posted);
        assert_eq!(v2["apiVersion"], "autoscaling/v2");
        assert_eq!(
            v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            70
        );
    }

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
