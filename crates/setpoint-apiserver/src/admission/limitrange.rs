//! The `LimitRanger` admission step: a namespace's LimitRanges give containers that state no
//! resources their defaults (mutating), then bound what pods, their containers and
//! PersistentVolumeClaims may ask for (validating), with upstream's messages.
//!
//! As upstream, pods are checked only when created (their containers' resources cannot
//! change afterwards); claims on create. Everything here is pure: the caller supplies the
//! namespace's LimitRanges.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};
use setpoint_api::quantity::Quantity;
use setpoint_api::quota::{parse_list, text, ResourceList};

/// The annotation that records which defaults were applied to a pod.
pub const ANNOTATION: &str = "kubernetes.io/limit-ranger";

/// One `spec.limits` entry with the defaults upstream's API defaulting derives for a
/// `Container` entry: `default` from `max`, `defaultRequest` from `default`, then from
/// `min`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Item {
    /// `Container`, `Pod` or `PersistentVolumeClaim`.
    pub kind: String,
    /// `min`.
    pub min: ResourceList,
    /// `max`.
    pub max: ResourceList,
    /// `default` (limits).
    pub default: ResourceList,
    /// `defaultRequest`.
    pub default_request: ResourceList,
    /// `maxLimitRequestRatio`.
    pub ratio: ResourceList,
}

/// The entries of one LimitRange, defaulted as upstream stores them.
pub fn items(limit_range: &Value) -> Vec<Item> {
    limit_range
        .pointer("/spec/limits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|l| {
            let mut item = Item {
                kind: l.get("type").and_then(Value::as_str).unwrap_or("").into(),
                min: parse_list(l.get("min")),
                max: parse_list(l.get("max")),
                default: parse_list(l.get("default")),
                default_request: parse_list(l.get("defaultRequest")),
                ratio: parse_list(l.get("maxLimitRequestRatio")),
            };
            if item.kind == "Container" {
                for (k, q) in &item.max {
                    item.default.entry(k.clone()).or_insert(*q);
                }
                for (k, q) in item.default.clone().iter().chain(item.min.clone().iter()) {
                    item.default_request.entry(k.clone()).or_insert(*q);
                }
            }
            item
        })
        .collect()
}

fn containers_mut<'a>(
    pod: &'a mut Value,
    field: &str,
) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    pod.pointer_mut(&format!("/spec/{field}"))
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

/// Fills in one container's missing limits and requests; returns the annotation phrases
/// (`cpu, memory request for container web`).
fn default_container(
    c: &mut Map<String, Value>,
    limits: &ResourceList,
    requests: &ResourceList,
    what: &str,
) -> Vec<String> {
    let name = c
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let resources = c.entry("resources").or_insert_with(|| json!({}));
    if !resources.is_object() {
        *resources = json!({});
    }
    let mut out = Vec::new();
    let mut set = |field: &str, defaults: &ResourceList| -> Vec<String> {
        if defaults.is_empty() {
            return vec![];
        }
        let map = resources
            .as_object_mut()
            .expect("made an object above")
            .entry(field)
            .or_insert_with(|| json!({}));
        if !map.is_object() {
            *map = json!({});
        }
        let map = map.as_object_mut().expect("made an object above");
        let mut names = Vec::new();
        for (k, q) in defaults {
            if !map.contains_key(k) {
                map.insert(k.clone(), Value::String(text(q)));
                names.push(k.clone());
            }
        }
        names
    };
    // Upstream fills limits first, then requests, and reports requests first.
    let set_limits = set("limits", limits);
    let set_requests = set("requests", requests);
    if !set_requests.is_empty() {
        out.push(format!(
            "{} request for {what} {name}",
            set_requests.join(", ")
        ));
    }
    if !set_limits.is_empty() {
        out.push(format!("{} limit for {what} {name}", set_limits.join(", ")));
    }
    out
}

/// The mutating half: applies each LimitRange's `Container` defaults, in turn, to the
/// containers and init containers of a new pod that lack them, and records what it set in
/// the `kubernetes.io/limit-ranger` annotation.
pub fn default_pod(pod: &mut Value, ranges: &[Value]) {
    for range in ranges {
        let mut limits = ResourceList::new();
        let mut requests = ResourceList::new();
        for item in items(range).into_iter().filter(|i| i.kind == "Container") {
            limits.extend(item.default);
            requests.extend(item.default_request);
        }
        if limits.is_empty() && requests.is_empty() {
            continue;
        }
        let mut notes = Vec::new();
        for c in containers_mut(pod, "containers") {
            notes.extend(default_container(c, &limits, &requests, "container"));
        }
        for c in containers_mut(pod, "initContainers") {
            notes.extend(default_container(c, &limits, &requests, "init container"));
        }
        if !notes.is_empty() {
            let meta = setpoint_api::meta::metadata_mut(pod);
            let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
            if !annotations.is_object() {
                *annotations = json!({});
            }
            annotations
                .as_object_mut()
                .expect("made an object above")
                .insert(
                    ANNOTATION.into(),
                    Value::String(format!("LimitRanger plugin set: {}", notes.join("; "))),
                );
        }
    }
}

