//! The `RollingUpdate` strategy (upstream's `rollingUpdate`): without surge, old pods are
//! deleted while at most `maxUnavailable` nodes lack an available daemon pod (the manage
//! step then creates the new one); with `maxSurge`, a new pod is created beside the old one
//! on at most `maxSurge` nodes at once, and the old one is deleted once the new one is
//! available. An old pod that is not available is replaced at once either way.
//! `OnDelete` does nothing here: pods change revision only when someone deletes them.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use setpoint_runtime::ObjectKey;

use super::placement::{daemon_pod_spec, node_fit, pods_by_node};
use super::status::{availability, min_ready, pod_hash};

/// The `OnDelete` strategy type.
pub const ON_DELETE: &str = "OnDelete";

/// Whether the DaemonSet rolls its pods (`RollingUpdate`, the default) rather than waiting
/// for them to be deleted (`OnDelete`).
pub fn is_rolling(ds: &DaemonSet) -> bool {
    ds.spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref())
        != Some(ON_DELETE)
}

/// `(maxSurge, maxUnavailable)` against `desired` nodes, percentages rounded up (as upstream's
/// `updatedDesiredNodeCounts`); defaults 0 and 1; both 0 (which could never progress) means 1
/// unavailable.
pub fn surge_and_unavailable(ds: &DaemonSet, desired: i32) -> (i32, i32) {
    let ru = ds
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref());
    let value = |v: Option<&IntOrString>, default: i32| match v {
        Some(v) => crate::deployment::rolling::resolve(Some(v), desired, true, "0"),
        None => default,
    };
    let surge = value(ru.and_then(|r| r.max_surge.as_ref()), 0);
    let unavailable = value(ru.and_then(|r| r.max_unavailable.as_ref()), 1);
    if desired > 0 && surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    }
}

/// What one rolling step does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    /// Old pods to delete.
    pub delete: Vec<ObjectKey>,
    /// Nodes to get a new pod beside their old one (surge).
    pub create: Vec<String>,
}

/// A node's live pods split into the one of the update revision and the old one; `None`
/// when there are two of either (the manage step cleans that node up first).
fn split<'a>(pods: &[&'a Pod], hash: &str) -> Option<(Option<&'a Pod>, Option<&'a Pod>)> {
    let (mut new, mut old) = (None, None);
    for p in pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let slot = if pod_hash(p) == Some(hash) {
            &mut new
        } else {
            &mut old
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(*p);
    }
    Some((new, old))
}

