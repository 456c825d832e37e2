//! PodDisruptionBudget rules shared by the API server's `pods/eviction` and the disruption
//! controller: which pods a budget guards, what "healthy" means, and the `DisruptionAllowed`
//! condition with upstream's reasons. Over JSON, the form the API server holds objects in.

use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::selector::LabelSelector;

/// The condition the disruption controller (and an eviction that uses the last allowed
/// disruption) sets on a budget.
pub const DISRUPTION_ALLOWED: &str = "DisruptionAllowed";
/// `DisruptionAllowed=True`: more healthy pods than the budget needs.
pub const SUFFICIENT_PODS: &str = "SufficientPods";
/// `DisruptionAllowed=False`: the healthy pods are at or below what the budget needs.
pub const INSUFFICIENT_PODS: &str = "InsufficientPods";
/// `DisruptionAllowed=False`: the controller could not compute the budget's status.
pub const SYNC_FAILED: &str = "SyncFailed";
/// The `Status` cause type an eviction refused by a budget carries.
pub const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";
/// `unhealthyPodEvictionPolicy: IfHealthyBudget` (the default).
pub const IF_HEALTHY_BUDGET: &str = "IfHealthyBudget";
/// `unhealthyPodEvictionPolicy: AlwaysAllow`.
pub const ALWAYS_ALLOW: &str = "AlwaysAllow";
/// How long an evicted pod stays in `status.disruptedPods` (and out of the healthy count)
/// waiting to be seen deleted: upstream's `DeletionTimeout`.
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);
/// The most entries `disruptedPods` may hold before evictions are refused (upstream's
/// `MaxDisruptedPodSize`).
pub const MAX_DISRUPTED_PODS: usize = 2000;

/// Whether a pod's `Ready` condition is `True`: what a budget counts as healthy.
pub fn is_pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

/// The pods a budget counts, as the disruption controller selects them: a missing selector
/// selects nothing, an empty one (`{}`) every pod of the namespace (policy/v1). `None` when
/// the selector does not parse.
pub fn controller_selector(pdb: &Value) -> Option<LabelSelector> {
    match pdb.pointer("/spec/selector") {
        None | Some(Value::Null) => Some(LabelSelector::nothing()),
        Some(sel) => LabelSelector::from_label_selector_json(sel).ok(),
    }
}

/// Whether an eviction of `pod` is subject to `pdb` (same namespace assumed). The eviction
/// handler is stricter than the controller: a missing or empty selector guards nothing.
pub fn eviction_guards(pdb: &Value, pod: &Value) -> bool {
    match pdb.pointer("/spec/selector") {
        None | Some(Value::Null) => false,
        Some(sel) => LabelSelector::from_label_selector_json(sel)
            .is_ok_and(|s| !s.is_empty() && !s.is_nothing() && s.matches_object(pod)),
    }
}

/// Sets a condition as apimachinery's `SetStatusCondition` does: `lastTransitionTime` moves
/// only when the status changes (or the condition is new); reason, message and
/// observedGeneration always take the new values.
pub fn set_condition(
    conditions: &mut Vec<Value>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    observed_generation: i64,
    now: &str,
) {
    let fresh = json!({
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": observed_generation,
        "lastTransitionTime": now,
    });
    match conditions
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
    {
        Some(existing) => {
            let same_status = existing.get("status").and_then(Value::as_str) == Some(status);
            let since = existing.get("lastTransitionTime").cloned();
            *existing = fresh;
            if let (true, Some(since)) = (same_status, since) {
                existing["lastTransitionTime"] = since;
            }
        }
        None => conditions.push(fresh),
    }
}

/// `DisruptionAllowed` as `status.disruptionsAllowed` implies (upstream's
/// `UpdateDisruptionAllowedCondition`): `True`/`SufficientPods` when above zero, else
/// `False`/`InsufficientPods`, at the status' `observedGeneration`.
pub fn update_disruption_allowed_condition(status: &mut Map<String, Value>, now: &str) {
    let allowed = status
        .get("disruptionsAllowed")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let generation = status
        .get("observedGeneration")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let (cond, reason) = if allowed > 0 {
        ("True", SUFFICIENT_PODS)
    } else {
        ("False", INSUFFICIENT_PODS)
    };
    let mut conditions = match status.remove("conditions") {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    };
    set_condition(
        &mut conditions,
        DISRUPTION_ALLOWED,
        cond,
        reason,
        "",
        generation,
        now,
    );
    status.insert("conditions".into(), Value::Array(conditions));
}

/// The message of an eviction refused because the budget allows no disruption.
pub fn budget_message(name: &str, desired_healthy: i64, current_healthy: i64) -> String {
    format!(
        "The disruption budget {name} needs {desired_healthy} healthy pods and has {current_healthy} currently"
    )
}

/// The message every eviction refused by a budget answers with (429).
pub const EVICTION_REFUSED: &str =
    "Cannot evict pod as it would violate the pod's disruption budget.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn condition_keeps_its_transition_time_while_status_holds() {
        let mut status = json!({"disruptionsAllowed": 1, "observedGeneration": 2})
            .as_object()
            .cloned()
            .unwrap();
        update_disruption_allowed_condition(&mut status, "t1");
        assert_eq!(
            status["conditions"],
            json!([{"type": "DisruptionAllowed", "status": "True", "reason": "SufficientPods",
                    "message": "", "observedGeneration": 2, "lastTransitionTime": "t1"}])
        );
        update_disruption_allowed_condition(&mut status, "t2");
        assert_eq!(status["conditions"][0]["lastTransitionTime"], "t1");
        status.insert("disruptionsAllowed".into(), json!(0));
        update_disruption_allowed_condition(&mut status, "t3");
        let c = &status["conditions"][0];
        assert_eq!(
            (&c["status"], &c["reason"], &c["lastTransitionTime"]),
            (&json!("False"), &json!("InsufficientPods"), &json!("t3"))
        );
    }

    #[test]
    fn selectors_of_the_controller_and_of_eviction_differ_on_empty() {
        let pod = json!({"metadata": {"labels": {"app": "web"}}});
        let empty = json!({"spec": {"selector": {}}});
        let none = json!({"spec": {}});
        let web = json!({"spec": {"selector": {"matchLabels": {"app": "web"}}}});
        assert!(controller_selector(&empty).unwrap().matches_object(&pod));
        assert!(!controller_selector(&none).unwrap().matches_object(&pod));
        assert!(!eviction_guards(&empty, &pod));
        assert!(!eviction_guards(&none, &pod));
        assert!(eviction_guards(&web, &pod));
        assert!(!eviction_guards(
            &web,
            &json!({"metadata": {"labels": {"app": "db"}}})
        ));
    }

    #[test]
    fn readiness_is_the_ready_condition() {
        let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let not = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        assert!(is_pod_ready(&ready));
        assert!(!is_pod_ready(&not));
        assert!(!is_pod_ready(&json!({})));
        assert_eq!(
            budget_message("web", 2, 1),
            "The disruption budget web needs 2 healthy pods and has 1 currently"
        );
    }
}