fn min_constraint(
    kind: &str,
    name: &str,
    enforced: &Quantity,
    requests: &ResourceList,
    limits: &ResourceList,
) -> Option<String> {
    let e = text(enforced);
    let Some(req) = requests.get(name) else {
        return Some(format!(
            "minimum {name} usage per {kind} is {e}.  No request is specified"
        ));
    };
    if req < enforced {
        return Some(format!(
            "minimum {name} usage per {kind} is {e}, but request is {}",
            text(req)
        ));
    }
    match limits.get(name) {
        Some(lim) if lim < enforced => Some(format!(
            "minimum {name} usage per {kind} is {e}, but limit is {}",
            text(lim)
        )),
        _ => None,
    }
}

fn max_constraint(
    kind: &str,
    name: &str,
    enforced: &Quantity,
    requests: &ResourceList,
    limits: &ResourceList,
) -> Option<String> {
    let e = text(enforced);
    let Some(lim) = limits.get(name) else {
        return Some(format!(
            "maximum {name} usage per {kind} is {e}.  No limit is specified"
        ));
    };
    if lim > enforced {
        return Some(format!(
            "maximum {name} usage per {kind} is {e}, but limit is {}",
            text(lim)
        ));
    }
    match requests.get(name) {
        Some(req) if req > enforced => Some(format!(
            "maximum {name} usage per {kind} is {e}, but request is {}",
            text(req)
        )),
        _ => None,
    }
}

fn max_request_constraint(
    kind: &str,
    name: &str,
    enforced: &Quantity,
    requests: &ResourceList,
) -> Option<String> {
    let e = text(enforced);
    match requests.get(name) {
        None => Some(format!(
            "maximum {name} usage per {kind} is {e}.  No request is specified"
        )),
        Some(req) if req > enforced => Some(format!(
            "maximum {name} usage per {kind} is {e}, but request is {}",
            text(req)
        )),
        _ => None,
    }
}

fn ratio_constraint(
    kind: &str,
    name: &str,
    enforced: &Quantity,
    requests: &ResourceList,
    limits: &ResourceList,
) -> Option<String> {
    let e = text(enforced);
    let milli = |q: Option<&Quantity>| q.and_then(|q| q.milli_value()).unwrap_or(0);
    let (req, lim) = (milli(requests.get(name)), milli(limits.get(name)));
    if req == 0 {
        return Some(format!("{name} max limit to request ratio per {kind} is {e}, but no request is specified or request is 0"));
    }
    if lim == 0 {
        return Some(format!("{name} max limit to request ratio per {kind} is {e}, but no limit is specified or limit is 0"));
    }
    let observed = lim as f64 / req as f64;
    let allowed = enforced.milli_value().unwrap_or(i64::MAX) as f64;
    (observed * 1000.0 > allowed).then(|| {
        format!("{name} max limit to request ratio per {kind} is {e}, but provided ratio is {observed:.6}")
    })
}

/// Every min/max/ratio violation of one entry against one set of requests and limits.
fn check(item: &Item, requests: &ResourceList, limits: &ResourceList, errs: &mut Vec<String>) {
    let kind = item.kind.as_str();
    for (k, v) in &item.min {
        errs.extend(min_constraint(kind, k, v, requests, limits));
    }
    for (k, v) in &item.max {
        errs.extend(max_constraint(kind, k, v, requests, limits));
    }
    for (k, v) in &item.ratio {
        errs.extend(ratio_constraint(kind, k, v, requests, limits));
    }
}

/// Upstream's aggregate error text: one message as it is, several (without repeats) as
/// `[a, b]`.
fn aggregate(errs: Vec<String>) -> Option<String> {
    let mut seen = BTreeSet::new();
    let unique: Vec<String> = errs
        .into_iter()
        .filter(|e| seen.insert(e.clone()))
        .collect();
    match unique.len() {
        0 => None,
        1 => unique.into_iter().next(),
        _ => Some(format!("[{}]", unique.join(", "))),
    }
}

fn container_lists(c: &Value) -> (ResourceList, ResourceList) {
    (
        parse_list(c.pointer("/resources/requests")),
        parse_list(c.pointer("/resources/limits")),
    )
}

