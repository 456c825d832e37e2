//! The pure decision of one pass over a StatefulSet (upstream's `updateStatefulSet`): which
//! ordinals to create, which pods to delete, which to relabel — given its member pods, its
//! current and update revisions, and the time.
//!
//! - Every ordinal in `[start, start + replicas)` gets a pod; a Failed or Succeeded one is
//!   deleted (and made again in a later pass). Under `OrderedReady` the pass stops at the
//!   first ordinal that is missing, terminating, or not Running and Ready (and available for
//!   `minReadySeconds`): one pod at a time, in order. Under `Parallel` nothing waits.
//! - Pods beyond the range are condemned, highest ordinal first: under `OrderedReady` one at a
//!   time, each only once every other pod is healthy (the first unhealthy pod excepted).
//! - `RollingUpdate`: pods at ordinals `>= partition` not at the update revision are deleted
//!   from the highest ordinal down, at most `maxUnavailable` (default 1) pods unavailable at
//!   once; they come back at the update revision. `OnDelete`: only pods someone else deletes
//!   come back at the update revision.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use setpoint_runtime::Object;

use super::identity::{identity_matches, ordinal_of, pod_revision, replicas, start_ordinal};
use super::status::{available_in, is_running_and_ready, is_terminating};

/// Which revision a pod is created at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// `status.currentRevision` (an ordinal below the partition).
    Current,
    /// `status.updateRevision`.
    Update,
}

/// Why a pod is deleted (for the log; events say the same for all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// It Failed or Succeeded: it is made again.
    Finished,
    /// Its ordinal is beyond `replicas` (a scale-down).
    Condemned,
    /// It is not at the update revision (a rolling update).
    Outdated,
}

/// A pod to delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delete {
    /// Its name.
    pub name: String,
    /// Its uid (the delete's precondition).
    pub uid: String,
    /// Why.
    pub why: Why,
}

/// What one pass should do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Ordinals to create (claims first, then the pod), and at which revision.
    pub create: Vec<(i32, At)>,
    /// Pods to delete, in order.
    pub delete: Vec<Delete>,
    /// Member pods missing their identity labels, with their ordinals.
    pub relabel: Vec<(String, i32)>,
    /// Pending pods whose claims must exist (one may have been deleted under them).
    pub ensure_claims: Vec<i32>,
    /// When a Ready pod becomes available, look again.
    pub requeue: Option<Duration>,
}

fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed" | "Succeeded")
    )
}

fn is_pending(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        None | Some("Pending")
    )
}

/// `spec.minReadySeconds`.
pub fn min_ready_seconds(set: &StatefulSet) -> i64 {
    set.spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0)
        .max(0) as i64
}

/// Whether pods are managed one at a time in order (`OrderedReady`, the default).
pub fn ordered(set: &StatefulSet) -> bool {
    set.spec
        .as_ref()
        .and_then(|s| s.pod_management_policy.as_deref())
        != Some("Parallel")
}

/// Whether pods are rolled to the update revision (`RollingUpdate`, the default) rather than
/// left for someone else to delete (`OnDelete`).
pub fn rolling(set: &StatefulSet) -> bool {
    let t = set
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref());
    matches!(t, None | Some("RollingUpdate"))
}

/// `rollingUpdate.partition` (0 without one).
pub fn partition(set: &StatefulSet) -> i32 {
    set.spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .unwrap_or(0)
        .max(0)
}

/// `rollingUpdate.maxUnavailable` over `replicas` (a percentage rounds up), at least 1.
pub fn max_unavailable(set: &StatefulSet) -> usize {
    let value = set
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.max_unavailable.clone());
    let n = replicas(set) as i64;
    let v = match value {
        None => 1,
        Some(IntOrString::Int(i)) => i64::from(i),
        Some(IntOrString::String(s)) => {
            let pct = s
                .strip_suffix('%')
                .and_then(|p| p.parse::<i64>().ok())
                .unwrap_or(100);
            (pct * n + 99) / 100
        }
    };
    v.max(1) as usize
}

