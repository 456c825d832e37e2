//! Which container runtime a local node runs its pods on, and getting it ready.
//!
//! `auto` (the default) runs containers through CRI when an endpoint is given, a system
//! containerd is running or a private one can be started (containerd, runc, the CNI plugins
//! and a static busybox installed, as root), and local processes otherwise. A CRI node keeps
//! the pods it already runs as processes where they are ([`setpoint_node::routed`]), so a
//! data dir from before containers were the default loses nothing.
//! `process` runs every pod as local processes; `cri` insists on containers.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use setpoint_api::cidr::Cidr;
use setpoint_network::dns::node::NodeDnsConfig;
use setpoint_network::dns::{ClusterDns, ResolvConf};
use setpoint_node::containerd::{self, DaemonOptions, LocalContainerd};
use setpoint_node::cri::runtime::{CriRuntime, CriRuntimeOptions};
use setpoint_node::cri::CriClient;
use setpoint_node::process::netns::{PodNetwork, NETWORK_ANNOTATION, NETWORK_REASON_ANNOTATION};
use setpoint_node::process::{ProcessRuntime, ProcessRuntimeOptions};
use setpoint_node::routed::RoutedRuntime;
use setpoint_node::runtime::PodRuntime;

/// The runtimes a local node can run pods on.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeKind {
    /// `cri` when an endpoint is given or containerd is running or installed, else `process`.
    Auto,
    /// Each container is a process of this machine (no images, no isolation).
    Process,
    /// Containers through the Container Runtime Interface (containerd).
    Cri,
}

/// How process pods are networked (`--process-pod-network`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessPodNetwork {
    /// Loopback addresses on the node's network.
    Host,
    /// A network namespace per pod on the node's pod bridge (needs root).
    Bridge,
    /// `bridge` when the agent runs as root with the CNI plugins (and on a CRI node the pod
    /// network is its private containerd's), else `host`, saying why in the log and on the
    /// Node (`setpoint.io/process-pod-network-reason`).
    Auto,
}

/// `--container-runtime` and `--container-runtime-endpoint`, shared by `setpoint up` and
/// `setpoint agent`.
#[derive(clap::Args, Clone, Debug)]
pub struct ContainerRuntimeFlags {
    /// What the local node runs pods on. `cri`: containers through containerd (the
    /// `--container-runtime-endpoint` given, else a running system containerd, else a
    /// private one started under the data dir); pods the node already runs as processes
    /// stay processes. `process`: every container a local process
    /// (no images, no isolation). `auto`: `cri` when an endpoint is given or containerd is
    /// running or installed (with runc, the CNI plugins and a static busybox, as root),
    /// else `process`.
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "SETPOINT_CONTAINER_RUNTIME"
    )]
    pub container_runtime: RuntimeKind,
    /// How pods run as local processes are networked. `auto` (the default): `bridge` when it
    /// can run here (root, the CNI plugins, and on a CRI node a private containerd), else
    /// `host`; the Node's `setpoint.io/process-pod-network` annotation says which, and
    /// `setpoint.io/process-pod-network-reason` why not `bridge`. `bridge` (as root): each
    /// gets a network namespace of its own on the node's pod bridge and an address from the
    /// pod range, as container pods do (the private containerd's network, or on a
    /// process-only node a `10.223.<x>.0/24` bridge of its own); refused where it cannot run.
    /// `host`: each gets an address of its own from the loopback range 127.0.0.0/8 and shares
    /// the node's network (reachable from this machine only; two replicas cannot both listen
    /// on `0.0.0.0` at one port).
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "SETPOINT_PROCESS_POD_NETWORK"
    )]
    pub process_pod_network: ProcessPodNetwork,
    /// The node's pod range (`spec.podCIDR`) when the cluster gives nodes ranges: the subnet
    /// of the bridge the node's pods join (a private containerd's, or the process pods'),
    /// instead of a `10.223.<x>.0/24` of this machine's own.
    #[arg(skip)]
    pub pod_cidr: Option<Cidr>,
    /// The cluster CIDR (the range node ranges come from, `--cluster-cidr`), when known:
    /// pod traffic to it keeps the pod's address, traffic leaving it is masqueraded. Unknown,
    /// only traffic within the node's own pod range keeps it.
    #[arg(skip)]
    pub cluster_cidr: Option<Cidr>,
    /// The CRI runtime's socket, `unix:///path/to/socket` (with `cri` or `auto`),
    /// as kubelet's flag of the same name. Its own CNI network and sandbox image apply.
    #[arg(long)]
    pub container_runtime_endpoint: Option<String>,
    /// Image garbage collection on CRI nodes.
    #[command(flatten)]
    pub image_gc: ImageGcFlags,
    /// The cluster DNS pods are told.
    #[command(flatten)]
    pub dns: DnsFlags,
}

/// The kubelet's `--cluster-dns` and `--cluster-domain`.
#[derive(clap::Args, Clone, Debug)]
pub struct DnsFlags {
    /// The DNS servers pods of `dnsPolicy: ClusterFirst` use, comma-separated (the kubelet's
    /// flag). Default: the node's own cluster DNS server, which a node with a private
    /// containerd, or with `--process-pod-network bridge`, runs on its pod bridge's gateway;
    /// a node without one tells pods nothing, and they resolve as `dnsPolicy: Default`.
    #[arg(long, value_delimiter = ',')]
    pub cluster_dns: Vec<std::net::IpAddr>,
    /// The cluster's DNS domain (the kubelet's flag).
    #[arg(long, default_value = setpoint_network::dns::DEFAULT_CLUSTER_DOMAIN)]
    pub cluster_domain: String,
}

