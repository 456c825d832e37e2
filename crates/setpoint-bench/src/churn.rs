//! `bench churn`: a steady stream of creates, patches and deletes of pods and Deployments at a
//! fixed rate, to see whether the cluster keeps up and how API latency moves over time.
//!
//! Operations are due on a fixed schedule (rate R ⇒ one every 1/R s, catching up after a
//! stall). At most `max_in_flight` are outstanding; an operation due while every slot is busy
//! is not sent but logged as skipped — that is the backlog a cluster that cannot keep up
//! builds, made visible instead of hidden in an unbounded queue. The operations cycle through
//! create pod, create Deployment, patch pod, patch Deployment (replicas 1 ↔ 2), delete pod and
//! delete Deployment, on the objects this run created.
//!
//! Answering the API at the rate is half of keeping up; the controllers, the scheduler and the
//! nodes must follow. So with nodes to run pods on, the run then waits until what the load
//! left has settled (see [`unsettled`]) and reports how long that took.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use serde_json::{json, Value};
use setpoint_runtime::client::{
    Api, Client, DeleteParams, ListParams, Patch, PatchParams, PostParams,
};
use tokio::sync::Semaphore;

use crate::density::{
    create_namespace, delete_namespace, run_id, wait_until, Nodes, Outcome, RUN_LABEL,
};
use crate::observe::pod_running;
use crate::placement::Placement;
use crate::procstat::Sampler;
use crate::progress::{self, Progress};
use crate::record::{Mark, Record, Recorder};
use crate::report::{self, ChurnReport};
use crate::timed::{once, with_retries};
use crate::BenchError;

/// How a churn run goes.
#[derive(Clone, Debug)]
pub struct ChurnConfig {
    /// Operations per second.
    pub rate: f64,
    /// How long the load lasts.
    pub duration: Duration,
    /// Simulated nodes to host (0: none; pods then stay Pending unless the cluster has nodes).
    pub nodes: usize,
    /// Operations outstanding at most; more due at once are skipped (backlog).
    pub max_in_flight: usize,
    /// The container image of the pods and Deployments it creates.
    pub image: String,
    /// How long to wait for nodes, draining and deletion (each).
    pub timeout: Duration,
    /// Whether to show the progress line on stderr while the run goes.
    pub progress: bool,
    /// Where to also write the raw event log (JSON lines), from which the report can be
    /// recomputed; `None` writes none.
    pub raw_log: Option<PathBuf>,
    /// Which local processes to sample (besides this one).
    pub processes: crate::procstat::Scope,
}

impl Default for ChurnConfig {
    fn default() -> Self {
        ChurnConfig {
            rate: 100.0,
            duration: Duration::from_secs(60),
            nodes: 0,
            max_in_flight: 256,
            image: "nginx:1.25".into(),
            timeout: Duration::from_secs(120),
            progress: true,
            raw_log: None,
            processes: Default::default(),
        }
    }
}

/// The objects a run has created and not yet deleted, oldest first.
#[derive(Default)]
struct Live {
    pods: Mutex<VecDeque<String>>,
    deployments: Mutex<VecDeque<String>>,
}

fn pod(name: &str, run: &str, spec: &Value) -> Result<Pod, serde_json::Error> {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {RUN_LABEL: run}},
        "spec": spec
    }))
}

fn deployment(name: &str, run: &str, spec: &Value) -> Result<Deployment, serde_json::Error> {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {RUN_LABEL: run}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, RUN_LABEL: run}},
                "spec": spec
            }
        }
    }))
}

/// Operation `i` of the cycle.
async fn operate(
    i: u64,
    pods: &Api<Pod>,
    deps: &Api<Deployment>,
    live: &Live,
    rec: &Recorder,
    run: &str,
    spec: &Value,
) {
    let n = i / 6;
    match i % 6 {
        0 => {
            let name = format!("churn-pod-{n}");
            let Ok(p) = pod(&name, run, spec) else {
                return;
            };
            if once(
                rec,
                "create",
                "pods",
                pods.create(&PostParams::default(), &p),
            )
            .await
            .is_ok()
            {
                live.pods.lock().push_back(name);
            }
        }
        1 => {
            let name = format!("churn-deploy-{n}");
            let Ok(d) = deployment(&name, run, spec) else {
                return;
            };
            if once(
                rec,
                "create",
                "deployments",
                deps.create(&PostParams::default(), &d),
            )
            .await
            .is_ok()
            {
                live.deployments.lock().push_back(name);
            }
        }
        2 => {
            let target = live.pods.lock().back().cloned();
            if let Some(name) = target {
                let patch =
                    Patch::Merge(json!({"metadata": {"labels": {"churn-gen": n.to_string()}}}));
                let _ = once(
                    rec,
                    "patch",
                    "pods",
                    pods.patch(&name, &PatchParams::default(), &patch),
                )
                .await;
            }
        }
        3 => {
            let target = live.deployments.lock().back().cloned();
            if let Some(name) = target {
                let patch = Patch::Merge(json!({"spec": {"replicas": 1 + (n % 2) as i32}}));
                let _ = once(
                    rec,
                    "patch",
                    "deployments",
                    deps.patch(&name, &PatchParams::default(), &patch),
                )
                .await;
            }
        }
        4 => {
            let target = live.pods.lock().pop_front();
            if let Some(name) = target {
                let _ = once(
                    rec,
                    "delete",
                    "pods",
                    pods.delete(&name, &DeleteParams::default()),
                )
                .await;
            }
        }
        _ => {
            let target = live.deployments.lock().pop_front();
            if let Some(name) = target {
                let _ = once(
                    rec,
                    "delete",
                    "deployments",
                    deps.delete(&name, &DeleteParams::background()),
                )
                .await;
            }
        }
    }
}

