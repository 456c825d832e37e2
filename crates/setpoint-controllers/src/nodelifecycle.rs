//! The node lifecycle controller: notices nodes whose agent went silent, taints them, and
//! evicts their pods so the pods' owners recreate them on healthy nodes.
//!
//! A node agent proves it is alive by renewing its Lease in `kube-node-lease` (and by
//! posting status). When neither happened within the grace period, the node's conditions
//! turn `Unknown` ("Kubelet stopped posting node status.") and it gets the
//! `node.kubernetes.io/unreachable` taints; a node reporting `Ready=False` gets
//! `node.kubernetes.io/not-ready` instead. Both come as `NoSchedule` (the scheduler stops
//! placing pods there) and `NoExecute` (pods that do not tolerate the taint are evicted; pods
//! that tolerate it for `tolerationSeconds` — the API server adds 300 s by default — are
//! evicted when that runs out). A node that reports `Ready=True` again is untainted.
//!
//! Everything is derived from what the caches show (the taint's `timeAdded` is the eviction
//! clock), so a restarted controller picks up exactly where the old one was.
//!
//! [`plan_node`] and [`evictions`] are the pure decisions; [`NodeLifecycleController`] does
//! the I/O around them.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
/// Taint matching is `setpoint_api::taints`' rule, shared with the scheduler.
pub use setpoint_api::taints::tolerates;
use setpoint_runtime::client::{Api, Client, DeleteParams, Patch, PatchParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "nodelifecycle";
/// The namespace node agents renew their Leases in.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Taint of a node whose agent has not been heard from within the grace period.
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Taint of a node whose agent reports it not ready.
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
/// Condition types the agent owns; all turn `Unknown` when it goes silent.
const AGENT_CONDITIONS: &[&str] = &["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// Settings of the node lifecycle controller.
#[derive(Clone, Debug)]
pub struct NodeLifecycleConfig {
    /// How long a node may go without renewing its Lease or posting status before it is
    /// considered unreachable (Kubernetes' `--node-monitor-grace-period`, 50 s).
    pub grace_period: Duration,
}

impl Default for NodeLifecycleConfig {
    fn default() -> Self {
        NodeLifecycleConfig {
            grace_period: Duration::from_secs(50),
        }
    }
}

/// What one pass over a node should change.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePlan {
    /// The agent went silent: turn its conditions `Unknown`.
    pub mark_unknown: bool,
    /// The node's complete new taint list, when it changes.
    pub taints: Option<Vec<Taint>>,
    /// When the node goes stale if nothing is heard from it before then.
    pub recheck: Option<Duration>,
}

fn ts(t: &Option<Time>) -> Option<Timestamp> {
    t.as_ref().map(|t| t.0)
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// The last time anything was heard from the node's agent: its Lease renewal, its `Ready`
/// heartbeat, or (for a node that never reported) its creation.
pub fn last_heard(node: &Node, lease: Option<&Lease>) -> Option<Timestamp> {
    let renewed = lease.and_then(|l| l.spec.as_ref()).and_then(|s| {
        s.renew_time
            .as_ref()
            .map(|t| t.0)
            .or_else(|| s.acquire_time.as_ref().map(|t| t.0))
    });
    let heartbeat = condition(node, "Ready").and_then(|c| ts(&c.last_heartbeat_time));
    [renewed, heartbeat, ts(&node.metadata.creation_timestamp)]
        .into_iter()
        .flatten()
        .max()
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    let nanos = now.as_nanosecond() - since.as_nanosecond();
    Duration::from_nanos(nanos.clamp(0, u64::MAX as i128) as u64)
}

/// Decides a node's health: given the node, when its agent was last heard from, and the
/// time now, whether its conditions go `Unknown` and which taints it should carry.
pub fn plan_node(
    node: &Node,
    heard: Option<Timestamp>,
    now: Timestamp,
    grace: Duration,
) -> NodePlan {
    let ready = condition(node, "Ready").map(|c| c.status.as_str());
    let silent_for = heard.map(|h| elapsed(h, now));
    let stale = silent_for.is_some_and(|d| d >= grace);
    let mark_unknown = stale && ready != Some("Unknown");
    let effective = if stale { Some("Unknown") } else { ready };
    let wanted: &[&str] = match effective {
        Some("True") => &[],
        Some("False") => &[NOT_READY],
        Some(_) => &[UNREACHABLE],
        // A node that has not reported yet is given the grace period before judging it.
        None => &[],
    };
    let current = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let ours = |t: &Taint| {
        (t.key == UNREACHABLE || t.key == NOT_READY)
            && (t.effect == "NoExecute" || t.effect == "NoSchedule")
    };
    let mut next: Vec<Taint> = current.iter().filter(|t| !ours(t)).cloned().collect();
    for key in wanted {
        for effect in ["NoSchedule", "NoExecute"] {
            let kept = current
                .iter()
                .find(|t| t.key == *key && t.effect == effect)
                .cloned();
            next.push(kept.unwrap_or_else(|| Taint {
                key: key.to_string(),
                effect: effect.into(),
                time_added: (effect == "NoExecute").then_some(Time(now)),
                value: None,
            }));
        }
    }
    let same = next.len() == current.len() && next.iter().all(|t| current.contains(t));
    NodePlan {
        mark_unknown,
        taints: (!same).then_some(next),
        recheck: match silent_for {
            Some(d) if d < grace => Some(grace - d),
            _ => None,
        },
    }
}

/// Whether a change to one of the node's pods can call for action: only pods of a node with a
/// `NoExecute` taint (evictions) or whose `Ready` condition is `Unknown` (pods marked not
/// ready) can. Pods of a healthy node change all the time and need nothing from this
/// controller; should the node turn unhealthy, that change wakes it for all its pods anyway.
pub fn pods_need_attention(node: &Node) -> bool {
    let no_execute = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.effect == "NoExecute"));
    no_execute || condition(node, "Ready").is_some_and(|c| c.status == "Unknown")
}

