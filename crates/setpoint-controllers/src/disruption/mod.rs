//! The disruption controller (upstream's `disruption`): keeps each PodDisruptionBudget's
//! `status` (`currentHealthy`, `desiredHealthy`, `disruptionsAllowed`, `expectedPods`,
//! `observedGeneration`, `disruptedPods` and the `DisruptionAllowed` condition) true to the
//! pods its selector picks, which the API server's `pods/eviction` reads and decrements.
//!
//! `budget` is the pure decision. This module reads the caches and, where a budget's
//! numbers depend on the pods' controllers (`maxUnavailable`, a percentage `minAvailable`),
//! finds each controller's scale as upstream's finders do: a ReplicaSet (or the Deployment
//! owning it), a ReplicationController, a StatefulSet, or any other kind through its `scale`
//! subresource. A failure leaves the budget allowing nothing, with `SyncFailed`.

pub mod budget;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::Value;
use setpoint_api::selector::LabelSelector;
use setpoint_runtime::client::{Api, Client, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

/// The controller's name, upstream's (`--controllers`, work queue, metrics, logs).
pub const NAME: &str = "disruption";
/// The component its Events name.
pub const REPORTER: &str = "controllermanager";

/// The pods a budget's selector picks in its namespace (none when it does not parse).
fn selected(pdb: &PodDisruptionBudget, pods: &Store<Pod>) -> Option<Vec<Arc<Pod>>> {
    let sel = selector(pdb)?;
    let ns = pdb.metadata.namespace.as_deref().unwrap_or_default();
    Some(
        pods.by_namespace(ns)
            .into_iter()
            .filter(|p| {
                let labels = p.metadata.labels.as_ref();
                sel.matches(|k| labels.and_then(|l| l.get(k)).map(String::as_str))
            })
            .collect(),
    )
}

fn selector(pdb: &PodDisruptionBudget) -> Option<LabelSelector> {
    let v = serde_json::to_value(pdb).ok()?;
    setpoint_api::disruption::controller_selector(&v)
}

struct DisruptionController {
    client: Client,
    budgets: Store<PodDisruptionBudget>,
    pods: Store<Pod>,
    replica_sets: Store<ReplicaSet>,
    deployments: Store<Deployment>,
    controllers: Store<ReplicationController>,
    stateful_sets: Store<StatefulSet>,
    events: EventRecorder,
}

/// A pod's controller and its scale.
struct Scaled {
    uid: String,
    replicas: i32,
}

impl DisruptionController {
    fn key(ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(Some(ns), name)
    }

    /// Upstream's finders, in order: the first that knows the pod's controller gives its
    /// scale. `Ok(None)`: none of them knows it.
    async fn find(&self, owner: &OwnerReference, ns: &str) -> Result<Option<Scaled>, String> {
        let group = setpoint_api::resource::split_api_version(&owner.api_version).0;
        let uid_ok = |uid: Option<&String>| uid.map(String::as_str) == Some(owner.uid.as_str());
        match (group, owner.kind.as_str()) {
            ("apps", "ReplicaSet") => {
                let Some(rs) = self.replica_sets.get(&Self::key(ns, &owner.name)) else {
                    return Ok(None);
                };
                if !uid_ok(rs.metadata.uid.as_ref()) {
                    return Ok(None);
                }
                // A ReplicaSet of a Deployment scales with it.
                let parent = rs
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|r| r.controller == Some(true))
                    .cloned();
                if let Some(parent) = parent.filter(|p| {
                    p.kind == "Deployment"
                        && setpoint_api::resource::split_api_version(&p.api_version).0 == "apps"
                }) {
                    let Some(d) = self.deployments.get(&Self::key(ns, &parent.name)) else {
                        return Ok(None);
                    };
                    if d.metadata.uid.as_deref() != Some(parent.uid.as_str()) {
                        return Ok(None);
                    }
                    return Ok(Some(Scaled {
                        uid: parent.uid,
                        replicas: setpoint_api::replicas::or_default(
                            d.spec.as_ref().and_then(|s| s.replicas),
                        ),
                    }));
                }
                Ok(Some(Scaled {
                    uid: owner.uid.clone(),
                    replicas: setpoint_api::replicas::or_default(
                        rs.spec.as_ref().and_then(|s| s.replicas),
                    ),
                }))
            }
            ("", "ReplicationController") => Ok(self
                .controllers
                .get(&Self::key(ns, &owner.name))
                .filter(|rc| uid_ok(rc.metadata.uid.as_ref()))
                .map(|rc| Scaled {
                    uid: owner.uid.clone(),
                    replicas: setpoint_api::replicas::or_default(
                        rc.spec.as_ref().and_then(|s| s.replicas),
                    ),
                })),
            ("apps", "StatefulSet") => Ok(self
                .stateful_sets
                .get(&Self::key(ns, &owner.name))
                .filter(|s| uid_ok(s.metadata.uid.as_ref()))
                .map(|s| Scaled {
                    uid: owner.uid.clone(),
                    replicas: setpoint_api::replicas::or_default(
                        s.spec.as_ref().and_then(|s| s.replicas),
                    ),
                })),
            _ => self.scale_of(owner, ns).await,
        }
    }

    /// Any other controller, through its `scale` subresource (upstream's
    /// `getScaleController`).
    async fn scale_of(&self, owner: &OwnerReference, ns: &str) -> Result<Option<Scaled>, String> {
        let (group, version) = setpoint_api::resource::split_api_version(&owner.api_version);
        let path = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let no_match = || format!("no matches for kind {:?} in group {group:?}", owner.kind);
        let doc = match self
            .client
            .request(http::Method::GET, &path, None, Bytes::new())
            .await
        {
            Ok(doc) => doc,
            Err(e) if e.is_not_found() => return Err(no_match()),
            Err(e) => return Err(e.to_string()),
        };
        let resources = doc
            .get("resources")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let plural = resources
            .iter()
            .find(|r| {
                r.get("kind").and_then(Value::as_str) == Some(owner.kind.as_str())
                    && !r
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("/")
                        .contains('/')
            })
            .and_then(|r| r.get("name").and_then(Value::as_str))
            .ok_or_else(no_match)?
            .to_string();
        let scale_path = format!("{}/namespaces/{ns}/{plural}/{}/scale", path, owner.name);
        match self
            .client
            .request(http::Method::GET, &scale_path, None, Bytes::new())
            .await
        {
            Ok(scale) => {
                let uid = scale.pointer("/metadata/uid").and_then(Value::as_str);
                if uid.is_some_and(|u| u != owner.uid) {
                    return Ok(None);
                }
                let replicas = scale
                    .pointer("/spec/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                Ok(Some(Scaled {
                    uid: owner.uid.clone(),
                    replicas: i32::try_from(replicas).unwrap_or(i32::MAX),
                }))
            }
            Err(e) if e.is_not_found() => {
                let scalable = resources.iter().any(|r| {
                    r.get("name").and_then(Value::as_str) == Some(&format!("{plural}/scale"))
                });
                if scalable {
                    Ok(None)
                } else {
                    let gr = if group.is_empty() {
                        plural
                    } else {
                        format!("{plural}.{group}")
                    };
                    Err(format!("{gr} does not implement the scale subresource"))
                }
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// The summed scale of the pods' controllers, and the pods that have none (upstream's
    /// `getExpectedScale`).
    async fn expected_scale(&self, pods: &[&Pod]) -> Result<(i32, Vec<String>), String> {
        let mut scales: HashMap<String, i32> = HashMap::new();
        let mut unmanaged = Vec::new();
        for pod in pods {
            let Some(owner) = pod
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|r| r.controller == Some(true))
            else {
                unmanaged.push(pod.metadata.name.clone().unwrap_or_default());
                continue;
            };
            if scales.contains_key(&owner.uid) {
                continue;
            }
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            match self.find(owner, ns).await? {
                Some(s) => {
                    scales.insert(s.uid, s.replicas);
                }
                None => {
                    return Err(format!(
                        "found no controllers for pod {:?}",
                        pod.metadata.name.as_deref().unwrap_or_default()
                    ))
                }
            }
        }
        Ok((scales.values().sum(), unmanaged))
    }

    /// Upstream's `trySync`: the status to write and when to look again.
    async fn try_sync(
        &self,
        pdb: &PodDisruptionBudget,
    ) -> Result<
        (
            Option<k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus>,
            Option<Duration>,
        ),
        String,
    > {
        let reference = pdb.object_reference();
        let Some(pods) = selected(pdb, &self.pods) else {
            let e = "invalid label selector".to_string();
            self.events.publish(
                &reference,
                EventType::Warning,
                "NoPods",
                &format!("Failed to get pods: {e}"),
            );
            return Err(e);
        };
        if pods.is_empty() {
            self.events.publish(
                &reference,
                EventType::Normal,
                "NoPods",
                "No matching pods found",
            );
        }
        let pods: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
        let scale = if budget::needs_scale(pdb) {
            match self.expected_scale(&pods).await {
                Ok((scale, unmanaged)) => {
                    if !unmanaged.is_empty() {
                        tracing::debug!(pods = ?unmanaged, "unmanaged pods under a budget");
                        let sel = pdb
                            .spec
                            .as_ref()
                            .and_then(|s| s.selector.as_ref())
                            .map(|s| serde_json::to_string(s).unwrap_or_default())
                            .unwrap_or_else(|| "nil".into());
                        self.events.publish(
                            &reference,
                            EventType::Warning,
                            "UnmanagedPods",
                            &format!(
                                "Pods selected by this PodDisruptionBudget (selector: {sel}) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value."
                            ),
                        );
                    }
                    scale
                }
                Err(e) => {
                    self.events.publish(
                        &reference,
                        EventType::Warning,
                        "CalculateExpectedPodCountFailed",
                        &format!("Failed to calculate the number of expected pods: {e}"),
                    );
                    return Err(e);
                }
            }
        } else {
            0
        };
        let (expected, desired) = budget::expected_and_desired(pdb, pods.len(), scale);
        let now = crate::now();
        let disrupted = budget::disrupted_pods(pdb, &pods, now);
        for name in &disrupted.expired {
            if let Some(pod) = pods
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name))
            {
                self.events.publish(
                    &pod.object_reference(),
                    EventType::Warning,
                    "NotDeleted",
                    &format!(
                        "Pod was expected by PDB {}/{} to be deleted but it wasn't",
                        pdb.namespace().unwrap_or_default(),
                        pdb.name()
                    ),
                );
            }
        }
        let healthy = budget::count_healthy(&pods, &disrupted.pods, now);
        decision::observe_with(|| {
            format!(
                "{} pods selected, {expected} expected, {healthy} healthy, {desired} desired healthy, {} disruptions allowed, {} being evicted",
                pods.len(),
                budget::disruptions_allowed(healthy, desired, expected),
                disrupted.pods.len()
            )
        });
        let recheck = disrupted.recheck.map(|at| budget::until(at, now));
        let status = budget::status(pdb, healthy, desired, expected, disrupted.pods, now);
        Ok((status, recheck))
    }

    async fn write(
        &self,
        pdb: &PodDisruptionBudget,
        status: k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus,
    ) -> Result<(), setpoint_runtime::ClientError> {
        let api: Api<PodDisruptionBudget> = Api::namespaced(
            self.client.clone(),
            pdb.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let mut new = pdb.clone();
        new.status = Some(status);
        api.replace_status(&pdb.name(), &PostParams::default(), &new)
            .await
            .map(|_| ())
    }
}