/// The validating half for one LimitRange: the text after `pods "x" is forbidden: ` when a
/// new pod (or claim, `plural` = `persistentvolumeclaims`) breaks it.
pub fn validate(plural: &str, obj: &Value, range: &Value) -> Option<String> {
    let mut errs = Vec::new();
    for item in items(range) {
        match (plural, item.kind.as_str()) {
            ("pods", "Container") => {
                for field in ["containers", "initContainers"] {
                    for c in obj
                        .pointer(&format!("/spec/{field}"))
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        let (requests, limits) = container_lists(c);
                        check(&item, &requests, &limits, &mut errs);
                    }
                }
            }
            ("pods", "Pod") => {
                let (requests, limits) = setpoint_api::quota::containers_requests_limits(obj);
                check(&item, &requests, &limits, &mut errs);
            }
            ("persistentvolumeclaims", "PersistentVolumeClaim") => {
                let requests = parse_list(obj.pointer("/spec/resources/requests"));
                for (k, v) in &item.min {
                    errs.extend(min_constraint(
                        "PersistentVolumeClaim",
                        k,
                        v,
                        &requests,
                        &BTreeMap::new(),
                    ));
                }
                for (k, v) in &item.max {
                    errs.extend(max_request_constraint(
                        "PersistentVolumeClaim",
                        k,
                        v,
                        &requests,
                    ));
                }
            }
            _ => {}
        }
    }
    aggregate(errs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(limits: Value) -> Value {
        json!({"metadata": {"name": "lr"}, "spec": {"limits": limits}})
    }

    #[test]
    fn defaults_fill_only_what_containers_leave_out() {
        let lr = range(json!([{"type": "Container",
            "default": {"cpu": "500m", "memory": "256Mi"},
            "defaultRequest": {"cpu": "100m"}}]));
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "web"},
            {"name": "side", "resources": {"limits": {"memory": "1Gi"}}}
        ]}});
        default_pod(&mut pod, &[lr]);
        let c = &pod["spec"]["containers"];
        assert_eq!(
            c[0]["resources"],
            json!({"limits": {"cpu": "500m", "memory": "256Mi"},
                   "requests": {"cpu": "100m", "memory": "256Mi"}})
        );
        assert_eq!(c[1]["resources"]["limits"]["memory"], "1Gi");
        assert_eq!(c[1]["resources"]["limits"]["cpu"], "500m");
        assert_eq!(
            pod["metadata"]["annotations"][ANNOTATION],
            "LimitRanger plugin set: cpu, memory request for container web; cpu, memory limit for container web; cpu, memory request for container side; cpu limit for container side"
        );
    }

    #[test]
    fn container_defaults_derive_from_max_and_min() {
        let lr =
            range(json!([{"type": "Container", "max": {"cpu": "2"}, "min": {"memory": "1Mi"}}]));
        let item = &items(&lr)[0];
        assert_eq!(item.default["cpu"], Quantity::parse("2").unwrap());
        assert_eq!(item.default_request["cpu"], Quantity::parse("2").unwrap());
        assert_eq!(
            item.default_request["memory"],
            Quantity::parse("1Mi").unwrap()
        );
    }

    #[test]
    fn violations_use_upstreams_messages() {
        let lr = range(json!([{"type": "Container", "max": {"cpu": "2"}}]));
        let pod = json!({"spec": {"containers": [{"name": "c",
            "resources": {"limits": {"cpu": "3"}, "requests": {"cpu": "1"}}}]}});
        assert_eq!(
            validate("pods", &pod, &lr).as_deref(),
            Some("maximum cpu usage per Container is 2, but limit is 3")
        );
        let lr = range(json!([
            {"type": "Container", "min": {"memory": "64Mi"}, "maxLimitRequestRatio": {"cpu": "2"}},
            {"type": "Pod", "max": {"cpu": "1"}}
        ]));
        let pod = json!({"spec": {"containers": [{"name": "c",
            "resources": {"limits": {"cpu": "1500m"}, "requests": {"cpu": "500m", "memory": "32Mi"}}}]}});
        assert_eq!(
            validate("pods", &pod, &lr).as_deref(),
            Some("[minimum memory usage per Container is 64Mi, but request is 32Mi, cpu max limit to request ratio per Container is 2, but provided ratio is 3.000000, maximum cpu usage per Pod is 1, but limit is 1500m]")
        );
        let pod = json!({"spec": {"containers": [{"name": "c"}]}});
        let lr = range(json!([{"type": "Container", "min": {"cpu": "100m"}}]));
        assert_eq!(
            validate("pods", &pod, &lr).as_deref(),
            Some("minimum cpu usage per Container is 100m.  No request is specified")
        );
    }

    #[test]
    fn claims_are_bounded_by_their_request() {
        let lr = range(json!([{"type": "PersistentVolumeClaim",
            "min": {"storage": "1Gi"}, "max": {"storage": "10Gi"}}]));
        let pvc = |s: &str| json!({"spec": {"resources": {"requests": {"storage": s}}}});
        assert_eq!(validate("persistentvolumeclaims", &pvc("5Gi"), &lr), None);
        assert_eq!(
            validate("persistentvolumeclaims", &pvc("20Gi"), &lr).as_deref(),
            Some("maximum storage usage per PersistentVolumeClaim is 10Gi, but request is 20Gi")
        );
        assert_eq!(
            validate("persistentvolumeclaims", &pvc("500Mi"), &lr).as_deref(),
            Some("minimum storage usage per PersistentVolumeClaim is 1Gi, but request is 500Mi")
        );
    }
}
