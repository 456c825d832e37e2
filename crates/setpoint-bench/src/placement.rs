//! Where a run's pods may go, and what keeps everything else off the nodes a run hosts.
//!
//! Against a cluster with real nodes, a benchmark pod must not land on a real node (it would
//! pull and run its image there), and the cluster's own workloads must not land on the
//! benchmark's simulated nodes (a DaemonSet would otherwise put a pod on each of them). So
//! the nodes a run hosts carry the run's label and a `NoSchedule` taint of the same key, and
//! the run's pods select those nodes and tolerate that taint; with reused nodes the pods
//! select the cluster's simulated nodes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use serde_json::{json, Value};
use setpoint_node::simulation::SIMULATED_LABEL;

use crate::density::RUN_LABEL;

/// The nodes a run's pods may be scheduled to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Only the simulated nodes this run hosts (labelled and tainted with the run id).
    RunNodes(String),
    /// Any of the cluster's own simulated nodes (`setpoint.dev/simulated=true`).
    SimulatedNodes,
    /// Wherever the scheduler puts them (the run asked for the cluster's nodes).
    Anywhere,
}

impl Placement {
    /// Labels of the nodes a run hosts.
    pub fn node_labels(run: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(RUN_LABEL.to_string(), run.to_string())])
    }

    /// Taints of the nodes a run hosts.
    pub fn node_taints(run: &str) -> Vec<Taint> {
        vec![Taint {
            key: RUN_LABEL.into(),
            value: Some(run.into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }]
    }

    /// The label selector of the nodes the pods may go to (`None`: any node).
    pub fn node_selector(&self) -> Option<String> {
        match self {
            Placement::RunNodes(run) => Some(format!("{RUN_LABEL}={run}")),
            Placement::SimulatedNodes => Some(format!("{SIMULATED_LABEL}=true")),
            Placement::Anywhere => None,
        }
    }

    /// The pod spec of every pod a run creates: one container of `image`, placed here.
    pub fn pod_spec(&self, image: &str) -> Value {
        let mut spec = json!({"containers": [{"name": "app", "image": image}]});
        self.apply_to(&mut spec);
        spec
    }

    /// Adds `nodeSelector` and `tolerations` to the pod spec `spec` (a JSON object).
    pub fn apply_to(&self, spec: &mut Value) {
        let Some(spec) = spec.as_object_mut() else {
            return;
        };
        match self {
            Placement::RunNodes(run) => {
                spec.insert("nodeSelector".into(), json!({ RUN_LABEL: run }));
                spec.insert(
                    "tolerations".into(),
                    json!([{
                        "key": RUN_LABEL,
                        "operator": "Equal",
                        "value": run,
                        "effect": "NoSchedule"
                    }]),
                );
            }
            Placement::SimulatedNodes => {
                spec.insert("nodeSelector".into(), json!({ SIMULATED_LABEL: "true" }));
            }
            Placement::Anywhere => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_nodes_are_selected_and_their_taint_tolerated() {
        let p = Placement::RunNodes("abc123".into());
        let mut spec = json!({"containers": []});
        p.apply_to(&mut spec);
        assert_eq!(
            spec["nodeSelector"],
            json!({"setpoint-bench-run": "abc123"})
        );
        let t = &Placement::node_taints("abc123")[0];
        let tol = &spec["tolerations"][0];
        assert_eq!(
            (
                tol["key"].as_str(),
                tol["value"].as_str(),
                tol["effect"].as_str()
            ),
            (
                Some(t.key.as_str()),
                t.value.as_deref(),
                Some(t.effect.as_str())
            )
        );
        assert_eq!(
            p.node_selector().as_deref(),
            Some("setpoint-bench-run=abc123")
        );
        for (k, v) in Placement::node_labels("abc123") {
            assert_eq!(spec["nodeSelector"][&k], json!(v));
        }
    }

    #[test]
    fn reused_nodes_are_the_simulated_ones_and_anywhere_adds_nothing() {
        let mut spec = json!({"containers": []});
        Placement::SimulatedNodes.apply_to(&mut spec);
        assert_eq!(
            spec["nodeSelector"],
            json!({"setpoint.dev/simulated": "true"})
        );
        assert!(spec.get("tolerations").is_none());
        let mut plain = json!({"containers": []});
        Placement::Anywhere.apply_to(&mut plain);
        assert_eq!(plain, json!({"containers": []}));
        assert_eq!(Placement::Anywhere.node_selector(), None);
    }
}