/// A member pod's state for the decision.
struct Slot<'a> {
    pod: &'a Pod,
    healthy: bool,
}

/// The pure decision for `set` over its member pods at `now`; `current`/`update` are the
/// revision names pods are compared against.
pub fn plan(set: &StatefulSet, pods: &[&Pod], update: &str, now: Timestamp) -> Plan {
    let mut out = Plan::default();
    if set.metadata.deletion_timestamp.is_some() {
        return out;
    }
    let set_name = set.name();
    let start = start_ordinal(set);
    let n = replicas(set) as usize;
    let monotonic = ordered(set);
    let min_ready = min_ready_seconds(set);

    let health = |p: &Pod, out: &mut Plan| -> bool {
        if is_terminating(p) || !is_running_and_ready(p) {
            return false;
        }
        match available_in(p, min_ready, now) {
            None => true,
            Some(left) => {
                out.requeue = Some(out.requeue.map_or(left, |r| r.min(left)));
                false
            }
        }
    };

    let mut slots: Vec<Option<Slot>> = (0..n).map(|_| None).collect();
    let mut condemned: Vec<(i32, Slot)> = Vec::new();
    for p in pods {
        let Some(ord) = ordinal_of(&set_name, &p.name()) else {
            continue;
        };
        let healthy = health(p, &mut out);
        let slot = Slot { pod: p, healthy };
        let i = i64::from(ord) - i64::from(start);
        if i >= 0 && (i as usize) < n {
            slots[i as usize] = Some(slot);
        } else {
            condemned.push((ord, slot));
        }
    }
    condemned.sort_by_key(|(ord, _)| *ord);
    // The first unhealthy pod, in ordinal order, in range first: the one a scale-down may
    // remove although it is not healthy.
    let first_unhealthy = slots
        .iter()
        .flatten()
        .chain(condemned.iter().map(|(_, s)| s))
        .find(|s| !s.healthy)
        .map(|s| s.pod.name());

    let at = |ord: i32| {
        if rolling(set) && ord < start + partition(set) {
            At::Current
        } else {
            At::Update
        }
    };
    let delete = |p: &Pod, why: Why| Delete {
        name: p.name(),
        uid: p.uid().unwrap_or_default(),
        why,
    };

    for (i, slot) in slots.iter().enumerate() {
        let ord = start + i as i32;
        let Some(s) = slot else {
            out.create.push((ord, at(ord)));
            if monotonic {
                return out;
            }
            continue;
        };
        let p = s.pod;
        if is_finished(p) {
            if !is_terminating(p) {
                out.delete.push(delete(p, Why::Finished));
            }
            if monotonic {
                return out;
            }
            continue;
        }
        if is_pending(p) && !is_terminating(p) {
            out.ensure_claims.push(ord);
        }
        if !identity_matches(&set_name, p, ord) && !is_terminating(p) {
            out.relabel.push((p.name(), ord));
        }
        if monotonic && !s.healthy {
            return out;
        }
    }

    for (_, s) in condemned.iter().rev() {
        let p = s.pod;
        if is_terminating(p) {
            if monotonic {
                return out;
            }
            continue;
        }
        if monotonic && !s.healthy && first_unhealthy.as_deref() != Some(p.name().as_str()) {
            return out;
        }
        out.delete.push(delete(p, Why::Condemned));
        if monotonic {
            return out;
        }
    }

    if !rolling(set) {
        return out;
    }
    let max = max_unavailable(set);
    let unavailable = slots
        .iter()
        .filter(|s| !s.as_ref().is_some_and(|s| s.healthy))
        .count();
    let mut budget = max.saturating_sub(unavailable);
    let from = (partition(set).max(0) as usize).min(n);
    for s in slots[from..].iter().rev().flatten() {
        if budget == 0 {
            break;
        }
        if pod_revision(s.pod) != Some(update) && !is_terminating(s.pod) {
            out.delete.push(delete(s.pod, Why::Outdated));
            budget -= 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::identity::REVISION_LABEL;
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn set(replicas: i32, policy: &str, strategy: serde_json::Value) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u"},
            "spec": {
                "replicas": replicas,
                "podManagementPolicy": policy,
                "updateStrategy": strategy,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}}
            }
        }))
        .unwrap()
    }

    fn rolling_partition(p: i32) -> serde_json::Value {
        json!({"type": "RollingUpdate", "rollingUpdate": {"partition": p}})
    }

    /// A pod of ordinal `ord` at `rev`, Running and Ready since t=0 when `ready`.
    fn pod(ord: i32, rev: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("web-{ord}"), "uid": format!("uid-{ord}"), "labels": {
                "app": "web", REVISION_LABEL: rev,
                "statefulset.kubernetes.io/pod-name": format!("web-{ord}"),
                "apps.kubernetes.io/pod-index": ord.to_string(),
            }},
            "status": {
                "phase": if ready { "Running" } else { "Pending" },
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                                "lastTransitionTime": Time(ts(0))}]
            }
        }))
        .unwrap()
    }

    fn run(s: &StatefulSet, pods: &[Pod]) -> Plan {
        let refs: Vec<&Pod> = pods.iter().collect();
        plan(s, &refs, "new", ts(100))
    }

    fn deleted(p: &Plan) -> Vec<&str> {
        p.delete.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn ordered_ready_creates_one_at_a_time_in_order() {
        let s = set(3, "OrderedReady", rolling_partition(0));
        assert_eq!(run(&s, &[]).create, [(0, At::Update)]);
        // web-0 exists but is not Ready: nothing more.
        assert_eq!(
            run(&s, &[pod(0, "new", false)]),
            Plan {
                ensure_claims: vec![0],
                ..Default::default()
            }
        );
        assert_eq!(run(&s, &[pod(0, "new", true)]).create, [(1, At::Update)]);
        // A gap is filled first, even with a later pod present.
        assert_eq!(
            run(&s, &[pod(0, "new", true), pod(2, "new", true)]).create,
            [(1, At::Update)]
        );
    }

    #[test]
    fn parallel_creates_every_missing_ordinal_at_once() {
        let s = set(3, "Parallel", rolling_partition(0));
        assert_eq!(
            run(&s, &[pod(1, "new", false)]).create,
            [(0, At::Update), (2, At::Update)]
        );
    }

    #[test]
    fn scale_down_removes_the_highest_ordinal_first_one_at_a_time() {
        let s = set(1, "OrderedReady", rolling_partition(0));
        let pods = [
            pod(0, "new", true),
            pod(1, "new", true),
            pod(2, "new", true),
        ];
        assert_eq!(deleted(&run(&s, &pods)), ["web-2"]);
        // While web-2 terminates, web-1 waits.
        let mut going = pod(2, "new", true);
        going.metadata.deletion_timestamp = Some(Time(ts(50)));
        assert!(run(&s, &[pod(0, "new", true), pod(1, "new", true), going])
            .delete
            .is_empty());
        // An unhealthy pod in range blocks the scale-down; the first unhealthy may go.
        assert!(run(&s, &[pod(0, "new", false), pod(1, "new", true)])
            .delete
            .is_empty());
        assert_eq!(
            deleted(&run(&s, &[pod(0, "new", true), pod(1, "new", false)])),
            ["web-1"]
        );
        // Parallel removes them all at once.
        let p = set(1, "Parallel", rolling_partition(0));
        assert_eq!(deleted(&run(&p, &pods)), ["web-2", "web-1"]);
    }

    #[test]
    fn a_failed_pod_is_deleted_to_be_made_again() {
        let s = set(2, "OrderedReady", rolling_partition(0));
        let mut failed = pod(0, "new", false);
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let p = run(&s, &[failed, pod(1, "new", true)]);
        assert_eq!(
            p.delete,
            [Delete {
                name: "web-0".into(),
                uid: "uid-0".into(),
                why: Why::Finished
            }]
        );
        assert!(p.create.is_empty());
    }

    #[test]
    fn rolling_update_goes_down_from_the_highest_ordinal_above_the_partition() {
        let s = set(3, "OrderedReady", rolling_partition(0));
        let old = [
            pod(0, "old", true),
            pod(1, "old", true),
            pod(2, "old", true),
        ];
        assert_eq!(deleted(&run(&s, &old)), ["web-2"]);
        // Wait for the recreated web-2 to be Ready before touching web-1.
        let mid = [
            pod(0, "old", true),
            pod(1, "old", true),
            pod(2, "new", false),
        ];
        assert!(run(&s, &mid).delete.is_empty());
        let mid = [
            pod(0, "old", true),
            pod(1, "old", true),
            pod(2, "new", true),
        ];
        assert_eq!(deleted(&run(&s, &mid)), ["web-1"]);
        // With partition 2 only web-2 is updated, and a missing web-1 comes back current.
        let s = set(3, "OrderedReady", rolling_partition(2));
        assert_eq!(deleted(&run(&s, &old)), ["web-2"]);
        assert!(run(
            &s,
            &[
                pod(0, "old", true),
                pod(1, "old", true),
                pod(2, "new", true)
            ]
        )
        .delete
        .is_empty());
        assert_eq!(run(&s, &[pod(0, "old", true)]).create, [(1, At::Current)]);
        assert_eq!(
            run(&s, &[pod(0, "old", true), pod(1, "old", true)]).create,
            [(2, At::Update)]
        );
    }

    #[test]
    fn max_unavailable_bounds_the_pods_updated_at_once() {
        let strategy = json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0, "maxUnavailable": 2}});
        let s = set(4, "Parallel", strategy);
        let old: Vec<Pod> = (0..4).map(|i| pod(i, "old", true)).collect();
        assert_eq!(deleted(&run(&s, &old)), ["web-3", "web-2"]);
        // One already unavailable leaves room for one more.
        let mut some = old.clone();
        some[3] = pod(3, "new", false);
        assert_eq!(deleted(&run(&s, &some)), ["web-2"]);
        let s = set(
            4,
            "Parallel",
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "50%"}}),
        );
        assert_eq!(max_unavailable(&s), 2);
        let s = set(
            3,
            "Parallel",
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}),
        );
        assert_eq!(max_unavailable(&s), 1);
    }

    #[test]
    fn on_delete_leaves_outdated_pods_alone() {
        let s = set(2, "OrderedReady", json!({"type": "OnDelete"}));
        assert!(run(&s, &[pod(0, "old", true), pod(1, "old", true)])
            .delete
            .is_empty());
        assert_eq!(run(&s, &[pod(0, "old", true)]).create, [(1, At::Update)]);
    }

    #[test]
    fn min_ready_seconds_gates_the_next_pod() {
        let mut s = set(2, "OrderedReady", rolling_partition(0));
        s.spec.as_mut().unwrap().min_ready_seconds = Some(130);
        let p = run(&s, &[pod(0, "new", true)]);
        assert!(p.create.is_empty());
        assert_eq!(p.requeue, Some(Duration::from_secs(30)));
    }

    #[test]
    fn ordinals_start_where_the_spec_says() {
        let mut s = set(2, "Parallel", rolling_partition(0));
        s.spec.as_mut().unwrap().ordinals =
            Some(serde_json::from_value(json!({"start": 3})).unwrap());
        let p = run(&s, &[pod(0, "new", true), pod(3, "new", true)]);
        assert_eq!(p.create, [(4, At::Update)]);
        assert_eq!(deleted(&p), ["web-0"]);
    }

    #[test]
    fn pods_missing_identity_labels_are_relabelled_and_a_deleted_set_does_nothing() {
        let s = set(1, "OrderedReady", rolling_partition(0));
        let mut bare = pod(0, "new", true);
        bare.metadata
            .labels
            .as_mut()
            .unwrap()
            .remove("apps.kubernetes.io/pod-index");
        assert_eq!(run(&s, &[bare]).relabel, [("web-0".to_string(), 0)]);
        let mut gone = s.clone();
        gone.metadata.deletion_timestamp = Some(Time(ts(1)));
        assert_eq!(run(&gone, &[]), Plan::default());
    }
}
