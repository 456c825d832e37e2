//! ResourceQuota accounting: what an object costs a quota, whether a quota covers it, and
//! the check admission makes. One set of rules for the API server (which charges a create
//! to the quota before storing it) and the ResourceQuota controller (which recomputes
//! `status.used` from what exists), so the two never disagree about an object's cost.
//!
//! Kubernetes' rules, per kind:
//! - every object costs `count/<plural>` (core) or `count/<plural>.<group>` one;
//! - core kinds with a legacy count name (`services`, `configmaps`, `secrets`,
//!   `persistentvolumeclaims`, `replicationcontrollers`, `resourcequotas`) cost that one too;
//! - a pod that has not reached `Succeeded`/`Failed` (and is not past its deletion grace)
//!   costs `pods` one plus its compute resources: `requests.cpu`/`cpu`, `requests.memory`/
//!   `memory`, `limits.cpu`, `limits.memory` (and the same for `ephemeral-storage`), each the
//!   larger of the containers' sum and any one init container;
//! - a service costs `services.loadbalancers` (type `LoadBalancer`) and
//!   `services.nodeports` (its node ports);
//! - a PersistentVolumeClaim costs `requests.storage` (and the per-StorageClass names).
//!
//! Scopes (`Terminating`, `NotTerminating`, `BestEffort`, `NotBestEffort`, also as
//! `scopeSelector` expressions) select pods only: a scoped quota covers no other kind.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use crate::quantity::Quantity;

/// Resource name → amount, in name order (which is how upstream prints them).
pub type ResourceList = BTreeMap<String, Quantity>;

/// The core kinds whose objects are also counted under a legacy name.
const LEGACY_COUNTS: &[(&str, &str)] = &[
    ("pods", "pods"),
    ("services", "services"),
    ("configmaps", "configmaps"),
    ("secrets", "secrets"),
    ("persistentvolumeclaims", "persistentvolumeclaims"),
    ("replicationcontrollers", "replicationcontrollers"),
    ("resourcequotas", "resourcequotas"),
];

/// The pod compute resources a quota can limit (besides `pods` and `count/pods`).
const POD_COMPUTE: &[&str] = &[
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
];

/// The resources for which a quota makes every container state an explicit amount (a
/// backward-compatibility rule of upstream's pod evaluator).
const MUST_SPECIFY: &[&str] = &[
    "cpu",
    "memory",
    "requests.cpu",
    "requests.memory",
    "limits.cpu",
    "limits.memory",
];

/// The suffix of per-StorageClass PVC quota names (`<class>.storageclass.storage.k8s.io/…`).
const STORAGE_CLASS_SUFFIX: &str = ".storageclass.storage.k8s.io/";

/// The quota scopes this implementation knows.
pub const SCOPES: &[&str] = &[
    "Terminating",
    "NotTerminating",
    "BestEffort",
    "NotBestEffort",
];

/// One unit.
fn one() -> Quantity {
    Quantity::parse("1").expect("1 parses")
}

/// Zero.
pub fn zero() -> Quantity {
    Quantity::parse("0").expect("0 parses")
}

/// The object-count name of a resource: `count/pods`, `count/deployments.apps`.
pub fn count_name(group: &str, plural: &str) -> String {
    if group.is_empty() {
        format!("count/{plural}")
    } else {
        format!("count/{plural}.{group}")
    }
}

/// The resource (group, plural) a `count/…` name counts.
pub fn counted_resource(name: &str) -> Option<(String, String)> {
    let rest = name.strip_prefix("count/")?;
    Some(match rest.split_once('.') {
        Some((plural, group)) => (group.to_string(), plural.to_string()),
        None => (String::new(), rest.to_string()),
    })
}

/// Parses a JSON map of quantities (`spec.hard`, `status.used`); entries that do not parse
/// (validation refuses them) are left out.
pub fn parse_list(v: Option<&Value>) -> ResourceList {
    v.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), Quantity::parse(v.as_str()?).ok()?)))
        .collect()
}

