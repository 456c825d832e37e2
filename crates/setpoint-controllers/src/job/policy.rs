//! The Job's rules about its pods' outcomes: `podFailurePolicy` (what a failed pod means:
//! fail the Job, fail its index, count or ignore the failure) and `successPolicy` (which
//! succeeded indexes are enough for an Indexed Job to succeed).

use k8s_openapi::api::batch::v1::{PodFailurePolicy, SuccessPolicy};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

use super::indexes::Intervals;

/// What a `podFailurePolicy` rule does with a failed pod it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The Job fails at once (reason `PodFailurePolicy`).
    FailJob,
    /// The pod's index fails and is not retried (needs `backoffLimitPerIndex`).
    FailIndex,
    /// The failure is not counted against the back-off limits; the pod is replaced.
    Ignore,
    /// The failure is counted as any other.
    Count,
}

/// The first rule of `policy` that a failed pod matches: its action and, for `FailJob`, the
/// Job's failure message. Rules with an action this version does not know are skipped, as
/// the API tells clients to do.
pub fn match_pod_failure_policy(
    policy: &PodFailurePolicy,
    pod: &Pod,
) -> Option<(Action, Option<String>)> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = pod.status.as_ref();
    for (index, rule) in policy.rules.iter().enumerate() {
        let action = match rule.action.as_str() {
            "FailJob" => Action::FailJob,
            "FailIndex" => Action::FailIndex,
            "Ignore" => Action::Ignore,
            "Count" => Action::Count,
            _ => continue,
        };
        let message = if let Some(req) = &rule.on_exit_codes {
            let containers = status.and_then(|s| s.container_statuses.as_deref());
            let inits = status.and_then(|s| s.init_container_statuses.as_deref());
            let matching = |list: Option<&[ContainerStatus]>| {
                list.into_iter().flatten().find_map(|c| {
                    let code = c.state.as_ref()?.terminated.as_ref()?.exit_code;
                    let named = req.container_name.as_deref().is_none_or(|n| n == c.name);
                    // Exit code 0 is success, never a failure to match.
                    let hit = match req.operator.as_str() {
                        "In" => req.values.contains(&code),
                        "NotIn" => !req.values.contains(&code),
                        _ => false,
                    };
                    (named && code != 0 && hit).then(|| (c.name.clone(), code))
                })
            };
            let Some((container, code)) = matching(containers).or_else(|| matching(inits)) else {
                continue;
            };
            format!(
                "Container {container} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {index}",
                rule.action
            )
        } else if let Some(patterns) = &rule.on_pod_conditions {
            let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
            let Some(c) = conditions.iter().find(|c| {
                patterns
                    .iter()
                    .any(|p| p.type_ == c.type_ && p.status == c.status)
            }) else {
                continue;
            };
            format!(
                "Pod {ns}/{name} has condition {} matching {} rule at index {index}",
                c.type_, rule.action
            )
        } else {
            continue;
        };
        return Some((action, (action == Action::FailJob).then_some(message)));
    }
    None
}

