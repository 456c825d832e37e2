//! The garbage collector: cascading deletion driven by `ownerReferences`.
//!
//! The owner graph is not kept as separate state: it is read from the informers' caches,
//! whose built-in owner index maps an owner's uid to its dependents. One controller handles
//! every watched resource; its keys carry the resource (`configmaps/name`,
//! `deployments.apps/name`) so that one work queue serves them all. A reconcile looks at one
//! object in two roles:
//!
//! - **as an owner being deleted** ([`decide_owner`]): with finalizer `orphan`, strip the
//!   owner references to it from its dependents and drop the finalizer; with
//!   `foregroundDeletion`, delete its dependents (foreground themselves) and drop the
//!   finalizer once no dependent with `blockOwnerDeletion` remains;
//! - **as a dependent** ([`decide_dependent`]): when none of its owners exists any more (or
//!   exists with another uid), delete it — this is background deletion; when some owners
//!   are gone but others remain, remove the references to the gone ones.
//!
//! Events wake the object itself, its owners (a foreground owner waits for its dependents)
//! and its dependents (an owner's disappearance orphans them).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{json, Value};
use setpoint_runtime::client::{
    Api, ApiResource, Client, ClientError, DeleteParams, DynamicObject, Patch, PatchParams,
};
use setpoint_runtime::controller::{
    Action, Context, Controller, ControllerMetrics, ControllerOptions, ReconcileError, Reconciler,
    Source,
};
use setpoint_runtime::decision;
use setpoint_runtime::informer::{Event, Handler, Informer, Scope, SharedInformers, Store};
use setpoint_runtime::workqueue::WorkQueue;
use setpoint_runtime::{Object, ObjectKey};

use crate::discovery::{self, resource_id};

/// The finalizer of an owner deleted with `propagationPolicy: Foreground`.
pub const FOREGROUND: &str = "foregroundDeletion";
/// The finalizer of an owner deleted with `propagationPolicy: Orphan`.
pub const ORPHAN: &str = "orphan";
/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "garbagecollector";

/// Resources the collector leaves alone even when served, as upstream's: events are
/// short-lived and expire by themselves. Leases are collected: a node's Lease is owned by its
/// Node and goes with it. Their frequent renewals cost the collector little, since an update
/// that leaves ownership unchanged is dropped at once (`ownership_changed`).
pub const IGNORED: &[(&str, &str)] = &[("", "events"), ("events.k8s.io", "events")];

/// How long an owner waiting for its dependents goes without a re-check when no event
/// arrives (events normally wake it first).
const WAIT_RECHECK: Duration = Duration::from_secs(5);
/// How soon to look again while the caches are still filling.
const SYNC_RECHECK: Duration = Duration::from_millis(100);
/// How soon to judge again an object whose write was refused because it changed since the
/// cache showed it: the cache then holds the change, or soon will. (An update that changes
/// nothing ownership-related does not enqueue the object, so no event would bring it back.)
const STALE_RECHECK: Duration = Duration::from_millis(50);

/// What the collector found about the owner one owner reference names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerState {
    /// The owner exists with the referenced uid and is not waiting for its dependents.
    Present,
    /// The owner exists and is being deleted in the foreground: it waits for its
    /// dependents.
    WaitingForDependents,
    /// No object with that name and uid exists.
    Absent,
    /// The owner's kind is not one the collector watches: it is never treated as gone.
    Unknown,
}

/// What to do with an object as a dependent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DependentAction {
    /// Leave it alone.
    Keep,
    /// Remove the owner references with these uids (some owners remain).
    RemoveOwnerReferences(Vec<String>),
    /// Delete it with this propagation policy.
    Delete(&'static str),
}

