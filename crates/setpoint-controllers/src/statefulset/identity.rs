//! A StatefulSet pod's identity: its ordinal, its stable name (`<set>-<ordinal>`), its labels,
//! `hostname`/`subdomain`, and the claims (`<template>-<set>-<ordinal>`) its volumes name.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodTemplateSpec};
use serde_json::{json, Value};
use setpoint_api::selector::LabelSelector;
use setpoint_runtime::Object;

/// The label naming a StatefulSet pod (for per-pod Services).
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// The label carrying a StatefulSet pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// The label naming the ControllerRevision a pod was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// The first ordinal (`spec.ordinals.start`, 0 without it).
pub fn start_ordinal(set: &StatefulSet) -> i32 {
    set.spec
        .as_ref()
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .unwrap_or(0)
        .max(0)
}

/// `spec.replicas`, absent meaning 1.
pub fn replicas(set: &StatefulSet) -> i32 {
    setpoint_api::replicas::or_default(set.spec.as_ref().and_then(|s| s.replicas)).max(0)
}

/// Whether `ordinal` is one the set wants now: `start <= ordinal < start + replicas`.
pub fn in_range(set: &StatefulSet, ordinal: i32) -> bool {
    let start = start_ordinal(set);
    ordinal >= start && ordinal < start + replicas(set)
}

/// The name of the set's pod with `ordinal`.
pub fn pod_name(set_name: &str, ordinal: i32) -> String {
    format!("{set_name}-{ordinal}")
}

/// The ordinal of a pod named `<set_name>-<ordinal>`; `None` for any other name, so such a
/// pod is not a member of the set (upstream's `getParentNameAndOrdinal`).
pub fn ordinal_of(set_name: &str, pod_name: &str) -> Option<i32> {
    let digits = pod_name.strip_prefix(set_name)?.strip_prefix('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Upstream parses the ordinal as a signed 32-bit number; anything else is no member.
    digits.parse::<i32>().ok()
}

/// The name of the claim made from `template` for the set's pod with `ordinal`.
pub fn claim_name(template: &str, set_name: &str, ordinal: i32) -> String {
    format!("{template}-{set_name}-{ordinal}")
}

/// The set's label selector; one that cannot be parsed selects nothing.
pub fn selector(set: &StatefulSet) -> LabelSelector {
    let v = serde_json::to_value(set.spec.as_ref().map(|s| &s.selector)).unwrap_or(Value::Null);
    LabelSelector::from_label_selector_json(&v).unwrap_or_else(|_| LabelSelector::nothing())
}

/// Whether the set's (non-empty) selector matches `labels`.
pub fn selects(selector: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    !selector.is_empty() && selector.matches(|k| labels.and_then(|l| l.get(k)).map(String::as_str))
}

/// The revision (ControllerRevision name) a pod was made from.
pub fn pod_revision(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(REVISION_LABEL))
        .map(String::as_str)
}

/// The controller reference a StatefulSet puts on its pods and revisions.
pub fn owner_reference(set: &StatefulSet) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": set.name(),
        "uid": set.uid().unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// The identity labels a pod with `ordinal` must carry.
pub fn identity_labels(set_name: &str, ordinal: i32) -> [(&'static str, String); 2] {
    [
        (POD_NAME_LABEL, pod_name(set_name, ordinal)),
        (POD_INDEX_LABEL, ordinal.to_string()),
    ]
}

/// Whether a member pod carries its identity labels (an adopted pod may not).
pub fn identity_matches(set_name: &str, pod: &Pod, ordinal: i32) -> bool {
    let labels = pod.metadata.labels.as_ref();
    identity_labels(set_name, ordinal)
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(*k)) == Some(v))
}

/// The set's pod with `ordinal` made from `template` at the revision named `revision`:
/// template labels, annotations and finalizers, the identity labels, `hostname` (its name)
/// and `subdomain` (`spec.serviceName`), and one volume per claim template naming its claim.
pub fn new_pod(set: &StatefulSet, template: &PodTemplateSpec, ordinal: i32, revision: &str) -> Pod {
    let set_name = set.name();
    let name = pod_name(&set_name, ordinal);
    let meta = template.metadata.clone().unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    for (k, v) in identity_labels(&set_name, ordinal) {
        labels.insert(k.to_string(), v);
    }
    labels.insert(REVISION_LABEL.to_string(), revision.to_string());
    let mut spec = serde_json::to_value(template.spec.clone().unwrap_or_default())
        .unwrap_or_else(|_| json!({}));
    spec["hostname"] = json!(name);
    let service = set
        .spec
        .as_ref()
        .and_then(|s| s.service_name.clone())
        .unwrap_or_default();
    if !service.is_empty() {
        spec["subdomain"] = json!(service);
    }
    let templates = claim_templates(set);
    if !templates.is_empty() {
        // A claim template's volume replaces a template volume of the same name.
        let mut volumes: Vec<Value> = spec["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|v| {
                let n = v["name"].as_str().unwrap_or_default();
                !templates.iter().any(|t| t.name() == n)
            })
            .collect();
        for t in &templates {
            volumes.push(json!({
                "name": t.name(),
                "persistentVolumeClaim": {"claimName": claim_name(&t.name(), &set_name, ordinal)},
            }));
        }
        spec["volumes"] = json!(volumes);
    }
    let body = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": set.namespace(),
            "labels": labels,
            "annotations": meta.annotations,
            "finalizers": meta.finalizers,
            "ownerReferences": [owner_reference(set)],
        },
        "spec": spec,
    });
    serde_json::from_value(body).unwrap_or_default()
}