impl Default for DnsFlags {
    fn default() -> Self {
        DnsFlags {
            cluster_dns: Vec::new(),
            cluster_domain: setpoint_network::dns::DEFAULT_CLUSTER_DOMAIN.to_string(),
        }
    }
}

/// The kubelet's image garbage collection flags, for CRI nodes.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct ImageGcFlags {
    /// The percent of the image filesystem's space used at which unused images start being
    /// removed (100 never removes any), as kubelet's flag of the same name.
    #[arg(long, default_value_t = 85, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub image_gc_high_threshold: u8,
    /// The percent of the image filesystem's space used that image garbage collection
    /// frees down to; below the high threshold.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub image_gc_low_threshold: u8,
}

impl Default for ImageGcFlags {
    fn default() -> Self {
        Self {
            image_gc_high_threshold: setpoint_node::cri::gc::DEFAULT_HIGH_THRESHOLD,
            image_gc_low_threshold: setpoint_node::cri::gc::DEFAULT_LOW_THRESHOLD,
        }
    }
}

impl ImageGcFlags {
    /// The CRI runtime's options with these thresholds; refused, in the kubelet's words,
    /// when the low threshold is not below the high one.
    pub fn options(&self, logs: &Path) -> anyhow::Result<CriRuntimeOptions> {
        if self.image_gc_low_threshold >= self.image_gc_high_threshold {
            anyhow::bail!(
                "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) {} must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) {}",
                self.image_gc_low_threshold,
                self.image_gc_high_threshold
            );
        }
        let mut options = CriRuntimeOptions::new(logs);
        options.image_gc_high_threshold = self.image_gc_high_threshold;
        options.image_gc_low_threshold = self.image_gc_low_threshold;
        Ok(options)
    }
}

/// The first pod subnet `10.223.<x>.0/24` tried. Private containerds of nodes take
/// 10.223.0.0/16, apart from the tests' `TestContainerd` (10.222.0.0/16).
const SUBNET_PREFIX: &str = "10.223";

/// Where the subnet locks of every private containerd on this machine are (the directory a
/// private containerd already uses for sockets whose path would be too long).
const LOCK_DIR: &str = "/run/setpoint";

/// A local node's runtime, ready to run pods.
pub struct NodeRuntime {
    /// The runtime the agent drives.
    pub runtime: Arc<dyn PodRuntime>,
    /// The Node's `status.nodeInfo.containerRuntimeVersion`.
    pub version: String,
    /// One line that says what pods run on (logged and printed).
    pub description: String,
    /// The private containerd, if this process started one.
    containerd: Option<LocalContainerd>,
    /// Held while the private containerd uses its subnet.
    _subnet_lock: Option<std::fs::File>,
    /// The cluster DNS server the node runs, if any: on its private containerd's bridge.
    pub dns: Option<NodeDnsConfig>,
    /// The pod subnet of the node's own pod bridge (its private containerd's, or its process
    /// pods' with `--process-pod-network bridge`), if it has one: the service proxy's cluster
    /// CIDR unless `--cluster-cidr` says otherwise.
    pub pod_subnet: Option<String>,
    /// The Node annotations saying how process pods are networked here.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// The nftables table masquerading the node's pod traffic that leaves the cluster, when
    /// the node has a pod network of its own; deleted at [`NodeRuntime::stop`].
    masquerade: Option<String>,
    /// The bridge of a process-only node's own pod network; deleted at [`NodeRuntime::stop`]
    /// when no pod is attached to it any more.
    own_bridge: Option<String>,
}

impl NodeRuntime {
    /// Stops the private containerd, if any (its containers keep running in their shims,
    /// and the next start adopts them), and removes the node's masquerade rule, and the
    /// process pods' own bridge when no pod uses it (pods left running keep it, and the next
    /// start adopts them on it).
    pub async fn stop(self) {
        let NodeRuntime {
            runtime,
            containerd,
            masquerade,
            own_bridge,
            _subnet_lock: subnet_lock,
            ..
        } = self;
        // The CRI runtime's monitor goes first: it would only see containerd gone.
        drop(runtime);
        if let Some(c) = containerd {
            if let Err(e) = c.stop().await {
                tracing::warn!(error = %e, "stopping the private containerd");
            }
        }
        if let Some(table) = masquerade {
            if let Err(e) = setpoint_network::masquerade::remove(&table).await {
                tracing::warn!(error = %e, table = %table, "removing the pod masquerade rule");
            }
        }
        // Still holding the subnet's lock: no other node can have taken the bridge over.
        if let Some(bridge) = own_bridge {
            remove_unused_bridge(&bridge).await;
        }
        drop(subnet_lock);
    }
}

/// Whether a bridge whose ports are listed in `brif` (`/sys/class/net/<bridge>/brif`) exists
/// and has none: a pod left running keeps its veth on the bridge.
fn bridge_unused(brif: &Path) -> bool {
    match std::fs::read_dir(brif) {
        Ok(mut ports) => ports.next().is_none(),
        Err(_) => false,
    }
}

/// Deletes `bridge` if no pod is attached to it; logs why not otherwise.
async fn remove_unused_bridge(bridge: &str) {
    let brif = Path::new("/sys/class/net").join(bridge).join("brif");
    if !bridge_unused(&brif) {
        if brif.exists() {
            tracing::info!(bridge, "pods left running keep the pod bridge");
        }
        return;
    }
    match tokio::process::Command::new("ip")
        .args(["link", "del", bridge])
        .output()
        .await
    {
        Ok(out) if out.status.success() => tracing::info!(bridge, "pod bridge removed"),
        Ok(out) => tracing::warn!(
            bridge,
            error = %String::from_utf8_lossy(&out.stderr).trim(),
            "removing the pod bridge"
        ),
        Err(e) => tracing::warn!(bridge, error = %e, "removing the pod bridge"),
    }
}

