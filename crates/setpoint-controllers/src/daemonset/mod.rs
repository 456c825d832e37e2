//! The DaemonSet controller: one pod per eligible node (upstream's `daemonset-controller`).
//!
//! Each pass reads the DaemonSet, the nodes and its pods from the shared caches, and:
//! - resolves its update revision in the ControllerRevision history ([`history`]);
//! - decides per node which daemon pods to create or delete ([`placement::manage`]): pods go
//!   where `nodeName`, `nodeSelector`, required node affinity and taints (against the pod's
//!   tolerations plus the daemon tolerations) allow, failed pods are replaced under a per-node
//!   backoff (1 s doubling to 15 min, upstream's `failedPodsBackoff`);
//! - rolls pods to the update revision ([`rolling::step`]) unless the strategy is `OnDelete`;
//! - writes `status` ([`status::compute`]) and prunes old revisions.
//!
//! A pod is created with a required node affinity naming its node (`matchFields
//! metadata.name In [<node>]`) and the scheduler binds it there. Creates and deletes go out
//! in slow-start batches and are tracked in [`Expectations`], so a stale cache never doubles
//! them. Node changes that can move a daemon pod (added, removed, labels, taints) wake every
//! DaemonSet; status heartbeats do not.

pub mod history;
pub mod placement;
pub mod rolling;
pub mod status;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::json;
use setpoint_api::selector::LabelSelector;
use setpoint_runtime::client::{Api, Client, DeleteParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Event, HandlerId, Informer, Scope, SharedInformers, Store};
use setpoint_runtime::workqueue::WorkQueue;
use setpoint_runtime::{Object, ObjectKey};

use crate::expectations::{Expectations, OwnedPods, EXPECTATIONS_TIMEOUT};

/// The controller's name (work queue, metrics, logs, `--controllers`).
pub const NAME: &str = "daemonset";
/// The reporter of its events, as upstream names it.
pub const REPORTER: &str = "daemonset-controller";
/// The annotation upstream's API server keeps the template generation in; copied to pods
/// as [`TEMPLATE_GENERATION_LABEL`] when present.
pub const TEMPLATE_GENERATION_ANNOTATION: &str = "deprecated.daemonset.template.generation";
/// The pod label with the DaemonSet's template generation.
pub const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";
/// The event reason for a failed daemon pod about to be deleted.
pub const FAILED_DAEMON_POD: &str = "FailedDaemonPod";
/// The first wait before a failed daemon pod on the same node is deleted again.
pub const FAILED_POD_BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// The longest such wait.
pub const FAILED_POD_BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

const OWNER: crate::expectations::Owner = crate::expectations::Owner {
    group: "apps",
    kind: "DaemonSet",
};

/// The controller reference a DaemonSet puts on its pods and revisions.
pub(crate) fn owner_reference(ds: &DaemonSet) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": ds.name(),
        "uid": ds.uid().unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

fn controller_ref(obj: &impl Object) -> Option<OwnerReference> {
    obj.owner_references()
        .into_iter()
        .find(|r| r.controller == Some(true))
}

/// The DaemonSet's selector; an absent or invalid one selects nothing.
pub fn selector_of(ds: &DaemonSet) -> LabelSelector {
    let v = serde_json::to_value(ds.spec.as_ref().map(|s| &s.selector))
        .unwrap_or(serde_json::Value::Null);
    LabelSelector::from_label_selector_json(&v).unwrap_or_else(|_| LabelSelector::nothing())
}

fn selects(sel: &LabelSelector, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    !sel.is_empty() && sel.matches(|k| labels.get(k).map(String::as_str))
}

