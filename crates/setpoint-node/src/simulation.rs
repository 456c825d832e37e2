//! Many simulated nodes in one process ([`run_simulated`]), to load a cluster — ours or any
//! Kubernetes-compatible one, since only the public API is used.
//!
//! The nodes write through one client ([`run_simulated`], [`run_simulated_on`]), or each
//! through a client of its own identity ([`run_simulated_as`]), as a cluster enforcing the
//! Node authorizer and NodeRestriction requires: there a node may write only its own Node,
//! Lease and pods.
//!
//! Costs are shared where the API allows: ONE pod informer (all pods, routed client-side by
//! `spec.nodeName` to the hosted node's workers) and ONE node informer (label-selected to the
//! simulated nodes) serve every node, and Lease renewals are spread evenly over the renew
//! interval instead of arriving together. Each node still has its own runtime, Lease and pod
//! workers, exactly as the local agent does (the same code).
//!
//! The endpoint for logs and metrics is optional and, when enabled, ONE server serves every
//! simulated node: all of them advertise the same address and port, a log request is routed
//! by the pod's node, and `/metrics` sums over the nodes (each pod work queue keeps its own
//! `name` label, `pods-<node>`).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeSystemInfo, Pod, Taint};
use setpoint_runtime::client::Client;
use setpoint_runtime::informer::{Scope, SharedInformers};

use crate::agent::{arch, AgentConfig, AgentError, Capacity, KUBELET_VERSION};
use crate::host::{self, HostedNode};
use crate::metrics::NodeMetrics;
use crate::runtime::PodRuntime;
use crate::server::{LogServer, LogTargets};
use crate::simulated::{SharedLoad, SimulatedConfig, SimulatedRuntime, RUNTIME_VERSION};

/// The label every simulated node carries (value `"true"`).
pub const SIMULATED_LABEL: &str = "setpoint.dev/simulated";

/// How a simulation host behaves.
#[derive(Clone, Debug)]
pub struct SimulationConfig {
    /// How many nodes to host.
    pub nodes: usize,
    /// Node names are `<name_prefix><index>`, index from 0.
    pub name_prefix: String,
    /// Capacity of each node.
    pub capacity: Capacity,
    /// Extra labels of every node.
    pub labels: BTreeMap<String, String>,
    /// Taints of every node.
    pub taints: Vec<Taint>,
    /// `InternalIP` of every node (where the shared endpoint for logs and metrics is reached).
    pub address: String,
    /// How simulated containers behave.
    pub runtime: SimulatedConfig,
    /// Lease renewal interval of each node.
    pub lease_interval: Duration,
    /// Status check interval of each node.
    pub status_interval: Duration,
    /// Unchanged status is written at least this often.
    pub status_report_frequency: Duration,
    /// Every pod is synced at least this often.
    pub resync_interval: Duration,
    /// Concurrent pod syncs per node.
    pub pod_workers: usize,
    /// Where the shared endpoint for logs and metrics listens; it runs only with
    /// `client_ca_pem` set too.
    pub server_listen: Option<SocketAddr>,
    /// The CA signing accepted client certificates.
    pub client_ca_pem: Option<String>,
}

impl Default for SimulationConfig {
    fn default() -> Self {
        SimulationConfig {
            nodes: 1,
            name_prefix: "sim-node-".into(),
            capacity: Capacity {
                cpu: "8".into(),
                memory: "32Gi".into(),
                pods: 110,
            },
            labels: BTreeMap::new(),
            taints: Vec::new(),
            address: "127.0.0.1".into(),
            runtime: SimulatedConfig::default(),
            lease_interval: Duration::from_secs(10),
            status_interval: Duration::from_secs(10),
            status_report_frequency: Duration::from_secs(5 * 60),
            // Kubelet's default `--sync-frequency`. Simulated pods change only through the API
            // (which wakes their sync anyway), and a resync reads every pod of every node.
            resync_interval: Duration::from_secs(60),
            pod_workers: 2,
            server_listen: None,
            client_ca_pem: None,
        }
    }
}

impl SimulationConfig {
    /// The name of node `index`.
    pub fn node_name(&self, index: usize) -> String {
        format!("{}{index}", self.name_prefix)
    }

    /// The agent configuration of node `index`: honest system info (a simulated OS image and
    /// runtime), the simulation label.
    pub fn agent_config(&self, index: usize) -> AgentConfig {
        let name = self.node_name(index);
        let mut labels = self.labels.clone();
        labels.insert(SIMULATED_LABEL.into(), "true".into());
        AgentConfig {
            node_name: name.clone(),
            address: self.address.clone(),
            capacity: self.capacity.clone(),
            labels,
            annotations: Default::default(),
            instance_type: None,
            taints: self.taints.clone(),
            system_info: NodeSystemInfo {
                architecture: arch().into(),
                container_runtime_version: RUNTIME_VERSION.into(),
                kubelet_version: KUBELET_VERSION.into(),
                operating_system: "linux".into(),
                os_image: "setpoint simulated node".into(),
                machine_id: name,
                ..Default::default()
            },
            server_listen: self
                .server_listen
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
            client_ca_pem: self.client_ca_pem.clone(),
            lease_interval: self.lease_interval,
            status_interval: self.status_interval,
            status_report_frequency: self.status_report_frequency,
            resync_interval: self.resync_interval,
            pod_workers: self.pod_workers,
            api_server: None,
            dns: None,
        }
    }
}

