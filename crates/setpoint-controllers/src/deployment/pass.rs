//! The working view one pass of [`plan`](super::plan) decides on: every ReplicaSet as a
//! plain record the steps change in place (replicas, annotations, whether it changed), plus
//! what the steps learn on the way (the new ReplicaSet, events, the progress reason). Only
//! at the end is it turned into a [`Plan`](super::Plan), so each step sees what the earlier
//! ones decided.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus, ReplicaSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use setpoint_api::replicas;

use super::rolling::surge_and_unavailable;
use super::REVISION;

/// One ReplicaSet as a pass sees it.
#[derive(Clone, Debug)]
pub(super) struct Rs {
    pub(super) name: String,
    /// Its `spec.replicas`, as decided so far.
    pub(super) replicas: i32,
    /// Pods the ReplicaSet reports having (its status; may lag its spec either way).
    pub(super) pods: i32,
    /// Available pods it reports.
    pub(super) available: i32,
    pub(super) annotations: BTreeMap<String, String>,
    /// Whether this pass changed `replicas` or `annotations`, i.e. it must be written.
    pub(super) changed: bool,
    /// Creation time in seconds; `i64::MAX` for one this pass creates (the newest).
    pub(super) created: i64,
    /// Its revision annotation (0 when absent).
    pub(super) revision: i64,
}

/// The state the steps of one pass share.
pub(super) struct Pass<'a> {
    pub(super) d: &'a Deployment,
    /// The ReplicaSets as given: `views[i]` stands for `rses[i]`; a ReplicaSet this pass
    /// creates is the one view past their end.
    pub(super) rses: &'a [ReplicaSet],
    pub(super) spec: DeploymentSpec,
    pub(super) old_status: DeploymentStatus,
    /// `spec.replicas`.
    pub(super) replicas: i32,
    /// `maxSurge` and `maxUnavailable`, resolved against `replicas`.
    pub(super) surge: i32,
    pub(super) max_unavailable: i32,
    pub(super) paused: bool,
    /// The collision count to report (bumped when the new ReplicaSet's name is taken).
    pub(super) collision_count: Option<i32>,
    pub(super) views: Vec<Rs>,
    /// Indexes into `views`, oldest first.
    pub(super) order: Vec<usize>,
    /// The ReplicaSet of the current template, once found or created.
    pub(super) new_idx: Option<usize>,
    /// Whether `new_idx` is a ReplicaSet this pass creates.
    pub(super) created: bool,
    /// Why the rollout progressed in this pass: the `Progressing` reason and message.
    pub(super) progress: Option<(&'static str, String)>,
    /// `ScalingReplicaSet` event messages, in the order the scaling was decided.
    pub(super) events: Vec<String>,
}

impl<'a> Pass<'a> {
    /// The view of `rses` before any decision.
    pub(super) fn new(d: &'a Deployment, rses: &'a [ReplicaSet]) -> Self {
        let spec = d.spec.clone().unwrap_or_default();
        let old_status = d.status.clone().unwrap_or_default();
        let (surge, max_unavailable) = surge_and_unavailable(d);
        let views: Vec<Rs> = rses
            .iter()
            .map(|rs| Rs {
                name: rs.metadata.name.clone().unwrap_or_default(),
                replicas: spec_replicas(rs),
                pods: status_of(rs).0,
                available: status_of(rs).2,
                annotations: rs.metadata.annotations.clone().unwrap_or_default(),
                changed: false,
                created: rs.metadata.creation_timestamp.as_ref().map_or(0, secs),
                revision: revision_of(rs),
            })
            .collect();
        let mut order: Vec<usize> = (0..views.len()).collect();
        order.sort_by_key(|&i| (views[i].created, views[i].revision, views[i].name.clone()));
        Pass {
            d,
            rses,
            replicas: desired(d),
            surge,
            max_unavailable,
            paused: spec.paused.unwrap_or(false),
            collision_count: old_status.collision_count,
            spec,
            old_status,
            views,
            order,
            new_idx: None,
            created: false,
            progress: None,
            events: Vec::new(),
        }
    }

    /// Every ReplicaSet but the new one, oldest first.
    pub(super) fn olds(&self) -> Vec<usize> {
        self.order
            .iter()
            .copied()
            .filter(|&i| Some(i) != self.new_idx)
            .collect()
    }

    /// The ReplicaSets with replicas, oldest first.
    pub(super) fn active(&self) -> Vec<usize> {
        self.order
            .iter()
            .copied()
            .filter(|&i| self.views[i].replicas > 0)
            .collect()
    }

    /// The replicas of all ReplicaSets, as decided so far.
    pub(super) fn total(&self) -> i32 {
        self.views.iter().map(|v| v.replicas).sum()
    }

    /// Pods that may exist: an old ReplicaSet scaled down still has its pods until its
    /// controller deletes them, so the surge is measured against whichever is larger.
    pub(super) fn occupied(&self) -> i32 {
        self.views.iter().map(|v| v.replicas.max(v.pods)).sum()
    }

    /// Sets ReplicaSet `i` to `n` replicas, with the `ScalingReplicaSet` event that says so.
    pub(super) fn scale(&mut self, i: usize, n: i32) {
        let v = &mut self.views[i];
        if v.replicas != n {
            let dir = if n > v.replicas { "up" } else { "down" };
            self.events.push(format!(
                "Scaled {dir} replica set {} from {} to {n}",
                v.name, v.replicas
            ));
            v.replicas = n;
            v.changed = true;
        }
    }
}

/// The Deployment's `spec.replicas` (absent means 1).
pub(super) fn desired(d: &Deployment) -> i32 {
    replicas::or_default(d.spec.as_ref().and_then(|s| s.replicas))
}

/// A ReplicaSet's `spec.replicas`, read as its own controller reads it (absent means 1).
pub(super) fn spec_replicas(rs: &ReplicaSet) -> i32 {
    replicas::or_default(rs.spec.as_ref().and_then(|s| s.replicas))
}

/// An annotation's value.
pub(super) fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// A ReplicaSet's revision annotation (0 when absent or not a number).
pub(super) fn revision_of(rs: &ReplicaSet) -> i64 {
    annotation(&rs.metadata, REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// `(pods, ready, available)` as the ReplicaSet's status reports them.
pub(super) fn status_of(rs: &ReplicaSet) -> (i32, i32, i32) {
    rs.status.as_ref().map_or((0, 0, 0), |s| {
        (
            s.replicas,
            s.ready_replicas.unwrap_or(0),
            s.available_replicas.unwrap_or(0),
        )
    })
}

/// A timestamp in seconds.
pub(super) fn secs(t: &Time) -> i64 {
    t.0.as_second()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_set_without_replicas_has_one_as_in_its_own_controller() {
        let rs = ReplicaSet {
            spec: Some(Default::default()),
            ..Default::default()
        };
        assert_eq!(spec_replicas(&rs), 1);
        assert_eq!(spec_replicas(&ReplicaSet::default()), 1);
    }
}
