//! One metric source at a time: read its values through [`MetricsClient`], ask the
//! [`Calculator`] for a proposal, and describe the outcome in upstream's words — the
//! `currentMetrics` entry and the name a `SuccessfulRescale` reason uses, or on failure the
//! condition reason (`FailedGetResourceMetric`, `FailedGetPodsMetric`, ...) and its messages.

use std::sync::Arc;

use k8s_openapi::api::autoscaling::v2::{
    ContainerResourceMetricStatus, ExternalMetricStatus, MetricIdentifier, MetricSpec,
    MetricStatus, MetricTarget, MetricValueStatus, ObjectMetricStatus, PodsMetricStatus,
    ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as LabelSelectorSpec;
use setpoint_api::selector::LabelSelector;

use super::metrics::MetricsClient;
use super::replicas::Calculator;

/// What every metric of one autoscaler is computed against.
pub struct Inputs<'a> {
    /// Reads metrics.
    pub metrics: &'a MetricsClient,
    /// The replica calculator and its clock.
    pub calc: Calculator,
    /// The autoscaler's namespace.
    pub namespace: &'a str,
    /// The target's pod selector (its Scale's `status.selector`).
    pub selector: &'a str,
    /// The pods it selects.
    pub pods: &'a [Arc<Pod>],
    /// The target's `spec.replicas`.
    pub spec_replicas: i32,
    /// The target's `status.replicas`.
    pub status_replicas: i32,
}

/// A metric's proposal.
#[derive(Debug, PartialEq)]
pub struct Proposal {
    /// The replica count it asks for.
    pub replicas: i32,
    /// How a rescale's reason names it, e.g. `cpu resource utilization (percentage of request)`.
    pub name: String,
    /// Its `currentMetrics` entry.
    pub status: MetricStatus,
}

/// A metric that gave no proposal.
#[derive(Debug, PartialEq)]
pub struct Failure {
    /// The `ScalingActive` reason and Event reason, e.g. `FailedGetResourceMetric`.
    pub reason: &'static str,
    /// The Event's message, which the condition's message quotes.
    pub cause: String,
    /// The error as `computeReplicasForMetric` returns it (quoted in
    /// `FailedComputeMetricsReplicas`).
    pub error: String,
    /// Its `currentMetrics` entry (empty, as upstream leaves it).
    pub placeholder: MetricStatus,
}

fn fail(reason: &'static str, cause: String, error: String) -> Failure {
    Failure {
        reason,
        cause,
        error,
        placeholder: MetricStatus::default(),
    }
}

/// A quantity's value in thousandths.
fn milli(q: &Option<Quantity>) -> Option<i64> {
    setpoint_api::quantity::Quantity::parse(&q.as_ref()?.0)
        .ok()?
        .milli_value()
}

/// Thousandths as a canonical quantity (`140m`, `2`), as `NewMilliQuantity` prints.
pub fn milli_quantity(m: i64) -> Quantity {
    Quantity(setpoint_api::quantity::canonical_quantity(&format!("{m}m")))
}

/// A metric's label selector as a query string; an unparseable one is the error.
fn metric_selector(s: &Option<LabelSelectorSpec>) -> Result<String, String> {
    match s {
        None => Ok(String::new()),
        Some(s) => {
            let v = serde_json::to_value(s).map_err(|e| e.to_string())?;
            LabelSelector::label_selector_json_to_string(&v).map_err(|e| e.to_string())
        }
    }
}

/// Upstream prints an external metric's selector with Go's `%+v`; an absent one is `<nil>`.
fn selector_text(s: &Option<LabelSelectorSpec>) -> String {
    match metric_selector(s) {
        Ok(t) if s.is_some() => format!("{{{t}}}"),
        _ => "<nil>".into(),
    }
}

