//! From the metrics' proposal to the replica count set, pure: upstream's stabilization
//! (the highest recommendation of the last `--horizontal-pod-autoscaler-downscale-stabilization`
//! without a `behavior`; with one, each direction's `stabilizationWindowSeconds`), the scaling
//! policies (`Pods` and `Percent` per `periodSeconds`, chosen by `selectPolicy`), the bounds,
//! and the conditions each step sets.
//!
//! The history the windows and periods look back over lives in [`History`], one per
//! autoscaler, kept in memory by the controller as upstream keeps it (a restarted controller
//! starts with none, and seeds it with the current size).

use chrono::{DateTime, Utc};
use k8s_openapi::api::autoscaling::v2::{
    HPAScalingPolicy, HPAScalingRules, HorizontalPodAutoscalerBehavior,
};

/// A recommendation (the metrics' proposal) and when it was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Recommendation {
    replicas: i32,
    at: DateTime<Utc>,
}

/// A rescale: how many replicas it added (or removed) and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ScaleEvent {
    change: i32,
    at: DateTime<Utc>,
    outdated: bool,
}

/// One autoscaler's recent recommendations and rescales.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    recommendations: Vec<Recommendation>,
    scale_up: Vec<ScaleEvent>,
    scale_down: Vec<ScaleEvent>,
}

/// A condition a step sets: (status, reason, message).
pub type Cond = (bool, &'static str, &'static str);

/// What normalizing a proposal decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Normalized {
    /// The replica count to set.
    pub replicas: i32,
    /// The recommendation after the stabilization window, before the bounds and policies
    /// (for the decision record).
    pub stabilized: i32,
    /// The `AbleToScale` condition (always true here: the scale was read).
    pub able_to_scale: Cond,
    /// The `ScalingLimited` condition.
    pub scaling_limited: Cond,
}

const READY: &str = "ReadyForNewScale";
const READY_MSG: &str = "recommended size matches current size";
const DOWN_STABILIZED: &str = "ScaleDownStabilized";
const DOWN_STABILIZED_MSG: &str =
    "recent recommendations were higher than current one, applying the highest recent recommendation";
const UP_STABILIZED: &str = "ScaleUpStabilized";
const UP_STABILIZED_MSG: &str =
    "recent recommendations were lower than current one, applying the lowest recent recommendation";
const WITHIN: &str = "DesiredWithinRange";
const WITHIN_MSG: &str = "the desired count is within the acceptable range";
const TOO_MANY: &str = "TooManyReplicas";
const TOO_MANY_MSG: &str = "the desired replica count is more than the maximum replica count";
const TOO_FEW: &str = "TooFewReplicas";
const TOO_FEW_MSG: &str = "the desired replica count is less than the minimum replica count";
const UP_LIMIT: &str = "ScaleUpLimit";
const UP_LIMIT_MSG: &str =
    "the desired replica count is increasing faster than the maximum scale rate";
const DOWN_LIMIT: &str = "ScaleDownLimit";
const DOWN_LIMIT_MSG: &str =
    "the desired replica count is decreasing faster than the maximum scale rate";

/// Without a `behavior`, a scale-up is capped at twice the current size (at least 4).
fn scale_up_limit(current: i32) -> i32 {
    (2.0 * f64::from(current)).max(4.0) as i32
}

/// `behavior` with upstream's defaults wherever it is silent (the API server fills them too
/// when a `behavior` is given; this covers objects written before that or by other servers).
/// `down_window` is the `--horizontal-pod-autoscaler-downscale-stabilization` window, which a
/// scale-down rule without `stabilizationWindowSeconds` takes.
pub fn with_defaults(
    behavior: &HorizontalPodAutoscalerBehavior,
    down_window: i32,
) -> (HPAScalingRules, HPAScalingRules) {
    let policy = |type_: &str, value, period| HPAScalingPolicy {
        type_: type_.into(),
        value,
        period_seconds: period,
    };
    let mut up = behavior.scale_up.clone().unwrap_or_default();
    up.stabilization_window_seconds.get_or_insert(0);
    up.select_policy.get_or_insert_with(|| "Max".into());
    if up.policies.as_ref().is_none_or(|p| p.is_empty()) {
        up.policies = Some(vec![policy("Pods", 4, 15), policy("Percent", 100, 15)]);
    }
    let mut down = behavior.scale_down.clone().unwrap_or_default();
    down.stabilization_window_seconds.get_or_insert(down_window);
    down.select_policy.get_or_insert_with(|| "Max".into());
    if down.policies.as_ref().is_none_or(|p| p.is_empty()) {
        down.policies = Some(vec![policy("Percent", 100, 15)]);
    }
    (up, down)
}