/// The set's `volumeClaimTemplates`.
pub fn claim_templates(set: &StatefulSet) -> Vec<PersistentVolumeClaim> {
    set.spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.clone())
        .unwrap_or_default()
}

/// The claims the pod with `ordinal` uses, as they are created: each template under its
/// claim name, with the template's labels plus the set's `matchLabels`, and no status.
pub fn new_claims(set: &StatefulSet, ordinal: i32) -> Vec<PersistentVolumeClaim> {
    let set_name = set.name();
    let match_labels = set
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    claim_templates(set)
        .into_iter()
        .map(|mut c| {
            let name = claim_name(&c.name(), &set_name, ordinal);
            let labels = c.metadata.labels.get_or_insert_with(Default::default);
            for (k, v) in &match_labels {
                labels.insert(k.clone(), v.clone());
            }
            c.metadata.name = Some(name);
            c.metadata.namespace = set.namespace();
            c.metadata.uid = None;
            c.metadata.resource_version = None;
            c.metadata.creation_timestamp = None;
            c.status = None;
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn set() -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "set-uid"},
            "spec": {
                "replicas": 3,
                "serviceName": "nginx",
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [{"name": "c", "image": "busybox"}],
                        "volumes": [{"name": "www", "emptyDir": {}}, {"name": "other", "emptyDir": {}}]
                    }
                },
                "volumeClaimTemplates": [{
                    "metadata": {"name": "www", "labels": {"kind": "data"}},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                    "status": {"phase": "Pending"}
                }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn ordinals_come_from_names_of_the_set_only() {
        assert_eq!(ordinal_of("web", "web-0"), Some(0));
        assert_eq!(ordinal_of("web", "web-12"), Some(12));
        assert_eq!(ordinal_of("web", "web-"), None);
        assert_eq!(ordinal_of("web", "web-x"), None);
        assert_eq!(ordinal_of("web", "webs-1"), None);
        assert_eq!(ordinal_of("web", "web-1-2"), None);
        assert_eq!(ordinal_of("web", "web-99999999999"), None);
    }

    #[test]
    fn a_new_pod_has_its_identity_and_claims() {
        let s = set();
        let template = s.spec.as_ref().unwrap().template.clone();
        let p = new_pod(&s, &template, 2, "web-abc");
        assert_eq!(p.metadata.name.as_deref(), Some("web-2"));
        let labels = p.metadata.labels.clone().unwrap();
        assert_eq!(labels[POD_NAME_LABEL], "web-2");
        assert_eq!(labels[POD_INDEX_LABEL], "2");
        assert_eq!(labels[REVISION_LABEL], "web-abc");
        assert_eq!(labels["app"], "web");
        let spec = p.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("web-2"));
        assert_eq!(spec.subdomain.as_deref(), Some("nginx"));
        let volumes = spec.volumes.unwrap();
        assert_eq!(volumes.len(), 2);
        assert_eq!(volumes[0].name, "other");
        let claim = volumes[1].persistent_volume_claim.as_ref().unwrap();
        assert_eq!(claim.claim_name, "www-web-2");
        let refs = p.metadata.owner_references.unwrap();
        assert_eq!(refs[0].uid, "set-uid");
        assert_eq!(refs[0].controller, Some(true));
        assert!(identity_matches("web", &new_pod(&s, &template, 1, "r"), 1));
    }

    #[test]
    fn claims_carry_the_selector_labels() {
        let c = new_claims(&set(), 1);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].metadata.name.as_deref(), Some("www-web-1"));
        let labels = c[0].metadata.labels.clone().unwrap();
        assert_eq!(
            (labels["app"].as_str(), labels["kind"].as_str()),
            ("web", "data")
        );
        assert!(c[0].status.is_none());
    }

    #[test]
    fn ordinal_range_starts_at_ordinals_start() {
        let mut s = set();
        s.spec.as_mut().unwrap().ordinals =
            Some(serde_json::from_value(json!({"start": 5})).unwrap());
        assert!(!in_range(&s, 0));
        assert!(in_range(&s, 5) && in_range(&s, 7));
        assert!(!in_range(&s, 8));
    }
}