/// A quantity as upstream serialises it.
pub fn text(q: &Quantity) -> String {
    q.canonical().unwrap_or_else(|| "0".to_string())
}

/// A resource list as a JSON map of canonical quantities.
pub fn to_json(list: &ResourceList) -> Value {
    Value::Object(
        list.iter()
            .map(|(k, q)| (k.clone(), Value::String(text(q))))
            .collect::<Map<String, Value>>(),
    )
}

/// `a=1,b=2`, in name order: how upstream's quota messages print a resource list.
pub fn pretty(list: &ResourceList) -> String {
    list.iter()
        .map(|(k, q)| format!("{k}={}", text(q)))
        .collect::<Vec<_>>()
        .join(",")
}

fn add_to(list: &mut ResourceList, name: &str, q: Quantity) {
    let sum = match list.get(name) {
        Some(cur) => (*cur + q).unwrap_or(*cur),
        None => q,
    };
    list.insert(name.to_string(), sum);
}

/// `a + b`, resource by resource.
pub fn add(a: &ResourceList, b: &ResourceList) -> ResourceList {
    let mut out = a.clone();
    for (k, q) in b {
        add_to(&mut out, k, *q);
    }
    out
}

/// Whether the quota name `name` is one that objects of (group, plural) are charged under.
pub fn covers(group: &str, plural: &str, name: &str) -> bool {
    if name == count_name(group, plural) {
        return true;
    }
    if group.is_empty()
        && LEGACY_COUNTS
            .iter()
            .any(|(p, n)| *p == plural && *n == name)
    {
        return true;
    }
    match (group, plural) {
        ("", "pods") => POD_COMPUTE.contains(&name) || name.starts_with("requests.hugepages-"),
        ("", "services") => name == "services.loadbalancers" || name == "services.nodeports",
        ("", "persistentvolumeclaims") => {
            name == "requests.storage"
                || name
                    .split_once(STORAGE_CLASS_SUFFIX)
                    .is_some_and(|(_, r)| r == "requests.storage" || r == "persistentvolumeclaims")
        }
        _ => false,
    }
}

/// A container's `resources.requests` and `resources.limits`; a request left out is its
/// limit, as API defaulting makes it.
fn container_resources(c: &Value) -> (ResourceList, ResourceList) {
    let limits = parse_list(c.pointer("/resources/limits"));
    let mut requests = parse_list(c.pointer("/resources/requests"));
    for (k, q) in &limits {
        requests.entry(k.clone()).or_insert(*q);
    }
    (requests, limits)
}

