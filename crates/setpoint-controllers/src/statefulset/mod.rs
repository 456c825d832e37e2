//! The StatefulSet controller: pods with stable names and ordinals (`<set>-<ordinal>`), each
//! with its own claims (`<template>-<set>-<ordinal>`), created in order and removed in reverse
//! order, rolled to a new template from the highest ordinal down, with the templates'
//! history in ControllerRevisions.
//!
//! One module per concern, as upstream splits it:
//!
//! - `identity`: ordinals, names, the identity labels, `hostname`/`subdomain`, the pod and
//!   its claims made from the template;
//! - `history`: ControllerRevisions — the current and update revisions, rollbacks,
//!   collisions, `revisionHistoryLimit`;
//! - `plan`: the pure decision of a pass — what to create, delete and relabel, under
//!   `OrderedReady` or `Parallel`, `RollingUpdate` (`partition`, `maxUnavailable`) or
//!   `OnDelete`;
//! - `claims`: `persistentVolumeClaimRetentionPolicy` as the claims' owner references;
//! - `status`: the status counts and revisions;
//! - this module: the I/O — caches in, adoption, the plan's writes out, events.

pub mod claims;
pub mod history;
pub mod identity;
pub mod plan;
pub mod status;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodTemplateSpec};
use serde_json::json;
use setpoint_runtime::client::{Api, Client, DeleteParams, Patch, PatchParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

use identity::{ordinal_of, selector, selects};
use plan::At;

/// The controller's name (work queue, metrics, logs, `--controllers`).
pub const NAME: &str = "statefulset";
/// The reporter of its events.
pub const REPORTER: &str = "statefulset-controller";

/// The controller reference of an object, if any.
fn controller_uid(obj: &impl Object) -> Option<String> {
    obj.owner_references()
        .into_iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid)
}

/// Whether `claim` is named as one of `set`'s claims: `<template>-<set>-<ordinal>`.
fn is_claim_of(set: &StatefulSet, claim: &str) -> bool {
    let set_name = set.name();
    identity::claim_templates(set).iter().any(|t| {
        claim
            .strip_prefix(&t.name())
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|rest| ordinal_of(&set_name, rest))
            .is_some()
    })
}

/// Why a claim gets the owner references `refs` (for the decision record).
fn claim_refs_rule(
    set: &StatefulSet,
    pod: &Pod,
    ordinal: i32,
    refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
) -> String {
    let owned_by = |uid: Option<String>| uid.is_some_and(|u| refs.iter().any(|r| r.uid == u));
    if owned_by(pod.uid()) {
        format!(
            "persistentVolumeClaimRetentionPolicy whenScaled: Delete and {}: the claim goes with its pod",
            ordinal_outside(set, ordinal)
        )
    } else if owned_by(set.uid()) {
        "persistentVolumeClaimRetentionPolicy whenDeleted: Delete: the claim goes with the StatefulSet".into()
    } else {
        "persistentVolumeClaimRetentionPolicy Retain: the claim outlives its pod and the StatefulSet".into()
    }
}

/// The reconciler of StatefulSets.
pub struct StatefulSetController {
    client: Client,
    sets: Store<StatefulSet>,
    pods: Store<Pod>,
    revisions: Store<ControllerRevision>,
    claims: Store<PersistentVolumeClaim>,
    events: EventRecorder,
}

/// The member pods of a set after adoption and release.
struct Members {
    pods: Vec<Arc<Pod>>,
}

