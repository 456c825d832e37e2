//! The autoscaler's I/O: every sync period, per HorizontalPodAutoscaler, read the target's
//! `scale` subresource, read the metrics, decide ([`super::decide`]'s pure steps), write the
//! new size through `scale` and the status, and record the Events upstream records.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use k8s_openapi::api::autoscaling::v2::{
    HorizontalPodAutoscaler, HorizontalPodAutoscalerStatus, MetricSpec, MetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;
use setpoint_api::selector::LabelSelector;
use setpoint_runtime::client::{Api, ApiResource, Client, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
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
    async fn reconcile(&self, _ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let history_key = format!("{}/{}", key.namespace.as_deref().unwrap_or(""), key.name);
        let Some(hpa) = self.hpas.get(key) else {
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
                    return Ok(Action::RequeueAfter(self.config.sync_period - since));
                }
            }
            last.insert(history_key.clone(), Instant::now());
        }
        if hpa.metadata.deletion_timestamp.is_some() {
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
        let (desired, reason) = if current == 0 && min != 0 {
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
            (max, status::ABOVE_MAX.to_string())
        } else if current < min {
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
            let (proposed, metric_name, statuses) = match computed {
                Ok(c) => c,
                Err((statuses, e)) => {
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
            let (s, r, m) = n.able_to_scale;
            set_condition(&mut conditions, ABLE_TO_SCALE, s, r, m.into(), &stamp);
            let (s, r, m) = n.scaling_limited;
            set_condition(&mut conditions, SCALING_LIMITED, s, r, m.into(), &stamp);
            (n.replicas, reason)
        };

        let mut rescale = None;
        if desired != current {
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
    /// scale down.
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
    ) -> Result<(i32, String, Option<Vec<MetricStatus>>), (Option<Vec<MetricStatus>>, String)> {
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
        let mut best: Option<(i32, String)> = None;
        let mut invalid = 0;
        let mut first_error: Option<(&'static str, String, String)> = None;
        for spec in specs {
            match source::compute(&ctx, spec).await {
                Ok(Proposal {
                    replicas,
                    name,
                    status,
                }) => {
                    statuses.push(status);
                    if best.as_ref().is_none_or(|(r, _)| replicas > *r) {
                        best = Some((replicas, name));
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
        let replicas = best.as_ref().map(|(r, _)| *r).unwrap_or(0);
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
        let Some((replicas, name)) = best else {
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
        Ok((replicas, name, statuses))
    }
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
