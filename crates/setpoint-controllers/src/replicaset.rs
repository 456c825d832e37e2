//! The ReplicaSet controller: keeps `spec.replicas` pods matching a ReplicaSet's selector
//! running, adopting matching orphans and releasing owned pods that stop matching.
//!
//! Creates and deletes go out in batches that grow 1, 2, 4, 8 … (slow start), so a create
//! that keeps failing costs one request instead of hundreds. In-flight intent is tracked in
//! [`Expectations`], so a stale cache never causes double work.
//!
//! [`plan`] is the pure decision; [`ReplicaSetController`] does the I/O around it. Both
//! serve ReplicationControllers too, through the [`Replicated`] adapter (upstream's
//! ReplicationController controller is its ReplicaSet controller over such an adapter), so
//! the two kinds share one implementation of every rule here.

use std::cmp::Ordering;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetCondition, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use setpoint_api::selector::LabelSelector;
use setpoint_runtime::client::{Api, Client, ListParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::events::{EventRecorder, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

pub use crate::expectations::Expectations;
use crate::expectations::{BatchesEnd, OwnedPods};

/// The controller's name (work queue, metrics, logs, event reporter).
pub const NAME: &str = "replicaset";
pub use crate::expectations::EXPECTATIONS_TIMEOUT;
/// The most pods created or deleted for one ReplicaSet in one pass.
pub const BURST_REPLICAS: usize = 500;

/// A kind whose objects keep `spec.replicas` copies of a pod template running: the
/// ReplicaSet itself, and the ReplicationController seen as one (its equality selector as
/// `matchLabels`, its status fields the same). The controller reads every object through
/// [`Replicated::as_replica_set`] and writes back only the status.
pub trait Replicated:
    k8s_openapi::Resource<Scope = k8s_openapi::NamespaceResourceScope> + Object
{
    /// The controller's name (`--controllers`, work queue, metrics, logs).
    const CONTROLLER: &'static str;
    /// The component its Events are reported by, upstream's.
    const REPORTER: &'static str;
    /// The object as a ReplicaSet: metadata, spec (selector included) and status.
    fn as_replica_set(&self) -> ReplicaSet;
    /// Replaces the object's status with `status`.
    fn set_status(&mut self, status: ReplicaSetStatus);
}

impl Replicated for ReplicaSet {
    const CONTROLLER: &'static str = NAME;
    const REPORTER: &'static str = "replicaset-controller";
    fn as_replica_set(&self) -> ReplicaSet {
        self.clone()
    }
    fn set_status(&mut self, status: ReplicaSetStatus) {
        self.status = Some(status);
    }
}

/// The owner kind whose pods a controller's expectations follow.
fn owner_of<K: Replicated>() -> crate::expectations::Owner {
    crate::expectations::Owner {
        group: K::GROUP,
        kind: K::KIND,
    }
}
/// The condition reporting failed creates or deletes.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";

/// What one pass over a ReplicaSet should do.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Pods to create.
    pub create: usize,
    /// Pods to delete, most deletable first.
    pub delete: Vec<ObjectKey>,
    /// Matching orphans to adopt (already counted as owned).
    pub adopt: Vec<ObjectKey>,
    /// Owned pods that no longer match the selector.
    pub release: Vec<ObjectKey>,
    /// The status the pods observed imply (without conditions).
    pub status: ReplicaSetStatus,
    /// When a ready pod becomes available, look again.
    pub requeue: Option<Duration>,
}

/// The controller reference of an object, if any.
fn controller_ref(pod: &Pod) -> Option<OwnerReference> {
    pod.owner_references()
        .into_iter()
        .find(|r| r.controller == Some(true))
}

fn is_active(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// The time since which a pod has been Ready, if it is.
fn ready_since(pod: &Pod) -> Option<Option<Timestamp>> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| c.last_transition_time.as_ref().map(|t| t.0))
}

