//! Pods: the spec (containers, volumes, tolerations, restart and DNS policies), pod templates,
//! and which fields a pod update may change.

use serde_json::{json, Map, Value};
use setpoint_api::names;
use setpoint_api::Cause;
use std::collections::HashSet;

use super::container::container;
use super::fields::{
    arr, at, child, diff_paths, dns_label, dns_subdomain, entries, enum_field, index, int,
    not_supported, present, qualified_name, s, same, strip_nulls,
};
use super::meta::{annotations, labels};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ContainerKind {
    Regular,
    Init,
}

pub(super) fn pod(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    match old {
        None => {
            pod_spec(e, spec, "spec");
            if !arr(spec, "ephemeralContainers").is_empty() {
                e.push(Cause::forbidden(
                    "spec.ephemeralContainers",
                    "cannot be set on create",
                ));
            }
        }
        Some(old) => {
            let old_spec = at(old, "spec");
            // A spec the update leaves as it was (every status write, every label change) was
            // validated when it was written; upstream's status updates do not look at it either.
            if same(spec, old_spec) {
                return;
            }
            pod_spec(e, spec, "spec");
            pod_update(e, spec, old_spec);
        }
    }
}

const POD_UPDATE_MESSAGE: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// `ValidatePodUpdate`: a pod's spec is immutable except container images, a shorter
/// `activeDeadlineSeconds`, added tolerations and removed scheduling gates.
fn pod_update(e: &mut Vec<Cause>, new: &Value, old: &Value) {
    match (
        int(new, "activeDeadlineSeconds"),
        int(old, "activeDeadlineSeconds"),
    ) {
        (Some(n), _) if !(0..=i64::from(i32::MAX)).contains(&n) => {
            e.push(Cause::invalid(
                "spec.activeDeadlineSeconds",
                &json!(n),
                &names::inclusive_range_error(0, i64::from(i32::MAX)),
            ));
            return;
        }
        (Some(n), Some(o)) if n > o => {
            e.push(Cause::invalid(
                "spec.activeDeadlineSeconds",
                &json!(n),
                "must be less than or equal to previous value",
            ));
            return;
        }
        (None, Some(_)) => {
            e.push(Cause::invalid(
                "spec.activeDeadlineSeconds",
                &Value::Null,
                "must not update from a positive integer to nil value",
            ));
        }
        _ => {}
    }
    let mut munged = strip_nulls(new);
    let old = strip_nulls(old);
    let (Some(m), Some(o)) = (munged.as_object_mut(), old.as_object()) else {
        return;
    };
    for list in ["containers", "initContainers"] {
        let old_list = o.get(list).and_then(Value::as_array);
        if let (Some(new_list), Some(old_list)) =
            (m.get_mut(list).and_then(Value::as_array_mut), old_list)
        {
            if new_list.len() == old_list.len() {
                for (n, o) in new_list.iter_mut().zip(old_list) {
                    if let (Some(n), Some(img)) = (n.as_object_mut(), o.get("image")) {
                        n.insert("image".into(), img.clone());
                    }
                }
            }
        }
    }
    // Fields that may change (validated above) or that other endpoints own compare as the old.
    let take_old = |field: &str, m: &mut Map<String, Value>| match o.get(field) {
        Some(v) => {
            m.insert(field.into(), v.clone());
        }
        None => {
            m.remove(field);
        }
    };
    take_old("activeDeadlineSeconds", m);
    take_old("ephemeralContainers", m);
    let old_tolerations = o
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let new_tolerations = m
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if old_tolerations.iter().all(|t| new_tolerations.contains(t)) {
        take_old("tolerations", m);
    }
    let old_gates = o
        .get("schedulingGates")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let new_gates = m
        .get("schedulingGates")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if new_gates.iter().all(|g| old_gates.contains(g)) {
        take_old("schedulingGates", m);
    }
    let old_grace = o
        .get("terminationGracePeriodSeconds")
        .and_then(Value::as_i64);
    if old_grace.is_some_and(|g| g < 0)
        && m.get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            == Some(1)
    {
        take_old("terminationGracePeriodSeconds", m);
    }
    if munged != old {
        let mut changed = Vec::new();
        diff_paths(&old, &munged, "spec", &mut changed, 5);
        e.push(Cause::forbidden(
            "spec",
            &format!("{POD_UPDATE_MESSAGE}\n  changed: {}", changed.join(", ")),
        ));
    }
}

