//! The disruption controller's pure decision: a budget's status from its pods, the scale of
//! their controllers and the time, as upstream's `trySync` computes it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use setpoint_api::disruption::{
    set_condition, update_disruption_allowed_condition, DELETION_TIMEOUT, DISRUPTION_ALLOWED,
    INSUFFICIENT_PODS, SUFFICIENT_PODS, SYNC_FAILED,
};

use crate::deployment::rolling::resolve;
use crate::endpointslice::pods::is_pod_ready;

/// Whether the budget's numbers depend on the scale of its pods' controllers: a
/// `maxUnavailable`, or a percentage `minAvailable` (an integer `minAvailable` counts pods).
pub fn needs_scale(pdb: &PodDisruptionBudget) -> bool {
    let spec = pdb.spec.as_ref();
    spec.and_then(|s| s.max_unavailable.as_ref()).is_some()
        || matches!(
            spec.and_then(|s| s.min_available.as_ref()),
            Some(IntOrString::String(_))
        )
}

/// `(expectedPods, desiredHealthy)` from the number of selected pods and, when
/// [`needs_scale`], the summed scale of their controllers (upstream's `getExpectedPodCount`).
pub fn expected_and_desired(pdb: &PodDisruptionBudget, pods: usize, scale: i32) -> (i32, i32) {
    let spec = pdb.spec.as_ref();
    if let Some(max) = spec.and_then(|s| s.max_unavailable.as_ref()) {
        let unavailable = resolve(Some(max), scale, true, "0");
        return (scale, (scale - unavailable).max(0));
    }
    match spec.and_then(|s| s.min_available.as_ref()) {
        Some(IntOrString::Int(n)) => (i32::try_from(pods).unwrap_or(i32::MAX), *n),
        Some(min @ IntOrString::String(_)) => (scale, resolve(Some(min), scale, true, "0")),
        None => (0, 0),
    }
}

/// The budget's `disruptedPods` still pending at `now` (upstream's `buildDisruptedPodMap`):
/// entries of pods now being deleted, gone, or older than [`DELETION_TIMEOUT`] drop out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Disrupted {
    /// The entries kept.
    pub pods: BTreeMap<String, Time>,
    /// When the earliest kept entry expires: the budget is looked at again then.
    pub recheck: Option<Timestamp>,
    /// Pods whose eviction was recorded but which were not deleted in time.
    pub expired: Vec<String>,
}

fn expires(at: &Time) -> Timestamp {
    at.0.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
        DELETION_TIMEOUT.as_secs() as i64,
    ))
    .unwrap_or(at.0)
}

/// See [`Disrupted`].
pub fn disrupted_pods(pdb: &PodDisruptionBudget, pods: &[&Pod], now: Timestamp) -> Disrupted {
    let mut out = Disrupted::default();
    let Some(recorded) = pdb.status.as_ref().and_then(|s| s.disrupted_pods.as_ref()) else {
        return out;
    };
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(at) = recorded.get(&name) else {
            continue;
        };
        let expiry = expires(at);
        if expiry < now {
            out.expired.push(name);
        } else {
            out.recheck = Some(out.recheck.map_or(expiry, |r| r.min(expiry)));
            out.pods.insert(name, at.clone());
        }
    }
    out
}

/// Pods that count as healthy: Ready, not being deleted and not just evicted (upstream's
/// `countHealthyPods`).
pub fn count_healthy(pods: &[&Pod], disrupted: &BTreeMap<String, Time>, now: Timestamp) -> i32 {
    let mut n = 0;
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        if disrupted.get(name).is_some_and(|at| expires(at) > now) {
            continue;
        }
        if is_pod_ready(pod) {
            n += 1;
        }
    }
    n
}

/// Whether the `DisruptionAllowed` condition says what the status does, at the budget's
/// generation (upstream's `ConditionsAreUpToDate`).
fn conditions_up_to_date(pdb: &PodDisruptionBudget) -> bool {
    let Some(status) = pdb.status.as_ref() else {
        return false;
    };
    let Some(cond) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == DISRUPTION_ALLOWED)
    else {
        return false;
    };
    if status.observed_generation != pdb.metadata.generation {
        return false;
    }
    if status.disruptions_allowed > 0 {
        cond.status == "True" && cond.reason == SUFFICIENT_PODS
    } else {
        cond.status == "False" && cond.reason == INSUFFICIENT_PODS
    }
}

