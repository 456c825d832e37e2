//! Upstream's replica calculator, pure: given the target's pods, the metrics read for them and
//! the time, how many replicas one metric asks for.
//!
//! The rules are kube-controller-manager's (`replica_calculator.go`), step for step: a change
//! within the tolerance (0.1) is no change; pods being deleted or failed are ignored; pending
//! pods, and for CPU pods still in their initialization period whose sample may predate
//! readiness, are "unready" and only counted (as using nothing) when the metric asks for a
//! scale-up; pods with no sample are "missing" and counted as using their whole request (or
//! the target, if higher) on a scale-down and nothing on a scale-up; a correction that would
//! flip the direction of the change cancels it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;

/// The calculator's settings: kube-controller-manager's `--horizontal-pod-autoscaler-*` flags.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tuning {
    /// `--horizontal-pod-autoscaler-tolerance`: the smallest ratio change acted on (0.1).
    pub tolerance: f64,
    /// `--horizontal-pod-autoscaler-cpu-initialization-period` (5 minutes): after a pod's
    /// start, a CPU sample counts only when it was taken a whole window after readiness.
    pub cpu_initialization_period: Duration,
    /// `--horizontal-pod-autoscaler-initial-readiness-delay` (30 s): an unready pod whose
    /// readiness last changed within this long after its start has never been ready.
    pub initial_readiness_delay: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            tolerance: 0.1,
            cpu_initialization_period: Duration::from_secs(300),
            initial_readiness_delay: Duration::from_secs(30),
        }
    }
}

/// One pod's sample of a metric, in thousandths (millicores, millibytes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PodMetric {
    /// The value, ×1000.
    pub milli: i64,
    /// When it was measured (the end of its window).
    pub timestamp: DateTime<Utc>,
    /// How long a span it averages.
    pub window: Duration,
}

/// Samples by pod name.
pub type PodMetrics = BTreeMap<String, PodMetric>;

/// Why no proposal could be made; the text is upstream's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CalcError(pub String);

fn err<T>(message: impl Into<String>) -> Result<T, CalcError> {
    Err(CalcError(message.into()))
}

/// A Resource or ContainerResource metric's proposal against a utilization target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UtilizationProposal {
    /// The replica count asked for.
    pub replicas: i32,
    /// Usage as a whole percentage of the requests (of the pods with samples).
    pub utilization: i32,
    /// The average usage per pod, ×1000.
    pub raw_average_milli: i64,
}

/// A proposal against an average (or total) value target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueProposal {
    /// The replica count asked for.
    pub replicas: i32,
    /// The usage the status reports, ×1000 (an average or a total, as the target is).
    pub usage_milli: i64,
}

fn secs(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> DateTime<Utc> {
    DateTime::from_timestamp(t.0.as_second(), 0).unwrap_or_default()
}

fn ready_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}

/// The pods a metric's samples are judged against, sorted as upstream's `groupPods` does.
#[derive(Debug, Default)]
struct Groups {
    ready: usize,
    unready: BTreeSet<String>,
    missing: BTreeSet<String>,
    ignored: BTreeSet<String>,
}

fn group_pods(
    pods: &[Arc<Pod>],
    metrics: &PodMetrics,
    resource: &str,
    tuning: &Tuning,
    now: DateTime<Utc>,
) -> Groups {
    let mut g = Groups::default();
    for pod in pods {
        let n = name(pod).to_string();
        if pod.metadata.deletion_timestamp.is_some() || phase(pod) == "Failed" {
            g.ignored.insert(n);
            continue;
        }
        // Pending pods are unready whatever their samples say.
        if phase(pod) == "Pending" {
            g.unready.insert(n);
            continue;
        }
        let Some(metric) = metrics.get(&n) else {
            g.missing.insert(n);
            continue;
        };
        if resource == "cpu" {
            let condition = ready_condition(pod);
            let start = pod.status.as_ref().and_then(|s| s.start_time.as_ref());
            let unready = match (condition, start) {
                (Some(c), Some(start)) => {
                    let start = secs(start);
                    let changed = c.last_transition_time.as_ref().map(secs).unwrap_or(start);
                    let init = chrono::Duration::from_std(tuning.cpu_initialization_period)
                        .unwrap_or_default();
                    if start + init > now {
                        // Still initializing: a sample counts only from a pod that is ready
                        // and was so for a whole window before the sample was taken.
                        let window = chrono::Duration::from_std(metric.window).unwrap_or_default();
                        c.status == "False" || metric.timestamp < changed + window
                    } else {
                        // Past it: left out only if it has never been ready.
                        let delay = chrono::Duration::from_std(tuning.initial_readiness_delay)
                            .unwrap_or_default();
                        c.status == "False" && start + delay > changed
                    }
                }
                _ => true,
            };
            if unready {
                g.unready.insert(n);
                continue;
            }
        }
        g.ready += 1;
    }
    g
}

