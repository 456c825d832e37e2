//! `setpoint`: the command-line entry point.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use setpoint_apiserver::{ApiServer, ServerConfig, StoreConfig};

/// mimalloc rather than glibc malloc: under load the server allocates from many threads at
/// once, and glibc's arena locks, consolidation and page clearing took about a third of its
/// CPU in the 30,000-pod density profile.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Keeps freed memory for a second before returning it to the OS (mimalloc's default is 10 ms),
/// unless `MIMALLOC_PURGE_DELAY` says otherwise. The server frees and allocates object buffers
/// continuously (old versions leaving the store's memory and the watch cache, requests coming
/// in), so memory returned at once is faulted back in, zeroed, moments later: at 30,000 pods
/// that cost the server about a sixth of its CPU time. Memory not reused within the second is
/// still returned.
#[cfg(feature = "mimalloc")]
// mimalloc's options are set through its C interface.
#[allow(unsafe_code)]
fn tune_allocator() {
    /// `mi_option_purge_delay` in the `mi_option_e` enum of mimalloc v3's `mimalloc.h` (the
    /// bindings do not name it; the bindings crate is pinned so that this index stays right).
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a plain integer option; mimalloc reads options atomically.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 1000) };
    }
}

mod agent_cmd;
mod audit_flags;
mod bench_cmd;
mod chaos;
mod container_runtime;
mod controller_manager;
mod hpa_flags;
mod join;
mod leadership;
mod local_path;
mod node_ipam;
mod sa_credentials;
mod scheduler_cmd;
mod secure_serving;
mod store_cmd;
mod ui_login;
mod why_cmd;

#[derive(Parser)]
#[command(
    name = "setpoint",
    version,
    about = "A Kubernetes-compatible declarative control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// The command line is parsed once at start: a large variant costs nothing worth boxing for.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Start a whole cluster — API server, controllers, scheduler and a local node that runs
    /// pods as processes, or in containerd with `--container-runtime cri` (plus
    /// `--simulate N` simulated nodes) — on the embedded store unless `--store` says
    /// otherwise.
    Up(UpArgs),
    /// Start the API server only.
    Server(ServeArgs),
    /// Run the built-in controllers against an API server.
    ControllerManager(controller_manager::ControllerManagerArgs),
    /// Place pending pods on nodes.
    Scheduler(scheduler_cmd::SchedulerArgs),
    /// Run a node: pods as local processes (in containerd with `--container-runtime cri`), or
    /// `--simulate N` simulated nodes.
    Agent(agent_cmd::AgentArgs),
    /// Copy a cluster's objects out of a store or into one (for moving between stores).
    Store {
        #[command(subcommand)]
        command: store_cmd::StoreCommand,
    },
    /// Load a Kubernetes-compatible cluster through its public API and report figures:
    /// `density`, `churn`, `api`, and `compare` for two reports.
    Bench {
        #[command(subcommand)]
        command: bench_cmd::BenchCommand,
    },
    /// Start a cluster of separate processes, inject faults from a seeded schedule while a
    /// workload changes, and report each fault's time-to-converge and any invariant broken.
    Chaos(chaos::ChaosArgs),
    /// Why an object is as it is: the writes that made it, the controllers' decisions behind
    /// them and the writes that woke those decisions (also `kubectl why`, docs/why.md).
    Why(why_cmd::WhyArgs),
}

