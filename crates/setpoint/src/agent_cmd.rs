//! `setpoint agent`: the node agent against any API server — one node running pods as local
//! processes, or `--simulate N` nodes whose pods are simulated — and the local node inside
//! `setpoint up`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use setpoint_api::cidr::{Cidr, CidrError};
use setpoint_node::podcidr::PodCidrWait;
use setpoint_node::{AgentConfig, Capacity, SimulatedConfig, SimulationConfig};
use setpoint_runtime::client::Client;
use setpoint_runtime::informer::SharedInformers;

/// The node agent's `User-Agent` name (its writes name their field manager themselves).
pub const COMPONENT: &str = setpoint_node::podworker::FIELD_MANAGER;

#[derive(clap::Args, Clone)]
pub struct AgentArgs {
    /// Kubeconfig of the API server (default: `$KUBECONFIG`, then `~/.kube/config`). Its CA
    /// also vouches for the API server when it asks this agent for logs.
    #[arg(long, conflicts_with = "token")]
    kubeconfig: Option<PathBuf>,
    /// Join the cluster at this URL (`https://<address>:6443`) with `--token` and
    /// `--ca-cert-hash`, as `setpoint up` prints them.
    #[arg(long, requires_all = ["token", "ca_cert_hash"])]
    server: Option<String>,
    /// The bootstrap token (`<id>.<secret>`) the agent asks for its certificate with.
    #[arg(long, requires = "server")]
    token: Option<String>,
    /// `sha256:<hex>` of the cluster CA's public key: the agent trusts only that CA.
    #[arg(long, requires = "server")]
    ca_cert_hash: Option<String>,
    /// Join with the bootstrap token of this kubeconfig (its server, its CA, its user's
    /// token), as the kubelet's flag of the same name; the node's own kubeconfig is written
    /// in `--data-dir`.
    #[arg(long, conflicts_with_all = ["kubeconfig", "server"])]
    bootstrap_kubeconfig: Option<PathBuf>,
    /// The Node's name (default: this host's name).
    #[arg(long)]
    node_name: Option<String>,
    /// Where the process runtime keeps its state, pod logs and pod addresses (with
    /// `--container-runtime cri`: pod logs, and a private containerd under `containerd/`).
    #[arg(long, default_value = "setpoint-agent", env = "SETPOINT_AGENT_DIR")]
    data_dir: PathBuf,
    /// Address of the node agent's HTTPS port: container logs (the API server connects to it)
    /// and `/metrics`, for client certificates of the kubeconfig's CA.
    #[arg(long, default_value = "0.0.0.0:10250")]
    listen: SocketAddr,
    /// The address the Node reports (default: this host's primary address).
    #[arg(long)]
    address: Option<String>,
    #[command(flatten)]
    simulation: SimulationFlags,
    #[command(flatten)]
    container_runtime: crate::container_runtime::ContainerRuntimeFlags,
    #[command(flatten)]
    proxy: ProxyFlags,
    /// Seconds between Lease renewals.
    #[arg(long, default_value_t = 10)]
    lease_interval_seconds: u64,
    /// How many pods the node takes (`status.capacity.pods`), as the kubelet's `--max-pods`.
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// Routes to other nodes' pod ranges (`spec.podCIDR`): `host-gw` routes each through
    /// its node's `InternalIP`, as flannel's host-gw backend (needs root and the nodes on
    /// one link); `none` installs no routes.
    #[arg(long, value_enum, default_value = "host-gw")]
    pod_network_routes: PodNetworkRoutes,
}

/// How a node reaches pods on other nodes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodNetworkRoutes {
    /// A route to each other node's pod range through that node's address.
    HostGw,
    /// No routes: another program (or nothing) connects the nodes' pods.
    None,
}

