//! The DNS server as a node runs it: on which addresses, and what the node's pods are told.
//!
//! Several clusters share one machine in tests and development, so a node's DNS server must
//! not take an address another node uses: it listens on addresses that are the node's own —
//! the gateway of its pod bridge (container pods reach it there, and so does the host, the
//! gateway being a host address) and one address of its loopback pod block (for the host and
//! process pods when there is no bridge).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use setpoint_runtime::SharedInformers;

use super::resolvconf::{ClusterDns, ResolvConf};
use super::server::{DnsServer, Upstreams};
use super::DnsError;

/// The port DNS is served on.
pub const DNS_PORT: u16 = 53;

/// The address of a node's loopback pod block the DNS server listens on: `127.B.255.253` for
/// the block `127.B.0.1` upward, outside the 65,000 addresses the process runtime hands out.
pub fn loopback_address(pod_block_first: Ipv4Addr) -> Ipv4Addr {
    let [a, b, ..] = pod_block_first.octets();
    Ipv4Addr::new(a, b, 255, 253)
}

/// The gateway of a pod bridge's subnet (`10.223.7.0/24` → `10.223.7.1`): the address the
/// CNI bridge plugin's `host-local` IPAM gives the bridge, the first of the subnet.
pub fn bridge_gateway(cidr: &str) -> Option<Ipv4Addr> {
    let (network, prefix) = cidr.split_once('/')?;
    let network: Ipv4Addr = network.parse().ok()?;
    let prefix: u32 = prefix.parse().ok().filter(|p| *p <= 30)?;
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    Some(Ipv4Addr::from((u32::from(network) & mask) + 1))
}

/// How a node runs its DNS server.
#[derive(Clone, Debug)]
pub struct NodeDnsConfig {
    /// The addresses it listens on (UDP and TCP each), in order of preference.
    pub addresses: Vec<IpAddr>,
    /// The port (53; tests use others).
    pub port: u16,
    /// The cluster domain (`--cluster-domain`).
    pub domain: String,
    /// The host's `resolv.conf`, whose nameservers get every other question.
    pub host: ResolvConf,
}

impl NodeDnsConfig {
    /// What the node's pods are told, as the kubelet's `--cluster-dns` and
    /// `--cluster-domain`: the servers given (`flag`), else this node's own first address.
    pub fn cluster_dns(&self, flag: &[IpAddr]) -> ClusterDns {
        let servers = if flag.is_empty() {
            self.addresses
                .iter()
                .take(1)
                .map(IpAddr::to_string)
                .collect()
        } else {
            flag.iter().map(IpAddr::to_string).collect()
        };
        ClusterDns {
            servers,
            domain: self.domain.clone(),
        }
    }
}

/// A node's running DNS servers (one per address, on shared caches); stopped when dropped.
pub struct NodeDns {
    servers: Vec<DnsServer>,
}

impl NodeDns {
    /// The addresses served on.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(DnsServer::local_addr).collect()
    }
}

/// Starts the node's DNS server on each of the config's addresses, answering from Service
/// and EndpointSlice informers of `informers` and forwarding to the host's resolvers (less
/// the node's own addresses).
pub async fn start_node(
    informers: &SharedInformers,
    config: &NodeDnsConfig,
) -> Result<NodeDns, DnsError> {
    let upstreams = Upstreams::from_resolv_conf(&config.host, &config.addresses);
    let mut servers = Vec::new();
    let mut shared = None;
    for ip in &config.addresses {
        let listen = SocketAddr::new(*ip, config.port);
        let server = match &shared {
            None => {
                let (server, directory, zone) =
                    super::start_parts(informers, listen, &config.domain, upstreams.clone())
                        .await?;
                shared = Some((directory, zone));
                server
            }
            Some((directory, zone)) => {
                DnsServer::start(listen, directory.clone(), zone.clone(), upstreams.clone()).await?
            }
        };
        servers.push(server);
    }
    Ok(NodeDns { servers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_of_the_node() {
        assert_eq!(
            loopback_address(Ipv4Addr::new(127, 4, 0, 1)),
            Ipv4Addr::new(127, 4, 255, 253)
        );
        assert_eq!(
            bridge_gateway("10.223.7.0/24"),
            Some(Ipv4Addr::new(10, 223, 7, 1))
        );
        assert_eq!(
            bridge_gateway("10.244.1.0/16"),
            Some(Ipv4Addr::new(10, 244, 0, 1))
        );
        assert_eq!(bridge_gateway("nonsense"), None);
        assert_eq!(bridge_gateway("10.0.0.0/31"), None);
    }

    #[test]
    fn pods_are_told_the_flag_or_the_nodes_own_address() {
        let config = NodeDnsConfig {
            addresses: vec![
                "10.223.7.1".parse().unwrap(),
                "127.4.255.253".parse().unwrap(),
            ],
            port: DNS_PORT,
            domain: "cluster.local".into(),
            host: ResolvConf::default(),
        };
        assert_eq!(config.cluster_dns(&[]).servers, vec!["10.223.7.1"]);
        assert_eq!(
            config.cluster_dns(&["10.96.0.10".parse().unwrap()]).servers,
            vec!["10.96.0.10"]
        );
    }
}
