//! The built-in service load balancer (`service-lb-controller`, the name upstream's service
//! controller has in the controller manager): a `type: LoadBalancer` Service gets the nodes'
//! `InternalIP`s as its `status.loadBalancer.ingress`, as k3s's servicelb does. Every node's
//! service proxy routes a Service's ingress IPs and ports like its node ports, so a node's
//! own address on the Service's port reaches the Service; the ingress entries say so with
//! `ipMode: VIP` (the address is the Service's, the proxy delivers to its endpoints).
//!
//! As upstream's built-in cloud controllers, only Services without `spec.loadBalancerClass`
//! are this controller's: a Service with a class belongs to whatever implements that class.
//! A Service that is no longer a `LoadBalancer` has its ingress removed.
//!
//! [`desired`] is the pure decision; the reconciler writes `status.loadBalancer` when it
//! differs.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use setpoint_runtime::client::{Api, Client, Patch, PatchParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::ObjectKey;

/// The controller's name (`--controllers`, work queue, metrics, logs): upstream's.
pub const NAME: &str = "service-lb-controller";

/// Nodes labelled so are left out of every load balancer, as upstream's service controller
/// leaves them out.
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// The label of Setpoint's simulated nodes: they run no service proxy, so their address
/// would not answer.
pub const SIMULATED_LABEL: &str = "setpoint.dev/simulated";

/// The label EndpointSlices name their Service by.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Whether this controller gives `svc` its ingress: a `LoadBalancer` without a class.
pub fn is_ours(svc: &Service) -> bool {
    let Some(spec) = &svc.spec else {
        return false;
    };
    spec.type_.as_deref() == Some("LoadBalancer") && spec.load_balancer_class.is_none()
}

/// The address a node's load balancer ingress uses: its first IPv4 `InternalIP`, if it can
/// serve at all (Ready, not excluded, not simulated, not being deleted).
pub fn node_address(node: &Node) -> Option<Ipv4Addr> {
    if node.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let labels = node.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(EXCLUDE_LABEL))
        || labels
            .and_then(|l| l.get(SIMULATED_LABEL))
            .map(String::as_str)
            == Some("true")
    {
        return None;
    }
    let status = node.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    status
        .addresses
        .iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse::<Ipv4Addr>().ok())
}

/// The nodes that hold a ready endpoint of the Service in `slices` (those of the Service).
pub fn endpoint_nodes<'a>(slices: impl IntoIterator<Item = &'a EndpointSlice>) -> BTreeSet<String> {
    slices
        .into_iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .filter_map(|e| e.node_name.clone())
        .collect()
}

/// What `svc`'s `status.loadBalancer` should be, or `None` to leave it as it is (a Service
/// with a class is someone else's).
///
/// A `LoadBalancer` Service without a class gets the address of every node that can serve
/// it, sorted and without duplicates; with `externalTrafficPolicy: Local`, only of the nodes
/// holding one of its ready endpoints (`endpoint_nodes`), since the others drop its traffic.
/// Any other Service has no ingress.
pub fn desired(
    svc: &Service,
    nodes: &[&Node],
    endpoint_nodes: &BTreeSet<String>,
) -> Option<LoadBalancerStatus> {
    let spec = svc.spec.as_ref();
    let is_lb = spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer");
    if is_lb && !is_ours(svc) {
        return None;
    }
    if !is_lb || svc.metadata.deletion_timestamp.is_some() {
        return Some(LoadBalancerStatus::default());
    }
    let local = spec.and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
    let ips: BTreeSet<Ipv4Addr> = nodes
        .iter()
        .filter(|n| {
            !local
                || n.metadata
                    .name
                    .as_ref()
                    .is_some_and(|name| endpoint_nodes.contains(name))
        })
        .filter_map(|n| node_address(n))
        .collect();
    let ingress: Vec<LoadBalancerIngress> = ips
        .into_iter()
        .map(|ip| LoadBalancerIngress {
            ip: Some(ip.to_string()),
            ip_mode: Some("VIP".into()),
            ..LoadBalancerIngress::default()
        })
        .collect();
    Some(LoadBalancerStatus {
        ingress: (!ingress.is_empty()).then_some(ingress),
    })
}

