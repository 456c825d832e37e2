//! Persistent storage vocabulary shared by the API server (admission, printers), the volume
//! controllers, the scheduler and the node agent: the annotations and finalizers upstream uses,
//! how a claim's or a volume's class is read, and when a class is the default one.
//!
//! Everything here works on JSON objects so that every component reads the same fields the
//! same way, whatever typed view it holds.

use serde_json::Value;

/// Finalizer the API server adds to every claim; removed once no pod uses the claim.
pub const PVC_PROTECTION_FINALIZER: &str = "kubernetes.io/pvc-protection";
/// Finalizer the API server adds to every volume; removed once the volume is not bound.
pub const PV_PROTECTION_FINALIZER: &str = "kubernetes.io/pv-protection";

/// A StorageClass annotated `"true"` is the default class for claims that name none.
pub const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
/// The beta spelling of [`DEFAULT_CLASS_ANNOTATION`], still honoured upstream.
pub const BETA_DEFAULT_CLASS_ANNOTATION: &str = "storageclass.beta.kubernetes.io/is-default-class";
/// The beta annotation that named a claim's or a volume's class before `storageClassName`.
pub const BETA_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

/// On a volume and a claim: the binder finished binding them (`"yes"`).
pub const BIND_COMPLETED_ANNOTATION: &str = "pv.kubernetes.io/bind-completed";
/// On a volume or a claim: the binder, not the user, set `claimRef` / `volumeName` (`"yes"`).
pub const BOUND_BY_CONTROLLER_ANNOTATION: &str = "pv.kubernetes.io/bound-by-controller";
/// On a volume: the provisioner that created it.
pub const PROVISIONED_BY_ANNOTATION: &str = "pv.kubernetes.io/provisioned-by";
/// On a claim: the node the scheduler chose for a `WaitForFirstConsumer` claim's first pod.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";
/// On a claim: the provisioner expected to provision it (set by the binder).
pub const STORAGE_PROVISIONER_ANNOTATION: &str = "volume.kubernetes.io/storage-provisioner";
/// The beta spelling of [`STORAGE_PROVISIONER_ANNOTATION`], still set upstream for old
/// provisioners.
pub const BETA_STORAGE_PROVISIONER_ANNOTATION: &str =
    "volume.beta.kubernetes.io/storage-provisioner";

/// Setpoint's built-in provisioner: volumes are directories under a node agent's data dir.
pub const LOCAL_PATH_PROVISIONER: &str = "setpoint.io/local-path";
/// The default StorageClass `setpoint up` creates for [`LOCAL_PATH_PROVISIONER`].
pub const LOCAL_PATH_CLASS: &str = "local-path";

/// The Node annotation in which a node agent publishes the directory its local-path volumes
/// live under; the provisioner puts a claim's volume there.
pub const LOCAL_PATH_DIR_ANNOTATION: &str = "setpoint.io/local-path-dir";

/// `volumeBindingMode` that delays binding and provisioning until a pod using the claim is
/// scheduled.
pub const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";

/// The label every node carries with its own name, which local volumes' node affinity names.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.get("metadata")?.get("annotations")?.get(key)?.as_str()
}

/// The class a claim asks for: the beta annotation wins over `spec.storageClassName`, as
/// upstream's `GetPersistentVolumeClaimClass`; `""` for no class.
pub fn claim_class(pvc: &Value) -> &str {
    if let Some(class) = annotation(pvc, BETA_CLASS_ANNOTATION) {
        return class;
    }
    pvc.pointer("/spec/storageClassName")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Whether a claim names a class at all (an explicit `""` is a choice of "no class").
pub fn claim_names_class(pvc: &Value) -> bool {
    annotation(pvc, BETA_CLASS_ANNOTATION).is_some()
        || pvc
            .pointer("/spec/storageClassName")
            .is_some_and(|v| !v.is_null())
}

/// The class a volume belongs to, read as upstream's `GetPersistentVolumeClass`.
pub fn volume_class(pv: &Value) -> &str {
    if let Some(class) = annotation(pv, BETA_CLASS_ANNOTATION) {
        return class;
    }
    pv.pointer("/spec/storageClassName")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Whether a StorageClass is marked the default (either annotation, `"true"`).
pub fn is_default_class(sc: &Value) -> bool {
    annotation(sc, DEFAULT_CLASS_ANNOTATION) == Some("true")
        || annotation(sc, BETA_DEFAULT_CLASS_ANNOTATION) == Some("true")
}

/// The access modes as `kubectl get` abbreviates them, in upstream's fixed order
/// (`RWO,ROX,RWX,RWOP`), each at most once.
pub fn access_modes_string(modes: &[Value]) -> String {
    const ORDER: [(&str, &str); 4] = [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ];
    ORDER
        .iter()
        .filter(|(mode, _)| modes.iter().any(|m| m.as_str() == Some(mode)))
        .map(|(_, short)| *short)
        .collect::<Vec<_>>()
        .join(",")
}

/// The name of the claim a pod volume uses: `persistentVolumeClaim.claimName`, or for a
/// generic ephemeral volume the claim upstream creates for it, `<pod>-<volume>`.
pub fn pod_volume_claim(pod_name: &str, volume: &Value) -> Option<String> {
    if let Some(claim) = volume
        .pointer("/persistentVolumeClaim/claimName")
        .and_then(Value::as_str)
    {
        return Some(claim.to_string());
    }
    if volume.get("ephemeral").is_some_and(|e| !e.is_null()) {
        let name = volume.get("name").and_then(Value::as_str).unwrap_or("");
        return Some(format!("{pod_name}-{name}"));
    }
    None
}

/// The names of the claims a pod uses, in volume order.
pub fn pod_claims(pod: &Value) -> Vec<String> {
    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .map(|vols| {
            vols.iter()
                .filter_map(|v| pod_volume_claim(name, v))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn classes_read_the_beta_annotation_first() {
        let pvc = json!({"metadata": {"annotations": {BETA_CLASS_ANNOTATION: "old"}},
                         "spec": {"storageClassName": "new"}});
        assert_eq!(claim_class(&pvc), "old");
        let pvc = json!({"spec": {"storageClassName": ""}});
        assert_eq!(claim_class(&pvc), "");
        assert!(claim_names_class(&pvc));
        assert!(!claim_names_class(&json!({"spec": {}})));
        assert_eq!(
            volume_class(&json!({"spec": {"storageClassName": "x"}})),
            "x"
        );
    }

    #[test]
    fn default_class_by_either_annotation() {
        assert!(is_default_class(
            &json!({"metadata": {"annotations": {DEFAULT_CLASS_ANNOTATION: "true"}}})
        ));
        assert!(is_default_class(
            &json!({"metadata": {"annotations": {BETA_DEFAULT_CLASS_ANNOTATION: "true"}}})
        ));
        assert!(!is_default_class(
            &json!({"metadata": {"annotations": {DEFAULT_CLASS_ANNOTATION: "false"}}})
        ));
    }

    #[test]
    fn access_modes_in_upstream_order() {
        let modes = [
            json!("ReadWriteMany"),
            json!("ReadWriteOnce"),
            json!("ReadWriteOnce"),
        ];
        assert_eq!(access_modes_string(&modes), "RWO,RWX");
        assert_eq!(access_modes_string(&[]), "");
    }

    #[test]
    fn pod_claims_include_ephemeral_volumes() {
        let pod = json!({"metadata": {"name": "web"}, "spec": {"volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-claim"}},
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}},
            {"name": "tmp", "emptyDir": {}},
        ]}});
        assert_eq!(pod_claims(&pod), vec!["data-claim", "web-scratch"]);
    }
}
