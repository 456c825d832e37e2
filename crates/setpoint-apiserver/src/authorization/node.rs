//! The Node authorizer (`--authorization-mode=Node,RBAC` upstream): what a node agent, user
//! `system:node:<name>` in group `system:nodes`, may do.
//!
//! Secrets, ConfigMaps, PersistentVolumeClaims, PersistentVolumes and ServiceAccount tokens
//! are readable only when a pod bound to the node refers to them; a node's Lease is its own.
//! Every other request of a node is allowed when upstream's `system:node` rules allow it,
//! which is how upstream grants nodes their general permissions (the `system:node`
//! ClusterRoleBinding has no subjects). This follows upstream with the
//! `AuthorizeNodeWithSelectors` gate off: reads of pods and nodes are not narrowed by field
//! selectors, which the request attributes do not carry.
//!
//! Upstream keeps a graph of pod → object edges fed by informers. Here the relationships are
//! read from the watch cache per request, which costs only the node's pods in the object's
//! namespace: those requests come when a pod starts, not on every heartbeat.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;

use super::rbac::{PolicyRule, Rbac};
use super::{Attributes, Authorizer, Decision};
use crate::authentication::UserInfo;
use crate::watchcache::{Caches, Filter};

/// The user name prefix of node identities.
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The group every node is in.
pub const NODES_GROUP: &str = "system:nodes";
/// The namespace of nodes' heartbeat Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

const PODS: &str = "/registry/core/pods/";
const PVCS: &str = "/registry/core/persistentvolumeclaims/";

/// The node a user is, upstream's `NodeIdentity`: a `system:node:<name>` user in group
/// `system:nodes`. `Some("")` is a node identity without a name.
pub fn node_name(user: &UserInfo) -> Option<&str> {
    if !user.in_group(NODES_GROUP) {
        return None;
    }
    user.username.strip_prefix(NODE_USER_PREFIX)
}

/// The kinds of object a node reaches through its pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Referenced {
    /// A Secret.
    Secret,
    /// A ConfigMap.
    ConfigMap,
    /// A PersistentVolumeClaim.
    Claim,
    /// A PersistentVolume (through a claim's `spec.volumeName`).
    Volume,
    /// A ServiceAccount (tokens for it).
    ServiceAccount,
}

/// The names of the objects of `kind` one pod refers to (in the pod's namespace), as upstream's
/// pod visitors find them: volumes (projected ones too), `env[].valueFrom`, `envFrom`,
/// `imagePullSecrets` and the pod's ServiceAccount. Claims of generic ephemeral volumes are
/// named `<pod>-<volume>`. PersistentVolumes are not named by pods; see [`claims_volumes`].
pub fn pod_references(pod: &Value, kind: Referenced) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let spec = &pod["spec"];
    let mut add = |v: &Value| {
        if let Some(s) = v.as_str().filter(|s| !s.is_empty()) {
            out.insert(s.to_string());
        }
    };
    let containers = ["containers", "initContainers", "ephemeralContainers"]
        .into_iter()
        .flat_map(|f| spec[f].as_array().into_iter().flatten());
    let volumes = || spec["volumes"].as_array().into_iter().flatten();
    match kind {
        Referenced::Secret => {
            for s in spec["imagePullSecrets"].as_array().into_iter().flatten() {
                add(&s["name"]);
            }
            for c in containers {
                for e in c["env"].as_array().into_iter().flatten() {
                    add(&e["valueFrom"]["secretKeyRef"]["name"]);
                }
                for e in c["envFrom"].as_array().into_iter().flatten() {
                    add(&e["secretRef"]["name"]);
                }
            }
            for v in volumes() {
                add(&v["secret"]["secretName"]);
                add(&v["azureFile"]["secretName"]);
                add(&v["csi"]["nodePublishSecretRef"]["name"]);
                for source in [
                    "cephfs",
                    "cinder",
                    "flexVolume",
                    "iscsi",
                    "rbd",
                    "scaleIO",
                    "storageos",
                ] {
                    add(&v[source]["secretRef"]["name"]);
                }
                for p in v["projected"]["sources"].as_array().into_iter().flatten() {
                    add(&p["secret"]["name"]);
                }
            }
        }
        Referenced::ConfigMap => {
            for c in containers {
                for e in c["env"].as_array().into_iter().flatten() {
                    add(&e["valueFrom"]["configMapKeyRef"]["name"]);
                }
                for e in c["envFrom"].as_array().into_iter().flatten() {
                    add(&e["configMapRef"]["name"]);
                }
            }
            for v in volumes() {
                add(&v["configMap"]["name"]);
                for p in v["projected"]["sources"].as_array().into_iter().flatten() {
                    add(&p["configMap"]["name"]);
                }
            }
        }
        Referenced::Claim => {
            let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
            for v in volumes() {
                add(&v["persistentVolumeClaim"]["claimName"]);
                if v.get("ephemeral").is_some() {
                    // The claim of a generic ephemeral volume is named after pod and volume.
                    add(&Value::String(format!(
                        "{pod_name}-{}",
                        v["name"].as_str().unwrap_or_default()
                    )));
                }
            }
        }
        Referenced::ServiceAccount => add(&spec["serviceAccountName"]),
        Referenced::Volume => {}
    }
    out
}