/// Runs a JSON rule of `setpoint_api::disruption` over a typed status.
fn with_json(
    status: &PodDisruptionBudgetStatus,
    f: impl FnOnce(&mut serde_json::Map<String, Value>),
) -> PodDisruptionBudgetStatus {
    let mut v = serde_json::to_value(status).unwrap_or_default();
    if let Some(map) = v.as_object_mut() {
        f(map);
    }
    serde_json::from_value(v).unwrap_or_else(|_| status.clone())
}

/// `disruptionsAllowed`: the healthy pods above the desired healthy ones, none while no pods
/// are expected.
pub fn disruptions_allowed(current_healthy: i32, desired_healthy: i32, expected: i32) -> i32 {
    let allowed = current_healthy - desired_healthy;
    if expected <= 0 || allowed <= 0 {
        0
    } else {
        allowed
    }
}

/// The status to write, or `None` when the stored one already says it (upstream's
/// `updatePdbStatus`). Disruptions are allowed only while pods are expected, so a budget
/// whose first pods just appeared stays safe until it is counted.
pub fn status(
    pdb: &PodDisruptionBudget,
    current_healthy: i32,
    desired_healthy: i32,
    expected: i32,
    disrupted: BTreeMap<String, Time>,
    now: Timestamp,
) -> Option<PodDisruptionBudgetStatus> {
    let allowed = disruptions_allowed(current_healthy, desired_healthy, expected);
    let old = pdb.status.clone().unwrap_or_default();
    let disrupted_now = (!disrupted.is_empty()).then_some(disrupted);
    let same_disrupted =
        old.disrupted_pods.as_ref().filter(|m| !m.is_empty()) == disrupted_now.as_ref();
    if old.current_healthy == current_healthy
        && old.desired_healthy == desired_healthy
        && old.expected_pods == expected
        && old.disruptions_allowed == allowed
        && same_disrupted
        && old.observed_generation == pdb.metadata.generation
        && conditions_up_to_date(pdb)
    {
        return None;
    }
    let new = PodDisruptionBudgetStatus {
        current_healthy,
        desired_healthy,
        expected_pods: expected,
        disruptions_allowed: allowed,
        disrupted_pods: disrupted_now,
        observed_generation: pdb.metadata.generation,
        conditions: old.conditions,
    };
    let now = stamp(now);
    Some(with_json(&new, |m| {
        update_disruption_allowed_condition(m, &now)
    }))
}

/// The status after a failed sync (upstream's `failSafe`): no disruptions allowed, and
/// `DisruptionAllowed=False` with reason `SyncFailed` and the error.
pub fn fail_safe(
    pdb: &PodDisruptionBudget,
    error: &str,
    now: Timestamp,
) -> PodDisruptionBudgetStatus {
    let mut status = pdb.status.clone().unwrap_or_default();
    status.disruptions_allowed = 0;
    let generation = status.observed_generation.unwrap_or(0);
    let now = stamp(now);
    with_json(&status, |m| {
        let mut conditions = match m.remove("conditions") {
            Some(Value::Array(a)) => a,
            _ => Vec::new(),
        };
        set_condition(
            &mut conditions,
            DISRUPTION_ALLOWED,
            "False",
            SYNC_FAILED,
            error,
            generation,
            &now,
        );
        m.insert("conditions".into(), Value::Array(conditions));
    })
}

