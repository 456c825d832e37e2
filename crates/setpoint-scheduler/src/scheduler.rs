//! The scheduler's I/O: informers feed the [`Cache`] and the [`SchedulingQueue`]; one loop
//! takes pending pods, decides in memory, assumes the pod on its node and hands the bind to
//! a bounded pool of concurrent requests; pods that fit nowhere get a `PodScheduled=False`
//! condition and a `FailedScheduling` event and wait for a cluster event.
//!
//! Decisions are made one at a time on purpose: each sees every earlier decision in the
//! cache, so no two pods are given the same free space. Only binds (and status writes) go
//! to the API, concurrently, so the loop never waits for the server unless
//! [`SchedulerConfig::parallelism`] requests are already in flight.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use parking_lot::Mutex;
use serde_json::json;
use setpoint_runtime::client::{Api, Client, ClientError, Patch, PatchParams};
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{
    Event, InformerError, InformerOptions, Scope, SharedInformers, StartPolicy, Store,
};
use setpoint_runtime::ObjectKey;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tracing::Instrument;

use crate::cache::Cache;
use crate::decision::{PodFacts, Rng};
use crate::queue::{QueueTiming, SchedulingQueue};
use crate::resources::PodRequests;
use crate::volumes::{claim_bound, volume_needs};

/// The scheduler name pods get when they name none.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";
/// The controller name the scheduler's decision records and writes carry.
pub const DECISIONS: &str = "scheduler";

/// How the scheduler runs.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Pods whose `spec.schedulerName` is this (or unset, for `default-scheduler`) are ours.
    pub scheduler_name: String,
    /// Most API requests (binds, status updates) in flight at once.
    pub parallelism: usize,
    /// Share of nodes to find feasible before choosing, in percent (Kubernetes'
    /// `percentageOfNodesToScore`); 0 adapts to the cluster size as Kubernetes does.
    pub percentage_of_nodes_to_score: u32,
    /// Backoff after the first failed attempt of a pod; doubles per attempt.
    pub initial_backoff: Duration,
    /// The longest backoff.
    pub max_backoff: Duration,
    /// An unschedulable pod is retried after this long even if no cluster event suggested it.
    pub max_unschedulable: Duration,
    /// Pods taken from the queue per turn of the loop.
    pub batch_size: usize,
    /// Publish a Normal `Scheduled` event per bound pod, as kube-scheduler does. Each one is
    /// an extra write, so very large bursts may want it off.
    pub scheduled_events: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            scheduler_name: DEFAULT_SCHEDULER_NAME.into(),
            parallelism: 256,
            percentage_of_nodes_to_score: 0,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(10),
            max_unschedulable: Duration::from_secs(60),
            batch_size: 64,
            scheduled_events: true,
        }
    }
}

/// What can go wrong around one pod or at start; logged, never fatal.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// The informers stopped before their caches filled.
    #[error("informers did not sync: {0}")]
    Sync(#[from] InformerError),
    /// The API refused or failed a bind.
    #[error("binding pod {pod} to node {node}: {source}")]
    Bind {
        /// The pod being bound.
        pod: ObjectKey,
        /// The node it was to be bound to.
        node: String,
        /// The API's answer.
        source: ClientError,
    },
    /// Writing the pod's PodScheduled condition failed.
    #[error("updating the status of pod {pod}: {source}")]
    Status {
        /// The pod whose status was being written.
        pod: ObjectKey,
        /// The API's answer.
        source: ClientError,
    },
}

fn bound_node(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn terminated(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether this scheduler should place the pod now.
fn wants_scheduling(pod: &Pod, scheduler_name: &str) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let name = spec
        .scheduler_name
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_SCHEDULER_NAME);
    bound_node(pod).is_none()
        && name == scheduler_name
        && pod.metadata.deletion_timestamp.is_none()
        && !terminated(pod)
        // Gated pods wait until their gates are removed (an update brings them back).
        && spec.scheduling_gates.as_ref().is_none_or(|g| g.is_empty())
}

/// State shared by the loop, the handlers and the bind tasks.
struct Shared {
    client: Client,
    config: SchedulerConfig,
    cache: Mutex<Cache>,
    queue: SchedulingQueue,
    recorder: EventRecorder,
    pods: Store<Pod>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    /// Woken on every claim event, for binds waiting for their claims to be bound.
    claims_changed: tokio::sync::Notify,
}

