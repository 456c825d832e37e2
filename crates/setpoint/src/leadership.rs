//! What the control-plane components that run against an API server share: connecting from a
//! kubeconfig, and leader election when they run as several replicas.

use std::path::Path;

use setpoint_runtime::client::{Client, Kubeconfig};
use setpoint_runtime::leader::{LeaderConfig, LeaderElector, LeaderHandle, LeaseLock};
use tokio::sync::watch;

/// A client for the API server in the kubeconfig at `path` (default: `$KUBECONFIG`, then
/// `~/.kube/config`), and the kubeconfig itself. `component` is its `User-Agent` name, which
/// the server records as the field manager of its writes.
pub fn connect(path: Option<&Path>, component: &str) -> anyhow::Result<(Client, Kubeconfig)> {
    let kubeconfig = match path {
        Some(p) => Kubeconfig::read(p)?,
        None => Kubeconfig::from_env()?,
    };
    let client = Client::from_kubeconfig(&kubeconfig)?.with_user_agent(component);
    Ok((client, kubeconfig))
}

/// A component's place in its election: the handle (to release the Lease on shutdown) and
/// the "am I leading" signal. Both are `None` when election is off (the component always acts).
pub struct Leadership {
    pub handle: Option<LeaderHandle>,
    pub leading: Option<watch::Receiver<bool>>,
}

/// Joins the election on the Lease `namespace/name`, when `enabled`.
pub fn elect(client: &Client, lease: (&str, &str), enabled: bool) -> anyhow::Result<Leadership> {
    if !enabled {
        return Ok(Leadership {
            handle: None,
            leading: None,
        });
    }
    let handle = LeaderElector::new(
        client.clone(),
        LeaseLock::new(lease.0, lease.1),
        LeaderConfig::default(),
    )?
    .start();
    tracing::info!(identity = handle.identity(), lease = %format!("{}/{}", lease.0, lease.1), "leader election");
    let leading = Some(handle.is_leader());
    Ok(Leadership {
        handle: Some(handle),
        leading,
    })
}

impl Leadership {
    /// Releases the Lease (if held) so another replica takes over at once, not after it
    /// expires.
    pub async fn release(self) {
        if let Some(h) = self.handle {
            h.shutdown().await;
        }
    }
}