/// The most restarts of any of the pod's containers.
fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().map(|c| c.restart_count).max())
        .unwrap_or(0)
}

fn phase_rank(pod: &Pod) -> u8 {
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Pending") => 0,
        Some("Unknown") => 1,
        Some("Running") => 2,
        _ => 0,
    }
}

/// Kubernetes' deletion ranking: `Less` means `a` should be deleted before `b`.
/// Unscheduled before scheduled, Pending before Unknown before Running, not-ready before
/// ready, ready for less time before ready for longer, more restarts first, newer before older.
pub fn deletion_order(a: &Pod, b: &Pod) -> Ordering {
    let scheduled = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
    };
    scheduled(a)
        .cmp(&scheduled(b))
        .then_with(|| phase_rank(a).cmp(&phase_rank(b)))
        .then_with(|| ready_since(a).is_some().cmp(&ready_since(b).is_some()))
        .then_with(
            || match (ready_since(a).flatten(), ready_since(b).flatten()) {
                // Newer ready time (ready for less time) first.
                (Some(x), Some(y)) => y.cmp(&x),
                _ => Ordering::Equal,
            },
        )
        .then_with(|| restarts(b).cmp(&restarts(a)))
        .then_with(|| {
            let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            created(b).cmp(&created(a))
        })
}

/// The slow-start batch sizes for `n` operations: 1, 2, 4, 8 … with the last one cut to fit.
pub fn batches(n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let (mut left, mut size) = (n, 1usize);
    while left > 0 {
        let b = size.min(left);
        out.push(b);
        left -= b;
        size = size.saturating_mul(2);
    }
    out
}

/// The label selector of a ReplicaSet (or of a ReplicationController seen as one).
pub fn selector_of(rs: &ReplicaSet) -> LabelSelector {
    let v = serde_json::to_value(rs.spec.as_ref().map(|s| &s.selector))
        .unwrap_or(serde_json::Value::Null);
    LabelSelector::from_label_selector_json(&v).unwrap_or_else(|_| LabelSelector::nothing())
}

/// The pure decision: given a ReplicaSet and the pods of its namespace at `now`, which pods
/// to create, delete, adopt and release, and what its status is.
pub fn plan(rs: &ReplicaSet, pods: &[Arc<Pod>], now: Timestamp) -> Plan {
    let spec = rs.spec.as_ref();
    let uid = rs.metadata.uid.clone().unwrap_or_default();
    let selector = selector_of(rs);
    // An empty selector would match every pod in the namespace: Kubernetes refuses it.
    let usable = !selector.is_empty();
    let deleting = rs.metadata.deletion_timestamp.is_some();
    let matches = |p: &Pod| {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        usable && selector.matches(|k| labels.get(k).map(String::as_str))
    };

    let mut owned: Vec<&Pod> = Vec::new();
    let (mut adopt, mut release) = (Vec::new(), Vec::new());
    for p in pods {
        match controller_ref(p) {
            Some(r) if r.uid == uid => {
                if matches(p) {
                    owned.push(p);
                } else {
                    release.push(ObjectKey::of(p.as_ref()));
                }
            }
            Some(_) => {}
            None => {
                if matches(p) && !deleting && p.metadata.deletion_timestamp.is_none() {
                    adopt.push(ObjectKey::of(p.as_ref()));
                    owned.push(p);
                }
            }
        }
    }
    let mut active: Vec<&Pod> = owned.iter().copied().filter(|p| is_active(p)).collect();
    let want = setpoint_api::replicas::or_default(spec.and_then(|s| s.replicas)).max(0) as usize;

    let (mut create, mut delete) = (0, Vec::new());
    if !deleting && usable {
        if active.len() < want {
            create = (want - active.len()).min(BURST_REPLICAS);
        } else if active.len() > want {
            let n = (active.len() - want).min(BURST_REPLICAS);
            active.sort_by(|a, b| deletion_order(a, b));
            delete = active[..n].iter().map(|p| ObjectKey::of(*p)).collect();
        }
    }

    let template_labels = spec
        .and_then(|s| s.template.as_ref())
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let min_ready = spec.and_then(|s| s.min_ready_seconds).unwrap_or(0).max(0) as i64;
    let (mut fully, mut ready, mut available) = (0, 0, 0);
    let mut requeue: Option<Duration> = None;
    for p in owned.iter().filter(|p| is_active(p)) {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        if template_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
        {
            fully += 1;
        }
        let Some(since) = ready_since(p) else {
            continue;
        };
        ready += 1;
        let elapsed = since.map(|t| now.as_second() - t.as_second());
        match elapsed {
            _ if min_ready == 0 => available += 1,
            Some(e) if e >= min_ready => available += 1,
            Some(e) => {
                let left = Duration::from_secs((min_ready - e) as u64);
                requeue = Some(requeue.map_or(left, |r| r.min(left)));
            }
            None => {}
        }
    }
    let status = ReplicaSetStatus {
        replicas: active_count(&owned),
        fully_labeled_replicas: Some(fully),
        ready_replicas: Some(ready),
        available_replicas: Some(available),
        observed_generation: rs.metadata.generation,
        conditions: None,
    };
    Plan {
        create,
        delete,
        adopt,
        release,
        status,
        requeue,
    }
}

