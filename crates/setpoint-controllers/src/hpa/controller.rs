//! The autoscaler's I/O: every sync period, per HorizontalPodAutoscaler, read the target's
//! `scale` subresource, read the metrics, decide ([`super::decide`]'s pure steps), write the
//! new size through `scale` and the status, and record the Events upstream records.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use k8s_openapi::api::autoscaling::v2::{
    HPAScalingRules, HorizontalPodAutoscaler, HorizontalPodAutoscalerStatus, MetricSpec,
    MetricStatus, MetricTarget, MetricValueStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;
use setpoint_api::selector::LabelSelector;
use setpoint_runtime::client::{Api, ApiResource, Client, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

use super::behavior::{with_defaults, History};
use super::metrics::MetricsClient;
use super::replicas::Tuning;
use super::selectors::{self, SelectorIndex, AMBIGUOUS_SELECTOR};
use super::source::{self, Proposal};
use super::status::{self, set_condition, ABLE_TO_SCALE, SCALING_ACTIVE, SCALING_LIMITED};

/// The controller's name (`--controllers`, work queue, metrics, logs).
pub const NAME: &str = "horizontalpodautoscaling";

/// Where the controller reads the time.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// kube-controller-manager's `--horizontal-pod-autoscaler-*` settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HpaConfig {
    /// `--horizontal-pod-autoscaler-sync-period` (15 s): how often each autoscaler is synced.
    pub sync_period: Duration,
    /// `--horizontal-pod-autoscaler-downscale-stabilization` (5 minutes): the window whose
    /// highest recommendation a scale-down may not go below.
    pub downscale_stabilization: Duration,
    /// The tolerance and the CPU initialization and readiness delays.
    pub tuning: Tuning,
}

impl Default for HpaConfig {
    fn default() -> Self {
        HpaConfig {
            sync_period: Duration::from_secs(15),
            downscale_stabilization: Duration::from_secs(300),
            tuning: Tuning::default(),
        }
    }
}

/// How long a resolved scale target kind is trusted before discovery is asked again.
const MAPPING_TTL: Duration = Duration::from_secs(60);

/// The reconciler of HorizontalPodAutoscalers.
pub struct HpaController {
    client: Client,
    hpas: Store<HorizontalPodAutoscaler>,
    pods: Store<Pod>,
    metrics: MetricsClient,
    events: EventRecorder,
    config: HpaConfig,
    clock: Clock,
    /// Per autoscaler (`namespace/name`): recent recommendations and rescales, in memory as
    /// upstream keeps them.
    histories: Mutex<HashMap<String, History>>,
    /// `apiVersion/kind` → resource, from discovery.
    mappings: Mutex<HashMap<String, (ApiResource, Instant)>>,
    /// When each autoscaler was last synced: as upstream's queue adds every key with the
    /// sync period's delay, an autoscaler is synced at most once a period, whatever changes
    /// (its own status writes included).
    last_sync: Mutex<HashMap<String, Instant>>,
    /// Every autoscaler's target selector as last read, to find pods that several
    /// autoscalers select (`AmbiguousSelector`).
    selectors: Mutex<SelectorIndex>,
}

fn time(t: DateTime<Utc>) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(t.timestamp()).unwrap_or_default())
}