/// The daemon pod for `node` at revision `hash`: the template with the daemon tolerations,
/// the node affinity naming `node`, the revision label, controlled by the DaemonSet.
pub fn new_pod(ds: &DaemonSet, node: &str, hash: &str) -> Result<Pod, serde_json::Error> {
    let template = ds
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    if let Some(g) = ds
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TEMPLATE_GENERATION_ANNOTATION))
    {
        labels.insert(TEMPLATE_GENERATION_LABEL.into(), g.clone());
    }
    labels.insert(status::REVISION_LABEL.into(), hash.into());
    let mut spec = placement::daemon_pod_spec(ds);
    spec.affinity = Some(placement::with_node_affinity(spec.affinity.take(), node));
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": format!("{}-", ds.name()),
            "namespace": ds.namespace(),
            "labels": labels,
            "annotations": meta.annotations,
            "finalizers": meta.finalizers,
            "ownerReferences": [owner_reference(ds)],
        },
        "spec": spec,
    }))
}

/// The failed-pod backoff per (DaemonSet, node), upstream's `flowcontrol.Backoff`.
#[derive(Debug, Default)]
struct FailedBackoff {
    entries: Mutex<HashMap<(String, String), (Instant, Duration)>>,
}

impl FailedBackoff {
    /// `None` when a failed pod on `node` may be deleted now (and the backoff steps on);
    /// else how long until it may.
    fn try_delete(&self, ds_uid: &str, node: &str, now: Instant) -> Option<Duration> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let key = (ds_uid.to_string(), node.to_string());
        match entries.get(&key).copied() {
            Some((at, delay)) if now.duration_since(at) < delay => {
                Some(delay - now.duration_since(at))
            }
            Some((at, delay)) if now.duration_since(at) <= 2 * FAILED_POD_BACKOFF_MAX => {
                entries.insert(key, (now, (delay * 2).min(FAILED_POD_BACKOFF_MAX)));
                None
            }
            _ => {
                entries.insert(key, (now, FAILED_POD_BACKOFF_INITIAL));
                None
            }
        }
    }
}

/// Unsubscribes the node handler when the reconciler goes.
struct NodeSubscription {
    informer: Informer<Node>,
    id: HandlerId,
}

impl Drop for NodeSubscription {
    fn drop(&mut self) {
        self.informer.unsubscribe(self.id);
    }
}

/// The reconciler of DaemonSets.
pub struct DaemonSetController {
    client: Client,
    sets: Store<DaemonSet>,
    nodes: Store<Node>,
    revisions: Store<ControllerRevision>,
    owned: OwnedPods,
    events: EventRecorder,
    backoff: FailedBackoff,
    node_subscription: OnceLock<NodeSubscription>,
}

impl DaemonSetController {
    fn expectations(&self) -> &Expectations {
        &self.owned.expectations
    }

    /// Adopts matching orphans and releases owned pods that no longer match; returns the
    /// pods the DaemonSet controls afterwards (as the cache shows them).
    async fn claim(&self, ds: &DaemonSet, api: &Api<Pod>) -> Vec<Arc<Pod>> {
        let uid = ds.uid().unwrap_or_default();
        let sel = selector_of(ds);
        let mut out = Vec::new();
        for p in self.owned.pods.by_owner(&uid) {
            if controller_ref(p.as_ref()).is_some_and(|r| r.uid == uid) {
                if selects(&sel, &p) {
                    out.push(p);
                } else {
                    let refs: Vec<serde_json::Value> = p
                        .owner_references()
                        .iter()
                        .filter(|r| r.uid != uid)
                        .filter_map(|r| serde_json::to_value(r).ok())
                        .collect();
                    decision::action(
                        format!("release pod {}", p.name()),
                        "an owned pod no longer matches the selector",
                    );
                    crate::expectations::patch_owner_references(
                        api,
                        &p,
                        refs,
                        "owner reference update",
                    )
                    .await;
                }
            }
        }
        if ds.metadata.deletion_timestamp.is_none() {
            for p in self
                .owned
                .pods
                .orphans_in(&ds.namespace().unwrap_or_default())
            {
                if p.metadata.deletion_timestamp.is_none() && selects(&sel, &p) {
                    let mut refs: Vec<serde_json::Value> = p
                        .owner_references()
                        .iter()
                        .filter_map(|r| serde_json::to_value(r).ok())
                        .collect();
                    refs.push(owner_reference(ds));
                    decision::action(
                        format!("adopt pod {}", p.name()),
                        "an orphan pod matches the selector",
                    );
                    if crate::expectations::patch_owner_references(
                        api,
                        &p,
                        refs,
                        "owner reference update",
                    )
                    .await
                    {
                        out.push(p);
                    }
                }
            }
        }
        out
    }

