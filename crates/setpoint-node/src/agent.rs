//! The local node agent: one node, one runtime, the endpoint for logs and metrics.
//! [`run_agent`] is the entry point; [`AgentConfig::local`] fills the configuration from this
//! machine.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeSystemInfo, Pod, Taint};
use setpoint_runtime::client::{Client, ClientError};
use setpoint_runtime::informer::{
    InformerError, InformerOptions, Scope, SharedInformers, StartPolicy,
};

use crate::host::{self, HostedNode};
use crate::metrics::NodeMetrics;
use crate::runtime::PodRuntime;
use crate::server::{LogServer, LogTargets, ServerError};

/// The `kubeletVersion` nodes report.
pub const KUBELET_VERSION: &str = "v1.32.0-setpoint";
/// The `containerRuntimeVersion` of the process runtime.
pub const PROCESS_RUNTIME_VERSION: &str = "setpoint-process://0.1";
/// The kubelet's default port.
pub const DEFAULT_PORT: u16 = 10250;

/// What can stop an agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The Node could not be registered.
    #[error("registering node {0}: {1}")]
    Register(String, ClientError),
    /// An informer stopped before syncing.
    #[error("informer: {0}")]
    Informer(#[from] InformerError),
    /// The endpoint for logs and metrics could not start.
    #[error("node agent endpoint: {0}")]
    Server(#[from] ServerError),
    /// Simulated nodes on identities of their own were given a client count that is not
    /// their node count.
    #[error("{clients} clients for {nodes} simulated nodes: each node needs a client of its own identity")]
    Identities {
        /// How many nodes were to be hosted.
        nodes: usize,
        /// How many clients came with them.
        clients: usize,
    },
}

/// A node's resources (`status.capacity`; `allocatable` is the same, nothing is reserved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// CPUs as a quantity (`"4"`, `"3500m"`).
    pub cpu: String,
    /// Memory as a quantity (`"16Gi"`, `"16318412Ki"`).
    pub memory: String,
    /// How many pods the node runs at most.
    pub pods: u32,
}

impl Capacity {
    /// This machine: its CPUs, its total memory (`/proc/meminfo`), and 110 pods.
    pub fn of_machine() -> Capacity {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| mem_total_kib(&m))
            .map_or_else(|| "0".to_string(), |kib| format!("{kib}Ki"));
        Capacity {
            cpu: cpus.to_string(),
            memory,
            pods: 110,
        }
    }
}

/// `MemTotal` in KiB from the text of `/proc/meminfo`.
fn mem_total_kib(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The Kubernetes name of this machine's architecture.
pub fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn os_image() -> String {
    let release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".into())
}

/// The first non-loopback address this machine would use to reach other hosts (no packet is
/// sent: connecting a UDP socket only picks a route), or 127.0.0.1.
fn local_address() -> String {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect("192.0.2.1:9")?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified())
        .map_or_else(|| "127.0.0.1".into(), |ip| ip.to_string())
}

/// How one node agent behaves.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The Node's name.
    pub node_name: String,
    /// `InternalIP` address, also each pod's `hostIP` and where its endpoint (logs, metrics) is reached.
    pub address: String,
    /// Capacity and allocatable.
    pub capacity: Capacity,
    /// Extra labels (override the well-known ones).
    pub labels: BTreeMap<String, String>,
    /// Annotations the agent sets on its Node at registration (facts about the node no
    /// status field holds, such as how its process pods are networked).
    pub annotations: BTreeMap<String, String>,
    /// `node.kubernetes.io/instance-type`, if any.
    pub instance_type: Option<String>,
    /// Taints set at registration (kept on existing nodes too).
    pub taints: Vec<Taint>,
    /// `status.nodeInfo`; set `container_runtime_version` to name the runtime used.
    pub system_info: NodeSystemInfo,
    /// Where the endpoint for logs and `/metrics` listens (port 0: a free port, which is what
    /// gets reported).
    pub server_listen: SocketAddr,
    /// The CA that signs accepted client certificates (the cluster CA). `None` disables the
    /// endpoint for logs and metrics (the node then reports port 0).
    pub client_ca_pem: Option<String>,
    /// Lease renewal interval (Kubernetes: 10 s).
    pub lease_interval: Duration,
    /// How often status is checked and written if it changed (Kubernetes: 10 s).
    pub status_interval: Duration,
    /// Status is written at least this often even unchanged (Kubernetes: 5 min).
    pub status_report_frequency: Duration,
    /// Every pod is synced at least this often (a safety net under events).
    pub resync_interval: Duration,
    /// Concurrent pod syncs (different pods).
    pub pod_workers: usize,
    /// Where pods that share the node's network (process pods, `hostNetwork` pods) reach the
    /// API server: their `KUBERNETES_SERVICE_HOST` and `_PORT`. `None`: the master Service's
    /// cluster IP, as for every other pod.
    pub api_server: Option<crate::runtime::ApiServerAddress>,
    /// The node's cluster DNS server, if it runs one (the runtime says where, see
    /// `setpoint_network::dns::node`). Its Services and EndpointSlices come from this agent's
    /// informers.
    pub dns: Option<setpoint_network::dns::node::NodeDnsConfig>,
}