fn containers<'a>(pod: &'a Value, field: &str) -> impl Iterator<Item = &'a Value> {
    pod.pointer(&format!("/spec/{field}"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// A pod's effective requests and limits: [`containers_requests_limits`] plus the pod's
/// `overhead` (for the resources the containers ask for), as quota charges them.
pub fn pod_requests_limits(pod: &Value) -> (ResourceList, ResourceList) {
    let (mut requests, mut limits) = containers_requests_limits(pod);
    let overhead = parse_list(pod.pointer("/spec/overhead"));
    for (k, q) in &overhead {
        if requests.contains_key(k) {
            add_to(&mut requests, k, *q);
        }
        if limits.contains_key(k) {
            add_to(&mut limits, k, *q);
        }
    }
    (requests, limits)
}

/// What a pod's containers ask for together: their sum, raised to any one init container's
/// amount where that is larger (init containers run one at a time, before the others).
pub fn containers_requests_limits(pod: &Value) -> (ResourceList, ResourceList) {
    let mut requests = ResourceList::new();
    let mut limits = ResourceList::new();
    for c in containers(pod, "containers") {
        let (r, l) = container_resources(c);
        requests = add(&requests, &r);
        limits = add(&limits, &l);
    }
    for c in containers(pod, "initContainers") {
        let (r, l) = container_resources(c);
        for (total, each) in [(&mut requests, r), (&mut limits, l)] {
            for (k, q) in each {
                if total.get(&k).is_none_or(|t| *t < q) {
                    total.insert(k, q);
                }
            }
        }
    }
    (requests, limits)
}

/// The compute usage of a set of requests and limits, under every quota name that tracks it.
fn compute_usage(requests: &ResourceList, limits: &ResourceList) -> ResourceList {
    let mut out = ResourceList::new();
    for r in ["cpu", "memory", "ephemeral-storage"] {
        if let Some(q) = requests.get(r) {
            out.insert(r.to_string(), *q);
            out.insert(format!("requests.{r}"), *q);
        }
        if let Some(q) = limits.get(r) {
            out.insert(format!("limits.{r}"), *q);
        }
    }
    for (k, q) in requests {
        if k.starts_with("hugepages-") {
            out.insert(format!("requests.{k}"), *q);
        }
    }
    out
}

/// Whether a pod still counts against `pods` and compute quotas: not terminal, and not stuck
/// past the end of its deletion grace period (a lost node must not hold quota forever).
pub fn pod_counts(pod: &Value, now: DateTime<Utc>) -> bool {
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return false;
    }
    let grace = pod
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64);
    if let (Some(ts), Some(grace)) = (crate::meta::deletion_timestamp(pod), grace) {
        if let Ok(at) = crate::time::parse_time(ts) {
            if now > at + chrono::Duration::seconds(grace) {
                return false;
            }
        }
    }
    true
}

/// What one object of (group, plural) costs, under every name that could track it.
pub fn usage(group: &str, plural: &str, obj: &Value, now: DateTime<Utc>) -> ResourceList {
    let mut out = ResourceList::new();
    out.insert(count_name(group, plural), one());
    if !group.is_empty() {
        return out;
    }
    match plural {
        "pods" => {
            if pod_counts(obj, now) {
                out.insert("pods".into(), one());
                let (requests, limits) = pod_requests_limits(obj);
                out.extend(compute_usage(&requests, &limits));
            }
        }
        "services" => {
            out.insert("services".into(), one());
            out.extend(service_usage(obj));
        }
        "persistentvolumeclaims" => {
            out.insert("persistentvolumeclaims".into(), one());
            let storage = obj
                .pointer("/spec/resources/requests/storage")
                .and_then(Value::as_str)
                .and_then(|s| Quantity::parse(s).ok());
            if let Some(q) = storage {
                out.insert("requests.storage".into(), q);
            }
            let class = obj
                .pointer("/spec/storageClassName")
                .and_then(Value::as_str)
                .filter(|c| !c.is_empty());
            if let Some(class) = class {
                out.insert(
                    format!("{class}{STORAGE_CLASS_SUFFIX}persistentvolumeclaims"),
                    one(),
                );
                if let Some(q) = storage {
                    out.insert(format!("{class}{STORAGE_CLASS_SUFFIX}requests.storage"), q);
                }
            }
        }
        other => {
            if let Some((_, name)) = LEGACY_COUNTS.iter().find(|(p, _)| *p == other) {
                out.insert(name.to_string(), one());
            }
        }
    }
    out
}

/// A service's load balancers and node ports: a `NodePort` service takes a node port per
/// port; a `LoadBalancer` one a load balancer and, unless it turns node port allocation off
/// (then only the ports that name one), a node port per port.
fn service_usage(svc: &Value) -> ResourceList {
    let mut out = ResourceList::new();
    let ports: Vec<&Value> = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .collect();
    let count = |n: usize| Quantity::parse(&n.to_string()).unwrap_or_else(|_| zero());
    match svc.pointer("/spec/type").and_then(Value::as_str) {
        Some("NodePort") => {
            out.insert("services.nodeports".into(), count(ports.len()));
        }
        Some("LoadBalancer") => {
            let allocate = svc
                .pointer("/spec/allocateLoadBalancerNodePorts")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            let node_ports = if allocate {
                ports.len()
            } else {
                ports
                    .iter()
                    .filter(|p| p.get("nodePort").and_then(Value::as_i64).unwrap_or(0) != 0)
                    .count()
            };
            out.insert("services.nodeports".into(), count(node_ports));
            out.insert("services.loadbalancers".into(), one());
        }
        _ => {}
    }
    out
}