impl ContainerRuntimeFlags {
    /// Opens the runtime these flags name. `node_dir` holds the process runtime's state
    /// (and, under `containers/`, the CRI pods' logs); a private containerd lives in
    /// `containerd_dir`. Says which runtime it chose and why in the log.
    pub async fn open(
        &self,
        node_dir: &Path,
        containerd_dir: &Path,
    ) -> anyhow::Result<NodeRuntime> {
        std::fs::create_dir_all(node_dir)
            .with_context(|| format!("creating {}", node_dir.display()))?;
        let (kind, why) = self.choose();
        tracing::info!(runtime = ?kind, reason = %why, "container runtime chosen");
        match kind {
            RuntimeKind::Process | RuntimeKind::Auto => {
                if let Some(endpoint) = &self.container_runtime_endpoint {
                    anyhow::bail!(
                        "--container-runtime-endpoint {endpoint} needs --container-runtime cri or auto"
                    );
                }
                let mut options = ProcessRuntimeOptions::default();
                let mut subnet_lock = None;
                let mut own_bridge = None;
                let mut description =
                    format!("as local processes (state in {})", node_dir.display());
                let (mode, annotations) = self.process_network(true);
                if mode == ProcessPodNetwork::Bridge {
                    let (network, subnet, bridge, lock) = self.own_pod_network(containerd_dir)?;
                    options.network = Some(network);
                    subnet_lock = Some(lock);
                    own_bridge = Some(bridge);
                    description.push_str(&format!(
                        ", each in a network namespace on the pod subnet {subnet}"
                    ));
                }
                // With a bridge of its own, the node serves cluster DNS on its gateway, as a
                // node with a private containerd does.
                let subnet = options.network.as_ref().and_then(PodNetwork::subnet);
                let (dns, cluster_dns) = self.node_dns(subnet.as_deref());
                options.cluster_dns = cluster_dns;
                let runtime = ProcessRuntime::with_options(node_dir, options)
                    .with_context(|| format!("process runtime in {}", node_dir.display()))?;
                let masquerade = match &subnet {
                    Some(subnet) => self.masquerade(subnet, containerd_dir).await,
                    None => None,
                };
                Ok(NodeRuntime {
                    runtime: Arc::new(runtime),
                    version: setpoint_node::agent::PROCESS_RUNTIME_VERSION.to_string(),
                    description,
                    containerd: None,
                    _subnet_lock: subnet_lock,
                    dns,
                    // The process pods' bridge, when they have one, is the node's pod range
                    // as a private containerd's is: the proxy's local traffic.
                    pod_subnet: subnet,
                    annotations,
                    masquerade,
                    own_bridge,
                })
            }
            RuntimeKind::Cri => {
                let opened = self.open_cri(node_dir, containerd_dir).await;
                if self.container_runtime == RuntimeKind::Auto {
                    // Containers were chosen because containerd looked usable; when it is
                    // not, say how to run processes instead rather than quietly doing so.
                    opened.with_context(|| {
                        format!("--container-runtime auto chose containers ({why}); --container-runtime process runs pods as local processes instead")
                    })
                } else {
                    opened
                }
            }
        }
    }

    /// Whether the runtime these flags open configures a pod network of the node's own (a
    /// private containerd's bridge, or process pods' with `--process-pod-network bridge` or
    /// `auto` resolved to it), which is then on [`Self::pod_cidr`] when the cluster gives one.
    pub fn needs_pod_subnet(&self) -> bool {
        if self.choose().0 == RuntimeKind::Cri {
            // Process pods of a CRI node join its private containerd's network, if any: a
            // system containerd's or an endpoint's network is not the node's to place.
            self.container_runtime_endpoint.is_none()
                && containerd::find_system_endpoint().is_none()
        } else {
            self.process_network_mode(true).0 == ProcessPodNetwork::Bridge
        }
    }

    /// The subnet of the node's pod bridge: its range when it has one, else the claimed
    /// `10.223.<x>.0/24`.
    fn pod_subnet(&self, x: u8) -> String {
        match &self.pod_cidr {
            Some(cidr) => cidr.to_string(),
            None => format!("{SUBNET_PREFIX}.{x}.0/24"),
        }
    }

