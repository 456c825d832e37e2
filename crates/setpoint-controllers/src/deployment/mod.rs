//! The Deployment controller: rolls a Deployment's pod template out through ReplicaSets.
//!
//! Each distinct pod template gets a ReplicaSet named `<deployment>-<pod-template-hash>`
//! (pods themselves are the ReplicaSet controller's business). [`plan`] is the pure decision
//! — which ReplicaSet to create, how to scale each one, which to delete and what status to
//! report — and [`DeploymentController`] carries it out.
//!
//! The decision is a few steps over one working view of the ReplicaSets (`pass`), one module
//! per concern, each readable on its own:
//!
//! - `sync`: the ReplicaSet of the current template — found (a rollback finds an old one) or
//!   created, its name from the template's hash, and hash collisions;
//! - `scale`: scaling without rollout progress — a changed `spec.replicas` spread over the
//!   active ReplicaSets in proportion, a paused Deployment, and the annotations recording
//!   what each ReplicaSet was scaled for;
//! - `rolling`: the `RollingUpdate` strategy — the new ReplicaSet up within `maxSurge`, the
//!   old ones down within `maxUnavailable`;
//! - `recreate`: the `Recreate` strategy — the old ReplicaSets to zero, then the new one up;
//! - `history`: revision numbers and `revisionHistoryLimit`;
//! - `progress`: the status — replica counts, the `Available` and `Progressing` conditions
//!   and the progress deadline;
//! - `reconcile`: the I/O — caches in, adoption of orphans, the plan's writes out.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus, ReplicaSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

mod history;
mod pass;
mod progress;
mod reconcile;
mod recreate;
pub(crate) mod rolling;
mod scale;
mod sync;
#[cfg(test)]
mod testing;

pub use reconcile::{controller, DeploymentController, FIELD_MANAGER};
pub use rolling::surge_and_unavailable;
pub use sync::template_hash;

use pass::{annotation, Pass};

/// The controller's name (work queue, metrics, logs, events).
pub const NAME: &str = "deployment";
/// The label (and name suffix) identifying a pod template.
pub const HASH_LABEL: &str = "pod-template-hash";
/// The revision annotation on ReplicaSets and Deployments.
pub const REVISION: &str = "deployment.kubernetes.io/revision";
/// The deployment's replicas when the ReplicaSet was last scaled.
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
/// The deployment's replicas plus surge when the ReplicaSet was last scaled.
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
/// The change cause copied from the deployment.
pub const CHANGE_CAUSE: &str = "kubernetes.io/change-cause";

/// A change to an existing ReplicaSet.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    /// The ReplicaSet's name.
    pub name: String,
    /// The new `spec.replicas`.
    pub replicas: i32,
    /// Annotations to set.
    pub annotations: BTreeMap<String, String>,
}

/// What one pass over a Deployment should do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// A ReplicaSet to create for the current template.
    pub create: Option<ReplicaSet>,
    /// Changes to existing ReplicaSets.
    pub updates: Vec<Update>,
    /// Old ReplicaSets to delete (beyond `revisionHistoryLimit`).
    pub delete: Vec<String>,
    /// The revision annotation the Deployment should carry, when it differs.
    pub revision: Option<String>,
    /// The status to write, when it differs.
    pub status: Option<DeploymentStatus>,
    /// `ScalingReplicaSet` event messages.
    pub events: Vec<String>,
    /// When to look again without any change (progress deadline).
    pub requeue: Option<Duration>,
}

/// The pure decision for one Deployment given the ReplicaSets it controls, at `now`.
pub fn plan(d: &Deployment, rses: &[ReplicaSet], now: &Time) -> Plan {
    let mut pass = Pass::new(d, rses);
    sync::find_or_create_new(&mut pass);
    // A changed `spec.replicas` is carried out alone: the rollout moves on in the next pass,
    // once the ReplicaSets are sized for the new count.
    if !scale::proportionally(&mut pass) {
        if pass.paused {
            scale::paused(&mut pass);
        } else if recreate::is_recreate(d) {
            recreate::rollout(&mut pass);
        } else {
            rolling::rollout(&mut pass);
        }
    }
    scale::record_targets(&mut pass);

    let mut out = Plan {
        delete: history::cleanup(&pass),
        ..Default::default()
    };
    for (i, v) in pass.views.iter().enumerate() {
        // A ReplicaSet this pass creates goes out whole, in `create`.
        if pass.created && Some(i) == pass.new_idx {
            continue;
        }
        if v.changed && !out.delete.contains(&v.name) {
            out.updates.push(Update {
                name: v.name.clone(),
                replicas: v.replicas,
                annotations: v.annotations.clone(),
            });
        }
    }
    if pass.created {
        let n = &pass.views[pass.new_idx.unwrap_or_default()];
        out.create = Some(sync::new_replica_set(d, n, &pass.collision_count));
    }
    if let Some(n) = pass.new_idx {
        let rev = pass.views[n].revision.to_string();
        if annotation(&d.metadata, REVISION) != Some(rev.as_str()) {
            out.revision = Some(rev);
        }
    }
    (out.status, out.requeue) = progress::status(&pass, now);
    out.events = pass.events;
    out
}

#[cfg(test)]
mod tests {
    use super::pass::{desired, spec_replicas};
    use super::testing::*;
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Random readiness per step and random mid-rollout changes (replicas, pause,
        /// image): no pass takes the pods beyond `replicas + maxSurge` or availability below
        /// `replicas - maxUnavailable` (unless it was already lower), and once unpaused every
        /// rollout ends on the latest template with the old ReplicaSets at 0.
        #[test]
        fn rollouts_stay_within_bounds_and_finish(
            replicas in 1i32..8,
            surge in 0i32..3,
            unavailable in 0i32..3,
            readiness in proptest::collection::vec(0i32..3, 40),
            changes in proptest::collection::vec((0usize..40, 0u8..4, 1i32..8), 0..5),
        ) {
            let mut d = deployment(replicas, "v0", rolling(json!(surge), json!(unavailable)));
            let mut m = Model::default();
            m.settle(&mut d);
            let mut image = 0;
            for (step, ready) in readiness.iter().enumerate() {
                for (at_step, kind, n) in &changes {
                    if *at_step == step {
                        match kind {
                            0 => d.spec.as_mut().unwrap().replicas = Some(*n),
                            1 => {
                                let s = d.spec.as_mut().unwrap();
                                s.paused = Some(!s.paused.unwrap_or(false));
                            }
                            _ => { image += 1; set_image(&mut d, &format!("v{image}")); }
                        }
                    }
                }
                let want = desired(&d);
                let (s, u) = surge_and_unavailable(&d);
                let (total_before, avail_before) = (m.total(), m.available());
                m.step(&mut d);
                prop_assert!(m.total() <= (want + s).max(total_before),
                    "total {} > {} + {}", m.total(), want, s);
                prop_assert!(m.available() >= (want - u).min(avail_before),
                    "available {} < {} - {} (was {})", m.available(), want, u, avail_before);
                m.ready(*ready);
            }
            d.spec.as_mut().unwrap().paused = None;
            m.settle(&mut d);
            let img = format!("v{image}");
            let want = desired(&d);
            for rs in &m.rses {
                let t = rs.spec.as_ref().unwrap().template.as_ref().unwrap();
                let current = t.spec.as_ref().unwrap().containers[0].image.as_deref() == Some(img.as_str());
                prop_assert_eq!(spec_replicas(rs), if current { want } else { 0 });
            }
            let reason = progressing(&d).reason;
            prop_assert_eq!(reason.as_deref(), Some("NewReplicaSetAvailable"));
        }
    }
}
