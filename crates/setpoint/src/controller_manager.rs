//! `setpoint controller-manager`: the built-in controllers against any API server, and the
//! same controllers in-process inside `setpoint up`.

use std::path::PathBuf;

use setpoint_runtime::client::Client;
use setpoint_runtime::informer::SharedInformers;

use setpoint_controllers::csrsigning::SigningCa;
use setpoint_controllers::manager::{self, Concurrency, ALL};

/// The Lease replicas of the controller manager elect their leader on (the name Kubernetes
/// uses, so tools that look for it find it).
pub const LEASE: (&str, &str) = ("kube-system", "kube-controller-manager");
/// The controllers' `User-Agent` name: the field manager their writes are recorded under.
pub const COMPONENT: &str = "setpoint-controller-manager";

#[derive(clap::Args, Clone)]
pub struct ControllerManagerArgs {
    /// Kubeconfig of the API server to manage (default: `$KUBECONFIG`, then `~/.kube/config`).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The controllers to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_values = ALL,
        value_parser = clap::builder::PossibleValuesParser::new(ALL)
    )]
    controllers: Vec<String>,
    /// Leader election on the Lease `kube-system/kube-controller-manager`.
    #[command(flatten)]
    leader_election: crate::leadership::LeaderElectionFlags,
    /// Address the HTTPS endpoint (`/healthz`, `/livez`, `/readyz`, `/metrics`) listens on.
    #[arg(long, default_value = "0.0.0.0")]
    bind_address: std::net::IpAddr,
    /// Port of the HTTPS endpoint (0 picks a free port and prints it).
    #[arg(long, default_value_t = 10257)]
    secure_port: u16,
    /// The endpoint's certificate (PEM); without it a self-signed one is made at start.
    #[arg(long, requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The private key of `--tls-cert-file` (PEM).
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// CA bundle (PEM) whose client certificates may read `/metrics` (default: the
    /// kubeconfig's cluster CA).
    #[arg(long)]
    client_ca_file: Option<PathBuf>,
    /// Requests per second the controllers may send to the API server (client-side limit).
    #[arg(long, default_value_t = 50.0)]
    kube_api_qps: f64,
    /// Requests the controllers may send in a burst above `--kube-api-qps`.
    #[arg(long, default_value_t = 100)]
    kube_api_burst: u32,
    /// The CA certificate (PEM) the CSR signing controller issues certificates with.
    #[arg(long, requires = "cluster_signing_key_file")]
    cluster_signing_cert_file: Option<PathBuf>,
    /// The private key (PEM) of `--cluster-signing-cert-file`.
    #[arg(long, requires = "cluster_signing_cert_file")]
    cluster_signing_key_file: Option<PathBuf>,
    /// The longest validity of the certificates the CSR signing controller issues.
    #[arg(long, default_value = "8760h0m0s", value_parser = crate::leadership::parse_go_duration)]
    cluster_signing_duration: std::time::Duration,
    /// Seconds a node may go without renewing its Lease before it is marked unreachable.
    #[arg(long, default_value_t = 50)]
    node_monitor_grace_period_seconds: u64,
    #[command(flatten)]
    concurrency: ConcurrencyFlags,
    #[command(flatten)]
    podgc: PodGcFlags,
    #[command(flatten)]
    node_ipam: crate::node_ipam::NodeIpamFlags,
    /// The pod network nodes' ranges are handed from with `--allocate-node-cidrs`: one
    /// CIDR, or an IPv4 and an IPv6 one comma-separated.
    #[arg(long)]
    cluster_cidr: Option<String>,
    #[command(flatten)]
    hpa: crate::hpa_flags::HpaFlags,
    /// The most endpoints an EndpointSlice holds before another is started (1 to 1000).
    #[arg(long, default_value_t = setpoint_controllers::endpointslice::DEFAULT_MAX_ENDPOINTS_PER_SLICE as u64, value_parser = clap::value_parser!(u64).range(1..=1000))]
    max_endpoints_per_slice: u64,
    /// Run each controller as its own ServiceAccount in `kube-system` (upstream's
    /// `system:controller:<name>` roles), with tokens this manager requests and renews;
    /// otherwise every controller uses the kubeconfig's credentials.
    #[arg(long)]
    use_service_account_credentials: bool,
}