/// Computes one metric's proposal.
pub async fn compute(i: &Inputs<'_>, spec: &MetricSpec) -> Result<Proposal, Failure> {
    match spec.type_.as_str() {
        "Resource" => {
            let Some(r) = spec.resource.as_ref() else {
                return Err(missing_source(spec));
            };
            let (replicas, name, current) =
                resource(i, &r.name, None, &r.target)
                    .await
                    .map_err(|(reason, cause)| {
                        let error =
                            format!("failed to get {} resource metric value: {cause}", r.name);
                        fail(reason, cause, error)
                    })?;
            Ok(Proposal {
                replicas,
                name,
                status: MetricStatus {
                    type_: "Resource".into(),
                    resource: Some(ResourceMetricStatus {
                        name: r.name.clone(),
                        current,
                    }),
                    ..Default::default()
                },
            })
        }
        "ContainerResource" => {
            let Some(r) = spec.container_resource.as_ref() else {
                return Err(missing_source(spec));
            };
            let (replicas, name, current) = resource(i, &r.name, Some(&r.container), &r.target)
                .await
                .map_err(|(_, cause)| {
                    let error = format!("failed to get {} container metric value: {cause}", r.name);
                    fail("FailedGetContainerResourceMetric", cause, error)
                })?;
            Ok(Proposal {
                replicas,
                name,
                status: MetricStatus {
                    type_: "ContainerResource".into(),
                    container_resource: Some(ContainerResourceMetricStatus {
                        name: r.name.clone(),
                        container: r.container.clone(),
                        current,
                    }),
                    ..Default::default()
                },
            })
        }
        "Pods" => {
            let Some(p) = spec.pods.as_ref() else {
                return Err(missing_source(spec));
            };
            let failed = |cause: String| {
                let error = format!("failed to get pods metric value: {cause}");
                fail("FailedGetPodsMetric", cause, error)
            };
            let metric_sel = metric_selector(&p.metric.selector).map_err(failed)?;
            let target = milli(&p.target.average_value).ok_or_else(|| {
                failed("invalid pods metric source: an average value target is required".into())
            })?;
            let samples = i
                .metrics
                .pods_metric(i.namespace, &p.metric.name, i.selector, &metric_sel)
                .await
                .map_err(|e| failed(format!("unable to get metric {}: {e}", p.metric.name)))?;
            let v = i
                .calc
                .plain_replicas(i.spec_replicas, target, "", i.pods, samples)
                .map_err(|e| failed(e.to_string()))?;
            Ok(Proposal {
                replicas: v.replicas,
                name: format!("pods metric {}", p.metric.name),
                status: MetricStatus {
                    type_: "Pods".into(),
                    pods: Some(PodsMetricStatus {
                        metric: p.metric.clone(),
                        current: MetricValueStatus {
                            average_value: Some(milli_quantity(v.usage_milli)),
                            ..Default::default()
                        },
                    }),
                    ..Default::default()
                },
            })
        }
        "Object" => {
            let Some(o) = spec.object.as_ref() else {
                return Err(missing_source(spec));
            };
            let failed = |cause: String| {
                let error = format!("failed to get object metric value: {cause}");
                fail("FailedGetObjectMetric", cause, error)
            };
            let metric_sel = metric_selector(&o.metric.selector).map_err(failed)?;
            let described = &o.described_object;
            let plural = plural_guess(&described.kind);
            let usage = i
                .metrics
                .object_metric(
                    i.namespace,
                    &plural,
                    &described.name,
                    &o.metric.name,
                    &metric_sel,
                )
                .await
                .map_err(|e| {
                    failed(format!(
                        "unable to get metric {}: {e} on {} {}/{}",
                        o.metric.name, described.kind, i.namespace, described.name
                    ))
                })?;
            let (replicas, current) = if let Some(target) = milli(&o.target.value) {
                let v = i
                    .calc
                    .usage_ratio_replicas(i.spec_replicas, usage, target, i.pods)
                    .map_err(|e| failed(e.to_string()))?;
                let current = MetricValueStatus {
                    value: Some(milli_quantity(v.usage_milli)),
                    ..Default::default()
                };
                (v.replicas, current)
            } else if let Some(target) = milli(&o.target.average_value) {
                let v = i.calc.per_pod_replicas(i.status_replicas, usage, target);
                let current = MetricValueStatus {
                    average_value: Some(milli_quantity(v.usage_milli)),
                    ..Default::default()
                };
                (v.replicas, current)
            } else {
                return Err(failed(
                    "invalid object metric source: neither a value target nor an average value target was set".into(),
                ));
            };
            Ok(Proposal {
                replicas,
                name: format!("{} metric {}", described.kind, o.metric.name),
                status: MetricStatus {
                    type_: "Object".into(),
                    object: Some(ObjectMetricStatus {
                        described_object: described.clone(),
                        metric: o.metric.clone(),
                        current,
                    }),
                    ..Default::default()
                },
            })
        }
        "External" => {
            let Some(x) = spec.external.as_ref() else {
                return Err(missing_source(spec));
            };
            let name = &x.metric.name;
            let failed = |cause: String| {
                let error = format!("failed to get {name} external metric value: {cause}");
                fail("FailedGetExternalMetric", cause, error)
            };
            let metric_sel = metric_selector(&x.metric.selector).map_err(failed)?;
            let values = i
                .metrics
                .external_metric(i.namespace, name, &metric_sel)
                .await
                .map_err(|e| {
                    failed(format!(
                        "failed to get {name} external metric: unable to get external metric {}/{name}/{}: {e}",
                        i.namespace,
                        selector_text(&x.metric.selector)
                    ))
                })?;
            let usage: i64 = values.iter().sum();
            let (replicas, current) = if let Some(target) = milli(&x.target.average_value) {
                let v = i.calc.per_pod_replicas(i.status_replicas, usage, target);
                let current = MetricValueStatus {
                    average_value: Some(milli_quantity(v.usage_milli)),
                    ..Default::default()
                };
                (v.replicas, current)
            } else if let Some(target) = milli(&x.target.value) {
                let v = i
                    .calc
                    .usage_ratio_replicas(i.spec_replicas, usage, target, i.pods)
                    .map_err(|e| failed(e.to_string()))?;
                let current = MetricValueStatus {
                    value: Some(milli_quantity(v.usage_milli)),
                    ..Default::default()
                };
                (v.replicas, current)
            } else {
                return Err(failed(
                    "invalid external metric source: neither a value target nor an average value target was set".into(),
                ));
            };
            Ok(Proposal {
                replicas,
                name: format!(
                    "external metric {name}({})",
                    selector_text(&x.metric.selector)
                ),
                status: MetricStatus {
                    type_: "External".into(),
                    external: Some(ExternalMetricStatus {
                        metric: MetricIdentifier {
                            name: name.clone(),
                            selector: x.metric.selector.clone(),
                        },
                        current,
                    }),
                    ..Default::default()
                },
            })
        }
        other => {
            let cause = format!("unknown metric source type {other:?}");
            Err(fail("InvalidMetricSourceType", cause.clone(), cause))
        }
    }
}

