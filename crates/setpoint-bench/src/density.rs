//! `bench density`: how fast the cluster turns D Deployments × R replicas into Running pods on
//! N nodes, and how fast it deletes them again. With another [`WorkloadKind`] the workloads are
//! StatefulSets of R replicas (`podManagementPolicy: Parallel`) or DaemonSets (one pod per
//! node the run's pods may go to), and the run ends when every pod is Running.
//!
//! The run: start N simulated nodes in this process (through the public API, like any node
//! agent), or with `reuse_nodes` find N simulated nodes the cluster already has (hosted by
//! `setpoint up --simulate N` or `setpoint agent --simulate N`), and wait until they are
//! Ready; open the watches ([`crate::observe`]); create the Deployments with C concurrent
//! requests (optionally started at a fixed rate); wait until every pod is Running and every
//! Deployment Available (or the timeout); delete the namespaces and wait until they are gone.
//! The pods go only to the run's nodes (or, reused, to the cluster's simulated nodes): see
//! [`crate::placement`].
//! Everything observed goes into the raw log, and the report is computed from it alone.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node};
use parking_lot::Mutex;
use serde_json::json;
use setpoint_node::{Capacity, SimulatedConfig, SimulationConfig};
use setpoint_runtime::client::{Api, Client, DeleteParams, ListParams, PostParams};
use tokio::sync::watch;

use crate::observe::Observer;
use crate::placement::Placement;
use crate::procstat::Sampler;
use crate::progress::{self, Progress};
use crate::record::{Entry, Mark, Record, Recorder};
use crate::report::{self, DensityReport};
use crate::timed::with_retries;
use crate::BenchError;

/// The label every object of a run carries, valued with the run id.
pub const RUN_LABEL: &str = "setpoint-bench-run";

/// Which workload a density run creates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkloadKind {
    /// Deployments of `replicas` pods; the run also waits for each to be Available.
    #[default]
    Deployment,
    /// StatefulSets of `replicas` pods, created in parallel (`podManagementPolicy: Parallel`).
    StatefulSet,
    /// DaemonSets: one pod on every node the run's pods may go to (`replicas` is unused).
    DaemonSet,
}

impl WorkloadKind {
    /// The kind's name, as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::DaemonSet => "DaemonSet",
        }
    }
}

/// How a density run goes.
#[derive(Clone, Debug)]
pub struct DensityConfig {
    /// Which workloads to create.
    pub kind: WorkloadKind,
    /// Simulated nodes to host in this process (0: use the nodes the cluster has).
    pub nodes: usize,
    /// Host no nodes: wait until the cluster has `nodes` Ready simulated nodes of its own
    /// (labelled `setpoint.dev/simulated=true`) and leave them in place at the end.
    pub reuse_nodes: bool,
    /// Deployments to create.
    pub deployments: usize,
    /// `spec.replicas` of each Deployment.
    pub replicas: i32,
    /// One namespace per Deployment instead of one for the run.
    pub namespace_per_deployment: bool,
    /// Deployment creates in flight at once.
    pub create_concurrency: usize,
    /// Deployment creates started per second (`None`: as fast as the cluster answers, with
    /// `create_concurrency` in flight).
    pub create_rate: Option<f64>,
    /// The container image of the Deployments' pods.
    pub image: String,
    /// Leave everything in place at the end.
    pub keep: bool,
    /// How long to wait for nodes, readiness and deletion (each).
    pub timeout: Duration,
    /// Pods each simulated node takes.
    pub node_pods: u32,
    /// Simulated containers start this long after their pod arrives…
    pub start_delay: Duration,
    /// … and turn ready this long after starting.
    pub ready_delay: Duration,
    /// Print a progress line on stderr.
    pub progress: bool,
    /// Where to write the raw log (JSON lines).
    pub raw_log: Option<PathBuf>,
    /// Which local processes to sample (besides this one).
    pub processes: crate::procstat::Scope,
}