impl StatefulSetController {
    /// The set's pods: those it controls that still match (others are released), and matching
    /// orphans named as its members (adopted, as upstream's `ClaimPods`).
    async fn members(&self, set: &StatefulSet, api: &Api<Pod>) -> Members {
        let uid = set.uid().unwrap_or_default();
        let set_name = set.name();
        let sel = selector(set);
        let member = |p: &Pod| {
            selects(&sel, p.metadata.labels.as_ref()) && ordinal_of(&set_name, &p.name()).is_some()
        };
        let mut pods = Vec::new();
        for p in self.pods.by_owner(&uid) {
            if controller_uid(p.as_ref()).as_deref() != Some(uid.as_str()) {
                continue;
            }
            if member(&p) {
                pods.push(p);
            } else {
                let refs: Vec<serde_json::Value> = p
                    .owner_references()
                    .iter()
                    .filter(|r| r.uid != uid)
                    .filter_map(|r| serde_json::to_value(r).ok())
                    .collect();
                decision::action(
                    format!("release pod {}", p.name()),
                    "an owned pod no longer matches the selector or is not named <set>-<ordinal>",
                );
                crate::expectations::patch_owner_references(api, &p, refs, "release").await;
            }
        }
        if set.metadata.deletion_timestamp.is_none() {
            let ns = set.namespace().unwrap_or_default();
            for p in self.pods.orphans_in(&ns) {
                if p.metadata.deletion_timestamp.is_some() || !member(&p) {
                    continue;
                }
                let mut refs: Vec<serde_json::Value> = p
                    .owner_references()
                    .iter()
                    .filter_map(|r| serde_json::to_value(r).ok())
                    .collect();
                refs.push(identity::owner_reference(set));
                decision::action(
                    format!("adopt pod {}", p.name()),
                    "an orphan pod matches the selector and is named <set>-<ordinal>",
                );
                if crate::expectations::patch_owner_references(api, &p, refs, "adopt").await {
                    pods.push(p);
                }
            }
        }
        Members { pods }
    }

    /// Makes the claims of the set's pod with `ordinal` that do not exist yet. `Ok(false)`
    /// while one of them is still being deleted: the pod must wait for it to be gone.
    async fn create_claims(
        &self,
        set: &StatefulSet,
        ordinal: i32,
        api: &Api<PersistentVolumeClaim>,
    ) -> Result<bool, String> {
        let ns = set.namespace();
        let pod_name = identity::pod_name(&set.name(), ordinal);
        // The pod does not exist yet: only its name and ordinal matter to the policy.
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": pod_name}})).unwrap_or_default();
        let reference = set.object_reference();
        for mut claim in identity::new_claims(set, ordinal) {
            let name = claim.name();
            if let Some(existing) = self.claims.get(&ObjectKey::new(ns.as_deref(), &name)) {
                if existing.metadata.deletion_timestamp.is_some() {
                    tracing::info!(claim = %name, "waiting for the claim to be deleted before its pod is made");
                    decision::observe_with(|| {
                        format!("claim {name} is being deleted: pod {pod_name} waits for it to go")
                    });
                    return Ok(false);
                }
                continue;
            }
            if let Some(refs) = claims::wanted_refs(set, &claim, &pod, ordinal) {
                claim.metadata.owner_references = Some(refs);
            }
            decision::action(
                format!("create claim {name}"),
                format!("pod {pod_name} needs it (volumeClaimTemplates) and it does not exist"),
            );
            match api.create(&PostParams::default(), &claim).await {
                Ok(_) => self.events.publish(
                    &reference,
                    EventType::Normal,
                    "SuccessfulCreate",
                    &format!(
                        "create Claim {name} Pod {pod_name} in StatefulSet {} success",
                        set.name()
                    ),
                ),
                Err(e) if e.is_already_exists() => {}
                Err(e) => {
                    self.events.publish(
                        &reference,
                        EventType::Warning,
                        "FailedCreate",
                        &format!(
                            "create Claim {name} for Pod {pod_name} in StatefulSet {} failed error: {e}",
                            set.name()
                        ),
                    );
                    return Err(e.to_string());
                }
            }
        }
        Ok(true)
    }