/// The reason of the `DisruptionTarget` condition a `NoExecute` eviction gives a pod.
pub const DISRUPTION_REASON: &str = "DeletionByTaintManager";
/// Its message, as upstream's.
pub const DISRUPTION_MESSAGE: &str = "Taint manager: deleting due to NoExecute taint";

/// The status patch giving `pod` the `DisruptionTarget` condition of a taint eviction, or
/// `None` when it has it already. The pod's uid is a precondition: a pod recreated under the
/// name is not touched.
pub fn disruption_target_patch(pod: &Pod, now: Timestamp) -> Option<Patch> {
    let current = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let has = current.iter().any(|c| {
        c.type_ == "DisruptionTarget"
            && c.status == "True"
            && c.reason.as_deref() == Some(DISRUPTION_REASON)
            && c.message.as_deref() == Some(DISRUPTION_MESSAGE)
    });
    if has {
        return None;
    }
    let condition = k8s_openapi::api::core::v1::PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        reason: Some(DISRUPTION_REASON.into()),
        message: Some(DISRUPTION_MESSAGE.into()),
        last_transition_time: Some(Time(now)),
        ..Default::default()
    };
    let conditions = crate::podgc::with_condition(&current, condition);
    Some(Patch::Merge(json!({
        "metadata": {"uid": pod.metadata.uid},
        "status": {"conditions": conditions},
    })))
}

/// Pods to evict from a node with these taints, and when to look again.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evictions {
    /// Pods to delete now.
    pub now: Vec<ObjectKey>,
    /// The earliest future moment a tolerating pod runs out of toleration.
    pub recheck: Option<Duration>,
}