fn active_count(owned: &[&Pod]) -> i32 {
    owned.iter().filter(|p| is_active(p)).count() as i32
}

/// The conditions a ReplicaSet should carry: `current` with `ReplicaFailure` set to `failure`
/// (reason, message) or removed.
pub fn conditions(
    current: &[ReplicaSetCondition],
    failure: Option<(&str, String)>,
    now: &Time,
) -> Vec<ReplicaSetCondition> {
    let mut out: Vec<ReplicaSetCondition> = current
        .iter()
        .filter(|c| c.type_ != REPLICA_FAILURE)
        .cloned()
        .collect();
    if let Some((reason, message)) = failure {
        let old = current.iter().find(|c| c.type_ == REPLICA_FAILURE);
        out.push(ReplicaSetCondition {
            type_: REPLICA_FAILURE.into(),
            status: "True".into(),
            reason: Some(reason.into()),
            message: Some(message),
            last_transition_time: old
                .filter(|o| o.status == "True")
                .and_then(|o| o.last_transition_time.clone())
                .or_else(|| Some(now.clone())),
        });
    }
    out
}

/// Whether two statuses say the same, reading an omitted count as zero (servers may omit
/// zero values) and an empty condition list as none.
pub fn same_status(a: &ReplicaSetStatus, b: &ReplicaSetStatus) -> bool {
    let n = |v: Option<i32>| v.unwrap_or(0);
    let c = |s: &ReplicaSetStatus| s.conditions.clone().unwrap_or_default();
    a.replicas == b.replicas
        && n(a.fully_labeled_replicas) == n(b.fully_labeled_replicas)
        && n(a.ready_replicas) == n(b.ready_replicas)
        && n(a.available_replicas) == n(b.available_replicas)
        && a.observed_generation == b.observed_generation
        && c(a) == c(b)
}

use crate::now;

/// The reconciler of ReplicaSets (or of another [`Replicated`] kind).
pub struct ReplicaSetController<K: Replicated = ReplicaSet> {
    client: Client,
    replicasets: Store<K>,
    owned: OwnedPods,
    events: EventRecorder,
}

