//! Printers for persistent storage: PersistentVolumes, PersistentVolumeClaims (core `v1`) and
//! StorageClasses (`storage.k8s.io/v1`).

use chrono::{DateTime, Utc};
use serde_json::Value;
use setpoint_api::storage;

use super::{age, arr_at, at, canonical_quantity, col, name_cell, str_at, wide, Column, AGE, NAME};

/// A quantity cell as upstream's `Quantity.String()` renders it: `0` for an absent quantity.
fn quantity_cell(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => canonical_quantity(s),
        Some(Value::Number(n)) => canonical_quantity(&n.to_string()),
        _ => "0".to_string(),
    }
}

/// A phase cell: `Terminating` once deletion began, as upstream's printers show it.
fn phase_cell(obj: &Value) -> String {
    if at(obj, "metadata.deletionTimestamp").is_some() {
        "Terminating".to_string()
    } else {
        str_at(obj, "status.phase").to_string()
    }
}

/// An optional string field, `<unset>` when absent.
fn unset_or(obj: &Value, dotted: &str) -> String {
    match at(obj, dotted).and_then(Value::as_str) {
        Some(s) => s.to_string(),
        None => "<unset>".to_string(),
    }
}

pub(super) const PERSISTENT_VOLUME: &[Column] = &[
    NAME,
    col("Capacity", "string", "The volume's storage capacity."),
    col(
        "Access Modes",
        "string",
        "The ways the volume can be mounted.",
    ),
    col(
        "Reclaim Policy",
        "string",
        "What happens to the volume when it is released from its claim.",
    ),
    col("Status", "string", "The phase of the volume."),
    col("Claim", "string", "The claim bound to the volume."),
    col("StorageClass", "string", "StorageClass of the pv"),
    col(
        "VolumeAttributesClass",
        "string",
        "VolumeAttributesClass of the pv",
    ),
    col("Reason", "string", "Why the volume is in its phase."),
    AGE,
    wide(
        "VolumeMode",
        "string",
        "Whether the volume is a formatted filesystem or a raw block device.",
    ),
];

pub(super) fn persistent_volume(pv: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let claim = match at(pv, "spec.claimRef") {
        Some(r) => format!("{}/{}", str_at(r, "namespace"), str_at(r, "name")),
        None => String::new(),
    };
    vec![
        name_cell(pv),
        Value::from(quantity_cell(at(pv, "spec.capacity.storage"))),
        Value::from(storage::access_modes_string(arr_at(pv, "spec.accessModes"))),
        Value::from(str_at(pv, "spec.persistentVolumeReclaimPolicy")),
        Value::from(phase_cell(pv)),
        Value::from(claim),
        Value::from(storage::volume_class(pv)),
        Value::from(unset_or(pv, "spec.volumeAttributesClassName")),
        Value::from(str_at(pv, "status.reason")),
        age(pv, now),
        Value::from(unset_or(pv, "spec.volumeMode")),
    ]
}

pub(super) const PERSISTENT_VOLUME_CLAIM: &[Column] = &[
    NAME,
    col("Status", "string", "The phase of the claim."),
    col("Volume", "string", "The volume bound to the claim."),
    col("Capacity", "string", "The capacity of the bound volume."),
    col(
        "Access Modes",
        "string",
        "The access modes of the bound volume.",
    ),
    col("StorageClass", "string", "StorageClass of the pvc"),
    col(
        "VolumeAttributesClass",
        "string",
        "VolumeAttributesClass of the pvc",
    ),
    AGE,
    wide(
        "VolumeMode",
        "string",
        "Whether the claim asks for a formatted filesystem or a raw block device.",
    ),
];

pub(super) fn persistent_volume_claim(pvc: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let volume = str_at(pvc, "spec.volumeName");
    // Upstream shows capacity and modes only once a volume is named, from the status.
    let (capacity, modes) = if volume.is_empty() {
        (String::new(), String::new())
    } else {
        (
            quantity_cell(at(pvc, "status.capacity.storage")),
            storage::access_modes_string(arr_at(pvc, "status.accessModes")),
        )
    };
    vec![
        name_cell(pvc),
        Value::from(phase_cell(pvc)),
        Value::from(volume),
        Value::from(capacity),
        Value::from(modes),
        Value::from(storage::claim_class(pvc)),
        Value::from(unset_or(pvc, "spec.volumeAttributesClassName")),
        age(pvc, now),
        Value::from(unset_or(pvc, "spec.volumeMode")),
    ]
}

