//! Loopback clients of endpoints off the loopback: `net.ipv4.conf.all.route_localnet = 1`,
//! which kube-proxy's iptables mode sets for its localhost node ports.
//!
//! The local node of `setpoint up` has the address 127.0.0.1, so its node ports and the
//! ingress of its LoadBalancer Services are there. A connection to 127.0.0.1 has the source
//! 127.0.0.1; once DNATed to a pod on the pod bridge, the kernel refuses to route a packet
//! with a loopback source off the loopback unless the outgoing interface allows it
//! (`route_localnet`). The rules then masquerade it to the bridge's address, so the pod's
//! reply comes back. The setting also lets packets from elsewhere addressed to 127.0.0.0/8 in,
//! which the rules drop unless a translation explains them, as the kubelet does.

use std::path::Path;

/// The switch that lets packets with loopback addresses be routed off the loopback.
pub const SYSCTL: &str = "/proc/sys/net/ipv4/conf/all/route_localnet";

/// Why loopback-sourced packets cannot be routed to pods.
#[derive(Debug, thiserror::Error)]
pub enum LocalnetError {
    /// The switch could not be read or turned on.
    #[error("cannot set {SYSCTL} to 1: {0}")]
    Sysctl(std::io::Error),
}

/// Turns the switch on; `Ok` once it is. The setting is the host's, as on any node whose
/// kube-proxy serves node ports on localhost.
pub async fn ensure() -> Result<(), LocalnetError> {
    let path = Path::new(SYSCTL);
    if super::bridge::is_on(&std::fs::read_to_string(path).map_err(LocalnetError::Sysctl)?) {
        return Ok(());
    }
    std::fs::write(path, "1\n").map_err(LocalnetError::Sysctl)
}
