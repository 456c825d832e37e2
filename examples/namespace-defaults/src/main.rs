//! Runs the example operator against the cluster in `$KUBECONFIG` (or `~/.kube/config`), or,
//! in a pod, the cluster it runs in, as its service account (`Client::try_default`).
//!
//! `--leader-elect` runs it as one of several replicas: all keep their caches warm, only the
//! holder of the Lease `default/namespace-defaults` reconciles. `--lease-seconds N` shortens
//! the lease (renew deadline and retry period scale with it).

use std::time::Duration;

use setpoint_runtime::client::Client;
use setpoint_runtime::informer::SharedInformers;
use setpoint_runtime::leader::{LeaderConfig, LeaderElector, LeaseLock};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(std::io::stdout().is_terminal())
        .init();
    let args: Vec<String> = std::env::args().collect();
    let leader_elect = args.iter().any(|a| a == "--leader-elect");
    let lease_seconds: u64 = args
        .iter()
        .position(|a| a == "--lease-seconds")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(15);
    let client = Client::try_default()?;
    let informers = SharedInformers::new(client.clone());
    let mut controller = namespace_defaults::controller(client.clone(), &informers);
    let mut elector = None;
    if leader_elect {
        let lease = Duration::from_secs(lease_seconds.max(1));
        let config = LeaderConfig {
            lease_duration: lease,
            renew_deadline: lease.mul_f64(2.0 / 3.0),
            retry_period: lease.mul_f64(2.0 / 15.0),
            ..LeaderConfig::default()
        };
        let handle = LeaderElector::new(
            client,
            LeaseLock::new("default", "namespace-defaults"),
            config,
        )?
        .start();
        tracing::info!(
            identity = handle.identity(),
            "leader election on default/namespace-defaults"
        );
        controller = controller.with_leadership(handle.is_leader());
        elector = Some(handle);
    }
    controller
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    if let Some(h) = elector {
        h.shutdown().await;
    }
    Ok(())
}