impl Default for DensityConfig {
    fn default() -> Self {
        DensityConfig {
            kind: WorkloadKind::Deployment,
            nodes: 0,
            reuse_nodes: false,
            deployments: 1,
            replicas: 1,
            namespace_per_deployment: false,
            create_concurrency: 32,
            create_rate: None,
            image: "nginx:1.25".into(),
            keep: false,
            timeout: Duration::from_secs(600),
            node_pods: 110,
            start_delay: Duration::ZERO,
            ready_delay: Duration::ZERO,
            progress: true,
            raw_log: None,
            processes: Default::default(),
        }
    }
}

/// What a run leaves: the report and the log it was computed from.
#[derive(Clone, Debug)]
pub struct Outcome<R> {
    /// The figures, computed from `log`.
    pub report: R,
    /// The raw event log of the run, in time order.
    pub log: Vec<Entry>,
}

/// A short random run id (lowercase hex, valid in names and label values).
pub fn run_id() -> String {
    format!("{:06x}", rand::random::<u32>() & 0xff_ffff)
}

/// Ready nodes that take pods (`Ready=True`, not cordoned), optionally label-selected.
pub(crate) async fn ready_nodes(
    client: &Client,
    rec: &Recorder,
    selector: Option<&str>,
) -> Result<u64, BenchError> {
    let api = Api::<Node>::all(client.clone());
    let mut lp = ListParams::default();
    if let Some(s) = selector {
        lp = lp.labels(s);
    }
    let (list, _) = with_retries(rec, "list", "nodes", || api.list(&lp)).await;
    Ok(list?
        .items
        .iter()
        .filter(|n| {
            let cordoned = n
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            ready && !cordoned
        })
        .count() as u64)
}

/// Polls `done` every `every` until it holds (true) or `timeout` passes (false). A failed
/// check counts as "not yet": a loaded server may refuse a read for a moment, and the failed
/// request is already in the log.
pub(crate) async fn wait_until<F, Fut>(
    timeout: Duration,
    every: Duration,
    mut done: F,
) -> Result<bool, BenchError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, BenchError>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if done().await.unwrap_or(false) {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(every).await;
    }
}

/// One workload of the run, as JSON: the same labels and pod template for every kind.
fn workload(
    kind: WorkloadKind,
    name: &str,
    run: &str,
    replicas: i32,
    image: &str,
    placement: &Placement,
) -> serde_json::Value {
    let pod_spec = placement.pod_spec(image);
    let mut spec = json!({
        "selector": {"matchLabels": {"app": name, RUN_LABEL: run}},
        "template": {
            "metadata": {"labels": {"app": name, RUN_LABEL: run}},
            "spec": pod_spec
        }
    });
    match kind {
        WorkloadKind::Deployment => spec["replicas"] = json!(replicas),
        WorkloadKind::StatefulSet => {
            spec["replicas"] = json!(replicas);
            spec["serviceName"] = json!(name);
            spec["podManagementPolicy"] = json!("Parallel");
        }
        WorkloadKind::DaemonSet => {}
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": kind.as_str(),
        "metadata": {"name": name, "labels": {RUN_LABEL: run}},
        "spec": spec
    })
}

/// Creates one workload (a failed create stays in the log: errors, and what is missing at
/// the end).
async fn create_workload(
    client: Client,
    rec: &Recorder,
    ns: &str,
    object: serde_json::Value,
    kind: WorkloadKind,
) {
    let pp = PostParams::default();
    match kind {
        WorkloadKind::Deployment => {
            let Ok(d) = serde_json::from_value::<Deployment>(object) else {
                return;
            };
            let api = Api::<Deployment>::namespaced(client, ns);
            let _ = with_retries(rec, "create", "deployments", || api.create(&pp, &d)).await;
        }
        WorkloadKind::StatefulSet => {
            let Ok(s) = serde_json::from_value::<StatefulSet>(object) else {
                return;
            };
            let api = Api::<StatefulSet>::namespaced(client, ns);
            let _ = with_retries(rec, "create", "statefulsets", || api.create(&pp, &s)).await;
        }
        WorkloadKind::DaemonSet => {
            let Ok(d) = serde_json::from_value::<DaemonSet>(object) else {
                return;
            };
            let api = Api::<DaemonSet>::namespaced(client, ns);
            let _ = with_retries(rec, "create", "daemonsets", || api.create(&pp, &d)).await;
        }
    }
}