    /// Creates the set's pod with `ordinal` from `template` at `revision`, after its claims;
    /// `rule` is why (for the decision record).
    #[allow(clippy::too_many_arguments)]
    async fn create_pod(
        &self,
        set: &StatefulSet,
        ordinal: i32,
        template: &PodTemplateSpec,
        revision: &str,
        pods: &Api<Pod>,
        claims: &Api<PersistentVolumeClaim>,
        rule: String,
    ) -> Result<(), String> {
        if !self.create_claims(set, ordinal, claims).await? {
            return Ok(());
        }
        let pod = identity::new_pod(set, template, ordinal, revision);
        let name = pod.name();
        let reference = set.object_reference();
        decision::action(format!("create pod {name} at revision {revision}"), rule);
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => {
                self.events.publish(
                    &reference,
                    EventType::Normal,
                    "SuccessfulCreate",
                    &format!("create Pod {name} in StatefulSet {} successful", set.name()),
                );
                Ok(())
            }
            // The cache has not seen it yet: the next pass will.
            Err(e) if e.is_already_exists() => Ok(()),
            Err(e) => {
                self.events.publish(
                    &reference,
                    EventType::Warning,
                    "FailedCreate",
                    &format!(
                        "create Pod {name} in StatefulSet {} failed error: {e}",
                        set.name()
                    ),
                );
                Err(e.to_string())
            }
        }
    }

    /// Deletes a pod (only the one with `uid`).
    async fn delete_pod(
        &self,
        set: &StatefulSet,
        d: &plan::Delete,
        pods: &Api<Pod>,
    ) -> Result<(), String> {
        let params = DeleteParams {
            precondition_uid: Some(d.uid.clone()),
            ..Default::default()
        };
        tracing::debug!(pod = %d.name, why = ?d.why, "deleting");
        let reference = set.object_reference();
        match pods.delete(&d.name, &params).await {
            Ok(_) => {
                self.events.publish(
                    &reference,
                    EventType::Normal,
                    "SuccessfulDelete",
                    &format!(
                        "delete Pod {} in StatefulSet {} successful",
                        d.name,
                        set.name()
                    ),
                );
                Ok(())
            }
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(()),
            Err(e) => {
                self.events.publish(
                    &reference,
                    EventType::Warning,
                    "FailedDelete",
                    &format!(
                        "delete Pod {} in StatefulSet {} failed error: {e}",
                        d.name,
                        set.name()
                    ),
                );
                Err(e.to_string())
            }
        }
    }

    /// Brings the claims of the member pods to the owner references the retention policy
    /// asks for; done before any pod is deleted, so a condemned pod's claims go with it.
    async fn retain_claims(
        &self,
        set: &StatefulSet,
        members: &[Arc<Pod>],
        api: &Api<PersistentVolumeClaim>,
    ) {
        let ns = set.namespace();
        let set_name = set.name();
        for p in members {
            let Some(ord) = ordinal_of(&set_name, &p.name()) else {
                continue;
            };
            for t in identity::claim_templates(set) {
                let name = identity::claim_name(&t.name(), &set_name, ord);
                let Some(claim) = self.claims.get(&ObjectKey::new(ns.as_deref(), &name)) else {
                    continue;
                };
                if claim.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                if let Some(refs) = claims::wanted_refs(set, &claim, p, ord) {
                    if decision::recording() {
                        decision::action(
                            format!("update claim {name} owner references"),
                            claim_refs_rule(set, p, ord, &refs),
                        );
                    }
                    // An update, as upstream's (its role updates claims, it does not patch
                    // them); the cached resourceVersion makes it fail if the claim changed.
                    let mut next = (*claim).clone();
                    next.metadata.owner_references = Some(refs);
                    if let Err(e) = api.replace(&name, &PostParams::default(), &next).await {
                        tracing::debug!(claim = %name, error = %e, "claim ownership update failed");
                    }
                }
            }
        }
    }

    /// The set's revisions: those it controls that its selector still matches (others are
    /// released), and orphans it matches (adopted), as upstream's `ClaimControllerRevisions`.
    async fn claim_revisions(
        &self,
        set: &StatefulSet,
        api: &Api<ControllerRevision>,
    ) -> Vec<Arc<ControllerRevision>> {
        let uid = set.uid().unwrap_or_default();
        let sel = selector(set);
        let to_json =
            |refs: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>| {
                refs.iter()
                    .filter_map(|r| serde_json::to_value(r).ok())
                    .collect::<Vec<_>>()
            };
        let mut out = Vec::new();
        for r in self.revisions.by_owner(&uid) {
            if controller_uid(r.as_ref()).as_deref() != Some(uid.as_str()) {
                continue;
            }
            if selects(&sel, r.metadata.labels.as_ref()) {
                out.push(r);
            } else {
                let refs = r
                    .owner_references()
                    .into_iter()
                    .filter(|o| o.uid != uid)
                    .collect();
                decision::action(
                    format!("release ControllerRevision {}", r.name()),
                    "an owned revision no longer matches the selector",
                );
                crate::expectations::patch_owner_references(
                    api,
                    r.as_ref(),
                    to_json(refs),
                    "revision release",
                )
                .await;
            }
        }
        if set.metadata.deletion_timestamp.is_none() {
            let ns = set.namespace().unwrap_or_default();
            for r in self.revisions.orphans_in(&ns) {
                if r.metadata.deletion_timestamp.is_some()
                    || !selects(&sel, r.metadata.labels.as_ref())
                {
                    continue;
                }
                let mut refs = to_json(r.owner_references());
                refs.push(identity::owner_reference(set));
                decision::action(
                    format!("adopt ControllerRevision {}", r.name()),
                    "an orphan revision matches the selector",
                );
                if crate::expectations::patch_owner_references(
                    api,
                    r.as_ref(),
                    refs,
                    "revision adoption",
                )
                .await
                {
                    out.push(r);
                }
            }
        }
        out
    }

    /// Writes the status, once more over a fresh read on a conflict (as upstream retries).
    async fn write_status(
        &self,
        set: &StatefulSet,
        status: k8s_openapi::api::apps::v1::StatefulSetStatus,
        api: &Api<StatefulSet>,
    ) -> Result<(), ReconcileError> {
        let mut next = set.clone();
        for attempt in 0..2 {
            next.status = Some(status.clone());
            match api
                .replace_status(&set.name(), &PostParams::default(), &next)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.is_conflict() && attempt == 0 => {
                    match api.get_opt(&set.name()).await? {
                        Some(fresh) => next = fresh,
                        None => return Ok(()),
                    }
                }
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Reconciler for StatefulSetController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(set) = self.sets.get(key) else {
            ctx.observe("the StatefulSet is gone");
            return Ok(Action::Done);
        };
        let ns = key.namespace.clone().unwrap_or_default();
        let pods_api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let claims_api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let revs_api: Api<ControllerRevision> = Api::namespaced(self.client.clone(), &ns);
        let sets_api: Api<StatefulSet> = Api::namespaced(self.client.clone(), &ns);
        let deleting = set.metadata.deletion_timestamp.is_some();

        let owned_revisions = self.claim_revisions(&set, &revs_api).await;
        let rev_refs: Vec<&ControllerRevision> =
            owned_revisions.iter().map(|r| r.as_ref()).collect();
        let resolved = history::resolve(&set, &rev_refs);
        if !deleting {
            if let Some(w) = &resolved.write {
                crate::history::write(&revs_api, w, "StatefulSet", &set.name()).await?;
            }
        }

        let members = self.members(&set, &pods_api).await;
        let member_refs: Vec<&Pod> = members.pods.iter().map(|p| p.as_ref()).collect();
        let now = crate::now();
        let plan = plan::plan(&set, &member_refs, &resolved.update, now);
        // The status the members imply (pure: computed here for the record, written below).
        let status = status::status(
            &set,
            &member_refs,
            &resolved.current,
            &resolved.update,
            resolved.collision_count,
            now,
        );
        if ctx.recording() {
            ctx.observe(observed(&set, &member_refs, &status));
            if deleting {
                ctx.observe("the StatefulSet is being deleted: no pod is created or deleted");
            } else if plan.create.is_empty() && plan.delete.is_empty() && plan::ordered(&set) {
                if let Some(wait) = ordered_wait(&set, &member_refs, now) {
                    ctx.observe(wait);
                }
            }
            if let Some(d) = plan.requeue {
                ctx.observe(format!(
                    "a Ready pod becomes available in {}s (minReadySeconds {}): look again then",
                    d.as_secs(),
                    plan::min_ready_seconds(&set)
                ));
            }
        }

        let mut failure: Option<String> = None;
        if !deleting {
            self.retain_claims(&set, &members.pods, &claims_api).await;
            for &ord in &plan.ensure_claims {
                if let Err(e) = self.create_claims(&set, ord, &claims_api).await {
                    failure.get_or_insert(e);
                }
            }
            for &(ord, at) in &plan.create {
                let (template, revision) = match at {
                    At::Current => (&resolved.current_template, &resolved.current),
                    At::Update => (&resolved.update_template, &resolved.update),
                };
                let rule = if ctx.recording() {
                    create_rule(&set, ord, at)
                } else {
                    String::new()
                };
                if let Err(e) = self
                    .create_pod(&set, ord, template, revision, &pods_api, &claims_api, rule)
                    .await
                {
                    failure.get_or_insert(e);
                }
            }
            for d in &plan.delete {
                if ctx.recording() {
                    ctx.action(
                        format!("delete pod {}", d.name),
                        delete_rule(&set, d, &member_refs, &resolved.update),
                    );
                }
                if let Err(e) = self.delete_pod(&set, d, &pods_api).await {
                    failure.get_or_insert(e);
                }
            }
            for (name, ord) in &plan.relabel {
                let labels: serde_json::Map<String, serde_json::Value> =
                    identity::identity_labels(&set.name(), *ord)
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), json!(v)))
                        .collect();
                let patch = Patch::Merge(json!({"metadata": {"labels": labels}}));
                ctx.action(
                    format!("patch pod {name} identity labels"),
                    format!(
                        "member pod {name} lacks its {} or {} label",
                        identity::POD_NAME_LABEL,
                        identity::POD_INDEX_LABEL
                    ),
                );
                if let Err(e) = pods_api.patch(name, &PatchParams::default(), &patch).await {
                    tracing::debug!(pod = %name, error = %e, "relabelling failed");
                }
            }
            for name in history::truncate(
                &set,
                &rev_refs,
                &member_refs,
                &resolved.current,
                &resolved.update,
            ) {
                if ctx.recording() {
                    ctx.action(
                        format!("delete ControllerRevision {name}"),
                        format!(
                            "beyond revisionHistoryLimit {}; neither the current nor the update revision, and no pod is at it",
                            set.spec
                                .as_ref()
                                .and_then(|s| s.revision_history_limit)
                                .unwrap_or(10)
                        ),
                    );
                }
                if let Err(e) = revs_api.delete(&name, &DeleteParams::default()).await {
                    if !e.is_not_found() {
                        tracing::debug!(revision = %name, error = %e, "history truncation failed");
                    }
                }
            }
        }

        if !status::same(&status, &set.status.clone().unwrap_or_default()) {
            ctx.action("update status", "the observed counts or revisions changed");
            self.write_status(&set, status, &sets_api).await?;
        }
        if let Some(e) = failure {
            return Err(ReconcileError::retry(e));
        }
        Ok(match plan.requeue {
            Some(d) => Action::RequeueAfter(d + Duration::from_millis(100)),
            None => Action::Done,
        })
    }
}