#[derive(clap::Args, Clone)]
struct ServeArgs {
    /// Where the store, certificates and kubeconfig live.
    #[arg(long, default_value = "setpoint-data", env = "SETPOINT_DATA_DIR")]
    data_dir: PathBuf,
    /// Address and port to serve the API on (kube-apiserver's `--bind-address` and
    /// `--secure-port`): every address by default, so pods reach the server through the
    /// `kubernetes` Service and other machines can join; `127.0.0.1:6443` keeps it to this
    /// machine (pods with a network of their own then cannot reach it).
    #[arg(long, default_value = "0.0.0.0:6443")]
    listen: SocketAddr,
    /// The address the `kubernetes` Service's endpoints name, where pods and other machines
    /// reach the server (kube-apiserver's flag). Default: the `--listen` address, or for an
    /// unspecified one the address of the interface with the default route.
    #[arg(long)]
    advertise_address: Option<std::net::IpAddr>,
    /// Store backend: `embedded` (durable, in the data dir), `memory` (lost on exit) or `etcd`
    /// (an etcd cluster, which several API servers can share).
    #[arg(long, default_value = "embedded", value_parser = ["embedded", "memory", "etcd"])]
    store: String,
    /// etcd client URLs, comma-separated (with `--store etcd`).
    #[arg(
        long,
        value_delimiter = ',',
        required_if_eq("store", "etcd"),
        env = "SETPOINT_ETCD_ENDPOINTS"
    )]
    etcd_endpoints: Vec<String>,
    #[command(flatten)]
    etcd: store_cmd::EtcdFlags,
    /// Serve plain HTTP without authentication instead of HTTPS (only for local experiments).
    #[arg(long)]
    insecure_http: bool,
    /// Seconds between compactions of old store history.
    #[arg(long, default_value_t = 300)]
    compaction_interval_seconds: u64,
    /// How often every node's agent is scraped for the resource metrics API
    /// (`metrics.k8s.io`, `kubectl top`), as metrics-server's `--metric-resolution`.
    #[arg(long, default_value = "15s", value_parser = crate::leadership::parse_go_duration)]
    metric_resolution: Duration,
    /// With `up`: run no local node (pods stay Pending unless another agent joins).
    #[arg(long)]
    no_node: bool,
    /// With `up`: seconds a node may go without renewing its Lease before it is marked
    /// unreachable.
    #[arg(long, default_value_t = 50)]
    node_monitor_grace_period_seconds: u64,
    /// Seconds new pods tolerate an unreachable or not-ready node before eviction.
    #[arg(long, default_value_t = 300)]
    default_toleration_seconds: i64,
    /// The ports Services' `nodePort`s come from, `<first>-<last>` inclusive, as
    /// kube-apiserver's flag.
    #[arg(long, default_value = "30000-32767", value_parser = parse_port_range)]
    service_node_port_range: std::ops::RangeInclusive<u16>,
    /// Requests without credentials are `system:anonymous` (true), or refused with 401
    /// (false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    anonymous_auth: bool,
    /// Admission plugins to turn off, comma-separated, as kube-apiserver's flag. Only
    /// `ServiceAccount` can be (a server without a controller manager has no `default`
    /// accounts, so it refuses pods that name none); the other steps always run.
    #[arg(long, value_delimiter = ',')]
    disable_admission_plugins: Vec<String>,
    /// A CSV file of static bearer tokens: `token,user,uid,"group1,group2"` per line.
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// The issuer (`iss`) of the service-account tokens this server mints and accepts.
    #[arg(long, default_value = setpoint_apiserver::authentication::serviceaccount::DEFAULT_ISSUER)]
    service_account_issuer: String,
    /// The audiences the API identifies as, comma-separated: a bearer token must be for one of
    /// them (default: the service-account issuer).
    #[arg(long, value_delimiter = ',')]
    api_audiences: Vec<String>,
    #[command(flatten)]
    audit: audit_flags::AuditFlags,
    /// For tests only, never in normal use: serve /debug/setpoint/faults, through which a
    /// cluster-admin drops every open watch, answers watches 410 Expired and adds latency to
    /// every request (`setpoint chaos` starts its server with it).
    #[arg(long, hide = true)]
    enable_fault_injection: bool,
}