/// The controller reference an owner of kind `K` puts on its pods.
fn owner_reference<K: Replicated>(rs: &ReplicaSet) -> serde_json::Value {
    json!({
        "apiVersion": K::API_VERSION,
        "kind": K::KIND,
        "name": rs.name(),
        "uid": rs.uid().unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// A new pod from the template of `rs`, an owner of kind `K`.
fn new_pod<K: Replicated>(rs: &ReplicaSet) -> Result<Pod, ReconcileError> {
    let template = rs.spec.as_ref().and_then(|s| s.template.clone());
    let meta = template
        .as_ref()
        .and_then(|t| t.metadata.clone())
        .unwrap_or_default();
    let body = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": format!("{}-", rs.name()),
            "namespace": rs.namespace(),
            "labels": meta.labels,
            "annotations": meta.annotations,
            "finalizers": meta.finalizers,
            "ownerReferences": [owner_reference::<K>(rs)],
        },
        "spec": template.and_then(|t| t.spec),
    });
    serde_json::from_value(body).map_err(ReconcileError::terminal)
}

impl<K: Replicated> ReplicaSetController<K> {
    async fn adopt(&self, api: &Api<Pod>, rs: &ReplicaSet, key: &ObjectKey) {
        let Some(pod) = self.owned.pods.get(key) else {
            return;
        };
        let mut refs: Vec<serde_json::Value> = pod
            .owner_references()
            .iter()
            .filter_map(|r| serde_json::to_value(r).ok())
            .collect();
        refs.push(owner_reference::<K>(rs));
        crate::expectations::patch_owner_references(api, &pod, refs, "adoption").await;
    }

    async fn release(&self, api: &Api<Pod>, rs: &ReplicaSet, key: &ObjectKey) {
        let Some(pod) = self.owned.pods.get(key) else {
            return;
        };
        let uid = rs.uid().unwrap_or_default();
        let refs: Vec<serde_json::Value> = pod
            .owner_references()
            .iter()
            .filter(|r| r.uid != uid)
            .filter_map(|r| serde_json::to_value(r).ok())
            .collect();
        crate::expectations::patch_owner_references(api, &pod, refs, "release").await;
    }

    /// Creates `n` pods in slow-start batches while this reconcile may act (its leadership
    /// term lasts); returns the first error.
    async fn create(
        &self,
        ctx: &Context,
        api: &Api<Pod>,
        rs: &ReplicaSet,
        owner: &K,
        key: &ObjectKey,
        n: usize,
    ) -> Option<String> {
        let pod = match new_pod::<K>(rs) {
            Ok(p) => p,
            Err(e) => {
                self.owned.expectations.creation_observed(key, n);
                return Some(e.message);
            }
        };
        // A term that ends mid-way stops before the next batch; the client also refuses any
        // write of a reconcile whose term is over.
        let proceed = || std::future::ready(ctx.may_act());
        match crate::expectations::create_in_batches_while(
            api,
            &pod,
            n,
            &self.owned.expectations,
            key,
            &self.events,
            &owner.object_reference(),
            proceed,
        )
        .await
        {
            BatchesEnd::Failed(msg) => Some(msg),
            BatchesEnd::Done | BatchesEnd::Stopped { .. } => None,
        }
    }

    /// Deletes the pods `keys`; returns the first error.
    async fn delete(
        &self,
        api: &Api<Pod>,
        owner: &K,
        key: &ObjectKey,
        pods: &[(ObjectKey, String)],
    ) -> Option<String> {
        crate::expectations::delete_in_batches(
            api,
            pods,
            &self.owned.expectations,
            key,
            &self.events,
            &owner.object_reference(),
        )
        .await
    }
}