/// The summary of what a pass over `set` observed: its members' counts as `status` has them,
/// its revisions and its policies.
fn observed(
    set: &StatefulSet,
    members: &[&Pod],
    status: &k8s_openapi::api::apps::v1::StatefulSetStatus,
) -> String {
    let terminating = members.iter().filter(|p| status::is_terminating(p)).count();
    let current = status.current_revision.as_deref().unwrap_or_default();
    let update = status.update_revision.as_deref().unwrap_or_default();
    let revisions = if current == update {
        format!("revision {update}")
    } else {
        format!("current revision {current}, update revision {update}")
    };
    let policy = if plan::ordered(set) {
        "OrderedReady"
    } else {
        "Parallel"
    };
    let strategy = if plan::rolling(set) {
        format!(
            "RollingUpdate (partition {}, maxUnavailable {})",
            plan::partition(set),
            plan::max_unavailable(set)
        )
    } else {
        "OnDelete".to_string()
    };
    format!(
        "{} desired, {} pod(s) ({terminating} terminating), {} current, {} updated, {} ready, {} available; {revisions}; {policy}, {strategy}",
        identity::replicas(set),
        status.replicas,
        status.current_replicas.unwrap_or(0),
        status.updated_replicas.unwrap_or(0),
        status.ready_replicas.unwrap_or(0),
        status.available_replicas.unwrap_or(0),
    )
}

