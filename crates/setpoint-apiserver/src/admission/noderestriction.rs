//! NodeRestriction admission, as upstream's plugin: what the Node authorizer cannot see,
//! because it is in the object written rather than in the request's path. A node
//! (`system:node:<name>` in `system:nodes`) may create and update only its own Node, without
//! touching the labels reserved to administrators, only its own Lease in `kube-node-lease`,
//! and only the status of pods bound to itself. Setpoint has no static pods, so a node
//! creates no pods at all (upstream allows mirror pods only).

use std::collections::BTreeSet;

use serde_json::Value;
use setpoint_api::{ApiError, GroupResource};

use crate::authentication::UserInfo;
use crate::authorization::node::{node_name, NODE_LEASE_NAMESPACE};
use crate::registry::ResourceDef;

/// Upstream's annotation of mirror pods.
pub(crate) const MIRROR_POD: &str = "kubernetes.io/config.mirror";

/// Labels in the `kubernetes.io` and `k8s.io` namespaces a node may set on itself (upstream's
/// `kubeletLabels`).
const NODE_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
];

/// Label namespaces a node may use freely (upstream's `kubeletLabelNamespaces`), with their
/// subdomains.
const NODE_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// The namespace reserved to administrators, with its subdomains.
const RESTRICTED_NAMESPACE: &str = "node-restriction.kubernetes.io";

fn in_namespace(namespace: &str, domain: &str) -> bool {
    namespace == domain || namespace.ends_with(&format!(".{domain}"))
}

/// Whether a node may set or change this label on its Node (upstream's `getForbiddenLabels`).
pub fn node_may_set_label(key: &str) -> bool {
    let Some((namespace, _)) = key.split_once('/') else {
        return true;
    };
    if in_namespace(namespace, RESTRICTED_NAMESPACE) {
        return false;
    }
    if in_namespace(namespace, "kubernetes.io") || in_namespace(namespace, "k8s.io") {
        return NODE_LABELS.contains(&key)
            || NODE_LABEL_NAMESPACES
                .iter()
                .any(|d| in_namespace(namespace, d));
    }
    true
}

