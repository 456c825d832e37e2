//! `setpoint controller-manager`: the built-in controllers against any API server, and the
//! same controllers in-process inside `setpoint up`.

use std::path::PathBuf;

use setpoint_runtime::client::Client;
use setpoint_runtime::informer::SharedInformers;

use setpoint_controllers::manager::{self, Concurrency, ALL};

/// The Lease replicas of the controller manager elect their leader on (the name Kubernetes
/// uses, so tools that look for it find it).
const LEASE: (&str, &str) = ("kube-system", "kube-controller-manager");
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
        default_value = "namespace,garbagecollector,replicaset,deployment,nodelifecycle,job,cronjob",
        value_parser = clap::builder::PossibleValuesParser::new(ALL)
    )]
    controllers: Vec<String>,
    /// Elect a leader on the Lease `kube-system/kube-controller-manager`, so that only one of
    /// several replicas acts (`--leader-elect=false` to run unconditionally).
    #[arg(
        long,
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    leader_elect: bool,
    /// Requests per second the controllers may send to the API server (client-side limit).
    #[arg(long, default_value_t = 50.0)]
    kube_api_qps: f64,
    /// Requests the controllers may send in a burst above `--kube-api-qps`.
    #[arg(long, default_value_t = 100)]
    kube_api_burst: u32,
    /// Seconds a node may go without renewing its Lease before it is marked unreachable.
    #[arg(long, default_value_t = 50)]
    node_monitor_grace_period_seconds: u64,
    #[command(flatten)]
    concurrency: ConcurrencyFlags,
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
    /// Jobs reconciled at once.
    #[arg(long, default_value_t = Concurrency::default().job)]
    concurrent_job_syncs: usize,
    /// CronJobs reconciled at once.
    #[arg(long, default_value_t = Concurrency::default().cronjob)]
    concurrent_cron_job_syncs: usize,
    /// Namespaces emptied at once.
    #[arg(long, default_value_t = Concurrency::default().namespace)]
    concurrent_namespace_syncs: usize,
    /// Objects the garbage collector handles at once.
    #[arg(long, default_value_t = Concurrency::default().garbagecollector)]
    concurrent_gc_syncs: usize,
}

impl ConcurrencyFlags {
    /// The concurrency the flags ask for.
    pub fn concurrency(&self) -> Concurrency {
        Concurrency {
            deployment: self.concurrent_deployment_syncs,
            replicaset: self.concurrent_replicaset_syncs,
            job: self.concurrent_job_syncs,
            cronjob: self.concurrent_cron_job_syncs,
            namespace: self.concurrent_namespace_syncs,
            garbagecollector: self.concurrent_gc_syncs,
        }
    }
}

impl ControllerManagerArgs {
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
        }
    }
}

/// `setpoint controller-manager`.
pub async fn run(args: ControllerManagerArgs) -> anyhow::Result<()> {
    let (client, _) = crate::leadership::connect(args.kubeconfig.as_deref(), COMPONENT)?;
    let client = client.with_rate_limit(args.kube_api_qps.max(0.1), args.kube_api_burst.max(1));
    let leadership = crate::leadership::elect(&client, LEASE, args.leader_elect)?;
    let options = args.options();
    manager::run(
        client,
        args.controllers,
        options,
        leadership.leading.clone(),
        crate::wait_for_signal(),
    )
    .await;
    leadership.release().await;
    Ok(())
}

/// The controllers running inside `setpoint up`.
///
/// No leader election: the controllers share the process (and its lifetime) with the API
/// server they manage, so there is exactly one set per server. Several `setpoint up` sharing
/// one etcd would each run a set; the controllers are idempotent and delete with uid and
/// resourceVersion preconditions, so duplicates only cost extra requests, while a lease would
/// delay the controllers by up to a lease duration after every unclean restart of a
/// single-node cluster.
pub fn start_in_process(
    client: Client,
    node_grace: std::time::Duration,
    concurrency: Concurrency,
    informers: SharedInformers,
) -> manager::InProcess {
    manager::InProcess::start_on(
        client,
        manager::Options {
            node_lifecycle: setpoint_controllers::nodelifecycle::NodeLifecycleConfig {
                grace_period: node_grace,
            },
            concurrency,
        },
        informers,
    )
}