impl AgentConfig {
    /// The configuration of an agent for `node_name` on this machine: its CPUs, memory,
    /// address, OS facts, the process runtime, the logs and metrics endpoint on 0.0.0.0:10250
    /// (disabled until `client_ca_pem` is set), Kubernetes' intervals.
    pub fn local(node_name: &str) -> AgentConfig {
        AgentConfig {
            node_name: node_name.into(),
            address: local_address(),
            capacity: Capacity::of_machine(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            instance_type: None,
            taints: Vec::new(),
            system_info: NodeSystemInfo {
                architecture: arch().into(),
                boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
                container_runtime_version: PROCESS_RUNTIME_VERSION.into(),
                kernel_version: read_trimmed("/proc/sys/kernel/osrelease"),
                kube_proxy_version: String::new(),
                kubelet_version: KUBELET_VERSION.into(),
                machine_id: read_trimmed("/etc/machine-id"),
                operating_system: "linux".into(),
                os_image: os_image(),
                system_uuid: String::new(),
            },
            server_listen: SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)),
            client_ca_pem: None,
            lease_interval: Duration::from_secs(10),
            status_interval: Duration::from_secs(10),
            status_report_frequency: Duration::from_secs(5 * 60),
            resync_interval: Duration::from_secs(10),
            pod_workers: 4,
            api_server: None,
            dns: None,
        }
    }
}

/// Names the serving certificate is issued for.
pub(crate) fn serving_names(address: &str, node_name: &str) -> Vec<String> {
    let mut names = vec![
        address.to_string(),
        node_name.to_string(),
        "localhost".into(),
    ];
    names.dedup();
    names
}

/// Runs the node agent for `config.node_name` on `runtime` until `shutdown` resolves:
/// registers the Node, renews its Lease, runs the pods bound to it, and serves their logs and
/// the agent's metrics ([`NodeMetrics`]: its API requests, informers and pod work queue are
/// recorded there). Pods keep running in the runtime when it returns; a restarted agent
/// adopts them.
pub async fn run_agent(
    client: Client,
    config: AgentConfig,
    runtime: Arc<dyn PodRuntime>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AgentError> {
    let metrics = Arc::new(NodeMetrics::new());
    let client = client.with_metrics(metrics.client().clone());
    let informers = SharedInformers::with_options(
        client.clone(),
        InformerOptions {
            metrics: Some(metrics.informers().clone()),
            ..InformerOptions::lean()
        },
        StartPolicy::OnRequest,
    );
    let pods =
        informers.typed::<Pod>(Scope::all().fields(&format!("spec.nodeName={}", config.node_name)));
    let nodes = informers
        .typed::<Node>(Scope::all().fields(&format!("metadata.name={}", config.node_name)));
    // Kept until the agent stops. A node that cannot serve DNS (port 53 needs root) runs on:
    // its pods then resolve `ClusterFirst` as the runtime was told (see its cluster DNS).
    let _dns = match &config.dns {
        Some(dns) => match setpoint_network::dns::node::start_node(&informers, dns).await {
            Ok(running) => {
                tracing::info!(addresses = ?running.addresses(), domain = %dns.domain, "cluster DNS serving");
                Some(running)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cluster DNS not served on this node");
                None
            }
        },
        None => None,
    };
    // The node's DNS addresses become endpoints of the kube-dns Service once its Node exists
    // (the Node owns the slice); retried until then, as registration comes later.
    let published = _dns.as_ref().map(|running| {
        let client = client.clone();
        let node = config.node_name.clone();
        let addresses = running.addresses();
        tokio::spawn(async move {
            for attempt in 1u32.. {
                match setpoint_network::dns::kubedns::publish(&client, &node, &addresses).await {
                    Ok(()) => return,
                    // Until the Node is registered this fails; longer than that is news.
                    Err(e) if attempt % 30 == 0 => {
                        tracing::warn!(error = %e, "kube-dns endpoints not published")
                    }
                    Err(e) => tracing::debug!(error = %e, "kube-dns endpoints not published yet"),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    });
    let dns_client = client.clone();
    let node_name = config.node_name.clone();
    let server = match &config.client_ca_pem {
        Some(ca) => {
            let tls =
                crate::server::tls_config(&serving_names(&config.address, &config.node_name), ca)?;
            let mut targets = LogTargets::new(pods.store());
            targets.add(&config.node_name, runtime.clone());
            Some(
                LogServer::start(
                    config.server_listen,
                    tls,
                    Arc::new(targets),
                    metrics.clone(),
                )
                .await?,
            )
        }
        None => {
            tracing::warn!(
                "no client CA configured: the endpoint for logs and metrics is disabled"
            );
            None
        }
    };
    let port = server.as_ref().map_or(0, |s| s.local_addr().port());
    let hosted = vec![HostedNode {
        client,
        config: Arc::new(config),
        runtime,
        lease_offset: Duration::ZERO,
        queue_metrics: Some(metrics.workqueue().clone()),
    }];
    let result = host::run(pods, nodes, port, hosted, shutdown).await;
    if let Some(task) = published {
        task.abort();
        // Bounded: the API server may be stopping too (`setpoint up`).
        let withdraw = setpoint_network::dns::kubedns::withdraw(&dns_client, &node_name);
        match tokio::time::timeout(Duration::from_secs(5), withdraw).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "kube-dns endpoints of this node not withdrawn")
            }
            Err(_) => tracing::warn!("kube-dns endpoints of this node not withdrawn in 5 s"),
        }
    }
    informers.shutdown().await;
    if let Some(s) = server {
        s.stop().await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_total() {
        let m = "MemTotal:       16318412 kB\nMemFree:  100 kB\n";
        assert_eq!(mem_total_kib(m), Some(16318412));
        assert_eq!(mem_total_kib("nothing"), None);
    }

    #[test]
    fn local_config_describes_this_machine() {
        let c = AgentConfig::local("me");
        assert!(c.capacity.cpu.parse::<u32>().unwrap() >= 1);
        assert!(c.capacity.memory.ends_with("Ki"));
        assert_eq!(c.capacity.pods, 110);
        assert!(c.address.parse::<std::net::IpAddr>().is_ok());
        assert_eq!(c.system_info.kubelet_version, KUBELET_VERSION);
    }
}