/// Each pod's request of `resource` in thousandths: its containers' (only `container`'s when
/// given) and its sidecars' (restartable init containers).
pub fn pod_requests(
    pods: &[Arc<Pod>],
    container: Option<&str>,
    resource: &str,
) -> Result<BTreeMap<String, i64>, CalcError> {
    let mut out = BTreeMap::new();
    for pod in pods {
        let Some(spec) = pod.spec.as_ref() else {
            continue;
        };
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let mut sum = 0i64;
        for c in spec.containers.iter().chain(sidecars) {
            if container.is_some_and(|want| want != c.name) {
                continue;
            }
            let request = c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get(resource));
            match request.and_then(|q| {
                setpoint_api::quantity::Quantity::parse(&q.0)
                    .ok()?
                    .milli_value()
            }) {
                Some(m) => sum += m,
                None => {
                    return err(format!(
                        "missing request for {resource} in container {} of Pod {}",
                        c.name,
                        name(pod)
                    ))
                }
            }
        }
        out.insert(name(pod).to_string(), sum);
    }
    Ok(out)
}

/// Usage over requests as upstream's `GetResourceUtilizationRatio`: (ratio to the target,
/// whole percentage, raw average per pod).
pub fn utilization_ratio(
    metrics: &PodMetrics,
    requests: &BTreeMap<String, i64>,
    target_utilization: i32,
) -> Result<(f64, i32, i64), CalcError> {
    let (mut used, mut requested, mut entries) = (0i64, 0i64, 0i64);
    for (pod, m) in metrics {
        let Some(r) = requests.get(pod) else {
            continue;
        };
        used += m.milli;
        requested += r;
        entries += 1;
    }
    if requested == 0 {
        return err("no metrics returned matched known pods");
    }
    let utilization = (used * 100 / requested) as i32;
    Ok((
        f64::from(utilization) / f64::from(target_utilization),
        utilization,
        used / entries,
    ))
}

/// Average usage over a target average as upstream's `GetMetricUsageRatio`.
fn usage_ratio(metrics: &PodMetrics, target_milli: i64) -> (f64, i64) {
    let total: i64 = metrics.values().map(|m| m.milli).sum();
    let average = total / (metrics.len().max(1) as i64);
    (average as f64 / target_milli as f64, average)
}

fn ceil(x: f64) -> i32 {
    x.ceil() as i32
}

/// The replica calculator with its settings and clock.
#[derive(Clone, Copy, Debug)]
pub struct Calculator {
    /// The flags' values.
    pub tuning: Tuning,
    /// The time the samples are judged at.
    pub now: DateTime<Utc>,
}