/// How many objects each controller reconciles at once (kube-controller-manager's flags and
/// defaults); `setpoint controller-manager` and `setpoint up` take the same.
#[derive(clap::Args, Clone)]
pub struct ConcurrencyFlags {
    /// Deployments reconciled at once.
    #[arg(long, default_value_t = Concurrency::default().deployment)]
    concurrent_deployment_syncs: usize,
    /// ReplicaSets reconciled at once.
    #[arg(long, default_value_t = Concurrency::default().replicaset)]
    concurrent_replicaset_syncs: usize,
    /// ReplicationControllers reconciled at once.
    #[arg(long, default_value_t = Concurrency::default().replicationcontroller)]
    concurrent_rc_syncs: usize,
    /// DaemonSets reconciled at once.
    #[arg(long, default_value_t = Concurrency::default().daemonset)]
    concurrent_daemonset_syncs: usize,
    /// StatefulSets reconciled at once.
    #[arg(long, default_value_t = Concurrency::default().statefulset)]
    concurrent_statefulset_syncs: usize,
    /// Jobs reconciled at once.
    #[arg(long, default_value_t = Concurrency::default().job)]
    concurrent_job_syncs: usize,
    /// CronJobs reconciled at once.
    #[arg(long, default_value_t = Concurrency::default().cronjob)]
    concurrent_cron_job_syncs: usize,
    /// Services whose Endpoints are written at once.
    #[arg(long, default_value_t = Concurrency::default().endpoint)]
    concurrent_endpoint_syncs: usize,
    /// Services whose EndpointSlices are written at once.
    #[arg(long, default_value_t = Concurrency::default().endpointslice)]
    concurrent_service_endpoint_syncs: usize,
    /// Namespaces emptied at once.
    #[arg(long, default_value_t = Concurrency::default().namespace)]
    concurrent_namespace_syncs: usize,
    /// Objects the garbage collector handles at once.
    #[arg(long, default_value_t = Concurrency::default().garbagecollector)]
    concurrent_gc_syncs: usize,
}

/// The pod garbage collector's flags; `setpoint controller-manager` and `setpoint up` take
/// the same.
#[derive(clap::Args, Clone)]
pub struct PodGcFlags {
    /// Terminated pods (Succeeded or Failed) kept before the oldest are deleted; 0 keeps
    /// them all.
    #[arg(long, default_value_t = setpoint_controllers::podgc::DEFAULT_TERMINATED_POD_GC_THRESHOLD)]
    terminated_pod_gc_threshold: usize,
    /// Seconds a node that pods are bound to may be missing from the controllers' cache
    /// before it is read from the server and, if gone, its pods deleted (upstream's fixed
    /// 40 s quarantine).
    #[arg(long, default_value_t = setpoint_controllers::podgc::DEFAULT_QUARANTINE.as_secs())]
    pod_gc_quarantine_seconds: u64,
}

impl PodGcFlags {
    /// The pod garbage collector's settings the flags ask for.
    pub fn config(&self) -> setpoint_controllers::podgc::PodGcConfig {
        setpoint_controllers::podgc::PodGcConfig {
            terminated_pod_gc_threshold: self.terminated_pod_gc_threshold,
            quarantine: std::time::Duration::from_secs(self.pod_gc_quarantine_seconds),
        }
    }
}