/// The message of the first `successPolicy` rule the succeeded indexes meet
/// (`"Matched rules at index <n>"`), if any. A rule with `succeededIndexes` is met when all
/// of them succeeded, or at least `succeededCount` of them; a rule with only
/// `succeededCount` when that many indexes succeeded.
pub fn match_success_policy(
    policy: &SuccessPolicy,
    completions: i32,
    succeeded: &Intervals,
) -> Option<String> {
    if succeeded.is_empty() {
        return None;
    }
    policy.rules.iter().enumerate().find_map(|(index, rule)| {
        let met = match (&rule.succeeded_indexes, rule.succeeded_count) {
            (Some(list), count) => {
                let required = Intervals::parse(list, completions);
                if required.is_empty() {
                    return None;
                }
                let done = required.overlap(succeeded);
                done == required.total() || count.is_some_and(|c| done >= c)
            }
            (None, Some(count)) => succeeded.total() >= count,
            (None, None) => false,
        };
        met.then(|| format!("Matched rules at index {index}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{
        PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyOnPodConditionsPattern,
        PodFailurePolicyRule, SuccessPolicyRule,
    };
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, PodCondition, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn failed(codes: &[(&str, i32)], conditions: &[&str]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                phase: Some("Failed".into()),
                container_statuses: Some(
                    codes
                        .iter()
                        .map(|(n, code)| ContainerStatus {
                            name: (*n).into(),
                            state: Some(ContainerState {
                                terminated: Some(ContainerStateTerminated {
                                    exit_code: *code,
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                conditions: Some(
                    conditions
                        .iter()
                        .map(|t| PodCondition {
                            type_: (*t).into(),
                            status: "True".into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        }
    }

    fn exit_rule(
        action: &str,
        op: &str,
        values: &[i32],
        container: Option<&str>,
    ) -> PodFailurePolicyRule {
        PodFailurePolicyRule {
            action: action.into(),
            on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                container_name: container.map(Into::into),
                operator: op.into(),
                values: values.to_vec(),
            }),
            on_pod_conditions: None,
        }
    }

    #[test]
    fn exit_codes_pick_the_first_matching_rule() {
        let policy = PodFailurePolicy {
            rules: vec![
                exit_rule("Unknown", "In", &[42], None),
                exit_rule("FailJob", "In", &[42], Some("main")),
                exit_rule("Ignore", "NotIn", &[1, 2], None),
                exit_rule("Count", "In", &[1], None),
            ],
        };
        let (action, msg) =
            match_pod_failure_policy(&policy, &failed(&[("main", 42)], &[])).unwrap();
        assert_eq!(action, Action::FailJob);
        assert_eq!(
            msg.unwrap(),
            "Container main for pod ns/p failed with exit code 42 matching FailJob rule at index 1"
        );
        // Another container with 42 misses the named rule, and 42 is not in [1, 2].
        assert_eq!(
            match_pod_failure_policy(&policy, &failed(&[("side", 42)], &[])),
            Some((Action::Ignore, None))
        );
        assert_eq!(
            match_pod_failure_policy(&policy, &failed(&[("main", 1)], &[])),
            Some((Action::Count, None))
        );
        // A container that exited 0 never matches, even NotIn.
        assert_eq!(
            match_pod_failure_policy(&policy, &failed(&[("x", 0)], &[])),
            None
        );
    }

    #[test]
    fn pod_conditions_match_by_type_and_status() {
        let policy = PodFailurePolicy {
            rules: vec![PodFailurePolicyRule {
                action: "FailJob".into(),
                on_exit_codes: None,
                on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                    type_: "DisruptionTarget".into(),
                    status: "True".into(),
                }]),
            }],
        };
        let pod = failed(&[("main", 137)], &["DisruptionTarget"]);
        let (_, msg) = match_pod_failure_policy(&policy, &pod).unwrap();
        assert_eq!(
            msg.unwrap(),
            "Pod ns/p has condition DisruptionTarget matching FailJob rule at index 0"
        );
        assert_eq!(
            match_pod_failure_policy(&policy, &failed(&[], &["Ready"])),
            None
        );
    }

    #[test]
    fn success_policy_rules() {
        let rule = |indexes: Option<&str>, count: Option<i32>| SuccessPolicyRule {
            succeeded_indexes: indexes.map(Into::into),
            succeeded_count: count,
        };
        let policy = SuccessPolicy {
            rules: vec![
                rule(Some("0"), None),
                rule(Some("2-4"), Some(2)),
                rule(None, Some(4)),
            ],
        };
        let s = |v: &[i32]| Intervals::from_indexes(v.iter().copied());
        assert_eq!(match_success_policy(&policy, 10, &s(&[])), None);
        assert_eq!(match_success_policy(&policy, 10, &s(&[1, 2])), None);
        assert_eq!(
            match_success_policy(&policy, 10, &s(&[0])).as_deref(),
            Some("Matched rules at index 0")
        );
        assert_eq!(
            match_success_policy(&policy, 10, &s(&[3, 4])).as_deref(),
            Some("Matched rules at index 1")
        );
        assert_eq!(
            match_success_policy(&policy, 10, &s(&[5, 6, 7, 8])).as_deref(),
            Some("Matched rules at index 2")
        );
    }
}
