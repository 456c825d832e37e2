//! Which nodes should run a DaemonSet's pod, and what one pass does about the pods on each
//! node (upstream's `NodeShouldRunDaemonPod` and `podsShouldBeOnNode`).
//!
//! A node should run the pod when the pod's `nodeName` (if set), its `nodeSelector` and
//! required node affinity ([`setpoint_api::nodeselector`]) match it and no `NoSchedule` or
//! `NoExecute` taint goes untolerated ([`setpoint_api::taints`]), counting the tolerations the
//! controller adds to every daemon pod ([`daemon_tolerations`]). A pod already there keeps
//! running while only `NoSchedule` taints are untolerated.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSpec, Toleration,
};
use setpoint_api::nodeselector::node_selector_matches;
use setpoint_api::taints::{tolerated, NO_EXECUTE, NO_SCHEDULE};
use setpoint_runtime::ObjectKey;

use super::status::is_ready;

/// `node.kubernetes.io/not-ready`: the node's Ready condition is False.
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
/// `node.kubernetes.io/unreachable`: the node's Ready condition is Unknown.
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// `node.kubernetes.io/disk-pressure`.
pub const DISK_PRESSURE: &str = "node.kubernetes.io/disk-pressure";
/// `node.kubernetes.io/memory-pressure`.
pub const MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";
/// `node.kubernetes.io/pid-pressure`.
pub const PID_PRESSURE: &str = "node.kubernetes.io/pid-pressure";
/// `node.kubernetes.io/unschedulable`: the node is cordoned.
pub const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
/// `node.kubernetes.io/network-unavailable`: the node's network is not set up.
pub const NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";

/// The node field a daemon pod's node affinity names its node by.
pub const NODE_NAME_FIELD: &str = "metadata.name";

/// `spec`'s tolerations plus those upstream's DaemonSet controller adds to every daemon pod
/// (`AddOrUpdateDaemonPodTolerations`): `not-ready` and `unreachable` for `NoExecute` without
/// `tolerationSeconds` (a daemon pod is never evicted from an unhealthy node), the pressure
/// conditions and `unschedulable` for `NoSchedule`, and `network-unavailable` for
/// `NoSchedule` when the pod uses the host's network. A toleration of the same key and
/// effect the pod already has is replaced.
pub fn daemon_tolerations(spec: &PodSpec) -> Vec<Toleration> {
    let mut added = vec![
        (NOT_READY, NO_EXECUTE),
        (UNREACHABLE, NO_EXECUTE),
        (DISK_PRESSURE, NO_SCHEDULE),
        (MEMORY_PRESSURE, NO_SCHEDULE),
        (PID_PRESSURE, NO_SCHEDULE),
        (UNSCHEDULABLE, NO_SCHEDULE),
    ];
    if spec.host_network == Some(true) {
        added.push((NETWORK_UNAVAILABLE, NO_SCHEDULE));
    }
    let mut out: Vec<Toleration> = spec.tolerations.clone().unwrap_or_default();
    for (key, effect) in added {
        let t = Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(effect.into()),
            value: None,
            toleration_seconds: None,
        };
        // Upstream's AddOrUpdateTolerationInPodSpec: an equal one stays, one of the same
        // key, operator, value and effect is replaced, otherwise it is appended.
        match out.iter_mut().find(|o| {
            o.key == t.key
                && o.effect == t.effect
                && o.operator.as_deref().unwrap_or("Equal") == "Exists"
        }) {
            Some(o) => *o = t,
            None => out.push(t),
        }
    }
    out
}

/// Required node affinity naming exactly `node` (`matchFields metadata.name In [node]`),
/// replacing any required terms `affinity` had (upstream's
/// `ReplaceDaemonSetPodNodeNameNodeAffinity`: the controller already checked them against
/// the node, and the scheduler binds the pod there).
pub fn with_node_affinity(affinity: Option<Affinity>, node: &str) -> Affinity {
    let selector = NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![NodeSelectorRequirement {
                key: NODE_NAME_FIELD.into(),
                operator: "In".into(),
                values: Some(vec![node.into()]),
            }]),
        }],
    };
    let mut affinity = affinity.unwrap_or_default();
    let mut node_affinity: NodeAffinity = affinity.node_affinity.take().unwrap_or_default();
    node_affinity.required_during_scheduling_ignored_during_execution = Some(selector);
    affinity.node_affinity = Some(node_affinity);
    affinity
}

