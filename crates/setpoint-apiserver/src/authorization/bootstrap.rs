//! Upstream's bootstrap RBAC policy (`cluster-admin`, the aggregated `admin`/`edit`/`view`,
//! the discovery, basic-user and public-info roles, the node, controller-manager and scheduler
//! roles, and their ClusterRoleBindings), reconciled at every start as kube-apiserver's
//! `rbac/bootstrap-roles` post-start hook does: what is missing is created, missing rules,
//! aggregation selectors, subjects, labels and annotations are added to what exists, and
//! nothing is removed. An object annotated `rbac.authorization.kubernetes.io/autoupdate:
//! "false"` is left as its owner made it.

use serde_json::{json, Map, Value};
use setpoint_api::ApiError;

use super::escalation::covers;
use super::rbac::{PolicyRule, GROUP};
use crate::objects::{DeleteOptions, WriteOptions};
use crate::state::ApiServer;
use crate::strategy::View;

/// The label every bootstrap object carries.
pub const BOOTSTRAPPING_LABEL: (&str, &str) = ("kubernetes.io/bootstrapping", "rbac-defaults");
/// The annotation that keeps reconciliation away from an object when `"false"`.
pub const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];
const READ_WRITE: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// A resource rule.
fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
    PolicyRule {
        verbs: strings(verbs),
        api_groups: strings(groups),
        resources: strings(resources),
        ..PolicyRule::default()
    }
}