/// Decides which of a node's pods its `NoExecute` taints evict now: a pod that does not
/// tolerate one of them at once; a pod that tolerates them all for a limited time once the
/// shortest `tolerationSeconds` has passed since the taints were added.
pub fn evictions(taints: &[Taint], pods: &[Arc<Pod>], now: Timestamp) -> Evictions {
    let no_execute: Vec<&Taint> = taints.iter().filter(|t| t.effect == "NoExecute").collect();
    let mut out = Evictions::default();
    if no_execute.is_empty() {
        return out;
    }
    let since = no_execute
        .iter()
        .filter_map(|t| ts(&t.time_added))
        .min()
        .unwrap_or(now);
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let tolerations = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default();
        let mut limit: Option<i64> = None;
        let mut tolerated_all = true;
        for taint in &no_execute {
            let matching: Vec<&Toleration> =
                tolerations.iter().filter(|t| tolerates(t, taint)).collect();
            if matching.is_empty() {
                tolerated_all = false;
                break;
            }
            // A taint tolerated forever by one toleration is tolerated forever.
            if matching.iter().all(|t| t.toleration_seconds.is_some()) {
                let secs = matching
                    .iter()
                    .filter_map(|t| t.toleration_seconds)
                    .max()
                    .unwrap_or(0);
                limit = Some(limit.map_or(secs, |l| l.min(secs)));
            }
        }
        let key = ObjectKey::of(pod.as_ref());
        match (tolerated_all, limit) {
            (false, _) => out.now.push(key),
            (true, None) => {}
            (true, Some(secs)) => {
                let left =
                    Duration::from_secs(secs.max(0) as u64).saturating_sub(elapsed(since, now));
                if left.is_zero() {
                    out.now.push(key);
                } else {
                    out.recheck = Some(out.recheck.map_or(left, |r| r.min(left)));
                }
            }
        }
    }
    out
}

/// The conditions of a node whose agent went silent: every agent-owned condition `Unknown`.
fn unknown_conditions(node: &Node, now: Timestamp) -> Vec<NodeCondition> {
    let mut conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    for type_ in AGENT_CONDITIONS {
        let fresh = NodeCondition {
            type_: type_.to_string(),
            status: "Unknown".into(),
            reason: Some("NodeStatusUnknown".into()),
            message: Some("Kubelet stopped posting node status.".into()),
            last_transition_time: Some(Time(now)),
            last_heartbeat_time: None,
        };
        match conditions.iter_mut().find(|c| c.type_ == *type_) {
            Some(c) if c.status == "Unknown" => {}
            Some(c) => {
                // The heartbeat stays: it records when the agent was last heard from.
                let heartbeat = c.last_heartbeat_time.take();
                *c = NodeCondition {
                    last_heartbeat_time: heartbeat,
                    ..fresh
                };
            }
            None if *type_ == "Ready" => conditions.push(fresh),
            None => {}
        }
    }
    conditions
}

/// `key:effect` of each taint, for the decision record.
fn taint_list<'a>(taints: impl IntoIterator<Item = &'a Taint>) -> String {
    let list: Vec<String> = taints
        .into_iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}

/// The rule [`plan_node`] follows for the taints it wants, in words.
fn taint_rule(ready: Option<&str>, silent_for: Option<Duration>, grace: Duration) -> String {
    match (ready, silent_for) {
        (_, Some(d)) if d >= grace => format!(
            "unreachable: nothing heard for {:.1}s >= {}s grace",
            d.as_secs_f64(),
            grace.as_secs()
        ),
        (Some("True"), _) => "Ready=True: no not-ready or unreachable taints".into(),
        (Some("False"), _) => format!("Ready=False: {NOT_READY}"),
        (Some(s), _) => format!("Ready={s}: {UNREACHABLE}"),
        (None, _) => "no Ready condition yet: within the grace period, no taints".into(),
    }
}

/// Why [`evictions`] evicts `pod` now, in words.
fn eviction_rule(taints: &[Taint], pod: &Pod, now: Timestamp) -> String {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let no_execute = taints.iter().filter(|t| t.effect == "NoExecute");
    if let Some(t) = no_execute
        .clone()
        .find(|t| !tolerations.iter().any(|x| tolerates(x, t)))
    {
        return format!("it does not tolerate the NoExecute taint {}", t.key);
    }
    let since = no_execute
        .filter_map(|t| ts(&t.time_added))
        .min()
        .unwrap_or(now);
    format!(
        "its tolerationSeconds ran out ({}s since the NoExecute taint was added)",
        elapsed(since, now).as_secs()
    )
}

/// Watches nodes, their Leases and their pods; acts on [`plan_node`] and [`evictions`].
pub struct NodeLifecycleController {
    client: Client,
    config: NodeLifecycleConfig,
    nodes: Store<Node>,
    leases: Store<Lease>,
    pods: Store<Pod>,
    events: EventRecorder,
}

/// Whether a pod still says it is Ready.
fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

