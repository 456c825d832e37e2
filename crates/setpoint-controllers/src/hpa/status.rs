//! The autoscaler's status conditions and the texts upstream puts in them and in its Events.

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// `AbleToScale`: whether the target's scale could be read and written.
pub const ABLE_TO_SCALE: &str = "AbleToScale";
/// `ScalingActive`: whether a replica count could be computed from the metrics.
pub const SCALING_ACTIVE: &str = "ScalingActive";
/// `ScalingLimited`: whether the bounds or the policies held the count back.
pub const SCALING_LIMITED: &str = "ScalingLimited";

/// Sets a condition in `conditions`, as upstream's `setConditionInList`: a new condition is
/// appended; an existing one keeps its `lastTransitionTime` unless its status changes.
pub fn set_condition(
    conditions: &mut Vec<HorizontalPodAutoscalerCondition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    now: &Time,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let i = match conditions.iter().position(|c| c.type_ == type_) {
        Some(i) => i,
        None => {
            conditions.push(HorizontalPodAutoscalerCondition {
                type_: type_.into(),
                ..Default::default()
            });
            conditions.len() - 1
        }
    };
    let c = &mut conditions[i];
    if c.status != status || c.last_transition_time.is_none() {
        c.last_transition_time = Some(now.clone());
    }
    c.status = status;
    c.reason = Some(reason.into());
    c.message = Some(message);
}

/// The `ScalingActive` message when a metric could not be turned into a count.
pub fn unable_to_compute(error: &str) -> String {
    format!("the HPA was unable to compute the replica count: {error}")
}

/// The `ScalingActive` message when a count was computed, naming the metric that won.
pub fn valid_metric_found(metric: &str) -> String {
    format!("the HPA was able to successfully calculate a replica count from {metric}")
}

/// The `AbleToScale` message when the scale could not be read.
pub fn failed_get_scale(error: &str) -> String {
    format!("the HPA controller was unable to get the target's current scale: {error}")
}

/// The `AbleToScale` message when the scale was read.
pub const SUCCEEDED_GET_SCALE: &str =
    "the HPA controller was able to get the target's current scale";

/// The `AbleToScale` message when the scale could not be written.
pub fn failed_update_scale(error: &str) -> String {
    format!("the HPA controller was unable to update the target scale: {error}")
}

/// The `AbleToScale` message after a rescale.
pub fn succeeded_rescale(replicas: i32) -> String {
    format!("the HPA controller was able to update the target scale to {replicas}")
}

/// The reason of a rescale that brings the size back above `minReplicas`.
pub const BELOW_MIN: &str = "Current number of replicas below Spec.MinReplicas";
/// The reason of a rescale that brings the size back below `maxReplicas`.
pub const ABOVE_MAX: &str = "Current number of replicas above Spec.MaxReplicas";
/// The reason of a scale-down on metrics.
pub const ALL_BELOW: &str = "All metrics below target";

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let mut cs = Vec::new();
        set_condition(
            &mut cs,
            ABLE_TO_SCALE,
            true,
            "SucceededGetScale",
            "a".into(),
            &at(10),
        );
        set_condition(
            &mut cs,
            ABLE_TO_SCALE,
            true,
            "ReadyForNewScale",
            "b".into(),
            &at(20),
        );
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].last_transition_time, Some(at(10)));
        assert_eq!(cs[0].reason.as_deref(), Some("ReadyForNewScale"));
        set_condition(
            &mut cs,
            ABLE_TO_SCALE,
            false,
            "FailedGetScale",
            "c".into(),
            &at(30),
        );
        assert_eq!(cs[0].last_transition_time, Some(at(30)));
        assert_eq!(cs[0].status, "False");
    }
}
