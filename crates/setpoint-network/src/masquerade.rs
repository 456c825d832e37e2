//! Masquerading of pod traffic that leaves the cluster's pod network, as flannel's host-gw
//! backend and kubenet do: a pod's packets to a pod on another node keep the pod's own address
//! (the host-gw routes carry them, and the other node routes the replies back to this node's
//! range), while packets to anything outside the cluster CIDR (the internet, other machines
//! of the LAN) leave with the node's address, since nothing outside routes pod ranges.
//!
//! The CNI bridge plugin's `ipMasq` cannot draw that line (it masquerades everything that
//! leaves the node's own subnet, so a pod on another node saw the node's address), so the
//! node's network list turns it off and the node owns one rule in an nftables table of its own
//! ([`table_name`]): source in the node's pod range, destination outside the cluster CIDR and
//! the node's range (and not multicast, as the bridge plugin's rule also spares).
//! Destinations local to the node never reach `postrouting`, so they are not masqueraded
//! either. Without a known cluster CIDR the node falls back to the bridge plugin's line:
//! everything leaving its own range is masqueraded.
//!
//! [`script`] is pure; [`install`] replaces the table in one transaction (so a restart, or a
//! table left by a node that was killed, ends with exactly the rule wanted), [`remove`]
//! deletes it at a clean stop.

use std::net::{IpAddr, Ipv4Addr};

use setpoint_api::cidr::Cidr;

use crate::proxy::{Nft, NftError};

/// Multicast (224.0.0.0/4): never masqueraded, as the CNI bridge plugin's rule leaves it.
const MULTICAST: (Ipv4Addr, u8) = (Ipv4Addr::new(224, 0, 0, 0), 4);

/// The base chain's name in the table.
const CHAIN: &str = "postrouting";

/// The table of the node identified by `identity` (its pod network's directory, say):
/// `setpoint-masq-<hash>`, so that two nodes or clusters sharing a network namespace (test
/// clusters on one machine) each own theirs, and a restarted node replaces its own.
pub fn table_name(identity: &str) -> String {
    format!(
        "setpoint-masq-{}",
        crate::proxy::rules::short_hash(identity).to_lowercase()
    )
}

/// Whether `outer` contains every address of `inner`.
fn covers(outer: &Cidr, inner: &Cidr) -> bool {
    outer.is_ipv4() == inner.is_ipv4()
        && outer.prefix() <= inner.prefix()
        && outer.contains(&inner.addr())
}

/// The destinations traffic from `pod_range` keeps its source address to: the cluster CIDR
/// (when known), the node's own range and multicast, without a range another one already
/// covers (nftables refuses overlapping intervals in one set).
pub fn exempt(pod_range: &Cidr, cluster_cidr: Option<&Cidr>) -> Vec<Cidr> {
    let multicast = Cidr::new(IpAddr::V4(MULTICAST.0), MULTICAST.1);
    let candidates: Vec<Cidr> = cluster_cidr
        .into_iter()
        .copied()
        .chain(std::iter::once(*pod_range))
        .chain(multicast)
        .collect();
    let mut kept: Vec<Cidr> = Vec::new();
    for (i, c) in candidates.iter().enumerate() {
        let covered = candidates
            .iter()
            .enumerate()
            .any(|(j, other)| j != i && covers(other, c) && (other != c || j < i));
        if !covered {
            kept.push(*c);
        }
    }
    kept
}

/// The `nft -f` script that makes `table` hold exactly the masquerade rule for `pod_range`
/// with destinations `exempt` spared: the table is created (if absent), deleted and declared
/// again in one transaction.
pub fn script(table: &str, pod_range: &Cidr, exempt: &[Cidr]) -> String {
    let spared: Vec<String> = exempt.iter().map(Cidr::to_string).collect();
    format!(
        "add table ip {table}\n\
         delete table ip {table}\n\
         table ip {table} {{\n\
         \tchain {CHAIN} {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tip saddr {pod_range} ip daddr != {{ {} }} masquerade\n\
         \t}}\n\
         }}\n",
        spared.join(", ")
    )
}

