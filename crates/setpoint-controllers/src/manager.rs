//! Running the built-in controllers together: on one set of shared informers, optionally
//! gated by leadership, until told to stop. Used by `setpoint controller-manager`, by
//! `setpoint up` (in-process) and by test clusters that want real controllers.

use std::future::Future;

use setpoint_runtime::client::Client;
use setpoint_runtime::controller::Controller;
use setpoint_runtime::informer::SharedInformers;
use tokio::sync::watch;

/// Every built-in controller, by the name `--controllers` knows it.
pub const ALL: &[&str] = &[
    "namespace",
    "garbagecollector",
    "replicaset",
    "deployment",
    "nodelifecycle",
];

/// Settings of the controllers that have any.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The node lifecycle controller's grace period.
    pub node_lifecycle: crate::nodelifecycle::NodeLifecycleConfig,
}

/// Builds the named controllers on one set of shared informers.
pub async fn build(
    client: &Client,
    names: &[String],
    options: &Options,
    informers: &SharedInformers,
) -> Vec<Controller> {
    let mut out = Vec::new();
    for name in names {
        match name.as_str() {
            "namespace" => out.push(crate::namespace::controller(client.clone(), informers)),
            "deployment" => out.push(crate::deployment::controller(client.clone(), informers)),
            "garbagecollector" => {
                let resources = crate::gc::resources(client).await;
                tracing::info!(resources = resources.len(), "garbage collector watching");
                out.push(crate::gc::controller(client.clone(), informers, &resources));
            }
            "replicaset" => out.push(crate::replicaset::controller(client.clone(), informers)),
            "nodelifecycle" => out.push(crate::nodelifecycle::controller(
                client.clone(),
                informers,
                options.node_lifecycle.clone(),
            )),
            other => tracing::warn!(controller = other, "unknown controller; skipped"),
        }
    }
    out
}

/// Runs the controllers until `shutdown` completes, acting only while `leader` says so.
pub async fn run(
    client: Client,
    names: Vec<String>,
    options: Options,
    leader: Option<watch::Receiver<bool>>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let informers = SharedInformers::new(client.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    for mut c in build(&client, &names, &options, &informers).await {
        if let Some(l) = &leader {
            c = c.with_leadership(l.clone());
        }
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(c.run(async move {
            let _ = stop.wait_for(|s| *s).await;
        })));
    }
    tracing::info!(controllers = ?names, "controllers running");
    shutdown.await;
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    informers.shutdown().await;
}

/// Controllers running in the background of the current process.
pub struct InProcess {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl InProcess {
    /// Starts every built-in controller with `client` (no leader election: one set per
    /// process).
    pub fn start(client: Client) -> InProcess {
        InProcess::start_with(client, Options::default())
    }

    /// Like [`InProcess::start`], with settings.
    pub fn start_with(client: Client, options: Options) -> InProcess {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let names = ALL.iter().map(|s| s.to_string()).collect();
        let task = tokio::spawn(run(client, names, options, None, async move {
            let _ = stopped.await;
        }));
        InProcess { stop, task }
    }

    /// Stops the controllers and waits for in-flight reconciles.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}