#[async_trait::async_trait]
impl<K: Replicated> Reconciler for ReplicaSetController<K> {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(owner) = self.replicasets.get(key) else {
            self.owned.expectations.forget(key);
            self.owned.fresh.forget(key);
            ctx.observe(format!("the {} is gone", K::KIND));
            return Ok(Action::Done);
        };
        let rs = owner.as_replica_set();
        let ns = key.namespace.clone().unwrap_or_default();
        // Its own pods and the namespace's orphans: all `plan` can act on, found through
        // indexes rather than by scanning every pod of the namespace (which made a namespace
        // with thousands of ReplicaSets quadratic). Read after the expectations are checked
        // (`Expectations::satisfied_then`): the other way round, pods landing in between are
        // missing from the read yet satisfy the expectations, and are created again.
        let uid = rs.metadata.uid.clone().unwrap_or_default();
        let (satisfied, pods) = self.owned.expectations.satisfied_then(key, || {
            let mut pods = self.owned.pods.by_owner(&uid);
            pods.extend(self.owned.pods.orphans_in(&ns));
            pods
        });
        let waiting = !satisfied;
        let now = now();
        let plan = plan(&rs, &pods, now);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let want =
            setpoint_api::replicas::or_default(rs.spec.as_ref().and_then(|s| s.replicas)).max(0);
        let active = plan.status.replicas;
        if ctx.recording() {
            let terminating = pods
                .iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_some()
                        && controller_ref(p).is_some_and(|r| r.uid == uid)
                })
                .count();
            ctx.observe(format!(
                "{want} desired, {active} active, {terminating} terminating, {} ready, {} available",
                plan.status.ready_replicas.unwrap_or(0),
                plan.status.available_replicas.unwrap_or(0),
            ));
        }
        for k in &plan.adopt {
            ctx.action(
                format!("adopt pod {}", k.name),
                "an orphan pod matches the selector",
            );
        }
        for k in &plan.release {
            ctx.action(
                format!("release pod {}", k.name),
                "an owned pod no longer matches the selector",
            );
        }

        for k in &plan.adopt {
            self.adopt(&api, &rs, k).await;
        }
        for k in &plan.release {
            self.release(&api, &rs, k).await;
        }

        let mut failure = None;
        if waiting && (plan.create > 0 || !plan.delete.is_empty()) {
            ctx.observe("earlier creates or deletes not yet observed (expectations): no action");
        }
        let mut create = plan.create;
        if !waiting && create > 0 && self.owned.count_from_server(key, ctx.successor_term()) {
            // First create for this set in a term taken over from another replica (the pods
            // its leader created last may not be in this replica's cache yet), or after a
            // create whose outcome is unknown (it may be on the server, not yet in the cache).
            let selector = selector_of(&rs).to_string();
            let live = api.list(&ListParams::default().labels(&selector)).await?;
            let live: Vec<Arc<Pod>> = live.items.into_iter().map(Arc::new).collect();
            let fresh = crate::replicaset::plan(&rs, &live, now);
            self.owned.counted_from_server(key, ctx.successor_term());
            if fresh.create < create {
                ctx.observe(format!(
                    "the server has {} active pods, the cache {active}: creating {} instead of {create}",
                    fresh.status.replicas, fresh.create
                ));
                create = fresh.create;
            }
        }
        if !waiting {
            if create > 0 {
                ctx.action(
                    format!("create {create} pod(s)"),
                    format!("{active} active < {want} desired"),
                );
                self.owned.expectations.expect(key, create, HashSet::new());
                if let Some(e) = self.create(ctx, &api, &rs, &owner, key, create).await {
                    failure = Some(("FailedCreate", e));
                }
            } else if !plan.delete.is_empty() {
                let victims: Vec<(ObjectKey, String)> = plan
                    .delete
                    .iter()
                    .filter_map(|k| Some((k.clone(), self.owned.pods.get(k)?.uid()?)))
                    .collect();
                let names: Vec<&str> = victims.iter().map(|(k, _)| k.name.as_str()).collect();
                ctx.action(
                    format!("delete pod(s) {}", names.join(", ")),
                    format!("{active} active > {want} desired; the most deletable first (unassigned, pending, not ready, ready the shortest, most restarts, newest)"),
                );
                let uids = victims.iter().map(|(_, u)| u.clone()).collect();
                self.owned.expectations.expect(key, 0, uids);
                if let Some(e) = self.delete(&api, &owner, key, &victims).await {
                    failure = Some(("FailedDelete", e));
                }
            }
        }

        let current = rs.status.clone().unwrap_or_default();
        let now_time = Time(now);
        let mut status = plan.status.clone();
        let conds = conditions(
            current.conditions.as_deref().unwrap_or_default(),
            failure.clone(),
            &now_time,
        );
        status.conditions = (!conds.is_empty()).then_some(conds);
        if !same_status(&status, &current) {
            let rs_api: Api<K> = Api::namespaced(self.client.clone(), &ns);
            ctx.action("update status", "the observed counts or conditions changed");
            // An update of the status, as upstream's controller writes it (its role,
            // `system:controller:replicaset-controller`, grants update of
            // replicasets/status, not patch); on a conflict once more over a fresh read, as
            // upstream's `updateReplicaSetStatus` retries.
            let mut next = (*owner).clone();
            for attempt in 0..2 {
                next.set_status(status.clone());
                match rs_api
                    .replace_status(&key.name, &PostParams::default(), &next)
                    .await
                {
                    Ok(_) => break,
                    Err(e) if e.is_conflict() && attempt == 0 => {
                        match rs_api.get_opt(&key.name).await? {
                            Some(fresh) => next = fresh,
                            None => break,
                        }
                    }
                    Err(e) if e.is_not_found() => break,
                    Err(e) => return Err(e.into()),
                }
            }
        }

        if let Some((_, e)) = failure {
            return Err(ReconcileError::retry(e));
        }
        // Observations normally wake the set; the expectations' expiry is the fallback if
        // none arrive.
        let fallback = waiting.then(|| {
            self.owned
                .expectations
                .expires_in(key)
                .unwrap_or(EXPECTATIONS_TIMEOUT)
        });
        Ok(match plan.requeue.into_iter().chain(fallback).min() {
            Some(d) => Action::RequeueAfter(d + Duration::from_millis(100)),
            None => Action::Done,
        })
    }

    /// A cancelled reconcile's writes may or may not have been sent: see
    /// [`Expectations::interrupted`](crate::expectations::Expectations::interrupted).
    fn interrupted(&self, key: &ObjectKey) {
        self.owned.expectations.interrupted(key);
    }
}

