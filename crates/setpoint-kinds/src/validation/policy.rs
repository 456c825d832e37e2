//! PodDisruptionBudgets (`policy/v1`): at most one of `minAvailable`/`maxUnavailable`, each a
//! non-negative int or a percentage up to 100%, a well-formed selector and a known
//! `unhealthyPodEvictionPolicy`, with upstream's messages.

use serde_json::Value;
use setpoint_api::Cause;

use super::apps::positive_int_or_percent;
use super::fields::{at, label_selector, not_supported};

/// The `unhealthyPodEvictionPolicy` values upstream accepts, sorted as its message lists them.
pub const UNHEALTHY_POD_EVICTION_POLICIES: &[&str] = &["AlwaysAllow", "IfHealthyBudget"];

pub(super) fn pod_disruption_budget(e: &mut Vec<Cause>, obj: &Value) {
    let spec = at(obj, "spec");
    let (min, max) = (at(spec, "minAvailable"), at(spec, "maxUnavailable"));
    if !min.is_null() && !max.is_null() {
        e.push(Cause::invalid(
            "spec",
            spec,
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    for (v, path) in [(min, "spec.minAvailable"), (max, "spec.maxUnavailable")] {
        if v.is_null() {
            continue;
        }
        positive_int_or_percent(e, v, path);
        let over = v
            .as_str()
            .and_then(|s| s.strip_suffix('%'))
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n > 100);
        if over {
            e.push(Cause::invalid(path, v, "must not be greater than 100%"));
        }
    }
    let sel = at(spec, "selector");
    if !sel.is_null() {
        label_selector(e, sel, "spec.selector");
    }
    if let Some(policy) = at(spec, "unhealthyPodEvictionPolicy").as_str() {
        if !UNHEALTHY_POD_EVICTION_POLICIES.contains(&policy) {
            not_supported(
                e,
                "spec.unhealthyPodEvictionPolicy",
                policy,
                UNHEALTHY_POD_EVICTION_POLICIES,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::validation::testutil::{check, fields, find};

    fn pdb(spec: serde_json::Value) -> serde_json::Value {
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": "web", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn valid_budgets() {
        for spec in [
            json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}),
            json!({"maxUnavailable": "25%", "selector": {}}),
            json!({"minAvailable": "100%", "unhealthyPodEvictionPolicy": "AlwaysAllow"}),
            json!({}),
        ] {
            assert_eq!(
                check("policy", "v1", "PodDisruptionBudget", pdb(spec.clone())),
                vec![],
                "{spec}"
            );
        }
    }

    #[test]
    fn upstream_messages() {
        let both = check(
            "policy",
            "v1",
            "PodDisruptionBudget",
            pdb(json!({"minAvailable": 1, "maxUnavailable": 1})),
        );
        assert!(find(&both, "spec")
            .message
            .ends_with("minAvailable and maxUnavailable cannot be both set"));
        let bad = check(
            "policy",
            "v1",
            "PodDisruptionBudget",
            pdb(json!({"minAvailable": -1})),
        );
        assert!(find(&bad, "spec.minAvailable")
            .message
            .ends_with("must be greater than or equal to 0"));
        let over = check(
            "policy",
            "v1",
            "PodDisruptionBudget",
            pdb(json!({"maxUnavailable": "150%"})),
        );
        assert!(find(&over, "spec.maxUnavailable")
            .message
            .ends_with("must not be greater than 100%"));
        let word = check(
            "policy",
            "v1",
            "PodDisruptionBudget",
            pdb(json!({"maxUnavailable": "half"})),
        );
        assert!(find(&word, "spec.maxUnavailable")
            .message
            .ends_with("must be an integer or percentage (e.g '5%')"));
        let policy = check(
            "policy",
            "v1",
            "PodDisruptionBudget",
            pdb(json!({"minAvailable": 1, "unhealthyPodEvictionPolicy": "Sometimes"})),
        );
        assert_eq!(fields(&policy), vec!["spec.unhealthyPodEvictionPolicy"]);
        assert!(
            policy[0]
                .message
                .contains("\"AlwaysAllow\", \"IfHealthyBudget\""),
            "{}",
            policy[0].message
        );
    }
}
