//! The watch recorder: from watches on pods and Deployments opened before anything is created,
//! records the first time each pod is seen created, scheduled (`spec.nodeName` set) and
//! Running (phase Running with every container ready), and the first time each Deployment is
//! seen with `availableReplicas` equal to its replicas.
//!
//! Times are when this process *saw* the change, which is what a user of the cluster can see;
//! a watch that ends (server timeout, dropped as slow) is reopened from the last
//! resourceVersion seen, and from scratch on 410 — first sightings are kept only once, so a
//! replayed initial state does not move them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use setpoint_runtime::client::{Api, Client, WatchEvent, WatchParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::record::{Record, Recorder};
use crate::BenchError;

/// Live counts of first sightings, for the progress line.
#[derive(Debug, Default)]
pub struct Counts {
    /// Pods of the run seen at all.
    pub created: AtomicU64,
    /// Pods seen bound to a node.
    pub scheduled: AtomicU64,
    /// Pods seen Running with every container ready.
    pub running: AtomicU64,
    /// Deployments seen with every replica available.
    pub available: AtomicU64,
}

impl Counts {
    /// `(created, scheduled, running, available)` now.
    pub fn get(&self) -> (u64, u64, u64, u64) {
        (
            self.created.load(Ordering::Relaxed),
            self.scheduled.load(Ordering::Relaxed),
            self.running.load(Ordering::Relaxed),
            self.available.load(Ordering::Relaxed),
        )
    }
}

#[derive(Default)]
struct State {
    created: HashSet<String>,
    scheduled: HashSet<String>,
    running: HashSet<String>,
    available: HashSet<String>,
    /// Every Deployment seen, for "what is missing".
    deployments: HashSet<String>,
    /// The last status seen of every pod not yet Running, for "what is missing".
    last: HashMap<String, String>,
}

/// Whether a pod counts as Running: phase Running and every container ready.
pub fn pod_running(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
        && status
            .container_statuses
            .as_ref()
            .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c.ready))
}