/// One rolling step over the nodes that should run the pod.
pub fn step(ds: &DaemonSet, nodes: &[&Node], pods: &[&Pod], hash: &str, now: Timestamp) -> Step {
    let spec = daemon_pod_spec(ds);
    let by_node = pods_by_node(pods);
    // The nodes that should run the pod, each with its pods (perhaps none).
    let mut wanted: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for node in nodes {
        if node_fit(&spec, node).should_run {
            let name = node.metadata.name.clone().unwrap_or_default();
            let here = by_node.get(&name).cloned().unwrap_or_default();
            wanted.insert(name, here);
        }
    }
    let (max_surge, max_unavailable) = surge_and_unavailable(ds, wanted.len() as i32);
    let min_ready = min_ready(ds);
    let available = |p: &Pod| availability(p, min_ready, now).0;
    let mut out = Step::default();
    if max_surge == 0 {
        let mut unavailable = 0;
        let (mut replace, mut candidates) = (Vec::new(), Vec::new());
        for here in wanted.values() {
            match split(here, hash) {
                // Two of a kind or nothing or both: the manage step acts; unavailable now.
                None | Some((None, None)) | Some((Some(_), Some(_))) => unavailable += 1,
                Some((Some(new), None)) => {
                    if !available(new) {
                        unavailable += 1;
                    }
                }
                Some((None, Some(old))) => {
                    if !available(old) {
                        replace.push(ObjectKey::of(old));
                    } else if unavailable < max_unavailable {
                        candidates.push(ObjectKey::of(old));
                    }
                }
            }
        }
        let room = (max_unavailable - unavailable).max(0) as usize;
        out.delete = replace;
        out.delete.extend(candidates.into_iter().take(room));
    } else {
        let mut surged = 0;
        let (mut replace, mut candidates) = (Vec::new(), Vec::new());
        for (node, here) in &wanted {
            match split(here, hash) {
                None => surged += 1,
                Some((_, None)) => {}
                Some((None, Some(old))) => {
                    if !available(old) {
                        replace.push(node.clone());
                    } else if surged < max_surge {
                        candidates.push(node.clone());
                    }
                }
                Some((Some(new), Some(old))) => {
                    if available(new) {
                        out.delete.push(ObjectKey::of(old));
                    } else {
                        surged += 1;
                    }
                }
            }
        }
        let room = (max_surge - surged).max(0) as usize;
        out.create = replace;
        out.create.extend(candidates.into_iter().take(room));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::{json, Value};

    fn ds(rolling: Value) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "default"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": rolling},
                "template": {"metadata": {"labels": {"app": "agent"}},
                             "spec": {"containers": [{"name": "c", "image": "x"}]}},
            }
        }))
        .unwrap()
    }

    fn node(name: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
    }

    fn pod(name: &str, node: &str, hash: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"controller-revision-hash": hash},
                         "creationTimestamp": Time(Timestamp::from_second(0).unwrap())},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .unwrap()
    }

    fn names(keys: &[ObjectKey]) -> Vec<&str> {
        keys.iter().map(|k| k.name.as_str()).collect()
    }

    #[test]
    fn defaults_and_percentages_round_up() {
        assert_eq!(surge_and_unavailable(&ds(json!(null)), 10), (0, 1));
        assert_eq!(
            surge_and_unavailable(&ds(json!({"maxUnavailable": "25%"})), 10),
            (0, 3)
        );
        assert_eq!(
            surge_and_unavailable(&ds(json!({"maxSurge": 1, "maxUnavailable": 0})), 10),
            (1, 0)
        );
        assert_eq!(
            surge_and_unavailable(&ds(json!({"maxSurge": 0, "maxUnavailable": 0})), 10),
            (0, 1)
        );
        let mut on_delete = ds(json!(null));
        on_delete
            .spec
            .as_mut()
            .unwrap()
            .update_strategy
            .as_mut()
            .unwrap()
            .type_ = Some(ON_DELETE.into());
        assert!(!is_rolling(&on_delete));
    }

    #[test]
    fn max_unavailable_bounds_the_old_pods_deleted() {
        let set = ds(json!({"maxUnavailable": 2}));
        let nodes = [node("a"), node("b"), node("c"), node("d")];
        let pods = [
            pod("a-old", "a", "old", true),
            pod("b-old", "b", "old", true),
            pod("c-old", "c", "old", false),
            pod("d-new", "d", "new", false),
        ];
        let nodes: Vec<&Node> = nodes.iter().collect();
        let pods: Vec<&Pod> = pods.iter().collect();
        let s = step(
            &set,
            &nodes,
            &pods,
            "new",
            Timestamp::from_second(10).unwrap(),
        );
        // c's old pod is unavailable: replaced regardless; d's new one is unavailable, so one
        // more may go.
        assert_eq!(names(&s.delete), vec!["c-old", "a-old"]);
        assert!(s.create.is_empty());
    }

    #[test]
    fn surge_creates_beside_and_deletes_after_the_new_pod_is_available() {
        let set = ds(json!({"maxSurge": 1, "maxUnavailable": 0}));
        let nodes = [node("a"), node("b"), node("c")];
        let nodes: Vec<&Node> = nodes.iter().collect();
        let now = Timestamp::from_second(10).unwrap();
        let first = [
            pod("a-old", "a", "old", true),
            pod("b-old", "b", "old", true),
            pod("c-old", "c", "old", true),
        ];
        let s = step(&set, &nodes, &first.iter().collect::<Vec<_>>(), "new", now);
        assert_eq!(s.create, vec!["a".to_string()]);
        assert!(s.delete.is_empty(), "no node loses its ready pod");
        let waiting = [
            pod("a-old", "a", "old", true),
            pod("a-new", "a", "new", false),
            pod("b-old", "b", "old", true),
        ];
        let s = step(
            &set,
            &nodes,
            &waiting.iter().collect::<Vec<_>>(),
            "new",
            now,
        );
        assert!(
            s.create.is_empty() && s.delete.is_empty(),
            "one surge at a time"
        );
        let ready = [
            pod("a-old", "a", "old", true),
            pod("a-new", "a", "new", true),
            pod("b-old", "b", "old", true),
        ];
        let s = step(&set, &nodes, &ready.iter().collect::<Vec<_>>(), "new", now);
        assert_eq!(names(&s.delete), vec!["a-old"]);
        assert_eq!(
            s.create,
            vec!["b".to_string()],
            "a's surge is done: the next node's starts"
        );
    }
}
