//! The storage protection controllers (upstream's `pvc-protection` and `pv-protection`): a
//! claim being deleted keeps `kubernetes.io/pvc-protection` while a pod that is not finished
//! uses it, and a volume being deleted keeps `kubernetes.io/pv-protection` while it is bound.
//! The API server adds both finalizers on create.
//!
//! [`claim_in_use`] and [`volume_in_use`] are the pure decisions.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use serde_json::{json, Value};
use setpoint_api::storage as st;
use setpoint_runtime::client::{Api, Client, ListParams, Patch, PatchParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::ObjectKey;

/// The claim protection controller's name.
pub const PVC_NAME: &str = "pvc-protection";
/// The volume protection controller's name.
pub const PV_NAME: &str = "pv-protection";

/// Whether any of `pods` (of the claim's namespace) uses the claim `name`: a pod that has not
/// finished (upstream counts pods neither `Succeeded` nor `Failed`).
pub fn claim_in_use(name: &str, pods: &[Value]) -> bool {
    pods.iter().any(|pod| {
        let phase = pod
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        !matches!(phase, "Succeeded" | "Failed") && st::pod_claims(pod).iter().any(|c| c == name)
    })
}

/// Whether a volume is in use: upstream's rule is simply that it is `Bound`.
pub fn volume_in_use(pv: &Value) -> bool {
    pv.pointer("/status/phase").and_then(Value::as_str) == Some("Bound")
}

fn has_finalizer(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    f: &str,
) -> bool {
    meta.finalizers
        .as_ref()
        .is_some_and(|fs| fs.iter().any(|x| x == f))
}

/// A JSON patch removing `finalizer`, guarded by a test of the list as read (so a concurrent
/// change to the finalizers makes it fail rather than drop someone else's).
fn remove_finalizer(finalizers: &[String], finalizer: &str) -> Patch {
    let kept: Vec<&String> = finalizers.iter().filter(|f| *f != finalizer).collect();
    Patch::Json(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
        {"op": "replace", "path": "/metadata/finalizers", "value": kept},
    ]))
}

fn to_value<T: k8s_openapi::serde::Serialize>(obj: &T) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

struct ClaimProtection {
    client: Client,
    claims: Store<PersistentVolumeClaim>,
    pods: Store<Pod>,
}