/// `ValidatePodTemplateSpec`: template labels and annotations (at `<path>.labels`, as upstream
/// names them) and the pod spec.
pub(super) fn pod_template(e: &mut Vec<Cause>, template: &Value, path: &str) {
    let meta = at(template, "metadata");
    labels(e, at(meta, "labels"), &child(path, "labels"));
    annotations(e, at(meta, "annotations"), &child(path, "annotations"));
    let spec = at(template, "spec");
    pod_spec(e, spec, &child(path, "spec"));
    if !arr(spec, "ephemeralContainers").is_empty() {
        e.push(Cause::forbidden(
            child(path, "spec.ephemeralContainers"),
            "ephemeral containers not allowed in pod template",
        ));
    }
}

fn pod_spec(e: &mut Vec<Cause>, spec: &Value, path: &str) {
    let mut volumes = HashSet::new();
    for (i, v) in arr(spec, "volumes").iter().enumerate() {
        volume(e, v, &index(&child(path, "volumes"), i), &mut volumes);
    }
    let containers = arr(spec, "containers");
    if containers.is_empty() {
        e.push(Cause::required(child(path, "containers"), ""));
    }
    let mut names_seen = HashSet::new();
    for (i, c) in containers.iter().enumerate() {
        container(
            e,
            c,
            &index(&child(path, "containers"), i),
            &volumes,
            &mut names_seen,
            ContainerKind::Regular,
        );
    }
    for (i, c) in arr(spec, "initContainers").iter().enumerate() {
        container(
            e,
            c,
            &index(&child(path, "initContainers"), i),
            &volumes,
            &mut names_seen,
            ContainerKind::Init,
        );
    }
    enum_field(
        e,
        s(spec, "restartPolicy"),
        &child(path, "restartPolicy"),
        &["Always", "OnFailure", "Never"],
    );
    enum_field(
        e,
        s(spec, "dnsPolicy"),
        &child(path, "dnsPolicy"),
        &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
    );
    labels(e, at(spec, "nodeSelector"), &child(path, "nodeSelector"));
    for (field, check) in [
        (
            "serviceAccountName",
            dns_subdomain as fn(&mut Vec<Cause>, &str, &str),
        ),
        ("nodeName", dns_subdomain),
        ("hostname", dns_label),
        ("subdomain", dns_label),
    ] {
        let v = s(spec, field);
        if !v.is_empty() {
            check(e, v, &child(path, field));
        }
    }
    if let Some(n) = int(spec, "activeDeadlineSeconds") {
        if !(1..=i64::from(i32::MAX)).contains(&n) {
            e.push(Cause::invalid(
                child(path, "activeDeadlineSeconds"),
                &json!(n),
                &names::inclusive_range_error(1, i64::from(i32::MAX)),
            ));
        }
    }
    for (i, t) in arr(spec, "tolerations").iter().enumerate() {
        toleration(e, t, &index(&child(path, "tolerations"), i));
    }
}

fn volume(e: &mut Vec<Cause>, v: &Value, path: &str, seen: &mut HashSet<String>) {
    let name = s(v, "name");
    if name.is_empty() {
        e.push(Cause::required(child(path, "name"), ""));
    } else {
        dns_label(e, name, &child(path, "name"));
        if !seen.insert(name.to_string()) {
            e.push(Cause::duplicate(child(path, "name"), &json!(name)));
        }
    }
    let sources: Vec<&String> = entries(v)
        .filter(|(k, x)| k.as_str() != "name" && !x.is_null())
        .map(|(k, _)| k)
        .collect();
    match sources.as_slice() {
        [] => e.push(Cause::required(path, "must specify a volume type")),
        [_] => {}
        [_, second, ..] => e.push(Cause::forbidden(
            child(path, second),
            "may not specify more than 1 volume type",
        )),
    }
}