/// How many simulated nodes to host and how they behave: `setpoint agent --simulate N` and
/// `setpoint up --simulate N` take the same flags.
#[derive(clap::Args, Clone)]
pub struct SimulationFlags {
    /// Host this many simulated nodes, whose pods are simulated rather than run (in
    /// `setpoint agent`: instead of running pods as processes).
    #[arg(long)]
    simulate: Option<usize>,
    /// Name prefix of simulated nodes.
    #[arg(long, default_value = "sim-node-")]
    node_prefix: String,
    /// Simulated containers start this many milliseconds after their pod arrives.
    #[arg(long, default_value_t = 1000)]
    start_delay_ms: u64,
    /// … and turn ready this many milliseconds after starting.
    #[arg(long, default_value_t = 1000)]
    ready_delay_ms: u64,
    /// Share of simulated containers that fail (exit 1), 0 to 1.
    #[arg(long, default_value_t = 0.0)]
    failure_rate: f64,
    /// CPU of each simulated node.
    #[arg(long, default_value = "8")]
    node_cpu: String,
    /// Memory of each simulated node.
    #[arg(long, default_value = "32Gi")]
    node_memory: String,
    /// Pods each simulated node takes.
    #[arg(long, default_value_t = 110)]
    node_pods: u32,
}

impl SimulationFlags {
    /// The configuration of the simulated nodes, if `--simulate` asks for any.
    pub fn config(&self, lease_interval: Duration) -> Option<SimulationConfig> {
        let nodes = self.simulate?;
        Some(SimulationConfig {
            nodes,
            name_prefix: self.node_prefix.clone(),
            capacity: Capacity {
                cpu: self.node_cpu.clone(),
                memory: self.node_memory.clone(),
                pods: self.node_pods,
            },
            runtime: SimulatedConfig {
                start_delay: Duration::from_millis(self.start_delay_ms),
                ready_delay: Duration::from_millis(self.ready_delay_ms),
                failure_rate: self.failure_rate.clamp(0.0, 1.0),
                ..SimulatedConfig::default()
            },
            lease_interval,
            ..SimulationConfig::default()
        })
    }
}

/// kube-proxy's `--proxy-mode`, as far as this node has modes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// Services routed by nftables rules in a table of the node's own.
    Nftables,
    /// No service proxy on this node.
    None,
}

/// The node's service proxy: `setpoint agent` and `setpoint up` take the same flags.
#[derive(clap::Args, Clone)]
pub struct ProxyFlags {
    /// The service proxy (kube-proxy's `--proxy-mode`): `nftables` routes Services' cluster
    /// IPs, node ports and external IPs to their ready endpoints with nftables rules (needs
    /// root: `CAP_NET_ADMIN`); `none` runs no proxy.
    #[arg(
        long,
        value_enum,
        default_value = "nftables",
        env = "SETPOINT_PROXY_MODE"
    )]
    proxy_mode: ProxyMode,
    /// The pod network (kube-proxy's `--cluster-cidr`, IPv4 CIDR): traffic to a cluster IP
    /// from outside it (the host itself, other machines) is masqueraded so its replies come
    /// back through this node, and pods' traffic leaving it is masqueraded while traffic to
    /// other pods keeps the pod's address. By default the node's pod subnet, when the node has
    /// one of its own (a private containerd's); the join command `setpoint up
    /// --allocate-node-cidrs` prints gives the cluster's.
    #[arg(long, value_parser = parse_cidr)]
    cluster_cidr: Option<String>,
}

/// An IPv4 CIDR (`10.244.0.0/16`), normalised to its network address (the proxy's rules
/// are IPv4).
fn parse_cidr(text: &str) -> Result<String, String> {
    let cidr: Cidr = text.parse().map_err(|e: CidrError| e.to_string())?;
    if !cidr.is_ipv4() {
        return Err(format!(
            "--cluster-cidr {text}: only an IPv4 range is supported"
        ));
    }
    Ok(cidr.to_string())
}

impl ProxyFlags {
    /// The proxy of node `node_name` whose state lives in `state_dir` (which names its
    /// nftables table), or `None` with `--proxy-mode none`. `pod_subnet` is the range this
    /// node's pods are in (the cluster CIDR node ranges come from, else the node's
    /// `spec.podCIDR`, else its own pod subnet): the cluster CIDR when `--cluster-cidr` is not
    /// given, as kube-proxy's `--detect-local-mode` `ClusterCIDR` and `NodeCIDR`.
    pub fn config(
        &self,
        node_name: &str,
        state_dir: &Path,
        pod_subnet: Option<&str>,
    ) -> Option<setpoint_network::proxy::ProxyConfig> {
        (self.proxy_mode == ProxyMode::Nftables).then(|| {
            let mut config = setpoint_network::proxy::ProxyConfig::new(
                node_name,
                &state_dir.display().to_string(),
            );
            config.node.cluster_cidr = self
                .cluster_cidr
                .clone()
                .or_else(|| pod_subnet.map(String::from));
            config
        })
    }

