//! A DaemonSet's status numbers, as upstream's `updateDaemonSetStatus` counts them: over the
//! nodes that should run the pod (`desiredNumberScheduled`), those that have one
//! (`currentNumberScheduled`), whose oldest pod is ready (`numberReady`), available for
//! `minReadySeconds` (`numberAvailable`) or of the update revision
//! (`updatedNumberScheduled`); pods on nodes that should not run one are
//! `numberMisscheduled`.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;

use super::placement::{daemon_pod_spec, node_fit, pods_by_node};

/// The label naming the revision a daemon pod was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// The revision hash a pod carries.
pub fn pod_hash(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get(REVISION_LABEL)
        .map(String::as_str)
}

/// The time since which a pod has been Ready (`Some(None)`: ready, time unknown).
fn ready_since(pod: &Pod) -> Option<Option<Timestamp>> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| c.last_transition_time.as_ref().map(|t| t.0))
}

/// Whether a pod's Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    ready_since(pod).is_some()
}

/// Whether a pod is available at `now` (ready for `min_ready` seconds, upstream's
/// `IsPodAvailable`); when it is ready but not yet available, how long until it is.
pub fn availability(pod: &Pod, min_ready: i64, now: Timestamp) -> (bool, Option<Duration>) {
    match ready_since(pod) {
        None => (false, None),
        Some(_) if min_ready <= 0 => (true, None),
        Some(None) => (false, None),
        Some(Some(since)) => {
            let elapsed = now.as_second() - since.as_second();
            if elapsed >= min_ready {
                (true, None)
            } else {
                (
                    false,
                    Some(Duration::from_secs((min_ready - elapsed) as u64)),
                )
            }
        }
    }
}

/// The DaemonSet's `minReadySeconds`.
pub fn min_ready(ds: &DaemonSet) -> i64 {
    i64::from(
        ds.spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .unwrap_or(0)
            .max(0),
    )
}

/// The status `nodes` and the DaemonSet's `pods` imply, with `hash` the update revision's
/// hash; and when a ready pod becomes available, how long until then.
pub fn compute(
    ds: &DaemonSet,
    nodes: &[&Node],
    pods: &[&Pod],
    hash: &str,
    now: Timestamp,
) -> (DaemonSetStatus, Option<Duration>) {
    let spec = daemon_pod_spec(ds);
    // Terminal pods on their way out are nothing to count (upstream leaves them out too).
    let live: Vec<&Pod> = pods
        .iter()
        .copied()
        .filter(|p| {
            !(p.metadata.deletion_timestamp.is_some()
                && matches!(super::placement::phase(p), Some("Failed" | "Succeeded")))
        })
        .collect();
    let by_node = pods_by_node(&live);
    let min_ready = min_ready(ds);
    let (mut desired, mut current, mut mis, mut ready, mut available, mut updated) =
        (0, 0, 0, 0, 0, 0);
    let mut requeue: Option<Duration> = None;
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let fit = node_fit(&spec, node);
        let first = by_node.get(name).and_then(|p| p.first());
        if fit.should_run {
            desired += 1;
            if let Some(pod) = first {
                current += 1;
                if is_ready(pod) {
                    ready += 1;
                    match availability(pod, min_ready, now) {
                        (true, _) => available += 1,
                        (false, Some(left)) => {
                            requeue = Some(requeue.map_or(left, |r| r.min(left)));
                        }
                        (false, None) => {}
                    }
                }
                if pod_hash(pod) == Some(hash) {
                    updated += 1;
                }
            }
        } else if first.is_some() {
            mis += 1;
        }
    }
    let status = DaemonSetStatus {
        current_number_scheduled: current,
        number_misscheduled: mis,
        desired_number_scheduled: desired,
        number_ready: ready,
        observed_generation: ds.metadata.generation,
        updated_number_scheduled: Some(updated),
        number_available: Some(available),
        number_unavailable: Some(desired - available),
        collision_count: ds.status.as_ref().and_then(|s| s.collision_count),
        conditions: ds.status.as_ref().and_then(|s| s.conditions.clone()),
    };
    (status, requeue)
}

/// Whether two statuses say the same, reading an omitted count as zero.
pub fn same_status(a: &DaemonSetStatus, b: &DaemonSetStatus) -> bool {
    let n = |v: Option<i32>| v.unwrap_or(0);
    a.current_number_scheduled == b.current_number_scheduled
        && a.number_misscheduled == b.number_misscheduled
        && a.desired_number_scheduled == b.desired_number_scheduled
        && a.number_ready == b.number_ready
        && a.observed_generation == b.observed_generation
        && n(a.updated_number_scheduled) == n(b.updated_number_scheduled)
        && n(a.number_available) == n(b.number_available)
        && n(a.number_unavailable) == n(b.number_unavailable)
        && n(a.collision_count) == n(b.collision_count)
        && a.conditions.clone().unwrap_or_default() == b.conditions.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::{json, Value};

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn node(name: &str, labels: Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn pod(name: &str, node: &str, hash: &str, ready_at: Option<i64>) -> Pod {
        let conditions = match ready_at {
            Some(t) => {
                json!([{"type": "Ready", "status": "True", "lastTransitionTime": Time(ts(t))}])
            }
            None => json!([{"type": "Ready", "status": "False"}]),
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default",
                         "labels": {REVISION_LABEL: hash},
                         "creationTimestamp": Time(ts(0))},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running", "conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn counts_as_upstream() {
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "default", "generation": 4},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "minReadySeconds": 10,
                "template": {"metadata": {"labels": {"app": "agent"}},
                             "spec": {"nodeSelector": {"run": "yes"},
                                      "containers": [{"name": "c", "image": "x"}]}},
            }
        }))
        .unwrap();
        let nodes = [
            node("a", json!({"run": "yes"})),
            node("b", json!({"run": "yes"})),
            node("c", json!({"run": "yes"})),
            node("d", json!({"run": "yes"})),
            node("e", json!({})),
        ];
        let pods = [
            pod("pa", "a", "new", Some(0)),
            pod("pb", "b", "old", Some(95)),
            pod("pc", "c", "new", None),
            pod("pe", "e", "new", Some(0)),
        ];
        let nodes: Vec<&Node> = nodes.iter().collect();
        let pods: Vec<&Pod> = pods.iter().collect();
        let (s, requeue) = compute(&ds, &nodes, &pods, "new", ts(100));
        assert_eq!(s.desired_number_scheduled, 4);
        assert_eq!(s.current_number_scheduled, 3);
        assert_eq!(s.number_misscheduled, 1);
        assert_eq!(s.number_ready, 2);
        assert_eq!(s.number_available, Some(1));
        assert_eq!(s.number_unavailable, Some(3));
        assert_eq!(s.updated_number_scheduled, Some(2));
        assert_eq!(s.observed_generation, Some(4));
        assert_eq!(requeue, Some(Duration::from_secs(5)));
    }
}
