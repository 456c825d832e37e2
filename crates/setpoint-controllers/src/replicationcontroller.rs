//! The ReplicationController controller: the ReplicaSet controller ([`crate::replicaset`])
//! over an adapter, as upstream builds it. A ReplicationController is read as a ReplicaSet
//! whose selector is its equality map (`spec.selector`) as `matchLabels`; its pods carry a
//! `v1` `ReplicationController` controller reference, and its status (the same fields as a
//! ReplicaSet's) is written back to it.

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::ReplicationController;
use serde_json::{json, Value};
use setpoint_runtime::client::Client;
use setpoint_runtime::controller::Controller;
use setpoint_runtime::informer::SharedInformers;

use crate::replicaset::Replicated;

/// The controller's name, upstream's (`--controllers`, work queue, metrics, logs).
pub const NAME: &str = "replicationcontroller";

impl Replicated for ReplicationController {
    const CONTROLLER: &'static str = NAME;
    const REPORTER: &'static str = "replication-controller";

    fn as_replica_set(&self) -> ReplicaSet {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        // The only difference in shape: an equality map instead of a label selector. An
        // absent or empty map stays an empty selector, which selects nothing here (the API
        // server defaults it to the template's labels, so only a broken object has one).
        if let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut) {
            let labels = spec.remove("selector").unwrap_or(Value::Null);
            let selector = match labels {
                Value::Object(m) if !m.is_empty() => json!({ "matchLabels": m }),
                _ => json!({}),
            };
            spec.insert("selector".into(), selector);
        }
        if let Some(o) = v.as_object_mut() {
            o.insert("apiVersion".into(), json!("apps/v1"));
            o.insert("kind".into(), json!("ReplicaSet"));
        }
        serde_json::from_value(v).unwrap_or_else(|e| {
            // Every field of a ReplicationController has its twin in a ReplicaSet, so this
            // is a bug; keep the metadata so that the object selects nothing rather than
            // everything.
            tracing::error!(error = %e, "a ReplicationController did not convert");
            ReplicaSet {
                metadata: self.metadata.clone(),
                ..Default::default()
            }
        })
    }

    fn set_status(&mut self, status: ReplicaSetStatus) {
        // The same field names and types (conditions included), so the JSON carries over.
        self.status = serde_json::to_value(status)
            .and_then(serde_json::from_value)
            .ok();
    }
}

/// The ReplicationController controller, reconciling every ReplicationController when it or
/// one of its pods changes.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    crate::replicaset::controller_for::<ReplicationController>(client, informers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::jiff::Timestamp;
    use std::sync::Arc;

    fn rc(selector: Value) -> ReplicationController {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "rc-uid", "generation": 2},
            "spec": {
                "replicas": 3,
                "minReadySeconds": 5,
                "selector": selector,
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}]}
                }
            },
            "status": {"replicas": 1, "conditions": [{"type": "ReplicaFailure", "status": "True",
                        "reason": "FailedCreate", "message": "quota"}]}
        }))
        .unwrap()
    }

    fn pod(name: &str, labels: Value, owner: Option<&str>) -> Arc<Pod> {
        let refs = owner.map(|kind| {
            json!([{"apiVersion": "v1", "kind": kind, "name": "web", "uid": "rc-uid",
                    "controller": true}])
        });
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}"),
                             "labels": labels, "ownerReferences": refs},
                "status": {"phase": "Pending"}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn reads_as_a_replica_set_with_match_labels() {
        let rs = rc(json!({"app": "web"})).as_replica_set();
        let spec = rs.spec.clone().unwrap();
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(spec.min_ready_seconds, Some(5));
        let labels = spec.selector.match_labels.unwrap();
        assert_eq!(labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(rs.metadata.uid.as_deref(), Some("rc-uid"));
        assert_eq!(rs.metadata.generation, Some(2));
        let status = rs.status.unwrap();
        assert_eq!(status.replicas, 1);
        assert_eq!(
            status.conditions.unwrap()[0].reason.as_deref(),
            Some("FailedCreate")
        );
    }

    #[test]
    fn an_equality_selector_picks_pods_as_a_replica_set_would() {
        let rs = rc(json!({"app": "web"})).as_replica_set();
        let pods = vec![
            pod("orphan", json!({"app": "web", "x": "y"}), None),
            pod("other", json!({"app": "db"}), None),
            pod("stray", json!({"app": "db"}), Some("ReplicationController")),
        ];
        let plan = crate::replicaset::plan(&rs, &pods, Timestamp::from_second(100).unwrap());
        let names = |v: &[setpoint_runtime::ObjectKey]| {
            v.iter().map(|k| k.name.clone()).collect::<Vec<_>>()
        };
        assert_eq!(names(&plan.adopt), ["orphan"]);
        assert_eq!(names(&plan.release), ["stray"]);
        assert_eq!(plan.create, 2);
    }

    #[test]
    fn an_empty_selector_selects_nothing() {
        let rs = rc(json!({})).as_replica_set();
        let pods = vec![pod("orphan", json!({"app": "web"}), None)];
        let plan = crate::replicaset::plan(&rs, &pods, Timestamp::from_second(100).unwrap());
        assert!(plan.adopt.is_empty());
        assert_eq!(plan.create, 0);
    }

    #[test]
    fn status_is_written_back_field_for_field() {
        let mut rc = rc(json!({"app": "web"}));
        let status: ReplicaSetStatus = serde_json::from_value(json!({
            "replicas": 3, "fullyLabeledReplicas": 3, "readyReplicas": 2,
            "availableReplicas": 1, "observedGeneration": 2,
            "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedDelete",
                            "message": "m", "lastTransitionTime": "2020-01-01T00:00:00Z"}]
        }))
        .unwrap();
        rc.set_status(status.clone());
        let s = rc.status.clone().unwrap();
        assert_eq!(
            (s.replicas, s.fully_labeled_replicas, s.ready_replicas),
            (3, Some(3), Some(2))
        );
        assert_eq!(
            (s.available_replicas, s.observed_generation),
            (Some(1), Some(2))
        );
        assert_eq!(rc.as_replica_set().status, Some(status));
    }
}