/// A time as the API writes `metav1.Time`.
fn stamp(t: Timestamp) -> String {
    serde_json::to_value(Time(t))
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// How long until `at`, at least nothing.
pub fn until(at: Timestamp, now: Timestamp) -> Duration {
    let d = at.as_second() - now.as_second();
    Duration::from_secs(d.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pdb(spec: Value, status: Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "generation": 2},
            "spec": spec, "status": status
        }))
        .unwrap()
    }

    fn pod(name: &str, ready: bool, deleting: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default",
                         "deletionTimestamp": if deleting { Some("2026-01-01T00:00:00Z") } else { None }},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn int_and_percent_budgets() {
        let min2 = pdb(json!({"minAvailable": 2}), json!({}));
        assert!(!needs_scale(&min2));
        assert_eq!(expected_and_desired(&min2, 3, 0), (3, 2));
        let pct = pdb(json!({"minAvailable": "50%"}), json!({}));
        assert!(needs_scale(&pct));
        // Percentages of the controllers' scale round up.
        assert_eq!(expected_and_desired(&pct, 2, 5), (5, 3));
        let max1 = pdb(json!({"maxUnavailable": 1}), json!({}));
        assert_eq!(expected_and_desired(&max1, 3, 4), (4, 3));
        let max_pct = pdb(json!({"maxUnavailable": "30%"}), json!({}));
        // 30% of 3 rounds up to 1 unavailable.
        assert_eq!(expected_and_desired(&max_pct, 3, 3), (3, 2));
        let too_many = pdb(json!({"maxUnavailable": 5}), json!({}));
        assert_eq!(expected_and_desired(&too_many, 3, 3), (3, 0));
        assert_eq!(
            expected_and_desired(&pdb(json!({}), json!({})), 3, 0),
            (0, 0)
        );
    }

    #[test]
    fn healthy_pods_are_ready_live_and_not_just_evicted() {
        let now = at("2026-01-01T00:01:00Z");
        let b = pdb(
            json!({"minAvailable": 2}),
            json!({"disruptedPods": {"a": "2026-01-01T00:00:30Z", "old": "2025-12-31T23:50:00Z", "gone": "2026-01-01T00:00:30Z"}}),
        );
        let pods = [
            pod("a", true, false),
            pod("b", true, false),
            pod("c", false, false),
            pod("d", true, true),
            pod("old", true, false),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let d = disrupted_pods(&b, &refs, now);
        assert_eq!(d.pods.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(d.expired, ["old"]);
        assert_eq!(d.recheck, Some(at("2026-01-01T00:02:30Z")));
        // a is just evicted, c unready, d terminating: b and old count.
        assert_eq!(count_healthy(&refs, &d.pods, now), 2);
        assert_eq!(until(d.recheck.unwrap(), now), Duration::from_secs(90));
    }

    #[test]
    fn status_and_condition_as_upstream() {
        let now = at("2026-01-01T00:00:00Z");
        let b = pdb(json!({"minAvailable": 2}), json!({}));
        let s = status(&b, 3, 2, 3, BTreeMap::new(), now).unwrap();
        assert_eq!(
            (
                s.current_healthy,
                s.desired_healthy,
                s.expected_pods,
                s.disruptions_allowed
            ),
            (3, 2, 3, 1)
        );
        assert_eq!(s.observed_generation, Some(2));
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (
                c.type_.as_str(),
                c.status.as_str(),
                c.reason.as_str(),
                c.observed_generation
            ),
            ("DisruptionAllowed", "True", "SufficientPods", Some(2))
        );
        // Written once, the same numbers need no write.
        let written = PodDisruptionBudget {
            status: Some(s),
            ..b.clone()
        };
        assert_eq!(status(&written, 3, 2, 3, BTreeMap::new(), now), None);
        // Short of pods: nothing allowed.
        let short = status(&written, 2, 2, 3, BTreeMap::new(), now).unwrap();
        assert_eq!(short.disruptions_allowed, 0);
        assert_eq!(
            short.conditions.as_ref().unwrap()[0].reason,
            "InsufficientPods"
        );
        // No expected pods: nothing allowed, however many are healthy.
        assert_eq!(
            status(&b, 3, 0, 0, BTreeMap::new(), now)
                .unwrap()
                .disruptions_allowed,
            0
        );
    }

    #[test]
    fn a_failed_sync_allows_nothing() {
        let b = pdb(
            json!({"maxUnavailable": 1}),
            json!({"disruptionsAllowed": 2, "observedGeneration": 1}),
        );
        let s = fail_safe(
            &b,
            "found no controllers for pod \"x\"",
            at("2026-01-01T00:00:00Z"),
        );
        assert_eq!(s.disruptions_allowed, 0);
        let c = &s.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (
                c.status.as_str(),
                c.reason.as_str(),
                c.message.as_str(),
                c.observed_generation
            ),
            (
                "False",
                "SyncFailed",
                "found no controllers for pod \"x\"",
                Some(1)
            )
        );
    }
}