/// The pure decision for an object as a dependent: `refs` pairs each of its owner
/// references with what was found about that owner; `has_dependents` says whether the
/// object itself owns anything; `finalizers` are its own finalizers.
pub fn decide_dependent(
    refs: &[(OwnerReference, OwnerState)],
    has_dependents: bool,
    finalizers: &[String],
) -> DependentAction {
    let uids = |want: OwnerState| {
        refs.iter()
            .filter(move |(_, s)| *s == want)
            .map(|(r, _)| r.uid.clone())
    };
    let solid = refs
        .iter()
        .any(|(_, s)| matches!(s, OwnerState::Present | OwnerState::Unknown));
    let dangling: Vec<String> = uids(OwnerState::Absent).collect();
    let waiting: Vec<String> = uids(OwnerState::WaitingForDependents).collect();
    if refs.is_empty() || (dangling.is_empty() && waiting.is_empty()) {
        return DependentAction::Keep;
    }
    if solid {
        // Another owner still wants the object: only the references to gone owners, or to
        // owners being deleted in the foreground (which must not wait on it), go.
        return DependentAction::RemoveOwnerReferences(
            dangling.into_iter().chain(waiting).collect(),
        );
    }
    if !waiting.is_empty() && has_dependents {
        // The owner waits in the foreground: this object's own dependents go first, too.
        return DependentAction::Delete("Foreground");
    }
    let has = |f: &str| finalizers.iter().any(|x| x == f);
    DependentAction::Delete(if has(ORPHAN) {
        "Orphan"
    } else if has(FOREGROUND) {
        "Foreground"
    } else {
        "Background"
    })
}

/// A dependent as an owner being deleted sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DependentView {
    /// Its reference to the owner has `blockOwnerDeletion: true`.
    pub blocks: bool,
    /// It already has a `deletionTimestamp`.
    pub deleting: bool,
}

/// What to do for an owner that is being deleted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerPlan {
    /// Dependents (indexes) whose reference to the owner must be removed.
    pub orphan: Vec<usize>,
    /// Dependents (indexes) to delete in the foreground.
    pub delete: Vec<usize>,
    /// The finalizer to remove from the owner once the above succeeded.
    pub remove_finalizer: Option<&'static str>,
    /// Blocking dependents remain: check again when they change.
    pub waiting: bool,
}

/// The pure decision for an owner that is being deleted, from its finalizers and its
/// dependents. `orphan` is handled before `foregroundDeletion`, as Kubernetes does.
pub fn decide_owner(finalizers: &[String], dependents: &[DependentView]) -> OwnerPlan {
    let has = |f: &str| finalizers.iter().any(|x| x == f);
    if has(ORPHAN) {
        return OwnerPlan {
            orphan: (0..dependents.len()).collect(),
            remove_finalizer: Some(ORPHAN),
            ..OwnerPlan::default()
        };
    }
    if has(FOREGROUND) {
        let delete = dependents
            .iter()
            .enumerate()
            .filter(|(_, d)| !d.deleting)
            .map(|(i, _)| i)
            .collect();
        let waiting = dependents.iter().any(|d| d.blocks);
        return OwnerPlan {
            delete,
            remove_finalizer: (!waiting).then_some(FOREGROUND),
            waiting,
            ..OwnerPlan::default()
        };
    }
    OwnerPlan::default()
}

/// The resources the collector watches when the server's discovery cannot be read: the
/// built-in kinds that carry owner references in practice.
pub fn builtin_resources() -> Vec<ApiResource> {
    use k8s_openapi::api::{apps::v1 as apps, batch::v1 as batch, core::v1 as core};
    vec![
        ApiResource::of::<core::Pod>(),
        ApiResource::of::<core::Service>(),
        ApiResource::of::<core::ConfigMap>(),
        ApiResource::of::<core::Secret>(),
        ApiResource::of::<core::Endpoints>(),
        ApiResource::of::<core::ServiceAccount>(),
        ApiResource::of::<core::PersistentVolumeClaim>(),
        ApiResource::of::<apps::ReplicaSet>(),
        ApiResource::of::<apps::Deployment>(),
        ApiResource::of::<apps::StatefulSet>(),
        ApiResource::of::<apps::DaemonSet>(),
        ApiResource::of::<apps::ControllerRevision>(),
        ApiResource::of::<batch::Job>(),
        ApiResource::of::<batch::CronJob>(),
    ]
}

