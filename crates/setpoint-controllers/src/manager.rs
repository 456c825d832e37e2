//! Running the built-in controllers together: on one set of shared informers, optionally
//! gated by leadership, until told to stop. Used by `setpoint controller-manager`, by
//! `setpoint up` (in-process) and by test clusters that want real controllers.

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use setpoint_runtime::client::Client;
use setpoint_runtime::controller::{Controller, ControllerMetrics};
use setpoint_runtime::informer::{Scope, SharedInformers};
use setpoint_runtime::leader::LeaderHandle;
use tokio::sync::watch;

/// Every built-in controller, by the name `--controllers` knows it.
pub const ALL: &[&str] = &[
    "namespace",
    "garbagecollector",
    "replicaset",
    "replicationcontroller",
    "deployment",
    "daemonset",
    "endpoint",
    "endpointslice",
    "endpointslicemirroring",
    "statefulset",
    "disruption",
    "nodelifecycle",
    "nodeipam",
    "job",
    "cronjob",
    "ttl-after-finished",
    "pod-garbage-collector",
    "clusterrole-aggregation",
    "serviceaccount-token",
    "serviceaccount",
    "root-ca-cert-publisher",
    "resourcequota",
    "csrapproving",
    "csrsigning",
    "persistentvolume-binder",
    "pvc-protection",
    "pv-protection",
    "horizontalpodautoscaling",
    "service-lb-controller",
];

/// Settings of the controllers that have any.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The node lifecycle controller's grace period.
    pub node_lifecycle: crate::nodelifecycle::NodeLifecycleConfig,
    /// How many objects of each kind are reconciled at once.
    pub concurrency: Concurrency,
    /// The cluster CA (PEM) the token controller publishes in token Secrets as `ca.crt`
    /// (kube-controller-manager's `--root-ca-file`, by default its kubeconfig's CA).
    pub root_ca_pem: Option<String>,
    /// The CA the CSR signing controller signs with (`--cluster-signing-cert-file` and
    /// `--cluster-signing-key-file`); without one it does not run.
    pub cluster_signing: Option<crate::csrsigning::SigningCa>,
    /// Where the controllers record `controller_runtime_reconcile_*` and their queues'
    /// `workqueue_*` series (one set shared by every controller); none when `None`.
    pub metrics: Option<ControllerMetrics>,
    /// The EndpointSlice controller's settings (`--max-endpoints-per-slice`).
    pub endpointslice: crate::endpointslice::EndpointSliceConfig,
    /// The HorizontalPodAutoscaler controller's settings (`--horizontal-pod-autoscaler-*`).
    pub hpa: crate::hpa::HpaConfig,
    /// The pod garbage collector's settings (`--terminated-pod-gc-threshold`).
    pub podgc: crate::podgc::PodGcConfig,
    /// The node IPAM controller's ranges (`--allocate-node-cidrs` with `--cluster-cidr`);
    /// without them it does not run.
    pub node_ipam: Option<crate::nodeipam::NodeIpamConfig>,
}

/// Concurrent reconciles per controller: `kube-controller-manager`'s `--concurrent-*-syncs`,
/// with its defaults. A reconcile spends most of its time waiting for the API server, so
/// these bound requests in flight rather than CPU use; the node lifecycle controller keeps
/// the runtime's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Concurrency {
    /// `--concurrent-deployment-syncs` (default 5).
    pub deployment: usize,
    /// `--concurrent-replicaset-syncs` (default 5).
    pub replicaset: usize,
    /// `--concurrent-rc-syncs` (default 5): the ReplicationController controller.
    pub replicationcontroller: usize,
    /// `--concurrent-daemonset-syncs` (default 2).
    pub daemonset: usize,
    /// `--concurrent-statefulset-syncs` (default 5).
    pub statefulset: usize,
    /// `--concurrent-job-syncs` (default 5).
    pub job: usize,
    /// `--concurrent-cron-job-syncs` (default 5).
    pub cronjob: usize,
    /// `--concurrent-endpoint-syncs` (default 5): the Endpoints controller.
    pub endpoint: usize,
    /// `--concurrent-service-endpoint-syncs` (default 5): the EndpointSlice controller.
    pub endpointslice: usize,
    /// `--concurrent-namespace-syncs` (default 10).
    pub namespace: usize,
    /// `--concurrent-gc-syncs` (default 20).
    pub garbagecollector: usize,
}