/// A resource rule limited to these names.
fn named(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> PolicyRule {
    PolicyRule {
        resource_names: strings(names),
        ..rule(verbs, groups, resources)
    }
}

/// A non-resource rule.
fn urls(verbs: &[&str], paths: &[&str]) -> PolicyRule {
    PolicyRule {
        verbs: strings(verbs),
        non_resource_urls: strings(paths),
        ..PolicyRule::default()
    }
}

/// Writing events, in both groups that serve them (upstream's `eventsRule`).
fn events() -> PolicyRule {
    rule(
        &["create", "update", "patch"],
        &["", "events.k8s.io"],
        &["events"],
    )
}

/// One bootstrap ClusterRole.
struct Role {
    name: &'static str,
    /// Extra labels (the aggregation label of roles that feed another).
    labels: &'static [(&'static str, &'static str)],
    /// For aggregated roles: the label the aggregated roles carry (`…=true`).
    aggregate_from: Option<&'static str>,
    rules: Vec<PolicyRule>,
}

fn role(name: &'static str, rules: Vec<PolicyRule>) -> Role {
    Role {
        name,
        labels: &[],
        aggregate_from: None,
        rules,
    }
}

const TO_ADMIN: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
const TO_EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
const TO_VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";

/// The bootstrap ClusterRoles, with upstream's names and rules.
fn roles() -> Vec<Role> {
    let nodes = vec![
        rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
        rule(
            &["create"],
            &["authorization.k8s.io"],
            &["subjectaccessreviews", "localsubjectaccessreviews"],
        ),
        rule(READ, &[""], &["services"]),
        rule(&["create", "get", "list", "watch"], &[""], &["nodes"]),
        rule(&["update", "patch"], &[""], &["nodes/status"]),
        rule(&["update", "patch"], &[""], &["nodes"]),
        rule(&["create", "update", "patch"], &[""], &["events"]),
        rule(READ, &[""], &["pods"]),
        rule(&["create", "delete"], &[""], &["pods"]),
        rule(&["update", "patch"], &[""], &["pods/status"]),
        rule(&["create"], &[""], &["pods/eviction"]),
        rule(READ, &[""], &["secrets", "configmaps"]),
        rule(
            &["get"],
            &[""],
            &["persistentvolumeclaims", "persistentvolumes"],
        ),
        rule(&["get"], &[""], &["endpoints"]),
        rule(
            &["create", "get", "list", "watch"],
            &["certificates.k8s.io"],
            &["certificatesigningrequests"],
        ),
        rule(
            &["get", "create", "update", "patch", "delete"],
            &["coordination.k8s.io"],
            &["leases"],
        ),
        rule(
            &["get", "update", "patch"],
            &[""],
            &["persistentvolumeclaims/status"],
        ),
        rule(&["create"], &[""], &["serviceaccounts/token"]),
    ];
    vec![
        role(
            "cluster-admin",
            vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])],
        ),
        role(
            "system:discovery",
            vec![urls(
                &["get"],
                &[
                    "/livez",
                    "/readyz",
                    "/healthz",
                    "/version",
                    "/version/",
                    "/openapi",
                    "/openapi/*",
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                ],
            )],
        ),
        role(
            "system:basic-user",
            vec![
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                // `kubectl auth whoami`.
                rule(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
            ],
        ),
        role(
            "system:public-info-viewer",
            vec![urls(
                &["get"],
                &["/livez", "/readyz", "/healthz", "/version", "/version/"],
            )],
        ),
        // Setpoint's own: any component (a controller manager, a scheduler, a node agent, a
        // user's operator) may report its decision records; the server stamps each with the
        // reporting user. Reading the trail (`/debug/setpoint/why`) stays with cluster-admin.
        role(
            "setpoint:decision-reporter",
            vec![urls(&["post"], &[setpoint_api::trail::DECISIONS_PATH])],
        ),
        Role {
            name: "admin",
            labels: &[],
            aggregate_from: Some(TO_ADMIN),
            rules: vec![],
        },
        Role {
            name: "edit",
            labels: &[(TO_ADMIN, "true")],
            aggregate_from: Some(TO_EDIT),
            rules: vec![],
        },
        Role {
            name: "view",
            labels: &[(TO_EDIT, "true")],
            aggregate_from: Some(TO_VIEW),
            rules: vec![],
        },
        Role {
            name: "system:aggregate-to-admin",
            labels: &[(TO_ADMIN, "true")],
            aggregate_from: None,
            rules: vec![
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["localsubjectaccessreviews"],
                ),
                rule(READ_WRITE, &[GROUP], &["roles", "rolebindings"]),
            ],
        },
        Role {
            name: "system:aggregate-to-edit",
            labels: &[(TO_EDIT, "true")],
            aggregate_from: None,
            rules: vec![
                rule(
                    READ,
                    &[""],
                    &[
                        "pods/attach",
                        "pods/proxy",
                        "pods/exec",
                        "pods/portforward",
                        "secrets",
                        "services/proxy",
                    ],
                ),
                rule(&["impersonate"], &[""], &["serviceaccounts"]),
                rule(
                    WRITE,
                    &[""],
                    &[
                        "pods",
                        "pods/attach",
                        "pods/proxy",
                        "pods/exec",
                        "pods/portforward",
                    ],
                ),
                rule(&["create"], &[""], &["pods/eviction"]),
                rule(
                    WRITE,
                    &[""],
                    &[
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "serviceaccounts",
                        "services",
                        "services/proxy",
                        "persistentvolumeclaims",
                        "configmaps",
                        "secrets",
                    ],
                ),
                rule(&["create"], &[""], &["serviceaccounts/token"]),
                rule(
                    WRITE,
                    &["apps"],
                    &[
                        "statefulsets",
                        "statefulsets/scale",
                        "daemonsets",
                        "deployments",
                        "deployments/scale",
                        "deployments/rollback",
                        "replicasets",
                        "replicasets/scale",
                    ],
                ),
                rule(WRITE, &["autoscaling"], &["horizontalpodautoscalers"]),
                rule(WRITE, &["batch"], &["jobs", "cronjobs"]),
                rule(
                    WRITE,
                    &["extensions"],
                    &[
                        "daemonsets",
                        "deployments",
                        "deployments/scale",
                        "deployments/rollback",
                        "ingresses",
                        "replicasets",
                        "replicasets/scale",
                        "replicationcontrollers/scale",
                        "networkpolicies",
                    ],
                ),
                rule(WRITE, &["policy"], &["poddisruptionbudgets"]),
                rule(
                    WRITE,
                    &["networking.k8s.io"],
                    &["networkpolicies", "ingresses"],
                ),
            ],
        },
        // metrics-server's role: reading the resource metrics API, for every viewer.
        Role {
            name: "system:aggregated-metrics-reader",
            labels: &[(TO_VIEW, "true"), (TO_EDIT, "true"), (TO_ADMIN, "true")],
            aggregate_from: None,
            rules: vec![rule(READ, &["metrics.k8s.io"], &["pods", "nodes"])],
        },
        Role {
            name: "system:aggregate-to-view",
            labels: &[(TO_VIEW, "true")],
            aggregate_from: None,
            rules: vec![
                rule(
                    READ,
                    &[""],
                    &[
                        "pods",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "serviceaccounts",
                        "services",
                        "services/status",
                        "endpoints",
                        "persistentvolumeclaims",
                        "persistentvolumeclaims/status",
                        "configmaps",
                    ],
                ),
                rule(
                    READ,
                    &[""],
                    &[
                        "limitranges",
                        "resourcequotas",
                        "bindings",
                        "events",
                        "pods/status",
                        "resourcequotas/status",
                        "namespaces/status",
                        "replicationcontrollers/status",
                        "pods/log",
                    ],
                ),
                rule(READ, &[""], &["namespaces"]),
                rule(READ, &["discovery.k8s.io"], &["endpointslices"]),
                rule(
                    READ,
                    &["apps"],
                    &[
                        "controllerrevisions",
                        "statefulsets",
                        "statefulsets/status",
                        "statefulsets/scale",
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/status",
                        "deployments/scale",
                        "replicasets",
                        "replicasets/status",
                        "replicasets/scale",
                    ],
                ),
                rule(
                    READ,
                    &["autoscaling"],
                    &[
                        "horizontalpodautoscalers",
                        "horizontalpodautoscalers/status",
                    ],
                ),
                rule(
                    READ,
                    &["batch"],
                    &["jobs", "cronjobs", "cronjobs/status", "jobs/status"],
                ),
                rule(
                    READ,
                    &["extensions"],
                    &[
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/scale",
                        "deployments/status",
                        "ingresses",
                        "ingresses/status",
                        "replicasets",
                        "replicasets/scale",
                        "replicasets/status",
                        "replicationcontrollers/scale",
                        "networkpolicies",
                    ],
                ),
                rule(
                    READ,
                    &["policy"],
                    &["poddisruptionbudgets", "poddisruptionbudgets/status"],
                ),
                rule(
                    READ,
                    &["networking.k8s.io"],
                    &["networkpolicies", "ingresses", "ingresses/status"],
                ),
            ],
        },
        role("system:node", nodes),
        // What kube-proxy reads and writes; Setpoint's node agents run the proxy as the node.
        role(
            "system:node-proxier",
            vec![
                rule(&["list", "watch"], &[""], &["endpoints", "services"]),
                rule(READ, &[""], &["nodes"]),
                rule(
                    &["create", "patch", "update"],
                    &["", "events.k8s.io"],
                    &["events"],
                ),
                rule(
                    &["list", "watch"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
            ],
        ),
        role(
            "system:node-bootstrapper",
            vec![rule(
                &["create", "get", "list", "watch"],
                &["certificates.k8s.io"],
                &["certificatesigningrequests"],
            )],
        ),
        role(
            "system:auth-delegator",
            vec![
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
            ],
        ),
        role(
            "system:kube-controller-manager",
            vec![
                events(),
                rule(&["create"], &["coordination.k8s.io"], &["leases"]),
                named(
                    &["get", "update"],
                    &["coordination.k8s.io"],
                    &["leases"],
                    &["kube-controller-manager"],
                ),
                rule(&["create"], &[""], &["endpoints"]),
                named(
                    &["get", "update"],
                    &[""],
                    &["endpoints"],
                    &["kube-controller-manager"],
                ),
                rule(&["create"], &[""], &["secrets", "serviceaccounts"]),
                rule(&["delete"], &[""], &["secrets"]),
                rule(
                    &["get"],
                    &[""],
                    &["namespaces", "secrets", "serviceaccounts", "configmaps"],
                ),
                rule(&["update"], &[""], &["secrets", "serviceaccounts"]),
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
                rule(&["list", "watch"], &["*"], &["*"]),
                rule(&["create"], &[""], &["serviceaccounts/token"]),
            ],
        ),
        role(
            "system:kube-scheduler",
            vec![
                events(),
                rule(&["create"], &["coordination.k8s.io"], &["leases"]),
                named(
                    &["get", "update"],
                    &["coordination.k8s.io"],
                    &["leases"],
                    &["kube-scheduler"],
                ),
                rule(&["create"], &[""], &["endpoints"]),
                named(
                    &["get", "update"],
                    &[""],
                    &["endpoints"],
                    &["kube-scheduler"],
                ),
                rule(READ, &[""], &["nodes"]),
                rule(&["get", "list", "watch", "delete"], &[""], &["pods"]),
                rule(&["create"], &[""], &["pods/binding", "bindings"]),
                rule(&["patch", "update"], &[""], &["pods/status"]),
                rule(READ, &[""], &["services", "replicationcontrollers"]),
                rule(READ, &["apps", "extensions"], &["replicasets"]),
                rule(READ, &["apps"], &["statefulsets"]),
                rule(READ, &["policy"], &["poddisruptionbudgets"]),
                rule(
                    READ,
                    &[""],
                    &["persistentvolumeclaims", "persistentvolumes"],
                ),
                rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
                rule(READ, &["storage.k8s.io"], &["csinodes"]),
                rule(READ, &[""], &["namespaces"]),
                rule(READ, &["storage.k8s.io"], &["csidrivers"]),
                rule(READ, &["storage.k8s.io"], &["csistoragecapacities"]),
            ],
        ),
        role(
            "system:volume-scheduler",
            vec![
                rule(
                    &["get", "list", "watch", "update", "patch"],
                    &[""],
                    &["persistentvolumes"],
                ),
                rule(READ, &["storage.k8s.io"], &["storageclasses"]),
                rule(
                    &["get", "list", "watch", "update", "patch"],
                    &[""],
                    &["persistentvolumeclaims"],
                ),
            ],
        ),
        role(
            "system:service-account-issuer-discovery",
            vec![urls(
                &["get"],
                &["/.well-known/openid-configuration", "/openid/v1/jwks"],
            )],
        ),
        role(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            vec![rule(
                &["create"],
                &["certificates.k8s.io"],
                &["certificatesigningrequests/nodeclient"],
            )],
        ),
        role(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            vec![rule(
                &["create"],
                &["certificates.k8s.io"],
                &["certificatesigningrequests/selfnodeclient"],
            )],
        ),
        role(
            "system:certificates.k8s.io:kube-apiserver-client-approver",
            vec![named(
                &["approve"],
                &["certificates.k8s.io"],
                &["signers"],
                &["kubernetes.io/kube-apiserver-client"],
            )],
        ),
        role(
            "system:certificates.k8s.io:kube-apiserver-client-kubelet-approver",
            vec![named(
                &["approve"],
                &["certificates.k8s.io"],
                &["signers"],
                &["kubernetes.io/kube-apiserver-client-kubelet"],
            )],
        ),
    ]
}