/// The ReplicaSet controller, reconciling every ReplicaSet when it or one of its pods changes.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    controller_for::<ReplicaSet>(client, informers)
}

/// The controller of the [`Replicated`] kind `K`, reconciling every object when it or one of
/// its pods changes.
pub fn controller_for<K: Replicated>(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = ReplicaSetController::<K> {
        events: EventRecorder::new(client.clone(), Reporter::new(K::REPORTER)),
        client,
        replicasets: informers.typed::<K>(Scope::all()).store(),
        owned: OwnedPods::watch(informers, owner_of::<K>()),
    };
    let sets = informers.typed::<K>(Scope::all()).store();
    Controller::for_type::<K>(K::CONTROLLER, informers, None)
        .owns::<K, Pod>(None)
        // An orphan wakes the ReplicaSets of its namespace that select it, to be adopted.
        .watches::<Pod>(None, move |pod: &Pod| {
            if controller_ref(pod).is_some() || pod.metadata.deletion_timestamp.is_some() {
                return Vec::new();
            }
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            sets.by_namespace(&pod.namespace().unwrap_or_default())
                .iter()
                .filter(|rs| {
                    let sel = selector_of(&rs.as_replica_set());
                    !sel.is_empty() && sel.matches(|k| labels.get(k).map(String::as_str))
                })
                .map(|rs| ObjectKey::of(rs.as_ref()))
                .collect()
        })
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "rs-uid";

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    fn rs(replicas: i32, min_ready: i32) -> ReplicaSet {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": UID, "generation": 3},
            "spec": {
                "replicas": replicas,
                "minReadySeconds": min_ready,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web", "tier": "front"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}]}
                }
            }
        }))
        .unwrap()
    }

    /// A pod created at `created`, owned by the ReplicaSet when `owned`.
    fn pod(name: &str, owned: bool, created: i64) -> Pod {
        let refs = if owned {
            json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web",
                    "uid": UID, "controller": true}])
        } else {
            json!(null)
        };
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "default", "uid": format!("uid-{name}"),
                "labels": {"app": "web", "tier": "front"},
                "ownerReferences": refs,
                "creationTimestamp": Time(ts(created)),
            },
            "status": {"phase": "Pending"}
        }))
        .unwrap()
    }

    fn with(
        mut p: Pod,
        node: Option<&str>,
        phase: &str,
        ready_at: Option<i64>,
        restarts: i32,
    ) -> Pod {
        let spec = p.spec.get_or_insert_with(Default::default);
        spec.node_name = node.map(String::from);
        let status = p.status.get_or_insert_with(Default::default);
        status.phase = Some(phase.into());
        status.conditions = ready_at.map(|t| {
            serde_json::from_value(json!([{
                "type": "Ready", "status": "True", "lastTransitionTime": Time(ts(t))
            }]))
            .unwrap()
        });
        status.container_statuses = Some(
            serde_json::from_value(json!([{
                "name": "c", "image": "nginx", "imageID": "", "ready": ready_at.is_some(),
                "restartCount": restarts
            }]))
            .unwrap(),
        );
        p
    }

    fn arcs(pods: Vec<Pod>) -> Vec<Arc<Pod>> {
        pods.into_iter().map(Arc::new).collect()
    }

    fn names(keys: &[ObjectKey]) -> Vec<&str> {
        keys.iter().map(|k| k.name.as_str()).collect()
    }

    #[test]
    fn batches_grow_by_doubling() {
        assert_eq!(batches(0), Vec::<usize>::new());
        assert_eq!(batches(1), vec![1]);
        assert_eq!(batches(3), vec![1, 2]);
        assert_eq!(batches(10), vec![1, 2, 4, 3]);
        assert_eq!(batches(50), vec![1, 2, 4, 8, 16, 19]);
    }

    #[test]
    fn creates_the_missing_pods() {
        let p = plan(&rs(3, 0), &arcs(vec![pod("a", true, 1)]), ts(100));
        assert_eq!(p.create, 2);
        assert!(p.delete.is_empty());
        assert_eq!(p.status.replicas, 1);
        assert_eq!(p.status.fully_labeled_replicas, Some(1));
        assert_eq!(p.status.observed_generation, Some(3));
    }

    #[test]
    fn inactive_pods_do_not_count() {
        let mut done = pod("done", true, 1);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let mut going = pod("going", true, 1);
        going.metadata.deletion_timestamp = Some(Time(ts(5)));
        let p = plan(&rs(2, 0), &arcs(vec![done, going]), ts(100));
        assert_eq!(p.create, 2);
        assert_eq!(p.status.replicas, 0);
    }

    #[test]
    fn adopts_matching_orphans_and_releases_non_matching() {
        let mut stray = pod("stray", true, 1);
        stray.metadata.labels = Some([("app".to_string(), "other".to_string())].into());
        let mut foreign = pod("foreign", true, 1);
        foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into();
        let pods = arcs(vec![pod("orphan", false, 1), stray, foreign]);
        let p = plan(&rs(1, 0), &pods, ts(100));
        assert_eq!(names(&p.adopt), ["orphan"]);
        assert_eq!(names(&p.release), ["stray"]);
        assert_eq!(p.create, 0);
        assert_eq!(p.status.replicas, 1);
    }

    #[test]
    fn deletes_in_kubernetes_rank_order() {
        let pods = arcs(vec![
            with(pod("old-ready", true, 1), Some("n"), "Running", Some(10), 0),
            with(pod("new-ready", true, 2), Some("n"), "Running", Some(50), 0),
            with(pod("restarty", true, 1), Some("n"), "Running", Some(10), 5),
            with(pod("running", true, 1), Some("n"), "Running", None, 0),
            with(pod("unknown", true, 1), Some("n"), "Unknown", None, 0),
            with(pod("pending", true, 1), Some("n"), "Pending", None, 0),
            with(pod("unscheduled-old", true, 1), None, "Pending", None, 0),
            with(pod("unscheduled-new", true, 9), None, "Pending", None, 0),
        ]);
        let p = plan(&rs(1, 0), &pods, ts(100));
        assert_eq!(
            names(&p.delete),
            [
                "unscheduled-new",
                "unscheduled-old",
                "pending",
                "unknown",
                "running",
                "new-ready",
                "restarty",
            ]
        );
    }

    #[test]
    fn availability_waits_for_min_ready_seconds() {
        let pods = arcs(vec![
            with(pod("a", true, 1), Some("n"), "Running", Some(10), 0),
            with(pod("b", true, 1), Some("n"), "Running", Some(95), 0),
            with(pod("c", true, 1), Some("n"), "Running", None, 0),
        ]);
        let p = plan(&rs(3, 30), &pods, ts(100));
        assert_eq!(p.status.ready_replicas, Some(2));
        assert_eq!(p.status.available_replicas, Some(1));
        assert_eq!(p.requeue, Some(Duration::from_secs(25)));
        let p = plan(&rs(3, 0), &pods, ts(100));
        assert_eq!(p.status.available_replicas, Some(2));
        assert_eq!(p.requeue, None);
    }

    #[test]
    fn replica_failure_condition_comes_and_goes() {
        let now = Time(ts(100));
        let set = conditions(&[], Some(("FailedCreate", "quota".into())), &now);
        assert_eq!(set.len(), 1);
        assert_eq!(set[0].reason.as_deref(), Some("FailedCreate"));
        let later = conditions(&set, Some(("FailedCreate", "quota".into())), &Time(ts(200)));
        assert_eq!(later, set);
        assert!(conditions(&set, None, &now).is_empty());
    }

    #[test]
    fn omitted_zero_counts_are_the_same_status() {
        let p = plan(&rs(0, 0), &[], ts(100));
        let stored = ReplicaSetStatus {
            replicas: 0,
            observed_generation: Some(3),
            conditions: Some(Vec::new()),
            ..Default::default()
        };
        assert!(same_status(&p.status, &stored));
        let older = ReplicaSetStatus {
            observed_generation: Some(2),
            ..stored
        };
        assert!(!same_status(&p.status, &older));
    }

    #[test]
    fn expectations_block_until_observed() {
        let e = Expectations::default();
        let k = ObjectKey::new(Some("default"), "web");
        assert!(e.satisfied(&k));
        e.expect(&k, 2, HashSet::new());
        assert!(!e.satisfied(&k));
        e.creation_observed(&k, 1);
        assert!(!e.satisfied(&k));
        e.creation_observed(&k, 1);
        assert!(e.satisfied(&k));
        e.expect(&k, 0, ["u1".to_string()].into());
        assert!(!e.satisfied(&k));
        e.deletion_observed(&k, "u1");
        assert!(e.satisfied(&k));
    }

    #[test]
    fn an_interrupted_reconciles_expectations_expire_after_a_grace() {
        let e = Expectations::default();
        let k = ObjectKey::new(Some("default"), "web");
        e.expect(&k, 3, HashSet::new());
        assert!(e.expires_in(&k).unwrap() > crate::expectations::INTERRUPTED_GRACE);
        e.interrupted(&k);
        // Still trusted for the grace (a create it sent may yet be observed) ...
        assert!(!e.satisfied(&k));
        let left = e.expires_in(&k).unwrap();
        assert!(left <= crate::expectations::INTERRUPTED_GRACE, "{left:?}");
        // ... and a second interruption does not extend it.
        e.interrupted(&k);
        assert!(e.expires_in(&k).unwrap() <= left);
        // Observed writes still count as before.
        e.creation_observed(&k, 3);
        assert!(e.satisfied(&k));
        assert_eq!(e.expires_in(&k), None);
    }
}
