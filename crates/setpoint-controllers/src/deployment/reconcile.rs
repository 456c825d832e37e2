//! The I/O half of the Deployment controller: reads a Deployment and the ReplicaSets it
//! controls from the informer caches, adopts orphaned ReplicaSets its selector matches, asks
//! [`plan`] what to do and carries that out through the API.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;
use setpoint_runtime::client::{Api, Client, DeleteParams, Patch, PatchParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

use super::sync::{bare, owner_reference};
use super::{plan, NAME, REVISION};

/// Whether the deployment's selector matches these labels (`matchLabels` and the
/// `matchExpressions` operators).
fn selects(d: &Deployment, labels: &BTreeMap<String, String>) -> bool {
    let Some(sel) = d.spec.as_ref().map(|s| &s.selector) else {
        return false;
    };
    let labels_ok = sel.match_labels.as_ref().is_some_and(|m| !m.is_empty())
        || sel
            .match_expressions
            .as_ref()
            .is_some_and(|e| !e.is_empty());
    labels_ok
        && sel
            .match_labels
            .iter()
            .flatten()
            .all(|(k, v)| labels.get(k) == Some(v))
        && sel.match_expressions.iter().flatten().all(|e| {
            let vals = e.values.clone().unwrap_or_default();
            match e.operator.as_str() {
                "In" => labels.get(&e.key).is_some_and(|v| vals.contains(v)),
                "NotIn" => labels.get(&e.key).is_none_or(|v| !vals.contains(v)),
                "Exists" => labels.contains_key(&e.key),
                "DoesNotExist" => !labels.contains_key(&e.key),
                _ => false,
            }
        })
}

/// The field manager of the controller's writes, as Kubernetes names it.
pub const FIELD_MANAGER: &str = "kube-controller-manager";

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

fn write_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// The reconciler of Deployments.
pub struct DeploymentController {
    client: Client,
    deployments: Store<Deployment>,
    replica_sets: Store<ReplicaSet>,
    events: EventRecorder,
}

#[async_trait::async_trait]
impl Reconciler for DeploymentController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(d) = self.deployments.get(key) else {
            return Ok(Action::Done);
        };
        if d.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        let uid = d.metadata.uid.clone().unwrap_or_default();
        let rs_api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
        let mut owned: Vec<ReplicaSet> = self
            .replica_sets
            .by_owner(&uid)
            .iter()
            .filter(|rs| {
                rs.metadata.deletion_timestamp.is_none()
                    && rs
                        .metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|r| r.uid == uid && r.controller == Some(true))
            })
            .map(|rs| (**rs).clone())
            .collect();
        // Adopt matching orphans.
        for rs in self.replica_sets.orphans_in(&ns) {
            let orphan = !rs
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.controller == Some(true));
            if orphan
                && rs.metadata.deletion_timestamp.is_none()
                && selects(&d, &rs.metadata.labels.clone().unwrap_or_default())
            {
                let mut refs = rs.metadata.owner_references.clone().unwrap_or_default();
                refs.push(owner_reference(&d));
                let patch = json!({"metadata": {
                    "ownerReferences": refs,
                    "resourceVersion": rs.metadata.resource_version,
                }});
                match rs_api
                    .patch(&rs.name(), &write_params(), &Patch::Merge(patch))
                    .await
                {
                    Ok(adopted) => owned.push(adopted),
                    Err(e) if e.is_not_found() || e.is_conflict() => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let now = Time(crate::now());
        let p = plan(&d, &owned, &now);
        if ctx.recording() {
            let want = setpoint_api::replicas::or_default(d.spec.as_ref().and_then(|s| s.replicas));
            let sets: Vec<String> = owned
                .iter()
                .map(|rs| {
                    let n = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
                    let have = rs.status.as_ref().map_or(0, |s| s.replicas);
                    format!("{} {have}/{n}", rs.name())
                })
                .collect();
            ctx.observe(format!(
                "{want} desired; ReplicaSets (pods/replicas): {}",
                if sets.is_empty() {
                    "none".to_string()
                } else {
                    sets.join(", ")
                }
            ));
        }
        if let Some(rs) = &p.create {
            let name = rs.metadata.name.as_deref().unwrap_or_default();
            ctx.action(
                format!("create ReplicaSet {name}"),
                "no ReplicaSet has the Deployment's pod template",
            );
        }
        if !p.updates.is_empty() && ctx.recording() {
            let strategy = d
                .spec
                .as_ref()
                .and_then(|s| s.strategy.as_ref())
                .and_then(|s| s.type_.as_deref())
                .unwrap_or("RollingUpdate");
            for u in &p.updates {
                ctx.action(
                    format!("set ReplicaSet {} to {} replicas", u.name, u.replicas),
                    format!(
                        "the {strategy} strategy's next step (new ReplicaSet up, old ones down)"
                    ),
                );
            }
        }
        let reference = d.object_reference();
        let dapi: Api<Deployment> = Api::namespaced(self.client.clone(), &ns);
        if let Some(rs) = &p.create {
            match rs_api
                .create(
                    &PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    rs,
                )
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_already_exists() => {
                    // Ours with this template (the cache is behind): just look again.
                    let name = rs.metadata.name.clone().unwrap_or_default();
                    if let Some(existing) = rs_api.get_opt(&name).await? {
                        let ours = existing
                            .metadata
                            .owner_references
                            .iter()
                            .flatten()
                            .any(|r| r.uid == uid && r.controller == Some(true));
                        let same = bare(existing.spec.as_ref().and_then(|s| s.template.as_ref()))
                            == bare(rs.spec.as_ref().and_then(|s| s.template.as_ref()));
                        if ours && same {
                            return Ok(Action::RequeueAfter(Duration::from_millis(100)));
                        }
                    }
                    // Another ReplicaSet holds the name: bump the collision count.
                    let count = d
                        .status
                        .as_ref()
                        .and_then(|s| s.collision_count)
                        .unwrap_or(0)
                        + 1;
                    // An update, as upstream's controller writes (its role grants no patch
                    // of deployments/status).
                    let mut next = (*d).clone();
                    next.status
                        .get_or_insert_with(Default::default)
                        .collision_count = Some(count);
                    dapi.replace_status(&d.name(), &post_params(), &next)
                        .await?;
                    // The status write's own event brings the Deployment back.
                    return Ok(Action::Done);
                }
                Err(e) => return Err(e.into()),
            }
        }
        for u in &p.updates {
            let patch = json!({
                "metadata": {"annotations": u.annotations},
                "spec": {"replicas": u.replicas},
            });
            match rs_api
                .patch(&u.name, &write_params(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        for m in &p.events {
            self.events
                .publish(&reference, EventType::Normal, "ScalingReplicaSet", m);
        }
        for name in &p.delete {
            match rs_api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut resource_version = d.metadata.resource_version.clone();
        // The revision annotation and the status are written with updates guarded by the
        // resourceVersion, as upstream's controller writes them: its role
        // (`system:controller:deployment-controller`) grants update, not patch, of
        // deployments and their status.
        if let Some(rev) = &p.revision {
            let mut next = (*d).clone();
            next.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(REVISION.to_string(), rev.clone());
            next.metadata.resource_version = resource_version.clone();
            let updated = dapi.replace(&d.name(), &post_params(), &next).await?;
            resource_version = updated.metadata.resource_version;
        }
        if let Some(st) = &p.status {
            let mut next = (*d).clone();
            let mut status = st.clone();
            if status.collision_count.is_none() {
                status.collision_count = d.status.as_ref().and_then(|s| s.collision_count);
            }
            next.status = Some(status);
            // Guarded by the resourceVersion: conditions written by others since the cache
            // was filled must not be lost.
            next.metadata.resource_version = resource_version;
            match dapi.replace_status(&d.name(), &post_params(), &next).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                // Changed meanwhile: the newer version's event queues this key again. Asking
                // for an immediate retry instead would spin on the stale cache until it
                // catches up — and a loaded server's caches lag most.
                Err(e) if e.is_conflict() => return Ok(Action::Done),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(match p.requeue {
            Some(d) => Action::RequeueAfter(d),
            None => Action::Done,
        })
    }
}

/// Builds the Deployment controller.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = DeploymentController {
        events: EventRecorder::new(client.clone(), Reporter::new("deployment-controller")),
        client,
        deployments: informers.typed::<Deployment>(Scope::all()).store(),
        replica_sets: informers.typed::<ReplicaSet>(Scope::all()).store(),
    };
    Controller::for_type::<Deployment>(NAME, informers, None)
        .owns::<Deployment, ReplicaSet>(None)
        .build(Arc::new(reconciler))
}