    /// `--cluster-cidr`, if given.
    pub fn cluster_cidr(&self) -> Option<Cidr> {
        // Parsed once already by the flag's own parser.
        self.cluster_cidr.as_deref().and_then(|c| c.parse().ok())
    }

    /// Whether this node runs a service proxy.
    pub fn runs_proxy(&self) -> bool {
        self.proxy_mode != ProxyMode::None
    }

    /// The labels the node carries for its proxy: a node without one cannot take load
    /// balancer traffic, so it carries upstream's
    /// `node.kubernetes.io/exclude-from-external-load-balancers`, which the built-in
    /// service-load-balancer (as upstream's service controller) honours.
    pub fn node_labels(&self) -> std::collections::BTreeMap<String, String> {
        if self.runs_proxy() {
            std::collections::BTreeMap::new()
        } else {
            Self::without_proxy_labels()
        }
    }

    /// The labels of a node that runs no service proxy.
    fn without_proxy_labels() -> std::collections::BTreeMap<String, String> {
        std::collections::BTreeMap::from([(
            setpoint_controllers::servicelb::EXCLUDE_LABEL.to_string(),
            "true".to_string(),
        )])
    }
}

/// How long an agent waits for its Node's `spec.podCIDR` once another Node shows the cluster
/// allocates ranges (`setpoint up` waits as long for its local node when it allocates).
pub const POD_CIDR_TIMEOUT: Duration = Duration::from_secs(60);

/// How long an agent that is its cluster's first Node waits for a range before it takes the
/// cluster as one that gives none.
const POD_CIDR_GRACE: Duration = Duration::from_secs(5);

/// The pod range of node `config` when it configures a pod network of its own (`needed`),
/// and the cluster gives ranges (see [`PodCidrWait`]); logs what the node does without one.
pub async fn pod_cidr_for_network(
    client: &Client,
    config: &AgentConfig,
    needed: bool,
    wait: PodCidrWait,
) -> anyhow::Result<Option<Cidr>> {
    if !needed {
        return Ok(None);
    }
    let cidr = setpoint_node::podcidr::node_pod_cidr(client, config, wait).await?;
    match &cidr {
        Some(c) => {
            tracing::info!(node = %config.node_name, pod_cidr = %c, "the pod network uses the node's spec.podCIDR")
        }
        None => tracing::info!(
            node = %config.node_name,
            "the cluster gives nodes no spec.podCIDR (no node IPAM): the pod network uses a 10.223.<x>.0/24 subnet of this machine's own"
        ),
    }
    Ok(cidr)
}