impl ConcurrencyFlags {
    /// The concurrency the flags ask for.
    pub fn concurrency(&self) -> Concurrency {
        Concurrency {
            deployment: self.concurrent_deployment_syncs,
            replicaset: self.concurrent_replicaset_syncs,
            replicationcontroller: self.concurrent_rc_syncs,
            daemonset: self.concurrent_daemonset_syncs,
            statefulset: self.concurrent_statefulset_syncs,
            job: self.concurrent_job_syncs,
            cronjob: self.concurrent_cron_job_syncs,
            endpoint: self.concurrent_endpoint_syncs,
            endpointslice: self.concurrent_service_endpoint_syncs,
            namespace: self.concurrent_namespace_syncs,
            garbagecollector: self.concurrent_gc_syncs,
        }
    }
}

impl ControllerManagerArgs {
    /// The HTTPS endpoint's settings.
    fn secure_serving(&self) -> crate::secure_serving::SecureServing {
        crate::secure_serving::SecureServing {
            bind_address: self.bind_address,
            secure_port: self.secure_port,
            tls_cert_file: self.tls_cert_file.clone(),
            tls_private_key_file: self.tls_private_key_file.clone(),
            client_ca_file: self.client_ca_file.clone(),
        }
    }

    /// The controllers selected.
    #[cfg(test)]
    pub fn controllers(&self) -> &[String] {
        &self.controllers
    }

    /// The controllers' settings from the flags.
    pub fn options(&self) -> manager::Options {
        manager::Options {
            node_lifecycle: setpoint_controllers::nodelifecycle::NodeLifecycleConfig {
                grace_period: std::time::Duration::from_secs(
                    self.node_monitor_grace_period_seconds,
                ),
            },
            concurrency: self.concurrency.concurrency(),
            root_ca_pem: None,
            cluster_signing: None,
            metrics: None,
            endpointslice: setpoint_controllers::endpointslice::EndpointSliceConfig {
                max_endpoints_per_slice: self.max_endpoints_per_slice as usize,
            },
            podgc: self.podgc.config(),
            hpa: self.hpa.config(),
            node_ipam: None,
        }
    }

    /// The CA of `--cluster-signing-cert-file` and `--cluster-signing-key-file`, if given.
    pub fn cluster_signing(&self) -> anyhow::Result<Option<SigningCa>> {
        match (
            &self.cluster_signing_cert_file,
            &self.cluster_signing_key_file,
        ) {
            (Some(cert), Some(key)) => SigningCa::load(cert, key, self.cluster_signing_duration)
                .map(Some)
                .map_err(|e| anyhow::anyhow!("--cluster-signing-cert-file: {e}")),
            _ => Ok(None),
        }
    }
}