/// Whether a Deployment has all its replicas available.
pub fn deployment_available(d: &Deployment) -> bool {
    let want = setpoint_api::replicas::or_default(d.spec.as_ref().and_then(|s| s.replicas));
    d.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
        >= want
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// Records first sightings until stopped.
pub struct Observer {
    counts: Arc<Counts>,
    state: Arc<Mutex<State>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Observer {
    /// Opens the watches on pods and Deployments matching `selector` in every namespace; when
    /// this returns, the server has accepted both, so anything created afterwards is seen.
    pub async fn start(
        client: &Client,
        rec: &Recorder,
        selector: &str,
    ) -> Result<Self, BenchError> {
        let counts = Arc::new(Counts::default());
        let state = Arc::new(Mutex::new(State::default()));
        let (stop, stopped) = watch::channel(false);
        let params = WatchParams {
            label_selector: Some(selector.into()),
            ..Default::default()
        };
        // Field ownership is never read here, and skipping it halves the cost of decoding.
        let pods = Api::<Pod>::all(client.clone()).skipping_managed_fields();
        let first = pods.watch(&params, "").await?;
        let (c, s, r) = (counts.clone(), state.clone(), rec.clone());
        let pod_task = tokio::spawn(follow(
            pods,
            params.clone(),
            first,
            stopped.clone(),
            move |p: Pod| see_pod(&r, &c, &s, &p),
        ));
        let deployments = Api::<Deployment>::all(client.clone()).skipping_managed_fields();
        let first = deployments.watch(&params, "").await?;
        let (c, s, r) = (counts.clone(), state.clone(), rec.clone());
        let dep_task = tokio::spawn(follow(
            deployments,
            params,
            first,
            stopped,
            move |d: Deployment| see_deployment(&r, &c, &s, &d),
        ));
        Ok(Observer {
            counts,
            state,
            stop,
            tasks: vec![pod_task, dep_task],
        })
    }

    /// The live counts.
    pub fn counts(&self) -> Arc<Counts> {
        self.counts.clone()
    }

    /// What is not there yet, given `pods` expected and the Deployments `deployments` (keys
    /// `namespace/name`): counts, then up to 10 examples with their last seen status.
    pub fn missing(&self, pods: u64, deployments: &[String]) -> Vec<String> {
        let s = self.state.lock();
        let mut out = vec![format!(
            "pods seen created {}/{pods}, scheduled {}/{pods}, Running {}/{pods}; Deployments Available {}/{}",
            s.created.len(),
            s.scheduled.len(),
            s.running.len(),
            s.available.len(),
            deployments.len()
        )];
        let not_seen: Vec<&String> = deployments
            .iter()
            .filter(|d| !s.deployments.contains(*d))
            .collect();
        if !not_seen.is_empty() {
            out.push(format!("Deployments never seen: {}", not_seen.len()));
        }
        let examples: BTreeMap<&String, &String> = s
            .last
            .iter()
            .filter(|(k, _)| !s.running.contains(*k))
            .collect();
        for (pod, status) in examples.into_iter().take(10) {
            out.push(format!("pod {pod}: {status}"));
        }
        for d in deployments
            .iter()
            .filter(|d| s.deployments.contains(*d) && !s.available.contains(*d))
            .take(10)
        {
            out.push(format!("Deployment {d}: not Available"));
        }
        out
    }

    /// Closes the watches.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

fn see_pod(rec: &Recorder, counts: &Counts, state: &Mutex<State>, pod: &Pod) {
    let k = key(&pod.metadata);
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let running = pod_running(pod);
    let mut s = state.lock();
    if s.created.insert(k.clone()) {
        counts.created.fetch_add(1, Ordering::Relaxed);
        rec.record(Record::PodCreated { pod: k.clone() });
    }
    if let Some(node) = &node {
        if s.scheduled.insert(k.clone()) {
            counts.scheduled.fetch_add(1, Ordering::Relaxed);
            rec.record(Record::PodScheduled {
                pod: k.clone(),
                node: node.clone(),
            });
        }
    }
    if running {
        if s.running.insert(k.clone()) {
            counts.running.fetch_add(1, Ordering::Relaxed);
            rec.record(Record::PodRunning { pod: k.clone() });
        }
        s.last.remove(&k);
    } else {
        let phase = pod
            .status
            .as_ref()
            .and_then(|st| st.phase.clone())
            .unwrap_or_else(|| "no status".into());
        let status = format!("{phase}, node {}", node.as_deref().unwrap_or("(none)"));
        s.last.insert(k, status);
    }
}

fn see_deployment(rec: &Recorder, counts: &Counts, state: &Mutex<State>, d: &Deployment) {
    let k = key(&d.metadata);
    let mut s = state.lock();
    s.deployments.insert(k.clone());
    if deployment_available(d) && s.available.insert(k.clone()) {
        counts.available.fetch_add(1, Ordering::Relaxed);
        rec.record(Record::DeploymentAvailable { deployment: k });
    }
}

/// Feeds every object of a watch to `see`, reopening the watch when it ends, until `stopped`.
async fn follow<K, S>(
    api: Api<K>,
    params: WatchParams,
    first: S,
    stopped: watch::Receiver<bool>,
    see: impl Fn(K) + Send + 'static,
) where
    K: DeserializeOwned
        + Serialize
        + Send
        + 'static
        + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
    S: futures::Stream<Item = Result<WatchEvent<K>, setpoint_runtime::ClientError>>
        + Send
        + 'static,
{
    follow_events(api, params, first, stopped, move |o, deleted| {
        if !deleted {
            see(o)
        }
    })
    .await
}

/// Follows a watch from `first` on, opening it again from the last resourceVersion when it
/// ends, until `stopped`; `see` gets every object added or changed (`false`) or deleted
/// (`true`).
pub(crate) async fn follow_events<K, S>(
    api: Api<K>,
    params: WatchParams,
    first: S,
    mut stopped: watch::Receiver<bool>,
    see: impl Fn(K, bool) + Send + 'static,
) where
    K: DeserializeOwned
        + Serialize
        + Send
        + 'static
        + k8s_openapi::Metadata<Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
    S: futures::Stream<Item = Result<WatchEvent<K>, setpoint_runtime::ClientError>>
        + Send
        + 'static,
{
    let mut stream = Some(first.boxed());
    let mut rv = String::new();
    loop {
        let s = match stream.take() {
            Some(s) => s,
            None => {
                let opened = tokio::select! {
                    r = api.watch(&params, &rv) => r,
                    _ = stopped.wait_for(|s| *s) => return,
                };
                match opened {
                    Ok(s) => s.boxed(),
                    Err(e) => {
                        if e.is_gone() {
                            rv.clear();
                        }
                        // A loaded server may refuse for a moment; ask again shortly.
                        tokio::select! {
                            _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
                            _ = stopped.wait_for(|s| *s) => return,
                        }
                        continue;
                    }
                }
            }
        };
        let mut s = s;
        loop {
            let ev = tokio::select! {
                ev = s.next() => ev,
                _ = stopped.wait_for(|s| *s) => return,
            };
            match ev {
                Some(Ok(WatchEvent::Added(o))) | Some(Ok(WatchEvent::Modified(o))) => {
                    if let Some(v) = o.metadata().resource_version.clone() {
                        rv = v;
                    }
                    see(o, false);
                }
                Some(Ok(WatchEvent::Deleted(o))) => {
                    if let Some(v) = o.metadata().resource_version.clone() {
                        rv = v;
                    }
                    see(o, true);
                }
                Some(Ok(WatchEvent::Bookmark {
                    resource_version, ..
                })) => rv = resource_version,
                Some(Ok(WatchEvent::Error(e))) => {
                    if e.code == 410 {
                        rv.clear();
                    }
                    break;
                }
                Some(Err(_)) | None => break,
            }
        }
    }
}