#[async_trait::async_trait]
impl Reconciler for ClaimProtection {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(claim) = self.claims.get(key) else {
            ctx.observe("the claim is gone");
            return Ok(Action::Done);
        };
        if claim.metadata.deletion_timestamp.is_none() {
            ctx.observe("not being deleted: nothing to do");
            return Ok(Action::Done);
        }
        if !has_finalizer(&claim.metadata, st::PVC_PROTECTION_FINALIZER) {
            ctx.observe(format!(
                "being deleted; {} is already removed",
                st::PVC_PROTECTION_FINALIZER
            ));
            return Ok(Action::Done);
        }
        let ns = key.namespace.clone().unwrap_or_default();
        let cached: Vec<Value> = self
            .pods
            .by_namespace(&ns)
            .iter()
            .map(|p| to_value(p.as_ref()))
            .collect();
        if claim_in_use(&key.name, &cached) {
            ctx.observe("being deleted; an unfinished pod uses it (cache): kept");
            return Ok(Action::Done);
        }
        // The cache may not have a pod created moments ago: confirm with a live list before
        // letting the claim go, as upstream does.
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let live: Vec<Value> = pods
            .list(&ListParams::default())
            .await
            .map_err(ReconcileError::from)?
            .items
            .iter()
            .map(to_value)
            .collect();
        if claim_in_use(&key.name, &live) {
            ctx.observe(
                "being deleted; an unfinished pod uses it (live list, not yet cached): kept",
            );
            return Ok(Action::Done);
        }
        ctx.observe(format!(
            "being deleted; no unfinished pod uses it ({} pod(s) in the namespace, listed live)",
            live.len()
        ));
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let finalizers = claim.metadata.finalizers.clone().unwrap_or_default();
        let patch = remove_finalizer(&finalizers, st::PVC_PROTECTION_FINALIZER);
        ctx.action(
            format!("remove finalizer {}", st::PVC_PROTECTION_FINALIZER),
            "the claim is being deleted and no pod that has not finished uses it",
        );
        match api.patch(&key.name, &PatchParams::default(), &patch).await {
            Ok(_) => Ok(Action::Done),
            Err(e) if e.is_not_found() => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

struct VolumeProtection {
    client: Client,
    volumes: Store<PersistentVolume>,
}

#[async_trait::async_trait]
impl Reconciler for VolumeProtection {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(volume) = self.volumes.get(key) else {
            ctx.observe("the volume is gone");
            return Ok(Action::Done);
        };
        let phase = volume
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("none");
        if volume.metadata.deletion_timestamp.is_none() {
            ctx.observe(format!("phase {phase}, not being deleted: nothing to do"));
            return Ok(Action::Done);
        }
        if !has_finalizer(&volume.metadata, st::PV_PROTECTION_FINALIZER) {
            ctx.observe(format!(
                "phase {phase}, being deleted; {} is already removed",
                st::PV_PROTECTION_FINALIZER
            ));
            return Ok(Action::Done);
        }
        if volume_in_use(&to_value(volume.as_ref())) {
            ctx.observe(format!(
                "phase {phase}, being deleted; in use (Bound): kept"
            ));
            return Ok(Action::Done);
        }
        ctx.observe(format!("phase {phase}, being deleted"));
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        let finalizers = volume.metadata.finalizers.clone().unwrap_or_default();
        let patch = remove_finalizer(&finalizers, st::PV_PROTECTION_FINALIZER);
        ctx.action(
            format!("remove finalizer {}", st::PV_PROTECTION_FINALIZER),
            format!("the volume is being deleted and not Bound (phase {phase})"),
        );
        match api.patch(&key.name, &PatchParams::default(), &patch).await {
            Ok(_) => Ok(Action::Done),
            Err(e) if e.is_not_found() => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

/// The claim protection controller: claims, re-checked when a pod that uses them changes.
pub fn claim_controller(client: Client, informers: &SharedInformers) -> Controller {
    let claims = informers
        .typed::<PersistentVolumeClaim>(Scope::all())
        .store();
    let reconciler = ClaimProtection {
        client,
        claims,
        pods: informers.typed::<Pod>(Scope::all()).store(),
    };
    Controller::for_type::<PersistentVolumeClaim>(PVC_NAME, informers, None)
        .watches::<Pod>(None, |pod: &Pod| {
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            st::pod_claims(&to_value(pod))
                .iter()
                .map(|c| ObjectKey::new(Some(&ns), c))
                .collect()
        })
        .build(Arc::new(reconciler))
}

/// The volume protection controller.
pub fn volume_controller(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = VolumeProtection {
        client,
        volumes: informers.typed::<PersistentVolume>(Scope::all()).store(),
    };
    Controller::for_type::<PersistentVolume>(PV_NAME, informers, None).build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unfinished_pods_keep_a_claim() {
        let pod = |phase: &str| {
            json!({"metadata": {"name": "p"}, "status": {"phase": phase},
                   "spec": {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}})
        };
        assert!(claim_in_use("data", &[pod("Running")]));
        assert!(claim_in_use("data", &[pod("Pending")]));
        assert!(!claim_in_use("data", &[pod("Succeeded"), pod("Failed")]));
        assert!(!claim_in_use("other", &[pod("Running")]));
    }

    #[test]
    fn bound_volumes_are_in_use() {
        assert!(volume_in_use(&json!({"status": {"phase": "Bound"}})));
        assert!(!volume_in_use(&json!({"status": {"phase": "Released"}})));
    }

    #[test]
    fn finalizer_removal_keeps_the_others() {
        let fs = vec!["a".to_string(), st::PVC_PROTECTION_FINALIZER.to_string()];
        let Patch::Json(ops) = remove_finalizer(&fs, st::PVC_PROTECTION_FINALIZER) else {
            panic!("a JSON patch");
        };
        assert_eq!(ops[1]["value"], json!(["a"]));
    }
}