impl Calculator {
    /// A Resource (or, with `container`, ContainerResource) metric against an
    /// `averageUtilization` target: upstream's `GetResourceReplicas`.
    pub fn resource_replicas(
        &self,
        current: i32,
        target_utilization: i32,
        resource: &str,
        container: Option<&str>,
        pods: &[Arc<Pod>],
        mut metrics: PodMetrics,
    ) -> Result<UtilizationProposal, CalcError> {
        if pods.is_empty() {
            return err("no pods returned by selector while calculating replica count");
        }
        let g = group_pods(pods, &metrics, resource, &self.tuning, self.now);
        for n in g.ignored.iter().chain(&g.unready) {
            metrics.remove(n);
        }
        if metrics.is_empty() {
            return err("did not receive metrics for targeted pods (pods might be unready)");
        }
        let requests = pod_requests(pods, container, resource)?;
        let (ratio, utilization, raw) = utilization_ratio(&metrics, &requests, target_utilization)?;
        let proposal = |replicas| UtilizationProposal {
            replicas,
            utilization,
            raw_average_milli: raw,
        };
        let scale_up_with_unready = !g.unready.is_empty() && ratio > 1.0;
        if !scale_up_with_unready && g.missing.is_empty() {
            if (1.0 - ratio).abs() <= self.tuning.tolerance {
                return Ok(proposal(current));
            }
            return Ok(proposal(ceil(ratio * g.ready as f64)));
        }
        if !g.missing.is_empty() {
            if ratio < 1.0 {
                // Scaling down: a pod without a sample may be busy, so it counts as using its
                // whole request (or the target, when that is above 100 %).
                let fallback = i64::from(target_utilization.max(100));
                for n in &g.missing {
                    let request = requests.get(n).copied().unwrap_or(0);
                    metrics.insert(n.clone(), sample(request * fallback / 100));
                }
            } else if ratio > 1.0 {
                // Scaling up: it counts as idle, so the scale-up is not overdone.
                for n in &g.missing {
                    metrics.insert(n.clone(), sample(0));
                }
            }
        }
        if scale_up_with_unready {
            for n in &g.unready {
                metrics.insert(n.clone(), sample(0));
            }
        }
        let (new_ratio, _, _) = utilization_ratio(&metrics, &requests, target_utilization)?;
        if (1.0 - new_ratio).abs() <= self.tuning.tolerance
            || (ratio < 1.0 && new_ratio > 1.0)
            || (ratio > 1.0 && new_ratio < 1.0)
        {
            return Ok(proposal(current));
        }
        let replicas = ceil(new_ratio * metrics.len() as f64);
        if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
            return Ok(proposal(current));
        }
        Ok(proposal(replicas))
    }

    /// Per-pod samples against an average value target (`averageValue` of a Resource or
    /// ContainerResource metric, or a Pods metric): upstream's `calcPlainMetricReplicas`.
    /// `resource` is the resource's name for resource metrics (the CPU readiness rules apply
    /// to `cpu`), empty for Pods metrics.
    pub fn plain_replicas(
        &self,
        current: i32,
        target_milli: i64,
        resource: &str,
        pods: &[Arc<Pod>],
        mut metrics: PodMetrics,
    ) -> Result<ValueProposal, CalcError> {
        if pods.is_empty() {
            return err("no pods returned by selector while calculating replica count");
        }
        let g = group_pods(pods, &metrics, resource, &self.tuning, self.now);
        for n in g.ignored.iter().chain(&g.unready) {
            metrics.remove(n);
        }
        if metrics.is_empty() {
            return err("did not receive metrics for targeted pods (pods might be unready)");
        }
        let (ratio, usage) = usage_ratio(&metrics, target_milli);
        let proposal = |replicas| ValueProposal {
            replicas,
            usage_milli: usage,
        };
        let scale_up_with_unready = !g.unready.is_empty() && ratio > 1.0;
        if !scale_up_with_unready && g.missing.is_empty() {
            if (1.0 - ratio).abs() <= self.tuning.tolerance {
                return Ok(proposal(current));
            }
            return Ok(proposal(ceil(ratio * g.ready as f64)));
        }
        if !g.missing.is_empty() {
            // On a scale-down a pod without a sample counts as using the target exactly; on
            // a scale-up, as using nothing.
            let fill = if ratio < 1.0 { target_milli } else { 0 };
            for n in &g.missing {
                metrics.insert(n.clone(), sample(fill));
            }
        }
        if scale_up_with_unready {
            for n in &g.unready {
                metrics.insert(n.clone(), sample(0));
            }
        }
        let (new_ratio, _) = usage_ratio(&metrics, target_milli);
        if (1.0 - new_ratio).abs() <= self.tuning.tolerance
            || (ratio < 1.0 && new_ratio > 1.0)
            || (ratio > 1.0 && new_ratio < 1.0)
        {
            return Ok(proposal(current));
        }
        let replicas = ceil(new_ratio * metrics.len() as f64);
        if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
            return Ok(proposal(current));
        }
        Ok(proposal(replicas))
    }

    /// A single value against a `value` target (Object and External metrics): upstream's
    /// `getUsageRatioReplicaCount` — the ratio times the ready pods, or from zero replicas
    /// the ratio itself.
    pub fn usage_ratio_replicas(
        &self,
        current: i32,
        usage_milli: i64,
        target_milli: i64,
        pods: &[Arc<Pod>],
    ) -> Result<ValueProposal, CalcError> {
        let ratio = usage_milli as f64 / target_milli as f64;
        let replicas = if current != 0 {
            if (1.0 - ratio).abs() <= self.tuning.tolerance {
                current
            } else {
                if pods.is_empty() {
                    return err("unable to calculate ready pods: no pods returned by selector while calculating replica count");
                }
                let ready = pods
                    .iter()
                    .filter(|p| {
                        phase(p) == "Running"
                            && ready_condition(p).is_some_and(|c| c.status == "True")
                    })
                    .count();
                ceil(ratio * ready as f64)
            }
        } else {
            ceil(ratio)
        };
        Ok(ValueProposal {
            replicas,
            usage_milli,
        })
    }

    /// A total against an `averageValue` target (Object and External metrics): the total
    /// divided by the per-pod target, unless within tolerance of `replicas` × target; the
    /// usage reported is the total per replica, rounded up.
    pub fn per_pod_replicas(
        &self,
        replicas: i32,
        usage_milli: i64,
        target_milli: i64,
    ) -> ValueProposal {
        let mut out = replicas;
        let ratio = usage_milli as f64 / (target_milli as f64 * f64::from(replicas));
        if (1.0 - ratio).abs() > self.tuning.tolerance {
            out = ceil(usage_milli as f64 / target_milli as f64);
        }
        ValueProposal {
            replicas: out,
            usage_milli: ceil(usage_milli as f64 / f64::from(replicas)) as i64,
        }
    }
}