/// What keeps the run's namespace from being settled, or `None` when it is: a Deployment not
/// yet observed at its generation or without all its replicas updated and available, a pod
/// not Running and ready, or a deleted pod not yet gone.
pub fn unsettled(pods: &[Pod], deployments: &[Deployment]) -> Option<String> {
    let mut out = Vec::new();
    for d in deployments {
        let want = setpoint_api::replicas::or_default(d.spec.as_ref().and_then(|s| s.replicas));
        let s = d.status.clone().unwrap_or_default();
        let observed = s.observed_generation >= d.metadata.generation;
        let at = |n: Option<i32>| n.unwrap_or(0) == want;
        if !(observed && at(s.replicas) && at(s.updated_replicas) && at(s.available_replicas)) {
            out.push(format!(
                "deployment {} ({}/{want} available)",
                d.metadata.name.as_deref().unwrap_or(""),
                s.available_replicas.unwrap_or(0)
            ));
        }
    }
    for p in pods {
        let name = p.metadata.name.as_deref().unwrap_or("");
        if p.metadata.deletion_timestamp.is_some() {
            out.push(format!("pod {name} (terminating)"));
            continue;
        }
        if !pod_running(p) {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("Pending");
            out.push(format!("pod {name} ({phase})"));
        }
    }
    if out.is_empty() {
        return None;
    }
    let n = out.len();
    out.truncate(5);
    Some(format!("{n} not settled, e.g. {}", out.join(", ")))
}