    /// Creates a daemon pod on each of `nodes` in slow-start batches; the first error.
    async fn create(
        &self,
        api: &Api<Pod>,
        ds: &DaemonSet,
        key: &ObjectKey,
        nodes: &[String],
        hash: &str,
    ) -> Option<String> {
        let reference = ds.object_reference();
        let params = PostParams::default();
        let mut rest = nodes;
        for size in crate::replicaset::batches(nodes.len()) {
            let (batch, tail) = rest.split_at(size);
            rest = tail;
            let results = futures::future::join_all(batch.iter().map(|node| {
                let params = &params;
                async move {
                    let pod = new_pod(ds, node, hash).map_err(|e| e.to_string())?;
                    api.create_metadata(params, &pod)
                        .await
                        .map_err(|e| e.to_string())
                }
            }))
            .await;
            let mut failed = None;
            for r in results {
                match r {
                    Ok(meta) => self.events.publish(
                        &reference,
                        EventType::Normal,
                        "SuccessfulCreate",
                        &format!("Created pod: {}", meta.name.as_deref().unwrap_or_default()),
                    ),
                    Err(e) => {
                        self.expectations().creation_observed(key, 1);
                        self.events.publish(
                            &reference,
                            EventType::Warning,
                            "FailedCreate",
                            &format!("Error creating: {e}"),
                        );
                        failed.get_or_insert(e);
                    }
                }
            }
            if failed.is_some() {
                // The creates never sent will never be observed.
                self.expectations().creation_observed(key, rest.len());
                return failed;
            }
        }
        None
    }

    /// Deletes the pods `victims` (key, uid) in slow-start batches; the first error.
    async fn delete(
        &self,
        api: &Api<Pod>,
        ds: &DaemonSet,
        key: &ObjectKey,
        victims: &[(ObjectKey, String)],
    ) -> Option<String> {
        crate::expectations::delete_in_batches(
            api,
            victims,
            self.expectations(),
            key,
            &self.events,
            &ds.object_reference(),
        )
        .await
    }