    /// The pod network of a process-only node: a bridge of its own on its `spec.podCIDR`, or
    /// else a claimed `10.223.<x>.0/24` subnet (the bridge is named by the claimed `x` either
    /// way), written where a private containerd of the same data dir would write it (so one
    /// started later shares the bridge, the range and `host-local`'s records). Returns the
    /// network, its subnet, its bridge's name and the subnet's lock.
    fn own_pod_network(
        &self,
        containerd_dir: &Path,
    ) -> anyhow::Result<(PodNetwork, String, String, std::fs::File)> {
        let bin_dir = bridge_network_prerequisites()?;
        std::fs::create_dir_all(containerd_dir)
            .with_context(|| format!("creating {}", containerd_dir.display()))?;
        let (x, lock) = claim_subnet(containerd_dir)?;
        let subnet = self.pod_subnet(x);
        let ipam_data_dir = containerd_dir.join("cni").join("ipam");
        let file = conflist_path(containerd_dir);
        for dir in [
            ipam_data_dir.as_path(),
            file.parent().unwrap_or(containerd_dir),
        ] {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let text = containerd::config::cni_conflist(&containerd::config::CniNetwork {
            name: bridge_name(x),
            bridge: bridge_name(x),
            subnet: subnet.clone(),
            ipam_data_dir,
        });
        std::fs::write(&file, &text).with_context(|| format!("writing {}", file.display()))?;
        let network =
            PodNetwork::new(bin_dir, &text).with_context(|| file.display().to_string())?;
        Ok((network, subnet, bridge_name(x), lock))
    }

    /// Installs the masquerade rule of the node's pod network on `subnet` (whose files are
    /// under `containerd_dir`, which names the rule's table); its table, or `None` with a
    /// warning when nftables cannot be programmed here (pods then reach only the cluster).
    async fn masquerade(&self, subnet: &str, containerd_dir: &Path) -> Option<String> {
        let pod_range = match subnet.parse::<Cidr>() {
            Ok(range) => range,
            Err(e) => {
                tracing::warn!(error = %e, subnet, "pod traffic leaving the cluster is not masqueraded");
                return None;
            }
        };
        let config = setpoint_network::masquerade::MasqueradeConfig {
            table: setpoint_network::masquerade::table_name(&containerd_dir.display().to_string()),
            pod_range,
            cluster_cidr: self.cluster_cidr,
        };
        match setpoint_network::masquerade::install(&config).await {
            Ok(()) => Some(config.table),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot program nftables: pod traffic leaving the cluster CIDR is not masqueraded, so pods reach only the cluster and this node's own addresses"
                );
                None
            }
        }
    }

    /// The runtime to open, `auto` resolved, and why.
    fn choose(&self) -> (RuntimeKind, String) {
        match self.container_runtime {
            RuntimeKind::Process => (RuntimeKind::Process, "--container-runtime process".into()),
            RuntimeKind::Cri => (RuntimeKind::Cri, "--container-runtime cri".into()),
            RuntimeKind::Auto => {
                if let Some(endpoint) = &self.container_runtime_endpoint {
                    return (
                        RuntimeKind::Cri,
                        format!("--container-runtime-endpoint {endpoint} given"),
                    );
                }
                if let Some(socket) = containerd::find_system_endpoint() {
                    return (
                        RuntimeKind::Cri,
                        format!("a containerd is running at {}", socket.display()),
                    );
                }
                match containerd::testing::missing_prerequisites() {
                    None => (
                        RuntimeKind::Cri,
                        "containerd, runc and the CNI plugins are installed".into(),
                    ),
                    Some(reason) => (
                        RuntimeKind::Process,
                        format!("no containerd to run containers with: {reason}"),
                    ),
                }
            }
        }
    }

    /// How process pods are networked, `auto` resolved (`node_bridge`: the node has a pod
    /// bridge of its own for them), and the Node annotations saying so. When `auto` gives
    /// them the node's network, the log says why too.
    fn process_network(&self, node_bridge: bool) -> (ProcessPodNetwork, BTreeMap<String, String>) {
        let (mode, why) = self.process_network_mode(node_bridge);
        let name = if mode == ProcessPodNetwork::Bridge {
            "bridge"
        } else {
            "host"
        };
        let mut annotations = BTreeMap::from([(NETWORK_ANNOTATION.to_string(), name.to_string())]);
        if let Some(why) = why {
            tracing::warn!(
                reason = %why,
                "process pods get loopback addresses on the node's network (--process-pod-network auto)"
            );
            annotations.insert(
                NETWORK_REASON_ANNOTATION.to_string(),
                format!("process pods get loopback addresses on the node's network: {why}"),
            );
        }
        (mode, annotations)
    }

    /// `--process-pod-network` with `auto` resolved (`node_bridge`: the node has a pod bridge
    /// of its own for process pods), and why `auto` chose `host`.
    fn process_network_mode(&self, node_bridge: bool) -> (ProcessPodNetwork, Option<String>) {
        match self.process_pod_network {
            ProcessPodNetwork::Auto => {
                let why = if !setpoint_node::process::netns::permitted() {
                    Some(
                        "the agent does not run as root (no CAP_NET_ADMIN and CAP_SYS_ADMIN)"
                            .to_string(),
                    )
                } else if containerd::config::find_cni_bin_dir().is_none() {
                    Some(format!(
                        "no CNI plugins in {}",
                        containerd::config::CNI_BIN_DIRS.join(" or ")
                    ))
                } else if !node_bridge {
                    Some("the CRI runtime's pod network is not the node's own (a system containerd or --container-runtime-endpoint)".to_string())
                } else {
                    None
                };
                match why {
                    None => (ProcessPodNetwork::Bridge, None),
                    Some(why) => (ProcessPodNetwork::Host, Some(why)),
                }
            }
            mode => (mode, None),
        }
    }

    /// The cluster DNS server the node runs on the gateway of its pod bridge's `subnet`
    /// (none without one), and what pods are told: `--cluster-dns`, else that server.
    fn node_dns(&self, subnet: Option<&str>) -> (Option<NodeDnsConfig>, ClusterDns) {
        let dns = subnet
            .and_then(setpoint_network::dns::node::bridge_gateway)
            .map(|gateway| NodeDnsConfig {
                addresses: vec![gateway.into()],
                port: setpoint_network::dns::node::DNS_PORT,
                domain: self.dns.cluster_domain.clone(),
                host: ResolvConf::parse(
                    &std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
                ),
            });
        let cluster_dns = match &dns {
            Some(dns) => dns.cluster_dns(&self.dns.cluster_dns),
            None => ClusterDns {
                servers: self
                    .dns
                    .cluster_dns
                    .iter()
                    .map(|ip| ip.to_string())
                    .collect(),
                domain: self.dns.cluster_domain.clone(),
            },
        };
        (dns, cluster_dns)
    }

    async fn open_cri(
        &self,
        node_dir: &Path,
        containerd_dir: &Path,
    ) -> anyhow::Result<NodeRuntime> {
        let mut containerd = None;
        let mut subnet_lock = None;
        let mut subnet = None;
        let endpoint = match &self.container_runtime_endpoint {
            Some(endpoint) => endpoint.clone(),
            None => {
                let image_cache = containerd_dir.join("images");
                let local = match containerd::find_system_endpoint() {
                    Some(socket) => LocalContainerd::System(socket),
                    None => {
                        if let Some(reason) = containerd::testing::missing_prerequisites() {
                            anyhow::bail!(
                                "--container-runtime cri: no --container-runtime-endpoint given, no containerd running at {}, and a private one cannot run here: {reason}. A private containerd needs root and containerd, runc, the CNI plugins, iptables and a static busybox installed (Debian: `apt-get install containerd runc containernetworking-plugins iptables busybox-static`)",
                                containerd::SYSTEM_SOCKET
                            );
                        }
                        std::fs::create_dir_all(containerd_dir)
                            .with_context(|| format!("creating {}", containerd_dir.display()))?;
                        let (x, lock) = claim_subnet(containerd_dir)?;
                        let cidr = self.pod_subnet(x);
                        let options = DaemonOptions::new(bridge_name(x), cidr.clone());
                        subnet_lock = Some(lock);
                        subnet = Some(cidr);
                        LocalContainerd::find_or_start(containerd_dir, options)
                            .await
                            .with_context(|| {
                                format!("starting containerd in {}", containerd_dir.display())
                            })?
                    }
                };
                let imported =
                    containerd::ensure_local_images(local.endpoint(), &image_cache).await;
                match (&local, imported) {
                    (_, Ok(())) => {}
                    // A system containerd has its own sandbox image; the local busybox is a
                    // convenience there.
                    (LocalContainerd::System(socket), Err(e)) => tracing::warn!(
                        error = %e,
                        socket = %socket.display(),
                        "could not import the local images into the system containerd"
                    ),
                    (LocalContainerd::Private(_), Err(e)) => {
                        let _ = local.stop().await;
                        return Err(e).context("importing the local images into containerd");
                    }
                }
                let endpoint = format!("unix://{}", local.endpoint().display());
                containerd = Some(local);
                endpoint
            }
        };
        // A private containerd's subnet tells its bridge (a system containerd's bridge is its
        // own business).
        let (dns, cluster_dns) = self.node_dns(subnet.as_deref());
        // Process pods can join only a pod network the agent knows: its private containerd's.
        let (mode, annotations) = self.process_network(subnet.is_some());
        let opened = async {
            let client = CriClient::connect(&endpoint)
                .await
                .with_context(|| format!("connecting to the CRI runtime at {endpoint}"))?;
            let version = version_once_ready(&client)
                .await
                .with_context(|| format!("asking the CRI runtime at {endpoint} its version"))?;
            let logs = node_dir.join(CONTAINER_LOGS_DIR);
            move_container_logs(node_dir, &logs)?;
            let mut options = self.image_gc.options(&logs)?;
            options.cluster_dns = cluster_dns.clone();
            let containers = CriRuntime::new(client, options)
                .await
                .with_context(|| format!("CRI runtime at {endpoint}"))?;
            let mut process_options = ProcessRuntimeOptions::default();
            if mode == ProcessPodNetwork::Bridge {
                process_options.network =
                    Some(containerd_pod_network(subnet.as_deref(), containerd_dir)?);
                process_options.cluster_dns = cluster_dns.clone();
            }
            let processes = ProcessRuntime::with_options(node_dir, process_options)
                .with_context(|| format!("process runtime in {}", node_dir.display()))?;
            let runtime = RoutedRuntime::new(Arc::new(containers), Arc::new(processes));
            anyhow::Ok((runtime, version))
        }
        .await;
        let (runtime, version) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                if let Some(c) = &containerd {
                    let _ = c.stop().await;
                }
                return Err(e);
            }
        };
        // A private containerd's network is the node's own, and so is masquerading it.
        let masquerade = match &subnet {
            Some(subnet) => self.masquerade(subnet, containerd_dir).await,
            None => None,
        };
        let which = match &containerd {
            Some(LocalContainerd::Private(_)) => "private ",
            Some(LocalContainerd::System(_)) => "system ",
            None => "",
        };
        let mut description = format!(
            "in {which}{} {} at {endpoint}",
            version.runtime_name, version.runtime_version
        );
        if let Some(subnet) = &subnet {
            description.push_str(&format!(" (pod subnet {subnet})"));
        }
        description.push_str(&format!(
            "; pods it ran as processes stay processes (state in {})",
            node_dir.display()
        ));
        Ok(NodeRuntime {
            runtime: Arc::new(runtime),
            version: format!("{}://{}", version.runtime_name, version.runtime_version),
            description,
            containerd,
            _subnet_lock: subnet_lock,
            dns,
            pod_subnet: subnet,
            annotations,
            masquerade,
            own_bridge: None,
        })
    }
}