/// The prefix of the per-controller roles, each bound to the ServiceAccount `kube-system/<rest
/// of the name>` a controller manager with `--use-service-account-credentials` runs it as.
const CONTROLLER_PREFIX: &str = "system:controller:";

/// Upstream's roles of the controllers Setpoint runs (and of the CSR controllers).
fn controller_roles() -> Vec<Role> {
    let c = |name: &'static str, mut rules: Vec<PolicyRule>, events_too: bool| {
        if events_too {
            rules.push(events());
        }
        role(name, rules)
    };
    vec![
        c(
            "system:controller:clusterrole-aggregation-controller",
            vec![rule(
                &["escalate", "get", "list", "watch", "update", "patch"],
                &[GROUP],
                &["clusterroles"],
            )],
            false,
        ),
        c(
            "system:controller:cronjob-controller",
            vec![
                rule(
                    &["get", "list", "watch", "update"],
                    &["batch"],
                    &["cronjobs"],
                ),
                rule(
                    &[
                        "get", "list", "watch", "create", "update", "delete", "patch",
                    ],
                    &["batch"],
                    &["jobs"],
                ),
                rule(&["update"], &["batch"], &["cronjobs/status"]),
                rule(&["update"], &["batch"], &["cronjobs/finalizers"]),
                rule(&["list", "watch", "delete"], &[""], &["pods"]),
            ],
            true,
        ),
        c(
            "system:controller:daemon-set-controller",
            vec![
                rule(
                    &["get", "list", "watch"],
                    &["extensions", "apps"],
                    &["daemonsets"],
                ),
                rule(&["update"], &["extensions", "apps"], &["daemonsets/status"]),
                rule(
                    &["update"],
                    &["extensions", "apps"],
                    &["daemonsets/finalizers"],
                ),
                rule(&["list", "watch"], &[""], &["nodes"]),
                rule(
                    &["list", "watch", "create", "delete", "patch"],
                    &[""],
                    &["pods"],
                ),
                rule(&["create"], &[""], &["pods/binding"]),
                rule(
                    &[
                        "get", "list", "watch", "create", "delete", "update", "patch",
                    ],
                    &["apps"],
                    &["controllerrevisions"],
                ),
            ],
            true,
        ),
        c(
            "system:controller:deployment-controller",
            vec![
                rule(
                    &["get", "list", "watch", "update"],
                    &["extensions", "apps"],
                    &["deployments"],
                ),
                rule(
                    &["update"],
                    &["extensions", "apps"],
                    &["deployments/status"],
                ),
                rule(
                    &["update"],
                    &["extensions", "apps"],
                    &["deployments/finalizers"],
                ),
                rule(
                    &[
                        "get", "list", "watch", "create", "update", "patch", "delete",
                    ],
                    &["apps", "extensions"],
                    &["replicasets"],
                ),
                rule(&["get", "list", "watch", "update"], &[""], &["pods"]),
            ],
            true,
        ),
        c(
            "system:controller:generic-garbage-collector",
            vec![rule(
                &["get", "list", "watch", "patch", "update", "delete"],
                &["*"],
                &["*"],
            )],
            true,
        ),
        c(
            "system:controller:horizontal-pod-autoscaler",
            vec![
                rule(
                    &["get", "list", "watch"],
                    &["autoscaling"],
                    &["horizontalpodautoscalers"],
                ),
                rule(
                    &["update"],
                    &["autoscaling"],
                    &["horizontalpodautoscalers/status"],
                ),
                rule(&["get", "update"], &["*"], &["*/scale"]),
                rule(&["list"], &[""], &["pods"]),
                named(
                    &["get"],
                    &[""],
                    &["services"],
                    &["https:heapster:", "http:heapster:"],
                ),
                rule(&["list"], &["metrics.k8s.io"], &["pods"]),
                rule(&["get", "list"], &["custom.metrics.k8s.io"], &["*"]),
                rule(&["get", "list"], &["external.metrics.k8s.io"], &["*"]),
            ],
            true,
        ),
        c(
            "system:controller:job-controller",
            vec![
                rule(
                    &["get", "list", "watch", "update", "patch"],
                    &["batch"],
                    &["jobs"],
                ),
                rule(&["update"], &["batch"], &["jobs/status"]),
                rule(&["update"], &["batch"], &["jobs/finalizers"]),
                rule(
                    &["list", "watch", "create", "delete", "patch"],
                    &[""],
                    &["pods"],
                ),
            ],
            true,
        ),
        c(
            "system:controller:namespace-controller",
            vec![
                rule(&["get", "list", "watch", "delete"], &[""], &["namespaces"]),
                rule(
                    &["update"],
                    &[""],
                    &["namespaces/finalize", "namespaces/status"],
                ),
                rule(
                    &["get", "list", "watch", "delete", "deletecollection"],
                    &["*"],
                    &["*"],
                ),
            ],
            false,
        ),
        c(
            "system:controller:node-controller",
            vec![
                rule(
                    &["get", "list", "watch", "update", "delete", "patch"],
                    &[""],
                    &["nodes"],
                ),
                rule(&["patch", "update"], &[""], &["nodes/status"]),
                rule(&["patch", "update"], &[""], &["pods/status"]),
                rule(&["list", "watch", "get", "delete"], &[""], &["pods"]),
            ],
            true,
        ),
        c(
            "system:controller:endpoint-controller",
            vec![
                rule(&["get", "list", "watch"], &[""], &["services", "pods"]),
                rule(
                    &["get", "list", "create", "update", "delete"],
                    &[""],
                    &["endpoints"],
                ),
                rule(&["create"], &[""], &["endpoints/restricted"]),
            ],
            true,
        ),
        c(
            "system:controller:endpointslice-controller",
            vec![
                rule(
                    &["get", "list", "watch"],
                    &[""],
                    &["services", "pods", "nodes"],
                ),
                // Slices carry blockOwnerDeletion on their Service's reference.
                rule(&["update"], &[""], &["services/finalizers"]),
                rule(
                    &["get", "list", "create", "update", "delete"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
            ],
            true,
        ),
        c(
            "system:controller:endpointslicemirroring-controller",
            vec![
                rule(&["get", "list", "watch"], &[""], &["services", "endpoints"]),
                // Mirrored slices carry blockOwnerDeletion on their Endpoints' reference.
                rule(&["update"], &[""], &["endpoints/finalizers"]),
                rule(
                    &["get", "list", "create", "update", "delete"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
            ],
            true,
        ),
        c(
            "system:controller:replicaset-controller",
            vec![
                rule(
                    &["get", "list", "watch", "update"],
                    &["apps", "extensions"],
                    &["replicasets"],
                ),
                rule(
                    &["update"],
                    &["apps", "extensions"],
                    &["replicasets/status"],
                ),
                rule(
                    &["update"],
                    &["apps", "extensions"],
                    &["replicasets/finalizers"],
                ),
                rule(
                    &["list", "watch", "patch", "create", "delete"],
                    &[""],
                    &["pods"],
                ),
            ],
            true,
        ),
        c(
            "system:controller:replication-controller",
            vec![
                rule(
                    &["get", "list", "watch", "update"],
                    &[""],
                    &["replicationcontrollers"],
                ),
                rule(&["update"], &[""], &["replicationcontrollers/status"]),
                rule(&["update"], &[""], &["replicationcontrollers/finalizers"]),
                rule(
                    &["list", "watch", "patch", "create", "delete"],
                    &[""],
                    &["pods"],
                ),
            ],
            true,
        ),
        c(
            "system:controller:service-controller",
            vec![
                rule(&["get", "list", "watch"], &[""], &["services"]),
                rule(&["patch", "update"], &[""], &["services"]),
                rule(&["patch", "update"], &[""], &["services/status"]),
                rule(&["list", "watch"], &[""], &["nodes"]),
                // Setpoint's built-in balancer: a `Local` policy's ingress is the nodes
                // holding its endpoints.
                rule(
                    &["list", "watch"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
            ],
            true,
        ),
        c(
            "system:controller:ttl-after-finished-controller",
            vec![rule(
                &["get", "list", "watch", "delete"],
                &["batch"],
                &["jobs"],
            )],
            true,
        ),
        c(
            "system:controller:pod-garbage-collector",
            vec![
                rule(&["list", "watch", "delete"], &[""], &["pods"]),
                rule(&["get", "list", "watch"], &[""], &["nodes"]),
                rule(&["patch"], &[""], &["pods/status"]),
            ],
            false,
        ),
        c(
            "system:controller:disruption-controller",
            vec![
                rule(
                    &["get", "list", "watch"],
                    &["extensions", "apps"],
                    &["deployments"],
                ),
                rule(
                    &["get", "list", "watch"],
                    &["apps", "extensions"],
                    &["replicasets"],
                ),
                rule(
                    &["get", "list", "watch"],
                    &[""],
                    &["replicationcontrollers"],
                ),
                rule(
                    &["get", "list", "watch"],
                    &["policy"],
                    &["poddisruptionbudgets"],
                ),
                rule(&["get", "list", "watch"], &["apps"], &["statefulsets"]),
                rule(&["update"], &["policy"], &["poddisruptionbudgets/status"]),
                rule(&["patch", "update"], &[""], &["pods/status"]),
                rule(&["get"], &["*"], &["*/scale"]),
            ],
            true,
        ),
        c(
            "system:controller:statefulset-controller",
            vec![
                rule(&["list", "watch"], &[""], &["pods"]),
                rule(&["get", "list", "watch"], &["apps"], &["statefulsets"]),
                rule(&["update"], &["apps"], &["statefulsets/status"]),
                rule(&["update"], &["apps"], &["statefulsets/finalizers"]),
                rule(
                    &["get", "create", "delete", "update", "patch"],
                    &[""],
                    &["pods"],
                ),
                rule(
                    &[
                        "get", "create", "delete", "update", "patch", "list", "watch",
                    ],
                    &["apps"],
                    &["controllerrevisions"],
                ),
                rule(&["get", "create"], &[""], &["persistentvolumeclaims"]),
                rule(&["update", "delete"], &[""], &["persistentvolumeclaims"]),
            ],
            true,
        ),
        c(
            "system:controller:resourcequota-controller",
            vec![
                rule(&["list", "watch"], &["*"], &["*"]),
                rule(&["update"], &[""], &["resourcequotas/status"]),
            ],
            true,
        ),
        // Upstream's volume controllers write with `update`; Setpoint's write the same fields
        // with compare-and-swap merge patches, so they hold `patch` where upstream's hold
        // `update`, and the binder watches nodes (local-path volumes follow the node's
        // directory) where upstream's only gets and lists them.
        c(
            "system:controller:persistent-volume-binder",
            vec![
                rule(
                    &[
                        "get", "list", "watch", "update", "patch", "create", "delete",
                    ],
                    &[""],
                    &["persistentvolumes"],
                ),
                rule(&["update", "patch"], &[""], &["persistentvolumes/status"]),
                rule(
                    &["get", "list", "watch", "update", "patch"],
                    &[""],
                    &["persistentvolumeclaims"],
                ),
                rule(
                    &["update", "patch"],
                    &[""],
                    &["persistentvolumeclaims/status"],
                ),
                rule(
                    &["list", "watch", "get", "create", "delete"],
                    &[""],
                    &["pods"],
                ),
                rule(
                    &["get", "list", "watch"],
                    &["storage.k8s.io"],
                    &["storageclasses"],
                ),
                rule(&["get", "list", "watch"], &[""], &["nodes"]),
                rule(&["watch"], &[""], &["events"]),
            ],
            true,
        ),
        c(
            "system:controller:pvc-protection-controller",
            vec![
                rule(
                    &["get", "list", "watch", "update", "patch"],
                    &[""],
                    &["persistentvolumeclaims"],
                ),
                rule(&["list", "watch", "get"], &[""], &["pods"]),
            ],
            true,
        ),
        c(
            "system:controller:pv-protection-controller",
            vec![rule(
                &["get", "list", "watch", "update", "patch"],
                &[""],
                &["persistentvolumes"],
            )],
            true,
        ),
        c(
            "system:controller:service-account-controller",
            vec![rule(&["create"], &[""], &["serviceaccounts"])],
            true,
        ),
        c(
            "system:controller:root-ca-cert-publisher",
            vec![rule(&["create", "update"], &[""], &["configmaps"])],
            true,
        ),
        c(
            "system:controller:certificate-controller",
            vec![
                rule(
                    &["get", "list", "watch", "delete"],
                    &["certificates.k8s.io"],
                    &["certificatesigningrequests"],
                ),
                rule(
                    &["update"],
                    &["certificates.k8s.io"],
                    &[
                        "certificatesigningrequests/status",
                        "certificatesigningrequests/approval",
                    ],
                ),
                named(
                    &["approve"],
                    &["certificates.k8s.io"],
                    &["signers"],
                    &["kubernetes.io/kube-apiserver-client-kubelet"],
                ),
                named(
                    &["sign"],
                    &["certificates.k8s.io"],
                    &["signers"],
                    &[
                        "kubernetes.io/legacy-unknown",
                        "kubernetes.io/kube-apiserver-client",
                        "kubernetes.io/kube-apiserver-client-kubelet",
                        "kubernetes.io/kubelet-serving",
                    ],
                ),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
            ],
            true,
        ),
    ]
}

/// The bootstrap ClusterRoleBindings: (role, user subjects, group subjects).
const BINDINGS: &[(&str, &[&str], &[&str])] = &[
    ("cluster-admin", &[], &["system:masters"]),
    ("system:discovery", &[], &["system:authenticated"]),
    ("system:basic-user", &[], &["system:authenticated"]),
    ("setpoint:decision-reporter", &[], &["system:authenticated"]),
    (
        "system:public-info-viewer",
        &[],
        &["system:authenticated", "system:unauthenticated"],
    ),
    (
        "system:kube-controller-manager",
        &["system:kube-controller-manager"],
        &[],
    ),
    ("system:kube-scheduler", &["system:kube-scheduler"], &[]),
    ("system:volume-scheduler", &["system:kube-scheduler"], &[]),
    // Upstream keeps this binding without subjects: nodes are authorized by the Node
    // authorizer, and the binding is there only for clusters that add the group back.
    ("system:node", &[], &[]),
    ("system:node-proxier", &["system:kube-proxy"], &[]),
    (
        "system:service-account-issuer-discovery",
        &[],
        &["system:serviceaccounts"],
    ),
];

/// The bindings that let machines join with a bootstrap token, as kubeadm adds them (its
/// `kubeadm:kubelet-bootstrap`, `kubeadm:node-autoapprove-bootstrap` and
/// `kubeadm:node-autoapprove-certificate-rotation`): bootstrappers may create CSRs and have
/// node client CSRs approved, nodes may have their renewals approved. (name, role, group).
const JOIN_BINDINGS: &[(&str, &str, &str)] = &[
    (
        "setpoint:kubelet-bootstrap",
        "system:node-bootstrapper",
        "system:bootstrappers",
    ),
    (
        "setpoint:node-autoapprove-bootstrap",
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        "system:bootstrappers",
    ),
    (
        "setpoint:node-autoapprove-certificate-rotation",
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        "system:nodes",
    ),
    // The node agent runs the service proxy with the node's own credentials (kubeadm binds
    // the role to kube-proxy's service account instead).
    (
        "setpoint:node-proxier",
        "system:node-proxier",
        "system:nodes",
    ),
];

fn metadata(name: &str, extra_labels: &[(&str, &str)]) -> Value {
    let mut labels = Map::new();
    labels.insert(BOOTSTRAPPING_LABEL.0.into(), BOOTSTRAPPING_LABEL.1.into());
    for (k, v) in extra_labels {
        labels.insert(k.to_string(), json!(v));
    }
    json!({"name": name, "labels": labels, "annotations": {AUTOUPDATE: "true"}})
}

/// The bootstrap ClusterRoles as objects.
pub fn cluster_roles() -> Vec<Value> {
    roles()
        .into_iter()
        .chain(controller_roles())
        .map(|r| {
            let mut obj = json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": metadata(r.name, r.labels),
            });
            if let Some(label) = r.aggregate_from {
                obj["aggregationRule"] =
                    json!({"clusterRoleSelectors": [{"matchLabels": {label: "true"}}]});
            }
            if !r.rules.is_empty() || r.aggregate_from.is_none() {
                obj["rules"] = serde_json::to_value(&r.rules).expect("rules serialize");
            }
            obj
        })
        .collect()
}

/// The bootstrap ClusterRoleBindings as objects.
pub fn cluster_role_bindings() -> Vec<Value> {
    BINDINGS
        .iter()
        .map(|(role, users, groups)| {
            let subjects: Vec<Value> = users
                .iter()
                .map(|u| json!({"kind": "User", "apiGroup": GROUP, "name": u}))
                .chain(
                    groups
                        .iter()
                        .map(|g| json!({"kind": "Group", "apiGroup": GROUP, "name": g})),
                )
                .collect();
            binding(role, subjects)
        })
        .chain(JOIN_BINDINGS.iter().map(|(name, role, group)| {
            let mut obj = binding(
                role,
                vec![json!({"kind": "Group", "apiGroup": GROUP, "name": group})],
            );
            obj["metadata"]["name"] = json!(name);
            obj
        }))
        .chain(controller_roles().into_iter().map(|r| {
            let account = r.name.trim_start_matches(CONTROLLER_PREFIX);
            binding(
                r.name,
                vec![
                    json!({"kind": "ServiceAccount", "name": account, "namespace": "kube-system"}),
                ],
            )
        }))
        .collect()
}

fn binding(role: &str, subjects: Vec<Value>) -> Value {
    let mut obj = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": metadata(role, &[]),
        "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role},
    });
    if !subjects.is_empty() {
        obj["subjects"] = Value::Array(subjects);
    }
    obj
}

/// Whether the owner of `existing` asked reconciliation to leave it alone.
fn protected(existing: &Value) -> bool {
    existing
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(AUTOUPDATE))
        .and_then(Value::as_str)
        == Some("false")
}

