//! `setpoint scheduler`: places pending pods on nodes, against any API server, leader-elected
//! on `kube-system/kube-scheduler`; and the same scheduler in-process inside `setpoint up`.

use std::path::PathBuf;

use setpoint_runtime::client::Client;
use setpoint_runtime::informer::SharedInformers;
use setpoint_scheduler::SchedulerConfig;

/// The Lease scheduler replicas elect their leader on (Kubernetes' name for it).
const LEASE: (&str, &str) = ("kube-system", "kube-scheduler");
/// The scheduler's `User-Agent` name.
pub const COMPONENT: &str = "setpoint-scheduler";

#[derive(clap::Args, Clone)]
pub struct SchedulerArgs {
    /// Kubeconfig of the API server (default: `$KUBECONFIG`, then `~/.kube/config`).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Elect a leader on the Lease `kube-system/kube-scheduler`, so that only one of several
    /// replicas binds pods (`--leader-elect=false` to run unconditionally).
    #[arg(
        long,
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    leader_elect: bool,
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

/// `setpoint scheduler`.
pub async fn run(args: SchedulerArgs) -> anyhow::Result<()> {
    let (client, _) = crate::leadership::connect(args.kubeconfig.as_deref(), COMPONENT)?;
    // Binding is the scheduler's whole output; a client-side limit only slows it unless asked.
    let client = if args.kube_api_qps > 0.0 {
        client.with_rate_limit(args.kube_api_qps, (args.kube_api_qps as u32).max(1))
    } else {
        client.without_rate_limit()
    };
    let leadership = crate::leadership::elect(&client, LEASE, args.leader_elect)?;
    let config = SchedulerConfig {
        scheduler_name: args.scheduler_name,
        parallelism: args.parallelism.max(1),
        ..SchedulerConfig::default()
    };
    setpoint_scheduler::run(
        client,
        config,
        leadership.leading.clone(),
        crate::wait_for_signal(),
    )
    .await;
    leadership.release().await;
    Ok(())
}

/// The scheduler running inside `setpoint up` (one per process, so no election).
pub struct InProcess {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl InProcess {
    /// Starts the scheduler with `client` on `informers`, shared with the controllers.
    pub fn start(client: Client, informers: SharedInformers) -> InProcess {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            setpoint_scheduler::run_shared(
                client,
                SchedulerConfig::default(),
                &informers,
                None,
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