/// A sample the calculator makes up for a pod (its time does not matter any more).
fn sample(milli: i64) -> PodMetric {
    PodMetric {
        milli,
        timestamp: DateTime::<Utc>::default(),
        window: Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    //! The cases of upstream's `replica_calculator_test.go`, rewritten with one container per
    //! pod (upstream's fixtures have two, which doubles the raw values, not the counts).
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, PodCondition, PodSpec, PodStatus, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-06-01T12:00:00Z")
            .unwrap()
            .to_utc()
    }

    fn t(d: DateTime<Utc>) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(d.timestamp()).unwrap())
    }

    /// How a fixture pod stands.
    #[derive(Clone, Copy)]
    struct P {
        phase: &'static str,
        ready: &'static str,
        /// Started long ago (past the CPU initialization period) or just now.
        hot: bool,
        deleting: bool,
        request: Option<&'static str>,
    }

    const RUNNING: P = P {
        phase: "Running",
        ready: "True",
        hot: false,
        deleting: false,
        request: Some("1"),
    };

    fn pods(specs: &[P]) -> Vec<Arc<Pod>> {
        specs
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (start, transition) = if p.hot {
                    (
                        now() - chrono::Duration::minutes(1),
                        now() - chrono::Duration::seconds(10),
                    )
                } else {
                    // Long started; a pod unready since its start has never been ready.
                    let start = now() - chrono::Duration::minutes(10);
                    (start, start)
                };
                let requests = p.request.map(|r| [("cpu".to_string(), Q(r.into()))].into());
                Arc::new(Pod {
                    metadata: ObjectMeta {
                        name: Some(format!("p{i}")),
                        deletion_timestamp: p.deleting.then(|| t(now())),
                        ..Default::default()
                    },
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: "c".into(),
                            resources: Some(ResourceRequirements {
                                requests,
                                ..Default::default()
                            }),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    status: Some(PodStatus {
                        phase: Some(p.phase.into()),
                        start_time: Some(t(start)),
                        conditions: Some(vec![PodCondition {
                            type_: "Ready".into(),
                            status: p.ready.into(),
                            last_transition_time: Some(t(transition)),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                })
            })
            .collect()
    }

    fn levels(values: &[i64]) -> PodMetrics {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                (
                    format!("p{i}"),
                    PodMetric {
                        milli: *v,
                        timestamp: now() - chrono::Duration::seconds(5),
                        window: Duration::from_secs(30),
                    },
                )
            })
            .collect()
    }

    fn calc() -> Calculator {
        Calculator {
            tuning: Tuning::default(),
            now: now(),
        }
    }

    fn cpu(
        current: i32,
        target: i32,
        p: &[P],
        m: &[i64],
    ) -> Result<UtilizationProposal, CalcError> {
        calc().resource_replicas(current, target, "cpu", None, &pods(p), levels(m))
    }

    fn ok(replicas: i32, utilization: i32, raw: i64) -> Result<UtilizationProposal, CalcError> {
        Ok(UtilizationProposal {
            replicas,
            utilization,
            raw_average_milli: raw,
        })
    }

    fn unready() -> P {
        P {
            ready: "False",
            ..RUNNING
        }
    }

    #[test]
    fn scale_up_and_down() {
        assert_eq!(cpu(3, 30, &[RUNNING; 3], &[300, 500, 700]), ok(5, 50, 500));
        assert_eq!(
            cpu(5, 50, &[RUNNING; 5], &[100, 300, 500, 250, 250]),
            ok(3, 28, 280)
        );
    }

    #[test]
    fn the_seeds_example_140_percent_on_3_pods_is_6() {
        // 140m used of 100m requested on each of 3 pods against a 70 % target.
        let p = P {
            request: Some("100m"),
            ..RUNNING
        };
        assert_eq!(cpu(3, 70, &[p; 3], &[140, 140, 140]), ok(6, 140, 140));
    }

    #[test]
    fn unready_pods_make_a_smaller_scale_up() {
        let p = [unready(), RUNNING, RUNNING];
        assert_eq!(cpu(3, 30, &p, &[300, 500, 700]), ok(4, 60, 600));
        // ... or none, when counting them as idle would flip the direction.
        let p = [RUNNING, unready(), unready()];
        assert_eq!(cpu(3, 30, &p, &[400, 500, 700]), ok(3, 40, 400));
    }

    #[test]
    fn cpu_samples_of_pods_still_initializing_count_as_unready() {
        let hot = P {
            hot: true,
            ..RUNNING
        };
        assert_eq!(
            cpu(3, 30, &[hot, RUNNING, RUNNING], &[300, 500, 700]),
            ok(4, 60, 600)
        );
        assert_eq!(
            cpu(3, 30, &[RUNNING, hot, hot], &[400, 500, 700]),
            ok(3, 40, 400)
        );
        // The CPU rule is CPU's only: memory samples of the same pods all count.
        let mem = calc().resource_replicas(
            3,
            30,
            "memory",
            None,
            &pods(
                &[P {
                    request: None,
                    ..hot
                }; 3],
            ),
            levels(&[300, 500, 700]),
        );
        assert_eq!(
            mem,
            Err(CalcError(
                "missing request for memory in container c of Pod p0".into()
            ))
        );
    }

    #[test]
    fn an_unready_pod_that_was_ready_after_the_initial_delay_counts() {
        // Started 10 minutes ago, unready since 9 minutes ago (long after its start): it has
        // been ready before, so past the initialization period its sample counts.
        let p = [unready(), RUNNING, RUNNING];
        let mut ps = pods(&p);
        let pod = Arc::make_mut(&mut ps[0]);
        let status = pod.status.as_mut().unwrap();
        status.start_time = Some(t(now() - chrono::Duration::minutes(10)));
        status.conditions.as_mut().unwrap()[0].last_transition_time =
            Some(t(now() - chrono::Duration::minutes(9)));
        // Pending would be unready whatever the condition says; Running and unready but
        // past the delay is counted: (300+500+700)/3000 = 50 % of a 30 % target.
        let counted = calc().resource_replicas(3, 30, "cpu", None, &ps, levels(&[300, 500, 700]));
        assert_eq!(counted, ok(5, 50, 500));
        // Unready since 10 s after its start: never ready, left out.
        let pod = Arc::make_mut(&mut ps[0]);
        pod.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time = Some(
            t(now() - chrono::Duration::minutes(10) + chrono::Duration::seconds(10)),
        );
        let left_out = calc().resource_replicas(3, 30, "cpu", None, &ps, levels(&[300, 500, 700]));
        assert_eq!(left_out, ok(4, 60, 600));
    }

    #[test]
    fn failed_and_deleted_pods_are_ignored() {
        let failed = P {
            phase: "Failed",
            ready: "False",
            ..RUNNING
        };
        let p = [RUNNING, RUNNING, failed, failed];
        assert_eq!(cpu(2, 30, &p, &[500, 700, 100, 100]), ok(4, 60, 600));
        let deleting = P {
            deleting: true,
            ..RUNNING
        };
        let p = [RUNNING, RUNNING, deleting, deleting];
        assert_eq!(cpu(2, 30, &p, &[500, 700, 100, 100]), ok(4, 60, 600));
        let p = [RUNNING, RUNNING, RUNNING, deleting, deleting];
        assert_eq!(cpu(5, 50, &p, &[100, 300, 500, 250, 250]), ok(2, 30, 300));
    }

    #[test]
    fn unready_pods_are_left_out_of_a_scale_down() {
        let p = [RUNNING, RUNNING, RUNNING, unready(), unready()];
        assert_eq!(cpu(5, 50, &p, &[100, 300, 500, 250, 250]), ok(2, 30, 300));
    }

    #[test]
    fn tolerance() {
        let req = |r| P {
            request: Some(r),
            ..RUNNING
        };
        let p = [req("0.9"), req("1.0"), req("1.1")];
        assert_eq!(cpu(3, 100, &p, &[1010, 1030, 1020]), ok(3, 102, 1020));
        // A wider tolerance ignores a bigger change.
        let wide = Calculator {
            tuning: Tuning {
                tolerance: 0.5,
                ..Tuning::default()
            },
            now: now(),
        };
        let p = pods(&[RUNNING; 3]);
        let r = wide.resource_replicas(3, 100, "cpu", None, &p, levels(&[1400, 1400, 1400]));
        assert_eq!(r, ok(3, 140, 1400));
    }

    #[test]
    fn samples_of_unknown_pods_are_ignored() {
        assert_eq!(
            cpu(4, 100, &[RUNNING; 4], &[4000, 9500, 3000, 7000, 3200, 2000]),
            ok(24, 587, 5875)
        );
    }

    #[test]
    fn missing_samples() {
        // Scale-down: the missing pods count as using their whole request.
        assert_eq!(cpu(4, 100, &[RUNNING; 4], &[400, 95]), ok(3, 24, 247));
        // Exactly on target: no change.
        assert_eq!(cpu(2, 100, &[RUNNING; 2], &[1000]), ok(2, 100, 1000));
        // Above: the missing pod counts as idle, which brings it within tolerance.
        assert_eq!(cpu(2, 100, &[RUNNING; 2], &[1900]), ok(2, 190, 1900));
        // Below: the missing pod counts as busy, which keeps the size.
        assert_eq!(cpu(2, 100, &[RUNNING; 2], &[600]), ok(2, 60, 600));
        // A surge pod without a sample during a rolling update does not scale up.
        assert_eq!(cpu(2, 50, &[RUNNING; 3], &[100, 100]), ok(2, 10, 100));
    }

    #[test]
    fn missing_and_unready_together() {
        let p = [unready(), RUNNING, RUNNING];
        // Counting the missing pod as busy would turn a scale-down into a scale-up: no change.
        assert_eq!(cpu(3, 50, &p, &[100, 450]), ok(3, 45, 450));
        // Scale-up: unready and missing both count as idle.
        assert_eq!(cpu(3, 50, &p, &[100, 2000]), ok(4, 200, 2000));
        let hot = P {
            hot: true,
            ..RUNNING
        };
        assert_eq!(
            cpu(3, 50, &[hot, RUNNING, RUNNING], &[100, 2000]),
            ok(4, 200, 2000)
        );
        let p = [unready(), RUNNING, RUNNING, RUNNING];
        assert_eq!(cpu(4, 50, &p, &[100, 100, 100]), ok(3, 10, 100));
    }

    #[test]
    fn errors() {
        assert_eq!(
            cpu(3, 50, &[], &[]),
            Err(CalcError(
                "no pods returned by selector while calculating replica count".into()
            ))
        );
        assert_eq!(
            cpu(3, 50, &[unready(); 3], &[100, 100, 100]),
            Err(CalcError(
                "did not receive metrics for targeted pods (pods might be unready)".into()
            ))
        );
        let none = P {
            request: None,
            ..RUNNING
        };
        assert_eq!(
            cpu(3, 50, &[none; 3], &[100, 100, 100]),
            Err(CalcError(
                "missing request for cpu in container c of Pod p0".into()
            ))
        );
    }

    #[test]
    fn pods_metrics_average_value() {
        let c = calc();
        let p = pods(&[RUNNING; 3]);
        let v = c.plain_replicas(3, 15_000, "", &p, levels(&[20_000, 10_000, 30_000]));
        assert_eq!(
            v,
            Ok(ValueProposal {
                replicas: 4,
                usage_milli: 20_000
            })
        );
        let v = c.plain_replicas(
            5,
            10_000,
            "",
            &pods(&[RUNNING; 5]),
            levels(&[1_000, 2_000, 3_000, 4_000, 5_000]),
        );
        assert_eq!(
            v,
            Ok(ValueProposal {
                replicas: 2,
                usage_milli: 3_000
            })
        );
        // Unready pods in a scale-up count as zero (upstream's CM unready case).
        let p = pods(&[unready(), RUNNING, RUNNING]);
        let v = c.plain_replicas(3, 15_000, "", &p, levels(&[50_000, 10_000, 30_000]));
        // A Pods metric applies no readiness rule (only Pending pods are unready), so the
        // unready pod's sample counts: (50+10+30)/3 = 30 against 15 → 2.0 → 6.
        assert_eq!(
            v,
            Ok(ValueProposal {
                replicas: 6,
                usage_milli: 30_000
            })
        );
        // AverageValue of a resource: CPU's readiness rules apply. The ready pods average
        // 400m against 150m; counting the unready one as idle, 266m: ceil(1.78 × 3) = 6.
        let v = c.plain_replicas(3, 150, "cpu", &p, levels(&[500, 300, 500]));
        assert_eq!(
            v,
            Ok(ValueProposal {
                replicas: 6,
                usage_milli: 400
            })
        );
        // ... and no change when counting it as idle would flip the direction.
        let v = c.plain_replicas(3, 150, "cpu", &p, levels(&[500, 100, 300]));
        assert_eq!(
            v,
            Ok(ValueProposal {
                replicas: 3,
                usage_milli: 200
            })
        );
    }

    #[test]
    fn object_and_external_values() {
        let c = calc();
        let ready = pods(&[RUNNING; 3]);
        // Object Value: ratio 5000/3000 on 3 ready pods.
        assert_eq!(
            c.usage_ratio_replicas(3, 5_000, 3_000, &ready),
            Ok(ValueProposal {
                replicas: 5,
                usage_milli: 5_000
            })
        );
        // Within tolerance: unchanged.
        assert_eq!(
            c.usage_ratio_replicas(3, 3_100, 3_000, &ready)
                .unwrap()
                .replicas,
            3
        );
        // Only ready, running pods count.
        let mixed = pods(&[
            RUNNING,
            unready(),
            P {
                phase: "Pending",
                ..RUNNING
            },
        ]);
        assert_eq!(
            c.usage_ratio_replicas(3, 6_000, 3_000, &mixed)
                .unwrap()
                .replicas,
            2
        );
        // From zero: the ratio itself.
        assert_eq!(
            c.usage_ratio_replicas(0, 6_500, 3_000, &[])
                .unwrap()
                .replicas,
            3
        );
        // AverageValue: the total over the per-pod target.
        assert_eq!(
            c.per_pod_replicas(3, 8_600, 2_000),
            ValueProposal {
                replicas: 5,
                usage_milli: 2_867
            }
        );
        assert_eq!(c.per_pod_replicas(3, 6_100, 2_000).replicas, 3);
    }
}