fn main() -> anyhow::Result<()> {
    #[cfg(feature = "mimalloc")]
    tune_allocator();
    let cli = Cli::parse();
    // `bench` hosts many simulated nodes whose per-pod logs would bury its progress and report.
    let default_log = if matches!(cli.command, Command::Bench { .. }) {
        "error"
    } else {
        "info"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SETPOINT_LOG")
                .unwrap_or_else(|_| default_log.into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in files or CI logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Up(args) => {
                let up = Up {
                    concurrency: args.concurrency.concurrency(),
                    podgc: args.podgc.config(),
                    hpa: args.hpa.config(),
                    node_ipam: args.node_ipam,
                    simulation: args.simulation,
                    container_runtime: args.container_runtime,
                    proxy: args.proxy,
                };
                run(args.serve, Some(up)).await
            }
            Command::Server(args) => run(args, None).await,
            Command::ControllerManager(args) => controller_manager::run(args).await,
            Command::Scheduler(args) => scheduler_cmd::run(args).await,
            Command::Agent(args) => agent_cmd::run(args).await,
            Command::Store { command } => store_cmd::run(command).await,
            Command::Bench { command } => bench_cmd::run(command).await,
            Command::Chaos(args) => chaos::run(args).await,
            Command::Why(args) => why_cmd::run(args).await,
        }
    })
}

/// `setpoint up`'s flags: the server's, the controllers' concurrency, and simulated nodes to
/// host besides the local node.
#[derive(clap::Args)]
struct UpArgs {
    #[command(flatten)]
    serve: ServeArgs,
    #[command(flatten)]
    concurrency: controller_manager::ConcurrencyFlags,
    #[command(flatten)]
    podgc: controller_manager::PodGcFlags,
    #[command(flatten)]
    hpa: hpa_flags::HpaFlags,
    #[command(flatten)]
    node_ipam: node_ipam::NodeIpamFlags,
    #[command(flatten)]
    simulation: agent_cmd::SimulationFlags,
    #[command(flatten)]
    container_runtime: container_runtime::ContainerRuntimeFlags,
    #[command(flatten)]
    proxy: agent_cmd::ProxyFlags,
}

/// What `setpoint up` runs besides the API server.
struct Up {
    concurrency: setpoint_controllers::manager::Concurrency,
    podgc: setpoint_controllers::podgc::PodGcConfig,
    hpa: setpoint_controllers::hpa::HpaConfig,
    /// `--allocate-node-cidrs`: node ranges from a cluster CIDR `up` claims on this machine.
    node_ipam: node_ipam::NodeIpamFlags,
    simulation: agent_cmd::SimulationFlags,
    container_runtime: container_runtime::ContainerRuntimeFlags,
    proxy: agent_cmd::ProxyFlags,
}

/// The admission plugins `--disable-admission-plugins` names, refusing the ones this server
/// cannot turn off.
fn disabled_admission(names: &[String]) -> anyhow::Result<Vec<&str>> {
    const CAN_BE_DISABLED: [&str; 1] = ["ServiceAccount"];
    names
        .iter()
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .map(|n| {
            CAN_BE_DISABLED.iter().copied().find(|c| *c == n).ok_or_else(|| {
                anyhow::anyhow!(
                    "--disable-admission-plugins: {n:?} cannot be disabled (only ServiceAccount can)"
                )
            })
        })
        .collect()
}