    async fn write_status(
        &self,
        ds: &DaemonSet,
        status: k8s_openapi::api::apps::v1::DaemonSetStatus,
    ) -> Result<(), ReconcileError> {
        let current = ds.status.clone().unwrap_or_default();
        if status::same_status(&status, &current) {
            return Ok(());
        }
        decision::action("update status", "the observed counts changed");
        let api: Api<DaemonSet> =
            Api::namespaced(self.client.clone(), &ds.namespace().unwrap_or_default());
        // An update of the status subresource, as upstream's controller writes it; once more
        // over a fresh read on a conflict.
        let mut next = ds.clone();
        for attempt in 0..2 {
            next.status = Some(status.clone());
            match api
                .replace_status(&ds.name(), &PostParams::default(), &next)
                .await
            {
                Ok(_) => break,
                Err(e) if e.is_conflict() && attempt == 0 => match api.get_opt(&ds.name()).await? {
                    Some(fresh) => next = fresh,
                    None => break,
                },
                Err(e) if e.is_not_found() => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Reconciler for DaemonSetController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(ds) = self.sets.get(key) else {
            self.expectations().forget(key);
            ctx.observe("the DaemonSet is gone");
            return Ok(Action::Done);
        };
        // A DaemonSet being deleted is left to the garbage collector, as upstream does.
        if ds.metadata.deletion_timestamp.is_some() {
            ctx.observe("the DaemonSet is being deleted: left to the garbage collector");
            return Ok(Action::Done);
        }
        let ns = key.namespace.clone().unwrap_or_default();
        let reference = ds.object_reference();
        if selector_of(&ds).is_empty() {
            ctx.observe("the selector is empty (it would select all pods): nothing done");
            self.events.publish(
                &reference,
                EventType::Warning,
                "SelectingAll",
                "This daemon set is selecting all pods. A non-empty selector is required.",
            );
            return Ok(Action::Done);
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let uid = ds.uid().unwrap_or_default();

        // History first: the update revision's hash names the pods this pass creates.
        let revisions: Vec<Arc<ControllerRevision>> = self
            .revisions
            .by_owner(&uid)
            .into_iter()
            .filter(|r| controller_ref(r.as_ref()).is_some_and(|c| c.uid == uid))
            .collect();
        let rev_refs: Vec<&ControllerRevision> = revisions.iter().map(|r| r.as_ref()).collect();
        let resolved = history::resolve(&ds, &rev_refs);
        if let Some(w) = &resolved.write {
            let api = Api::namespaced(self.client.clone(), &ns);
            crate::history::write(&api, w, "DaemonSet", &ds.name()).await?;
        }

        // Expectations before the pods are read, never after: pods created by an earlier pass
        // that land in between would be missing from what is read yet satisfy the
        // expectations (`Expectations::satisfied_then`).
        let waiting = !self.expectations().satisfied(key);
        let pods = self.claim(&ds, &api).await;
        let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
        let nodes = self.nodes.list();
        let node_refs: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
        let hash = resolved.hash.clone();
        let now = crate::now();
        // The status the nodes and pods imply (pure: computed here for the record, written
        // below).
        let (mut st, available_in) = status::compute(&ds, &node_refs, &pod_refs, &hash, now);
        let recording = ctx.recording();
        if recording {
            ctx.observe(format!(
                "{} nodes: {} should run the daemon pod, {} have one, {} misscheduled, {} updated (revision {hash}), {} ready, {} available",
                node_refs.len(),
                st.desired_number_scheduled,
                st.current_number_scheduled,
                st.number_misscheduled,
                st.updated_number_scheduled.unwrap_or(0),
                st.number_ready,
                st.number_available.unwrap_or(0),
            ));
            if waiting {
                ctx.observe(
                    "earlier creates or deletes not yet observed (expectations): no action",
                );
            }
        }

        let mut failure = None;
        let mut requeue: Option<Duration> = None;
        if !waiting {
            let (surge, _) = rolling::surge_and_unavailable(&ds, node_refs.len() as i32);
            let rolling_on = rolling::is_rolling(&ds);
            let manage =
                placement::manage(&ds, &node_refs, &pod_refs, &hash, rolling_on && surge > 0);
            let mut delete: Vec<ObjectKey> = manage.delete.clone();
            let mut create: Vec<String> = manage.create.clone();
            // Why each pod is deleted and each node gets a pod (for the decision record).
            let mut delete_rules: HashMap<String, String> = HashMap::new();
            let mut create_rules: HashMap<String, String> = HashMap::new();
            if recording {
                let spec = placement::daemon_pod_spec(&ds);
                for k in &manage.delete {
                    let rule = match self.owned.pods.get(k) {
                        Some(p) => {
                            placement_delete_rule(&spec, &node_refs, &p, rolling_on && surge > 0)
                        }
                        None => "placement".to_string(),
                    };
                    delete_rules.entry(k.name.clone()).or_insert(rule);
                }
                for n in &manage.create {
                    create_rules.entry(n.clone()).or_insert_with(|| {
                        format!("node {n} should run a daemon pod and has none")
                    });
                }
            }
            for (node, pod) in &manage.failed {
                match self.backoff.try_delete(&uid, node, Instant::now()) {
                    Some(wait) => {
                        if recording {
                            ctx.observe(format!(
                                "failed pod {} on node {node}: deleted after a backoff of {}s more",
                                pod.name,
                                wait.as_secs()
                            ));
                        }
                        requeue = Some(requeue.map_or(wait, |r| r.min(wait)))
                    }
                    None => {
                        self.events.publish(
                            &reference,
                            EventType::Warning,
                            FAILED_DAEMON_POD,
                            &format!(
                                "Found failed daemon pod {}/{} on node {node}, will try to kill it",
                                ns, pod.name
                            ),
                        );
                        if recording {
                            delete_rules.entry(pod.name.clone()).or_insert_with(|| {
                                format!("the pod Failed on node {node}, which should run one: replaced (its backoff has passed)")
                            });
                        }
                        delete.push(pod.clone());
                    }
                }
            }
            if rolling_on {
                let step = rolling::step(&ds, &node_refs, &pod_refs, &hash, now);
                if recording {
                    let (max_surge, max_unavailable) =
                        rolling::surge_and_unavailable(&ds, st.desired_number_scheduled);
                    let min_ready = status::min_ready(&ds);
                    for k in &step.delete {
                        let rule = match self.owned.pods.get(k) {
                            Some(p) if max_surge > 0 => format!(
                                "the new pod on node {} is available: the old one goes (RollingUpdate, maxSurge {max_surge})",
                                placement::target_node(&p).unwrap_or_default()
                            ),
                            Some(p) if !status::availability(&p, min_ready, now).0 => format!(
                                "revision {} is not the update revision {hash} and the pod is not available: replaced at once (RollingUpdate)",
                                status::pod_hash(&p).unwrap_or("none")
                            ),
                            Some(p) => format!(
                                "revision {} is not the update revision {hash}; within maxUnavailable {max_unavailable} (RollingUpdate)",
                                status::pod_hash(&p).unwrap_or("none")
                            ),
                            None => "RollingUpdate".to_string(),
                        };
                        delete_rules.entry(k.name.clone()).or_insert(rule);
                    }
                    for n in &step.create {
                        create_rules.entry(n.clone()).or_insert_with(|| {
                            format!("node {n} has only a daemon pod of an old revision: a new one beside it (RollingUpdate, maxSurge {max_surge})")
                        });
                    }
                }
                delete.extend(step.delete);
                create.extend(step.create);
            }
            let mut seen = BTreeSet::new();
            delete.retain(|k| seen.insert(k.name.clone()));
            let mut seen = BTreeSet::new();
            create.retain(|n| seen.insert(n.clone()));
            let victims: Vec<(ObjectKey, String)> = delete
                .iter()
                .filter_map(|k| Some((k.clone(), self.owned.pods.get(k)?.uid()?)))
                .collect();
            if !create.is_empty() || !victims.is_empty() {
                if recording {
                    for n in &create {
                        ctx.action(
                            format!("create a daemon pod for node {n}"),
                            create_rules.remove(n).unwrap_or_default(),
                        );
                    }
                    for (k, _) in &victims {
                        ctx.action(
                            format!("delete pod {}", k.name),
                            delete_rules.remove(&k.name).unwrap_or_default(),
                        );
                    }
                }
                let uids: HashSet<String> = victims.iter().map(|(_, u)| u.clone()).collect();
                self.expectations().expect(key, create.len(), uids);
                tracing::debug!(daemonset = %key, create = create.len(), delete = victims.len(), "syncing nodes");
                if let Some(e) = self.create(&api, &ds, key, &create, &hash).await {
                    failure = Some(e);
                }
                if let Some(e) = self.delete(&api, &ds, key, &victims).await {
                    failure.get_or_insert(e);
                }
            }
            // Old revisions no pod is at, beyond the limit.
            for name in history::truncate(&ds, &rev_refs, &pod_refs, &hash) {
                if recording {
                    ctx.action(
                        format!("delete ControllerRevision {name}"),
                        format!(
                            "beyond revisionHistoryLimit {}; not the update revision and no pod is at it",
                            ds.spec
                                .as_ref()
                                .and_then(|s| s.revision_history_limit)
                                .unwrap_or(10)
                        ),
                    );
                }
                let rapi: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &ns);
                if let Err(e) = rapi.delete(&name, &DeleteParams::default()).await {
                    if !e.is_not_found() {
                        failure.get_or_insert(e.to_string());
                    }
                }
            }
        }

        st.collision_count = (resolved.collision_count > 0
            || ds.status.as_ref().and_then(|s| s.collision_count).is_some())
        .then_some(resolved.collision_count);
        self.write_status(&ds, st).await?;

        if let Some(e) = failure {
            return Err(ReconcileError::retry(e));
        }
        let fallback = waiting.then(|| {
            self.expectations()
                .expires_in(key)
                .unwrap_or(EXPECTATIONS_TIMEOUT)
        });
        Ok(
            match available_in
                .into_iter()
                .chain(requeue)
                .chain(fallback)
                .min()
            {
                Some(d) => Action::RequeueAfter(d + Duration::from_millis(100)),
                None => Action::Done,
            },
        )
    }

    /// A cancelled reconcile's writes may or may not have been sent: see
    /// [`Expectations::interrupted`](crate::expectations::Expectations::interrupted).
    fn interrupted(&self, key: &ObjectKey) {
        self.expectations().interrupted(key);
    }
}

/// Why the manage step deletes `pod` (for the decision record): its node is gone or should
/// not run it, it ran to completion, or it is a surplus on its node.
fn placement_delete_rule(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    nodes: &[&Node],
    pod: &Pod,
    surge: bool,
) -> String {
    let Some(node) = placement::target_node(pod) else {
        return "the pod names no node".to_string();
    };
    let Some(n) = nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node.as_str()))
    else {
        return format!("node {node} no longer exists");
    };
    if !placement::node_fit(spec, n).should_continue_running {
        return format!("node {node} should not run the daemon pod (nodeName, nodeSelector, node affinity or an untolerated NoExecute taint)");
    }
    if placement::phase(pod) == Some("Succeeded") {
        return format!("the pod Succeeded on node {node}: a daemon pod should keep running");
    }
    if surge {
        format!("node {node} has a surplus daemon pod (maxSurge: one new and one old at most, the old one until the new one is ready)")
    } else {
        format!("node {node} has more than one daemon pod: the oldest stays")
    }
}

