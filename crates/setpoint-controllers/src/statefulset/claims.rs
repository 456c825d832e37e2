//! `persistentVolumeClaimRetentionPolicy` as owner references on the claims, so the garbage
//! collector does the deleting (upstream's `updateClaimOwnerRefForSetAndPod`):
//!
//! - `whenDeleted: Delete`: the claim is owned by the set while its pod is in range, so it
//!   goes with the set;
//! - `whenScaled: Delete`: the claim of a condemned pod (ordinal beyond `replicas`) is owned
//!   by that pod before the pod is deleted, so it goes with the pod;
//! - `Retain` (both defaults): neither reference; claims outlive pods and set.
//!
//! The references are not controller references: a claim is nobody's controlled object.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use setpoint_runtime::Object;

use super::identity::in_range;

/// The retention policy: (`whenDeleted` is Delete, `whenScaled` is Delete).
pub fn policy(set: &StatefulSet) -> (bool, bool) {
    let p = set
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
    let delete = |v: Option<&String>| v.map(String::as_str) == Some("Delete");
    (
        delete(p.and_then(|p| p.when_deleted.as_ref())),
        delete(p.and_then(|p| p.when_scaled.as_ref())),
    )
}

fn reference(api_version: &str, kind: &str, name: String, uid: String) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name,
        uid,
        ..Default::default()
    }
}

/// The owner references `claim` (of the set's pod `pod` with `ordinal`) should carry, when
/// they differ from what it has; `None` when it is right already.
pub fn wanted_refs(
    set: &StatefulSet,
    claim: &PersistentVolumeClaim,
    pod: &Pod,
    ordinal: i32,
) -> Option<Vec<OwnerReference>> {
    let (when_deleted, when_scaled) = policy(set);
    let set_uid = set.uid().unwrap_or_default();
    let pod_uid = pod.uid().unwrap_or_default();
    let current = claim.owner_references();
    // Another controller owns the claim: leave it be, as upstream does.
    if current
        .iter()
        .any(|r| r.controller == Some(true) && r.uid != set_uid && r.uid != pod_uid)
    {
        return None;
    }
    let mut out: Vec<OwnerReference> = current
        .iter()
        .filter(|r| r.uid != set_uid && r.uid != pod_uid)
        .cloned()
        .collect();
    let scaled_down = !in_range(set, ordinal);
    if when_scaled && scaled_down {
        out.push(reference("v1", "Pod", pod.name(), pod_uid.clone()));
    } else if when_deleted {
        out.push(reference(
            "apps/v1",
            "StatefulSet",
            set.name(),
            set_uid.clone(),
        ));
    }
    let key = |r: &OwnerReference| (r.uid.clone(), r.controller);
    let mut a: Vec<_> = current.iter().map(key).collect();
    let mut b: Vec<_> = out.iter().map(key).collect();
    a.sort();
    b.sort();
    (a != b).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set(replicas: i32, when_deleted: &str, when_scaled: &str) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "uid": "set-uid"},
            "spec": {"replicas": replicas, "selector": {}, "template": {}, "serviceName": "",
                     "persistentVolumeClaimRetentionPolicy": {"whenDeleted": when_deleted, "whenScaled": when_scaled}}
        }))
        .unwrap()
    }

    fn pod() -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "web-1", "uid": "pod-uid"}})).unwrap()
    }

    fn claim(owners: &[&str]) -> PersistentVolumeClaim {
        let refs: Vec<_> = owners
            .iter()
            .map(|u| json!({"apiVersion": "v1", "kind": "X", "name": "x", "uid": u}))
            .collect();
        serde_json::from_value(json!({"metadata": {"name": "www-web-1", "ownerReferences": refs}}))
            .unwrap()
    }

    fn uids(r: Option<Vec<OwnerReference>>) -> Option<Vec<String>> {
        r.map(|v| v.into_iter().map(|r| r.uid).collect())
    }

    #[test]
    fn retain_retain_leaves_claims_unowned() {
        assert_eq!(
            uids(wanted_refs(
                &set(1, "Retain", "Retain"),
                &claim(&[]),
                &pod(),
                1
            )),
            None
        );
        // A stale reference of ours is removed.
        assert_eq!(
            uids(wanted_refs(
                &set(3, "Retain", "Retain"),
                &claim(&["set-uid"]),
                &pod(),
                1
            )),
            Some(vec![])
        );
    }

    #[test]
    fn when_deleted_delete_owns_claims_by_the_set() {
        let s = set(3, "Delete", "Retain");
        assert_eq!(
            uids(wanted_refs(&s, &claim(&["other"]), &pod(), 1)),
            Some(vec!["other".into(), "set-uid".into()])
        );
        assert_eq!(uids(wanted_refs(&s, &claim(&["set-uid"]), &pod(), 1)), None);
    }

    #[test]
    fn when_scaled_delete_owns_condemned_claims_by_their_pod() {
        // Ordinal 1 with one replica is condemned.
        let s = set(1, "Delete", "Delete");
        assert_eq!(
            uids(wanted_refs(&s, &claim(&["set-uid"]), &pod(), 1)),
            Some(vec!["pod-uid".into()])
        );
        // In range: the set, not the pod.
        let s = set(2, "Delete", "Delete");
        assert_eq!(
            uids(wanted_refs(&s, &claim(&["pod-uid"]), &pod(), 1)),
            Some(vec!["set-uid".into()])
        );
        let s = set(2, "Retain", "Delete");
        assert_eq!(uids(wanted_refs(&s, &claim(&[]), &pod(), 1)), None);
    }
}