impl HpaController {
    /// The resource serving `kind` in `api_version`, as upstream's RESTMapper finds it.
    async fn resource_for(&self, api_version: &str, kind: &str) -> Result<ApiResource, String> {
        let key = format!("{api_version}/{kind}");
        if let Some((r, at)) = self.mappings.lock().expect("mappings").get(&key) {
            if at.elapsed() < MAPPING_TTL {
                return Ok(r.clone());
            }
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let path = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let no_match = || format!("no matches for kind {kind:?} in group {group:?}");
        let doc = match self
            .client
            .request(http::Method::GET, &path, None, Bytes::new())
            .await
        {
            Ok(doc) => doc,
            Err(e) if e.is_not_found() => return Err(no_match()),
            Err(e) => return Err(e.to_string()),
        };
        let found = crate::discovery::parse_resource_list(group, version, &doc)
            .into_iter()
            .find(|r| r.resource.kind == kind)
            .map(|r| r.resource)
            .ok_or_else(no_match)?;
        self.mappings
            .lock()
            .expect("mappings")
            .insert(key, (found.clone(), Instant::now()));
        Ok(found)
    }

    /// The target's autoscaling/v1 Scale and the resource it was read through.
    async fn get_scale(
        &self,
        hpa: &HorizontalPodAutoscaler,
    ) -> Result<(ApiResource, Value), String> {
        let target = &hpa.spec.as_ref().ok_or("no spec")?.scale_target_ref;
        let api_version = target.api_version.as_deref().unwrap_or("");
        let resource = self.resource_for(api_version, &target.kind).await?;
        let ns = hpa.namespace().unwrap_or_default();
        let path = resource.object_path(Some(&ns), &target.name, Some("scale"));
        match self
            .client
            .request(http::Method::GET, &path, None, Bytes::new())
            .await
        {
            Ok(scale) => Ok((resource, scale)),
            Err(e) => {
                if e.is_not_found() {
                    // The kind may have moved (a CRD deleted and recreated): ask again next time.
                    self.mappings
                        .lock()
                        .expect("mappings")
                        .remove(&format!("{api_version}/{}", target.kind));
                }
                Err(e.to_string())
            }
        }
    }

    /// Writes `scale` back with `spec.replicas` set: an update, as upstream writes it (its
    /// role grants `get` and `update` on `*/scale`).
    async fn update_scale(
        &self,
        resource: &ApiResource,
        ns: &str,
        name: &str,
        mut scale: Value,
        replicas: i32,
    ) -> Result<(), String> {
        scale["spec"]["replicas"] = Value::from(replicas);
        let path = resource.object_path(Some(ns), name, Some("scale"));
        let body = serde_json::to_vec(&scale).map_err(|e| e.to_string())?;
        self.client
            .request(
                http::Method::PUT,
                &path,
                Some("application/json"),
                Bytes::from(body),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// What one sync found and decided, before it is written.
struct Outcome {
    status: HorizontalPodAutoscalerStatus,
    rescale: Option<(i32, String)>,
}

#[async_trait::async_trait]
impl Reconciler for HpaController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let history_key = format!("{}/{}", key.namespace.as_deref().unwrap_or(""), key.name);
        let Some(hpa) = self.hpas.get(key) else {
            ctx.observe("the HorizontalPodAutoscaler is gone");
            self.histories
                .lock()
                .expect("histories")
                .remove(&history_key);
            self.last_sync
                .lock()
                .expect("last_sync")
                .remove(&history_key);
            self.selectors
                .lock()
                .expect("selectors")
                .remove(&history_key);
            return Ok(Action::Done);
        };
        {
            let mut last = self.last_sync.lock().expect("last_sync");
            if let Some(at) = last.get(&history_key) {
                let since = at.elapsed();
                if since < self.config.sync_period {
                    if ctx.recording() {
                        ctx.observe(format!(
                            "synced {:.1}s ago, within the sync period of {}s: not yet",
                            since.as_secs_f64(),
                            self.config.sync_period.as_secs()
                        ));
                    }
                    return Ok(Action::RequeueAfter(self.config.sync_period - since));
                }
            }
            last.insert(history_key.clone(), Instant::now());
        }
        if hpa.metadata.deletion_timestamp.is_some() {
            ctx.observe("the HorizontalPodAutoscaler is being deleted");
            return Ok(Action::Done);
        }
        let span = tracing::debug_span!("hpa", namespace = ?key.namespace, name = %key.name);
        let _guard = span.enter();
        let now = (self.clock)();
        let result = self.sync(&hpa, &history_key, now).await;
        let mut next = result.status;
        next.observed_generation = hpa.metadata.generation;
        if let Some((replicas, _)) = &result.rescale {
            next.last_scale_time = Some(time(now));
            next.desired_replicas = *replicas;
        }
        if hpa.status.as_ref() != Some(&next) {
            let api: Api<HorizontalPodAutoscaler> =
                Api::namespaced(self.client.clone(), key.namespace.as_deref().unwrap_or(""));
            if ctx.recording() {
                ctx.action(
                    "update status",
                    format!(
                        "the status differs: {}",
                        status_changes(hpa.status.as_ref(), &next).join(", ")
                    ),
                );
            }
            let mut updated = HorizontalPodAutoscaler::clone(&hpa);
            updated.status = Some(next);
            if let Err(e) = api
                .replace_status(&key.name, &PostParams::default(), &updated)
                .await
            {
                // A conflict means a newer version is on its way through the informer, which
                // queues the key again.
                if !e.is_conflict() {
                    return Err(e.into());
                }
            }
        }
        Ok(Action::RequeueAfter(self.config.sync_period))
    }
}

impl HpaController {
    /// Upstream's `reconcileAutoscaler`, its writes of the scale and Events included; the
    /// status is returned for the caller to write.
    async fn sync(
        &self,
        hpa: &HorizontalPodAutoscaler,
        history_key: &str,
        now: DateTime<Utc>,
    ) -> Outcome {
        let stamp = time(now);
        let mut st = hpa.status.clone().unwrap_or_default();
        let mut conditions = st.conditions.take().unwrap_or_default();
        let spec = hpa.spec.clone().unwrap_or_default();
        let cref = hpa.object_reference();
        let ns = hpa.namespace().unwrap_or_default();
        let target = &spec.scale_target_ref;
        let reference = format!("{}/{}/{}", target.kind, ns, target.name);
        let finish = |mut st: HorizontalPodAutoscalerStatus, conditions, rescale| {
            st.conditions = Some(conditions).filter(|c: &Vec<_>| !c.is_empty());
            Outcome {
                status: st,
                rescale,
            }
        };

        let (resource, scale) = match self.get_scale(hpa).await {
            Ok(s) => s,
            Err(e) => {
                self.events
                    .publish(&cref, EventType::Warning, "FailedGetScale", &e);
                set_condition(
                    &mut conditions,
                    ABLE_TO_SCALE,
                    false,
                    "FailedGetScale",
                    status::failed_get_scale(&e),
                    &stamp,
                );
                decision::observe_with(|| format!("cannot read the scale of {reference}: {e}"));
                tracing::info!(target = %reference, error = %e, "cannot read the target's scale");
                return finish(st, conditions, None);
            }
        };
        set_condition(
            &mut conditions,
            ABLE_TO_SCALE,
            true,
            "SucceededGetScale",
            status::SUCCEEDED_GET_SCALE.into(),
            &stamp,
        );
        let current = scale
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(0) as i32;
        let status_replicas = scale
            .pointer("/status/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(0) as i32;
        let min = spec.min_replicas.unwrap_or(1);
        let max = spec.max_replicas;
        decision::observe_with(|| {
            format!(
                "{reference}: {current} replicas (spec), {status_replicas} (status); minReplicas {min}, maxReplicas {max}"
            )
        });
        let behavior = spec
            .behavior
            .as_ref()
            .map(|b| with_defaults(b, self.config.downscale_stabilization.as_secs() as i32));
        self.histories
            .lock()
            .expect("histories")
            .entry(history_key.to_string())
            .or_default()
            .seed(current, now);

        let mut metric_statuses: Option<Vec<MetricStatus>> = None;
        // Why `desired` is what it is, for the decision record (empty when not recording).
        let mut rule = String::new();
        let (desired, reason) = if current == 0 && min != 0 {
            decision::observe("the target has 0 replicas: scaling is disabled");
            set_condition(
                &mut conditions,
                SCALING_ACTIVE,
                false,
                "ScalingDisabled",
                "scaling is disabled since the replica count of the target is zero".into(),
                &stamp,
            );
            (current, String::new())
        } else if current > max {
            if decision::recording() {
                rule = format!("{current} current > maxReplicas {max}");
            }
            (max, status::ABOVE_MAX.to_string())
        } else if current < min {
            if decision::recording() {
                rule = format!("{current} current < minReplicas {min}");
            }
            (min, status::BELOW_MIN.to_string())
        } else {
            let selector = scale
                .pointer("/status/selector")
                .and_then(Value::as_str)
                .unwrap_or("");
            let computed = self
                .compute_for_metrics(
                    hpa,
                    &spec.metrics.clone().unwrap_or_default(),
                    selector,
                    current,
                    status_replicas,
                    now,
                    &mut conditions,
                    &stamp,
                )
                .await;
            let (proposed, metric_name, statuses, metric_note) = match computed {
                Ok(c) => c,
                Err((statuses, e)) => {
                    decision::observe_with(|| format!("no rescale: {e}"));
                    st.current_replicas = Some(current);
                    st.current_metrics = statuses;
                    self.events.publish(
                        &cref,
                        EventType::Warning,
                        "FailedComputeMetricsReplicas",
                        &e,
                    );
                    tracing::info!(target = %reference, error = %e, "failed to compute desired number of replicas based on listed metrics");
                    return finish(st, conditions, None);
                }
            };
            metric_statuses = statuses;
            let reason = if proposed > current {
                format!("{metric_name} above target")
            } else if proposed < current {
                status::ALL_BELOW.to_string()
            } else {
                String::new()
            };
            let mut histories = self.histories.lock().expect("histories");
            let history = histories.entry(history_key.to_string()).or_default();
            let n = match &behavior {
                None => history.normalize(
                    current,
                    proposed,
                    min,
                    max,
                    self.config.downscale_stabilization,
                    now,
                ),
                Some((up, down)) => {
                    history.normalize_with_behavior(current, proposed, min, max, up, down, now)
                }
            };
            drop(histories);
            if decision::recording() {
                decision::observe(format!(
                    "recommendation: {proposed} proposed by {metric_name}, {} after stabilization ({}), {} within the limits ({})",
                    n.stabilized, n.able_to_scale.1, n.replicas, n.scaling_limited.1
                ));
                rule = format!("{metric_note}: {current} -> {} replicas", n.replicas);
                if n.stabilized != proposed {
                    rule.push_str(&format!(
                        ", not {proposed}: {} in the stabilization window",
                        if proposed < current {
                            "a higher recommendation"
                        } else {
                            "a lower recommendation"
                        }
                    ));
                }
                if n.scaling_limited.0 {
                    let limit = match n.scaling_limited.1 {
                        "TooManyReplicas" => format!("maxReplicas {max}"),
                        "TooFewReplicas" => format!("minReplicas {min}"),
                        "ScaleUpLimit" => match &behavior {
                            Some((up, _)) => policies_text("scaleUp", up),
                            None => "the scale-up limit max(2 x current, 4)".into(),
                        },
                        "ScaleDownLimit" => match &behavior {
                            Some((_, down)) => policies_text("scaleDown", down),
                            None => "the scale-down limit".into(),
                        },
                        other => other.to_string(),
                    };
                    rule.push_str(&format!(", capped from {} by {limit}", n.stabilized));
                }
            }
            let (s, r, m) = n.able_to_scale;
            set_condition(&mut conditions, ABLE_TO_SCALE, s, r, m.into(), &stamp);
            let (s, r, m) = n.scaling_limited;
            set_condition(&mut conditions, SCALING_LIMITED, s, r, m.into(), &stamp);
            (n.replicas, reason)
        };

        let mut rescale = None;
        if desired != current {
            if decision::recording() {
                decision::action(
                    format!("scale {reference} from {current} to {desired}"),
                    rule,
                );
            }
            match self
                .update_scale(&resource, &ns, &target.name, scale.clone(), desired)
                .await
            {
                Ok(()) => {
                    set_condition(
                        &mut conditions,
                        ABLE_TO_SCALE,
                        true,
                        "SucceededRescale",
                        status::succeeded_rescale(desired),
                        &stamp,
                    );
                    self.events.publish(
                        &cref,
                        EventType::Normal,
                        "SuccessfulRescale",
                        &format!("New size: {desired}; reason: {reason}"),
                    );
                    tracing::info!(target = %reference, from = current, to = desired, %reason, "rescaled");
                    self.histories
                        .lock()
                        .expect("histories")
                        .entry(history_key.to_string())
                        .or_default()
                        .record_rescale(
                            behavior.as_ref().map(|(u, d)| (u, d)),
                            current,
                            desired,
                            now,
                        );
                    rescale = Some((desired, reason));
                }
                Err(e) => {
                    self.events.publish(
                        &cref,
                        EventType::Warning,
                        "FailedRescale",
                        &format!("New size: {desired}; reason: {reason}; error: {e}"),
                    );
                    set_condition(
                        &mut conditions,
                        ABLE_TO_SCALE,
                        false,
                        "FailedUpdateScale",
                        status::failed_update_scale(&e),
                        &stamp,
                    );
                    st.current_replicas = Some(current);
                    st.current_metrics = metric_statuses;
                    return finish(st, conditions, None);
                }
            }
        }
        st.current_replicas = Some(current);
        st.desired_replicas = if rescale.is_some() { desired } else { current };
        st.current_metrics = metric_statuses;
        finish(st, conditions, rescale)
    }

    /// Upstream's `computeReplicasForMetrics`: every metric's proposal, the largest wins; an
    /// error (with the statuses so far) when all failed, or some failed and the rest would
    /// scale down. With the proposal, the winning metric's current value against its target
    /// (for the decision record; empty when none is kept).
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    async fn compute_for_metrics(
        &self,
        hpa: &HorizontalPodAutoscaler,
        specs: &[MetricSpec],
        selector: &str,
        spec_replicas: i32,
        status_replicas: i32,
        now: DateTime<Utc>,
        conditions: &mut Vec<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerCondition>,
        stamp: &Time,
    ) -> Result<(i32, String, Option<Vec<MetricStatus>>, String), (Option<Vec<MetricStatus>>, String)>
    {
        let cref = hpa.object_reference();
        if selector.is_empty() {
            self.events.publish(
                &cref,
                EventType::Warning,
                "SelectorRequired",
                "selector is required",
            );
            set_condition(
                conditions,
                SCALING_ACTIVE,
                false,
                "InvalidSelector",
                "the HPA target's scale is missing a selector".into(),
                stamp,
            );
            return Err((None, "selector is required".into()));
        }
        let parsed = match LabelSelector::parse(selector) {
            Ok(s) => s,
            Err(e) => {
                let message = format!(
                    "couldn't convert selector into a corresponding internal selector object: {e}"
                );
                self.events
                    .publish(&cref, EventType::Warning, "InvalidSelector", &message);
                set_condition(
                    conditions,
                    SCALING_ACTIVE,
                    false,
                    "InvalidSelector",
                    message.clone(),
                    stamp,
                );
                return Err((None, message));
            }
        };
        let ns = hpa.namespace().unwrap_or_default();
        let pods: Vec<Arc<Pod>> = self
            .pods
            .by_namespace(&ns)
            .into_iter()
            .filter(|p| {
                let labels = p.metadata.labels.as_ref();
                parsed.matches(|k| labels.and_then(|l| l.get(k)).map(String::as_str))
            })
            .collect();
        // Upstream's `validateAndParseSelector`: the pods under this selector may be sized by
        // this autoscaler only.
        let controlling = {
            let mut index = self.selectors.lock().expect("selectors");
            index.put(&ns, &hpa.name(), parsed.clone());
            index.controlling(
                &ns,
                pods.iter().map(|p| {
                    let labels = p.metadata.labels.as_ref();
                    move |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str)
                }),
            )
        };
        if controlling.len() > 1 {
            let message = selectors::ambiguous_message(selector, &controlling);
            self.events
                .publish(&cref, EventType::Warning, AMBIGUOUS_SELECTOR, &message);
            set_condition(
                conditions,
                SCALING_ACTIVE,
                false,
                AMBIGUOUS_SELECTOR,
                message.clone(),
                stamp,
            );
            return Err((None, message));
        }
        let ctx = source::Inputs {
            metrics: &self.metrics,
            calc: super::replicas::Calculator {
                tuning: self.config.tuning,
                now,
            },
            namespace: &ns,
            selector,
            pods: &pods,
            spec_replicas,
            status_replicas,
        };
        let mut statuses = Vec::with_capacity(specs.len());
        let mut best: Option<(i32, String, String)> = None;
        let recording = decision::recording();
        let mut invalid = 0;
        let mut first_error: Option<(&'static str, String, String)> = None;
        for spec in specs {
            match source::compute(&ctx, spec).await {
                Ok(Proposal {
                    replicas,
                    name,
                    status,
                }) => {
                    let note = if recording {
                        let note = format!("{name} {}", metric_vs_target(spec, &status));
                        decision::observe(format!("{note}: {replicas} replicas"));
                        note
                    } else {
                        String::new()
                    };
                    statuses.push(status);
                    if best.as_ref().is_none_or(|(r, _, _)| replicas > *r) {
                        best = Some((replicas, name, note));
                    }
                }
                Err(f) => {
                    // Upstream records an Event for each metric that fails.
                    self.events
                        .publish(&cref, EventType::Warning, f.reason, &f.cause);
                    statuses.push(f.placeholder);
                    invalid += 1;
                    if first_error.is_none() {
                        first_error = Some((f.reason, f.cause, f.error));
                    }
                }
            }
        }
        let statuses = Some(statuses).filter(|s| !s.is_empty());
        let error = first_error.as_ref().map(|(_, _, e)| {
            format!(
                "invalid metrics ({invalid} invalid out of {}), first error is: {e}",
                specs.len()
            )
        });
        let replicas = best.as_ref().map(|(r, _, _)| *r).unwrap_or(0);
        if let Some((reason, cause, _)) = &first_error {
            if invalid >= specs.len() || replicas < spec_replicas {
                set_condition(
                    conditions,
                    SCALING_ACTIVE,
                    false,
                    reason,
                    status::unable_to_compute(cause),
                    stamp,
                );
                return Err((statuses, error.unwrap_or_default()));
            }
        }
        if let Some(e) = &error {
            // Some failed, and the others scale up: the larger proposal is taken.
            decision::observe_with(|| e.clone());
        }
        let Some((replicas, name, note)) = best else {
            // No metrics at all: nothing to act on, which the condition says.
            set_condition(
                conditions,
                SCALING_ACTIVE,
                false,
                "InvalidMetricSourceType",
                status::unable_to_compute("no metrics are specified"),
                stamp,
            );
            return Err((None, "no metrics are specified".into()));
        };
        set_condition(
            conditions,
            SCALING_ACTIVE,
            true,
            "ValidMetricFound",
            status::valid_metric_found(&name),
            stamp,
        );
        Ok((replicas, name, statuses, note))
    }
}

/// A metric target as the decision record says it: `50%`, `100m average`, `2`.
fn target_text(t: &MetricTarget) -> String {
    if let Some(u) = t.average_utilization {
        format!("{u}%")
    } else if let Some(v) = &t.average_value {
        format!("{} average", v.0)
    } else if let Some(v) = &t.value {
        v.0.clone()
    } else {
        "none".into()
    }
}

/// A metric's current value as the decision record says it: `180% (900m average)`.
fn current_text(c: &MetricValueStatus) -> String {
    match (c.average_utilization, &c.average_value, &c.value) {
        (Some(u), Some(v), _) => format!("{u}% ({} average)", v.0),
        (Some(u), None, _) => format!("{u}%"),
        (None, Some(v), _) => format!("{} average", v.0),
        (None, None, Some(v)) => v.0.clone(),
        (None, None, None) => "unknown".into(),
    }
}

/// `<current> vs target <target>` of one metric, from its spec and its computed status.
fn metric_vs_target(spec: &MetricSpec, status: &MetricStatus) -> String {
    let target = match spec.type_.as_str() {
        "Resource" => spec.resource.as_ref().map(|r| &r.target),
        "ContainerResource" => spec.container_resource.as_ref().map(|r| &r.target),
        "Pods" => spec.pods.as_ref().map(|p| &p.target),
        "Object" => spec.object.as_ref().map(|o| &o.target),
        "External" => spec.external.as_ref().map(|x| &x.target),
        _ => None,
    };
    let current = status
        .resource
        .as_ref()
        .map(|r| &r.current)
        .or(status.container_resource.as_ref().map(|r| &r.current))
        .or(status.pods.as_ref().map(|p| &p.current))
        .or(status.object.as_ref().map(|o| &o.current))
        .or(status.external.as_ref().map(|x| &x.current));
    format!(
        "{} vs target {}",
        current.map_or_else(|| "unknown".into(), current_text),
        target.map_or_else(|| "none".into(), target_text)
    )
}

/// A direction's scaling policies, e.g. `scaleUp policies Pods 4/15s, Percent 100/15s
/// (selectPolicy Max)`.
fn policies_text(direction: &str, rules: &HPAScalingRules) -> String {
    let policies: Vec<String> = rules
        .policies
        .iter()
        .flatten()
        .map(|p| format!("{} {}/{}s", p.type_, p.value, p.period_seconds))
        .collect();
    format!(
        "{direction} policies {} (selectPolicy {})",
        policies.join(", "),
        rules.select_policy.as_deref().unwrap_or("Max")
    )
}

/// The status fields a write changes, by their API names.
fn status_changes(
    old: Option<&HorizontalPodAutoscalerStatus>,
    new: &HorizontalPodAutoscalerStatus,
) -> Vec<&'static str> {
    let Some(old) = old else {
        return vec!["no status yet"];
    };
    let mut out = Vec::new();
    if old.current_replicas != new.current_replicas {
        out.push("currentReplicas");
    }
    if old.desired_replicas != new.desired_replicas {
        out.push("desiredReplicas");
    }
    if old.current_metrics != new.current_metrics {
        out.push("currentMetrics");
    }
    if old.conditions != new.conditions {
        out.push("conditions");
    }
    if old.last_scale_time != new.last_scale_time {
        out.push("lastScaleTime");
    }
    if old.observed_generation != new.observed_generation {
        out.push("observedGeneration");
    }
    out
}

/// The HPA controller on `informers`, reading the system clock.
pub fn controller(client: Client, informers: &SharedInformers, config: HpaConfig) -> Controller {
    controller_with_clock(client, informers, config, Arc::new(Utc::now))
}

/// The HPA controller with its own clock (for tests that move time).
pub fn controller_with_clock(
    client: Client,
    informers: &SharedInformers,
    config: HpaConfig,
    clock: Clock,
) -> Controller {
    let reconciler = HpaController {
        events: EventRecorder::new(client.clone(), Reporter::new("horizontal-pod-autoscaler")),
        metrics: MetricsClient::new(client.clone()),
        client,
        hpas: informers
            .typed::<HorizontalPodAutoscaler>(Scope::all())
            .store(),
        pods: informers.typed::<Pod>(Scope::all()).store(),
        config,
        clock,
        histories: Mutex::new(HashMap::new()),
        mappings: Mutex::new(HashMap::new()),
        last_sync: Mutex::new(HashMap::new()),
        selectors: Mutex::new(SelectorIndex::default()),
    };
    Controller::for_type::<HorizontalPodAutoscaler>(NAME, informers, None)
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_texts_of_metrics_and_policies() {
        let spec: MetricSpec = serde_json::from_value(serde_json::json!({
            "type": "Resource",
            "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}
        }))
        .unwrap();
        let status: MetricStatus = serde_json::from_value(serde_json::json!({
            "type": "Resource",
            "resource": {"name": "cpu", "current": {"averageUtilization": 180, "averageValue": "900m"}}
        }))
        .unwrap();
        assert_eq!(
            metric_vs_target(&spec, &status),
            "180% (900m average) vs target 50%"
        );
        let (up, _) = with_defaults(&Default::default(), 300);
        assert_eq!(
            policies_text("scaleUp", &up),
            "scaleUp policies Pods 4/15s, Percent 100/15s (selectPolicy Max)"
        );
        let old = HorizontalPodAutoscalerStatus::default();
        let new = HorizontalPodAutoscalerStatus {
            desired_replicas: 3,
            ..Default::default()
        };
        assert_eq!(status_changes(Some(&old), &new), ["desiredReplicas"]);
    }
}