/// Hosts the simulated nodes of a run until dropped or stopped.
pub struct Nodes {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), setpoint_node::AgentError>>,
}

impl Nodes {
    /// Starts `n` simulated nodes of run `run`, named `bench-<run>-<i>`, labelled and tainted
    /// so that only the run's pods go to them ([`Placement::RunNodes`]).
    pub fn start(
        client: &Client,
        n: usize,
        run: &str,
        pods: u32,
        runtime: SimulatedConfig,
    ) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let config = SimulationConfig {
            nodes: n,
            name_prefix: format!("bench-{run}-"),
            capacity: Capacity {
                cpu: "8".into(),
                memory: "32Gi".into(),
                pods,
            },
            labels: Placement::node_labels(run),
            taints: Placement::node_taints(run),
            runtime,
            ..Default::default()
        };
        let task = tokio::spawn(setpoint_node::run_simulated(
            client.clone(),
            config,
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            },
        ));
        Nodes { stop, task }
    }

    /// Stops the nodes (their Node objects stay, as a stopped kubelet's do).
    pub async fn stop(self) -> Result<(), BenchError> {
        let _ = self.stop.send(true);
        match self.task.await {
            Ok(r) => r.map_err(|e| BenchError::Nodes(e.to_string())),
            Err(e) => Err(BenchError::Nodes(e.to_string())),
        }
    }
}

/// Deletes the Node objects of a run's simulated nodes (after they stopped).
pub async fn delete_nodes(
    client: &Client,
    rec: &Recorder,
    selector: &str,
) -> Result<(), BenchError> {
    let api = Api::<Node>::all(client.clone());
    let lp = ListParams::default().labels(selector);
    let (list, _) = with_retries(rec, "list", "nodes", || api.list(&lp)).await;
    let names: Vec<String> = list?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    futures::stream::iter(names)
        .for_each_concurrent(32, |name| {
            let api = api.clone();
            async move {
                let dp = DeleteParams::default();
                let _ = with_retries(rec, "delete", "nodes", || api.delete(&name, &dp)).await;
            }
        })
        .await;
    Ok(())
}

/// What the progress line is about.
#[derive(Clone, Copy, Debug)]
enum Stage {
    /// Waiting until `want` nodes are Ready; `ready` were at the last look.
    Nodes { ready: u64, want: u64 },
    /// Creating, and waiting for Running and Available.
    Load,
    /// Waiting until the run's namespaces are gone; `left` were at the last look.
    Deleting { left: u64, of: u64 },
}

