//! A StatefulSet's status as upstream computes it: counts over its member pods, the current
//! and update revisions, and the rolling update completing (`currentRevision` catches up
//! with `updateRevision` once every pod is updated and Ready).

use std::time::Duration;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::identity::pod_revision;
use super::plan::min_ready_seconds;

/// Whether the pod is being deleted.
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// The pod's Ready condition, if True: since when (when recorded).
fn ready_since(pod: &Pod) -> Option<Option<Timestamp>> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| c.last_transition_time.as_ref().map(|t| t.0))
}

/// Whether the pod is Running with its Ready condition True.
pub fn is_running_and_ready(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && ready_since(pod).is_some()
}

/// For a Running and Ready pod: `None` when it has been Ready for `min_ready` seconds at
/// `now` (available), else how long until it will have been.
pub fn available_in(pod: &Pod, min_ready: i64, now: Timestamp) -> Option<Duration> {
    if min_ready <= 0 {
        return None;
    }
    let since = ready_since(pod).flatten()?;
    let left = since.as_second() + min_ready - now.as_second();
    (left > 0).then(|| Duration::from_secs(left as u64))
}

/// The status the member pods imply (upstream's `computeReplicaStatus` and
/// `completeRollingUpdate`), keeping `conditions` from `set.status`.
pub fn status(
    set: &StatefulSet,
    pods: &[&Pod],
    current: &str,
    update: &str,
    collision_count: i32,
    now: Timestamp,
) -> StatefulSetStatus {
    let min_ready = min_ready_seconds(set);
    let mut s = StatefulSetStatus {
        observed_generation: set.metadata.generation,
        current_revision: Some(current.to_string()),
        update_revision: Some(update.to_string()),
        collision_count: Some(collision_count),
        conditions: set.status.as_ref().and_then(|s| s.conditions.clone()),
        ..Default::default()
    };
    let (mut ready, mut available, mut at_current, mut updated) = (0, 0, 0, 0);
    for p in pods {
        s.replicas += 1;
        if is_running_and_ready(p) {
            ready += 1;
            if available_in(p, min_ready, now).is_none() {
                available += 1;
            }
        }
        if !is_terminating(p) {
            let rev = pod_revision(p);
            if rev == Some(current) {
                at_current += 1;
            }
            if rev == Some(update) {
                updated += 1;
            }
        }
    }
    let rolling = matches!(
        set.spec
            .as_ref()
            .and_then(|sp| sp.update_strategy.as_ref())
            .and_then(|u| u.type_.as_deref()),
        None | Some("RollingUpdate")
    );
    if rolling && updated == s.replicas && ready == s.replicas {
        at_current = updated;
        s.current_revision = Some(update.to_string());
    }
    s.ready_replicas = Some(ready);
    s.available_replicas = Some(available);
    s.current_replicas = Some(at_current);
    s.updated_replicas = Some(updated);
    s
}

/// Whether two statuses say the same, reading omitted counts as zero.
pub fn same(a: &StatefulSetStatus, b: &StatefulSetStatus) -> bool {
    let n = |v: Option<i32>| v.unwrap_or(0);
    let c = |s: &StatefulSetStatus| s.conditions.clone().unwrap_or_default();
    a.replicas == b.replicas
        && n(a.ready_replicas) == n(b.ready_replicas)
        && n(a.available_replicas) == n(b.available_replicas)
        && n(a.current_replicas) == n(b.current_replicas)
        && n(a.updated_replicas) == n(b.updated_replicas)
        && n(a.collision_count) == n(b.collision_count)
        && a.current_revision == b.current_revision
        && a.update_revision == b.update_revision
        && a.observed_generation == b.observed_generation
        && c(a) == c(b)
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

    fn pod(rev: &str, ready_at: Option<i64>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "labels": {REVISION_LABEL: rev}},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": if ready_at.is_some() { "True" } else { "False" },
                                "lastTransitionTime": Time(ts(ready_at.unwrap_or(0)))}]
            }
        }))
        .unwrap()
    }

    fn set(min_ready: i32) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "generation": 4},
            "spec": {"replicas": 3, "minReadySeconds": min_ready, "selector": {},
                     "template": {}, "serviceName": ""}
        }))
        .unwrap()
    }

    #[test]
    fn counts_pods_by_readiness_availability_and_revision() {
        let pods = [pod("old", Some(0)), pod("new", Some(95)), pod("new", None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let s = status(&set(10), &refs, "old", "new", 0, ts(100));
        assert_eq!(s.replicas, 3);
        assert_eq!(s.ready_replicas, Some(2));
        assert_eq!(s.available_replicas, Some(1));
        assert_eq!(s.current_replicas, Some(1));
        assert_eq!(s.updated_replicas, Some(2));
        assert_eq!(s.current_revision.as_deref(), Some("old"));
        assert_eq!(s.update_revision.as_deref(), Some("new"));
        assert_eq!(s.observed_generation, Some(4));
    }

    #[test]
    fn a_finished_rolling_update_makes_the_update_revision_current() {
        let pods = [pod("new", Some(0)), pod("new", Some(0))];
        let refs: Vec<&Pod> = pods.iter().collect();
        let s = status(&set(0), &refs, "old", "new", 0, ts(100));
        assert_eq!(s.current_revision.as_deref(), Some("new"));
        assert_eq!(s.current_replicas, Some(2));
        assert!(same(&s, &s.clone()));
        let not_ready = [pod("new", Some(0)), pod("new", None)];
        let refs: Vec<&Pod> = not_ready.iter().collect();
        let s = status(&set(0), &refs, "old", "new", 0, ts(100));
        assert_eq!(s.current_revision.as_deref(), Some("old"));
    }
}