pub(super) const STORAGE_CLASS: &[Column] = &[
    NAME,
    col(
        "Provisioner",
        "string",
        "The provisioner that creates volumes of this class.",
    ),
    col(
        "ReclaimPolicy",
        "string",
        "The reclaim policy of volumes provisioned for this class.",
    ),
    col(
        "VolumeBindingMode",
        "string",
        "When claims of this class are bound and provisioned.",
    ),
    col(
        "AllowVolumeExpansion",
        "string",
        "Whether claims of this class may be expanded.",
    ),
    AGE,
];

pub(super) fn storage_class(sc: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let mut name = str_at(sc, "metadata.name").to_string();
    if storage::is_default_class(sc) {
        name.push_str(" (default)");
    }
    let reclaim = match str_at(sc, "reclaimPolicy") {
        "" => "Delete",
        p => p,
    };
    let binding = match str_at(sc, "volumeBindingMode") {
        "" => "Immediate",
        m => m,
    };
    let expansion = at(sc, "allowVolumeExpansion")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    vec![
        Value::from(name),
        Value::from(str_at(sc, "provisioner")),
        Value::from(reclaim),
        Value::from(binding),
        // A boolean cell under a `string` column, as upstream's printer emits it.
        Value::from(expansion),
        age(sc, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> DateTime<Utc> {
        "2026-01-01T00:10:00Z".parse().unwrap()
    }

    #[test]
    fn default_class_is_marked_and_unset_fields_take_upstream_defaults() {
        let sc = json!({"metadata": {"name": "local-path", "creationTimestamp": "2026-01-01T00:00:00Z",
                            "annotations": {storage::DEFAULT_CLASS_ANNOTATION: "true"}},
                        "provisioner": "setpoint.io/local-path",
                        "volumeBindingMode": "WaitForFirstConsumer"});
        assert_eq!(
            storage_class(&sc, now()),
            vec![
                json!("local-path (default)"),
                json!("setpoint.io/local-path"),
                json!("Delete"),
                json!("WaitForFirstConsumer"),
                json!(false),
                json!("10m"),
            ]
        );
        assert_eq!(STORAGE_CLASS.len(), 6);
    }

    #[test]
    fn volume_and_claim_rows() {
        let pv = json!({"metadata": {"name": "pv1", "creationTimestamp": "2026-01-01T00:00:00Z"},
                        "spec": {"capacity": {"storage": "1024Mi"}, "accessModes": ["ReadWriteOnce"],
                                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "slow",
                                 "claimRef": {"namespace": "ns", "name": "c"}, "volumeMode": "Filesystem"},
                        "status": {"phase": "Bound"}});
        let row = persistent_volume(&pv, now());
        assert_eq!(row.len(), PERSISTENT_VOLUME.len());
        assert_eq!(
            row,
            vec![
                json!("pv1"),
                json!("1Gi"),
                json!("RWO"),
                json!("Retain"),
                json!("Bound"),
                json!("ns/c"),
                json!("slow"),
                json!("<unset>"),
                json!(""),
                json!("10m"),
                json!("Filesystem"),
            ]
        );
        let pending = json!({"metadata": {"name": "c"}, "spec": {"storageClassName": "slow",
                             "resources": {"requests": {"storage": "1Gi"}}},
                             "status": {"phase": "Pending"}});
        let row = persistent_volume_claim(&pending, now());
        assert_eq!(row.len(), PERSISTENT_VOLUME_CLAIM.len());
        assert_eq!(
            &row[..6],
            &[
                json!("c"),
                json!("Pending"),
                json!(""),
                json!(""),
                json!(""),
                json!("slow")
            ]
        );
    }
}
