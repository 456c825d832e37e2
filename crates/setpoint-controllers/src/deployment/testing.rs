//! What the deployment unit tests share: a Deployment to start from and a model of the
//! cluster that applies plans and plays the ReplicaSet controller.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, ReplicaSet, ReplicaSetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use super::pass::{annotation, spec_replicas, status_of};
use super::{plan, Plan, REVISION};

/// `s` seconds into the tests' fixed epoch.
pub(super) fn at(s: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + s).unwrap())
}

/// A Deployment `app` of `replicas` pods of one container running `image`.
pub(super) fn deployment(replicas: i32, image: &str, strategy: serde_json::Value) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "app", "namespace": "default", "uid": "d-uid", "generation": 1},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "app"}},
            "strategy": strategy,
            "template": {
                "metadata": {"labels": {"app": "app"}},
                "spec": {"containers": [{"name": "c", "image": image}]}
            }
        }
    }))
    .unwrap()
}

/// A `RollingUpdate` strategy.
pub(super) fn rolling(
    surge: serde_json::Value,
    unavailable: serde_json::Value,
) -> serde_json::Value {
    json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}})
}

/// The cluster as the test model sees it: ReplicaSets whose pods appear at once and become
/// available when the model says so.
#[derive(Default)]
pub(super) struct Model {
    pub(super) rses: Vec<ReplicaSet>,
    pub(super) clock: i64,
}

impl Model {
    /// Carries out `p` as the reconciler would, then lets the ReplicaSets' pods follow.
    fn apply(&mut self, d: &mut Deployment, p: &Plan) {
        self.clock += 1;
        if let Some(rs) = &p.create {
            let mut rs = rs.clone();
            rs.metadata.creation_timestamp = Some(at(self.clock));
            rs.status = Some(ReplicaSetStatus::default());
            self.rses.push(rs);
        }
        for u in &p.updates {
            let rs = self
                .rses
                .iter_mut()
                .find(|r| r.metadata.name.as_deref() == Some(&u.name))
                .unwrap();
            rs.spec.as_mut().unwrap().replicas = Some(u.replicas);
            rs.metadata.annotations = Some(u.annotations.clone());
        }
        self.rses
            .retain(|r| !p.delete.contains(r.metadata.name.as_ref().unwrap()));
        if let Some(r) = &p.revision {
            d.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(REVISION.into(), r.clone());
        }
        if let Some(s) = &p.status {
            d.status = Some(s.clone());
        }
        // The ReplicaSet controller: pods follow spec at once, unavailable ones go first.
        for rs in &mut self.rses {
            let want = spec_replicas(rs);
            let st = rs.status.get_or_insert_with(Default::default);
            st.replicas = want;
            let a = st.available_replicas.unwrap_or(0).min(want);
            st.available_replicas = Some(a);
            st.ready_replicas = Some(a);
        }
    }

    /// Makes up to `n` pods of each ReplicaSet available.
    pub(super) fn ready(&mut self, n: i32) {
        for rs in &mut self.rses {
            let st = rs.status.get_or_insert_with(Default::default);
            let a = (st.available_replicas.unwrap_or(0) + n).min(st.replicas);
            st.available_replicas = Some(a);
            st.ready_replicas = Some(a);
        }
    }

    /// Available pods over all ReplicaSets.
    pub(super) fn available(&self) -> i32 {
        self.rses.iter().map(|r| status_of(r).2).sum()
    }

    /// `spec.replicas` over all ReplicaSets.
    pub(super) fn total(&self) -> i32 {
        self.rses.iter().map(spec_replicas).sum()
    }

    /// The ReplicaSet of revision `rev`.
    pub(super) fn by_rev(&self, rev: &str) -> &ReplicaSet {
        self.rses
            .iter()
            .find(|r| annotation(&r.metadata, REVISION) == Some(rev))
            .unwrap()
    }

    /// One pass: plans at the model's clock and applies the plan.
    pub(super) fn step(&mut self, d: &mut Deployment) -> Plan {
        let p = plan(d, &self.rses, &at(self.clock));
        self.apply(d, &p);
        p
    }

    /// Passes, with every pod becoming available, until nothing is left to do.
    pub(super) fn settle(&mut self, d: &mut Deployment) {
        for _ in 0..100 {
            self.step(d);
            self.ready(100);
        }
    }
}

/// The Deployment's `Progressing` condition.
pub(super) fn progressing(d: &Deployment) -> DeploymentCondition {
    d.status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Progressing")
        .unwrap()
        .clone()
}

/// A new template (as a user's edit would make it, with the generation bumped).
pub(super) fn set_image(d: &mut Deployment, image: &str) {
    d.spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers[0]
        .image = Some(image.into());
    d.metadata.generation = Some(d.metadata.generation.unwrap() + 1);
}