/// `setpoint controller-manager`.
pub async fn run(args: ControllerManagerArgs) -> anyhow::Result<()> {
    let (client, kubeconfig) = crate::leadership::connect(args.kubeconfig.as_deref(), COMPONENT)?;
    // The runtime's metrics, served at `/metrics` on the secure port.
    let mut registry = setpoint_runtime::metrics::Registry::default();
    let controller_metrics = setpoint_runtime::controller::ControllerMetrics::new();
    controller_metrics.register(&mut registry);
    let leader_metrics = setpoint_runtime::metrics::LeaderMetrics::new(&mut registry);
    let client_metrics =
        std::sync::Arc::new(setpoint_runtime::metrics::ClientMetrics::new(&mut registry));
    let informer_metrics = setpoint_runtime::metrics::InformerMetrics::new(&mut registry);
    let client = client
        .with_rate_limit(args.kube_api_qps.max(0.1), args.kube_api_burst.max(1))
        .with_metrics(client_metrics.clone());
    // `manager::run`'s informers, recording into this registry.
    let informers = SharedInformers::with_options(
        client.clone(),
        setpoint_runtime::informer::InformerOptions {
            metrics: Some(informer_metrics),
            ..setpoint_runtime::informer::InformerOptions::lean()
        },
        setpoint_runtime::informer::StartPolicy::OnRequest,
    );
    let server = args
        .secure_serving()
        .start(std::sync::Arc::new(registry), kubeconfig.ca_pem.as_deref())
        .await?;
    tracing::info!(address = %server.local_addr(), "serving /healthz, /livez, /readyz and /metrics");
    let leadership =
        crate::leadership::elect(&client, LEASE, &args.leader_election, Some(leader_metrics))?;
    let options = manager::Options {
        metrics: Some(controller_metrics),
        // Upstream's `--root-ca-file` defaults to the CA the kubeconfig trusts.
        root_ca_pem: kubeconfig.ca_pem.clone(),
        cluster_signing: args.cluster_signing()?,
        node_ipam: args.node_ipam.config(args.cluster_cidr.as_deref())?,
        ..args.options()
    };
    if args.use_service_account_credentials {
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let signal = tokio::spawn(async move {
            crate::wait_for_signal().await;
            let _ = stop_tx.send(true);
        });
        // Informers stay on the manager's own identity (it may list and watch everything),
        // shared by every controller as upstream's are; writes go through each controller's
        // own client.
        let mut runs = Vec::new();
        let mut own = Vec::new();
        for name in &args.controllers {
            let Some(account) = crate::sa_credentials::service_account_of(name) else {
                own.push(name.clone());
                continue;
            };
            let Some(c) =
                crate::sa_credentials::client_for(&client, &kubeconfig, account, stop.clone())
                    .await?
            else {
                break;
            };
            let c = c
                .with_rate_limit(args.kube_api_qps.max(0.1), args.kube_api_burst.max(1))
                .with_metrics(client_metrics.clone())
                .with_user_agent(COMPONENT);
            tracing::info!(controller = %name, account, "controller runs as its service account");
            runs.push((c, vec![name.clone()]));
        }
        if !own.is_empty() {
            runs.push((client.clone(), own));
        }
        let tasks: Vec<_> = runs
            .into_iter()
            .map(|(c, names)| {
                let options = options.clone();
                let leading = leadership.handle.clone();
                let informers = informers.clone();
                let mut stop = stop.clone();
                tokio::spawn(async move {
                    manager::run_on(c, names, options, leading, &informers, async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
        signal.abort();
    } else {
        manager::run_on(
            client,
            args.controllers,
            options,
            leadership.handle.clone(),
            &informers,
            crate::wait_for_signal(),
        )
        .await;
    }
    informers.shutdown().await;
    leadership.release().await;
    drop(server);
    Ok(())
}

/// The controllers running inside `setpoint up`, reconciling only while `leading` says so:
/// `up` joins the same election on `kube-system/kube-controller-manager` as a standalone
/// `setpoint controller-manager`, so that one pointed at the same server stands by until `up`
/// stops (and releases the Lease), and `kubectl -n kube-system get lease` names the holder.
#[allow(clippy::too_many_arguments)]
pub fn start_in_process(
    client: Client,
    node_grace: std::time::Duration,
    concurrency: Concurrency,
    informers: SharedInformers,
    leading: Option<setpoint_runtime::leader::LeaderHandle>,
    metrics: Option<setpoint_runtime::controller::ControllerMetrics>,
    root_ca_pem: Option<String>,
    cluster_signing: Option<SigningCa>,
    podgc: setpoint_controllers::podgc::PodGcConfig,
    hpa: setpoint_controllers::hpa::HpaConfig,
    node_ipam: Option<setpoint_controllers::nodeipam::NodeIpamConfig>,
) -> manager::InProcess {
    manager::InProcess::start_leading_on(
        client,
        manager::Options {
            node_lifecycle: setpoint_controllers::nodelifecycle::NodeLifecycleConfig {
                grace_period: node_grace,
            },
            concurrency,
            root_ca_pem,
            cluster_signing,
            metrics,
            endpointslice: Default::default(),
            podgc,
            hpa,
            node_ipam,
        },
        informers,
        leading,
    )
}
