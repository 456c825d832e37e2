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
use setpoint_runtime::decision;
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
    let union = union(role, all)?;
    union.differs_from(role).then_some(union.rules)
}

/// What an aggregated role's selectors pick.
#[derive(Clone, Debug, PartialEq)]
pub struct Union<'a> {
    /// How many selectors the role has.
    pub selectors: usize,
    /// The ClusterRoles matched, in the order their rules were taken.
    pub matched: Vec<&'a str>,
    /// The union of their rules.
    pub rules: Vec<PolicyRule>,
}

impl Union<'_> {
    /// Whether `role`'s rules are not this union (so they are to be replaced).
    pub fn differs_from(&self, role: &ClusterRole) -> bool {
        role.rules.as_deref().unwrap_or_default() != self.rules.as_slice()
    }
}

/// The union of the rules of the ClusterRoles `role`'s selectors match (`None` when it is
/// not aggregated); [`aggregate`] compares it with the role's rules.
pub fn union<'a>(role: &ClusterRole, all: &'a [Arc<ClusterRole>]) -> Option<Union<'a>> {
    let selectors = role
        .aggregation_rule
        .as_ref()?
        .cluster_role_selectors
        .clone()
        .unwrap_or_default();
    let mut sorted: Vec<&Arc<ClusterRole>> = all.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut rules: Vec<PolicyRule> = Vec::new();
    let mut matched: Vec<&'a str> = Vec::new();
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
            let name = other.metadata.name.as_deref().unwrap_or_default();
            if !matched.contains(&name) {
                matched.push(name);
            }
            for rule in other.rules.iter().flatten() {
                if !rules.contains(rule) {
                    rules.push(rule.clone());
                }
            }
        }
    }
    Some(Union {
        selectors: selectors.len(),
        matched,
        rules,
    })
}

/// A one-line summary of `union` against the role's `current` rule count.
fn describe(union: &Union<'_>, current: usize) -> String {
    const SHOWN: usize = 5;
    let mut names = union
        .matched
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if union.matched.len() > SHOWN {
        names.push_str(&format!(", … ({} more)", union.matched.len() - SHOWN));
    }
    if union.matched.is_empty() {
        names.push_str("none");
    }
    format!(
        "{} selector(s) match {} ClusterRole(s): {names}; {} rule(s) in their union, {current} in the role",
        union.selectors,
        union.matched.len(),
        union.rules.len(),
    )
}

struct Aggregation {
    client: Client,
    roles: Store<ClusterRole>,
}

#[async_trait::async_trait]
impl Reconciler for Aggregation {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(role) = self.roles.get(key) else {
            ctx.observe("the ClusterRole is gone");
            return Ok(Action::Done);
        };
        let all = self.roles.list();
        let Some(union) = union(&role, &all) else {
            ctx.observe("no aggregationRule: not aggregated");
            return Ok(Action::Done);
        };
        let current = role.rules.as_ref().map_or(0, Vec::len);
        decision::observe_with(|| describe(&union, current));
        if !union.differs_from(&role) {
            return Ok(Action::Done);
        }
        let rules = union.rules;
        ctx.action(
            format!("update rules ({} rule(s))", rules.len()),
            "the union of the matched ClusterRoles' rules differs from the role's",
        );
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
        let union = union(&admin, &all).unwrap();
        assert_eq!(union.matched, ["a", "b"]);
        assert_eq!(
            describe(&union, 0),
            "1 selector(s) match 2 ClusterRole(s): a, b; 2 rule(s) in their union, 0 in the role"
        );
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