fn labels(obj: &Value) -> serde_json::Map<String, Value> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// The labels a write sets, changes or removes (all of them on create).
fn modified_labels(new: &Value, old: Option<&Value>) -> BTreeSet<String> {
    let new = labels(new);
    let old = old.map(labels).unwrap_or_default();
    new.iter()
        .filter(|(k, v)| old.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .chain(old.keys().filter(|k| !new.contains_key(*k)).cloned())
        .collect()
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Checks a write of `obj` (over `old` for an update; `status` when it is a write of the
/// status subresource) by `user`. `Ok` for everyone but nodes.
pub fn admit(
    res: &ResourceDef,
    namespace: &str,
    obj: &Value,
    old: Option<&Value>,
    status: bool,
    user: Option<&UserInfo>,
) -> Result<(), ApiError> {
    let Some(node) = user.and_then(node_name) else {
        return Ok(());
    };
    let name = str_at(obj, "/metadata/name");
    let forbidden = |message: String| {
        let gr = GroupResource {
            group: res.group.clone(),
            resource: res.plural.clone(),
        };
        Err(ApiError::forbidden(&gr, name, &message))
    };
    if node.is_empty() {
        return forbidden("could not determine node from user \"\"".into());
    }
    match (res.group.as_str(), res.plural.as_str()) {
        ("", "pods") => {
            if status {
                if str_at(old.unwrap_or(obj), "/spec/nodeName") != node {
                    return forbidden(format!(
                        "node {node:?} can only update pod status for pods with spec.nodeName set to itself"
                    ));
                }
                return Ok(());
            }
            if old.is_some() {
                return forbidden(format!(
                    "unexpected operation \"UPDATE\", node {node:?} can only create and delete mirror pods"
                ));
            }
            if obj
                .pointer(&format!(
                    "/metadata/annotations/{}",
                    MIRROR_POD.replace('/', "~1")
                ))
                .is_none()
            {
                return forbidden(format!(
                    "pod does not have {MIRROR_POD:?} annotation, node {node:?} can only create mirror pods"
                ));
            }
            if str_at(obj, "/spec/nodeName") != node {
                return forbidden(format!(
                    "node {node:?} can only create pods with spec.nodeName set to itself"
                ));
            }
            // Setpoint runs no static pods, so a mirror pod would mirror nothing; refusing
            // it keeps a node from reaching Secrets through a pod it made up.
            forbidden(format!(
                "node {node:?} can not create mirror pods: this cluster runs no static pods"
            ))
        }
        ("", "nodes") => {
            if name != node {
                return forbidden(format!(
                    "node {node:?} is not allowed to modify node {name:?}"
                ));
            }
            let refused: Vec<String> = modified_labels(obj, old)
                .into_iter()
                .filter(|k| !node_may_set_label(k))
                .collect();
            if !refused.is_empty() {
                let what = if old.is_some() { "modify" } else { "set" };
                return forbidden(format!(
                    "node {node:?} is not allowed to {what} the following labels: {}",
                    refused.join(", ")
                ));
            }
            if let Some(old) = old {
                if obj.pointer("/spec/taints") != old.pointer("/spec/taints") {
                    return forbidden(format!("node {node:?} is not allowed to modify taints"));
                }
            }
            Ok(())
        }
        ("coordination.k8s.io", "leases") => {
            if namespace != NODE_LEASE_NAMESPACE {
                return forbidden(format!(
                    "can only access leases in the {NODE_LEASE_NAMESPACE:?} system namespace"
                ));
            }
            if old.is_none() && name != node {
                return forbidden(
                    "can only access node lease with the same name as the requesting node".into(),
                );
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Checks a delete of `obj` by `user`: a node deletes only pods bound to itself, and no Node
/// but its own. `Ok` for everyone but nodes.
pub fn admit_delete(
    res: &ResourceDef,
    obj: &Value,
    user: Option<&UserInfo>,
) -> Result<(), ApiError> {
    let Some(node) = user.and_then(node_name) else {
        return Ok(());
    };
    let name = str_at(obj, "/metadata/name");
    let gr = GroupResource {
        group: res.group.clone(),
        resource: res.plural.clone(),
    };
    match (res.group.as_str(), res.plural.as_str()) {
        ("", "pods") if str_at(obj, "/spec/nodeName") != node => Err(ApiError::forbidden(
            &gr,
            name,
            &format!("node {node:?} can only delete pods with spec.nodeName set to itself"),
        )),
        ("", "nodes") if name != node => Err(ApiError::forbidden(
            &gr,
            name,
            &format!("node {node:?} is not allowed to modify node {name:?}"),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_may_set_only_upstreams_labels() {
        for allowed in [
            "kubernetes.io/hostname",
            "topology.kubernetes.io/zone",
            "node.kubernetes.io/exclude-from-external-load-balancers",
            "foo.node.kubernetes.io/bar",
            "kubelet.kubernetes.io/x",
            "example.com/team",
            "plain",
        ] {
            assert!(node_may_set_label(allowed), "{allowed}");
        }
        for refused in [
            "node-restriction.kubernetes.io/trusted",
            "a.node-restriction.kubernetes.io/x",
            "node-role.kubernetes.io/control-plane",
            "kubernetes.io/role",
            "k8s.io/x",
            "x.k8s.io/y",
        ] {
            assert!(!node_may_set_label(refused), "{refused}");
        }
    }

    #[test]
    fn modified_labels_are_the_changed_added_and_removed_ones() {
        let old = serde_json::json!({"metadata": {"labels": {"a": "1", "b": "2", "c": "3"}}});
        let new = serde_json::json!({"metadata": {"labels": {"a": "1", "b": "9", "d": "4"}}});
        assert_eq!(
            modified_labels(&new, Some(&old))
                .into_iter()
                .collect::<Vec<_>>(),
            ["b", "c", "d"]
        );
        assert_eq!(modified_labels(&new, None).len(), 3);
    }
}