/// How long a pod whose claims wait for their first consumer waits for them to be bound
/// before its attempt fails (upstream's `bindTimeoutSeconds`, 600).
const VOLUME_BIND_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs the scheduler until `shutdown` completes, placing pods only while `leader` is true
/// (when given; caches stay warm meanwhile). In-flight binds finish before it returns.
///
/// Every bind is one request through `client`, so the client's rate limit caps binds per
/// second: a client from a kubeconfig is limited to 50 requests/s by default, which a busy
/// scheduler wants lifted (`Client::without_rate_limit` or a high `with_rate_limit`).
pub async fn run(
    client: Client,
    config: SchedulerConfig,
    leader: Option<watch::Receiver<bool>>,
    shutdown: impl Future<Output = ()> + Send,
) {
    // One LIST page: the scheduler needs every pod before it decides anyway, and paging a
    // large cluster costs the server more than it saves.
    let options = InformerOptions {
        page_size: None,
        ..InformerOptions::lean()
    };
    let informers = SharedInformers::with_options(client.clone(), options, StartPolicy::OnRequest);
    run_shared(client, config, &informers, leader, shutdown).await;
    informers.shutdown().await;
}

/// [`run`] on informers the caller owns (and shuts down): inside one process the scheduler
/// and the controllers can share one pod cache instead of each holding every pod.
pub async fn run_shared(
    client: Client,
    config: SchedulerConfig,
    informers: &SharedInformers,
    leader: Option<watch::Receiver<bool>>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let work = run_on(client, config, informers, leader, stop_rx);
    tokio::pin!(work);
    tokio::select! {
        _ = &mut work => {}
        _ = shutdown => {
            let _ = stop_tx.send(true);
            work.await;
        }
    }
}

async fn wait_stop(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn run_on(
    client: Client,
    config: SchedulerConfig,
    informers: &SharedInformers,
    mut leader: Option<watch::Receiver<bool>>,
    mut stop: watch::Receiver<bool>,
) {
    let pods = informers.typed::<Pod>(Scope::all());
    let nodes = informers.typed::<Node>(Scope::all());
    let claims = informers.typed::<PersistentVolumeClaim>(Scope::all());
    let volumes = informers.typed::<PersistentVolume>(Scope::all());
    let classes = informers.typed::<StorageClass>(Scope::all());
    // The decision records of binds reach the API server the scheduler talks to.
    setpoint_runtime::decision::publish(&client);
    let shared = Arc::new(Shared {
        recorder: EventRecorder::new(client.clone(), Reporter::new(DEFAULT_SCHEDULER_NAME)),
        client,
        queue: SchedulingQueue::new(QueueTiming {
            initial_backoff: config.initial_backoff,
            max_backoff: config.max_backoff,
            max_unschedulable: config.max_unschedulable,
        }),
        config,
        cache: Mutex::new(Cache::new()),
        pods: pods.store(),
        claims: claims.store(),
        volumes: volumes.store(),
        classes: classes.store(),
        claims_changed: tokio::sync::Notify::new(),
    });
    // A claim, volume or class appearing or changing can make a pod schedulable.
    let claim_handler = claims.subscribe(Arc::new({
        let shared = shared.clone();
        move |_e: &Event<PersistentVolumeClaim>| {
            shared.claims_changed.notify_waiters();
            shared.queue.move_all_unschedulable()
        }
    }));
    let volume_handler = volumes.subscribe(Arc::new({
        let shared = shared.clone();
        move |_e: &Event<PersistentVolume>| shared.queue.move_all_unschedulable()
    }));
    let class_handler = classes.subscribe(Arc::new({
        let shared = shared.clone();
        move |_e: &Event<StorageClass>| shared.queue.move_all_unschedulable()
    }));
    let node_handler = nodes.subscribe(Arc::new({
        let shared = shared.clone();
        move |e: &Event<Node>| shared.on_node(e)
    }));
    let pod_handler = pods.subscribe(Arc::new({
        let shared = shared.clone();
        move |e: &Event<Pod>| shared.on_pod(e)
    }));
    // Deciding on a partial view would overcommit nodes or call pods unschedulable.
    let synced = async {
        pods.wait_synced().await?;
        nodes.wait_synced().await?;
        claims.wait_synced().await?;
        volumes.wait_synced().await?;
        classes.wait_synced().await?;
        Ok::<(), SchedulerError>(())
    };
    tokio::select! {
        r = synced => if let Err(e) = r {
            tracing::error!(error = %e, "scheduler not started");
            return;
        },
        _ = wait_stop(&mut stop) => return,
    }
    tracing::info!(
        nodes = shared.cache.lock().nodes().len(),
        pending = shared.queue.len(),
        "scheduler running"
    );
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let mut rng = Rng::new(seed);
    let permits = Arc::new(Semaphore::new(shared.config.parallelism.max(1)));
    'outer: loop {
        if let Some(l) = &mut leader {
            tokio::select! {
                r = l.wait_for(|lead| *lead) => if r.is_err() { break },
                _ = wait_stop(&mut stop) => break,
            }
        }
        let batch = tokio::select! {
            b = shared.queue.pop(shared.config.batch_size.max(1)) => match b {
                Some(b) => b,
                None => break,
            },
            _ = wait_stop(&mut stop) => break,
        };
        let mut keys = batch.into_iter();
        while let Some(key) = keys.next() {
            let leading = leader.as_ref().is_none_or(|l| *l.borrow());
            if !leading || *stop.borrow() {
                // Not ours to act on any more: leave the rest for the next leader turn.
                shared.queue.requeue(key);
                keys.for_each(|k| shared.queue.requeue(k));
                continue 'outer;
            }
            let permit = tokio::select! {
                p = permits.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break 'outer,
                },
                _ = wait_stop(&mut stop) => {
                    shared.queue.requeue(key);
                    break 'outer;
                }
            };
            shared.schedule_one(key, &mut rng, permit);
        }
    }
    shared.queue.close();
    // Let binds under way finish, so their outcome is not lost.
    let _ = permits
        .acquire_many(shared.config.parallelism.max(1) as u32)
        .await;
    nodes.unsubscribe(node_handler);
    pods.unsubscribe(pod_handler);
    claims.unsubscribe(claim_handler);
    volumes.unsubscribe(volume_handler);
    classes.unsubscribe(class_handler);
    shared.recorder.flush().await;
}