/// Runs the service proxy of `config` until `shutdown`, logging why it stopped if it did.
async fn run_proxy(
    client: Client,
    config: Option<setpoint_network::proxy::ProxyConfig>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let Some(config) = config else {
        tracing::info!("no service proxy on this node (--proxy-mode none)");
        return;
    };
    tracing::info!(table = %config.table, "service proxy in nftables mode");
    if let Err(e) = setpoint_network::proxy::run(client, config, shutdown).await {
        tracing::error!(error = %e, "service proxy stopped");
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// How the agent gets its credentials from a bootstrap token.
enum Joining {
    /// `--server --token --ca-cert-hash`: the CA from `cluster-info`, pinned by its hash.
    Flags(crate::join::JoinFlags),
    /// `--bootstrap-kubeconfig`.
    Kubeconfig(PathBuf),
}

impl Joining {
    fn of(args: &AgentArgs) -> Option<Joining> {
        if let Some(path) = &args.bootstrap_kubeconfig {
            return Some(Joining::Kubeconfig(path.clone()));
        }
        match (&args.server, &args.token, &args.ca_cert_hash) {
            (Some(server), Some(token), Some(hash)) => {
                Some(Joining::Flags(crate::join::JoinFlags {
                    server: server.clone(),
                    token: token.clone(),
                    ca_cert_hash: hash.clone(),
                }))
            }
            _ => None,
        }
    }

    /// The server the node kubeconfigs are for, if known without asking it.
    fn server(&self) -> Option<&str> {
        match self {
            Joining::Flags(f) => Some(&f.server),
            Joining::Kubeconfig(_) => None,
        }
    }

    async fn bootstrap(&self) -> anyhow::Result<crate::join::Bootstrap> {
        match self {
            Joining::Flags(f) => crate::join::Bootstrap::discover(f).await,
            Joining::Kubeconfig(path) => crate::join::Bootstrap::from_kubeconfig(path),
        }
    }
}

/// A client of the node kubeconfig `kc` (kept in `node_dir`), whose certificate is renewed
/// for as long as the process runs.
fn node_client(
    kc: &setpoint_runtime::client::Kubeconfig,
    name: &str,
    node_dir: &Path,
) -> anyhow::Result<Client> {
    let transport = crate::join::RotatingTransport::new(kc)?;
    let client = Client::new(crate::join::Rotating(transport.clone())).with_user_agent(COMPONENT);
    // Ends with the process.
    tokio::spawn(crate::join::renew(
        client.clone(),
        transport,
        name.to_string(),
        node_dir.to_path_buf(),
    ));
    Ok(client)
}

/// How many simulated nodes ask for their certificates at once.
const JOIN_CONCURRENCY: usize = 32;

/// A client of its own identity (`system:node:<name>`) for every simulated node of `config`,
/// each from the kubeconfig kept in `<data_dir>/nodes/<name>` while its certificate is valid,
/// else from a new CSR made with the bootstrap token.
async fn simulated_identities(
    joining: &Joining,
    config: &SimulationConfig,
    data_dir: &Path,
) -> anyhow::Result<(Vec<Client>, String)> {
    let names: Vec<String> = (0..config.nodes).map(|i| config.node_name(i)).collect();
    let dirs: Vec<PathBuf> = names
        .iter()
        .map(|n| data_dir.join("nodes").join(n))
        .collect();
    let mut kubeconfigs: Vec<Option<setpoint_runtime::client::Kubeconfig>> = match joining.server()
    {
        Some(server) => dirs
            .iter()
            .map(|d| crate::join::existing(server, d))
            .collect(),
        None => vec![None; names.len()],
    };
    if kubeconfigs.iter().any(Option::is_none) {
        let bootstrap = Arc::new(joining.bootstrap().await?);
        let client = bootstrap.client()?;
        let permits = Arc::new(tokio::sync::Semaphore::new(JOIN_CONCURRENCY));
        let mut joins = tokio::task::JoinSet::new();
        for (i, kc) in kubeconfigs.iter().enumerate() {
            if kc.is_some() {
                continue;
            }
            let (bootstrap, client, permits) = (bootstrap.clone(), client.clone(), permits.clone());
            let (name, dir) = (names[i].clone(), dirs[i].clone());
            joins.spawn(async move {
                let _permit = permits.acquire_owned().await?;
                let kc = crate::join::join_with(&bootstrap, &client, &name, &dir)
                    .await
                    .with_context(|| format!("joining simulated node {name}"))?;
                anyhow::Ok((i, kc))
            });
        }
        while let Some(joined) = joins.join_next().await {
            let (i, kc) = joined??;
            kubeconfigs[i] = Some(kc);
        }
    }
    let mut clients = Vec::with_capacity(names.len());
    let mut ca = String::new();
    for ((kc, name), dir) in kubeconfigs.into_iter().zip(&names).zip(&dirs) {
        let kc = kc.expect("every node joined");
        ca = kc.ca_pem.clone().unwrap_or_default();
        // Nothing throttles a node agent's writes here (as for the single-identity agent).
        clients.push(node_client(&kc, name, dir)?.without_rate_limit());
    }
    Ok((clients, ca))
}

/// `setpoint agent`.
pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let lease_interval = Duration::from_secs(args.lease_interval_seconds.max(1));
    let joining = Joining::of(&args);
    if let (Some(mut config), Some(joining)) =
        (args.simulation.config(lease_interval), joining.as_ref())
    {
        let (clients, ca) = simulated_identities(joining, &config, &args.data_dir).await?;
        config.server_listen = (!ca.is_empty()).then_some(args.listen);
        config.client_ca_pem = (!ca.is_empty()).then_some(ca);
        let nodes = config.nodes;
        println!(
            "Simulating {nodes} nodes, each as system:node:<name> with a certificate of its own"
        );
        setpoint_node::run_simulated_as(clients, config, crate::wait_for_signal()).await?;
        return Ok(());
    }
    let (client, kubeconfig) = match joining {
        Some(joining) => {
            let name = args.node_name.clone().unwrap_or_else(hostname);
            let kubeconfig = match &joining {
                Joining::Flags(flags) => crate::join::join(flags, &name, &args.data_dir).await?,
                Joining::Kubeconfig(_) => {
                    let bootstrap = joining.bootstrap().await?;
                    crate::join::join_with(&bootstrap, &bootstrap.client()?, &name, &args.data_dir)
                        .await?
                }
            };
            let client = node_client(&kubeconfig, &name, &args.data_dir)?;
            (client, kubeconfig)
        }
        None => crate::leadership::connect(args.kubeconfig.as_deref(), COMPONENT)?,
    };
    let client = client.without_rate_limit();
    if let Some(mut config) = args.simulation.config(lease_interval) {
        config.server_listen = kubeconfig.ca_pem.is_some().then_some(args.listen);
        config.client_ca_pem = kubeconfig.ca_pem.clone();
        let nodes = config.nodes;
        println!("Simulating {nodes} nodes");
        setpoint_node::run_simulated(client, config, crate::wait_for_signal()).await?;
        return Ok(());
    }
    let name = args.node_name.unwrap_or_else(hostname);
    let mut config = AgentConfig::local(&name);
    config.server_listen = args.listen;
    config.client_ca_pem = kubeconfig.ca_pem.clone();
    config.lease_interval = lease_interval;
    config.api_server = setpoint_node::sources::api_server_address(&kubeconfig.server);
    if let Some(a) = args.address {
        config.address = a;
    }
    config.capacity.pods = args.max_pods;
    // Routes are owned by a protocol number derived from the node's data dir, so a restart
    // finds its own and two nodes on one machine keep apart.
    let (stop_routes, routes_stopped) = tokio::sync::oneshot::channel::<()>();
    let routes = (args.pod_network_routes == PodNetworkRoutes::HostGw).then(|| {
        let identity = std::path::absolute(&args.data_dir)
            .unwrap_or_else(|_| args.data_dir.clone())
            .display()
            .to_string();
        let config = setpoint_network::routes::RoutesConfig {
            node_name: name.clone(),
            proto: setpoint_network::routes::proto_number(&identity),
        };
        tokio::spawn(setpoint_network::routes::run(
            client.clone(),
            config,
            async move {
                let _ = routes_stopped.await;
            },
        ))
    });
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = args.data_dir.canonicalize()?;
    config.labels.extend(args.proxy.node_labels());
    // The pod network is on the node's range when the cluster gives one: the Node is
    // registered and its range awaited before the runtime configures a bridge.
    let wait = PodCidrWait::IfAllocated {
        timeout: POD_CIDR_TIMEOUT,
        grace: POD_CIDR_GRACE,
    };
    let mut runtime_flags = args.container_runtime.clone();
    runtime_flags.pod_cidr =
        pod_cidr_for_network(&client, &config, runtime_flags.needs_pod_subnet(), wait).await?;
    // Pod traffic within the cluster CIDR keeps the pods' addresses.
    runtime_flags.cluster_cidr = args.proxy.cluster_cidr();
    let runtime = runtime_flags
        .open(&data_dir, &data_dir.join("containerd"))
        .await?;
    config.system_info.container_runtime_version = runtime.version.clone();
    config.dns = runtime.dns.clone();
    config.annotations.extend(runtime.annotations.clone());
    tracing::info!(node = %name, runtime = %runtime.description, "node runtime");
    println!("Node {name} is running pods {}", runtime.description);
    let (stop_proxy, proxy_stopped) = tokio::sync::oneshot::channel::<()>();
    let proxy = tokio::spawn(run_proxy(
        client.clone(),
        args.proxy.config(
            &name,
            &data_dir,
            runtime_flags
                .pod_cidr
                .map(|c| c.to_string())
                .or_else(|| runtime.pod_subnet.clone())
                .as_deref(),
        ),
        async move {
            let _ = proxy_stopped.await;
        },
    ));
    let result = setpoint_node::run_agent(
        client,
        config,
        runtime.runtime.clone(),
        crate::wait_for_signal(),
    )
    .await;
    let _ = stop_proxy.send(());
    let _ = proxy.await;
    let _ = stop_routes.send(());
    if let Some(routes) = routes {
        let _ = routes.await;
    }
    runtime.stop().await;
    result?;
    Ok(())
}

/// Runs a node agent (`agent`) and, beside it, the node's local-path volume directories
/// under `dir`, both until `shutdown`.
async fn with_local_path<F, Fut>(
    client: Client,
    node: String,
    dir: std::path::PathBuf,
    proxy: Option<setpoint_network::proxy::ProxyConfig>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    agent: F,
) -> Result<(), setpoint_node::AgentError>
where
    F: FnOnce(Client, std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) -> Fut,
    Fut: std::future::Future<Output = Result<(), setpoint_node::AgentError>>,
{
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let stop = std::sync::Arc::new(stop);
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown.await;
            let _ = stop.send(true);
        }
    });
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let local_path = tokio::spawn(setpoint_node::localpath::run(
        client.clone(),
        node,
        dir,
        wait(stopped.clone()),
    ));
    let proxy = tokio::spawn(run_proxy(client.clone(), proxy, wait(stopped.clone())));
    let result = agent(client, Box::pin(wait(stopped))).await;
    let _ = stop.send(true);
    let _ = proxy.await;
    match local_path.await {
        Ok(Err(e)) => tracing::error!(error = %e, "local-path volumes stopped"),
        Err(e) => tracing::error!(error = %e, "local-path volumes stopped"),
        Ok(Ok(())) => {}
    }
    result
}