/// Runs the density benchmark against the cluster behind `client`.
pub async fn run(
    client: Client,
    config: DensityConfig,
) -> Result<Outcome<DensityReport>, BenchError> {
    let rec = Recorder::new();
    let id = run_id();
    let selector = format!("{RUN_LABEL}={id}");
    // A DaemonSet's pods are one per usable node, known once the nodes are Ready.
    let pods_per_workload = Arc::new(std::sync::atomic::AtomicU64::new(
        config.replicas.max(0) as u64
    ));
    let expected_pods = {
        let per = pods_per_workload.clone();
        let n = config.deployments as u64;
        move || n * per.load(std::sync::atomic::Ordering::Relaxed)
    };
    // Only Deployments are also waited on to be Available.
    let d = if config.kind == WorkloadKind::Deployment {
        config.deployments as u64
    } else {
        0
    };
    let kind_name = config.kind.as_str();
    let hosted = config.nodes > 0 && !config.reuse_nodes;
    let placement = if hosted {
        Placement::RunNodes(id.clone())
    } else if config.reuse_nodes {
        Placement::SimulatedNodes
    } else {
        Placement::Anywhere
    };

    let stage = Arc::new(Mutex::new(Stage::Nodes {
        ready: 0,
        want: config.nodes as u64,
    }));
    let counts: Arc<OnceLock<Arc<crate::observe::Counts>>> = Arc::new(OnceLock::new());
    let progress = config.progress.then(|| {
        let (stage, counts, expected_pods) = (stage.clone(), counts.clone(), expected_pods.clone());
        Progress::start(move || match *stage.lock() {
            Stage::Nodes { ready, want } => {
                format!("{} nodes Ready {ready}/{want}", progress::bar(ready, want))
            }
            Stage::Load => {
                let (c, s, r, a) = counts.get().map(|c| c.get()).unwrap_or_default();
                let pods = expected_pods();
                let available = if d > 0 {
                    format!("  Deployments Available {a}/{d}")
                } else {
                    String::new()
                };
                format!(
                    "{} pods Running {r}/{pods}  created {c}  scheduled {s}{available}",
                    progress::bar(r, pods)
                )
            }
            Stage::Deleting { left, of } => {
                let gone = of.saturating_sub(left);
                format!("{} namespaces deleted {gone}/{of}", progress::bar(gone, of))
            }
        })
    });

    let nodes = hosted.then(|| {
        Nodes::start(
            &client,
            config.nodes,
            &id,
            config.node_pods,
            SimulatedConfig {
                start_delay: config.start_delay,
                ready_delay: config.ready_delay,
                ..Default::default()
            },
        )
    });
    let eligible = placement.node_selector();
    if config.nodes > 0 {
        let want = config.nodes as u64;
        let ok = wait_until(config.timeout, Duration::from_millis(250), || async {
            let ready = ready_nodes(&client, &rec, eligible.as_deref()).await?;
            *stage.lock() = Stage::Nodes { ready, want };
            Ok(ready >= want)
        })
        .await?;
        if !ok {
            if let Some(p) = progress {
                p.stop().await;
            }
            if let Some(n) = nodes {
                let _ = n.stop().await;
            }
            return Err(BenchError::Setup(format!(
                "{} simulated nodes were not Ready within {:?}",
                config.nodes, config.timeout
            )));
        }
    }
    // The nodes the run's pods may go to.
    let usable_nodes = ready_nodes(&client, &rec, eligible.as_deref()).await?;
    if config.kind == WorkloadKind::DaemonSet {
        pods_per_workload.store(usable_nodes, std::sync::atomic::Ordering::Relaxed);
    }
    let pods = expected_pods();
    // What the report multiplies by the workloads to get the pods.
    let replicas = pods_per_workload.load(std::sync::atomic::Ordering::Relaxed);
    rec.record_at(
        0,
        Record::Start {
            benchmark: "density".into(),
            run_id: id.clone(),
            unix_ms: chrono::Utc::now().timestamp_millis(),
            params: json!({
                "nodes": usable_nodes,
                // Hosted by this run; reused ones are the cluster's.
                "simulated_nodes": if hosted { config.nodes } else { 0 },
                "reused_nodes": config.reuse_nodes,
                "node_selector": eligible,
                "kind": kind_name,
                "deployments": config.deployments,
                "replicas": replicas,
                "namespace_per_deployment": config.namespace_per_deployment,
                "create_concurrency": config.create_concurrency,
                "create_rate": config.create_rate,
                "image": config.image,
                "start_delay_ms": config.start_delay.as_millis() as u64,
                "ready_delay_ms": config.ready_delay.as_millis() as u64,
            }),
        },
    );
    let sampler = Sampler::start(
        rec.clone(),
        config.processes.clone(),
        Duration::from_secs(1),
    );
    let observer = Observer::start(&client, &rec, &selector).await?;

    // Namespaces are set-up, not load: they exist before the clock starts.
    let namespaces: Vec<String> = if config.namespace_per_deployment {
        (0..config.deployments)
            .map(|i| format!("bench-{id}-{i}"))
            .collect()
    } else {
        vec![format!("bench-{id}")]
    };
    let ns_api = Api::<Namespace>::all(client.clone());
    let created: Vec<Result<(), BenchError>> = futures::stream::iter(namespaces.clone())
        .map(|name| {
            let (client, rec, id) = (client.clone(), rec.clone(), id.clone());
            async move { create_namespace(&client, &rec, &name, &id).await }
        })
        .buffer_unordered(config.create_concurrency.max(1))
        .collect()
        .await;
    created.into_iter().collect::<Result<Vec<()>, _>>()?;

    let keys: Vec<(String, String)> = (0..config.deployments)
        .map(|i| {
            let ns = if config.namespace_per_deployment {
                namespaces[i].clone()
            } else {
                namespaces[0].clone()
            };
            (ns, format!("bench-{i}"))
        })
        .collect();
    let deployment_keys: Vec<String> = keys.iter().map(|(ns, n)| format!("{ns}/{n}")).collect();
    let counts = counts.get_or_init(|| observer.counts()).clone();
    *stage.lock() = Stage::Load;

    rec.record(Record::Mark {
        mark: Mark::CreatesStarted,
    });
    // With a rate, create i is due i/rate after the first; without, as soon as a slot frees.
    let first = tokio::time::Instant::now();
    let rec2 = rec.clone();
    futures::stream::iter(keys.into_iter().enumerate())
        .for_each_concurrent(config.create_concurrency.max(1), |(i, (ns, name))| {
            let (client, rec, id, image, placement) = (
                client.clone(),
                rec2.clone(),
                id.clone(),
                config.image.clone(),
                placement.clone(),
            );
            async move {
                if let Some(rate) = config.create_rate {
                    tokio::time::sleep_until(first + Duration::from_secs_f64(i as f64 / rate))
                        .await;
                }
                let object = workload(config.kind, &name, &id, config.replicas, &image, &placement);
                create_workload(client, &rec, &ns, object, config.kind).await;
            }
        })
        .await;
    rec.record(Record::Mark {
        mark: Mark::CreatesDone,
    });

    let ready = wait_until(config.timeout, Duration::from_millis(20), || {
        let (_, _, r, a) = counts.get();
        async move { Ok(r >= pods && a >= d) }
    })
    .await?;
    if ready {
        rec.record(Record::Mark {
            mark: Mark::AllReady,
        });
    } else {
        rec.record(Record::Mark {
            mark: Mark::TimedOut,
        });
        let awaited: &[String] = if d > 0 { &deployment_keys } else { &[] };
        for what in observer.missing(pods, awaited) {
            rec.record(Record::Missing { what });
        }
    }

    if !config.keep {
        let of = namespaces.len() as u64;
        *stage.lock() = Stage::Deleting { left: of, of };
        rec.record(Record::Mark {
            mark: Mark::DeleteStarted,
        });
        futures::stream::iter(namespaces.clone())
            .for_each_concurrent(config.create_concurrency.max(1), |name| {
                let (api, rec) = (ns_api.clone(), rec.clone());
                async move {
                    let dp = DeleteParams::default();
                    let _ =
                        with_retries(&rec, "delete", "namespaces", || api.delete(&name, &dp)).await;
                }
            })
            .await;
        let ns_selector = ListParams::default().labels(&selector);
        let gone = wait_until(config.timeout, Duration::from_millis(100), || {
            let (api, rec, lp, stage) = (&ns_api, &rec, &ns_selector, &stage);
            async move {
                let (list, _) = with_retries(rec, "list", "namespaces", || api.list(lp)).await;
                let left = list?.items.len() as u64;
                *stage.lock() = Stage::Deleting { left, of };
                Ok(left == 0)
            }
        })
        .await?;
        if gone {
            rec.record(Record::Mark {
                mark: Mark::Deleted,
            });
        } else {
            let left = match *stage.lock() {
                Stage::Deleting { left, .. } => left,
                _ => of,
            };
            rec.record(Record::Missing {
                what: format!("{left} namespaces still there after {:?}", config.timeout),
            });
        }
    }
    if let Some(p) = progress {
        p.stop().await;
    }
    observer.stop().await;
    sampler.stop().await;
    // The measurement is over: a failure cleaning up goes in the report, not over it.
    if let Some(n) = nodes {
        if let Err(e) = n.stop().await {
            rec.record(Record::Missing {
                what: e.to_string(),
            });
        }
        if !config.keep {
            if let Err(e) = delete_nodes(&client, &rec, &selector).await {
                rec.record(Record::Missing {
                    what: format!("deleting the simulated Nodes: {e}"),
                });
            }
        }
    }

    let log = rec.snapshot();
    if let Some(path) = &config.raw_log {
        crate::record::write_log(&log, std::fs::File::create(path)?)?;
    }
    let report = report::density(&log)?;
    Ok(Outcome { report, log })
}