/// The scheduler's decision about one pod, woken by the pod's version waiting in the queue.
fn decision_for(pod: &Pod, key: &ObjectKey) -> setpoint_runtime::decision::Scope {
    use setpoint_runtime::decision::{ObjectRef, Scope, Trigger};
    if !setpoint_runtime::decision::enabled() {
        return Scope::begin(DECISIONS, ObjectRef::default(), Vec::new());
    }
    let object = ObjectRef::new(
        "Pod",
        key.namespace.as_deref().unwrap_or_default(),
        &key.name,
    );
    let pending = Trigger::event(
        "unscheduled",
        object.clone(),
        pod.metadata.resource_version.clone(),
    );
    Scope::begin(DECISIONS, object, vec![pending])
}

impl Shared {
    fn on_node(&self, e: &Event<Node>) {
        match e {
            Event::Added(n) | Event::Updated { new: n, .. } => {
                if self.cache.lock().set_node(n) {
                    self.queue.move_all_unschedulable();
                }
            }
            Event::Deleted(n) => {
                let name = n.metadata.name.as_deref().unwrap_or_default();
                self.cache.lock().remove_node(name);
            }
        }
    }

    fn on_pod(&self, e: &Event<Pod>) {
        let key = e.key();
        match e {
            Event::Deleted(_) => {
                self.queue.remove(&key);
                if self.cache.lock().remove_pod(&key) {
                    self.queue.move_all_unschedulable();
                }
            }
            Event::Added(p) | Event::Updated { new: p, .. } => {
                if let Some(node) = bound_node(p) {
                    self.queue.remove(&key);
                    if terminated(p) {
                        if self.cache.lock().remove_pod(&key) {
                            self.queue.move_all_unschedulable();
                        }
                    } else {
                        let requests = PodRequests::of(p);
                        self.cache.lock().set_pod(&key, node, requests);
                    }
                } else if wants_scheduling(p, &self.config.scheduler_name) {
                    match e {
                        Event::Updated { old, new }
                            if old.spec != new.spec
                                || old.metadata.labels != new.metadata.labels =>
                        {
                            self.queue.update(key)
                        }
                        _ => self.queue.add(key),
                    }
                } else {
                    self.queue.remove(&key);
                }
            }
        }
    }