/// `ordinal N < R replicas`, or the range when ordinals do not start at 0.
fn ordinal_in_range(set: &StatefulSet, ordinal: i32) -> String {
    let start = identity::start_ordinal(set);
    let n = identity::replicas(set);
    if start == 0 {
        format!("ordinal {ordinal} < {n} replicas")
    } else {
        format!("ordinal {ordinal} in [{start}, {})", start + n)
    }
}

/// `ordinal N >= R replicas`, or outside the range when ordinals do not start at 0.
fn ordinal_outside(set: &StatefulSet, ordinal: i32) -> String {
    let start = identity::start_ordinal(set);
    let n = identity::replicas(set);
    if start == 0 {
        format!("ordinal {ordinal} >= {n} replicas")
    } else {
        format!("ordinal {ordinal} outside [{start}, {})", start + n)
    }
}

/// Why the plan creates the pod with `ordinal` (for the decision record).
fn create_rule(set: &StatefulSet, ordinal: i32, at: At) -> String {
    let range = ordinal_in_range(set, ordinal);
    let mut rule = if !plan::ordered(set) {
        format!("{range} has no pod (Parallel)")
    } else if ordinal == identity::start_ordinal(set) {
        format!("{range} has no pod and is the first (OrderedReady)")
    } else {
        let min_ready = plan::min_ready_seconds(set);
        format!(
            "{range} has no pod and {} and below are Running and Ready{} (OrderedReady)",
            identity::pod_name(&set.name(), ordinal - 1),
            if min_ready > 0 {
                format!(" for minReadySeconds {min_ready}")
            } else {
                String::new()
            }
        )
    };
    if at == At::Current {
        rule.push_str(&format!(
            "; below partition {}: at the current revision",
            plan::partition(set)
        ));
    }
    rule
}