fn missing_source(spec: &MetricSpec) -> Failure {
    let cause = format!(
        "invalid metric source: the {} source of a {} metric is missing",
        spec.type_, spec.type_
    );
    fail("InvalidMetricSourceType", cause.clone(), cause)
}

/// The resource name the custom metrics API addresses a described object by: its kind in
/// lower case, pluralized as the API's resources are (`Service` → `services`, `Ingress` →
/// `ingresses`).
fn plural_guess(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    if lower.ends_with('s')
        || lower.ends_with("ch")
        || lower.ends_with("sh")
        || lower.ends_with('x')
    {
        format!("{lower}es")
    } else if lower.ends_with('y') && !lower.ends_with("ay") && !lower.ends_with("ey") {
        format!("{}ies", &lower[..lower.len() - 1])
    } else {
        format!("{lower}s")
    }
}

/// A Resource or ContainerResource metric (upstream's `computeStatusForResourceMetricGeneric`):
/// (replicas, the rescale reason's name, the current value) or (reason, message).
async fn resource(
    i: &Inputs<'_>,
    resource: &str,
    container: Option<&str>,
    target: &MetricTarget,
) -> Result<(i32, String, MetricValueStatus), (&'static str, String)> {
    const REASON: &str = "FailedGetResourceMetric";
    let kind = if container.is_some() {
        "container resource"
    } else {
        "resource"
    };
    if let Some(average) = milli(&target.average_value) {
        let samples = i
            .metrics
            .resource_metric(i.namespace, i.selector, resource, container)
            .await
            .map_err(|e| {
                (
                    REASON,
                    format!("failed to get {resource} usage: unable to get metrics for resource {resource}: {e}"),
                )
            })?;
        let v = i
            .calc
            .plain_replicas(i.spec_replicas, average, resource, i.pods, samples)
            .map_err(|e| (REASON, format!("failed to get {resource} usage: {e}")))?;
        return Ok((
            v.replicas,
            format!("{resource} {kind}"),
            MetricValueStatus {
                average_value: Some(milli_quantity(v.usage_milli)),
                ..Default::default()
            },
        ));
    }
    let Some(utilization) = target.average_utilization else {
        return Err((
            REASON,
            "invalid resource metric source: neither an average utilization target nor an average value (usage) target was set".into(),
        ));
    };
    let samples = i
        .metrics
        .resource_metric(i.namespace, i.selector, resource, container)
        .await
        .map_err(|e| {
            (
                REASON,
                format!("failed to get {resource} utilization: unable to get metrics for resource {resource}: {e}"),
            )
        })?;
    let p = i
        .calc
        .resource_replicas(
            i.spec_replicas,
            utilization,
            resource,
            container,
            i.pods,
            samples,
        )
        .map_err(|e| (REASON, format!("failed to get {resource} utilization: {e}")))?;
    Ok((
        p.replicas,
        format!("{resource} {kind} utilization (percentage of request)"),
        MetricValueStatus {
            average_utilization: Some(p.utilization),
            average_value: Some(milli_quantity(p.raw_average_milli)),
            ..Default::default()
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_and_plurals() {
        assert_eq!(milli_quantity(140).0, "140m");
        assert_eq!(milli_quantity(2000).0, "2");
        assert_eq!(plural_guess("Service"), "services");
        assert_eq!(plural_guess("Ingress"), "ingresses");
        assert_eq!(plural_guess("Policy"), "policies");
        assert_eq!(plural_guess("Deployment"), "deployments");
    }
}
