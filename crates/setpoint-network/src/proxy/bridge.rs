//! Bridged pod traffic through the IP hooks: `br_netfilter` with
//! `net.bridge.bridge-nf-call-iptables = 1`, which kube-proxy expects of the node and k3s's
//! agent sets up at start, as the proxy does here.
//!
//! A client pod and the endpoint its Service picked are often on the same pod bridge. The
//! request goes through the host (its destination, the cluster IP, is not on the bridge) and
//! is DNATed there, but the endpoint's reply is addressed to the client pod, so the bridge
//! switches it straight across: unless bridged packets pass the IP hooks, the reply never
//! meets the connection's conntrack entry, keeps the endpoint's address as its source, and
//! the client refuses it. With the setting, conntrack un-DNATs it and the endpoint still sees
//! the client's own address.

use std::path::Path;

/// The switch that sends bridged IPv4 packets through the IP hooks.
pub const SYSCTL: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";

/// Why bridged traffic cannot be made to pass the IP hooks.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    /// The `br_netfilter` module is not loaded and could not be.
    #[error("the br_netfilter module is not loaded and `modprobe br_netfilter` did not load it")]
    NoModule,
    /// The switch could not be turned on.
    #[error("cannot set {SYSCTL} to 1: {0}")]
    Sysctl(std::io::Error),
}

/// Loads `br_netfilter` if needed and turns the switch on; `Ok` once bridged packets pass
/// the IP hooks. The setting is the host's: every bridge's traffic then passes them, as on
/// any Kubernetes node.
pub async fn ensure() -> Result<(), BridgeError> {
    if !Path::new(SYSCTL).exists() {
        // A failure shows as the switch still missing.
        let _ = tokio::process::Command::new("modprobe")
            .arg("br_netfilter")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .await;
        if !Path::new(SYSCTL).exists() {
            return Err(BridgeError::NoModule);
        }
    }
    if is_on(&std::fs::read_to_string(SYSCTL).map_err(BridgeError::Sysctl)?) {
        return Ok(());
    }
    std::fs::write(SYSCTL, "1\n").map_err(BridgeError::Sysctl)?;
    Ok(())
}

/// Whether the switch's text says it is on.
pub fn is_on(text: &str) -> bool {
    text.trim() == "1"
}
