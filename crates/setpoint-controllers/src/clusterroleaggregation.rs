//! The ClusterRole aggregation controller (upstream's `clusterrole-aggregation`): a
//! ClusterRole with an `aggregationRule` gets, as its rules, the union of the rules of the
//! ClusterRoles its selectors match (each selector's matches in name order, a rule already
//! present not repeated), and keeps it as those roles come, change and go.
//!
//! Any ClusterRole change may change what an aggregated role selects, so every change
//! enqueues every aggregated role; [`aggregate`] is the pure decision.

use std::sync::Arc;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use serde_json::{json, Value};
use setpoint_api::selector::LabelSelector;
use setpoint_runtime::client::{Api, Client, Patch, PatchParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::ObjectKey;

/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "clusterrole-aggregation";

fn labels_json(role: &ClusterRole) -> Value {
    json!({"metadata": {"labels": role.metadata.labels.clone().unwrap_or_default()}})
}

/// The rules `role` should have, or `None` when it is not aggregated or already has them.
/// A selector that does not parse matches nothing (the server validated it on write).
pub fn aggregate(role: &ClusterRole, all: &[Arc<ClusterRole>]) -> Option<Vec<PolicyRule>> {
    let selectors = role
        .aggregation_rule
        .as_ref()?
        .cluster_role_selectors
        .clone()
        .unwrap_or_default();
    let mut sorted: Vec<&Arc<ClusterRole>> = all.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut rules: Vec<PolicyRule> = Vec::new();
    for sel in &selectors {
        let Ok(sel) = serde_json::to_value(sel)
            .map_err(|_| ())
            .and_then(|v| LabelSelector::from_label_selector_json(&v).map_err(|_| ()))
        else {
            continue;
        };
        for other in &sorted {
            if other.metadata.name == role.metadata.name || !sel.matches_object(&labels_json(other))
            {
                continue;
            }
            for rule in other.rules.iter().flatten() {
                if !rules.contains(rule) {
                    rules.push(rule.clone());
                }
            }
        }
    }
    let current = role.rules.clone().unwrap_or_default();
    (current != rules).then_some(rules)
}

struct Aggregation {
    client: Client,
    roles: Store<ClusterRole>,
}

#[async_trait::async_trait]
impl Reconciler for Aggregation {
    async fn reconcile(&self, _ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(role) = self.roles.get(key) else {
            return Ok(Action::Done);
        };
        let Some(rules) = aggregate(&role, &self.roles.list()) else {
            return Ok(Action::Done);
        };
        let api: Api<ClusterRole> = Api::all(self.client.clone());
        // A merge patch replaces the whole list, an empty one included.
        let patch = Patch::Merge(json!({ "rules": rules }));
        match api.patch(&key.name, &PatchParams::default(), &patch).await {
            Ok(_) => {
                tracing::debug!(role = %key.name, rules = rules.len(), "aggregated rules");
                Ok(Action::Done)
            }
            Err(e) if e.code() == Some(404) => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

/// Builds the ClusterRole aggregation controller.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let roles = informers.typed::<ClusterRole>(Scope::all()).store();
    let all = roles.clone();
    Controller::for_type::<ClusterRole>(NAME, informers, None)
        .watches::<ClusterRole>(None, move |_changed| {
            all.list()
                .iter()
                .filter(|r| r.aggregation_rule.is_some())
                .filter_map(|r| r.metadata.name.as_deref())
                .map(|n| ObjectKey::new(None, n))
                .collect()
        })
        .build(Arc::new(Aggregation { client, roles }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(v: Value) -> Arc<ClusterRole> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn aggregated_roles_get_the_union_of_what_they_select() {
        let admin = role(json!({"metadata": {"name": "admin"}, "aggregationRule":
            {"clusterRoleSelectors": [{"matchLabels": {"agg": "admin"}}]}}));
        let b = role(
            json!({"metadata": {"name": "b", "labels": {"agg": "admin"}},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]}),
        );
        let a = role(
            json!({"metadata": {"name": "a", "labels": {"agg": "admin"}},
            "rules": [{"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]},
                      {"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]}),
        );
        let other = role(json!({"metadata": {"name": "c"},
            "rules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]}));
        let all = vec![admin.clone(), b.clone(), a.clone(), other];
        let rules = aggregate(&admin, &all).unwrap();
        // In name order, without repeats.
        let verbs: Vec<&str> = rules.iter().map(|r| r.verbs[0].as_str()).collect();
        assert_eq!(verbs, ["list", "get"]);
        // Up to date: nothing to do.
        let mut done = (*admin).clone();
        done.rules = Some(rules);
        assert!(aggregate(&done, &all).is_none());
        // A role that is not aggregated is left alone.
        assert!(aggregate(&b, &all).is_none());
        // When the selected roles go, the rules go too.
        assert_eq!(aggregate(&done, &[Arc::new(done.clone())]), Some(vec![]));
    }
}