/// The resources to collect: every served resource (custom ones included) that can be
/// listed, watched, patched and deleted, except [`IGNORED`]; the built-in list when
/// discovery fails.
pub async fn resources(client: &Client) -> Vec<ApiResource> {
    match discovery::served_resources(client).await {
        Ok(served) => served
            .into_iter()
            .filter(|r| {
                ["list", "watch", "patch", "delete"]
                    .iter()
                    .all(|v| r.supports(v))
            })
            .filter(|r| {
                !IGNORED
                    .iter()
                    .any(|(g, p)| r.resource.group == *g && r.resource.plural == *p)
            })
            .map(|r| r.resource)
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "discovery failed; collecting the built-in resources only");
            builtin_resources()
        }
    }
}

struct Watched {
    resource: ApiResource,
    id: String,
    informer: Informer<DynamicObject>,
    store: Store<DynamicObject>,
}

/// The watched resources and the lookups between them.
struct Graph {
    watched: Vec<Watched>,
    by_id: HashMap<String, usize>,
    by_kind: HashMap<(String, String), usize>,
}

impl Graph {
    fn new(informers: &SharedInformers, resources: &[ApiResource]) -> Graph {
        let mut watched = Vec::new();
        let mut by_id = HashMap::new();
        let mut by_kind = HashMap::new();
        for r in resources {
            let id = resource_id(r);
            if by_id.contains_key(&id) {
                continue;
            }
            // Metadata only, as upstream's collector does: owners and finalizers are all it
            // reads, and whole pods and events would cost many times the memory.
            let informer = informers.metadata(r, Scope::all());
            by_id.insert(id.clone(), watched.len());
            by_kind.insert((r.group.clone(), r.kind.clone()), watched.len());
            watched.push(Watched {
                resource: r.clone(),
                id,
                store: informer.store(),
                informer,
            });
        }
        Graph {
            watched,
            by_id,
            by_kind,
        }
    }

    fn synced(&self) -> bool {
        self.watched.iter().all(|w| w.store.has_synced())
    }

    /// The key of an object of watched resource `idx`.
    fn key(&self, idx: usize, namespace: Option<&str>, name: &str) -> ObjectKey {
        ObjectKey::new(namespace, &format!("{}/{name}", self.watched[idx].id))
    }

    /// Splits a key into its resource and the object's own key.
    fn parse(&self, key: &ObjectKey) -> Option<(usize, ObjectKey)> {
        let (id, name) = key.name.split_once('/')?;
        let idx = *self.by_id.get(id)?;
        Some((idx, ObjectKey::new(key.namespace.as_deref(), name)))
    }

    /// The watched resource an owner reference points into.
    fn owner_resource(&self, r: &OwnerReference) -> Option<usize> {
        let (group, _) = setpoint_api::resource::split_api_version(&r.api_version);
        self.by_kind
            .get(&(group.to_string(), r.kind.clone()))
            .copied()
    }

    /// The key of the owner an object's reference names.
    fn owner_key(&self, dependent_ns: Option<&str>, r: &OwnerReference) -> Option<ObjectKey> {
        let idx = self.owner_resource(r)?;
        let ns = if self.watched[idx].resource.namespaced {
            dependent_ns
        } else {
            None
        };
        Some(self.key(idx, ns, &r.name))
    }

    /// Every cached object (of any watched resource) with an owner reference to `uid`.
    fn dependents(&self, uid: &str) -> Vec<(usize, Arc<DynamicObject>)> {
        self.watched
            .iter()
            .enumerate()
            .flat_map(|(i, w)| w.store.by_owner(uid).into_iter().map(move |o| (i, o)))
            .collect()
    }

    /// Queues everything an event about `obj` (of resource `idx`) may concern.
    fn enqueue_related(&self, queue: &WorkQueue<ObjectKey>, idx: usize, obj: &DynamicObject) {
        let ns = obj.namespace();
        queue.add(self.key(idx, ns.as_deref(), &obj.name()));
        for r in obj.owner_references() {
            if let Some(k) = self.owner_key(ns.as_deref(), &r) {
                queue.add(k);
            }
        }
        if let Some(uid) = obj.uid() {
            for (i, d) in self.dependents(&uid) {
                queue.add(self.key(i, d.namespace().as_deref(), &d.name()));
            }
        }
    }
}

