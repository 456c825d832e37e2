//! PersistentVolumes, PersistentVolumeClaims and StorageClasses: the essentials of upstream's
//! `ValidatePersistentVolume`, `ValidatePersistentVolumeClaim` and `ValidateStorageClass`, with
//! their messages.

use serde_json::{json, Value};
use setpoint_api::Cause;

use super::fields::{arr, at, diff_paths, entries, not_supported, optional_enum, s, same};
use super::quantity::parse_quantity;

const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const VOLUME_MODES: &[&str] = &["Block", "Filesystem"];

/// The volume sources Setpoint knows a PersistentVolume by; a PV must name exactly one.
const PV_SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

fn access_modes(e: &mut Vec<Cause>, spec: &Value, path: &str, required_detail: &str) {
    let modes = arr(spec, "accessModes");
    if modes.is_empty() {
        e.push(Cause::required(
            format!("{path}.accessModes"),
            required_detail,
        ));
    }
    for m in modes {
        let mode = m.as_str().unwrap_or("");
        if !ACCESS_MODES.contains(&mode) {
            not_supported(e, format!("{path}.accessModes"), mode, ACCESS_MODES);
        }
    }
    if modes.iter().any(|m| m.as_str() == Some("ReadWriteOncePod")) && modes.len() > 1 {
        e.push(Cause::forbidden(
            format!("{path}.accessModes"),
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
}

pub(super) fn persistent_volume(e: &mut Vec<Cause>, pv: &Value, old: Option<&Value>) {
    let spec = at(pv, "spec");
    access_modes(e, spec, "spec", "");
    let capacity = at(spec, "capacity");
    if entries(capacity).next().is_none() {
        e.push(Cause::required("spec.capacity", ""));
    } else if capacity.get("storage").is_none() || entries(capacity).count() > 1 {
        e.push(Cause::not_supported(
            "spec.capacity",
            capacity,
            &["storage"],
        ));
    }
    if let Some(q) = capacity.get("storage").and_then(parse_quantity) {
        if !q.is_positive() {
            e.push(Cause::invalid(
                "spec.capacity.storage",
                &capacity["storage"],
                "must be greater than zero",
            ));
        }
    }
    optional_enum(
        e,
        spec,
        "persistentVolumeReclaimPolicy",
        "spec.persistentVolumeReclaimPolicy",
        &["Delete", "Recycle", "Retain"],
    );
    optional_enum(e, spec, "volumeMode", "spec.volumeMode", VOLUME_MODES);
    let sources: Vec<&str> = PV_SOURCES
        .iter()
        .copied()
        .filter(|k| !at(spec, k).is_null())
        .collect();
    match sources.as_slice() {
        [] => e.push(Cause::required("spec", "must specify a volume type")),
        [_] => {}
        [_, second, ..] => e.push(Cause::forbidden(
            format!("spec.{second}"),
            "may not specify more than 1 volume type",
        )),
    }
    if !at(spec, "hostPath").is_null() && s(at(spec, "hostPath"), "path").is_empty() {
        e.push(Cause::required("spec.hostPath.path", ""));
    }
    if !at(spec, "local").is_null() {
        if s(at(spec, "local"), "path").is_empty() {
            e.push(Cause::required("spec.local.path", ""));
        }
        if at(spec, "nodeAffinity").is_null() {
            e.push(Cause::required(
                "spec.nodeAffinity",
                "Local volumes require node affinity",
            ));
        }
    }
    if let Some(old) = old {
        // Upstream lets the source and node affinity be set once, never changed after.
        for key in sources.iter().copied().chain(["nodeAffinity"]) {
            let (new_v, old_v) = (at(spec, key), at(at(old, "spec"), key));
            if !old_v.is_null() && !same(new_v, old_v) {
                e.push(Cause::invalid(
                    format!("spec.{key}"),
                    new_v,
                    "field is immutable",
                ));
            }
        }
    }
}

pub(super) fn persistent_volume_claim(e: &mut Vec<Cause>, pvc: &Value, old: Option<&Value>) {
    let spec = at(pvc, "spec");
    access_modes(e, spec, "spec", "at least 1 access mode is required");
    let storage = at(at(at(spec, "resources"), "requests"), "storage");
    if storage.is_null() {
        e.push(Cause::required("spec.resources[storage]", ""));
    } else if let Some(q) = parse_quantity(storage) {
        if !q.is_positive() {
            e.push(Cause::invalid(
                "spec.resources[storage]",
                storage,
                "must be greater than zero",
            ));
        }
    }
    optional_enum(e, spec, "volumeMode", "spec.volumeMode", VOLUME_MODES);
    if let Some(old) = old {
        claim_update(e, pvc, old);
    }
}

/// A claim's spec is immutable but for what the binder fills in (`volumeName`, a retroactive
/// default class) and, once bound, the requested size (expansion).
fn claim_update(e: &mut Vec<Cause>, pvc: &Value, old: &Value) {
    let old_spec = at(old, "spec").clone();
    let mut new_spec = at(pvc, "spec").clone();
    let (Some(new_map), Some(old_map)) = (new_spec.as_object_mut(), old_spec.as_object()) else {
        return;
    };
    if s(&old_spec, "volumeName").is_empty() {
        restore(new_map, old_map, "volumeName");
    }
    if at(&old_spec, "storageClassName").is_null() {
        restore(new_map, old_map, "storageClassName");
    }
    restore(new_map, old_map, "volumeAttributesClassName");
    let bound = s(at(pvc, "status"), "phase") == "Bound";
    if bound {
        if let (Some(requests), Some(old_requests)) = (
            new_map
                .get_mut("resources")
                .and_then(|r| r.get_mut("requests"))
                .and_then(Value::as_object_mut),
            old_map
                .get("resources")
                .and_then(|r| r.get("requests"))
                .and_then(Value::as_object),
        ) {
            restore(requests, old_requests, "storage");
        }
    }
    if !same(&new_spec, &old_spec) {
        let mut changed = Vec::new();
        diff_paths(&old_spec, &new_spec, "spec", &mut changed, 5);
        e.push(Cause::forbidden(
            "spec",
            &format!(
                "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims\n{}",
                changed.join("\n")
            ),
        ));
    }
    let size = |v: &Value| {
        parse_quantity(at(
            at(at(at(v, "spec"), "resources"), "requests"),
            "storage",
        ))
    };
    if let (Some(new_size), Some(old_size)) = (size(pvc), size(old)) {
        if new_size < old_size {
            e.push(Cause::forbidden(
                "spec.resources.requests.storage",
                "field can not be less than previous value",
            ));
        }
    }
}

/// Puts `old`'s value of `key` into `new` (or removes it), so a comparison ignores the key.
fn restore(
    new: &mut serde_json::Map<String, Value>,
    old: &serde_json::Map<String, Value>,
    key: &str,
) {
    match old.get(key) {
        Some(v) => {
            new.insert(key.to_string(), v.clone());
        }
        None => {
            new.remove(key);
        }
    }
}

pub(super) fn storage_class(e: &mut Vec<Cause>, sc: &Value, old: Option<&Value>) {
    if s(sc, "provisioner").is_empty() {
        e.push(Cause::required("provisioner", ""));
    }
    optional_enum(
        e,
        sc,
        "reclaimPolicy",
        "reclaimPolicy",
        &["Delete", "Retain"],
    );
    optional_enum(
        e,
        sc,
        "volumeBindingMode",
        "volumeBindingMode",
        &["Immediate", "WaitForFirstConsumer"],
    );
    let Some(old) = old else {
        return;
    };
    for (field, detail) in [
        ("parameters", "updates to parameters are forbidden."),
        ("provisioner", "updates to provisioner are forbidden."),
        ("reclaimPolicy", "updates to reclaimPolicy are forbidden."),
    ] {
        if !same(at(sc, field), at(old, field)) {
            e.push(Cause::forbidden(field, detail));
        }
    }
    if !same(at(sc, "volumeBindingMode"), at(old, "volumeBindingMode")) {
        e.push(Cause::invalid(
            "volumeBindingMode",
            &json!(s(sc, "volumeBindingMode")),
            "field is immutable",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pvc(spec: Value) -> Value {
        json!({"metadata": {"name": "c", "namespace": "ns"}, "spec": spec})
    }

    #[test]
    fn claim_needs_modes_and_size() {
        let mut e = Vec::new();
        persistent_volume_claim(&mut e, &pvc(json!({})), None);
        let fields: Vec<&str> = e.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["spec.accessModes", "spec.resources[storage]"]);
        assert_eq!(
            e[0].message,
            "Required value: at least 1 access mode is required"
        );
    }

    #[test]
    fn bound_claim_spec_is_immutable_but_for_binder_fields() {
        let old = pvc(json!({"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Gi"}}}));
        let mut bound = old.clone();
        bound["spec"]["volumeName"] = json!("pv-1");
        bound["spec"]["storageClassName"] = json!("local-path");
        let mut e = Vec::new();
        persistent_volume_claim(&mut e, &bound, Some(&old));
        assert!(e.is_empty(), "{e:?}");

        let mut changed = bound.clone();
        changed["spec"]["accessModes"] = json!(["ReadWriteMany"]);
        let mut e = Vec::new();
        persistent_volume_claim(&mut e, &changed, Some(&bound));
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].field, "spec");
        assert!(e[0].message.starts_with(
            "Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"
        ));
    }

    #[test]
    fn volume_needs_one_source_and_local_needs_affinity() {
        let mut e = Vec::new();
        let pv =
            json!({"spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}});
        persistent_volume(&mut e, &pv, None);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].message, "Required value: must specify a volume type");

        let mut e = Vec::new();
        let pv = json!({"spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                                 "local": {"path": "/x"}}});
        persistent_volume(&mut e, &pv, None);
        assert_eq!(e[0].field, "spec.nodeAffinity");
    }

    #[test]
    fn storage_class_provisioner_is_required_and_immutable() {
        let mut e = Vec::new();
        storage_class(&mut e, &json!({}), None);
        assert_eq!(e[0].field, "provisioner");
        let old = json!({"provisioner": "a"});
        let mut e = Vec::new();
        storage_class(&mut e, &json!({"provisioner": "b"}), Some(&old));
        assert_eq!(
            e[0].message,
            "Forbidden: updates to provisioner are forbidden."
        );
    }
}
