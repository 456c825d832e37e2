//! The node IPAM flags `setpoint controller-manager` and `setpoint up` share
//! (`--allocate-node-cidrs`, `--node-cidr-mask-size`), and the cluster CIDR `setpoint up`
//! chooses when none is given.

use std::path::Path;

use setpoint_api::cidr::Cidr;
use setpoint_controllers::nodeipam::NodeIpamConfig;

/// The service range every Setpoint cluster hands cluster IPs from, kept out of node ranges.
pub const SERVICE_CIDR: &str = "10.96.0.0/12";

/// The node IPAM controller's switches.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct NodeIpamFlags {
    /// Give each Node a pod range (`spec.podCIDR`, `spec.podCIDRs`) from the cluster CIDR,
    /// as kube-controller-manager's node IPAM controller does.
    #[arg(long)]
    pub allocate_node_cidrs: bool,
    /// The prefix length of each node's range (default 24 for IPv4, 64 for IPv6; not with a
    /// dual-stack `--cluster-cidr`).
    #[arg(long)]
    pub node_cidr_mask_size: Option<u8>,
}

impl NodeIpamFlags {
    /// The controller's configuration for `cluster_cidr`, or `None` when allocation is off.
    pub fn config(&self, cluster_cidr: Option<&str>) -> anyhow::Result<Option<NodeIpamConfig>> {
        if !self.allocate_node_cidrs {
            return Ok(None);
        }
        let service: Cidr = SERVICE_CIDR.parse()?;
        NodeIpamConfig::new(
            cluster_cidr.unwrap_or_default(),
            self.node_cidr_mask_size,
            vec![service],
        )
        .map(Some)
        .map_err(|e| anyhow::anyhow!("node IPAM: {e}"))
    }
}

/// The second octet of the first `10.<y>.0.0/16` `setpoint up` tries as its cluster CIDR;
/// the candidates run to 10.254.0.0/16, above the private containerds' `10.223.0.0/16` and
/// the tests' `10.222.0.0/16`, and clear of the service range 10.96.0.0/12.
const FIRST: u8 = 224;
const LAST: u8 = 254;

/// The file in `up`'s data dir recording the cluster CIDR it chose.
const RECORD: &str = "cluster-cidr";

/// The cluster CIDR of a `setpoint up` in `data_dir` that was given none: a `10.<y>.0.0/16`
/// held by an exclusive lock on `/run/setpoint/cluster-net-<y>.lock` for as long as the
/// returned file is open, so two clusters on this machine never hand out one range (a
/// killed process releases its lock with it). The choice is recorded in the data dir and
/// preferred at the next start, since the nodes keep the ranges they were given; a range
/// some interface of this host already has an address in is skipped.
pub fn claim_default(data_dir: &Path) -> anyhow::Result<(Cidr, std::fs::File)> {
    let record = data_dir.join(RECORD);
    let recorded = std::fs::read_to_string(&record)
        .ok()
        .and_then(|s| s.trim().parse::<Cidr>().ok())
        .and_then(|c| candidate_of(&c));
    let addresses = crate::container_runtime::host_ipv4_addresses();
    let claim = crate::container_runtime::NumberedClaim {
        lock_name: &|y| format!("cluster-net-{y}.lock"),
        record: &record,
        record_text: &|y| format!("{}\n", cidr_of(y)),
    };
    let (y, file) = claim
        .claim(recorded, FIRST..=LAST, |y| {
            let cidr = cidr_of(y);
            addresses.iter().any(|(_, addr)| {
                addr.parse::<std::net::IpAddr>()
                    .is_ok_and(|a| cidr.contains(&a))
            })
        })?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "every cluster CIDR 10.{FIRST}-{LAST}.0.0/16 is in use on this machine; give one with --cluster-cidr"
            )
        })?;
    Ok((cidr_of(y), file))
}

fn cidr_of(y: u8) -> Cidr {
    Cidr::new(std::net::Ipv4Addr::new(10, y, 0, 0).into(), 16).expect("a /16 fits IPv4")
}

/// `y` of a recorded `10.<y>.0.0/16` among the candidates.
fn candidate_of(cidr: &Cidr) -> Option<u8> {
    (FIRST..=LAST).find(|y| cidr_of(*y) == *cidr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_off_needs_no_range_and_on_needs_one() {
        let off = NodeIpamFlags::default();
        assert!(off.config(None).unwrap().is_none());
        let on = NodeIpamFlags {
            allocate_node_cidrs: true,
            node_cidr_mask_size: None,
        };
        assert!(on
            .config(None)
            .unwrap_err()
            .to_string()
            .contains("--cluster-cidr"));
        let config = on.config(Some("10.244.0.0/16")).unwrap().unwrap();
        assert_eq!(config.node_mask_sizes, [24]);
        assert_eq!(config.service_cidrs[0].to_string(), SERVICE_CIDR);
    }

    #[test]
    fn the_candidates_stay_clear_of_the_other_ranges() {
        let service: Cidr = SERVICE_CIDR.parse().unwrap();
        for y in FIRST..=LAST {
            let c = cidr_of(y);
            assert!(!c.overlaps(&service));
            assert!(!c.overlaps(&"10.222.0.0/15".parse().unwrap()));
            assert_eq!(candidate_of(&c), Some(y));
        }
        assert_eq!(candidate_of(&"10.1.0.0/16".parse().unwrap()), None);
    }
}