/// Serves the API; with `up` also runs the controllers, the scheduler, the local node and any
/// simulated nodes in this process.
async fn run(args: ServeArgs, up: Option<Up>) -> anyhow::Result<()> {
    let all_in_one = up.is_some();
    let started = Instant::now();
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data_dir = args.data_dir.canonicalize()?;
    let config = ServerConfig {
        listen: args.listen,
        advertise_address: args.advertise_address,
        data_dir: Some(data_dir.clone()),
        store: match args.store.as_str() {
            "memory" => StoreConfig::Memory,
            "etcd" => StoreConfig::Etcd(args.etcd.options(&args.etcd_endpoints)?),
            _ => StoreConfig::Embedded(data_dir.join("store")),
        },
        insecure_http: args.insecure_http,
        compaction_interval: Duration::from_secs(args.compaction_interval_seconds.max(1)),
        metric_resolution: args.metric_resolution.max(Duration::from_millis(100)),
        default_toleration_seconds: args.default_toleration_seconds.max(0),
        service_node_port_range: args.service_node_port_range.clone(),
        service_account_admission: !disabled_admission(&args.disable_admission_plugins)?
            .contains(&"ServiceAccount"),
        authentication: setpoint_apiserver::authentication::AuthenticationConfig {
            anonymous_auth: args.anonymous_auth,
            token_auth_file: args.token_auth_file.clone(),
            service_account_issuer: args.service_account_issuer.clone(),
            api_audiences: args.api_audiences.clone(),
        },
        audit: args.audit.options()?,
        fault_injection: args.enable_fault_injection,
        ..ServerConfig::default()
    };
    let store = ApiServer::open_store(&config).await?;
    let server = ApiServer::new(config, store.clone()).await?;
    let running = server.serve().await?;
    let component_kubeconfigs = match (&running.pki, &running.kubeconfig) {
        (Some(pki), Some(_)) => write_component_kubeconfigs(
            pki,
            &data_dir,
            &running.url,
            &agent_cmd::local_node_name(),
        )?,
        _ => Vec::new(),
    };
    // The controllers and the scheduler share one set of informers: one cache of every pod
    // in this process, not one per component. The runtime metrics they record (reconciles,
    // work queues, leader election, API requests, objects skipped because they do not
    // decode) have no endpoint of their own here, so the API server's `/metrics` has them.
    let mut runtime_metrics = setpoint_runtime::metrics::Registry::default();
    let informer_metrics = setpoint_runtime::metrics::InformerMetrics::new(&mut runtime_metrics);
    let controller_metrics = setpoint_runtime::controller::ControllerMetrics::new();
    controller_metrics.register(&mut runtime_metrics);
    let leader_metrics = setpoint_runtime::metrics::LeaderMetrics::new(&mut runtime_metrics);
    let client_metrics = std::sync::Arc::new(setpoint_runtime::metrics::ClientMetrics::new(
        &mut runtime_metrics,
    ));
    server
        .metrics()
        .include(std::sync::Arc::new(runtime_metrics));
    let in_process = || {
        setpoint_runtime::client::Client::new(setpoint_runtime::client::ServiceTransport::new(
            setpoint_apiserver::http::router(server.clone()),
        ))
        .with_metrics(client_metrics.clone())
    };
    let informers = setpoint_runtime::informer::SharedInformers::with_options(
        in_process(),
        setpoint_runtime::informer::InformerOptions {
            metrics: Some(informer_metrics),
            ..setpoint_runtime::informer::InformerOptions::lean()
        },
        setpoint_runtime::informer::StartPolicy::OnRequest,
    );
    // `up` joins the elections a standalone controller manager and scheduler take part in,
    // with their default timing: its components act only while they lead, and a standalone
    // one pointed at this server stands by until `up` stops and releases the Leases.
    let election = leadership::LeaderElectionFlags::default();
    let mut leaderships = Vec::new();
    // Node ranges come from a cluster CIDR of this cluster's own on the machine, held (by
    // the lock file) for as long as `up` runs.
    let (node_ipam, _cluster_cidr_lock, cluster_cidr) = match up.as_ref() {
        Some(up) if up.node_ipam.allocate_node_cidrs => {
            let (cidr, lock) = node_ipam::claim_default(&data_dir)?;
            tracing::info!(cluster_cidr = %cidr, "node pod ranges are allocated from the cluster CIDR");
            (
                up.node_ipam.config(Some(&cidr.to_string()))?,
                Some(lock),
                Some(cidr),
            )
        }
        _ => (None, None, None),
    };
    let controllers = match up.as_ref() {
        Some(up) => {
            let client = in_process().with_user_agent(controller_manager::COMPONENT);
            let leadership = leadership::elect(
                &client,
                controller_manager::LEASE,
                &election,
                Some(leader_metrics.clone()),
            )?;
            let leading = leadership.handle.clone();
            leaderships.push(leadership);
            Some(controller_manager::start_in_process(
                client,
                Duration::from_secs(args.node_monitor_grace_period_seconds.max(1)),
                up.concurrency,
                informers.clone(),
                leading,
                Some(controller_metrics.clone()),
                running.pki.as_ref().map(|p| p.ca_cert.clone()),
                // `up` signs with the CA it generated into its data dir.
                running
                    .pki
                    .as_ref()
                    .map(|p| setpoint_controllers::csrsigning::SigningCa {
                        cert_pem: p.ca_cert.clone(),
                        key_pem: p.ca_key.clone(),
                        max_duration: setpoint_controllers::csrsigning::DEFAULT_DURATION,
                    }),
                up.podgc,
                up.hpa,
                node_ipam,
            ))
        }
        None => None,
    };
    let scheduler = if all_in_one {
        let client = in_process().with_user_agent(scheduler_cmd::COMPONENT);
        let leadership = leadership::elect(
            &client,
            scheduler_cmd::LEASE,
            &election,
            Some(leader_metrics.clone()),
        )?;
        let leading = leadership.leading.clone();
        leaderships.push(leadership);
        Some(scheduler_cmd::InProcess::start(
            client,
            informers.clone(),
            leading,
        ))
    } else {
        None
    };
    let node = match up.as_ref() {
        Some(up) if !args.no_node => {
            let ca = running.pki.as_ref().map(|p| p.ca_cert.clone());
            let name = agent_cmd::local_node_name();
            // With node ranges allocated here, the local node's pod network is on its own.
            let mut runtime_flags = up.container_runtime.clone();
            if cluster_cidr.is_some() {
                runtime_flags.pod_cidr = agent_cmd::local_pod_cidr(
                    &in_process().with_user_agent(agent_cmd::COMPONENT),
                    &name,
                    runtime_flags.needs_pod_subnet(),
                )
                .await?;
            }
            // Pod traffic within the cluster CIDR keeps the pods' addresses.
            runtime_flags.cluster_cidr = up.proxy.cluster_cidr().or(cluster_cidr);
            let runtime = runtime_flags
                .open(&data_dir.join("node"), &data_dir.join("containerd"))
                .await?;
            // The proxy's local traffic is the cluster CIDR's (kube-proxy's
            // `--detect-local-mode ClusterCIDR`), else the node's own pod subnet.
            let local = cluster_cidr
                .map(|c| c.to_string())
                .or_else(|| runtime.pod_subnet.clone());
            let proxy = up
                .proxy
                .config(&name, &data_dir.join("node"), local.as_deref());
            Some(agent_cmd::InProcess::start(
                in_process().with_user_agent(agent_cmd::COMPONENT),
                &name,
                runtime,
                ca,
                data_dir.join("node").join("storage"),
                &running.url,
                proxy,
            ))
        }
        _ => None,
    };
    if all_in_one {
        // Like the Namespaces the server bootstraps, but only where the local-path
        // provisioner runs: `up`'s controllers and node.
        local_path::ensure_class(&in_process()).await?;
        // kubeadm's CoreDNS addon Service; the nodes serving DNS publish its endpoints. Not
        // fatal: pods are told the nodes' own DNS addresses, not its cluster IP.
        if let Err(e) = setpoint_network::dns::kubedns::ensure_service(&in_process()).await {
            tracing::warn!(error = %e, "no kube-dns Service");
            eprintln!("Warning: no kube-dns Service: {e}");
        }
    }
    let node_runtime = node.as_ref().and_then(|n| n.runtime_description());
    // Simulated nodes share the pod cache with the scheduler and the controllers.
    let simulation = up.and_then(|up| up.simulation.config(Duration::from_secs(10)));
    let hosting = simulation.as_ref().map(|c| {
        (
            c.nodes,
            c.node_name(0),
            c.node_name(c.nodes.saturating_sub(1)),
        )
    });
    let simulated = simulation.map(|config| {
        let ca = running.pki.as_ref().map(|p| p.ca_cert.clone());
        agent_cmd::InProcess::simulated(
            in_process().with_user_agent(agent_cmd::COMPONENT),
            informers.clone(),
            config,
            ca,
        )
    });
    tracing::info!(url = %running.url, ready_ms = started.elapsed().as_millis() as u64, "API server ready");
    if let Some(kc) = &running.kubeconfig {
        println!("Setpoint is running at {}", running.url);
        println!(
            "Point kubectl at it with:\n\n    export KUBECONFIG={}\n",
            kc.display()
        );
        if let (Some(pki), true) = (running.pki.as_ref(), all_in_one) {
            // Other machines reach a server listening on every address at its advertised
            // one, which its certificate names.
            let join_url = if running.addr.ip().is_unspecified() {
                format!("https://{}", running.advertised)
            } else {
                running.url.clone()
            };
            match join::prepare(&in_process(), &join_url, &pki.ca_cert).await {
                Ok(token) => {
                    let hash = join::ca_cert_hash(&pki.ca_cert)?;
                    println!("Join another machine (token valid 24 h) with:\n");
                    // Joined nodes keep pod traffic within the cluster CIDR unmasqueraded
                    // and tell their proxy which traffic is the pods'.
                    let cidr_flag = cluster_cidr
                        .map(|c| format!(" --cluster-cidr {c}"))
                        .unwrap_or_default();
                    println!(
                        "    setpoint agent --server {join_url} --token {token} --ca-cert-hash {hash}{cidr_flag}\n"
                    );
                    // The server's certificate names the listen address: a machine
                    // elsewhere must use exactly that one.
                    if running.advertised.ip().is_loopback() {
                        println!(
                            "(The server listens on {}, which other machines cannot reach by that name: start it with --listen <address of this machine>:6443.)\n",
                            running.addr.ip()
                        );
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not prepare joining machines"),
            }
        }
        if all_in_one {
            // The live view: a token for the admin's rights, in the URL's fragment.
            match ui_login::token(&in_process()).await {
                Ok(token) => println!(
                    "Open the live view (signed in for {} h) at:\n\n    {}\n",
                    ui_login::TOKEN_SECONDS / 3600,
                    ui_login::url(&running.url, &token)
                ),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "could not make a login for the live view")
                }
            }
        }
        if !component_kubeconfigs.is_empty() {
            println!("Components running apart from this process use their own identities:\n");
            for (command, path) in &component_kubeconfigs {
                println!("    setpoint {command} --kubeconfig {}", path.display());
            }
            println!();
        }
    } else {
        println!(
            "Setpoint is running at {} (plain HTTP, no authentication)",
            running.url
        );
        println!(
            "Point kubectl at it with:\n\n    kubectl --server {}\n",
            running.url
        );
    }
    if let Some(description) = node_runtime {
        println!("The local node runs pods {description}");
    }
    if let Some((n, first, last)) = hosting {
        println!(
            "Hosting {n} simulated nodes ({first} … {last}): their pods are simulated, not run."
        );
    }
    if all_in_one {
        println!("Try: kubectl create namespace demo && kubectl -n demo create deployment web --image=nginx:1.25");
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    wait_for_signal().await;
    tracing::info!("shutting down");
    for n in [node, simulated].into_iter().flatten() {
        n.stop().await;
    }
    if let Some(s) = scheduler {
        s.stop().await;
    }
    if let Some(c) = controllers {
        c.stop().await;
    }
    // Released while the API server still serves, so standbys take over at once.
    for l in leaderships {
        l.release().await;
    }
    informers.shutdown().await;
    running.shutdown().await;
    drop(server);
    drop(store);
    Ok(())
}

/// Writes, next to the admin kubeconfig, one kubeconfig per component with a client
/// certificate of its own identity (upstream's users `system:kube-controller-manager`,
/// `system:kube-scheduler` and `system:node:<name>` in `system:nodes`), so that a component
/// run apart holds only what its role grants. Returns each with the command that uses it.
fn write_component_kubeconfigs(
    pki: &setpoint_apiserver::tls::Pki,
    data_dir: &std::path::Path,
    url: &str,
    node: &str,
) -> anyhow::Result<Vec<(String, std::path::PathBuf)>> {
    let components = [
        (
            "controller-manager --use-service-account-credentials".to_string(),
            "controller-manager.kubeconfig".to_string(),
            "system:kube-controller-manager".to_string(),
            None,
        ),
        (
            "scheduler".to_string(),
            "scheduler.kubeconfig".to_string(),
            "system:kube-scheduler".to_string(),
            None,
        ),
        (
            format!("agent --node-name {node}"),
            format!("node-{node}.kubeconfig"),
            format!("system:node:{node}"),
            Some("system:nodes"),
        ),
    ];
    let mut written = Vec::new();
    for (command, file, user, group) in components {
        let path = data_dir.join(file);
        pki.write_client_kubeconfig(&path, url, &user, group)
            .with_context(|| format!("writing {}", path.display()))?;
        written.push((command, path));
    }
    Ok(written)
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Parses a port range as kube-apiserver's `--service-node-port-range` takes it
/// (`30000-32767`; a single port is a range of one).
fn parse_port_range(text: &str) -> Result<std::ops::RangeInclusive<u16>, String> {
    let bad = || format!("invalid port range {text:?}: want <first>-<last>, e.g. 30000-32767");
    let (first, last) = text.split_once('-').unwrap_or((text, text));
    let first: u16 = first.trim().parse().map_err(|_| bad())?;
    let last: u16 = last.trim().parse().map_err(|_| bad())?;
    if first == 0 || first > last {
        return Err(bad());
    }
    Ok(first..=last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_manager_runs_every_controller_by_default() {
        let cli = Cli::try_parse_from(["setpoint", "controller-manager"]).unwrap();
        let Command::ControllerManager(args) = cli.command else {
            panic!("wrong subcommand")
        };
        assert_eq!(args.controllers(), setpoint_controllers::manager::ALL);
        assert_eq!(
            args.options().concurrency,
            setpoint_controllers::manager::Concurrency::default()
        );
    }

    #[test]
    fn controller_manager_concurrency_flags_reach_the_controllers() {
        let cli = Cli::try_parse_from([
            "setpoint",
            "controller-manager",
            "--concurrent-replicaset-syncs=7",
            "--concurrent-rc-syncs=4",
            "--concurrent-gc-syncs",
            "3",
        ])
        .unwrap();
        let Command::ControllerManager(args) = cli.command else {
            panic!("wrong subcommand")
        };
        let c = args.options().concurrency;
        assert_eq!((c.replicaset, c.garbagecollector, c.deployment), (7, 3, 5));
        assert_eq!(c.replicationcontroller, 4);
        let cli = Cli::try_parse_from([
            "setpoint",
            "controller-manager",
            "--terminated-pod-gc-threshold=10",
            "--pod-gc-quarantine-seconds=2",
        ])
        .unwrap();
        let Command::ControllerManager(args) = cli.command else {
            panic!("wrong subcommand")
        };
        let gc = args.options().podgc;
        assert_eq!(gc.terminated_pod_gc_threshold, 10);
        assert_eq!(gc.quarantine, Duration::from_secs(2));
    }

    #[test]
    fn controller_manager_signs_with_the_cluster_signing_flags() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        let (cert_file, key_file) = (dir.path().join("ca.crt"), dir.path().join("ca.key"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        let parse = |extra: &[&str]| {
            let mut argv = vec!["setpoint", "controller-manager"];
            argv.extend_from_slice(extra);
            match Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(Command::ControllerManager(args)) => Ok(args),
                Ok(_) => panic!("wrong subcommand"),
                Err(e) => Err(e),
            }
        };
        let (c, k) = (cert_file.to_str().unwrap(), key_file.to_str().unwrap());
        let args = parse(&[
            "--cluster-signing-cert-file",
            c,
            "--cluster-signing-key-file",
            k,
        ])
        .unwrap();
        let ca = args.cluster_signing().unwrap().unwrap();
        assert_eq!(
            ca.max_duration,
            setpoint_controllers::csrsigning::DEFAULT_DURATION
        );
        assert_eq!(ca.cert_pem, cert.pem());
        let args = parse(&[
            "--cluster-signing-cert-file",
            c,
            "--cluster-signing-key-file",
            k,
            "--cluster-signing-duration=1h",
        ])
        .unwrap();
        let ca = args.cluster_signing().unwrap().unwrap();
        assert_eq!(ca.max_duration, std::time::Duration::from_secs(3600));
        // Without flags nothing is signed; a certificate needs its key.
        assert!(parse(&[]).unwrap().cluster_signing().unwrap().is_none());
        assert!(parse(&["--cluster-signing-cert-file", c]).is_err());
        // A key that is not one is refused at start.
        let args = parse(&[
            "--cluster-signing-cert-file",
            c,
            "--cluster-signing-key-file",
            c,
        ])
        .unwrap();
        assert!(args.cluster_signing().is_err());
    }
}
