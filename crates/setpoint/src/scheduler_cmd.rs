//! `setpoint scheduler`: places pending pods on nodes, against any API server, leader-elected
//! on `kube-system/kube-scheduler`; and the same scheduler in-process inside `setpoint up`.

use std::path::PathBuf;

use setpoint_runtime::client::Client;
use setpoint_runtime::informer::SharedInformers;
use setpoint_scheduler::SchedulerConfig;

/// The Lease scheduler replicas elect their leader on (Kubernetes' name for it).
pub const LEASE: (&str, &str) = ("kube-system", "kube-scheduler");
/// The scheduler's `User-Agent` name.
pub const COMPONENT: &str = "setpoint-scheduler";

#[derive(clap::Args, Clone)]
pub struct SchedulerArgs {
    /// Kubeconfig of the API server (default: `$KUBECONFIG`, then `~/.kube/config`).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Leader election on the Lease `kube-system/kube-scheduler`.
    #[command(flatten)]
    leader_election: crate::leadership::LeaderElectionFlags,
    /// Address the HTTPS endpoint (`/healthz`, `/livez`, `/readyz`, `/metrics`) listens on.
    #[arg(long, default_value = "0.0.0.0")]
    bind_address: std::net::IpAddr,
    /// Port of the HTTPS endpoint (0 picks a free port and prints it).
    #[arg(long, default_value_t = 10259)]
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
    /// Pods whose `spec.schedulerName` is this are scheduled (unset means `default-scheduler`).
    #[arg(long, default_value = "default-scheduler")]
    scheduler_name: String,
    /// Most bind and status requests in flight at once.
    #[arg(long, default_value_t = SchedulerConfig::default().parallelism)]
    parallelism: usize,
    /// Requests per second to the API server (client-side limit; 0 for none).
    #[arg(long, default_value_t = 0.0)]
    kube_api_qps: f64,
}

impl SchedulerArgs {
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
}

/// `setpoint scheduler`.
pub async fn run(args: SchedulerArgs) -> anyhow::Result<()> {
    let (client, kubeconfig) = crate::leadership::connect(args.kubeconfig.as_deref(), COMPONENT)?;
    // The runtime's metrics, served at `/metrics` on the secure port.
    let mut registry = setpoint_runtime::metrics::Registry::default();
    let leader_metrics = setpoint_runtime::metrics::LeaderMetrics::new(&mut registry);
    let client_metrics =
        std::sync::Arc::new(setpoint_runtime::metrics::ClientMetrics::new(&mut registry));
    let informer_metrics = setpoint_runtime::metrics::InformerMetrics::new(&mut registry);
    // Binding is the scheduler's whole output; a client-side limit only slows it unless asked.
    let client = if args.kube_api_qps > 0.0 {
        client.with_rate_limit(args.kube_api_qps, (args.kube_api_qps as u32).max(1))
    } else {
        client.without_rate_limit()
    }
    .with_metrics(client_metrics);
    let server = args
        .secure_serving()
        .start(std::sync::Arc::new(registry), kubeconfig.ca_pem.as_deref())
        .await?;
    tracing::info!(address = %server.local_addr(), "serving /healthz, /livez, /readyz and /metrics");
    let leadership =
        crate::leadership::elect(&client, LEASE, &args.leader_election, Some(leader_metrics))?;
    let config = SchedulerConfig {
        scheduler_name: args.scheduler_name,
        parallelism: args.parallelism.max(1),
        ..SchedulerConfig::default()
    };
    // `setpoint_scheduler::run`'s informers (one LIST page: the scheduler needs every pod
    // before it decides anyway), recording into this registry.
    let informers = SharedInformers::with_options(
        client.clone(),
        setpoint_runtime::informer::InformerOptions {
            page_size: None,
            metrics: Some(informer_metrics),
            ..setpoint_runtime::informer::InformerOptions::lean()
        },
        setpoint_runtime::informer::StartPolicy::OnRequest,
    );
    setpoint_scheduler::run_shared(
        client,
        config,
        &informers,
        leadership.leading.clone(),
        crate::wait_for_signal(),
    )
    .await;
    informers.shutdown().await;
    leadership.release().await;
    drop(server);
    Ok(())
}

/// The scheduler running inside `setpoint up`, binding only while it leads
/// `kube-system/kube-scheduler` (the election a standalone `setpoint scheduler` joins too).
pub struct InProcess {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl InProcess {
    /// Starts the scheduler with `client` on `informers`, shared with the controllers,
    /// acting only while `leading` says so (when given).
    pub fn start(
        client: Client,
        informers: SharedInformers,
        leading: Option<tokio::sync::watch::Receiver<bool>>,
    ) -> InProcess {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            setpoint_scheduler::run_shared(
                client,
                SchedulerConfig::default(),
                &informers,
                leading,
                async move {
                    let _ = stopped.await;
                },
            )
            .await
        });
        InProcess { stop, task }
    }

    /// Stops it and waits for in-flight binds.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}