fn toleration(e: &mut Vec<Cause>, t: &Value, path: &str) {
    let k = s(t, "key");
    if !k.is_empty() {
        qualified_name(e, k, &child(path, "key"));
    }
    let op = s(t, "operator");
    if k.is_empty() && op != "Exists" {
        e.push(Cause::invalid(
            child(path, "operator"),
            &json!(op),
            "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
        ));
    }
    match op {
        "" | "Equal" => {}
        "Exists" => {
            if !s(t, "value").is_empty() {
                e.push(Cause::invalid(
                    child(path, "operator"),
                    &json!(s(t, "value")),
                    "value must be empty when `operator` is 'Exists'",
                ));
            }
        }
        other => not_supported(e, child(path, "operator"), other, &["Equal", "Exists"]),
    }
    let effect = s(t, "effect");
    if !effect.is_empty() && !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
        not_supported(
            e,
            child(path, "effect"),
            effect,
            &["NoSchedule", "PreferNoSchedule", "NoExecute"],
        );
    }
    if present(t, "tolerationSeconds") && effect != "NoExecute" {
        e.push(Cause::invalid(
            child(path, "effect"),
            &json!(effect),
            "effect must be 'NoExecute' when `tolerationSeconds` is set",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testutil::{check, check_update, find, pod};

    #[test]
    fn pod_create_and_update() {
        assert_eq!(check("", "v1", "Pod", pod()), vec![]);
        let mut empty = pod();
        empty["spec"]["containers"] = json!([]);
        assert_eq!(
            find(&check("", "v1", "Pod", empty), "spec.containers").message,
            "Required value"
        );
        let mut bad_rp = pod();
        bad_rp["spec"]["restartPolicy"] = json!("Sometimes");
        find(&check("", "v1", "Pod", bad_rp), "spec.restartPolicy");

        let mut image = pod();
        image["spec"]["containers"][0]["image"] = json!("busybox:1.37");
        image["metadata"]["labels"] = json!({"new": "label"});
        image["spec"]["tolerations"] =
            json!([{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]);
        assert_eq!(check_update("", "v1", "Pod", pod(), image), vec![]);

        let mut port = pod();
        port["spec"]["containers"][0]["ports"][0]["containerPort"] = json!(9090);
        let causes = check_update("", "v1", "Pod", pod(), port);
        let c = find(&causes, "spec");
        assert_eq!(c.reason, "FieldValueForbidden");
        assert!(c.message.starts_with("Forbidden: pod updates may not change fields other than `spec.containers[*].image`"), "{}", c.message);
        assert!(c
            .message
            .contains("spec.containers[0].ports[0].containerPort"));

        let mut node = pod();
        node["spec"]["nodeName"] = json!("node-1");
        find(&check_update("", "v1", "Pod", pod(), node), "spec");

        let mut deadline = pod();
        deadline["spec"]["activeDeadlineSeconds"] = json!(100);
        let mut longer = deadline.clone();
        longer["spec"]["activeDeadlineSeconds"] = json!(200);
        let causes = check_update("", "v1", "Pod", deadline.clone(), longer);
        assert!(find(&causes, "spec.activeDeadlineSeconds")
            .message
            .ends_with("must be less than or equal to previous value"));
        let mut shorter = deadline.clone();
        shorter["spec"]["activeDeadlineSeconds"] = json!(50);
        assert_eq!(check_update("", "v1", "Pod", deadline, shorter), vec![]);
    }

    #[test]
    fn tolerations() {
        let mut p = pod();
        p["spec"]["tolerations"] = json!([
            {"operator": "Equal", "value": "x"},
            {"key": "a", "operator": "Exists", "value": "v"},
            {"key": "b", "operator": "Equal", "effect": "NoSchedule", "tolerationSeconds": 5},
            {"key": "c", "operator": "Maybe"}
        ]);
        let causes = check("", "v1", "Pod", p);
        assert!(find(&causes, "spec.tolerations[0].operator")
            .message
            .contains("operator must be Exists when `key` is empty"));
        assert!(find(&causes, "spec.tolerations[1].operator")
            .message
            .ends_with("value must be empty when `operator` is 'Exists'"));
        find(&causes, "spec.tolerations[2].effect");
        find(&causes, "spec.tolerations[3].operator");
    }
}