/// A node agent running inside `setpoint up`: the local node, or simulated nodes.
pub struct InProcess {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    /// The local node's runtime, stopped after the agent (a private containerd).
    runtime: Option<crate::container_runtime::NodeRuntime>,
}

impl InProcess {
    /// Starts a node agent named `name` on `runtime`, serving logs on a free loopback port
    /// to callers with certificates from `client_ca_pem`.
    /// Its local-path volumes live under `local_path_dir`; pods that share its network reach
    /// the API server at `api_server_url`; `proxy` is its service proxy, if it runs one.
    pub fn start(
        client: Client,
        name: &str,
        runtime: crate::container_runtime::NodeRuntime,
        client_ca_pem: Option<String>,
        local_path_dir: std::path::PathBuf,
        api_server_url: &str,
        proxy: Option<setpoint_network::proxy::ProxyConfig>,
    ) -> InProcess {
        let mut config = AgentConfig::local(name);
        config.api_server = setpoint_node::sources::api_server_address(api_server_url);
        // Only this machine talks to the local node.
        config.address = "127.0.0.1".into();
        config.server_listen = SocketAddr::from(([127, 0, 0, 1], 0));
        config.client_ca_pem = client_ca_pem;
        config.system_info.container_runtime_version = runtime.version.clone();
        config.dns = runtime.dns.clone();
        config.annotations.extend(runtime.annotations.clone());
        if proxy.is_none() {
            config.labels.extend(ProxyFlags::without_proxy_labels());
        }
        tracing::info!(node = %name, runtime = %runtime.description, "local node runtime");
        let pods = runtime.runtime.clone();
        let node = name.to_string();
        let mut agent = InProcess::spawn("local node agent", move |shutdown| {
            with_local_path(
                client,
                node,
                local_path_dir,
                proxy,
                shutdown,
                move |c, shutdown| setpoint_node::run_agent(c, config, pods, shutdown),
            )
        });
        agent.runtime = Some(runtime);
        agent
    }