/// Holds an informer subscription until the source task is dropped.
struct Subscription {
    informer: Informer<DynamicObject>,
    id: setpoint_runtime::informer::HandlerId,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.informer.unsubscribe(self.id);
    }
}

fn source(graph: Arc<Graph>, idx: usize) -> Source {
    Box::new(move |queue: WorkQueue<ObjectKey>| {
        Box::pin(async move {
            let informer = graph.watched[idx].informer.clone();
            let g = graph.clone();
            let handler: Handler<DynamicObject> = Arc::new(move |ev: &Event<DynamicObject>| {
                if let Event::Updated { old, new } = ev {
                    // A resync hands over the same object: it asks for a pass regardless.
                    if !Arc::ptr_eq(old, new) && !ownership_changed(old, new) {
                        return;
                    }
                    // A reference removed by an update must still wake the old owner.
                    g.enqueue_related(&queue, idx, old);
                }
                g.enqueue_related(&queue, idx, ev.object());
            });
            let id = informer.subscribe(handler);
            let _subscription = Subscription { informer, id };
            std::future::pending::<()>().await;
        })
    })
}

/// Whether an update changed anything a collection decision reads: the object's identity, its
/// owner references, its deletion or its finalizers. Decisions about the object, its owners
/// and its dependents read nothing else of it, so an update that changes none of these (a
/// status write, a label, a scale) cannot change one; Kubernetes' graph builder acts on the
/// same transitions only.
fn ownership_changed(old: &DynamicObject, new: &DynamicObject) -> bool {
    const READ: [&str; 4] = [
        "/metadata/uid",
        "/metadata/ownerReferences",
        "/metadata/deletionTimestamp",
        "/metadata/finalizers",
    ];
    READ.iter().any(|p| old.0.pointer(p) != new.0.pointer(p))
}