    /// One attempt for one pod: decide in memory, then start the bind or the report.
    fn schedule_one(self: &Arc<Self>, key: ObjectKey, rng: &mut Rng, permit: OwnedSemaphorePermit) {
        let Some(pod) = self.pods.get(&key) else {
            self.queue.remove(&key);
            return;
        };
        if !wants_scheduling(&pod, &self.config.scheduler_name) {
            self.queue.remove(&key);
            return;
        }
        let span = tracing::debug_span!("schedule", pod = %key, node = tracing::field::Empty);
        let _entered = span.enter();
        let mut facts = PodFacts::of(&pod);
        let ns = key.namespace.clone().unwrap_or_default();
        let needs = volume_needs(
            &pod,
            |c| {
                self.claims
                    .get(&ObjectKey::new(Some(&ns), c))
                    .map(|c| (*c).clone())
            },
            |v| {
                self.volumes
                    .get(&ObjectKey::new(None, v))
                    .map(|v| (*v).clone())
            },
            |c| {
                self.classes
                    .get(&ObjectKey::new(None, c))
                    .map(|c| (*c).clone())
            },
        );
        let needs = match needs {
            Ok(needs) => needs,
            Err(reason) => {
                // Upstream's PreFilter rejection reads as every node's.
                let nodes = self.cache.lock().nodes().len();
                let message = format!("0/{nodes} nodes are available: {reason}.");
                tracing::debug!(%message, "unschedulable");
                self.queue.unschedulable(key.clone());
                let me = self.clone();
                tokio::spawn(
                    async move { me.report_unschedulable(pod, key, message, permit).await }
                        .instrument(span.clone()),
                );
                return;
            }
        };
        facts.volume_affinity = &needs.affinity;
        facts.missing_volume = needs.missing_volume;
        let outcome = {
            let mut cache = self.cache.lock();
            if cache.node_of(&key).is_some() {
                // Already assumed (its bind is under way) or seen bound.
                None
            } else {
                Some(cache.schedule_explained(
                    &key,
                    &facts,
                    self.config.percentage_of_nodes_to_score,
                    rng,
                ))
            }
        };
        match outcome {
            None => self.queue.done(&key),
            Some(Ok((node, summary))) => {
                span.record("node", node.as_str());
                tracing::debug!("assumed");
                self.queue.done(&key);
                let me = self.clone();
                let delayed = needs.delayed;
                let decision = decision_for(&pod, &key);
                decision.observe(summary);
                decision.action(
                    format!("bind to node {node}"),
                    "the highest score among the feasible nodes; ties broken at random",
                );
                tokio::spawn(
                    async move {
                        let bound = decision
                            .enter(async {
                                me.bind_volumes(&pod, &key, &node, &delayed).await
                                    && me.bind(pod, key, node, permit).await
                            })
                            .await;
                        decision.finish(if bound { "success" } else { "bind failed" });
                    }
                    .instrument(span.clone()),
                );
            }
            Some(Err(diagnosis)) => {
                let message = diagnosis.message();
                tracing::debug!(%message, "unschedulable");
                self.queue.unschedulable(key.clone());
                let me = self.clone();
                let decision = decision_for(&pod, &key);
                decision.observe(message.clone());
                decision.action("mark the pod unschedulable", "no node passed the filters");
                tokio::spawn(
                    async move {
                        decision
                            .enter(me.report_unschedulable(pod, key, message, permit))
                            .await;
                        decision.finish("unschedulable");
                    }
                    .instrument(span.clone()),
                );
            }
        }
    }

