//! The pure half of host-gw routing: the routes a node wants from the Nodes it sees, and
//! what to change to get there from the routes it has.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;
use setpoint_api::cidr::Cidr;

/// One route: packets for `dst` (another node's pod range) go to `via` (that node's
/// address), which must be on a link this host shares with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Route {
    /// The destination: a node's `spec.podCIDRs` entry.
    pub dst: Cidr,
    /// The gateway: the node's `InternalIP` of the same family.
    pub via: IpAddr,
}

/// The routes this host wants: one to every pod range of every Node but itself, through
/// that node's `InternalIP` of the range's family. Nodes without a pod range or an address
/// of its family are skipped, and so are gateways that are this host's own addresses
/// (`local`, loopback included): the node itself, and nodes sharing its address, as the
/// simulated nodes of `setpoint up` do.
pub fn desired<'a>(
    node_name: &str,
    nodes: impl IntoIterator<Item = &'a Node>,
    local: &[IpAddr],
) -> BTreeSet<Route> {
    let mut out = BTreeSet::new();
    for node in nodes {
        if node.metadata.name.as_deref() == Some(node_name) {
            continue;
        }
        let addresses: Vec<IpAddr> = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP")
            .filter_map(|a| a.address.parse().ok())
            .collect();
        let spec = node.spec.as_ref();
        let cidrs = spec
            .and_then(|s| s.pod_cidrs.clone())
            .filter(|l| !l.is_empty())
            .or_else(|| spec.and_then(|s| s.pod_cidr.clone()).map(|c| vec![c]))
            .unwrap_or_default();
        for cidr in cidrs {
            let Ok(dst) = cidr.parse::<Cidr>() else {
                continue;
            };
            let via = addresses.iter().find(|a| a.is_ipv4() == dst.is_ipv4());
            if let Some(via) = via {
                if via.is_loopback() || local.contains(via) {
                    continue;
                }
                out.insert(Route { dst, via: *via });
            }
        }
    }
    out
}

/// What to change: routes to add or repoint (`ip route replace`), and destinations whose
/// route to delete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Routes missing or pointing elsewhere.
    pub replace: Vec<Route>,
    /// Routes this host owns that no node wants any more.
    pub delete: Vec<Route>,
}

impl Changes {
    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.replace.is_empty() && self.delete.is_empty()
    }
}

/// The changes from `current` (the routes this host owns now) to `desired`.
pub fn diff(current: &BTreeSet<Route>, desired: &BTreeSet<Route>) -> Changes {
    let wanted: BTreeSet<Cidr> = desired.iter().map(|r| r.dst).collect();
    Changes {
        replace: desired.difference(current).copied().collect(),
        // A destination still wanted through another gateway is repointed by its
        // replace, not deleted.
        delete: current
            .iter()
            .filter(|r| !wanted.contains(&r.dst))
            .copied()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, cidrs: &[&str], ips: &[&str]) -> Node {
        let addresses: Vec<_> = ips
            .iter()
            .map(|ip| json!({"type": "InternalIP", "address": ip}))
            .chain(std::iter::once(
                json!({"type": "Hostname", "address": name}),
            ))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"podCIDR": cidrs.first(), "podCIDRs": cidrs},
            "status": {"addresses": addresses}
        }))
        .unwrap()
    }

    fn route(dst: &str, via: &str) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            via: via.parse().unwrap(),
        }
    }

    #[test]
    fn every_other_node_s_range_goes_through_its_address() {
        let nodes = [
            node("a", &["10.244.0.0/24"], &["192.168.7.1"]),
            node(
                "b",
                &["10.244.1.0/24", "fd00:1::/64"],
                &["192.168.7.2", "fd00::2"],
            ),
            node("c", &[], &["192.168.7.3"]),
            node("d", &["10.244.3.0/24"], &[]),
            node("sim", &["10.244.4.0/24"], &["127.0.0.1"]),
            node("same-host", &["10.244.5.0/24"], &["192.168.7.1"]),
        ];
        let local: Vec<IpAddr> = vec!["192.168.7.1".parse().unwrap()];
        let want = desired("a", &nodes, &local);
        assert_eq!(
            want,
            BTreeSet::from([
                route("10.244.1.0/24", "192.168.7.2"),
                route("fd00:1::/64", "fd00::2"),
            ])
        );
    }

    #[test]
    fn changes_add_repoint_and_remove() {
        let current = BTreeSet::from([
            route("10.244.1.0/24", "192.168.7.2"),
            route("10.244.2.0/24", "192.168.7.3"),
            route("10.244.9.0/24", "192.168.7.9"),
        ]);
        let desired = BTreeSet::from([
            route("10.244.1.0/24", "192.168.7.2"),
            route("10.244.2.0/24", "192.168.7.4"),
            route("10.244.3.0/24", "192.168.7.5"),
        ]);
        let changes = diff(&current, &desired);
        assert_eq!(
            changes.replace,
            [
                route("10.244.2.0/24", "192.168.7.4"),
                route("10.244.3.0/24", "192.168.7.5")
            ]
        );
        assert_eq!(changes.delete, [route("10.244.9.0/24", "192.168.7.9")]);
        assert!(diff(&desired, &desired).is_empty());
    }
}
