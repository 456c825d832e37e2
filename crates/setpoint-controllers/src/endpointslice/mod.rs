//! The EndpointSlice controller (`discovery.k8s.io/v1`): every Service with a selector gets
//! slices listing the pods it selects, with their `ready`, `serving` and `terminating`
//! conditions, node, zone and resolved ports. Services without a selector are left alone:
//! their endpoints are their user's.
//!
//! [`reconcile::desired`] and [`reconcile::plan`] are the pure decision; [`pods`] holds the
//! pod rules this controller shares with the Endpoints controller ([`crate::endpoints`]);
//! [`EndpointSliceController`] does the I/O. A Service's slices are found by their
//! `kubernetes.io/service-name` label and deleted with the Service by the garbage collector
//! (each carries a controller reference to it).

pub mod mirroring;
pub mod pods;
pub mod reconcile;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use setpoint_runtime::client::{Api, Client, DeleteParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

use self::pods::SERVICE_NAME_LABEL;

/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "endpointslice";
/// kube-controller-manager's `--max-endpoints-per-slice` default.
pub const DEFAULT_MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// The most `--max-endpoints-per-slice` may be (upstream's bound).
pub const MAX_ENDPOINTS_PER_SLICE_LIMIT: usize = 1000;
/// How long a written slice may take to reach the cache before the controller stops
/// waiting for it (someone else may have deleted it meanwhile).
const TRACK_TIMEOUT: Duration = Duration::from_secs(10);

/// The controller's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointSliceConfig {
    /// Endpoints per slice before another slice is started (`--max-endpoints-per-slice`).
    pub max_endpoints_per_slice: usize,
}

impl Default for EndpointSliceConfig {
    fn default() -> Self {
        EndpointSliceConfig {
            max_endpoints_per_slice: DEFAULT_MAX_ENDPOINTS_PER_SLICE,
        }
    }
}

/// What the controller last wrote to a slice: its generation, or its deletion.
#[derive(Clone, Copy, Debug)]
struct Written {
    generation: Option<i64>,
    at: Instant,
}

/// The slices this controller wrote and the cache has not shown yet, per Service: acting on
/// a cache without them would create a slice twice (upstream's `EndpointSliceTracker`).
#[derive(Default)]
struct Tracker {
    written: Mutex<HashMap<ObjectKey, HashMap<String, Written>>>,
}

impl Tracker {
    fn lock(&self) -> MutexGuard<'_, HashMap<ObjectKey, HashMap<String, Written>>> {
        // The map stays consistent whatever panicked holding it: each change is one call.
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, service: &ObjectKey, slice: &str, generation: Option<i64>) {
        self.lock().entry(service.clone()).or_default().insert(
            slice.to_string(),
            Written {
                generation,
                at: Instant::now(),
            },
        );
    }

    /// Whether the cached slices show every write (dropping the writes they show).
    fn caught_up(&self, service: &ObjectKey, cached: &[Arc<EndpointSlice>]) -> bool {
        let mut all = self.lock();
        let Some(written) = all.get_mut(service) else {
            return true;
        };
        written.retain(|name, w| {
            let seen = cached
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(name));
            let shown = match (w.generation, seen) {
                // Deleted: shown once absent.
                (None, seen) => seen.is_none(),
                (Some(g), Some(s)) => s.metadata.generation.unwrap_or(0) >= g,
                (Some(_), None) => false,
            };
            !shown && w.at.elapsed() < TRACK_TIMEOUT
        });
        let done = written.is_empty();
        if done {
            all.remove(service);
        }
        done
    }

    fn forget(&self, service: &ObjectKey) {
        self.lock().remove(service);
    }
}

/// The reconciler of Services' EndpointSlices.
pub struct EndpointSliceController {
    client: Client,
    services: Store<Service>,
    pods: Store<Pod>,
    nodes: Store<Node>,
    slices: Store<EndpointSlice>,
    config: EndpointSliceConfig,
    tracker: Tracker,
    events: EventRecorder,
}