/// The node a daemon pod is for: its `spec.nodeName`, else the single node its required
/// affinity names by `metadata.name` (upstream's `GetTargetNodeName`).
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(n.into());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().find_map(|t| {
        t.match_fields.as_deref()?.iter().find_map(|r| {
            match (r.key.as_str(), r.operator.as_str(), r.values.as_deref()) {
                (NODE_NAME_FIELD, "In", Some([one])) => Some(one.clone()),
                _ => None,
            }
        })
    })
}

/// What a node means for a DaemonSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    /// A daemon pod should be created there if none is.
    pub should_run: bool,
    /// A daemon pod already there may stay.
    pub should_continue_running: bool,
}

/// Whether the pod `spec` (with the daemon tolerations already added) should run on `node`.
pub fn node_fit(spec: &PodSpec, node: &Node) -> Fit {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let none = Fit {
        should_run: false,
        should_continue_running: false,
    };
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != name)
    {
        return none;
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if let Some(sel) = &spec.node_selector {
        if !sel.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            return none;
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    if required.is_some_and(|r| !node_selector_matches(r, name, &labels)) {
        return none;
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let untolerated = |effect: &str| {
        taints
            .iter()
            .any(|t| t.effect == effect && !tolerated(t, tolerations))
    };
    let no_execute = untolerated(NO_EXECUTE);
    Fit {
        should_run: !no_execute && !untolerated(NO_SCHEDULE),
        should_continue_running: !no_execute,
    }
}

/// The DaemonSet's pod spec as its pods get it, before the node affinity: the template's
/// spec with the daemon tolerations.
pub fn daemon_pod_spec(ds: &DaemonSet) -> PodSpec {
    let mut spec = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .unwrap_or_default();
    spec.tolerations = Some(daemon_tolerations(&spec));
    spec
}

/// A DaemonSet's pods grouped by the node they are for, each group oldest first (then
/// Running before others), as upstream sorts them. Pods for no node are left out.
pub fn pods_by_node<'a>(pods: &[&'a Pod]) -> BTreeMap<String, Vec<&'a Pod>> {
    let mut out: BTreeMap<String, Vec<&'a Pod>> = BTreeMap::new();
    for p in pods {
        if let Some(n) = target_node(p) {
            out.entry(n).or_default().push(p);
        }
    }
    for group in out.values_mut() {
        group.sort_by(|a, b| {
            let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let running = |p: &Pod| phase(p) != Some("Running");
            created(a)
                .cmp(&created(b))
                .then_with(|| running(a).cmp(&running(b)))
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        });
    }
    out
}

/// A pod's phase.
pub fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// What the manage step of one pass does (upstream's `manage`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Manage {
    /// Nodes that should get a daemon pod.
    pub create: Vec<String>,
    /// Pods to delete: on nodes that should not run them (or no longer exist), and the
    /// surplus where a node has more than one.
    pub delete: Vec<ObjectKey>,
    /// Failed pods on nodes that should run the daemon (node, pod): deleted to be
    /// recreated, under a per-node backoff the caller keeps.
    pub failed: Vec<(String, ObjectKey)>,
}

/// The manage step: for every node, the daemon pods to create or delete there. `nodes` are
/// the cluster's nodes, `pods` the DaemonSet's own pods, `hash` its update revision's hash
/// (which of two surged pods is the new one), `surge` whether `maxSurge` is above zero.
pub fn manage(ds: &DaemonSet, nodes: &[&Node], pods: &[&Pod], hash: &str, surge: bool) -> Manage {
    let spec = daemon_pod_spec(ds);
    let by_node = pods_by_node(pods);
    let deleting = ds.metadata.deletion_timestamp.is_some();
    let mut out = Manage::default();
    let mut known = BTreeSet::new();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        known.insert(name.clone());
        let fit = node_fit(&spec, node);
        let here: &[&Pod] = by_node.get(&name).map(Vec::as_slice).unwrap_or_default();
        if fit.should_run && here.is_empty() {
            if !deleting {
                out.create.push(name);
            }
        } else if fit.should_continue_running {
            let mut running = Vec::new();
            for p in here {
                if p.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                match phase(p) {
                    // A failed pod is replaced: deleted now, recreated by a later pass.
                    Some("Failed") => out.failed.push((name.clone(), ObjectKey::of(*p))),
                    // A daemon pod that ran to completion is not what a DaemonSet is for.
                    Some("Succeeded") => out.delete.push(ObjectKey::of(*p)),
                    _ => running.push(*p),
                }
            }
            out.delete.extend(surplus(&running, hash, surge));
        } else {
            out.delete.extend(
                here.iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .map(|p| ObjectKey::of(*p)),
            );
        }
    }
    // Pods for nodes that no longer exist.
    for (node, here) in &by_node {
        if !known.contains(node) {
            out.delete.extend(
                here.iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .map(|p| ObjectKey::of(*p)),
            );
        }
    }
    out
}

