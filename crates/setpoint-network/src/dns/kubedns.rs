//! The `kube-dns` Service in `kube-system`, as kubeadm's CoreDNS addon makes it (its labels
//! are what `kubectl cluster-info` lists), and the EndpointSlices through which nodes publish
//! the addresses they serve DNS on: the Service has no selector, each node writes its own
//! slice `kube-dns-<node>` while its server runs and deletes it when it stops, and the slice
//! is owned by the Node, so a Node that is deleted takes its slice with it.

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;
use setpoint_runtime::client::{Api, Client, ClientError, DeleteParams, PostParams};

/// The Service's namespace.
pub const NAMESPACE: &str = "kube-system";
/// The Service's name.
pub const NAME: &str = "kube-dns";
/// Its cluster IP: the 10th address of the service range, as kubeadm picks it.
pub const CLUSTER_IP: &str = "10.96.0.10";
/// Who manages the nodes' slices (`endpointslice.kubernetes.io/managed-by`).
pub const MANAGED_BY: &str = "node-dns.setpoint.io";

/// The Service, with kubeadm's labels and ports (`dns` 53/UDP, `dns-tcp` 53/TCP); no
/// selector: the nodes publish its endpoints.
pub fn service() -> Service {
    serde_json::from_value(json!({
        "metadata": {
            "name": NAME,
            "namespace": NAMESPACE,
            "labels": {
                "k8s-app": "kube-dns",
                "kubernetes.io/cluster-service": "true",
                "kubernetes.io/name": "CoreDNS",
            },
        },
        "spec": {
            "clusterIP": CLUSTER_IP,
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
            ],
        },
    }))
    .expect("a valid Service")
}

/// Creates the Service unless it exists (a user's changes are kept across restarts). Looked
/// up first: a create of an existing one is refused for its taken cluster IP before its name.
pub async fn ensure_service(client: &Client) -> Result<(), ClientError> {
    let api: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    match api.get(NAME).await {
        Ok(_) => return Ok(()),
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    match api.create(&PostParams::default(), &service()).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_already_exists() => Ok(()),
        Err(e) => Err(e),
    }
}

/// The slice of node `node` (uid `node_uid`, its owner) listing `addresses` as ready
/// endpoints on the Service's ports.
pub fn node_slice(node: &str, node_uid: &str, addresses: &[SocketAddr]) -> EndpointSlice {
    let ips: Vec<IpAddr> = addresses.iter().map(SocketAddr::ip).collect();
    let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = ips.into_iter().partition(IpAddr::is_ipv4);
    let (family, ips) = if v4.is_empty() {
        ("IPv6", v6)
    } else {
        ("IPv4", v4)
    };
    let port = addresses.first().map_or(53, SocketAddr::port);
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("{NAME}-{node}"),
            "namespace": NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": NAME,
                "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
            },
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
            }],
        },
        "addressType": family,
        "endpoints": ips.iter().map(|ip| json!({
            "addresses": [ip.to_string()],
            "conditions": {"ready": true, "serving": true, "terminating": false},
            "nodeName": node,
        })).collect::<Vec<_>>(),
        "ports": [
            {"name": "dns", "port": port, "protocol": "UDP"},
            {"name": "dns-tcp", "port": port, "protocol": "TCP"},
        ],
    }))
    .expect("a valid EndpointSlice")
}

/// Writes node `node`'s slice (created, or replaced when it differs). The Node must exist
/// (it owns the slice).
pub async fn publish(
    client: &Client,
    node: &str,
    addresses: &[SocketAddr],
) -> Result<(), ClientError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let uid = nodes.get(node).await?.metadata.uid.unwrap_or_default();
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), NAMESPACE);
    let want = node_slice(node, &uid, addresses);
    match api.create(&PostParams::default(), &want).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_already_exists() => {
            let mut current = api.get(&format!("{NAME}-{node}")).await?;
            if current.endpoints == want.endpoints
                && current.ports == want.ports
                && current.metadata.owner_references == want.metadata.owner_references
            {
                return Ok(());
            }
            current.address_type = want.address_type;
            current.endpoints = want.endpoints;
            current.ports = want.ports;
            current.metadata.owner_references = want.metadata.owner_references;
            current.metadata.labels = want.metadata.labels;
            api.replace(
                &current.metadata.name.clone().unwrap_or_default(),
                &PostParams::default(),
                &current,
            )
            .await
            .map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// Deletes node `node`'s slice (a node whose server stops is no longer an endpoint).
pub async fn withdraw(client: &Client, node: &str) -> Result<(), ClientError> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), NAMESPACE);
    match api
        .delete(&format!("{NAME}-{node}"), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_is_kubeadms() {
        let svc = service();
        let labels = svc.metadata.labels.unwrap();
        assert_eq!(labels["k8s-app"], "kube-dns");
        assert_eq!(labels["kubernetes.io/cluster-service"], "true");
        assert_eq!(labels["kubernetes.io/name"], "CoreDNS");
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.10"));
        assert!(spec.selector.is_none());
        let ports: Vec<(String, i32, String)> = spec
            .ports
            .unwrap()
            .into_iter()
            .map(|p| (p.name.unwrap(), p.port, p.protocol.unwrap()))
            .collect();
        assert_eq!(
            ports,
            vec![
                ("dns".into(), 53, "UDP".into()),
                ("dns-tcp".into(), 53, "TCP".into())
            ]
        );
    }

    #[test]
    fn a_nodes_slice_lists_its_addresses() {
        let s = node_slice("n1", "u1", &["10.223.4.1:53".parse().unwrap()]);
        assert_eq!(s.metadata.name.as_deref(), Some("kube-dns-n1"));
        assert_eq!(s.address_type, "IPv4");
        assert_eq!(s.endpoints.len(), 1);
        assert_eq!(s.endpoints[0].addresses, vec!["10.223.4.1"]);
        assert_eq!(s.endpoints[0].node_name.as_deref(), Some("n1"));
        assert_eq!(
            s.metadata.labels.as_ref().unwrap()["kubernetes.io/service-name"],
            "kube-dns"
        );
        assert_eq!(s.metadata.owner_references.as_ref().unwrap()[0].uid, "u1");
    }
}