/// The trigger time of a Service's endpoints: its latest change among the pods' readiness
/// transitions and the Service's creation.
pub fn trigger_time(service: &Service, pods: &[Arc<Pod>]) -> Option<String> {
    let created = service.metadata.creation_timestamp.as_ref().map(|t| t.0);
    pods.iter()
        .filter_map(|p| self::pods::ready_transition(p))
        .chain(created)
        .max()
        .map(|t| t.to_string())
}

/// The decision record's summary of the endpoints a Service's slices should hold.
fn endpoints_summary(desired: &reconcile::Desired) -> String {
    let (mut ready, mut not_ready, mut terminating) = (0, 0, 0);
    for ep in desired.values().flat_map(|(_, eps)| eps) {
        let c = ep.conditions.as_ref();
        if c.and_then(|c| c.ready).unwrap_or(false) {
            ready += 1;
        } else {
            not_ready += 1;
        }
        if c.and_then(|c| c.terminating).unwrap_or(false) {
            terminating += 1;
        }
    }
    format!(
        "{} endpoints: {ready} ready, {not_ready} not ready, {terminating} terminating; {} port mapping(s)",
        ready + not_ready,
        desired.len()
    )
}

/// Records the writes of a plan in the current decision, with the rule that chose each:
/// `endpoints` is how many endpoints the slices should hold, `max` how many a slice takes.
pub(crate) fn record_changes(changes: &reconcile::Changes, endpoints: usize, max: usize) {
    if !decision::recording() {
        return;
    }
    for s in &changes.create {
        let rule = if endpoints == 0 {
            "no endpoints and no slice to reuse: one empty placeholder slice".to_string()
        } else {
            format!("endpoints that fit no existing slice (at most {max} a slice)")
        };
        decision::action(
            format!(
                "create slice {}* ({} endpoints)",
                s.metadata.generate_name.as_deref().unwrap_or_default(),
                s.endpoints.len()
            ),
            rule,
        );
    }
    for s in &changes.update {
        let rule = if endpoints == 0 {
            "no endpoints: the slice is (made) the empty placeholder"
        } else {
            "its endpoints, ports, labels or owner differ from the desired ones"
        };
        decision::action(
            format!(
                "update slice {} ({} endpoints)",
                s.metadata.name.as_deref().unwrap_or_default(),
                s.endpoints.len()
            ),
            rule,
        );
    }
    for name in &changes.delete {
        let rule = if endpoints == 0 {
            "no endpoints: only one placeholder slice is kept"
        } else {
            "it holds no wanted endpoint (or ports, an owner or address type no longer wanted)"
        };
        decision::action(format!("delete slice {name}"), rule);
    }
}

impl EndpointSliceController {
    fn zone(&self, node: &str) -> Option<String> {
        self.nodes
            .get(&ObjectKey::new(None, node))?
            .metadata
            .labels
            .as_ref()?
            .get(pods::ZONE_LABEL)
            .cloned()
    }