/// The surplus among a node's live daemon pods (oldest first): without surge all but the
/// oldest; with surge, the oldest new-revision pod and the oldest old one may both stay only
/// while the new one is not ready and the old one is.
fn surplus(running: &[&Pod], hash: &str, surge: bool) -> Vec<ObjectKey> {
    if running.len() <= 1 {
        return Vec::new();
    }
    if !surge {
        return running[1..].iter().map(|p| ObjectKey::of(*p)).collect();
    }
    let mut out = Vec::new();
    let (mut new, mut old): (Option<&Pod>, Option<&Pod>) = (None, None);
    for p in running {
        let slot = if super::status::pod_hash(p) == Some(hash) {
            &mut new
        } else {
            &mut old
        };
        if slot.is_none() {
            *slot = Some(p);
        } else {
            out.push(ObjectKey::of(*p));
        }
    }
    if let (Some(n), Some(o)) = (new, old) {
        if !is_ready(o) || is_ready(n) {
            out.push(ObjectKey::of(o));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn node(name: &str, labels: Value, taints: Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints},
        }))
        .unwrap()
    }

    fn ds(template_spec: Value) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "default", "uid": "ds-uid"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}}, "spec": template_spec},
            }
        }))
        .unwrap()
    }

    fn pod(name: &str, node: &str, created: i64, phase: &str, hash: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "default", "uid": format!("uid-{name}"),
                "labels": {"app": "agent", "controller-revision-hash": hash},
                "creationTimestamp": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_second(created).unwrap()),
            },
            "spec": {"containers": [{"name": "c", "image": "x"}],
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                        {"nodeSelectorTerms": [{"matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn containers() -> Value {
        json!({"containers": [{"name": "c", "image": "x"}]})
    }

    #[test]
    fn adds_upstreams_tolerations_and_network_unavailable_only_for_host_network() {
        let spec: PodSpec = serde_json::from_value(containers()).unwrap();
        let t = daemon_tolerations(&spec);
        let keys: Vec<(&str, &str)> = t
            .iter()
            .map(|t| (t.key.as_deref().unwrap(), t.effect.as_deref().unwrap()))
            .collect();
        assert_eq!(
            keys,
            vec![
                (NOT_READY, NO_EXECUTE),
                (UNREACHABLE, NO_EXECUTE),
                (DISK_PRESSURE, NO_SCHEDULE),
                (MEMORY_PRESSURE, NO_SCHEDULE),
                (PID_PRESSURE, NO_SCHEDULE),
                (UNSCHEDULABLE, NO_SCHEDULE),
            ]
        );
        assert!(t
            .iter()
            .all(|t| t.toleration_seconds.is_none() && t.operator.as_deref() == Some("Exists")));
        let mut host = spec.clone();
        host.host_network = Some(true);
        // A user's not-ready toleration with a limit is replaced by the unlimited one.
        host.tolerations = Some(vec![Toleration {
            key: Some(NOT_READY.into()),
            operator: Some("Exists".into()),
            effect: Some(NO_EXECUTE.into()),
            toleration_seconds: Some(30),
            value: None,
        }]);
        let t = daemon_tolerations(&host);
        assert_eq!(t.len(), 7);
        assert!(t
            .iter()
            .any(|t| t.key.as_deref() == Some(NETWORK_UNAVAILABLE)));
        assert!(t.iter().all(|t| t.toleration_seconds.is_none()));
    }

    #[test]
    fn fit_follows_selector_affinity_and_taints() {
        let mut spec: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "c", "image": "x"}],
            "nodeSelector": {"role": "edge"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]}]}]}}},
        }))
        .unwrap();
        spec.tolerations = Some(daemon_tolerations(&spec));
        let yes = Fit {
            should_run: true,
            should_continue_running: true,
        };
        let no = Fit {
            should_run: false,
            should_continue_running: false,
        };
        let ok = node("n1", json!({"role": "edge", "zone": "a"}), json!(null));
        assert_eq!(node_fit(&spec, &ok), yes);
        assert_eq!(
            node_fit(
                &spec,
                &node("n2", json!({"role": "edge", "zone": "b"}), json!(null))
            ),
            no
        );
        assert_eq!(
            node_fit(&spec, &node("n3", json!({"zone": "a"}), json!(null))),
            no
        );
        let labels = json!({"role": "edge", "zone": "a"});
        let no_schedule = node(
            "n4",
            labels.clone(),
            json!([{"key": "gpu", "effect": "NoSchedule"}]),
        );
        assert_eq!(
            node_fit(&spec, &no_schedule),
            Fit {
                should_run: false,
                should_continue_running: true
            },
            "a NoSchedule taint keeps new pods off but lets one there stay"
        );
        let no_execute = node(
            "n5",
            labels.clone(),
            json!([{"key": "gpu", "effect": "NoExecute"}]),
        );
        assert_eq!(node_fit(&spec, &no_execute), no);
        let cordoned = node(
            "n6",
            labels,
            json!([
                {"key": UNSCHEDULABLE, "effect": "NoSchedule"},
                {"key": NOT_READY, "effect": "NoExecute"},
            ]),
        );
        assert_eq!(
            node_fit(&spec, &cordoned),
            yes,
            "the daemon tolerations apply"
        );
    }

    #[test]
    fn node_affinity_is_replaced_by_the_node_name() {
        let p = pod("a", "n1", 0, "Running", "h");
        assert_eq!(target_node(&p).as_deref(), Some("n1"));
        let before: Affinity = serde_json::from_value(json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [
                    {"key": "disk", "operator": "Exists"}]}}]}}))
        .unwrap();
        let after = serde_json::to_value(with_node_affinity(Some(before), "n7")).unwrap();
        assert_eq!(
            after["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
            json!({"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n7"]}]}]})
        );
        assert_eq!(
            after["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"],
            json!(1),
            "preferences are kept"
        );
    }

    #[test]
    fn manage_creates_deletes_and_replaces() {
        let set = ds(containers());
        let n1 = node("n1", json!({}), json!(null));
        let n2 = node("n2", json!({}), json!(null));
        let n3 = node("n3", json!({}), json!(null));
        let tainted = node(
            "n4",
            json!({}),
            json!([{"key": "x", "effect": "NoExecute"}]),
        );
        let pods = [
            pod("on-n1", "n1", 1, "Running", "h"),
            pod("extra-n1", "n1", 2, "Running", "h"),
            pod("failed-n2", "n2", 1, "Failed", "h"),
            pod("on-n4", "n4", 1, "Running", "h"),
            pod("gone", "n9", 1, "Running", "h"),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let m = manage(&set, &[&n1, &n2, &n3, &tainted], &refs, "h", false);
        assert_eq!(m.create, vec!["n3".to_string()]);
        let names: Vec<&str> = m.delete.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, vec!["extra-n1", "on-n4", "gone"]);
        assert_eq!(m.failed.len(), 1);
        assert_eq!(m.failed[0].0, "n2");
    }

    #[test]
    fn surge_keeps_a_ready_old_pod_until_the_new_one_is_ready() {
        let ready = |mut p: Pod| {
            p.status.as_mut().unwrap().conditions = Some(vec![serde_json::from_value(
                json!({"type": "Ready", "status": "True"}),
            )
            .unwrap()]);
            p
        };
        let old = ready(pod("old", "n1", 1, "Running", "old"));
        let new = pod("new", "n1", 2, "Running", "new");
        assert!(surplus(&[&old, &new], "new", true).is_empty());
        let new_ready = ready(new.clone());
        let out = surplus(&[&old, &new_ready], "new", true);
        assert_eq!(
            out.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
            vec!["old"]
        );
        let out = surplus(&[&old, &new], "new", false);
        assert_eq!(
            out.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
            vec!["new"]
        );
    }
}