impl Concurrency {
    /// The concurrency of the controller `--controllers` calls `name`; `None` for those that
    /// keep the runtime's default.
    pub fn of(&self, name: &str) -> Option<usize> {
        match name {
            "deployment" => Some(self.deployment),
            "replicaset" => Some(self.replicaset),
            "replicationcontroller" => Some(self.replicationcontroller),
            "daemonset" => Some(self.daemonset),
            "statefulset" => Some(self.statefulset),
            "job" => Some(self.job),
            "cronjob" => Some(self.cronjob),
            "namespace" => Some(self.namespace),
            "garbagecollector" => Some(self.garbagecollector),
            "endpoint" => Some(self.endpoint),
            "endpointslice" => Some(self.endpointslice),
            _ => None,
        }
    }
}

impl Default for Concurrency {
    fn default() -> Self {
        Concurrency {
            deployment: 5,
            replicaset: 5,
            replicationcontroller: 5,
            daemonset: 2,
            statefulset: 5,
            job: 5,
            cronjob: 5,
            endpoint: 5,
            endpointslice: 5,
            namespace: 10,
            garbagecollector: 20,
        }
    }
}

/// Builds the named controllers on one set of shared informers (the garbage collector, which
/// follows the set of served resources, is run by [`run`] itself).
pub async fn build(
    client: &Client,
    names: &[String],
    options: &Options,
    informers: &SharedInformers,
) -> Vec<Controller> {
    let mut out = Vec::new();
    for name in names {
        let c = client.clone();
        let controller = match name.as_str() {
            "namespace" => crate::namespace::controller(c, informers),
            "deployment" => crate::deployment::controller(c, informers),
            "garbagecollector" => continue,
            "replicaset" => crate::replicaset::controller(c, informers),
            "replicationcontroller" => crate::replicationcontroller::controller(c, informers),
            "daemonset" => crate::daemonset::controller(c, informers),
            "endpoint" => crate::endpoints::controller(c, informers),
            "endpointslice" => {
                crate::endpointslice::controller(c, informers, options.endpointslice)
            }
            "endpointslicemirroring" => crate::endpointslice::mirroring::controller(c, informers),
            "statefulset" => crate::statefulset::controller(c, informers),
            "disruption" => crate::disruption::controller(c, informers),
            "job" => crate::job::controller(c, informers),
            "cronjob" => crate::cronjob::controller(c, informers),
            "ttl-after-finished" => crate::ttlafterfinished::controller(c, informers),
            "pod-garbage-collector" => crate::podgc::controller(c, informers, options.podgc),
            "nodeipam" => match &options.node_ipam {
                Some(config) => crate::nodeipam::controller(c, informers, config),
                None => {
                    tracing::debug!(
                        controller = %name,
                        "--allocate-node-cidrs is off: not allocating node pod CIDRs"
                    );
                    continue;
                }
            },
            "clusterrole-aggregation" => crate::clusterroleaggregation::controller(c, informers),
            "serviceaccount" => crate::serviceaccount::controller(c, informers),
            "resourcequota" => crate::resourcequota::controller(c, informers),
            "root-ca-cert-publisher" => match &options.root_ca_pem {
                Some(ca) => crate::rootca::controller(c, informers, ca.clone()),
                None => {
                    tracing::info!(
                        controller = %name,
                        "no cluster CA is known (plain HTTP): not publishing kube-root-ca.crt"
                    );
                    continue;
                }
            },
            "csrapproving" => crate::csrapproving::controller(c, informers),
            "csrsigning" => match &options.cluster_signing {
                Some(ca) => crate::csrsigning::controller(c, informers, ca.clone()),
                None => {
                    tracing::info!(
                        controller = %name,
                        "no cluster signing CA is configured: not signing certificate requests"
                    );
                    continue;
                }
            },
            "serviceaccount-token" => {
                crate::tokens::controller(c, informers, options.root_ca_pem.clone())
            }
            "persistentvolume-binder" => {
                // Two controllers (claims and volumes) under the one name `--controllers` knows.
                let mut both = crate::persistentvolume::controllers(c, informers);
                let volumes = both.pop().expect("the volume side");
                push(&mut out, volumes, name, options);
                both.pop().expect("the claim side")
            }
            "pvc-protection" => crate::volumeprotection::claim_controller(c, informers),
            "pv-protection" => crate::volumeprotection::volume_controller(c, informers),
            "horizontalpodautoscaling" => crate::hpa::controller(c, informers, options.hpa),
            "service-lb-controller" => crate::servicelb::controller(c, informers),
            "nodelifecycle" => {
                crate::nodelifecycle::controller(c, informers, options.node_lifecycle.clone())
            }
            other => {
                tracing::warn!(controller = other, "unknown controller; skipped");
                continue;
            }
        };
        push(&mut out, controller, name, options);
    }
    out
}