/// Runs the churn benchmark against the cluster behind `client`.
pub async fn run(client: Client, config: ChurnConfig) -> Result<Outcome<ChurnReport>, BenchError> {
    if config.rate <= 0.0 || config.rate.is_nan() {
        return Err(BenchError::Setup("the rate must be positive".into()));
    }
    let rec = Recorder::new();
    let id = run_id();
    let ns = format!("bench-{id}");
    let nodes = (config.nodes > 0)
        .then(|| Nodes::start(&client, config.nodes, &id, 110, Default::default()));
    rec.record_at(
        0,
        Record::Start {
            benchmark: "churn".into(),
            run_id: id.clone(),
            unix_ms: chrono::Utc::now().timestamp_millis(),
            params: json!({
                "rate": config.rate,
                "duration_seconds": config.duration.as_secs_f64(),
                "simulated_nodes": config.nodes,
                "max_in_flight": config.max_in_flight,
            }),
        },
    );
    create_namespace(&client, &rec, &ns, &id).await?;
    let sampler = Sampler::start(
        rec.clone(),
        config.processes.clone(),
        Duration::from_secs(1),
    );
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let deps = Api::<Deployment>::namespaced(client.clone(), &ns);
    let live = Arc::new(Live::default());
    // With hosted nodes the pods go only to them; without, wherever the cluster puts them.
    let placement = if config.nodes > 0 {
        Placement::RunNodes(id.clone())
    } else {
        Placement::Anywhere
    };
    let spec = Arc::new(placement.pod_spec(&config.image));
    let slots = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
    let (sent, skipped) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let progress = config.progress.then(|| {
        let (sent, skipped, slots, max) = (
            sent.clone(),
            skipped.clone(),
            slots.clone(),
            config.max_in_flight.max(1),
        );
        let (began, duration) = (std::time::Instant::now(), config.duration);
        Progress::start(move || {
            format!(
                "{} operations sent {}  skipped {}  in flight {}",
                progress::time_bar(began, duration),
                sent.load(Ordering::Relaxed),
                skipped.load(Ordering::Relaxed),
                max - slots.available_permits()
            )
        })
    });

    rec.record(Record::Mark {
        mark: Mark::CreatesStarted,
    });
    let period = Duration::from_secs_f64(1.0 / config.rate);
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    // Due times are the ticks from the first one: exactly rate × duration of them.
    let mut at = ticker.tick().await;
    let end = at + config.duration;
    let mut i = 0u64;
    while at < end {
        match slots.clone().try_acquire_owned() {
            Ok(permit) => {
                sent.fetch_add(1, Ordering::Relaxed);
                let (pods, deps, live, rec, id, spec) = (
                    pods.clone(),
                    deps.clone(),
                    live.clone(),
                    rec.clone(),
                    id.clone(),
                    spec.clone(),
                );
                tokio::spawn(async move {
                    operate(i, &pods, &deps, &live, &rec, &id, &spec).await;
                    drop(permit);
                });
            }
            Err(_) => {
                skipped.fetch_add(1, Ordering::Relaxed);
                rec.record(Record::Skipped {
                    op: [
                        "create pod",
                        "create deployment",
                        "patch pod",
                        "patch deployment",
                        "delete pod",
                        "delete deployment",
                    ][(i % 6) as usize]
                        .into(),
                });
            }
        }
        i += 1;
        at = ticker.tick().await;
    }
    rec.record(Record::Mark {
        mark: Mark::LoadDone,
    });
    // Let what was sent finish, so its latency is in the log.
    let all = config.max_in_flight.max(1) as u32;
    let _ = tokio::time::timeout(config.timeout, slots.acquire_many(all)).await;
    if let Some(p) = progress {
        p.stop().await;
    }
    if config.nodes > 0 {
        let lp = ListParams::default();
        let left = Mutex::new(None);
        let settled = wait_until(config.timeout, Duration::from_millis(200), || async {
            let (p, _) = with_retries(&rec, "list", "pods", || pods.list(&lp)).await;
            let (d, _) = with_retries(&rec, "list", "deployments", || deps.list(&lp)).await;
            let what = unsettled(&p?.items, &d?.items);
            let done = what.is_none();
            *left.lock() = what;
            Ok(done)
        })
        .await?;
        if settled {
            rec.record(Record::Mark {
                mark: Mark::Settled,
            });
        } else {
            let what = left.lock().take().unwrap_or_else(|| "the cluster".into());
            rec.record(Record::Missing {
                what: format!("not settled after {:?}: {what}", config.timeout),
            });
        }
    }
    if !delete_namespace(&client, &rec, &ns, config.timeout).await? {
        rec.record(Record::Missing {
            what: format!("namespace {ns} still there after {:?}", config.timeout),
        });
    }
    sampler.stop().await;
    // The measurement is over: a failure cleaning up goes in the report, not over it.
    if let Some(n) = nodes {
        if let Err(e) = n.stop().await {
            rec.record(Record::Missing {
                what: e.to_string(),
            });
        }
        let selector = format!("{RUN_LABEL}={id}");
        if let Err(e) = crate::density::delete_nodes(&client, &rec, &selector).await {
            rec.record(Record::Missing {
                what: format!("deleting the simulated Nodes: {e}"),
            });
        }
    }
    let log = rec.snapshot();
    if let Some(path) = &config.raw_log {
        crate::record::write_log(&log, std::fs::File::create(path)?)?;
    }
    let report = report::churn(&log)?;
    Ok(Outcome { report, log })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment_at(generation: i64, observed: i64, want: i32, available: i32) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "d", "generation": generation},
            "spec": {"replicas": want, "selector": {}, "template": {}},
            "status": {"observedGeneration": observed, "replicas": want,
                       "updatedReplicas": want, "availableReplicas": available}
        }))
        .unwrap()
    }

    fn pod_in(phase: &str, ready: bool, deleting: bool) -> Pod {
        let mut metadata = json!({"name": "p"});
        if deleting {
            metadata["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(json!({
            "metadata": metadata,
            "status": {"phase": phase, "containerStatuses": [{
                "name": "app", "image": "i", "imageID": "", "ready": ready, "restartCount": 0
            }]}
        }))
        .unwrap()
    }

    #[test]
    fn settled_only_when_every_deployment_and_pod_is_done() {
        assert_eq!(unsettled(&[], &[]), None);
        let done = deployment_at(2, 2, 2, 2);
        assert_eq!(
            unsettled(
                &[pod_in("Running", true, false)],
                &[deployment_at(2, 2, 2, 2)]
            ),
            None
        );
        // A new generation not yet observed, or replicas not yet available.
        assert!(unsettled(&[], &[deployment_at(3, 2, 2, 2)]).is_some());
        let short = unsettled(&[], &[deployment_at(2, 2, 2, 1)]).unwrap();
        assert!(short.contains("1/2 available"), "{short}");
        // A pod not ready, Pending, or still terminating.
        assert!(unsettled(&[pod_in("Running", false, false)], &[]).is_some());
        let pending = unsettled(&[pod_in("Pending", false, false)], &[done]).unwrap();
        assert!(pending.starts_with("1 not settled") && pending.contains("Pending"));
        assert!(unsettled(&[pod_in("Running", true, true)], &[])
            .unwrap()
            .contains("terminating"));
    }
}