/// Hosts `config.nodes` simulated nodes until `shutdown` resolves, on informers of their own.
pub async fn run_simulated(
    client: Client,
    config: SimulationConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AgentError> {
    let informers = SharedInformers::lean(client.clone());
    let result = run_simulated_on(client, &informers, config, shutdown).await;
    informers.shutdown().await;
    result
}

/// Hosts `config.nodes` simulated nodes until `shutdown` resolves, on informers the process
/// already shares (a process that also runs the scheduler keeps one cache of every pod, not
/// two). `informers` should be lean ([`SharedInformers::lean`]), as the agent's own are; the
/// caller shuts them down.
pub async fn run_simulated_on(
    client: Client,
    informers: &SharedInformers,
    config: SimulationConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AgentError> {
    let clients = vec![client; config.nodes];
    host_simulated(informers, clients, config, shutdown).await
}

/// Hosts `config.nodes` simulated nodes until `shutdown` resolves, node `i` writing through
/// `clients[i]`: under the Node authorizer and NodeRestriction each node must be
/// `system:node:<name>` in `system:nodes`, and may write only its own Node, Lease and pods.
///
/// The shared pod and node informers list and watch through `clients[0]`, the first node's
/// identity: upstream's `system:node` rules let a node list and watch every pod and node,
/// which is all the informers read, so no identity with more rights is needed. Fails with
/// [`AgentError::Identities`] unless there is exactly one client per node (and at least one).
pub async fn run_simulated_as(
    clients: Vec<Client>,
    config: SimulationConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AgentError> {
    let Some(first) = clients.first().filter(|_| clients.len() == config.nodes) else {
        return Err(AgentError::Identities {
            nodes: config.nodes,
            clients: clients.len(),
        });
    };
    let informers = SharedInformers::lean(first.clone());
    let result = host_simulated(&informers, clients, config, shutdown).await;
    informers.shutdown().await;
    result
}

/// Hosts the nodes of `config` on `informers`, node `i` writing through `clients[i]`.
async fn host_simulated(
    informers: &SharedInformers,
    clients: Vec<Client>,
    config: SimulationConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AgentError> {
    let pods = informers.typed::<Pod>(Scope::all());
    let nodes = informers.typed::<Node>(Scope::all().labels(&format!("{SIMULATED_LABEL}=true")));
    let n = config.nodes.max(1);
    // Informer metrics belong to whoever owns `informers`; the rest is this host's.
    let metrics = Arc::new(NodeMetrics::new());
    // One count of each controller's running pods across the hosted nodes, so a shared
    // total load is split among all of them (pods on other hosts are not counted).
    let load = SharedLoad::new();
    let hosted: Vec<HostedNode> = clients
        .into_iter()
        .take(config.nodes)
        .enumerate()
        .map(|(i, client)| HostedNode {
            client: client.with_metrics(metrics.client().clone()),
            config: Arc::new(config.agent_config(i)),
            runtime: Arc::new(SimulatedRuntime::with_shared_load(
                config.runtime.clone(),
                load.clone(),
            )) as Arc<dyn PodRuntime>,
            // Node i renews at i/n of the interval, so renewals arrive evenly.
            lease_offset: config.lease_interval.mul_f64(i as f64 / n as f64),
            queue_metrics: Some(metrics.workqueue().clone()),
        })
        .collect();
    let server = match (&config.client_ca_pem, config.server_listen) {
        (Some(ca), Some(listen)) => {
            let names = crate::agent::serving_names(&config.address, "localhost");
            let tls = crate::server::tls_config(&names, ca)?;
            let mut targets = LogTargets::new(pods.store());
            for h in &hosted {
                targets.add(&h.config.node_name, h.runtime.clone());
            }
            Some(LogServer::start(listen, tls, Arc::new(targets), metrics.clone()).await?)
        }
        (None, Some(listen)) => {
            tracing::warn!(%listen, "no client CA configured: the endpoint for logs and metrics is disabled");
            None
        }
        _ => None,
    };
    let port = server.as_ref().map_or(0, |s| s.local_addr().port());
    let result = host::run(pods, nodes, port, hosted, shutdown).await;
    if let Some(s) = server {
        s.stop().await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_node_needs_a_client_of_its_own() {
        let cluster = setpoint_testing::TestCluster::start().await;
        let two = SimulationConfig {
            nodes: 2,
            ..SimulationConfig::default()
        };
        let err = run_simulated_as(vec![cluster.client()], two, std::future::pending())
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                AgentError::Identities {
                    nodes: 2,
                    clients: 1
                }
            ),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "1 clients for 2 simulated nodes: each node needs a client of its own identity"
        );
        // No node, no identity to list with: refused rather than hosting nothing.
        let none = SimulationConfig {
            nodes: 0,
            ..SimulationConfig::default()
        };
        let err = run_simulated_as(Vec::new(), none, std::future::pending())
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            AgentError::Identities {
                nodes: 0,
                clients: 0
            }
        ));
        cluster.stop().await;
    }
}