/// Why `--process-pod-network bridge` cannot run here, if it cannot: it needs root (network
/// namespaces, links and addresses) and the CNI plugins. Returns the plugins' directory.
fn bridge_network_prerequisites() -> anyhow::Result<PathBuf> {
    if !setpoint_node::process::netns::permitted() {
        anyhow::bail!(
            "--process-pod-network bridge needs CAP_NET_ADMIN and CAP_SYS_ADMIN (run as root); --process-pod-network host gives process pods loopback addresses instead"
        );
    }
    containerd::config::find_cni_bin_dir().ok_or_else(|| {
        anyhow::anyhow!(
            "--process-pod-network bridge needs the CNI plugins ({}) in {} (Debian: `apt-get install containernetworking-plugins`)",
            containerd::config::CNI_PLUGINS.join(", "),
            containerd::config::CNI_BIN_DIRS.join(" or ")
        )
    })
}

/// The CNI network list file under a private containerd's directory (`daemon` writes it).
fn conflist_path(containerd_dir: &Path) -> PathBuf {
    containerd_dir
        .join("cni")
        .join("net.d")
        .join("10-setpoint.conflist")
}

/// The pod network of a CRI node, for its process pods: its private containerd's network
/// list (`subnet` is that containerd's; `None`: the runtime is not a private containerd,
/// whose network this agent does not know).
fn containerd_pod_network(
    subnet: Option<&str>,
    containerd_dir: &Path,
) -> anyhow::Result<PodNetwork> {
    let bin_dir = bridge_network_prerequisites()?;
    if subnet.is_none() {
        anyhow::bail!(
            "--process-pod-network bridge on a CRI node needs the private containerd's pod network; with a system containerd or --container-runtime-endpoint use --process-pod-network host"
        );
    }
    let file = conflist_path(containerd_dir);
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    PodNetwork::new(bin_dir, &text).with_context(|| file.display().to_string())
}