    /// Binds the pod; whether it is bound.
    async fn bind(
        &self,
        pod: Arc<Pod>,
        key: ObjectKey,
        node: String,
        _permit: OwnedSemaphorePermit,
    ) -> bool {
        let ns = key.namespace.as_deref().unwrap_or("default");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let binding = json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": key.name, "namespace": ns, "uid": pod.metadata.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        match api.create_subresource(&key.name, "binding", &binding).await {
            Ok(_) => {
                if self.config.scheduled_events {
                    self.recorder.publish(
                        &pod.object_reference(),
                        EventType::Normal,
                        "Scheduled",
                        &format!("Successfully assigned {ns}/{} to {node}", key.name),
                    );
                }
                true
            }
            Err(source) => {
                // The space it held is free again, for this pod's retry or for others.
                self.cache.lock().forget(&key);
                self.queue.move_all_unschedulable();
                if source.is_not_found() {
                    self.queue.remove(&key);
                    return false;
                }
                let message = format!("Binding rejected: {source}");
                let err = SchedulerError::Bind {
                    pod: key.clone(),
                    node,
                    source,
                };
                tracing::warn!(error = %err, "bind failed; retrying after backoff");
                self.queue.backoff(key);
                self.recorder.publish(
                    &pod.object_reference(),
                    EventType::Warning,
                    "FailedScheduling",
                    &message,
                );
                false
            }
        }
    }

    /// Upstream's PreBind for claims that wait for their first consumer: each is given the
    /// chosen node (`volume.kubernetes.io/selected-node`), then the pod waits until all are
    /// bound. `false` when that failed, with the pod's node given back and the pod retried.
    async fn bind_volumes(
        &self,
        pod: &Arc<Pod>,
        key: &ObjectKey,
        node: &str,
        delayed: &[String],
    ) -> bool {
        if delayed.is_empty() {
            return true;
        }
        let ns = key.namespace.as_deref().unwrap_or("default");
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        let result = async {
            for claim in delayed {
                let cached = self.claims.get(&ObjectKey::new(Some(ns), claim));
                let selected = cached
                    .as_ref()
                    .and_then(|c| c.metadata.annotations.as_ref())
                    .and_then(|a| a.get(setpoint_api::storage::SELECTED_NODE_ANNOTATION))
                    .cloned();
                if selected.as_deref() != Some(node) {
                    let patch = Patch::Merge(json!({"metadata": {"annotations": {
                        setpoint_api::storage::SELECTED_NODE_ANNOTATION: node
                    }}}));
                    api.patch(claim, &PatchParams::default(), &patch)
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            let deadline = tokio::time::Instant::now() + VOLUME_BIND_TIMEOUT;
            loop {
                // Registered before the check, so an event between the check and the wait
                // still wakes it.
                let changed = self.claims_changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let all_bound = delayed.iter().all(|c| {
                    self.claims
                        .get(&ObjectKey::new(Some(ns), c))
                        .is_some_and(|c| claim_bound(&c))
                });
                if all_bound {
                    return Ok(());
                }
                if tokio::time::timeout_at(deadline, changed).await.is_err() {
                    return Err("binding volumes: context deadline exceeded".to_string());
                }
            }
        }
        .await;
        match result {
            Ok(()) => true,
            Err(message) => {
                self.cache.lock().forget(key);
                self.queue.move_all_unschedulable();
                self.queue.backoff(key.clone());
                tracing::warn!(pod = %key, %message, "volume binding failed; retrying after backoff");
                self.recorder.publish(
                    &pod.object_reference(),
                    EventType::Warning,
                    "FailedScheduling",
                    &message,
                );
                false
            }
        }
    }

    async fn report_unschedulable(
        &self,
        pod: Arc<Pod>,
        key: ObjectKey,
        message: String,
        _permit: OwnedSemaphorePermit,
    ) {
        self.recorder.publish(
            &pod.object_reference(),
            EventType::Warning,
            "FailedScheduling",
            &message,
        );
        let current = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"));
        if current.is_some_and(|c| {
            c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
                && c.message.as_deref() == Some(message.as_str())
        }) {
            return;
        }
        let mut condition = json!({
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": null,
        });
        // The transition time moves only when the status does.
        if current.is_none_or(|c| c.status != "False") {
            condition["lastTransitionTime"] = json!(setpoint_api::time::now_rfc3339());
        }
        let ns = key.namespace.as_deref().unwrap_or("default");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        // Conditional on the version decided on: were the pod bound meanwhile (by a later
        // attempt), a late write must not mark it unscheduled. A conflict only skips this
        // report; the next attempt writes a fresh one.
        let patch = Patch::Strategic(json!({
            "metadata": {"resourceVersion": pod.metadata.resource_version},
            "status": {"conditions": [condition]},
        }));
        if let Err(source) = api
            .patch_status(&key.name, &PatchParams::default(), &patch)
            .await
        {
            if source.is_conflict() {
                tracing::debug!("pod changed since the attempt; status not reported");
            } else if !source.is_not_found() {
                let err = SchedulerError::Status { pod: key, source };
                tracing::warn!(error = %err, "could not record that the pod is unschedulable");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn which_pods_are_ours() {
        let base = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}});
        assert!(wants_scheduling(&pod(base.clone()), DEFAULT_SCHEDULER_NAME));
        let mut named = base.clone();
        named["spec"]["schedulerName"] = json!("default-scheduler");
        assert!(wants_scheduling(
            &pod(named.clone()),
            DEFAULT_SCHEDULER_NAME
        ));
        named["spec"]["schedulerName"] = json!("other");
        assert!(!wants_scheduling(
            &pod(named.clone()),
            DEFAULT_SCHEDULER_NAME
        ));
        assert!(wants_scheduling(&pod(named), "other"));
        let mut bound = base.clone();
        bound["spec"]["nodeName"] = json!("n1");
        assert!(!wants_scheduling(&pod(bound), DEFAULT_SCHEDULER_NAME));
        let mut deleting = base.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        assert!(!wants_scheduling(&pod(deleting), DEFAULT_SCHEDULER_NAME));
        let mut failed = base.clone();
        failed["status"] = json!({"phase": "Failed"});
        assert!(!wants_scheduling(&pod(failed), DEFAULT_SCHEDULER_NAME));
        let mut gated = base.clone();
        gated["spec"]["schedulingGates"] = json!([{"name": "wait"}]);
        assert!(!wants_scheduling(&pod(gated), DEFAULT_SCHEDULER_NAME));
        assert!(!wants_scheduling(&Pod::default(), DEFAULT_SCHEDULER_NAME));
    }
}