/// What one node masquerades.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasqueradeConfig {
    /// The nftables table (family `ip`) the node owns; see [`table_name`].
    pub table: String,
    /// The node's pod range: the sources masqueraded.
    pub pod_range: Cidr,
    /// The cluster CIDR, traffic into which keeps its source; `None`: unknown, and only the
    /// node's own range is spared.
    pub cluster_cidr: Option<Cidr>,
}

/// Installs `config`'s rule, replacing whatever its table held; logs what is masqueraded
/// (and that it is more than upstream would when the cluster CIDR is unknown).
pub async fn install(config: &MasqueradeConfig) -> Result<(), NftError> {
    let spared = exempt(&config.pod_range, config.cluster_cidr.as_ref());
    Nft::new(&config.table)
        .apply(&script(&config.table, &config.pod_range, &spared))
        .await?;
    match &config.cluster_cidr {
        Some(cluster) => tracing::info!(
            table = %config.table,
            pod_range = %config.pod_range,
            cluster_cidr = %cluster,
            "pod traffic leaving the cluster CIDR is masqueraded; traffic to other pods keeps the pod's address"
        ),
        None => tracing::warn!(
            table = %config.table,
            pod_range = %config.pod_range,
            "the cluster CIDR is not known (no --cluster-cidr): all pod traffic leaving the node's own range is masqueraded, so pods on other nodes see this node's address"
        ),
    }
    Ok(())
}

/// Deletes the table; absent is fine.
pub async fn remove(table: &str) -> Result<(), NftError> {
    Nft::new(table).delete_table().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Cidr {
        text.parse().unwrap()
    }

    fn texts(cidrs: &[Cidr]) -> Vec<String> {
        cidrs.iter().map(Cidr::to_string).collect()
    }

    #[test]
    fn the_cluster_cidr_covers_the_node_s_range() {
        let spared = exempt(&cidr("10.244.3.0/24"), Some(&cidr("10.244.0.0/16")));
        assert_eq!(texts(&spared), ["10.244.0.0/16", "224.0.0.0/4"]);
    }

    #[test]
    fn a_range_outside_the_cluster_cidr_is_spared_too() {
        let spared = exempt(&cidr("10.223.7.0/24"), Some(&cidr("10.244.0.0/16")));
        assert_eq!(
            texts(&spared),
            ["10.244.0.0/16", "10.223.7.0/24", "224.0.0.0/4"]
        );
        // One equal to the cluster CIDR appears once.
        let same = exempt(&cidr("10.244.0.0/16"), Some(&cidr("10.244.0.0/16")));
        assert_eq!(texts(&same), ["10.244.0.0/16", "224.0.0.0/4"]);
    }

    #[test]
    fn without_a_cluster_cidr_only_the_node_s_range_is_spared() {
        let spared = exempt(&cidr("10.244.3.0/24"), None);
        assert_eq!(texts(&spared), ["10.244.3.0/24", "224.0.0.0/4"]);
    }

    #[test]
    fn the_script_replaces_the_table_in_one_transaction() {
        let range = cidr("10.244.3.0/24");
        let text = script(
            "setpoint-masq-abc",
            &range,
            &exempt(&range, Some(&cidr("10.244.0.0/16"))),
        );
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert_eq!(lines[0], "add table ip setpoint-masq-abc");
        assert_eq!(lines[1], "delete table ip setpoint-masq-abc");
        assert!(lines.contains(&"type nat hook postrouting priority srcnat; policy accept;"));
        assert!(
            lines.contains(
                &"ip saddr 10.244.3.0/24 ip daddr != { 10.244.0.0/16, 224.0.0.0/4 } masquerade"
            ),
            "{text}"
        );
    }

    #[test]
    fn tables_are_named_per_node() {
        let a = table_name("/var/lib/setpoint/a/containerd");
        assert!(a.starts_with("setpoint-masq-"), "{a}");
        assert_eq!(a, table_name("/var/lib/setpoint/a/containerd"));
        assert_ne!(a, table_name("/var/lib/setpoint/b/containerd"));
        assert!(a.len() <= 32, "nft names stay short: {a}");
    }
}