/// Adds a controller with the concurrency and metrics `options` give its name.
fn push(out: &mut Vec<Controller>, controller: Controller, name: &str, options: &Options) {
    let controller = match options.concurrency.of(name) {
        Some(n) => controller.with_workers(n),
        None => controller,
    };
    out.push(match &options.metrics {
        Some(m) => controller.with_metrics(m.clone()),
        None => controller,
    });
}

/// Runs the controllers until `shutdown` completes, acting only while `leader` leads (each
/// reconcile in its term, its writes fenced by it: [`Controller::with_leader`]).
pub async fn run(
    client: Client,
    names: Vec<String>,
    options: Options,
    leader: Option<LeaderHandle>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let informers = SharedInformers::lean(client.clone());
    run_on(client, names, options, leader, &informers, shutdown).await;
    informers.shutdown().await;
}

/// [`run`] on informers the caller owns (and shuts down), so that other components in the
/// same process (`setpoint up`'s scheduler) share their caches instead of holding a second
/// copy of every pod.
pub async fn run_on(
    client: Client,
    names: Vec<String>,
    options: Options,
    leader: Option<LeaderHandle>,
    informers: &SharedInformers,
    shutdown: impl Future<Output = ()> + Send,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    for mut c in build(&client, &names, &options, informers).await {
        if let Some(l) = &leader {
            c = c.with_leader(l.clone());
        }
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(c.run(async move {
            let _ = stop.wait_for(|s| *s).await;
        })));
    }
    if names.iter().any(|n| n == "garbagecollector") {
        tasks.push(tokio::spawn(run_garbage_collector(
            client.clone(),
            informers.clone(),
            options.concurrency.garbagecollector,
            options.metrics.clone(),
            leader.clone(),
            stop_rx.clone(),
        )));
    }
    tracing::info!(controllers = ?names, "controllers running");
    shutdown.await;
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
}

/// Runs the garbage collector over every served resource, and builds it again when that set
/// changes (CustomResourceDefinitions come and go), so custom objects are collected too. The
/// collector keeps no state of its own, so a rebuild only costs re-reading its caches.
async fn run_garbage_collector(
    client: Client,
    informers: SharedInformers,
    workers: usize,
    metrics: Option<ControllerMetrics>,
    leader: Option<LeaderHandle>,
    mut stop: watch::Receiver<bool>,
) {
    let changed = Arc::new(tokio::sync::Notify::new());
    let crds = informers.typed::<CustomResourceDefinition>(Scope::all());
    let notify = changed.clone();
    let subscription = crds.subscribe(Arc::new(move |_: &_| notify.notify_one()));
    let mut resources = crate::gc::resources(&client).await;
    loop {
        tracing::info!(resources = resources.len(), "garbage collector watching");
        let mut c =
            crate::gc::controller(client.clone(), &informers, &resources).with_workers(workers);
        if let Some(l) = &leader {
            c = c.with_leader(l.clone());
        }
        if let Some(m) = &metrics {
            c = c.with_metrics(m.clone());
        }
        let (halt, halted) = watch::channel(false);
        let task = tokio::spawn(c.run(async move {
            let mut halted = halted;
            let _ = halted.wait_for(|h| *h).await;
        }));
        let rebuild = loop {
            tokio::select! {
                _ = changed.notified() => {
                    let now = crate::gc::resources(&client).await;
                    if now != resources {
                        resources = now;
                        break true;
                    }
                }
                _ = async { let _ = stop.wait_for(|s| *s).await; } => break false,
            }
        };
        let _ = halt.send(true);
        let _ = task.await;
        if !rebuild {
            break;
        }
    }
    crds.unsubscribe(subscription);
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

    /// Like [`InProcess::start_with`], on informers the caller shares and shuts down.
    pub fn start_on(client: Client, options: Options, informers: SharedInformers) -> InProcess {
        InProcess::start_leading_on(client, options, informers, None)
    }

    /// Like [`InProcess::start_on`], reconciling only while `leader` says so (when given).
    pub fn start_leading_on(
        client: Client,
        options: Options,
        informers: SharedInformers,
        leader: Option<LeaderHandle>,
    ) -> InProcess {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let names = ALL.iter().map(|s| s.to_string()).collect();
        let task = tokio::spawn(async move {
            run_on(client, names, options, leader, &informers, async move {
                let _ = stopped.await;
            })
            .await
        });
        InProcess { stop, task }
    }

    /// Stops the controllers and waits for in-flight reconciles.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}