/// One scope a quota selects by: `(scopeName, operator, values)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopeSelector {
    /// `Terminating`, `NotTerminating`, `BestEffort`, `NotBestEffort`, …
    pub scope: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist` (`spec.scopes` entries are `Exists`).
    pub operator: String,
    /// The values of `In`/`NotIn`.
    pub values: Vec<String>,
}

/// A quota's scopes: `spec.scopes` and `spec.scopeSelector.matchExpressions` together.
pub fn scopes(quota: &Value) -> Vec<ScopeSelector> {
    let mut out: Vec<ScopeSelector> = quota
        .pointer("/spec/scopes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|s| ScopeSelector {
            scope: s.to_string(),
            operator: "Exists".into(),
            values: vec![],
        })
        .collect();
    for e in quota
        .pointer("/spec/scopeSelector/matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        out.push(ScopeSelector {
            scope: s("scopeName"),
            operator: s("operator"),
            values: e
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(String::from))
                .collect(),
        });
    }
    out
}

/// Whether a pod falls in a scope. Only the scopes in [`SCOPES`] select; others (e.g.
/// `PriorityClass`) select nothing here.
pub fn pod_in_scope(selector: &ScopeSelector, pod: &Value) -> bool {
    let terminating = pod
        .pointer("/spec/activeDeadlineSeconds")
        .and_then(Value::as_i64)
        .is_some_and(|s| s >= 0);
    let best_effort = crate::qos::of_pod(pod) == "BestEffort";
    let matched = match selector.scope.as_str() {
        "Terminating" => terminating,
        "NotTerminating" => !terminating,
        "BestEffort" => best_effort,
        "NotBestEffort" => !best_effort,
        _ => return false,
    };
    match selector.operator.as_str() {
        "Exists" => matched,
        "DoesNotExist" => !matched,
        // These scopes have no values: `In`/`NotIn` are refused by validation upstream.
        _ => false,
    }
}

/// Whether a quota whose enforced limits are `hard` covers an object of (group, plural):
/// it tracks a resource the object is charged under and the object is in every scope.
pub fn quota_matches(
    quota: &Value,
    hard: &ResourceList,
    group: &str,
    plural: &str,
    obj: &Value,
) -> bool {
    if !hard.keys().any(|k| covers(group, plural, k)) {
        return false;
    }
    let is_pod = group.is_empty() && plural == "pods";
    scopes(quota).iter().all(|s| is_pod && pod_in_scope(s, obj))
}

/// Upstream's backward-compatibility rule: when a quota limits CPU or memory, every
/// container (init containers too) must state that amount. The error is upstream's
/// `must specify limits.cpu for: a,b; requests.memory for: c`.
pub fn pod_constraints(required: &[&str], pod: &Value) -> Result<(), String> {
    let required: BTreeSet<&str> = required
        .iter()
        .copied()
        .filter(|r| MUST_SPECIFY.contains(r))
        .collect();
    if required.is_empty() {
        return Ok(());
    }
    let mut missing: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for c in containers(pod, "containers").chain(containers(pod, "initContainers")) {
        let requests = parse_list(c.pointer("/resources/requests"));
        let limits = parse_list(c.pointer("/resources/limits"));
        let have = compute_usage(&requests, &limits);
        for r in &required {
            if !have.contains_key(*r) {
                let name = c.get("name").and_then(Value::as_str).unwrap_or("");
                missing.entry(r).or_default().insert(name.to_string());
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let parts: Vec<String> = missing
        .iter()
        .map(|(r, names)| {
            format!(
                "{r} for: {}",
                names.iter().cloned().collect::<Vec<_>>().join(",")
            )
        })
        .collect();
    Err(format!("must specify {}", parts.join("; ")))
}

/// Why a create was refused by a quota (the text after `<resource> "<name>" is forbidden: `).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The controller has not yet computed usage for every limited resource.
    #[error("status unknown for quota: {quota}, resources: {resources}")]
    StatusUnknown {
        /// The quota's name.
        quota: String,
        /// The limited resources the object is charged under, comma-separated.
        resources: String,
    },
    /// The object does not state what the quota requires it to.
    #[error("failed quota: {quota}: {message}")]
    Constraints {
        /// The quota's name.
        quota: String,
        /// Upstream's `must specify …`.
        message: String,
    },
    /// The object would take usage above `hard`.
    #[error("exceeded quota: {quota}, requested: {requested}, used: {used}, limited: {limited}")]
    Exceeded {
        /// The quota's name.
        quota: String,
        /// The object's cost, for the exceeded resources.
        requested: String,
        /// Usage before it, for those resources.
        used: String,
        /// The limits, for those resources.
        limited: String,
    },
}

/// The admission decision for one quota that covers an object: the quota's new
/// `status.used` when the object's `delta` fits within `status.hard`, else why not.
/// `restricted` is the quota's limited resources that objects of this kind are charged
/// under ([`covers`]).
pub fn charge(
    quota_name: &str,
    restricted: &[&str],
    hard: &ResourceList,
    used: &ResourceList,
    delta: &ResourceList,
) -> Result<ResourceList, Refusal> {
    if restricted.iter().any(|k| !used.contains_key(*k)) {
        return Err(Refusal::StatusUnknown {
            quota: quota_name.to_string(),
            resources: restricted.join(","),
        });
    }
    let requested: ResourceList = delta
        .iter()
        .filter(|(k, _)| hard.contains_key(*k))
        .map(|(k, q)| (k.clone(), *q))
        .collect();
    let new_used = add(used, &requested);
    let exceeded: Vec<&String> = requested
        .keys()
        .filter(|k| new_used[*k] > hard[*k])
        .collect();
    if !exceeded.is_empty() {
        let mask = |l: &ResourceList| -> ResourceList {
            l.iter()
                .filter(|(k, _)| exceeded.contains(k))
                .map(|(k, q)| (k.clone(), *q))
                .collect()
        };
        return Err(Refusal::Exceeded {
            quota: quota_name.to_string(),
            requested: pretty(&mask(&requested)),
            used: pretty(&mask(used)),
            limited: pretty(&mask(hard)),
        });
    }
    Ok(new_used)
}

/// The resource (group, plural) whose objects a quota name is computed from, or `None` for
/// a name this implementation does not know how to count.
pub fn source_of(name: &str) -> Option<(String, String)> {
    if let Some(r) = counted_resource(name) {
        return Some(r);
    }
    for (plural, legacy) in LEGACY_COUNTS {
        if name == *legacy {
            return Some((String::new(), plural.to_string()));
        }
    }
    if covers("", "pods", name) {
        return Some((String::new(), "pods".into()));
    }
    if covers("", "services", name) {
        return Some((String::new(), "services".into()));
    }
    if covers("", "persistentvolumeclaims", name) {
        return Some((String::new(), "persistentvolumeclaims".into()));
    }
    None
}

/// What the ResourceQuota controller writes as `status.used`: for every resource in `hard`,
/// the summed cost of the `objects` (each with its group and plural) the quota covers; zero
/// where none do. Names it cannot count are left out (upstream reports none for them either).
pub fn compute_used<'a>(
    quota: &Value,
    hard: &ResourceList,
    objects: impl IntoIterator<Item = (&'a str, &'a str, &'a Value)>,
    now: DateTime<Utc>,
) -> ResourceList {
    let mut used: ResourceList = hard
        .keys()
        .filter(|k| source_of(k).is_some())
        .map(|k| (k.clone(), zero()))
        .collect();
    for (group, plural, obj) in objects {
        if !quota_matches(quota, hard, group, plural, obj) {
            continue;
        }
        for (k, q) in usage(group, plural, obj, now) {
            if used.contains_key(&k)
                && source_of(&k).is_some_and(|(g, p)| g == group && p == plural)
            {
                add_to(&mut used, &k, q);
            }
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list(pairs: &[(&str, &str)]) -> ResourceList {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity::parse(v).unwrap()))
            .collect()
    }

    fn pod(requests: Value, limits: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "resources": {"requests": requests, "limits": limits}}
        ]}})
    }

    #[test]
    fn a_pod_costs_its_count_and_compute() {
        let now = Utc::now();
        let p = pod(json!({"cpu": "250m"}), json!({"cpu": "1", "memory": "1Gi"}));
        let u = usage("", "pods", &p, now);
        assert_eq!(
            u,
            list(&[
                ("count/pods", "1"),
                ("pods", "1"),
                ("cpu", "250m"),
                ("requests.cpu", "250m"),
                ("limits.cpu", "1"),
                ("memory", "1Gi"),
                ("requests.memory", "1Gi"),
                ("limits.memory", "1Gi"),
            ])
        );
        // A finished pod keeps only its object count.
        let mut done = p.clone();
        done["status"] = json!({"phase": "Succeeded"});
        assert_eq!(usage("", "pods", &done, now), list(&[("count/pods", "1")]));
    }

    #[test]
    fn init_containers_raise_the_total_only_where_larger() {
        let p = json!({"spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "b", "resources": {"requests": {"cpu": "200m"}}}
            ],
            "initContainers": [
                {"name": "i", "resources": {"requests": {"cpu": "500m", "memory": "1Mi"}}}
            ]
        }});
        let (r, _) = pod_requests_limits(&p);
        assert_eq!(r, list(&[("cpu", "500m"), ("memory", "1Mi")]));
    }

    #[test]
    fn other_kinds_cost_their_counts() {
        let now = Utc::now();
        assert_eq!(
            usage("", "services", &json!({}), now),
            list(&[("count/services", "1"), ("services", "1")])
        );
        assert_eq!(
            usage("apps", "deployments", &json!({}), now),
            list(&[("count/deployments.apps", "1")])
        );
        let pvc = json!({"spec": {"storageClassName": "fast",
            "resources": {"requests": {"storage": "5Gi"}}}});
        let u = usage("", "persistentvolumeclaims", &pvc, now);
        assert_eq!(u["requests.storage"], Quantity::parse("5Gi").unwrap());
        assert!(u.contains_key("fast.storageclass.storage.k8s.io/requests.storage"));
        let lb = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}, {"port": 443}]}});
        let u = usage("", "services", &lb, now);
        assert_eq!(u["services.loadbalancers"], Quantity::parse("1").unwrap());
        assert_eq!(u["services.nodeports"], Quantity::parse("2").unwrap());
        let np = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        assert_eq!(
            usage("", "services", &np, now)["services.nodeports"],
            Quantity::parse("1").unwrap()
        );
        assert_eq!(
            source_of("services.nodeports"),
            Some(("".into(), "services".into()))
        );
        assert_eq!(
            counted_resource("count/deployments.apps"),
            Some(("apps".into(), "deployments".into()))
        );
        assert_eq!(source_of("limits.cpu"), Some(("".into(), "pods".into())));
        assert_eq!(source_of("bogus"), None);
    }

    #[test]
    fn exceeding_is_refused_with_upstreams_message() {
        let hard = list(&[("pods", "2"), ("services", "5")]);
        let used = list(&[("pods", "2"), ("services", "0")]);
        let delta = list(&[("pods", "1"), ("count/pods", "1")]);
        let e = charge("q", &["pods"], &hard, &used, &delta).unwrap_err();
        assert_eq!(
            e.to_string(),
            "exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2"
        );
        let used = list(&[("pods", "1"), ("services", "0")]);
        let new = charge("q", &["pods"], &hard, &used, &delta).unwrap();
        assert_eq!(new, list(&[("pods", "2"), ("services", "0")]));
        // Usage not yet computed.
        let e = charge("q", &["pods"], &hard, &ResourceList::new(), &delta).unwrap_err();
        assert_eq!(
            e.to_string(),
            "status unknown for quota: q, resources: pods"
        );
        // Only exceeded resources are named, with canonical quantities.
        let hard = list(&[("pods", "10"), ("requests.cpu", "1")]);
        let used = list(&[("pods", "1"), ("requests.cpu", "800m")]);
        let delta = list(&[("pods", "1"), ("requests.cpu", "500m")]);
        assert_eq!(
            charge("compute", &["pods", "requests.cpu"], &hard, &used, &delta)
                .unwrap_err()
                .to_string(),
            "exceeded quota: compute, requested: requests.cpu=500m, used: requests.cpu=800m, limited: requests.cpu=1"
        );
    }

    #[test]
    fn scopes_select_pods_only() {
        let best_effort = pod(json!({}), json!({}));
        let burstable = pod(json!({"cpu": "1"}), json!({}));
        let mut terminating = best_effort.clone();
        terminating["spec"]["activeDeadlineSeconds"] = json!(30);
        let hard = list(&[("pods", "5")]);
        let q = json!({"spec": {"scopes": ["BestEffort"]}});
        assert!(quota_matches(&q, &hard, "", "pods", &best_effort));
        assert!(!quota_matches(&q, &hard, "", "pods", &burstable));
        let q = json!({"spec": {"scopeSelector": {"matchExpressions": [
            {"scopeName": "Terminating", "operator": "Exists"}]}}});
        assert!(quota_matches(&q, &hard, "", "pods", &terminating));
        assert!(!quota_matches(&q, &hard, "", "pods", &best_effort));
        let q = json!({"spec": {"scopes": ["NotTerminating", "NotBestEffort"]}});
        assert!(quota_matches(&q, &hard, "", "pods", &burstable));
        // A scoped quota covers no other kind; an unscoped one covers what it tracks.
        let hard = list(&[("services", "1"), ("pods", "1")]);
        assert!(!quota_matches(&q, &hard, "", "services", &json!({})));
        assert!(quota_matches(&json!({}), &hard, "", "services", &json!({})));
        assert!(!quota_matches(&json!({}), &hard, "", "secrets", &json!({})));
    }

    #[test]
    fn constraints_name_the_containers_missing_amounts() {
        let p = json!({"spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1"}}},
            {"name": "b"}
        ]}});
        assert_eq!(
            pod_constraints(&["requests.cpu", "limits.memory", "pods"], &p),
            Err("must specify limits.memory for: a,b; requests.cpu for: b".into())
        );
        assert_eq!(pod_constraints(&["pods"], &p), Ok(()));
    }

    #[test]
    fn used_is_summed_over_covered_objects() {
        let now = Utc::now();
        let q = json!({"spec": {}});
        let hard = list(&[
            ("pods", "10"),
            ("requests.cpu", "4"),
            ("count/configmaps", "3"),
            ("weird", "1"),
        ]);
        let a = pod(json!({"cpu": "500m"}), json!({}));
        let b = pod(json!({"cpu": "1"}), json!({}));
        let mut done = b.clone();
        done["status"] = json!({"phase": "Failed"});
        let cm = json!({});
        let objs = vec![
            ("", "pods", &a),
            ("", "pods", &b),
            ("", "pods", &done),
            ("", "configmaps", &cm),
        ];
        let used = compute_used(&q, &hard, objs, now);
        assert_eq!(
            used,
            list(&[
                ("pods", "2"),
                ("requests.cpu", "1500m"),
                ("count/configmaps", "1")
            ])
        );
        assert_eq!(
            to_json(&used),
            json!({"pods": "2", "requests.cpu": "1500m", "count/configmaps": "1"})
        );
    }
}
