//! Pod workers: for one node, bring every pod the API binds to it and every pod its runtime
//! holds to agreement, one pod at a time per pod.
//!
//! Keys are `namespace/name`. A work queue guarantees a pod is never synced by two workers at
//! once and retries failures with backoff. Whatever woke a sync (informer event, runtime
//! notification, periodic resync), [`PodWorkers::sync`] reads the desired pod from the
//! informer cache and the actual pods from the runtime, and closes the whole gap:
//!
//! - runtime pods with that name but another uid (or no API pod at all) are killed;
//! - a pod with a `deletionTimestamp` is killed with its grace period, then deleted for good
//!   (`gracePeriodSeconds=0` with a uid precondition, so a new pod of the same name is safe);
//! - a `Succeeded`/`Failed` pod is left alone: it is never started again;
//! - anything else is synced through the runtime, and its status written (pods/status) only
//!   when it differs from what the API holds.
//!
//! The same workers serve the local agent and every simulated node of a simulation host.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use parking_lot::Mutex;
use setpoint_runtime::client::{Api, Client, ClientError, DeleteParams, PostParams};
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Store, NODE_INDEX};
use setpoint_runtime::workqueue::{WorkQueue, WorkQueueMetrics};
use setpoint_runtime::ObjectKey;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::runtime::{NodeContext, PodRuntime, RuntimeError, RuntimeEvent, RuntimePod};
use crate::status;

/// The field manager of the agent's writes.
pub const FIELD_MANAGER: &str = "setpoint-node";
/// The controller name the node agent's decision records and writes carry.
pub const DECISIONS: &str = "node-agent";

/// What can fail in one pod sync (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The runtime failed.
    #[error("runtime: {0}")]
    Runtime(#[from] RuntimeError),
    /// Writing to the API failed.
    #[error("API: {0}")]
    Api(#[from] ClientError),
}

/// What a sync did, for logs and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncOutcome {
    /// Neither the API nor the runtime knows the pod (any more).
    Absent,
    /// The pod was killed and removed from the API.
    Deleted,
    /// The pod has finished; nothing to do.
    Finished,
    /// The pod was synced; `true` if its status was written.
    Synced(bool),
}

/// The workers of one node.
#[derive(Clone)]
pub struct PodWorkers {
    inner: Arc<Inner>,
}