impl History {
    /// Seeds the history of an autoscaler seen for the first time with its current size, so
    /// that a restart does not scale down at once (upstream's `recordInitialRecommendation`).
    pub fn seed(&mut self, current: i32, now: DateTime<Utc>) {
        if self.recommendations.is_empty() {
            self.recommendations.push(Recommendation {
                replicas: current,
                at: now,
            });
        }
    }

    /// Records `r`, reusing the slot of a recommendation older than `cutoff`.
    fn record(&mut self, r: Recommendation, old: Option<usize>) {
        match old {
            Some(i) => self.recommendations[i] = r,
            None => self.recommendations.push(r),
        }
    }

    /// Without a `behavior`: the highest recommendation within the downscale window, then the
    /// bounds and the doubling cap (upstream's `normalizeDesiredReplicas`).
    pub fn normalize(
        &mut self,
        current: i32,
        proposed: i32,
        min: i32,
        max: i32,
        down_window: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Normalized {
        let cutoff = now - chrono::Duration::from_std(down_window).unwrap_or_default();
        let mut stabilized = proposed;
        let mut old = None;
        for (i, r) in self.recommendations.iter().enumerate() {
            if r.at < cutoff {
                old = Some(i);
            } else if r.replicas > stabilized {
                stabilized = r.replicas;
            }
        }
        self.record(
            Recommendation {
                replicas: proposed,
                at: now,
            },
            old,
        );
        let able_to_scale = if stabilized != proposed {
            (true, DOWN_STABILIZED, DOWN_STABILIZED_MSG)
        } else {
            (true, READY, READY_MSG)
        };
        let (limit, limit_reason, limit_msg) = if max > scale_up_limit(current) {
            (scale_up_limit(current), UP_LIMIT, UP_LIMIT_MSG)
        } else {
            (max, TOO_MANY, TOO_MANY_MSG)
        };
        let (replicas, reason, message) = if stabilized < min {
            (min, TOO_FEW, TOO_FEW_MSG)
        } else if stabilized > limit {
            (limit, limit_reason, limit_msg)
        } else {
            (stabilized, WITHIN, WITHIN_MSG)
        };
        Normalized {
            replicas,
            stabilized,
            able_to_scale,
            scaling_limited: (replicas != stabilized, reason, message),
        }
    }

    /// With a `behavior` (already through [`with_defaults`]): each direction's stabilization
    /// window, then its policies over their periods and the bounds (upstream's
    /// `normalizeDesiredReplicasWithBehaviors`).
    #[allow(clippy::too_many_arguments)]
    pub fn normalize_with_behavior(
        &mut self,
        current: i32,
        proposed: i32,
        min: i32,
        max: i32,
        up: &HPAScalingRules,
        down: &HPAScalingRules,
        now: DateTime<Utc>,
    ) -> Normalized {
        let window = |rules: &HPAScalingRules| {
            now - chrono::Duration::seconds(i64::from(
                rules.stabilization_window_seconds.unwrap_or(0),
            ))
        };
        let (up_cutoff, down_cutoff) = (window(up), window(down));
        let (mut up_rec, mut down_rec) = (proposed, proposed);
        let mut old = None;
        for (i, r) in self.recommendations.iter().enumerate() {
            if r.at > up_cutoff {
                up_rec = up_rec.min(r.replicas);
            }
            if r.at > down_cutoff {
                down_rec = down_rec.max(r.replicas);
            }
            if r.at < up_cutoff && r.at < down_cutoff {
                old = Some(i);
            }
        }
        // Within [lowest recent, highest recent], as close to the current size as possible.
        let stabilized = current.max(up_rec).min(down_rec);
        self.record(
            Recommendation {
                replicas: proposed,
                at: now,
            },
            old,
        );
        let able_to_scale = if stabilized == proposed {
            (true, READY, READY_MSG)
        } else if proposed >= current {
            (true, UP_STABILIZED, UP_STABILIZED_MSG)
        } else {
            (true, DOWN_STABILIZED, DOWN_STABILIZED_MSG)
        };
        let (replicas, reason, message) = if stabilized > current {
            let limit = self.scale_up_limit(current, up, now).max(current);
            let (allowed, reason, message) = if max > limit {
                (limit, UP_LIMIT, UP_LIMIT_MSG)
            } else {
                (max, TOO_MANY, TOO_MANY_MSG)
            };
            if stabilized > allowed {
                (allowed, reason, message)
            } else {
                (stabilized, WITHIN, WITHIN_MSG)
            }
        } else if stabilized < current {
            let limit = self.scale_down_limit(current, down, now).min(current);
            let (allowed, reason, message) = if min < limit {
                (limit, DOWN_LIMIT, DOWN_LIMIT_MSG)
            } else {
                (min, TOO_FEW, TOO_FEW_MSG)
            };
            if stabilized < allowed {
                (allowed, reason, message)
            } else {
                (stabilized, WITHIN, WITHIN_MSG)
            }
        } else {
            (stabilized, WITHIN, WITHIN_MSG)
        };
        Normalized {
            replicas,
            stabilized,
            able_to_scale,
            scaling_limited: (replicas != stabilized, reason, message),
        }
    }

    /// The replicas added (`up`) or removed within the last `period` seconds.
    fn change_within(events: &[ScaleEvent], period: i32, now: DateTime<Utc>) -> i32 {
        let cutoff = now - chrono::Duration::seconds(i64::from(period));
        events
            .iter()
            .filter(|e| !e.outdated && e.at > cutoff)
            .map(|e| e.change)
            .sum()
    }

    /// The size the policies allow scaling up to: per policy, the size at the start of its
    /// period plus what it allows; the largest (`Max`) or smallest (`Min`) of them.
    fn scale_up_limit(&self, current: i32, rules: &HPAScalingRules, now: DateTime<Utc>) -> i32 {
        let select = rules.select_policy.as_deref().unwrap_or("Max");
        if select == "Disabled" {
            return current;
        }
        let mut result: Option<i32> = None;
        for p in rules.policies.iter().flatten() {
            let start = current - Self::change_within(&self.scale_up, p.period_seconds, now)
                + Self::change_within(&self.scale_down, p.period_seconds, now);
            let proposed = match p.type_.as_str() {
                "Pods" => start + p.value,
                // Rounded up, or a small target could never grow.
                _ => (f64::from(start) * (1.0 + f64::from(p.value) / 100.0)).ceil() as i32,
            };
            result = Some(match (result, select) {
                (None, _) => proposed,
                (Some(r), "Min") => r.min(proposed),
                (Some(r), _) => r.max(proposed),
            });
        }
        result.unwrap_or(current)
    }

    /// The size the policies allow scaling down to (mirror of [`Self::scale_up_limit`]).
    fn scale_down_limit(&self, current: i32, rules: &HPAScalingRules, now: DateTime<Utc>) -> i32 {
        let select = rules.select_policy.as_deref().unwrap_or("Max");
        if select == "Disabled" {
            return current;
        }
        let mut result: Option<i32> = None;
        for p in rules.policies.iter().flatten() {
            let start = current - Self::change_within(&self.scale_up, p.period_seconds, now)
                + Self::change_within(&self.scale_down, p.period_seconds, now);
            let proposed = match p.type_.as_str() {
                "Pods" => start - p.value,
                _ => (f64::from(start) * (1.0 - f64::from(p.value) / 100.0)) as i32,
            };
            // The largest change is the smallest size; `Min` wants the smallest change.
            result = Some(match (result, select) {
                (None, _) => proposed,
                (Some(r), "Min") => r.max(proposed),
                (Some(r), _) => r.min(proposed),
            });
        }
        result.unwrap_or(current)
    }

    /// Records a rescale from `from` to `to` for the policies' periods (only with a
    /// `behavior`, as upstream): events older than the longest period are reused.
    pub fn record_rescale(
        &mut self,
        behavior: Option<(&HPAScalingRules, &HPAScalingRules)>,
        from: i32,
        to: i32,
        now: DateTime<Utc>,
    ) {
        let Some((up, down)) = behavior else {
            return;
        };
        let (rules, events) = if to > from {
            (up, &mut self.scale_up)
        } else {
            (down, &mut self.scale_down)
        };
        let longest = rules
            .policies
            .iter()
            .flatten()
            .map(|p| p.period_seconds)
            .max()
            .unwrap_or(0);
        let cutoff = now - chrono::Duration::seconds(i64::from(longest));
        for e in events.iter_mut() {
            if e.at < cutoff {
                e.outdated = true;
            }
        }
        let event = ScaleEvent {
            change: (to - from).abs(),
            at: now,
            outdated: false,
        };
        match events.iter().position(|e| e.outdated) {
            Some(i) => events[i] = event,
            None => events.push(event),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn rules(window: i32, select: &str, policies: &[(&str, i32, i32)]) -> HPAScalingRules {
        HPAScalingRules {
            stabilization_window_seconds: Some(window),
            select_policy: Some(select.into()),
            policies: Some(
                policies
                    .iter()
                    .map(|(t, v, p)| HPAScalingPolicy {
                        type_: (*t).into(),
                        value: *v,
                        period_seconds: *p,
                    })
                    .collect(),
            ),
        }
    }

    const FIVE_MIN: std::time::Duration = std::time::Duration::from_secs(300);

    #[test]
    fn without_behavior_a_scale_down_waits_for_the_window() {
        let mut h = History::default();
        h.seed(10, at(0));
        let n = h.normalize(10, 4, 1, 20, FIVE_MIN, at(15));
        assert_eq!(n.replicas, 10);
        assert_eq!(n.able_to_scale.1, "ScaleDownStabilized");
        assert_eq!(n.scaling_limited, (false, WITHIN, WITHIN_MSG));
        // A later, lower recommendation does not help while the 10 is in the window.
        assert_eq!(h.normalize(10, 3, 1, 20, FIVE_MIN, at(200)).replicas, 10);
        // Past the window the highest recent recommendation (4, at 15 s) is gone too by 316 s;
        // what is left is 3 (at 200 s) and the new one.
        let n = h.normalize(10, 5, 1, 20, FIVE_MIN, at(316));
        assert_eq!(n.replicas, 5);
        assert_eq!(n.able_to_scale, (true, READY, READY_MSG));
    }

    #[test]
    fn without_behavior_bounds_and_the_doubling_cap() {
        let mut h = History::default();
        let n = h.normalize(3, 30, 1, 50, FIVE_MIN, at(0));
        assert_eq!(n.replicas, 6);
        assert_eq!(n.scaling_limited, (true, UP_LIMIT, UP_LIMIT_MSG));
        let n = h.normalize(1, 30, 1, 50, FIVE_MIN, at(0));
        assert_eq!(n.replicas, 4);
        let n = h.normalize(5, 30, 1, 8, FIVE_MIN, at(0));
        assert_eq!(n.replicas, 8);
        assert_eq!(n.scaling_limited, (true, TOO_MANY, TOO_MANY_MSG));
        let mut h = History::default();
        let n = h.normalize(3, 1, 2, 8, FIVE_MIN, at(0));
        assert_eq!(n.replicas, 2);
        assert_eq!(n.scaling_limited, (true, TOO_FEW, TOO_FEW_MSG));
    }

    #[test]
    fn defaults_fill_what_a_behavior_leaves_out() {
        let (up, down) = with_defaults(&HorizontalPodAutoscalerBehavior::default(), 300);
        assert_eq!(up.stabilization_window_seconds, Some(0));
        assert_eq!(up.policies.as_ref().unwrap().len(), 2);
        assert_eq!(down.stabilization_window_seconds, Some(300));
        assert_eq!(down.select_policy.as_deref(), Some("Max"));
    }

    #[test]
    fn scale_up_policies_and_select_policy() {
        let pods4 = ("Pods", 4, 60);
        let percent100 = ("Percent", 100, 60);
        let down = rules(0, "Max", &[("Percent", 100, 15)]);
        let run = |select: &str, policies: &[(&str, i32, i32)]| {
            let mut h = History::default();
            h.normalize_with_behavior(10, 30, 1, 100, &rules(0, select, policies), &down, at(0))
        };
        assert_eq!(run("Max", &[pods4, percent100]).replicas, 20);
        let min = run("Min", &[pods4, percent100]);
        assert_eq!(min.replicas, 14);
        assert_eq!(min.scaling_limited, (true, UP_LIMIT, UP_LIMIT_MSG));
        let disabled = run("Disabled", &[pods4, percent100]);
        assert_eq!(disabled.replicas, 10);
        // Percent of the size at the period's start: 10 % of 10 adds one.
        assert_eq!(run("Max", &[("Percent", 10, 60)]).replicas, 11);
    }

    #[test]
    fn rescales_within_a_period_use_up_its_allowance() {
        let up = rules(0, "Max", &[("Pods", 4, 60)]);
        let down = rules(0, "Max", &[("Percent", 100, 15)]);
        let mut h = History::default();
        let n = h.normalize_with_behavior(10, 20, 1, 100, &up, &down, at(0));
        assert_eq!(n.replicas, 14);
        h.record_rescale(Some((&up, &down)), 10, 14, at(0));
        // 30 s later the period began at 10 replicas: still at most 14.
        let n = h.normalize_with_behavior(14, 20, 1, 100, &up, &down, at(30));
        assert_eq!(n.replicas, 14);
        assert_eq!(n.scaling_limited.1, UP_LIMIT);
        // After the period, 4 more.
        assert_eq!(
            h.normalize_with_behavior(14, 20, 1, 100, &up, &down, at(61))
                .replicas,
            18
        );
    }

    #[test]
    fn scale_down_window_and_policies() {
        let up = rules(0, "Max", &[("Pods", 4, 15)]);
        let down = rules(60, "Max", &[("Pods", 2, 30), ("Percent", 10, 30)]);
        let mut h = History::default();
        h.seed(10, at(0));
        let n = h.normalize_with_behavior(10, 2, 1, 100, &up, &down, at(10));
        assert_eq!(n.replicas, 10);
        assert_eq!(
            n.able_to_scale,
            (true, DOWN_STABILIZED, DOWN_STABILIZED_MSG)
        );
        // After the window: the policy with the biggest change (2 pods > 10 % of 10) wins.
        let n = h.normalize_with_behavior(10, 2, 1, 100, &up, &down, at(71));
        assert_eq!(n.replicas, 8);
        assert_eq!(n.scaling_limited, (true, DOWN_LIMIT, DOWN_LIMIT_MSG));
        // A minimum above the policy's floor: TooFewReplicas.
        let mut h = History::default();
        let free = rules(0, "Max", &[("Percent", 100, 15)]);
        let n = h.normalize_with_behavior(10, 2, 5, 100, &up, &free, at(0));
        assert_eq!(n.replicas, 5);
        assert_eq!(n.scaling_limited, (true, TOO_FEW, TOO_FEW_MSG));
    }

    #[test]
    fn scale_up_stabilization_takes_the_lowest_recent_recommendation() {
        let up = rules(60, "Max", &[("Percent", 100, 15)]);
        let down = rules(0, "Max", &[("Percent", 100, 15)]);
        let mut h = History::default();
        h.seed(3, at(0));
        let n = h.normalize_with_behavior(3, 6, 1, 10, &up, &down, at(10));
        assert_eq!(n.replicas, 3);
        assert_eq!(n.able_to_scale, (true, UP_STABILIZED, UP_STABILIZED_MSG));
        assert_eq!(
            h.normalize_with_behavior(3, 6, 1, 10, &up, &down, at(61))
                .replicas,
            6
        );
    }
}