/// What about a node can change where daemon pods go: its labels, taints and spec.
fn placement_facts(node: &Node) -> (Option<std::collections::BTreeMap<String, String>>, String) {
    let spec = node
        .spec
        .as_ref()
        .and_then(|s| serde_json::to_string(s).ok())
        .unwrap_or_default();
    (node.metadata.labels.clone(), spec)
}

/// Every DaemonSet's key.
fn all_keys(sets: &Store<DaemonSet>) -> Vec<ObjectKey> {
    sets.list()
        .iter()
        .map(|s| ObjectKey::of(s.as_ref()))
        .collect()
}

/// The DaemonSet controller, reconciling a DaemonSet when it, one of its pods or revisions,
/// an orphan it selects, or a node's placement facts change.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let node_informer = informers.typed::<Node>(Scope::all());
    let reconciler = Arc::new(DaemonSetController {
        events: EventRecorder::new(client.clone(), Reporter::new(REPORTER)),
        client,
        sets: informers.typed::<DaemonSet>(Scope::all()).store(),
        nodes: node_informer.store(),
        revisions: informers.typed::<ControllerRevision>(Scope::all()).store(),
        owned: OwnedPods::watch(informers, OWNER),
        backoff: FailedBackoff::default(),
        node_subscription: OnceLock::new(),
    });
    let sets = informers.typed::<DaemonSet>(Scope::all()).store();
    let orphan_sets = sets.clone();
    let controller = Controller::for_type::<DaemonSet>(NAME, informers, None)
        .owns::<DaemonSet, Pod>(None)
        .owns::<DaemonSet, ControllerRevision>(None)
        // An orphan wakes the DaemonSets of its namespace that select it, to be adopted.
        .watches::<Pod>(None, move |pod: &Pod| {
            if controller_ref(pod).is_some() || pod.metadata.deletion_timestamp.is_some() {
                return Vec::new();
            }
            orphan_sets
                .by_namespace(&pod.namespace().unwrap_or_default())
                .iter()
                .filter(|ds| selects(&selector_of(ds), pod))
                .map(|ds| ObjectKey::of(ds.as_ref()))
                .collect()
        })
        .build(reconciler.clone());
    let queue: WorkQueue<ObjectKey> = controller.queue().clone();
    let id = node_informer.subscribe(Arc::new(move |ev: &Event<Node>| {
        let moved = match ev {
            Event::Updated { old, new } => placement_facts(old) != placement_facts(new),
            _ => true,
        };
        if moved {
            for k in all_keys(&sets) {
                queue.add(k);
            }
        }
    }));
    let _ = reconciler.node_subscription.set(NodeSubscription {
        informer: node_informer,
        id,
    });
    controller
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_pods_back_off_per_node_doubling_to_the_limit() {
        let b = FailedBackoff::default();
        let t0 = Instant::now();
        assert_eq!(
            b.try_delete("ds", "n1", t0),
            None,
            "the first failure goes at once"
        );
        assert_eq!(
            b.try_delete("ds", "n1", t0 + Duration::from_millis(400)),
            Some(Duration::from_millis(600))
        );
        assert_eq!(b.try_delete("ds", "n2", t0), None, "each node has its own");
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(b.try_delete("ds", "n1", t1), None);
        assert_eq!(
            b.try_delete("ds", "n1", t1 + Duration::from_secs(1)),
            Some(Duration::from_secs(1)),
            "doubled to 2 s"
        );
        let mut t = t1;
        for _ in 0..20 {
            t += FAILED_POD_BACKOFF_MAX;
            assert_eq!(b.try_delete("ds", "n1", t), None);
        }
        assert_eq!(
            b.try_delete("ds", "n1", t + Duration::from_secs(1)),
            Some(FAILED_POD_BACKOFF_MAX - Duration::from_secs(1)),
            "never beyond the limit"
        );
        // Long quiet: back to the start.
        let later = t + 3 * FAILED_POD_BACKOFF_MAX;
        assert_eq!(b.try_delete("ds", "n1", later), None);
        assert_eq!(
            b.try_delete("ds", "n1", later + Duration::from_millis(500)),
            Some(Duration::from_millis(500))
        );
    }

    #[test]
    fn a_daemon_pod_names_its_node_and_revision() {
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "kube-system", "uid": "u1",
                         "annotations": {TEMPLATE_GENERATION_ANNOTATION: "3"}},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}},
                             "spec": {"hostNetwork": true,
                                      "containers": [{"name": "c", "image": "x"}]}},
            }
        }))
        .unwrap();
        let pod = new_pod(&ds, "node-7", "abc").unwrap();
        assert_eq!(placement::target_node(&pod).as_deref(), Some("node-7"));
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels[status::REVISION_LABEL], "abc");
        assert_eq!(labels[TEMPLATE_GENERATION_LABEL], "3");
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("agent-"));
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("DaemonSet", Some(true))
        );
        let tolerations = pod.spec.unwrap().tolerations.unwrap();
        assert!(tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some(placement::NETWORK_UNAVAILABLE)));
    }
}