    /// Starts `config.nodes` simulated nodes on the process's shared (lean) informers, with
    /// one logs and metrics endpoint for all of them on a free loopback port.
    pub fn simulated(
        client: Client,
        informers: SharedInformers,
        mut config: SimulationConfig,
        client_ca_pem: Option<String>,
    ) -> InProcess {
        config.address = "127.0.0.1".into();
        config.server_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        config.client_ca_pem = client_ca_pem;
        InProcess::spawn("simulated nodes", move |shutdown| async move {
            setpoint_node::run_simulated_on(client, &informers, config, shutdown).await
        })
    }

    fn spawn<F, Fut>(what: &'static str, run: F) -> InProcess
    where
        F: FnOnce(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) -> Fut,
        Fut: std::future::Future<Output = Result<(), setpoint_node::AgentError>> + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let fut = run(Box::pin(async move {
            let _ = stopped.await;
        }));
        let task = tokio::spawn(async move {
            if let Err(e) = fut.await {
                tracing::error!(error = %e, "{what} stopped");
            }
        });
        InProcess {
            stop,
            task,
            runtime: None,
        }
    }

    /// What the local node runs pods on, if this is one.
    pub fn runtime_description(&self) -> Option<String> {
        self.runtime.as_ref().map(|r| r.description.clone())
    }