fn finalizers(o: &DynamicObject) -> Vec<String> {
    o.0.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

/// A merge patch setting an object's owner references, guarded by its resourceVersion.
/// No references left removes the field, as Kubernetes clients expect (not an empty list).
fn owner_references_patch(kept: &[OwnerReference], resource_version: Option<String>) -> Patch {
    let refs = if kept.is_empty() {
        Value::Null
    } else {
        json!(kept)
    };
    Patch::Merge(json!({"metadata": {
        "ownerReferences": refs,
        "resourceVersion": resource_version,
    }}))
}

/// Outcomes of a foreground delete of a dependent that need nothing more: it went, or its
/// uid precondition failed (a new object took the name; its own events bring it here).
fn superseded(e: &ClientError) -> bool {
    e.is_not_found() || e.is_conflict()
}

/// The garbage collector's reconciler.
pub struct GarbageCollector {
    client: Client,
    graph: Arc<Graph>,
}

impl GarbageCollector {
    fn api(&self, idx: usize, namespace: Option<&str>) -> Api<DynamicObject> {
        Api::dynamic(
            self.client.clone(),
            &self.graph.watched[idx].resource,
            namespace,
        )
    }

    /// Finds out whether the owner a reference names exists. A cache miss is confirmed
    /// with a live read, because the cache may not yet hold an owner created a moment ago.
    async fn owner_state(
        &self,
        dependent_ns: Option<&str>,
        r: &OwnerReference,
    ) -> Result<OwnerState, ClientError> {
        let Some(idx) = self.graph.owner_resource(r) else {
            return Ok(OwnerState::Unknown);
        };
        let ns = if self.graph.watched[idx].resource.namespaced {
            dependent_ns
        } else {
            None
        };
        let classify = |o: &DynamicObject| {
            if o.uid().as_deref() != Some(r.uid.as_str()) {
                OwnerState::Absent
            } else if o.deletion_timestamp_set() && finalizers(o).iter().any(|f| f == FOREGROUND) {
                OwnerState::WaitingForDependents
            } else {
                OwnerState::Present
            }
        };
        let cached = self.graph.watched[idx]
            .store
            .get(&ObjectKey::new(ns, &r.name));
        if let Some(o) = &cached {
            if o.uid().as_deref() == Some(r.uid.as_str()) {
                return Ok(classify(o));
            }
        }
        Ok(match self.api(idx, ns).get_opt(&r.name).await? {
            Some(o) => classify(&o),
            None => OwnerState::Absent,
        })
    }

    /// The object's role as an owner being deleted.
    async fn reconcile_owner(
        &self,
        idx: usize,
        obj: &DynamicObject,
    ) -> Result<Action, ReconcileError> {
        let uid = obj.uid().unwrap_or_default();
        let dependents = self.graph.dependents(&uid);
        let views: Vec<DependentView> = dependents
            .iter()
            .map(|(_, d)| DependentView {
                blocks: d
                    .owner_references()
                    .iter()
                    .any(|r| r.uid == uid && r.block_owner_deletion == Some(true)),
                deleting: d.deletion_timestamp_set(),
            })
            .collect();
        let own_finalizers = finalizers(obj);
        let plan = decide_owner(&own_finalizers, &views);
        decision::observe_with(|| {
            format!(
                "{} being deleted, finalizers [{}]; {} dependent(s)",
                obj.name(),
                own_finalizers.join(", "),
                dependents.len()
            )
        });
        for &i in &plan.orphan {
            let (di, d) = &dependents[i];
            decision::action(
                format!("orphan {}", d.name()),
                "the owner is deleted with the orphan finalizer: drop the reference to it",
            );
            let kept: Vec<OwnerReference> = d
                .owner_references()
                .into_iter()
                .filter(|r| r.uid != uid)
                .collect();
            let patch = owner_references_patch(&kept, d.resource_version());
            match self
                .api(*di, d.namespace().as_deref())
                .patch(&d.name(), &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                // The dependent changed under us: its event brings us back here; the
                // finalizer must stay until every reference is gone.
                Err(e) => return Err(e.into()),
            }
        }
        for &i in &plan.delete {
            let (di, d) = &dependents[i];
            decision::action(
                format!("delete {} (foreground)", d.name()),
                "the owner is deleted in the foreground: its dependents go first",
            );
            let params = DeleteParams {
                propagation_policy: Some("Foreground".into()),
                precondition_uid: d.uid(),
                ..Default::default()
            };
            match self
                .api(*di, d.namespace().as_deref())
                .delete(&d.name(), &params)
                .await
            {
                Ok(_) => {}
                Err(e) if superseded(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(f) = plan.remove_finalizer {
            decision::action(
                format!("remove finalizer {f}"),
                "the owner's dependents are handled",
            );
            let rest: Vec<&String> = own_finalizers.iter().filter(|x| *x != f).collect();
            let rest = if rest.is_empty() {
                Value::Null
            } else {
                json!(rest)
            };
            let patch = Patch::Merge(json!({"metadata": {
                "finalizers": rest,
                "resourceVersion": obj.resource_version(),
            }}));
            match self
                .api(idx, obj.namespace().as_deref())
                .patch(&obj.name(), &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => {
                    tracing::info!(object = %obj.name(), finalizer = f, "dependents handled; finalizer removed");
                }
                Err(e) if e.is_not_found() => {}
                Err(e) if e.is_conflict() => return Ok(Action::RequeueAfter(STALE_RECHECK)),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(if plan.waiting {
            Action::RequeueAfter(WAIT_RECHECK)
        } else {
            Action::Done
        })
    }

    /// The object's role as a dependent.
    async fn reconcile_dependent(
        &self,
        idx: usize,
        obj: &DynamicObject,
    ) -> Result<Action, ReconcileError> {
        let refs = obj.owner_references();
        if refs.is_empty() {
            return Ok(Action::Done);
        }
        let ns = obj.namespace();
        let mut states = Vec::with_capacity(refs.len());
        for r in refs {
            let s = self.owner_state(ns.as_deref(), &r).await?;
            states.push((r, s));
        }
        let has_dependents = obj
            .uid()
            .is_some_and(|u| !self.graph.dependents(&u).is_empty());
        let api = self.api(idx, ns.as_deref());
        match decide_dependent(&states, has_dependents, &finalizers(obj)) {
            DependentAction::Keep => {}
            DependentAction::RemoveOwnerReferences(uids) => {
                decision::action(
                    format!(
                        "remove {} owner reference(s) from {}",
                        uids.len(),
                        obj.name()
                    ),
                    "those owners are gone while another owner remains",
                );
                let kept: Vec<OwnerReference> = states
                    .iter()
                    .map(|(r, _)| r)
                    .filter(|r| !uids.contains(&r.uid))
                    .cloned()
                    .collect();
                let patch = owner_references_patch(&kept, obj.resource_version());
                match api
                    .patch(&obj.name(), &PatchParams::default(), &patch)
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) if e.is_conflict() => return Ok(Action::RequeueAfter(STALE_RECHECK)),
                    Err(e) => return Err(e.into()),
                }
            }
            DependentAction::Delete(policy) => {
                decision::action(
                    format!("delete {} ({policy})", obj.name()),
                    "every owner it names is gone",
                );
                // Preconditions: delete exactly the version that was judged, so that a
                // reference removed meanwhile (orphaning) is never overtaken by this delete.
                let params = DeleteParams {
                    propagation_policy: Some(policy.into()),
                    precondition_uid: obj.uid(),
                    precondition_resource_version: obj.resource_version(),
                    ..Default::default()
                };
                match api.delete(&obj.name(), &params).await {
                    Ok(_) => {
                        tracing::info!(object = %obj.name(), policy, "owners gone; deleted dependent");
                    }
                    Err(e) if e.is_not_found() => {}
                    Err(e) if e.is_conflict() => return Ok(Action::RequeueAfter(STALE_RECHECK)),
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(Action::Done)
    }
}

#[async_trait::async_trait]
impl Reconciler for GarbageCollector {
    async fn reconcile(&self, _ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        // Decisions read dependents from the caches: before they hold a full list, "no
        // dependents" could be wrong (and an orphaned dependent would lose its owner).
        if !self.graph.synced() {
            return Ok(Action::RequeueAfter(SYNC_RECHECK));
        }
        let Some((idx, object_key)) = self.graph.parse(key) else {
            return Err(ReconcileError::terminal(format!("malformed key {key}")));
        };
        let Some(obj) = self.graph.watched[idx].store.get(&object_key) else {
            return Ok(Action::Done);
        };
        if obj.deletion_timestamp_set() {
            return self.reconcile_owner(idx, &obj).await;
        }
        self.reconcile_dependent(idx, &obj).await
    }
}

/// Builds the garbage collector over `resources` (see [`resources`]).
pub fn controller(
    client: Client,
    informers: &SharedInformers,
    resources: &[ApiResource],
) -> Controller {
    let graph = Arc::new(Graph::new(informers, resources));
    let sources = (0..graph.watched.len())
        .map(|i| source(graph.clone(), i))
        .collect();
    Controller::from_parts(
        NAME,
        WorkQueue::<ObjectKey>::builder(NAME),
        sources,
        Arc::new(GarbageCollector { client, graph }),
        ControllerOptions::default(),
        ControllerMetrics::new(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_identity_ownership_deletion_and_finalizers_concern_the_collector() {
        let base = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "1",
                "labels": {"app": "web"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "rs", "uid": "o1", "controller": true}]
            }
        });
        let with = |path: &str, v: Value| {
            let mut o = base.clone();
            let (parent, key) = path.rsplit_once('/').unwrap();
            o.pointer_mut(parent).unwrap()[key] = v;
            DynamicObject(o)
        };
        let old = DynamicObject(base.clone());
        // Status writes, label and version changes: nothing to decide anew.
        assert!(!ownership_changed(
            &old,
            &with("/metadata/resourceVersion", json!("2"))
        ));
        assert!(!ownership_changed(
            &old,
            &with("/metadata/labels", json!({"app": "db"}))
        ));
        assert!(!ownership_changed(&old, &old));
        // Each of these can change a decision about the object, an owner or a dependent.
        for (path, v) in [
            ("/metadata/uid", json!("u2")),
            ("/metadata/ownerReferences", json!([])),
            ("/metadata/deletionTimestamp", json!("2026-01-01T00:00:00Z")),
            ("/metadata/finalizers", json!([FOREGROUND])),
        ] {
            assert!(ownership_changed(&old, &with(path, v.clone())), "{path}");
            assert!(ownership_changed(&with(path, v), &old), "{path} back");
        }
    }

    fn owner_ref(uid: &str, block: bool) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: format!("owner-{uid}"),
            uid: uid.into(),
            controller: None,
            block_owner_deletion: block.then_some(true),
        }
    }

    #[test]
    fn dependent_with_a_live_owner_stays() {
        let refs = [(owner_ref("a", false), OwnerState::Present)];
        assert_eq!(decide_dependent(&refs, false, &[]), DependentAction::Keep);
        let refs = [(owner_ref("a", false), OwnerState::Unknown)];
        assert_eq!(decide_dependent(&refs, false, &[]), DependentAction::Keep);
        assert_eq!(decide_dependent(&[], false, &[]), DependentAction::Keep);
    }

    #[test]
    fn orphaned_dependent_is_deleted_in_the_background() {
        let refs = [(owner_ref("a", false), OwnerState::Absent)];
        assert_eq!(
            decide_dependent(&refs, false, &[]),
            DependentAction::Delete("Background")
        );
        assert_eq!(
            decide_dependent(&refs, true, &[ORPHAN.into()]),
            DependentAction::Delete("Orphan")
        );
    }

    #[test]
    fn dependent_with_some_owners_left_loses_only_the_dangling_references() {
        let refs = [
            (owner_ref("gone", false), OwnerState::Absent),
            (owner_ref("here", false), OwnerState::Present),
            (owner_ref("fg", true), OwnerState::WaitingForDependents),
        ];
        assert_eq!(
            decide_dependent(&refs, false, &[]),
            DependentAction::RemoveOwnerReferences(vec!["gone".into(), "fg".into()])
        );
    }

    #[test]
    fn dependent_of_a_foreground_owner_goes_in_the_foreground_when_it_owns_things() {
        let refs = [(owner_ref("fg", true), OwnerState::WaitingForDependents)];
        assert_eq!(
            decide_dependent(&refs, true, &[]),
            DependentAction::Delete("Foreground")
        );
        assert_eq!(
            decide_dependent(&refs, false, &[]),
            DependentAction::Delete("Background")
        );
    }

    #[test]
    fn foreground_owner_waits_for_blocking_dependents() {
        let deps = [
            DependentView {
                blocks: true,
                deleting: false,
            },
            DependentView {
                blocks: false,
                deleting: true,
            },
        ];
        let plan = decide_owner(&[FOREGROUND.into()], &deps);
        assert_eq!(plan.delete, vec![0]);
        assert!(plan.waiting);
        assert_eq!(plan.remove_finalizer, None);
        // Only non-blocking dependents left: the owner may go.
        let plan = decide_owner(&[FOREGROUND.into()], &deps[1..]);
        assert_eq!(plan.remove_finalizer, Some(FOREGROUND));
        assert!(!plan.waiting);
        let plan = decide_owner(&[FOREGROUND.into()], &[]);
        assert_eq!(plan.remove_finalizer, Some(FOREGROUND));
    }

    #[test]
    fn orphan_owner_strips_every_dependent_first() {
        let deps = [
            DependentView {
                blocks: true,
                deleting: false,
            },
            DependentView {
                blocks: false,
                deleting: false,
            },
        ];
        let plan = decide_owner(&[ORPHAN.into(), FOREGROUND.into()], &deps);
        assert_eq!(plan.orphan, vec![0, 1]);
        assert!(plan.delete.is_empty());
        assert_eq!(plan.remove_finalizer, Some(ORPHAN));
        // Someone else's finalizer: not the collector's business.
        assert_eq!(
            decide_owner(&["example.com/hold".into()], &deps),
            OwnerPlan::default()
        );
    }
}
