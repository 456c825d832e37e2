//! Runs the example operator against the cluster in `$KUBECONFIG`.

use setpoint_runtime::client::Client;
use setpoint_runtime::informer::SharedInformers;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .init();
    let client = Client::try_default()?;
    let informers = SharedInformers::new(client.clone());
    let controller = namespace_defaults::controller(client, &informers);
    controller
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    Ok(())
}