#[async_trait::async_trait]
impl Reconciler for DisruptionController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(pdb) = self.budgets.get(key) else {
            ctx.observe("the PodDisruptionBudget is gone");
            return Ok(Action::Done);
        };
        match self.try_sync(&pdb).await {
            Ok((status, recheck)) => {
                if let Some(status) = status {
                    if ctx.recording() {
                        let old = pdb.status.as_ref();
                        ctx.action(
                            "update status",
                            match old {
                                Some(o) if o.disruptions_allowed != status.disruptions_allowed => {
                                    format!(
                                        "disruptionsAllowed changed: {} -> {}",
                                        o.disruptions_allowed, status.disruptions_allowed
                                    )
                                }
                                Some(_) => {
                                    "the observed counts, disrupted pods or generation changed"
                                        .to_string()
                                }
                                None => "the budget has no status yet".to_string(),
                            },
                        );
                    }
                    match self.write(&pdb, status).await {
                        Ok(()) => {}
                        // The eviction handler (or another write) got there first: its change
                        // brings the budget back with the fresh version.
                        Err(e) if e.is_conflict() => return Ok(Action::Done),
                        Err(e) if e.is_not_found() => return Ok(Action::Done),
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(match recheck {
                    // Whole seconds are stored: wake just after the entry expires.
                    Some(d) => Action::RequeueAfter(d + Duration::from_secs(1)),
                    None => Action::Done,
                })
            }
            Err(message) => {
                tracing::warn!(pdb = %key, error = %message, "failed to sync PDB");
                let status = budget::fail_safe(&pdb, &message, crate::now());
                if ctx.recording() {
                    ctx.observe(format!("the sync failed: {message}"));
                    ctx.action(
                        "update status: 0 disruptions allowed, DisruptionAllowed=False (SyncFailed)",
                        "a failed sync allows no disruption (fail safe)",
                    );
                }
                match self.write(&pdb, status).await {
                    Ok(()) => {}
                    Err(e) if e.is_conflict() || e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
                Err(ReconcileError::terminal(message))
            }
        }
    }
}

/// The budgets in `pod`'s namespace whose selector picks it.
fn budgets_of(pod: &Pod, budgets: &Store<PodDisruptionBudget>) -> Vec<ObjectKey> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let labels = pod.metadata.labels.as_ref();
    budgets
        .by_namespace(ns)
        .into_iter()
        .filter(|b| {
            selector(b)
                .is_some_and(|s| s.matches(|k| labels.and_then(|l| l.get(k)).map(String::as_str)))
        })
        .map(|b| DisruptionController::key(ns, &b.name()))
        .collect()
}

/// The disruption controller: a budget is synced when it or one of its pods changes.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let budgets = informers.typed::<PodDisruptionBudget>(Scope::all()).store();
    let reconciler = DisruptionController {
        events: EventRecorder::new(client.clone(), Reporter::new(REPORTER)),
        client,
        budgets: budgets.clone(),
        pods: informers.typed::<Pod>(Scope::all()).store(),
        replica_sets: informers.typed::<ReplicaSet>(Scope::all()).store(),
        deployments: informers.typed::<Deployment>(Scope::all()).store(),
        controllers: informers
            .typed::<ReplicationController>(Scope::all())
            .store(),
        stateful_sets: informers.typed::<StatefulSet>(Scope::all()).store(),
    };
    Controller::for_type::<PodDisruptionBudget>(NAME, informers, None)
        .watches::<Pod>(None, move |pod| budgets_of(pod, &budgets))
        .build(Arc::new(reconciler))
}