/// How long a containerd that has just opened its socket may take to initialize its CRI
/// plugin.
const CRI_INIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The runtime's version, once its CRI server answers. containerd opens its socket before
/// its CRI plugin has initialized and answers `Unknown: server is not initialized yet`
/// meanwhile (a freshly started private containerd often does): that is waited out, within
/// [`CRI_INIT_TIMEOUT`]; any other error is returned at once.
async fn version_once_ready(
    client: &CriClient,
) -> Result<setpoint_node::cri::api::VersionResponse, setpoint_node::cri::CriError> {
    let deadline = tokio::time::Instant::now() + CRI_INIT_TIMEOUT;
    loop {
        match client.version().await {
            Err(e)
                if e.to_string().contains("not initialized")
                    && tokio::time::Instant::now() < deadline =>
            {
                tracing::debug!(error = %e, "waiting for the CRI server to initialize");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            result => return result,
        }
    }
}

/// The directory under a CRI node's directory that holds its containers' logs (the process
/// runtime, which routes image-less pods, owns the node directory's `pods/`).
const CONTAINER_LOGS_DIR: &str = "containers";

/// Moves the containers' log directories (`pods/<namespace>_<name>_<uid>`) an older version
/// kept directly under the node directory to `logs`, where the CRI runtime now looks: the
/// process runtime, which owns `<node_dir>/pods/`, removes what it cannot read as its own
/// state. A rename keeps the files, so containerd keeps writing to the logs it holds open.
/// Process pods' directories are bare uids, which never contain `_`.
fn move_container_logs(node_dir: &Path, logs: &Path) -> anyhow::Result<()> {
    let old = node_dir.join("pods");
    let Ok(entries) = std::fs::read_dir(&old) else {
        return Ok(());
    };
    let new = logs.join("pods");
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().contains('_') {
            continue;
        }
        std::fs::create_dir_all(&new).with_context(|| format!("creating {}", new.display()))?;
        let to = new.join(entry.file_name());
        std::fs::rename(entry.path(), &to)
            .with_context(|| format!("moving {} to {}", entry.path().display(), to.display()))?;
    }
    Ok(())
}

/// The bridge (and CNI network) of the private containerd on subnet `x`: at most 15 bytes,
/// and not the tests' `sp-t<x>`.
fn bridge_name(x: u8) -> String {
    format!("sp-n{x}")
}

/// The file in a private containerd's directory that records its subnet's `x`.
const SUBNET_FILE: &str = "pod-subnet";

/// Picks `x` of the pod subnet `10.223.<x>.0/24` for the private containerd in `dir` and
/// locks it for as long as the returned file is open.
///
/// A subnet is chosen by a lock rather than derived from the data dir's path because two
/// data dirs could derive the same one, while an exclusive `flock` on
/// `/run/setpoint/pod-net-<x>.lock` makes it impossible for two `setpoint` processes on this
/// machine to share one (and a killed process releases its lock with it). The `x` chosen is
/// recorded in the data dir and preferred at the next start: pods outlive the agent, and
/// their bridge keeps the old subnet's gateway address, so the same data dir should get the
/// same subnet back. A subnet some other interface already has is skipped.
fn claim_subnet(dir: &Path) -> anyhow::Result<(u8, std::fs::File)> {
    let record = dir.join(SUBNET_FILE);
    let recorded = std::fs::read_to_string(&record)
        .ok()
        .and_then(|s| s.trim().parse::<u8>().ok())
        .filter(|x| *x >= 1);
    let addresses = host_ipv4_addresses();
    let claim = NumberedClaim {
        lock_name: &|x| format!("pod-net-{x}.lock"),
        record: &record,
        record_text: &|x| format!("{x}\n"),
    };
    claim
        .claim(recorded, 1..=254u8, |x| {
            let prefix = format!("{SUBNET_PREFIX}.{x}.");
            let ours = bridge_name(x);
            addresses
                .iter()
                .any(|(dev, addr)| *dev != ours && addr.starts_with(&prefix))
        })?
        .ok_or_else(|| {
            anyhow::anyhow!("every pod subnet {SUBNET_PREFIX}.1-254.0/24 is in use on this machine")
        })
}