struct Inner {
    node: NodeContext,
    runtime: Arc<dyn PodRuntime>,
    /// The informer cache; may hold other nodes' pods (a simulation host shares one).
    pods: Store<Pod>,
    client: Client,
    queue: WorkQueue<ObjectKey>,
    /// Events about the node's pods, reported as `kubelet` from this node.
    recorder: EventRecorder,
    /// Last seen grace period per pod uid, for pods that vanish from the API while held.
    grace: Mutex<HashMap<String, Duration>>,
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn runtime_pod(pod: &Pod) -> RuntimePod {
    RuntimePod {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
    }
}

fn key_of(p: &RuntimePod) -> ObjectKey {
    ObjectKey::new(Some(&p.namespace), &p.name)
}

impl PodWorkers {
    /// Workers for `node`, reading desired pods from `pods` and running them on `runtime`.
    pub fn new(
        client: Client,
        node: NodeContext,
        runtime: Arc<dyn PodRuntime>,
        pods: Store<Pod>,
    ) -> Self {
        let queue = WorkQueue::builder(format!("pods-{}", node.node_name))
            .backoff(Duration::from_millis(50), Duration::from_secs(30))
            .no_rate_limit()
            .build();
        let reporter = Reporter {
            component: "kubelet".into(),
            instance: node.node_name.clone(),
        };
        let recorder = EventRecorder::new(client.clone(), reporter);
        PodWorkers {
            inner: Arc::new(Inner {
                recorder,
                node,
                runtime,
                pods,
                client,
                queue,
                grace: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The node these workers serve.
    pub fn node(&self) -> &NodeContext {
        &self.inner.node
    }

    /// Records the workers' queue (`pods-<node>`) in `metrics` from now on.
    pub fn record_metrics(&self, metrics: &WorkQueueMetrics) {
        self.inner.queue.record_metrics(metrics);
    }

    /// Asks for a sync of one pod.
    pub fn enqueue(&self, key: ObjectKey) {
        self.inner.queue.add(key);
    }

    /// Asks for a sync of every pod the API binds to the node and every pod the runtime holds
    /// (at start, that is how pods found again after a restart are reconciled).
    pub async fn enqueue_all(&self) {
        // Keys only: a cache that packs idle pods would decode each one to hand it out.
        for key in self
            .inner
            .pods
            .index_keys(NODE_INDEX, &self.inner.node.node_name)
        {
            self.enqueue(key);
        }
        for p in self.inner.runtime.pods().await {
            self.enqueue(key_of(&p));
        }
    }

    /// Runs `workers` workers, the runtime's notifications and a resync every `resync` until
    /// [`PodWorkers::shutdown`]. Tasks are added to `tasks`.
    pub fn spawn(&self, workers: usize, resync: Duration, tasks: &mut JoinSet<()>) {
        // The decision records of pod syncs reach the API server the agent talks to.
        setpoint_runtime::decision::publish(&self.inner.client);
        for _ in 0..workers.max(1) {
            let this = self.clone();
            tasks.spawn(async move {
                while let Some(item) = this.inner.queue.get().await {
                    let key = item.key().clone();
                    match this.sync(&key).await {
                        Ok(_) => item.forget(),
                        Err(e) => {
                            tracing::warn!(node = %this.inner.node.node_name, pod = %key, error = %e, "pod sync failed; retrying");
                            item.retry();
                        }
                    }
                }
            });
        }
        let mut notes = self.inner.runtime.subscribe();
        let this = self.clone();
        tasks.spawn(async move {
            while let Some(uid) = notes.recv().await {
                if this.inner.queue.is_shutting_down() {
                    break;
                }
                if let Some(key) = this.key_of_uid(&uid).await {
                    this.enqueue(key);
                }
            }
        });
        if let Some(mut events) = self.inner.runtime.events() {
            let this = self.clone();
            tasks.spawn(async move {
                while let Some(event) = events.recv().await {
                    if this.inner.queue.is_shutting_down() {
                        break;
                    }
                    this.publish(&event);
                }
            });
        }
        let this = self.clone();
        tasks.spawn(async move {
            // A zero period would spin (and `interval` rejects it).
            let mut tick = tokio::time::interval(resync.max(Duration::from_millis(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            while !this.inner.queue.is_shutting_down() {
                tick.tick().await;
                this.enqueue_all().await;
            }
        });
    }

    /// Stops the workers once the syncs in progress finish. Pods keep running: an agent that
    /// stops does not stop its pods.
    pub async fn shutdown(&self) {
        self.inner.queue.shutdown_with_drain().await;
    }

    /// Publishes what the runtime reported. The pod may be gone from the API by now (a
    /// preStop hook runs while it is deleted): the reference is built from what the runtime
    /// holds, not read from the cache.
    fn publish(&self, event: &RuntimeEvent) {
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(event.pod.namespace.clone()),
            name: Some(event.pod.name.clone()),
            uid: Some(event.pod.uid.clone()),
            field_path: event.field_path.clone(),
            ..Default::default()
        };
        let type_ = if event.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        self.inner
            .recorder
            .publish(&regarding, type_, &event.reason, &event.message);
    }

    async fn key_of_uid(&self, uid: &str) -> Option<ObjectKey> {
        // The runtime names the pods it holds; a notification is almost always about one of
        // them, and asking it is cheaper than reading every cached pod of the node.
        let held = self.inner.runtime.pods().await;
        if let Some(p) = held.iter().find(|p| p.uid == uid) {
            return Some(key_of(p));
        }
        let cached = self
            .inner
            .pods
            .by_node(&self.inner.node.node_name)
            .into_iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid));
        cached.map(|p| ObjectKey::of(p.as_ref()))
    }

    /// One level-triggered pass over one pod (see the module doc).
    pub async fn sync(&self, key: &ObjectKey) -> Result<SyncOutcome, SyncError> {
        let span = tracing::debug_span!("sync_pod", node = %self.inner.node.node_name, pod = %key);
        if !setpoint_runtime::decision::enabled() {
            return self.sync_inner(key).instrument(span).await;
        }
        // A decision record for the syncs that act (start, status, stop), woken by the pod's
        // version in the cache.
        use setpoint_runtime::decision::{ObjectRef, Scope, Trigger};
        let object = ObjectRef::new(
            "Pod",
            key.namespace.as_deref().unwrap_or_default(),
            &key.name,
        );
        let rv = self
            .inner
            .pods
            .get(key)
            .and_then(|p| p.metadata.resource_version.clone());
        let trigger = Trigger::event("sync", object.clone(), rv);
        let decision = Scope::begin(DECISIONS, object, vec![trigger]);
        let out = decision.enter(self.sync_inner(key)).instrument(span).await;
        if decision.acted() {
            decision.finish(match &out {
                Ok(_) => "success".to_string(),
                Err(e) => format!("error: {e}"),
            });
        }
        out
    }

    async fn sync_inner(&self, key: &ObjectKey) -> Result<SyncOutcome, SyncError> {
        let inner = &self.inner;
        let desired = inner
            .pods
            .get(key)
            .filter(|p| node_of(p) == Some(inner.node.node_name.as_str()));
        let desired_uid = desired.as_ref().and_then(|p| p.metadata.uid.clone());

        // Whatever the runtime holds under this name that is not the desired pod must go.
        let held = inner
            .runtime
            .pods_named(key.namespace.as_deref().unwrap_or_default(), &key.name)
            .await;
        for stale in held.iter().filter(|p| Some(&p.uid) != desired_uid.as_ref()) {
            let grace = inner
                .grace
                .lock()
                .get(&stale.uid)
                .copied()
                .unwrap_or(status::DEFAULT_GRACE_PERIOD);
            tracing::info!(uid = %stale.uid, ?grace, "killing a pod the API no longer binds here");
            inner.runtime.kill_pod(stale, grace).await?;
            inner.grace.lock().remove(&stale.uid);
        }

        let Some(pod) = desired else {
            return Ok(SyncOutcome::Absent);
        };
        let uid = desired_uid.unwrap_or_default();
        let grace = status::grace_period(&pod);
        inner.grace.lock().insert(uid.clone(), grace);
        let namespace = key.namespace.as_deref().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(inner.client.clone(), namespace);

        if pod.metadata.deletion_timestamp.is_some() {
            tracing::info!(?grace, "stopping a deleted pod");
            setpoint_runtime::decision::action(
                format!(
                    "stop the pod's containers on node {}, then remove the pod",
                    inner.node.node_name
                ),
                format!("deletionTimestamp is set (grace period {grace:?})"),
            );
            for c in pod.spec.iter().flat_map(|s| &s.containers) {
                let msg = format!("Stopping container {}", c.name);
                inner
                    .recorder
                    .publish(&pod.object_reference(), EventType::Normal, "Killing", &msg);
            }
            inner.runtime.kill_pod(&runtime_pod(&pod), grace).await?;
            inner.grace.lock().remove(&uid);
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                precondition_uid: Some(uid),
                ..Default::default()
            };
            match api.delete(&key.name, &params).await {
                // 404: already gone; 409: the name now belongs to a new pod.
                Ok(_) => {}
                Err(e) if e.is_not_found() || e.code() == Some(409) => {}
                Err(e) => return Err(e.into()),
            }
            return Ok(SyncOutcome::Deleted);
        }
        if status::is_terminal(&pod) {
            return Ok(SyncOutcome::Finished);
        }

        let observed = inner.runtime.sync_pod(&pod, &inner.node).await?;
        let composed = status::compose(&pod, &observed, &inner.node.host_ip, status::now());
        if pod.status.as_ref() == Some(&composed) {
            return Ok(SyncOutcome::Synced(false));
        }
        let events = status::container_events(&key.name, pod.status.as_ref(), &composed);
        if setpoint_runtime::decision::recording() {
            let phase = |s: Option<&k8s_openapi::api::core::v1::PodStatus>| {
                s.and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "none".into())
            };
            let containers = composed.container_statuses.as_deref().unwrap_or_default();
            let ready = containers.iter().filter(|c| c.ready).count();
            let running = containers
                .iter()
                .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                .count();
            setpoint_runtime::decision::observe(format!(
                "on node {}: phase {} -> {}; {running} of {} containers running, {ready} ready",
                inner.node.node_name,
                phase(pod.status.as_ref()),
                phase(Some(&composed)),
                containers.len()
            ));
            let started = running > 0
                && pod
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_deref())
                    .is_none_or(|cs| {
                        cs.iter()
                            .all(|c| c.state.as_ref().is_none_or(|s| s.running.is_none()))
                    });
            let what = if started {
                "pod started: write its status"
            } else {
                "write the pod's status"
            };
            setpoint_runtime::decision::action(
                what,
                "the runtime's state differs from the pod's status",
            );
        }
        let mut updated = (*pod).clone();
        updated.status = Some(composed);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        // The cached resourceVersion is a precondition: on 409 the retry sees a fresh pod.
        match api
            .replace_status_metadata(&key.name, &params, &updated)
            .await
        {
            Ok(_) => {
                // Only once the status that shows the change is written: a failed write is
                // retried and reports it then.
                for e in events {
                    let type_ = if e.warning {
                        EventType::Warning
                    } else {
                        EventType::Normal
                    };
                    inner
                        .recorder
                        .publish(&pod.object_reference(), type_, e.reason, &e.message);
                }
                Ok(SyncOutcome::Synced(true))
            }
            // Deleted meanwhile: the informer's delete event brings us back to kill it.
            Err(e) if e.is_not_found() => Ok(SyncOutcome::Absent),
            Err(e) => Err(e.into()),
        }
    }
}