/// Adds the labels and annotations of `expected` that `existing` lacks (existing values win).
fn merge_meta(out: &mut Value, expected: &Value) {
    for field in ["labels", "annotations"] {
        let Some(want) = expected
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_object)
        else {
            continue;
        };
        let meta = &mut out["metadata"];
        if !meta[field].is_object() {
            meta[field] = json!({});
        }
        let have = meta[field].as_object_mut().expect("just made an object");
        for (k, v) in want {
            have.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
}

/// The reconciled ClusterRole, or `None` when `existing` needs no change (or is protected):
/// upstream's `ComputeReconciledRole` without removals.
pub fn reconcile_role(existing: &Value, expected: &Value) -> Option<Value> {
    if protected(existing) {
        return None;
    }
    let mut out = existing.clone();
    merge_meta(&mut out, expected);
    // Aggregation selectors the role lacks are added.
    if let Some(want) = expected
        .pointer("/aggregationRule/clusterRoleSelectors")
        .and_then(Value::as_array)
    {
        if !out["aggregationRule"].is_object() {
            out["aggregationRule"] = json!({"clusterRoleSelectors": []});
        }
        let agg = &mut out["aggregationRule"]["clusterRoleSelectors"];
        if !agg.is_array() {
            *agg = json!([]);
        }
        let have = agg.as_array_mut().expect("just made an array");
        for sel in want {
            if !have.contains(sel) {
                have.push(sel.clone());
            }
        }
    } else {
        // Rules the role does not cover yet are added (an aggregated role's rules belong to
        // the aggregation controller).
        let have = PolicyRule::of(existing);
        let missing: Vec<PolicyRule> = PolicyRule::of(expected)
            .into_iter()
            .filter(|r| !covers(&have, std::slice::from_ref(r)).0)
            .collect();
        if !missing.is_empty() {
            let rules = out["rules"].as_array().cloned().unwrap_or_default();
            let mut rules = rules;
            rules.extend(
                missing
                    .iter()
                    .map(|r| serde_json::to_value(r).expect("rule")),
            );
            out["rules"] = Value::Array(rules);
        }
    }
    (out != *existing).then_some(out)
}

/// Whether a binding must be deleted and created again to be reconciled: its `roleRef`, which
/// cannot change, is not the bootstrap one (and it is not protected).
pub fn must_recreate(existing: &Value, expected: &Value) -> bool {
    !protected(existing) && existing.get("roleRef") != expected.get("roleRef")
}

/// The reconciled ClusterRoleBinding (missing subjects, labels and annotations added), or
/// `None` when nothing changes. When [`must_recreate`] says so, the result carries the
/// expected `roleRef` and no server-set metadata, ready to be created anew.
pub fn reconcile_binding(existing: &Value, expected: &Value) -> Option<Value> {
    if protected(existing) {
        return None;
    }
    let mut out = existing.clone();
    if must_recreate(existing, expected) {
        out["roleRef"] = expected["roleRef"].clone();
        let meta = out["metadata"].as_object_mut()?;
        meta.retain(|k, _| matches!(k.as_str(), "name" | "labels" | "annotations"));
    }
    merge_meta(&mut out, expected);
    let key = |s: &Value| {
        (
            s["kind"].as_str().unwrap_or_default().to_string(),
            s["name"].as_str().unwrap_or_default().to_string(),
            s["namespace"].as_str().unwrap_or_default().to_string(),
        )
    };
    if let Some(want) = expected.get("subjects").and_then(Value::as_array) {
        let mut have = out["subjects"].as_array().cloned().unwrap_or_default();
        for s in want {
            if !have.iter().any(|h| key(h) == key(s)) {
                have.push(s.clone());
            }
        }
        out["subjects"] = Value::Array(have);
    }
    (out != *existing).then_some(out)
}

/// How an existing object is brought up to its bootstrap version.
type Reconcile = fn(&Value, &Value) -> Option<Value>;

impl ApiServer {
    /// Creates or reconciles the bootstrap ClusterRoles and ClusterRoleBindings.
    pub(crate) async fn bootstrap_rbac(&self) -> Result<(), ApiError> {
        let registry = self.registry();
        let roles = registry
            .get(GROUP, "v1", "clusterroles")
            .expect("built in")
            .clone();
        let bindings = registry
            .get(GROUP, "v1", "clusterrolebindings")
            .expect("built in")
            .clone();
        let plan: [(_, Vec<Value>, Reconcile); 2] = [
            (roles, cluster_roles(), reconcile_role),
            (bindings, cluster_role_bindings(), reconcile_binding),
        ];
        let opts = WriteOptions::default();
        for (res, objects, reconcile) in plan {
            for expected in objects {
                let name = expected["metadata"]["name"].as_str().unwrap_or_default();
                match self.get_object(&res, "", name).await {
                    Err(e) if e.code == 404 => {
                        match self.create(&res, "", expected.clone(), &opts).await {
                            // Another server on the same store was first.
                            Err(e) if e.reason == "AlreadyExists" => {}
                            other => {
                                other?;
                            }
                        }
                    }
                    Err(e) => return Err(e),
                    Ok(existing) => {
                        let Some(updated) = reconcile(&existing, &expected) else {
                            continue;
                        };
                        tracing::info!(kind = %res.kind, name, "reconciling bootstrap RBAC");
                        if res.kind == "ClusterRoleBinding" && must_recreate(&existing, &expected) {
                            // `roleRef` cannot change: upstream deletes and creates again.
                            let precondition = DeleteOptions {
                                precondition_uid: existing
                                    .pointer("/metadata/uid")
                                    .and_then(Value::as_str)
                                    .map(str::to_string),
                                ..DeleteOptions::default()
                            };
                            match self.delete(&res, "", name, &precondition).await {
                                Err(e) if e.code == 404 || e.code == 409 => continue,
                                other => {
                                    other?;
                                }
                            }
                            match self.create(&res, "", updated, &opts).await {
                                Err(e) if e.reason == "AlreadyExists" => {}
                                other => {
                                    other?;
                                }
                            }
                            continue;
                        }
                        match self
                            .update(&res, "", name, View::Main, updated, &opts)
                            .await
                        {
                            // Changed under us (another server reconciling): it did the same.
                            Err(e) if e.code == 409 => {}
                            other => {
                                other?;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_objects_are_valid_and_labelled() {
        for obj in cluster_roles() {
            let causes =
                setpoint_kinds::validation::validate(GROUP, "v1", "ClusterRole", &obj, None);
            assert!(causes.is_empty(), "{obj}: {causes:?}");
            assert_eq!(
                obj["metadata"]["labels"]["kubernetes.io/bootstrapping"],
                "rbac-defaults"
            );
        }
        for obj in cluster_role_bindings() {
            let causes =
                setpoint_kinds::validation::validate(GROUP, "v1", "ClusterRoleBinding", &obj, None);
            assert!(causes.is_empty(), "{obj}: {causes:?}");
        }
        let gc = cluster_role_bindings()
            .into_iter()
            .find(|b| b["metadata"]["name"] == "system:controller:generic-garbage-collector")
            .unwrap();
        assert_eq!(
            gc["subjects"],
            json!([{"kind": "ServiceAccount", "name": "generic-garbage-collector", "namespace": "kube-system"}])
        );
        let admin = cluster_roles()
            .into_iter()
            .find(|r| r["metadata"]["name"] == "admin")
            .unwrap();
        assert_eq!(
            admin["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"]
                ["rbac.authorization.k8s.io/aggregate-to-admin"],
            "true"
        );
    }

    #[test]
    fn reconciliation_adds_and_never_removes() {
        let expected = &cluster_roles()
            .into_iter()
            .find(|r| r["metadata"]["name"] == "system:discovery")
            .unwrap();
        // A user narrowed the role and added a rule of their own.
        let mut existing = expected.clone();
        existing["rules"] = json!([
            {"verbs": ["get"], "nonResourceURLs": ["/healthz"]},
            {"verbs": ["get"], "nonResourceURLs": ["/custom"]},
        ]);
        existing["metadata"]["labels"] = json!({"mine": "yes"});
        let out = reconcile_role(&existing, expected).unwrap();
        let rules = PolicyRule::of(&out);
        assert!(covers(&rules, &PolicyRule::of(expected)).0);
        assert!(rules.iter().any(|r| r.non_resource_urls == ["/custom"]));
        assert_eq!(out["metadata"]["labels"]["mine"], "yes");
        assert_eq!(
            out["metadata"]["labels"]["kubernetes.io/bootstrapping"],
            "rbac-defaults"
        );
        assert!(reconcile_role(&out, expected).is_none());
        existing["metadata"]["annotations"] = json!({AUTOUPDATE: "false"});
        assert!(reconcile_role(&existing, expected).is_none());

        let expected = &cluster_role_bindings()
            .into_iter()
            .find(|b| b["metadata"]["name"] == "system:public-info-viewer")
            .unwrap();
        let mut existing = expected.clone();
        existing["subjects"] = json!([{"kind": "User", "apiGroup": GROUP, "name": "extra"}]);
        let out = reconcile_binding(&existing, expected).unwrap();
        assert_eq!(out["subjects"].as_array().unwrap().len(), 3);
        assert!(reconcile_binding(&out, expected).is_none());
        // A changed roleRef can only be put back by creating the binding again.
        let mut moved = out.clone();
        moved["roleRef"]["name"] = json!("cluster-admin");
        moved["metadata"]["uid"] = json!("u1");
        moved["metadata"]["resourceVersion"] = json!("7");
        assert!(must_recreate(&moved, expected));
        let again = reconcile_binding(&moved, expected).unwrap();
        assert_eq!(again["roleRef"], expected["roleRef"]);
        assert!(again["metadata"].get("uid").is_none());
        assert!(again["metadata"].get("resourceVersion").is_none());
        assert_eq!(again["subjects"], out["subjects"]);
    }
}
