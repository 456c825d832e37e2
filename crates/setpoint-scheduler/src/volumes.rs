//! Volume binding, the essentials of kube-scheduler's VolumeBinding plugin: what a pod's
//! PersistentVolumeClaims require of the node it goes to.
//!
//! - a claim that does not exist, or is being deleted, makes the pod unschedulable
//!   everywhere (upstream's PreFilter messages);
//! - an unbound claim whose class binds `Immediate` (or that names no class, or a class that
//!   does not exist) must be bound by the binder first: `pod has unbound immediate
//!   PersistentVolumeClaims`;
//! - a bound claim's volume restricts the pod to the nodes its node affinity allows;
//! - an unbound claim of a `WaitForFirstConsumer` class goes with the pod: once a node is
//!   chosen it is written to the claim's `volume.kubernetes.io/selected-node`, and the pod is
//!   bound only after its claims are (upstream's PreBind).

use k8s_openapi::api::core::v1::{NodeSelector, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use setpoint_api::storage as st;

/// What a pod's claims ask of its node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VolumeNeeds {
    /// Required node affinity of the volumes its claims are bound to.
    pub affinity: Vec<NodeSelector>,
    /// A claim is bound to a volume that does not exist.
    pub missing_volume: bool,
    /// Unbound claims of `WaitForFirstConsumer` classes, to be given the chosen node.
    pub delayed: Vec<String>,
}

/// Whether a claim is bound (the binder named its volume).
pub fn claim_bound(pvc: &PersistentVolumeClaim) -> bool {
    pvc.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty())
}

/// The pure pre-filter: the pod's needs, or why it fits no node at all (upstream's text).
pub fn volume_needs<C, V, S>(
    pod: &Pod,
    claim: C,
    volume: V,
    class: S,
) -> Result<VolumeNeeds, String>
where
    C: Fn(&str) -> Option<PersistentVolumeClaim>,
    V: Fn(&str) -> Option<PersistentVolume>,
    S: Fn(&str) -> Option<StorageClass>,
{
    let mut needs = VolumeNeeds::default();
    let pod_json = serde_json::to_value(pod).unwrap_or_default();
    let mut immediate_unbound = false;
    for name in st::pod_claims(&pod_json) {
        let Some(pvc) = claim(&name) else {
            return Err(format!("persistentvolumeclaim {name:?} not found"));
        };
        if pvc.metadata.deletion_timestamp.is_some() {
            return Err(format!("persistentvolumeclaim {name:?} is being deleted"));
        }
        if claim_bound(&pvc) {
            let volume_name = pvc
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.clone())
                .unwrap_or_default();
            match volume(&volume_name) {
                None => needs.missing_volume = true,
                Some(pv) => {
                    if let Some(required) = pv
                        .spec
                        .and_then(|s| s.node_affinity)
                        .and_then(|a| a.required)
                    {
                        needs.affinity.push(required);
                    }
                }
            }
            continue;
        }
        let pvc_json = serde_json::to_value(&pvc).unwrap_or_default();
        let class_name = st::claim_class(&pvc_json);
        let delayed = !class_name.is_empty()
            && class(class_name).is_some_and(|c| {
                c.volume_binding_mode.as_deref() == Some(st::WAIT_FOR_FIRST_CONSUMER)
            });
        if delayed {
            needs.delayed.push(name);
        } else {
            immediate_unbound = true;
        }
    }
    if immediate_unbound {
        return Err("pod has unbound immediate PersistentVolumeClaims".into());
    }
    Ok(needs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [], "volumes": [
                {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}}))
        .unwrap()
    }

    fn pvc(class: &str, volume: Option<&str>) -> PersistentVolumeClaim {
        let mut spec = json!({"storageClassName": class});
        if let Some(v) = volume {
            spec["volumeName"] = json!(v);
        }
        serde_json::from_value(json!({"metadata": {"name": "data"}, "spec": spec})).unwrap()
    }

    fn class(mode: &str) -> StorageClass {
        serde_json::from_value(json!({"metadata": {"name": "c"}, "provisioner": "p",
                                      "volumeBindingMode": mode}))
        .unwrap()
    }

    #[test]
    fn missing_claim_is_upstreams_message() {
        let r = volume_needs(&pod(), |_| None, |_| None, |_| None);
        assert_eq!(r, Err("persistentvolumeclaim \"data\" not found".into()));
    }

    #[test]
    fn unbound_immediate_claims_wait_for_the_binder() {
        let r = volume_needs(
            &pod(),
            |_| Some(pvc("c", None)),
            |_| None,
            |_| Some(class("Immediate")),
        );
        assert_eq!(
            r,
            Err("pod has unbound immediate PersistentVolumeClaims".into())
        );
        let r = volume_needs(&pod(), |_| Some(pvc("gone", None)), |_| None, |_| None);
        assert_eq!(
            r,
            Err("pod has unbound immediate PersistentVolumeClaims".into())
        );
    }

    #[test]
    fn delayed_claims_go_with_the_pod() {
        let r = volume_needs(
            &pod(),
            |_| Some(pvc("c", None)),
            |_| None,
            |_| Some(class("WaitForFirstConsumer")),
        );
        assert_eq!(r.unwrap().delayed, vec!["data".to_string()]);
    }

    #[test]
    fn bound_volumes_bring_their_node_affinity() {
        let pv: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "v"},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}}))
        .unwrap();
        let needs = volume_needs(
            &pod(),
            |_| Some(pvc("c", Some("v"))),
            |_| Some(pv.clone()),
            |_| None,
        )
        .unwrap();
        assert_eq!(needs.affinity.len(), 1);
        let facts_pod = pod();
        let mut facts = crate::decision::PodFacts::of(&facts_pod);
        facts.volume_affinity = &needs.affinity;
        let node = |name: &str| {
            let mut labels = std::collections::BTreeMap::new();
            labels.insert("kubernetes.io/hostname".to_string(), name.to_string());
            crate::decision::NodeInfo::new(
                name,
                crate::decision::NodeFacts {
                    labels,
                    ..Default::default()
                },
            )
        };
        // n1 may still lack room for the pod; its volume is not what rejects it.
        let on_n1 = crate::decision::filter(&facts, &node("n1"))
            .err()
            .unwrap_or_default();
        assert!(!on_n1.contains(&crate::decision::Reason::VolumeNodeAffinityConflict));
        assert_eq!(
            crate::decision::filter(&facts, &node("n2")),
            Err(vec![crate::decision::Reason::VolumeNodeAffinityConflict])
        );
        let missing =
            volume_needs(&pod(), |_| Some(pvc("c", Some("v"))), |_| None, |_| None).unwrap();
        assert!(missing.missing_volume);
    }
}