/// Whether `current` already says what `want` does (an empty list and none are the same).
pub fn same(current: Option<&LoadBalancerStatus>, want: &LoadBalancerStatus) -> bool {
    let empty = Vec::new();
    let a = current.and_then(|s| s.ingress.as_ref()).unwrap_or(&empty);
    let b = want.ingress.as_ref().unwrap_or(&empty);
    a == b
}

struct ServiceLbController {
    client: Client,
    services: Store<Service>,
    nodes: Store<Node>,
    slices: Store<EndpointSlice>,
}

#[async_trait::async_trait]
impl Reconciler for ServiceLbController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(svc) = self.services.get(key) else {
            ctx.observe("the Service is gone");
            return Ok(Action::Done);
        };
        let namespace = key.namespace.as_deref().unwrap_or_default();
        let nodes = self.nodes.list();
        let nodes: Vec<&Node> = nodes.iter().map(|n| &**n).collect();
        let slices = self.slices.list();
        let on = endpoint_nodes(
            slices
                .iter()
                .filter(|s| {
                    s.metadata.namespace.as_deref() == Some(namespace)
                        && s.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(SERVICE_NAME_LABEL))
                            == Some(&key.name)
                })
                .map(|s| &**s),
        );
        let Some(want) = desired(&svc, &nodes, &on) else {
            ctx.observe("a LoadBalancer with a loadBalancerClass: another controller's");
            return Ok(Action::Done);
        };
        let current = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref());
        let ips = |s: Option<&LoadBalancerStatus>| -> String {
            let ips: Vec<&str> = s
                .and_then(|s| s.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.as_deref())
                .collect();
            if ips.is_empty() {
                "none".into()
            } else {
                ips.join(", ")
            }
        };
        let lb = is_ours(&svc) && svc.metadata.deletion_timestamp.is_none();
        let local = svc
            .spec
            .as_ref()
            .and_then(|s| s.external_traffic_policy.as_deref())
            == Some("Local");
        if ctx.recording() {
            if lb {
                let serving = nodes.iter().filter(|n| node_address(n).is_some()).count();
                ctx.observe(format!(
                    "LoadBalancer{}: {} nodes, {serving} can serve{}; ingress {} (want {})",
                    if local {
                        " (externalTrafficPolicy Local)"
                    } else {
                        ""
                    },
                    nodes.len(),
                    if local {
                        format!(", {} with a ready endpoint", on.len())
                    } else {
                        String::new()
                    },
                    ips(current),
                    ips(Some(&want)),
                ));
            } else {
                ctx.observe(format!(
                    "not a LoadBalancer (or being deleted); ingress {}",
                    ips(current)
                ));
            }
        }
        if same(current, &want) {
            return Ok(Action::Done);
        }
        if ctx.recording() {
            ctx.action(
                format!("patch status.loadBalancer.ingress to {}", ips(Some(&want))),
                match (lb, local) {
                    (false, _) => "not a LoadBalancer (or being deleted): no ingress",
                    (true, false) => "the InternalIP of every Ready node not excluded from load balancers",
                    (true, true) => "the InternalIP of every Ready node not excluded from load balancers that holds a ready endpoint (Local)",
                },
            );
        }
        // A merge patch replaces the list whole, and `null` removes it.
        let ingress = match &want.ingress {
            Some(list) => serde_json::to_value(list).unwrap_or_default(),
            None => serde_json::Value::Null,
        };
        let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": ingress}}});
        let api: Api<Service> = Api::namespaced(self.client.clone(), namespace);
        match api
            .patch_status(&key.name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {
                tracing::debug!(service = %key, ingress = ?want.ingress, "load balancer status set");
                Ok(Action::Done)
            }
            Err(e) if e.code() == Some(404) => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

/// Builds the service load balancer controller: Services, woken again by every node change
/// (addresses and readiness decide the ingress) and by their EndpointSlices (for the
/// `Local` policy).
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let services = informers.typed::<Service>(Scope::all()).store();
    let reconciler = ServiceLbController {
        client,
        services: services.clone(),
        nodes: informers.typed::<Node>(Scope::all()).store(),
        slices: informers.typed::<EndpointSlice>(Scope::all()).store(),
    };
    let all_lb = services.clone();
    Controller::for_type::<Service>(NAME, informers, None)
        .watches::<Node>(None, move |_| {
            all_lb
                .list()
                .iter()
                .filter(|s| is_ours(s))
                .map(|s| ObjectKey::of(&**s))
                .collect()
        })
        .watches::<EndpointSlice>(None, |slice| {
            match (
                slice.metadata.namespace.as_deref(),
                slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL)),
            ) {
                (Some(ns), Some(name)) => vec![ObjectKey::new(Some(ns), name)],
                _ => vec![],
            }
        })
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    fn node(name: &str, ip: &str, ready: &str, labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {
                "conditions": [{"type": "Ready", "status": ready}],
                "addresses": [{"type": "Hostname", "address": name},
                              {"type": "InternalIP", "address": ip}],
            },
        }))
        .unwrap()
    }

    fn ips(status: &LoadBalancerStatus) -> Vec<(String, String)> {
        status
            .ingress
            .iter()
            .flatten()
            .map(|i| (i.ip.clone().unwrap(), i.ip_mode.clone().unwrap()))
            .collect()
    }

    fn lb(extra: serde_json::Value) -> Service {
        let mut spec = json!({"type": "LoadBalancer", "ports": [{"port": 80}]});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        svc(json!({"metadata": {"name": "web", "namespace": "x"}, "spec": spec}))
    }

    #[test]
    fn a_load_balancer_gets_the_addresses_of_the_nodes_that_can_serve_it() {
        let nodes = [
            node("b", "10.0.0.2", "True", json!({})),
            node("a", "10.0.0.1", "True", json!({})),
            node("down", "10.0.0.3", "False", json!({})),
            node("out", "10.0.0.4", "True", json!({(EXCLUDE_LABEL): ""})),
            node(
                "sim",
                "127.0.0.1",
                "True",
                json!({(SIMULATED_LABEL): "true"}),
            ),
            node("dup", "10.0.0.1", "True", json!({})),
        ];
        let nodes: Vec<&Node> = nodes.iter().collect();
        let want = desired(&lb(json!({})), &nodes, &BTreeSet::new()).unwrap();
        assert_eq!(
            ips(&want),
            [
                ("10.0.0.1".to_string(), "VIP".to_string()),
                ("10.0.0.2".into(), "VIP".into())
            ]
        );
    }

    #[test]
    fn a_local_policy_uses_only_the_nodes_with_ready_endpoints() {
        let nodes = [
            node("a", "10.0.0.1", "True", json!({})),
            node("b", "10.0.0.2", "True", json!({})),
        ];
        let nodes: Vec<&Node> = nodes.iter().collect();
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "x"},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.1.0.5"], "nodeName": "b", "conditions": {"ready": true}},
                {"addresses": ["10.1.0.6"], "nodeName": "a", "conditions": {"ready": false}},
            ],
        }))
        .unwrap();
        let on = endpoint_nodes([&slice]);
        let svc = lb(json!({"externalTrafficPolicy": "Local"}));
        let want = desired(&svc, &nodes, &on).unwrap();
        assert_eq!(ips(&want), [("10.0.0.2".to_string(), "VIP".to_string())]);
        // No endpoint anywhere: no ingress at all.
        let none = desired(&svc, &nodes, &BTreeSet::new()).unwrap();
        assert_eq!(none.ingress, None);
    }

    #[test]
    fn a_class_is_someone_elses_and_other_types_have_no_ingress() {
        let nodes = [node("a", "10.0.0.1", "True", json!({}))];
        let nodes: Vec<&Node> = nodes.iter().collect();
        let classy = lb(json!({"loadBalancerClass": "example.com/lb"}));
        assert!(!is_ours(&classy));
        assert_eq!(desired(&classy, &nodes, &BTreeSet::new()), None);
        let cluster_ip = svc(json!({"metadata": {"name": "web"}, "spec": {"type": "ClusterIP"}}));
        let want = desired(&cluster_ip, &nodes, &BTreeSet::new()).unwrap();
        assert_eq!(want.ingress, None);
        // An ingress left from when it was a LoadBalancer differs, so it is removed.
        let old = LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some("10.0.0.1".into()),
                ..LoadBalancerIngress::default()
            }]),
        };
        assert!(!same(Some(&old), &want));
        assert!(same(None, &want));
        assert!(same(
            Some(&LoadBalancerStatus {
                ingress: Some(vec![])
            }),
            &want
        ));
    }
}