/// Shared by the benchmarks that create their own namespace.
pub(crate) async fn create_namespace(
    client: &Client,
    rec: &Recorder,
    name: &str,
    run: &str,
) -> Result<(), BenchError> {
    let api = Api::<Namespace>::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {RUN_LABEL: run}}}))?;
    let pp = PostParams::default();
    match with_retries(rec, "create", "namespaces", || api.create(&pp, &ns)).await {
        (Ok(_), _) => Ok(()),
        (Err(e), true) if e.is_already_exists() => Ok(()),
        (Err(e), _) => Err(e.into()),
    }
}

/// Deletes a namespace and waits (up to `timeout`) until it is gone; whether it went.
pub(crate) async fn delete_namespace(
    client: &Client,
    rec: &Recorder,
    name: &str,
    timeout: Duration,
) -> Result<bool, BenchError> {
    let api = Api::<Namespace>::all(client.clone());
    let dp = DeleteParams::default();
    let _ = with_retries(rec, "delete", "namespaces", || api.delete(name, &dp)).await;
    let api = Arc::new(api);
    wait_until(timeout, Duration::from_millis(100), || {
        let api = api.clone();
        async move { Ok(api.get_opt(name).await?.is_none()) }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_gets_the_runs_labels_and_its_own_shape() {
        let placement = Placement::RunNodes("r1".into());
        for kind in [
            WorkloadKind::Deployment,
            WorkloadKind::StatefulSet,
            WorkloadKind::DaemonSet,
        ] {
            let w = workload(kind, "bench-0", "r1", 7, "nginx:1.25", &placement);
            assert_eq!(w["kind"], kind.as_str());
            assert_eq!(w["spec"]["selector"]["matchLabels"][RUN_LABEL], "r1");
            assert_eq!(
                w["spec"]["template"]["metadata"]["labels"]["app"],
                "bench-0"
            );
            let replicas = w["spec"].get("replicas").cloned();
            match kind {
                WorkloadKind::DaemonSet => assert_eq!(replicas, None),
                _ => assert_eq!(replicas, Some(json!(7))),
            }
        }
        let sts = workload(WorkloadKind::StatefulSet, "s", "r1", 3, "x", &placement);
        assert_eq!(sts["spec"]["podManagementPolicy"], "Parallel");
        assert_eq!(sts["spec"]["serviceName"], "s");
        // Each kind decodes as its typed object, as the create sends it.
        serde_json::from_value::<StatefulSet>(sts).unwrap();
    }
}
