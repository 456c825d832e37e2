//! `persistentVolumeClaim` volumes: the claim's bound volume and the directory of the node
//! it names. Pure: the claim and the volume are read by [`super::manager`].

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

/// The kubelet's prefix for a claim it cannot use yet (`error processing PVC ns/name: ...`).
pub fn claim_error(namespace: &str, claim: &str, why: &str) -> String {
    format!("error processing PVC {namespace}/{claim}: {why}")
}

/// The volume a claim is bound to, or why the pod cannot use the claim yet (the kubelet's
/// words, without the prefix of [`claim_error`]).
pub fn bound_volume(pvc: &PersistentVolumeClaim) -> Result<String, String> {
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err("PVC is being deleted".to_string());
    }
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
    let volume = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty());
    match (phase, volume) {
        (Some("Bound"), Some(v)) => Ok(v.to_string()),
        _ => Err("PVC is not bound".to_string()),
    }
}

/// Where a bound volume's data lives on this node: `spec.local.path` or
/// `spec.hostPath.path` (with its `type`), the kinds of volume this node mounts. The
/// volume must be bound to the claim (`uid` of the claim in `claimRef`).
pub fn volume_path(
    pv: &PersistentVolume,
    claim_uid: Option<&str>,
) -> Result<(PathBuf, Option<String>), String> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let spec = pv.spec.as_ref();
    let claim_ref = spec.and_then(|s| s.claim_ref.as_ref());
    match (claim_ref.and_then(|r| r.uid.as_deref()), claim_uid) {
        (Some(bound), Some(uid)) if bound != uid => {
            return Err(format!("PV {name} is bound to another claim (uid {bound})"))
        }
        _ if claim_ref.is_none() => return Err(format!("PV {name} has no claimRef")),
        _ => {}
    }
    if let Some(local) = spec.and_then(|s| s.local.as_ref()) {
        return Ok((PathBuf::from(&local.path), None));
    }
    if let Some(host) = spec.and_then(|s| s.host_path.as_ref()) {
        return Ok((PathBuf::from(&host.path), host.type_.clone()));
    }
    Err(format!(
        "PV {name}: this node mounts only local and hostPath persistent volumes"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        HostPathVolumeSource, ObjectReference, PersistentVolumeClaimSpec,
        PersistentVolumeClaimStatus, PersistentVolumeSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn only_a_bound_claim_gives_its_volume_path() {
        let mut pvc = PersistentVolumeClaim::default();
        assert_eq!(bound_volume(&pvc).unwrap_err(), "PVC is not bound");
        pvc.spec = Some(PersistentVolumeClaimSpec {
            volume_name: Some("pv-1".into()),
            ..Default::default()
        });
        pvc.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        });
        assert_eq!(bound_volume(&pvc).unwrap(), "pv-1");
        assert_eq!(
            claim_error("ns", "data", "PVC is not bound"),
            "error processing PVC ns/data: PVC is not bound"
        );

        let mut pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv-1".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                host_path: Some(HostPathVolumeSource {
                    path: "/srv/pv-1".into(),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                claim_ref: Some(ObjectReference {
                    uid: Some("c-1".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            volume_path(&pv, Some("c-1")).unwrap(),
            (PathBuf::from("/srv/pv-1"), Some("DirectoryOrCreate".into()))
        );
        assert!(volume_path(&pv, Some("c-2")).is_err());
        pv.spec.as_mut().unwrap().host_path = None;
        assert_eq!(
            volume_path(&pv, Some("c-1")).unwrap_err(),
            "PV pv-1: this node mounts only local and hostPath persistent volumes"
        );
    }
}