/// The PersistentVolumes these claims are bound to (`spec.volumeName`).
pub fn claims_volumes<'a>(claims: impl IntoIterator<Item = &'a Value>) -> BTreeSet<String> {
    claims
        .into_iter()
        .filter_map(|c| c["spec"]["volumeName"].as_str())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// The Node authorizer over the server's caches.
pub struct NodeAuthorizer {
    caches: Arc<Caches>,
    /// Asked before refusing with a reason: a request RBAC allows goes on to RBAC, as
    /// upstream's union of authorizers lets the next one decide after a node's no-opinion.
    rbac: Rbac,
    /// Upstream's `system:node` rules, what nodes may do beyond the objects checked here.
    node_rules: Vec<PolicyRule>,
}

impl NodeAuthorizer {
    /// A Node authorizer reading pods from these caches, with upstream's `system:node` rules.
    pub fn new(caches: Arc<Caches>, rbac: Rbac) -> NodeAuthorizer {
        let node_rules = super::bootstrap::cluster_roles()
            .iter()
            .find(|r| r["metadata"]["name"] == "system:node")
            .map(PolicyRule::of)
            .unwrap_or_default();
        NodeAuthorizer {
            caches,
            rbac,
            node_rules,
        }
    }

    /// The pods bound to `node` in `namespace` (every namespace when empty).
    fn pods_on(&self, node: &str, namespace: &str) -> Vec<Value> {
        let cache = self.caches.get(PODS);
        let prefix = if namespace.is_empty() {
            PODS.to_string()
        } else {
            format!("{PODS}{namespace}/")
        };
        let node = node.to_string();
        let filter = Filter {
            namespace: None,
            name: None,
            predicate: Some(Box::new(move |a| a.field("spec.nodeName") == node)),
        };
        let (items, _) = cache.list(&prefix, &filter);
        items.iter().map(|o| o.object()).collect()
    }

    /// Whether a pod bound to `node` refers to the object.
    fn related(&self, node: &str, kind: Referenced, namespace: &str, name: &str) -> bool {
        if kind == Referenced::Volume {
            let pvcs = self.caches.get(PVCS);
            return self.pods_on(node, "").iter().any(|pod| {
                let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
                let claims: Vec<Value> = pod_references(pod, Referenced::Claim)
                    .iter()
                    .filter_map(|c| pvcs.get(&format!("{PVCS}{ns}/{c}")))
                    .map(|o| o.object())
                    .collect();
                claims_volumes(&claims).contains(name)
            });
        }
        self.pods_on(node, namespace)
            .iter()
            .any(|pod| pod_references(pod, kind).contains(name))
    }

    /// Upstream's `authorize`: a named object related to the node.
    fn related_object(&self, node: &str, kind: Referenced, a: &Attributes) -> Result<(), String> {
        if a.name.is_empty() {
            return Err("No Object name found".into());
        }
        if self.related(node, kind, &a.namespace, &a.name) {
            Ok(())
        } else {
            tracing::debug!(node, resource = %a.resource, namespace = %a.namespace, name = %a.name, "node authorizer: no relationship");
            Err(format!(
                "no relationship found between node '{node}' and this object"
            ))
        }
    }

    /// The node's own decision: `Ok` to allow, `Err(reason)` when it has no opinion (an
    /// empty reason when the request is none of its business).
    pub fn decide(&self, node: &str, a: &Attributes) -> Result<(), String> {
        if a.resource_request {
            match (a.api_group.as_str(), a.resource.as_str()) {
                ("", "secrets") => return self.read_namespaced(node, Referenced::Secret, a),
                ("", "configmaps") => return self.read_namespaced(node, Referenced::ConfigMap, a),
                ("", "persistentvolumeclaims") => {
                    if a.subresource == "status" {
                        if !matches!(a.verb.as_str(), "update" | "patch") {
                            return Err("can only get/update/patch this type".into());
                        }
                        return self.related_object(node, Referenced::Claim, a);
                    }
                    return self.get_only(node, Referenced::Claim, a);
                }
                ("", "persistentvolumes") => return self.get_only(node, Referenced::Volume, a),
                ("", "serviceaccounts") => {
                    if a.verb != "create" || a.name.is_empty() {
                        return Err("can only create tokens for individual service accounts".into());
                    }
                    if a.subresource != "token" {
                        return Err("can only create token subresource of serviceaccount".into());
                    }
                    return self.related_object(node, Referenced::ServiceAccount, a);
                }
                ("coordination.k8s.io", "leases") => return lease(node, a),
                _ => {}
            }
        }
        if self.node_rules.iter().any(|r| r.allows(a)) {
            Ok(())
        } else {
            Err(String::new())
        }
    }

    /// Upstream's `authorizeReadNamespacedObject`.
    fn read_namespaced(&self, node: &str, kind: Referenced, a: &Attributes) -> Result<(), String> {
        if !matches!(a.verb.as_str(), "get" | "list" | "watch") {
            return Err("can only read resources of this type".into());
        }
        if !a.subresource.is_empty() {
            return Err("cannot read subresource".into());
        }
        if a.namespace.is_empty() {
            return Err("can only read namespaced object of this type".into());
        }
        self.related_object(node, kind, a)
    }

    /// Upstream's `authorizeGet`.
    fn get_only(&self, node: &str, kind: Referenced, a: &Attributes) -> Result<(), String> {
        if a.verb != "get" {
            return Err("can only get individual resources of this type".into());
        }
        if !a.subresource.is_empty() {
            return Err("cannot get subresource".into());
        }
        self.related_object(node, kind, a)
    }
}

/// Upstream's `authorizeLease`: a node's own Lease in `kube-node-lease` (its name is checked
/// by NodeRestriction on create, when the authorizer cannot know it).
fn lease(node: &str, a: &Attributes) -> Result<(), String> {
    if !matches!(
        a.verb.as_str(),
        "get" | "create" | "update" | "patch" | "delete"
    ) {
        return Err("can only get, create, update, patch, or delete a node lease".into());
    }
    if a.namespace != NODE_LEASE_NAMESPACE {
        return Err(format!(
            "can only access leases in the {NODE_LEASE_NAMESPACE:?} system namespace"
        ));
    }
    if a.verb != "create" && a.name != node {
        return Err("can only access node lease with the same name as the requesting node".into());
    }
    Ok(())
}

impl Authorizer for NodeAuthorizer {
    fn authorize(&self, a: &Attributes) -> Decision {
        let Some(node) = node_name(&a.user) else {
            return Decision::NoOpinion;
        };
        if node.is_empty() {
            return Decision::NoOpinion;
        }
        match self.decide(node, a) {
            Ok(()) => Decision::Allow,
            Err(reason) if reason.is_empty() => Decision::NoOpinion,
            // Upstream answers "no opinion" with a reason and lets RBAC decide next; the 403
            // then carries the reason. Asking RBAC here gives the same outcome in a chain
            // whose no-opinion has no reason.
            Err(_) if self.rbac.policy().allows(a) => Decision::NoOpinion,
            Err(reason) => Decision::Deny(reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p", "namespace": "a"},
            "spec": {
                "nodeName": "n1",
                "serviceAccountName": "bot",
                "imagePullSecrets": [{"name": "pull"}],
                "containers": [{
                    "name": "c",
                    "env": [
                        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}},
                        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "k"}}},
                        {"name": "C", "value": "plain"}
                    ],
                    "envFrom": [{"secretRef": {"name": "from-secret"}}, {"configMapRef": {"name": "from-cm"}}]
                }],
                "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "init-secret"}}]}],
                "volumes": [
                    {"name": "s", "secret": {"secretName": "vol-secret"}},
                    {"name": "m", "configMap": {"name": "vol-cm"}},
                    {"name": "proj", "projected": {"sources": [
                        {"secret": {"name": "proj-secret"}},
                        {"configMap": {"name": "proj-cm"}},
                        {"serviceAccountToken": {"path": "t"}}
                    ]}},
                    {"name": "claim", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                    {"name": "csi", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi-secret"}}}
                ]
            }
        })
    }

    fn names(set: BTreeSet<String>) -> Vec<String> {
        set.into_iter().collect()
    }

    #[test]
    fn a_pods_references_are_found_where_upstream_looks() {
        let p = pod();
        assert_eq!(
            names(pod_references(&p, Referenced::Secret)),
            [
                "csi-secret",
                "env-secret",
                "from-secret",
                "init-secret",
                "proj-secret",
                "pull",
                "vol-secret"
            ]
        );
        assert_eq!(
            names(pod_references(&p, Referenced::ConfigMap)),
            ["env-cm", "from-cm", "proj-cm", "vol-cm"]
        );
        assert_eq!(
            names(pod_references(&p, Referenced::Claim)),
            ["data", "p-scratch"]
        );
        assert_eq!(
            names(pod_references(&p, Referenced::ServiceAccount)),
            ["bot"]
        );
        let claims = [json!({"spec": {"volumeName": "pv-1"}}), json!({"spec": {}})];
        assert_eq!(names(claims_volumes(&claims)), ["pv-1"]);
    }

    #[test]
    fn node_identity_needs_the_prefix_and_the_group() {
        let n = UserInfo::authenticated("system:node:n1", vec![NODES_GROUP.into()]);
        assert_eq!(node_name(&n), Some("n1"));
        let no_group = UserInfo::authenticated("system:node:n1", vec![]);
        assert_eq!(node_name(&no_group), None);
        let other = UserInfo::authenticated("alice", vec![NODES_GROUP.into()]);
        assert_eq!(node_name(&other), None);
    }

    fn attrs(verb: &str, group: &str, resource: &str, ns: &str, name: &str) -> Attributes {
        Attributes {
            user: Arc::new(UserInfo::authenticated(
                "system:node:n1",
                vec![NODES_GROUP.into()],
            )),
            verb: verb.into(),
            resource_request: true,
            api_group: group.into(),
            api_version: "v1".into(),
            resource: resource.into(),
            subresource: String::new(),
            namespace: ns.into(),
            name: name.into(),
            path: String::new(),
        }
    }

    #[test]
    fn a_node_reaches_only_its_own_lease() {
        let l = |verb, ns, name| {
            lease(
                "n1",
                &attrs(verb, "coordination.k8s.io", "leases", ns, name),
            )
        };
        assert_eq!(l("get", "kube-node-lease", "n1"), Ok(()));
        assert_eq!(l("create", "kube-node-lease", ""), Ok(()));
        assert_eq!(
            l("update", "kube-node-lease", "n2"),
            Err("can only access node lease with the same name as the requesting node".into())
        );
        assert_eq!(
            l("get", "default", "n1"),
            Err("can only access leases in the \"kube-node-lease\" system namespace".into())
        );
        assert_eq!(
            l("list", "kube-node-lease", ""),
            Err("can only get, create, update, patch, or delete a node lease".into())
        );
    }
}