impl NodeLifecycleController {
    /// Nobody vouches for the pods of a silent node any more: their `Ready` condition turns
    /// False (so endpoints and controllers stop counting on them), as upstream does.
    async fn mark_pods_not_ready(&self, node: &str, now: Timestamp) -> Result<(), ReconcileError> {
        let ready: Vec<Arc<Pod>> = self
            .pods
            .by_node(node)
            .into_iter()
            .filter(|p| pod_ready(p))
            .collect();
        if !ready.is_empty() && decision::recording() {
            let names: Vec<String> = ready.iter().take(5).map(|p| p.name()).collect();
            let more = ready.len().saturating_sub(names.len());
            decision::action(
                format!(
                    "mark {} pod(s) not ready: {}{}",
                    ready.len(),
                    names.join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    }
                ),
                "the node's Ready is Unknown: nobody vouches for its pods",
            );
        }
        for pod in &ready {
            let pods: Api<Pod> = Api::namespaced(
                self.client.clone(),
                pod.metadata.namespace.as_deref().unwrap_or(""),
            );
            // Strategic merge: conditions merge by type, the others stay.
            let patch = Patch::Strategic(json!({"status": {"conditions": [{
                "type": "Ready", "status": "False", "reason": "NodeNotReady",
                "message": "the node running this pod stopped reporting",
                "lastTransitionTime": Time(now),
            }]}}));
            match pods
                .patch_status(&pod.name(), &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Reconciler for NodeLifecycleController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(node) = self.nodes.get(key) else {
            ctx.observe("the node is gone");
            return Ok(Action::Done);
        };
        let name = node.name();
        let lease = self
            .leases
            .get(&ObjectKey::new(Some(LEASE_NAMESPACE), &name));
        let now = crate::now();
        let heard = last_heard(&node, lease.as_deref());
        let grace = self.config.grace_period;
        let plan = plan_node(&node, heard, now, grace);
        let ready = condition(&node, "Ready").map(|c| c.status.as_str());
        let silent_for = heard.map(|h| elapsed(h, now));
        let current_taints = || {
            node.spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default()
        };
        if ctx.recording() {
            ctx.observe(format!(
                "Ready={}, last heard {} (grace {}s); taints: {}",
                ready.unwrap_or("none"),
                match silent_for {
                    Some(d) => format!("{:.1}s ago", d.as_secs_f64()),
                    None => "never".into(),
                },
                grace.as_secs(),
                taint_list(&current_taints()),
            ));
        }
        let api: Api<Node> = Api::all(self.client.clone());
        let mut rv = node.metadata.resource_version.clone();
        if plan.mark_unknown {
            ctx.action(
                "mark the node's conditions Unknown",
                format!(
                    "no Lease renewal or status for {:.1}s >= {}s grace",
                    silent_for.unwrap_or_default().as_secs_f64(),
                    grace.as_secs()
                ),
            );
            tracing::warn!(node = %name, "node stopped reporting; marking its conditions Unknown");
            // The resourceVersion makes this a compare-and-swap: a status the agent posted
            // meanwhile wins and this pass is retried against it.
            let patch = json!({
                "metadata": {"resourceVersion": rv},
                "status": {"conditions": unknown_conditions(&node, now)},
            });
            let written = api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
            rv = written.metadata.resource_version;
        }
        if let Some(taints) = &plan.taints {
            if ctx.recording() {
                let current = current_taints();
                let added: Vec<&Taint> = taints.iter().filter(|t| !current.contains(t)).collect();
                let removed: Vec<&Taint> = current.iter().filter(|t| !taints.contains(t)).collect();
                let mut what = Vec::new();
                if !added.is_empty() {
                    what.push(format!("add {}", taint_list(added)));
                }
                if !removed.is_empty() {
                    what.push(format!("remove {}", taint_list(removed)));
                }
                ctx.action(
                    format!("update taints: {}", what.join("; ")),
                    taint_rule(ready, silent_for, grace),
                );
            }
            tracing::info!(node = %name, taints = ?taints.iter().map(|t| format!("{}:{}", t.key, t.effect)).collect::<Vec<_>>(), "updating node taints");
            let patch = json!({
                "metadata": {"resourceVersion": rv},
                "spec": {"taints": taints},
            });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
        }
        let taints = plan.taints.clone().unwrap_or_else(current_taints);
        let silent =
            plan.mark_unknown || condition(&node, "Ready").is_some_and(|c| c.status == "Unknown");
        if silent {
            self.mark_pods_not_ready(&name, now).await?;
        }
        // Listing the node's pods is the costly part of a pass; only NoExecute taints need it.
        let evict = if taints.iter().any(|t| t.effect == "NoExecute") {
            evictions(&taints, &self.pods.by_node(&name), now)
        } else {
            Evictions::default()
        };
        if !evict.now.is_empty() || evict.recheck.is_some() {
            ctx.observe(format!(
                "NoExecute taints: {} pod(s) to evict now{}",
                evict.now.len(),
                match evict.recheck {
                    Some(d) => format!(", the next toleration runs out in {}s", d.as_secs()),
                    None => String::new(),
                }
            ));
        }
        for key in &evict.now {
            let Some(pod) = self.pods.get(key) else {
                continue;
            };
            if ctx.recording() {
                ctx.action(
                    format!("evict pod {key} (DisruptionTarget, then delete)"),
                    eviction_rule(&taints, &pod, now),
                );
            }
            let pods: Api<Pod> =
                Api::namespaced(self.client.clone(), key.namespace.as_deref().unwrap_or(""));
            // First the DisruptionTarget condition, as upstream's taint manager, so a Job's
            // podFailurePolicy can tell this eviction from a failure.
            if let Some(patch) = disruption_target_patch(&pod, now) {
                match pods
                    .patch_status(&key.name, &PatchParams::default(), &patch)
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() || e.is_conflict() => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            let params = DeleteParams {
                precondition_uid: pod.metadata.uid.clone(),
                ..DeleteParams::default()
            };
            match pods.delete(&key.name, &params).await {
                Ok(_) => {
                    self.events.publish(
                        &pod.object_reference(),
                        EventType::Normal,
                        "TaintManagerEviction",
                        &format!("Marking for deletion Pod {key}"),
                    );
                }
                Err(e) if e.is_not_found() || e.is_conflict() => {}
                Err(e) => return Err(e.into()),
            }
        }
        let recheck = [plan.recheck, evict.recheck].into_iter().flatten().min();
        Ok(match recheck {
            // A little slack so the re-check lands after the deadline, not just before it.
            Some(d) => Action::RequeueAfter(d + Duration::from_millis(100)),
            None => Action::Done,
        })
    }
}

/// The node lifecycle controller on `informers`.
pub fn controller(
    client: Client,
    informers: &SharedInformers,
    config: NodeLifecycleConfig,
) -> Controller {
    let reconciler = NodeLifecycleController {
        events: EventRecorder::new(client.clone(), Reporter::new("node-controller")),
        client,
        config,
        nodes: informers.typed::<Node>(Scope::all()).store(),
        leases: informers
            .typed::<Lease>(Scope::namespace(LEASE_NAMESPACE))
            .store(),
        pods: informers.typed::<Pod>(Scope::all()).store(),
    };
    let nodes = reconciler.nodes.clone();
    Controller::for_type::<Node>(NAME, informers, None)
        .watches::<Lease>(Some(Scope::namespace(LEASE_NAMESPACE)), |l: &Lease| {
            vec![ObjectKey::new(None, &l.name())]
        })
        // A pod bound to a tainted or silent node may have to go or be marked not ready. A
        // node not in the cache yet is woken: its own event decides once it arrives.
        .watches::<Pod>(None, move |p: &Pod| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .map(|n| ObjectKey::new(None, n))
                .filter(|key| nodes.get(key).is_none_or(|n| pods_need_attention(&n)))
                .into_iter()
                .collect()
        })
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, PodSpec};

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn node(ready: Option<&str>, taints: Vec<Taint>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.metadata.creation_timestamp = Some(Time(at(0)));
        n.spec = Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            ..NodeSpec::default()
        });
        n.status = Some(NodeStatus {
            conditions: ready.map(|s| {
                vec![NodeCondition {
                    type_: "Ready".into(),
                    status: s.into(),
                    last_heartbeat_time: Some(Time(at(0))),
                    ..NodeCondition::default()
                }]
            }),
            ..NodeStatus::default()
        });
        n
    }

    fn taint(key: &str, effect: &str, added: Option<i64>) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            time_added: added.map(|s| Time(at(s))),
            value: None,
        }
    }

    #[test]
    fn only_pods_of_tainted_or_silent_nodes_need_attention() {
        assert!(!pods_need_attention(&node(Some("True"), vec![])));
        assert!(!pods_need_attention(&node(None, vec![])));
        assert!(!pods_need_attention(&node(Some("False"), vec![])));
        let no_schedule = taint(NOT_READY, "NoSchedule", None);
        assert!(!pods_need_attention(&node(
            Some("False"),
            vec![no_schedule]
        )));
        assert!(pods_need_attention(&node(Some("Unknown"), vec![])));
        let no_execute = taint("dedicated", "NoExecute", Some(1));
        assert!(pods_need_attention(&node(Some("True"), vec![no_execute])));
    }

    const GRACE: Duration = Duration::from_secs(50);

    #[test]
    fn healthy_node_is_left_alone_and_rechecked_when_it_would_go_stale() {
        let n = node(Some("True"), vec![]);
        let plan = plan_node(&n, Some(at(0)), at(20), GRACE);
        assert_eq!(
            plan,
            NodePlan {
                mark_unknown: false,
                taints: None,
                recheck: Some(Duration::from_secs(30)),
            }
        );
    }

    #[test]
    fn silent_node_goes_unknown_and_unreachable() {
        let n = node(Some("True"), vec![taint("dedicated", "NoSchedule", None)]);
        let plan = plan_node(&n, Some(at(0)), at(50), GRACE);
        assert!(plan.mark_unknown);
        let taints = plan.taints.unwrap();
        assert_eq!(taints.len(), 3, "{taints:?}");
        assert_eq!(taints[0].key, "dedicated", "other taints are kept");
        assert!(taints.iter().any(|t| t.key == UNREACHABLE
            && t.effect == "NoExecute"
            && ts(&t.time_added) == Some(at(50))));
        assert!(taints
            .iter()
            .any(|t| t.key == UNREACHABLE && t.effect == "NoSchedule"));
    }

    #[test]
    fn already_marked_node_changes_nothing() {
        let n = node(
            Some("Unknown"),
            vec![
                taint(UNREACHABLE, "NoSchedule", None),
                taint(UNREACHABLE, "NoExecute", Some(50)),
            ],
        );
        let plan = plan_node(&n, Some(at(0)), at(200), GRACE);
        assert_eq!(
            plan,
            NodePlan {
                mark_unknown: false,
                taints: None,
                recheck: None
            }
        );
    }

    #[test]
    fn node_back_to_ready_is_untainted_and_not_ready_swaps_taints() {
        let tainted = vec![
            taint(UNREACHABLE, "NoSchedule", None),
            taint(UNREACHABLE, "NoExecute", Some(50)),
        ];
        let back = node(Some("True"), tainted.clone());
        let plan = plan_node(&back, Some(at(100)), at(101), GRACE);
        assert_eq!(plan.taints, Some(vec![]));
        assert!(!plan.mark_unknown);

        let not_ready = node(Some("False"), tainted);
        let plan = plan_node(&not_ready, Some(at(100)), at(101), GRACE);
        let taints = plan.taints.unwrap();
        assert!(taints.iter().all(|t| t.key == NOT_READY));
        assert_eq!(taints.len(), 2);
    }

    #[test]
    fn node_that_never_reported_gets_the_grace_period_from_creation() {
        let n = node(None, vec![]);
        let heard = last_heard(&n, None);
        assert_eq!(heard, Some(at(0)));
        assert!(!plan_node(&n, heard, at(10), GRACE).mark_unknown);
        let plan = plan_node(&n, heard, at(60), GRACE);
        assert!(plan.mark_unknown);
        assert!(plan.taints.is_some());
    }

    #[test]
    fn lease_renewal_counts_as_heard() {
        let n = node(Some("True"), vec![]);
        let lease = Lease {
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    at(45),
                )),
                ..Default::default()
            }),
            ..Lease::default()
        };
        assert_eq!(last_heard(&n, Some(&lease)), Some(at(45)));
        assert!(!plan_node(&n, Some(at(45)), at(60), GRACE).mark_unknown);
    }

    #[test]
    fn unknown_conditions_keep_heartbeat_and_transition() {
        let n = node(Some("True"), vec![]);
        let c = unknown_conditions(&n, at(60));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].status, "Unknown");
        assert_eq!(c[0].reason.as_deref(), Some("NodeStatusUnknown"));
        assert_eq!(ts(&c[0].last_heartbeat_time), Some(at(0)));
        assert_eq!(ts(&c[0].last_transition_time), Some(at(60)));
    }

    fn pod(name: &str, tolerations: Vec<Toleration>) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        p.spec = Some(PodSpec {
            tolerations: Some(tolerations),
            node_name: Some("n1".into()),
            ..PodSpec::default()
        });
        Arc::new(p)
    }

    fn toleration(
        key: Option<&str>,
        op: &str,
        effect: Option<&str>,
        secs: Option<i64>,
    ) -> Toleration {
        Toleration {
            key: key.map(String::from),
            operator: Some(op.into()),
            effect: effect.map(String::from),
            toleration_seconds: secs,
            value: None,
        }
    }

    #[test]
    fn toleration_matching_rules() {
        let t = taint("k", "NoExecute", None);
        assert!(tolerates(&toleration(None, "Exists", None, None), &t));
        assert!(tolerates(
            &toleration(Some("k"), "Exists", Some("NoExecute"), None),
            &t
        ));
        assert!(!tolerates(
            &toleration(Some("k"), "Exists", Some("NoSchedule"), None),
            &t
        ));
        assert!(!tolerates(
            &toleration(Some("other"), "Exists", None, None),
            &t
        ));
        let mut eq = toleration(Some("k"), "Equal", None, None);
        assert!(tolerates(&eq, &t), "empty value equals missing value");
        eq.value = Some("v".into());
        assert!(!tolerates(&eq, &t));
    }

    #[test]
    fn a_taint_eviction_marks_the_pod_as_upstream() {
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u1".into());
        let Some(Patch::Merge(p)) = disruption_target_patch(&pod, Timestamp::UNIX_EPOCH) else {
            panic!("a merge patch")
        };
        assert_eq!(p["metadata"]["uid"], "u1");
        let c = &p["status"]["conditions"][0];
        assert_eq!(
            (&c["type"], &c["status"], &c["reason"], &c["message"]),
            (
                &json!("DisruptionTarget"),
                &json!("True"),
                &json!("DeletionByTaintManager"),
                &json!("Taint manager: deleting due to NoExecute taint")
            )
        );
        let marked: Pod = serde_json::from_value(json!({"status": p["status"]})).unwrap();
        assert!(disruption_target_patch(&marked, Timestamp::UNIX_EPOCH).is_none());
    }

    #[test]
    fn eviction_timing_follows_tolerations() {
        let taints = vec![
            taint(UNREACHABLE, "NoSchedule", None),
            taint(UNREACHABLE, "NoExecute", Some(100)),
        ];
        let pods = vec![
            pod("intolerant", vec![]),
            pod(
                "short",
                vec![toleration(
                    Some(UNREACHABLE),
                    "Exists",
                    Some("NoExecute"),
                    Some(5),
                )],
            ),
            pod(
                "long",
                vec![toleration(
                    Some(UNREACHABLE),
                    "Exists",
                    Some("NoExecute"),
                    Some(300),
                )],
            ),
            pod("forever", vec![toleration(None, "Exists", None, None)]),
        ];
        let e = evictions(&taints, &pods, at(102));
        assert_eq!(e.now, vec![ObjectKey::new(Some("ns"), "intolerant")]);
        assert_eq!(e.recheck, Some(Duration::from_secs(3)));
        let e = evictions(&taints, &pods, at(105));
        assert_eq!(
            e.now,
            vec![
                ObjectKey::new(Some("ns"), "intolerant"),
                ObjectKey::new(Some("ns"), "short")
            ]
        );
        assert_eq!(e.recheck, Some(Duration::from_secs(295)));
        let e = evictions(&taints, &pods, at(1000));
        assert_eq!(e.now.len(), 3, "only the pod tolerating forever stays");
    }

    #[test]
    fn no_execute_free_nodes_evict_nothing() {
        let taints = vec![taint(UNREACHABLE, "NoSchedule", None)];
        let e = evictions(&taints, &[pod("p", vec![])], at(0));
        assert_eq!(e, Evictions::default());
    }
}