    async fn write(
        &self,
        key: &ObjectKey,
        api: &Api<EndpointSlice>,
        changes: reconcile::Changes,
    ) -> Result<(), setpoint_runtime::ClientError> {
        for slice in &changes.create {
            let made = api.create(&PostParams::default(), slice).await?;
            self.tracker.record(
                key,
                &made.name(),
                Some(made.metadata.generation.unwrap_or(0)),
            );
        }
        for slice in &changes.update {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let made = api.replace(&name, &PostParams::default(), slice).await?;
            self.tracker
                .record(key, &name, Some(made.metadata.generation.unwrap_or(0)));
        }
        for name in &changes.delete {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => self.tracker.record(key, name, None),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Reconciler for EndpointSliceController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(service) = self.services.get(key) else {
            ctx.observe("the Service is gone (the garbage collector deletes its slices)");
            // The garbage collector deletes the slices with their Service.
            self.tracker.forget(key);
            return Ok(Action::Done);
        };
        if pods::selector(&service).is_none() {
            ctx.observe("the Service has no selector: its endpoints are its user's");
            return Ok(Action::Done);
        }
        if service.metadata.deletion_timestamp.is_some() {
            ctx.observe("the Service is being deleted");
            return Ok(Action::Done);
        }
        let ns = key.namespace.clone().unwrap_or_default();
        let existing: Vec<Arc<EndpointSlice>> = self
            .slices
            .by_label(SERVICE_NAME_LABEL, &key.name)
            .into_iter()
            .filter(|s| s.namespace().as_deref() == Some(ns.as_str()))
            .filter(|s| reconcile::is_managed(s, &key.name))
            .collect();
        if !self.tracker.caught_up(key, &existing) {
            ctx.observe("slices written earlier are not in the cache yet: wait");
            // Its informer event wakes the Service again; this is the fallback.
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let pods = self.pods.by_namespace(&ns);
        let desired = reconcile::desired(&service, &pods, |n| self.zone(n));
        let trigger = trigger_time(&service, &pods);
        let changes = reconcile::plan(
            &service,
            &desired,
            &existing,
            self.config.max_endpoints_per_slice,
            trigger.as_deref(),
        );
        let max = self.config.max_endpoints_per_slice;
        decision::observe_with(|| {
            format!(
                "{}; {} slices (at most {max} endpoints a slice)",
                endpoints_summary(&desired),
                existing.len()
            )
        });
        if changes.is_empty() {
            return Ok(Action::Done);
        }
        record_changes(
            &changes,
            desired.values().map(|(_, eps)| eps.len()).sum(),
            max,
        );
        tracing::debug!(
            service = %key,
            create = changes.create.len(),
            update = changes.update.len(),
            delete = changes.delete.len(),
            "writing endpoint slices"
        );
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &ns);
        if let Err(e) = self.write(key, &api, changes).await {
            // A conflict means the cache was stale: the next pass sees the fresh slice.
            if !e.is_conflict() && !e.is_already_exists() {
                self.events.publish(
                    &service.object_reference(),
                    EventType::Warning,
                    "FailedToUpdateEndpointSlices",
                    &format!("Error updating Endpoint Slices for Service {key}: {e}"),
                );
            }
            return Err(e.into());
        }
        Ok(Action::Done)
    }
}

/// The Services whose selector picks the pod.
fn services_selecting(services: &Store<Service>, pod: &Pod) -> Vec<ObjectKey> {
    services
        .by_namespace(&pod.namespace().unwrap_or_default())
        .iter()
        .filter(|svc| pods::selector(svc).is_some_and(|sel| pods::selects(&sel, svc, pod)))
        .map(|svc| ObjectKey::of(svc.as_ref()))
        .collect()
}

/// The EndpointSlice controller, reconciling a Service when it, a pod it selects (before or
/// after a change) or one of its slices changes.
pub fn controller(
    client: Client,
    informers: &SharedInformers,
    config: EndpointSliceConfig,
) -> Controller {
    let services = informers.typed::<Service>(Scope::all()).store();
    let reconciler = EndpointSliceController {
        events: EventRecorder::new(client.clone(), Reporter::new("endpointslice-controller")),
        client,
        services: services.clone(),
        pods: informers.typed::<Pod>(Scope::all()).store(),
        nodes: informers.typed::<Node>(Scope::all()).store(),
        slices: informers.typed::<EndpointSlice>(Scope::all()).store(),
        config: EndpointSliceConfig {
            max_endpoints_per_slice: config
                .max_endpoints_per_slice
                .clamp(1, MAX_ENDPOINTS_PER_SLICE_LIMIT),
        },
        tracker: Tracker::default(),
    };
    Controller::for_type::<Service>(NAME, informers, None)
        .watches::<Pod>(None, move |pod: &Pod| services_selecting(&services, pod))
        .watches::<EndpointSlice>(None, |slice: &EndpointSlice| {
            let service = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL));
            match (service, slice.namespace()) {
                (Some(name), Some(ns)) if reconcile::is_managed(slice, name) => {
                    vec![ObjectKey::new(Some(&ns), name)]
                }
                _ => Vec::new(),
            }
        })
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests;