/// One of this machine's numbered network ranges, held by an exclusive lock on
/// `/run/setpoint/<lock_name(n)>` for as long as the returned file is open, so two `setpoint`
/// processes never share one and a killed process releases its lock with it. The number
/// recorded in a data dir (`record`) is tried first, since what was handed out from the range
/// outlives the process; a new choice is recorded there.
pub(crate) struct NumberedClaim<'a> {
    /// The lock file's name for number `n`.
    pub lock_name: &'a dyn Fn(u8) -> String,
    /// The data dir's record of the choice.
    pub record: &'a Path,
    /// What the record holds for number `n`.
    pub record_text: &'a dyn Fn(u8) -> String,
}

impl NumberedClaim<'_> {
    /// The first of `recorded`, then `candidates`, that `in_use` does not rule out and whose
    /// lock is free; `None` when every one is taken.
    pub fn claim(
        &self,
        recorded: Option<u8>,
        candidates: impl IntoIterator<Item = u8>,
        in_use: impl Fn(u8) -> bool,
    ) -> anyhow::Result<Option<(u8, std::fs::File)>> {
        let lock_dir = PathBuf::from(LOCK_DIR);
        std::fs::create_dir_all(&lock_dir)
            .with_context(|| format!("creating {}", lock_dir.display()))?;
        for n in recorded.into_iter().chain(candidates) {
            if in_use(n) {
                continue;
            }
            let path = lock_dir.join((self.lock_name)(n));
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            if try_lock(&file) {
                if recorded != Some(n) {
                    std::fs::write(self.record, (self.record_text)(n))
                        .with_context(|| format!("writing {}", self.record.display()))?;
                }
                return Ok(Some((n, file)));
            }
        }
        Ok(None)
    }
}

/// An exclusive, non-blocking `flock` on `file`: whether it was taken.
// flock is a system call (this crate does not depend on libc for one function).
#[allow(unsafe_code)]
fn try_lock(file: &std::fs::File) -> bool {
    extern "C" {
        fn flock(fd: i32, operation: i32) -> i32;
    }
    const LOCK_EX: i32 = 2;
    const LOCK_NB: i32 = 4;
    // SAFETY: flock on a descriptor `file` keeps open for the call.
    unsafe { flock(file.as_raw_fd(), LOCK_EX | LOCK_NB) == 0 }
}