    /// Stops the agent (a local node's processes keep running; the next start adopts them).
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
        if let Some(runtime) = self.runtime {
            runtime.stop().await;
        }
    }
}

/// The name of the local node of `setpoint up`.
pub fn local_node_name() -> String {
    hostname()
}

/// The pod range of `setpoint up`'s local node `name` when `up` gives nodes ranges and the
/// node's runtime configures a pod network (`needed`): registers the Node and waits for it.
pub async fn local_pod_cidr(
    client: &Client,
    name: &str,
    needed: bool,
) -> anyhow::Result<Option<Cidr>> {
    let mut config = AgentConfig::local(name);
    config.address = "127.0.0.1".into();
    pod_cidr_for_network(
        client,
        &config,
        needed,
        PodCidrWait::Allocated(POD_CIDR_TIMEOUT),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        proxy: ProxyFlags,
    }

    fn proxy(args: &[&str]) -> ProxyFlags {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .unwrap()
            .proxy
    }

    #[test]
    fn a_node_without_a_proxy_is_left_out_of_load_balancers() {
        let on = proxy(&["--proxy-mode", "nftables"]);
        assert!(on.runs_proxy());
        assert!(on.node_labels().is_empty());
        let off = proxy(&["--proxy-mode", "none"]);
        assert!(!off.runs_proxy());
        assert_eq!(
            off.node_labels()
                .get(setpoint_controllers::servicelb::EXCLUDE_LABEL),
            Some(&"true".to_string())
        );
        assert!(off.config("n", Path::new("/state"), None).is_none());
    }

    #[test]
    fn the_cluster_cidr_is_the_flag_else_the_node_s_range() {
        let dir = Path::new("/state");
        let given = proxy(&[
            "--proxy-mode",
            "nftables",
            "--cluster-cidr",
            "10.244.3.7/16",
        ]);
        let config = given.config("n", dir, Some("10.230.1.0/24")).unwrap();
        assert_eq!(config.node.cluster_cidr.as_deref(), Some("10.244.0.0/16"));
        let default = proxy(&["--proxy-mode", "nftables"]);
        let config = default.config("n", dir, Some("10.230.1.0/24")).unwrap();
        assert_eq!(config.node.cluster_cidr.as_deref(), Some("10.230.1.0/24"));
        let config = default.config("n", dir, None).unwrap();
        assert_eq!(config.node.cluster_cidr, None);
        let refused = |text: &str| {
            Cli::try_parse_from(["x", "--cluster-cidr", text])
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(refused("10.244.0.0").contains("invalid CIDR address: 10.244.0.0"));
        assert!(refused("fd00::/64").contains("only an IPv4 range"));
    }
}