/// Why the plan deletes `d` (for the decision record).
fn delete_rule(set: &StatefulSet, d: &plan::Delete, members: &[&Pod], update: &str) -> String {
    let pod = members.iter().find(|p| p.name() == d.name);
    let ordinal = ordinal_of(&set.name(), &d.name).unwrap_or_default();
    match d.why {
        plan::Why::Finished => format!(
            "the pod is {}: deleted to be made again",
            pod.and_then(|p| p.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("finished")
        ),
        plan::Why::Condemned => {
            let outside = ordinal_outside(set, ordinal);
            if plan::ordered(set) {
                format!("{outside}: scale down, highest ordinal first, one at a time once the others are Running and Ready (OrderedReady)")
            } else {
                format!("{outside}: scale down (Parallel)")
            }
        }
        plan::Why::Outdated => format!(
            "revision {} is not the update revision {update}, ordinal {ordinal} >= partition {}; at most {} unavailable (RollingUpdate, highest ordinal first)",
            pod.and_then(|p| identity::pod_revision(p)).unwrap_or("none"),
            plan::partition(set),
            plan::max_unavailable(set)
        ),
    }
}

/// Under `OrderedReady`, the pod a pass that does nothing waits for: the first in ordinal
/// order (then the condemned, highest first) that is terminating, not Running and Ready, or
/// not yet available.
fn ordered_wait(
    set: &StatefulSet,
    members: &[&Pod],
    now: k8s_openapi::jiff::Timestamp,
) -> Option<String> {
    let set_name = set.name();
    let min_ready = plan::min_ready_seconds(set);
    let mut by_ordinal: Vec<(i32, &Pod)> = members
        .iter()
        .filter_map(|p| Some((ordinal_of(&set_name, &p.name())?, *p)))
        .collect();
    by_ordinal.sort_by_key(|(o, _)| *o);
    let (in_range, mut condemned): (Vec<_>, Vec<_>) = by_ordinal
        .into_iter()
        .partition(|(o, _)| identity::in_range(set, *o));
    condemned.reverse();
    in_range.iter().chain(&condemned).find_map(|(_, p)| {
        let name = p.name();
        if status::is_terminating(p) {
            Some(format!("OrderedReady: waiting for {name} to terminate"))
        } else if !status::is_running_and_ready(p) {
            Some(format!(
                "OrderedReady: waiting for {name} to be Running and Ready"
            ))
        } else if status::available_in(p, min_ready, now).is_some() {
            Some(format!(
                "OrderedReady: waiting for {name} to be available (minReadySeconds {min_ready})"
            ))
        } else {
            None
        }
    })
}

/// The StatefulSet controller, reconciling a set when it, one of its pods, revisions or
/// claims, or an orphan pod its selector matches changes.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = StatefulSetController {
        events: EventRecorder::new(client.clone(), Reporter::new(REPORTER)),
        client,
        sets: informers.typed::<StatefulSet>(Scope::all()).store(),
        pods: informers.typed::<Pod>(Scope::all()).store(),
        revisions: informers.typed::<ControllerRevision>(Scope::all()).store(),
        claims: informers
            .typed::<PersistentVolumeClaim>(Scope::all())
            .store(),
    };
    let sets = informers.typed::<StatefulSet>(Scope::all()).store();
    let claim_sets = sets.clone();
    Controller::for_type::<StatefulSet>(NAME, informers, None)
        .owns::<StatefulSet, Pod>(None)
        .owns::<StatefulSet, ControllerRevision>(None)
        // An orphan wakes the sets of its namespace whose members it could be.
        .watches::<Pod>(None, move |pod: &Pod| {
            if controller_uid(pod).is_some() || pod.metadata.deletion_timestamp.is_some() {
                return Vec::new();
            }
            sets.by_namespace(&pod.namespace().unwrap_or_default())
                .iter()
                .filter(|s| {
                    ordinal_of(&s.name(), &pod.name()).is_some()
                        && selects(&selector(s), pod.metadata.labels.as_ref())
                })
                .map(|s| ObjectKey::of(s.as_ref()))
                .collect()
        })
        // A claim named for one of a set's pods wakes the set: a pod waiting for its claim
        // to be deleted, or a pending pod whose claim went away, goes on.
        .watches::<PersistentVolumeClaim>(None, move |claim: &PersistentVolumeClaim| {
            let name = claim.name();
            claim_sets
                .by_namespace(&claim.namespace().unwrap_or_default())
                .iter()
                .filter(|s| is_claim_of(s, &name))
                .map(|s| ObjectKey::of(s.as_ref()))
                .collect()
        })
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_recognised_by_template_set_and_ordinal() {
        let set: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {"selector": {}, "template": {}, "serviceName": "",
                     "volumeClaimTemplates": [{"metadata": {"name": "www"}}]}
        }))
        .unwrap();
        assert!(is_claim_of(&set, "www-web-0"));
        assert!(is_claim_of(&set, "www-web-12"));
        assert!(!is_claim_of(&set, "www-web-"));
        assert!(!is_claim_of(&set, "data-web-0"));
        assert!(!is_claim_of(&set, "www-webs-0"));
    }
}