/// `(device, address)` of every IPv4 address on this host's interfaces.
pub(crate) fn host_ipv4_addresses() -> Vec<(String, String)> {
    let Ok(out) = std::process::Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            // `<n>: <dev> inet <addr>/<len> ...`
            let fields: Vec<&str> = line.split_whitespace().collect();
            let dev = fields.get(1)?.to_string();
            let pos = fields.iter().position(|f| *f == "inet")?;
            let addr = fields.get(pos + 1)?.split('/').next()?.to_string();
            Some((dev, addr))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: ContainerRuntimeFlags,
    }

    #[test]
    fn the_process_pod_network_is_said_on_the_node() {
        let flags = |mode| ContainerRuntimeFlags {
            container_runtime: RuntimeKind::Process,
            container_runtime_endpoint: None,
            image_gc: ImageGcFlags::default(),
            dns: DnsFlags::default(),
            process_pod_network: mode,
            pod_cidr: None,
            cluster_cidr: None,
        };
        let (mode, annotations) = flags(ProcessPodNetwork::Host).process_network(true);
        assert_eq!(mode, ProcessPodNetwork::Host);
        assert_eq!(
            annotations,
            BTreeMap::from([(NETWORK_ANNOTATION.to_string(), "host".to_string())])
        );
        let (mode, annotations) = flags(ProcessPodNetwork::Bridge).process_network(true);
        assert_eq!(mode, ProcessPodNetwork::Bridge);
        assert_eq!(annotations[NETWORK_ANNOTATION], "bridge");
        // `auto` never takes a CRI runtime's network it does not know, and says why.
        let (mode, annotations) = flags(ProcessPodNetwork::Auto).process_network(false);
        assert_eq!(mode, ProcessPodNetwork::Host);
        assert_eq!(annotations[NETWORK_ANNOTATION], "host");
        assert!(annotations[NETWORK_REASON_ANNOTATION]
            .starts_with("process pods get loopback addresses on the node's network: "));
        // On a node of its own bridge, `auto` is `bridge` exactly where bridge can run.
        let can_bridge = setpoint_node::process::netns::permitted()
            && containerd::config::find_cni_bin_dir().is_some();
        let (mode, annotations) = flags(ProcessPodNetwork::Auto).process_network(true);
        assert_eq!(mode == ProcessPodNetwork::Bridge, can_bridge);
        assert_eq!(
            annotations.contains_key(NETWORK_REASON_ANNOTATION),
            !can_bridge
        );
    }

    #[test]
    fn auto_is_the_default_and_cri_takes_an_endpoint() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.flags.container_runtime, RuntimeKind::Auto);
        assert_eq!(cli.flags.container_runtime_endpoint, None);
        let cli = Cli::try_parse_from([
            "x",
            "--container-runtime",
            "cri",
            "--container-runtime-endpoint",
            "unix:///run/containerd/containerd.sock",
        ])
        .unwrap();
        assert_eq!(cli.flags.container_runtime, RuntimeKind::Cri);
        assert!(Cli::try_parse_from(["x", "--container-runtime", "docker"]).is_err());
        // Process pods get a network of their own wherever one can run (`auto`), unless the
        // flag names a mode.
        assert_eq!(cli.flags.process_pod_network, ProcessPodNetwork::Auto);
        let cli = Cli::try_parse_from(["x", "--process-pod-network", "host"]).unwrap();
        assert_eq!(cli.flags.process_pod_network, ProcessPodNetwork::Host);
        let cli = Cli::try_parse_from(["x", "--process-pod-network", "bridge"]).unwrap();
        assert_eq!(cli.flags.process_pod_network, ProcessPodNetwork::Bridge);
        assert!(Cli::try_parse_from(["x", "--process-pod-network", "none"]).is_err());
        let cli = Cli::try_parse_from(["x", "--container-runtime", "cri"]).unwrap();
        // The kubelet's image garbage collection flags and defaults.
        assert_eq!(cli.flags.image_gc, ImageGcFlags::default());
        let cli = Cli::try_parse_from([
            "x",
            "--image-gc-high-threshold",
            "90",
            "--image-gc-low-threshold",
            "70",
        ])
        .unwrap();
        let options = cli.flags.image_gc.options(Path::new("/logs")).unwrap();
        assert_eq!(
            (
                options.image_gc_high_threshold,
                options.image_gc_low_threshold
            ),
            (90, 70)
        );
        assert!(Cli::try_parse_from(["x", "--image-gc-high-threshold", "101"]).is_err());
        let inverted = ImageGcFlags {
            image_gc_high_threshold: 80,
            image_gc_low_threshold: 80,
        };
        assert_eq!(
            inverted.options(Path::new("/logs")).unwrap_err().to_string(),
            "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) 80 must be less than imageGCHighThresholdPercent (--image-gc-high-threshold) 80"
        );
    }

    #[tokio::test]
    async fn an_endpoint_without_cri_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let flags = ContainerRuntimeFlags {
            container_runtime: RuntimeKind::Process,
            container_runtime_endpoint: Some("unix:///nowhere.sock".into()),
            image_gc: ImageGcFlags::default(),
            dns: DnsFlags::default(),
            process_pod_network: ProcessPodNetwork::Host,
            pod_cidr: None,
            cluster_cidr: None,
        };
        let err = flags
            .open(&dir.path().join("node"), &dir.path().join("containerd"))
            .await
            .err()
            .expect("refused");
        assert!(err.to_string().contains("--container-runtime cri"), "{err}");
    }

    #[test]
    fn auto_with_an_endpoint_is_cri_and_process_stays_process() {
        let auto = ContainerRuntimeFlags {
            container_runtime: RuntimeKind::Auto,
            container_runtime_endpoint: Some("unix:///x.sock".into()),
            image_gc: ImageGcFlags::default(),
            dns: DnsFlags::default(),
            process_pod_network: ProcessPodNetwork::Host,
            pod_cidr: None,
            cluster_cidr: None,
        };
        let (kind, why) = auto.choose();
        assert_eq!(kind, RuntimeKind::Cri);
        assert!(why.contains("unix:///x.sock"), "{why}");
        let process = ContainerRuntimeFlags {
            container_runtime: RuntimeKind::Process,
            container_runtime_endpoint: None,
            image_gc: ImageGcFlags::default(),
            dns: DnsFlags::default(),
            process_pod_network: ProcessPodNetwork::Host,
            pod_cidr: None,
            cluster_cidr: None,
        };
        assert_eq!(process.choose().0, RuntimeKind::Process);
        // Without an endpoint, auto follows what this machine has.
        let auto = ContainerRuntimeFlags {
            container_runtime: RuntimeKind::Auto,
            container_runtime_endpoint: None,
            image_gc: ImageGcFlags::default(),
            dns: DnsFlags::default(),
            process_pod_network: ProcessPodNetwork::Host,
            pod_cidr: None,
            cluster_cidr: None,
        };
        let usable = containerd::find_system_endpoint().is_some()
            || containerd::testing::missing_prerequisites().is_none();
        let (kind, why) = auto.choose();
        assert_eq!(kind == RuntimeKind::Cri, usable, "{why}");
    }

    #[test]
    fn older_container_logs_move_out_of_the_process_runtimes_way() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path();
        let cri_pod = node.join("pods/default_web_0f1e-22");
        std::fs::create_dir_all(cri_pod.join("main")).unwrap();
        std::fs::write(cri_pod.join("main/0.log"), "line\n").unwrap();
        let process_pod = node.join("pods/0f1e-33");
        std::fs::create_dir_all(&process_pod).unwrap();
        move_container_logs(node, &node.join(CONTAINER_LOGS_DIR)).unwrap();
        assert!(!cri_pod.exists());
        assert!(process_pod.exists());
        let moved = node.join("containers/pods/default_web_0f1e-22/main/0.log");
        assert_eq!(std::fs::read_to_string(moved).unwrap(), "line\n");
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let flags = ContainerRuntimeFlags {
            container_runtime: RuntimeKind::Cri,
            container_runtime_endpoint: Some(format!(
                "unix://{}",
                dir.path().join("none.sock").display()
            )),
            image_gc: ImageGcFlags::default(),
            dns: DnsFlags::default(),
            process_pod_network: ProcessPodNetwork::Host,
            pod_cidr: None,
            cluster_cidr: None,
        };
        let err = flags
            .open(&dir.path().join("node"), &dir.path().join("containerd"))
            .await
            .err()
            .expect("refused");
        assert!(format!("{err:#}").contains("none.sock"), "{err:#}");
    }

    #[test]
    fn a_bridge_is_unused_only_when_it_exists_without_ports() {
        let dir = tempfile::tempdir().unwrap();
        let brif = dir.path().join("brif");
        assert!(!bridge_unused(&brif), "no bridge: nothing to delete");
        std::fs::create_dir(&brif).unwrap();
        assert!(bridge_unused(&brif));
        std::fs::write(brif.join("veth1234abcd"), "").unwrap();
        assert!(!bridge_unused(&brif), "a pod's veth keeps it");
    }

    #[test]
    fn bridges_fit_a_device_name_and_differ_from_the_tests() {
        assert!(bridge_name(254).len() <= 15);
        assert!(!bridge_name(1).starts_with("sp-t"));
    }
}
