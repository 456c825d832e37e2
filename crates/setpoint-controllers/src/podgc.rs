//! Pod garbage collection (upstream's `pod-garbage-collector`, "podgc"): deletes pods no one
//! else will.
//!
//! - **Terminated pods** (`Succeeded` or `Failed`) beyond `--terminated-pod-gc-threshold`
//!   (default 12500; 0 turns this off), evicted ones first, then oldest first.
//! - **Orphaned pods**, bound to a node that no longer exists. The node cache may merely be
//!   behind, so a node missing from it is quarantined first (40 s upstream, [`PodGcConfig`])
//!   and then read from the server: only a 404 condemns its pods. They get the
//!   `DisruptionTarget` condition (reason `DeletionByPodGC`) before they go.
//! - **Terminating pods on an out-of-service node**: a pod being deleted whose node is not
//!   Ready and carries the `node.kubernetes.io/out-of-service` taint.
//! - **Unscheduled terminating pods**: a pod being deleted that no node holds, which no
//!   agent will ever finish deleting.
//!
//! Every such pod is first marked `Failed` (unless it already ended), so its owner sees it
//! end, then deleted with grace period 0. [`decide`] and [`terminated_to_delete`] are the
//! pure decisions; the reconciler works per pod, plus one key for the terminated-pod count.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;
use setpoint_runtime::client::{Api, Client, DeleteParams, Patch, PatchParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

/// The controller's name, upstream's (`--controllers`, work queue, metrics, logs).
pub const NAME: &str = "pod-garbage-collector";
/// kube-controller-manager's default `--terminated-pod-gc-threshold`.
pub const DEFAULT_TERMINATED_POD_GC_THRESHOLD: usize = 12500;
/// How long a node missing from the cache is given to show up before it is read from the
/// server (upstream's `quarantineTime`).
pub const DEFAULT_QUARANTINE: Duration = Duration::from_secs(40);
/// The taint that lets terminating pods of a not-ready node go.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
/// The reason of the `DisruptionTarget` condition on an orphaned pod.
pub const REASON: &str = "DeletionByPodGC";
/// Its message.
pub const ORPHANED_MESSAGE: &str = "PodGC: node no longer exists";

/// The key standing for "count the terminated pods" (pods are namespaced, so no pod has it).
fn terminated_key() -> ObjectKey {
    ObjectKey::new(None, "terminated-pods")
}

/// The pod garbage collector's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodGcConfig {
    /// Terminated pods kept before the oldest are deleted; 0 keeps them all.
    pub terminated_pod_gc_threshold: usize,
    /// How long a missing node is quarantined before it is read from the server.
    pub quarantine: Duration,
}

impl Default for PodGcConfig {
    fn default() -> Self {
        PodGcConfig {
            terminated_pod_gc_threshold: DEFAULT_TERMINATED_POD_GC_THRESHOLD,
            quarantine: DEFAULT_QUARANTINE,
        }
    }
}

/// Whether the pod has ended: neither `Pending`, `Running` nor `Unknown` (as upstream, a pod
/// with no phase yet counts as ended only once it has one).
pub fn is_terminated(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some(p) if !matches!(p, "Pending" | "Running" | "Unknown")
    )
}

fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// What a node the pod is bound to looks like from here.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NodeView<'a> {
    /// In the node cache.
    Cached(&'a Node),
    /// Missing from the cache for this long.
    MissingFor(Duration),
}

/// What to do with one pod.
#[derive(Clone, Debug, PartialEq)]
pub enum PodDecision {
    /// Leave it.
    Keep,
    /// Its node has been missing for less than the quarantine: look again after this long.
    Quarantine(Duration),
    /// Its node is still missing after the quarantine: read the node from the server, and
    /// if it is gone, delete the pod with the `DisruptionTarget` condition.
    CheckNode,
    /// Mark it failed and delete it (no condition).
    Delete,
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

fn out_of_service(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT))
}

/// The decision for one pod, given its node (when it has one).
pub fn decide(pod: &Pod, node: Option<NodeView<'_>>, quarantine: Duration) -> PodDecision {
    let terminating = pod.metadata.deletion_timestamp.is_some();
    match (node_name(pod), node) {
        (None, _) if terminating => PodDecision::Delete,
        (None, _) => PodDecision::Keep,
        (Some(_), Some(NodeView::MissingFor(d))) if d < quarantine => {
            PodDecision::Quarantine(quarantine - d)
        }
        (Some(_), Some(NodeView::MissingFor(_))) => PodDecision::CheckNode,
        (Some(_), Some(NodeView::Cached(n))) if terminating => {
            if !node_ready(n) && out_of_service(n) {
                PodDecision::Delete
            } else {
                PodDecision::Keep
            }
        }
        (Some(_), _) => PodDecision::Keep,
    }
}

fn evicted(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some("Evicted")
    })
}

/// Upstream's order of terminated pods to delete: evicted first, then oldest first, names
/// breaking ties.
pub fn deletion_order(a: &Pod, b: &Pod) -> Ordering {
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    evicted(b)
        .cmp(&evicted(a))
        .then_with(|| created(a).cmp(&created(b)))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// The terminated pods to delete so that at most `threshold` remain (none when `threshold`
/// is 0, which turns this collection off), in the order to delete them.
pub fn terminated_to_delete(pods: &[Arc<Pod>], threshold: usize) -> Vec<Arc<Pod>> {
    if threshold == 0 {
        return Vec::new();
    }
    let mut ended: Vec<Arc<Pod>> = pods.iter().filter(|p| is_terminated(p)).cloned().collect();
    if ended.len() <= threshold {
        return Vec::new();
    }
    let n = ended.len() - threshold;
    ended.sort_by(|a, b| deletion_order(a, b));
    ended.truncate(n);
    ended
}

/// The pod's conditions with `condition` put in place of one of its type. The transition
/// time is kept when the status is unchanged, as upstream's `UpdatePodCondition` does.
pub fn with_condition(current: &[PodCondition], mut condition: PodCondition) -> Vec<PodCondition> {
    let mut out: Vec<PodCondition> = Vec::with_capacity(current.len() + 1);
    let mut replaced = false;
    for c in current {
        if c.type_ == condition.type_ {
            if c.status == condition.status {
                condition.last_transition_time = c.last_transition_time.clone();
            }
            out.push(condition.clone());
            replaced = true;
        } else {
            out.push(c.clone());
        }
    }
    if !replaced {
        out.push(condition);
    }
    out
}

/// What [`PodGc::fail_and_delete`] writes for `pod`, for the decision record.
fn fail_and_delete_what(pod: &Pod, condition: bool) -> String {
    let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name());
    match (is_terminated(pod), condition) {
        (true, _) => format!("delete pod {key} (grace period 0)"),
        (false, false) => format!("mark pod {key} Failed, then delete it (grace period 0)"),
        (false, true) => format!(
            "mark pod {key} Failed (DisruptionTarget {REASON}), then delete it (grace period 0)"
        ),
    }
}

struct PodGc {
    client: Client,
    pods: Store<Pod>,
    nodes: Store<Node>,
    config: PodGcConfig,
    /// When each node bound to by some pod was first found missing from the cache.
    missing: Mutex<HashMap<String, Instant>>,
}

impl PodGc {
    fn missing_for(&self, node: &str) -> Duration {
        let mut missing = self.missing.lock().unwrap_or_else(|e| e.into_inner());
        missing
            .entry(node.to_string())
            .or_insert_with(Instant::now)
            .elapsed()
    }

    fn found(&self, node: &str) {
        let mut missing = self.missing.lock().unwrap_or_else(|e| e.into_inner());
        missing.remove(node);
    }

    /// Marks the pod `Failed` (with `condition`) unless it already ended, then deletes it
    /// with grace period 0. A pod already gone is no error.
    async fn fail_and_delete(
        &self,
        pod: &Pod,
        condition: Option<PodCondition>,
    ) -> Result<(), ReconcileError> {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        tracing::info!(pod = %format!("{ns}/{name}"), "PodGC is force deleting Pod");
        if !is_terminated(pod) {
            let mut status = json!({"phase": "Failed"});
            if let Some(c) = condition {
                let current = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.clone())
                    .unwrap_or_default();
                status["conditions"] = serde_json::to_value(with_condition(&current, c))
                    .map_err(ReconcileError::terminal)?;
            }
            // The uid is a precondition: a pod recreated under the same name is not touched.
            let patch = json!({"metadata": {"uid": pod.uid()}, "status": status});
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            precondition_uid: pod.uid(),
            ..Default::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the terminated pods beyond the threshold.
    async fn collect_terminated(&self) -> Result<Action, ReconcileError> {
        let pods = self.pods.list();
        let threshold = self.config.terminated_pod_gc_threshold;
        let doomed = terminated_to_delete(&pods, threshold);
        // Counted only for a decision record (`terminated_to_delete` counts them too).
        let ended = if decision::recording() {
            pods.iter().filter(|p| is_terminated(p)).count()
        } else {
            0
        };
        decision::observe_with(|| {
            format!(
                "{ended} terminated pod(s) of {}, threshold {threshold}",
                pods.len()
            )
        });
        if doomed.is_empty() {
            return Ok(Action::Done);
        }
        if decision::recording() {
            let names: Vec<String> = doomed
                .iter()
                .take(5)
                .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name()))
                .collect();
            let more = doomed.len() - names.len();
            decision::action(
                format!(
                    "delete {} terminated pod(s): {}{} (grace period 0)",
                    doomed.len(),
                    names.join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    }
                ),
                format!("{ended} terminated > {threshold} threshold; evicted first, then oldest"),
            );
        }
        tracing::info!(pods = doomed.len(), "garbage collecting terminated pods");
        let results =
            futures::future::join_all(doomed.iter().map(|p| self.fail_and_delete(p, None))).await;
        results.into_iter().collect::<Result<Vec<()>, _>>()?;
        Ok(Action::Done)
    }
}

#[async_trait::async_trait]
impl Reconciler for PodGc {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        if *key == terminated_key() {
            return self.collect_terminated().await;
        }
        let Some(pod) = self.pods.get(key) else {
            ctx.observe("the pod is gone");
            return Ok(Action::Done);
        };
        let node = node_name(&pod).map(|n| match self.nodes.get(&ObjectKey::new(None, n)) {
            Some(node) => {
                self.found(n);
                Ok(node)
            }
            None => Err(self.missing_for(n)),
        });
        let view = match &node {
            Some(Ok(n)) => Some(NodeView::Cached(n)),
            Some(Err(d)) => Some(NodeView::MissingFor(*d)),
            None => None,
        };
        let terminating = pod.metadata.deletion_timestamp.is_some();
        if ctx.recording() {
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("none");
            let state = if terminating { ", terminating" } else { "" };
            ctx.observe(match (node_name(&pod), &view) {
                (None, _) => format!("phase {phase}{state}, bound to no node"),
                (Some(n), Some(NodeView::Cached(node))) => format!(
                    "phase {phase}{state}, on node {n} (Ready={}, out-of-service taint: {})",
                    if node_ready(node) { "True" } else { "not True" },
                    if out_of_service(node) { "yes" } else { "no" }
                ),
                (Some(n), _) => format!(
                    "phase {phase}{state}, its node {n} missing from the cache for {}s (quarantine {}s)",
                    match &view {
                        Some(NodeView::MissingFor(d)) => d.as_secs(),
                        _ => 0,
                    },
                    self.config.quarantine.as_secs()
                ),
            });
        }
        match decide(&pod, view, self.config.quarantine) {
            PodDecision::Keep => Ok(Action::Done),
            PodDecision::Quarantine(d) => Ok(Action::RequeueAfter(d)),
            PodDecision::Delete => {
                if ctx.recording() {
                    ctx.action(
                        fail_and_delete_what(&pod, false),
                        match node_name(&pod) {
                            None => "terminating and bound to no node: no agent will finish deleting it"
                                .to_string(),
                            Some(n) => format!(
                                "terminating on node {n}, which is not Ready and has the {OUT_OF_SERVICE_TAINT} taint"
                            ),
                        },
                    );
                }
                self.fail_and_delete(&pod, None).await?;
                Ok(Action::Done)
            }
            PodDecision::CheckNode => {
                let name = node_name(&pod).unwrap_or_default().to_string();
                let nodes: Api<Node> = Api::all(self.client.clone());
                if nodes.get_opt(&name).await?.is_some() {
                    ctx.observe(format!(
                        "node {name} exists on the server: the cache is behind"
                    ));
                    // The cache was behind; the node's arrival there settles it.
                    self.found(&name);
                    return Ok(Action::Done);
                }
                if ctx.recording() {
                    ctx.action(
                        fail_and_delete_what(&pod, true),
                        format!("orphaned: its node {name} is gone (not found on the server after the quarantine)"),
                    );
                }
                tracing::info!(pod = %key, node = %name, "found orphaned Pod assigned to the Node, deleting");
                let condition = PodCondition {
                    type_: "DisruptionTarget".into(),
                    status: "True".into(),
                    reason: Some(REASON.into()),
                    message: Some(ORPHANED_MESSAGE.into()),
                    last_transition_time: Some(Time(crate::now())),
                    ..Default::default()
                };
                self.fail_and_delete(&pod, Some(condition)).await?;
                Ok(Action::Done)
            }
        }
    }
}

/// The pod garbage collector: reconciles a pod when it changes, the pods of a node when the
/// node goes (or is taken out of service), and the terminated-pod count when a pod ends.
pub fn controller(client: Client, informers: &SharedInformers, config: PodGcConfig) -> Controller {
    let pods = informers.typed::<Pod>(Scope::all()).store();
    let nodes = informers.typed::<Node>(Scope::all()).store();
    let reconciler = PodGc {
        client,
        pods: pods.clone(),
        nodes: nodes.clone(),
        config,
        missing: Mutex::new(HashMap::new()),
    };
    let threshold = config.terminated_pod_gc_threshold;
    Controller::for_type::<Pod>(NAME, informers, None)
        .watches::<Pod>(None, move |pod: &Pod| {
            if threshold > 0 && is_terminated(pod) {
                vec![terminated_key()]
            } else {
                Vec::new()
            }
        })
        // A node gone from the cache (or out of service) wakes the pods bound to it. Other
        // node changes (status reports) do not: they change no decision.
        .watches::<Node>(None, move |node: &Node| {
            let name = node.name();
            let gone = nodes.get(&ObjectKey::new(None, &name)).is_none();
            if !gone && !out_of_service(node) {
                return Vec::new();
            }
            pods.list()
                .iter()
                .filter(|p| node_name(p) == Some(name.as_str()))
                .map(|p| ObjectKey::of(p.as_ref()))
                .collect()
        })
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: Option<&str>, phase: &str, created: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}"),
                         "creationTimestamp": created},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn terminating(mut p: Pod) -> Pod {
        p.metadata.deletion_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
        p
    }

    fn node(ready: bool, taint: Option<&str>) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "spec": {"taints": taint.map(|k| json!([{"key": k, "effect": "NoExecute"}]))},
            "status": {"conditions": [{"type": "Ready",
                                       "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    const Q: Duration = Duration::from_secs(40);

    #[test]
    fn a_missing_node_is_quarantined_then_checked() {
        let p = pod("a", Some("gone"), "Running", "2026-01-01T00:00:00Z");
        assert_eq!(
            decide(&p, Some(NodeView::MissingFor(Duration::from_secs(10))), Q),
            PodDecision::Quarantine(Duration::from_secs(30))
        );
        assert_eq!(
            decide(&p, Some(NodeView::MissingFor(Q)), Q),
            PodDecision::CheckNode
        );
        // Terminated pods of a gone node go too.
        let done = pod("b", Some("gone"), "Succeeded", "2026-01-01T00:00:00Z");
        assert_eq!(
            decide(&done, Some(NodeView::MissingFor(Q)), Q),
            PodDecision::CheckNode
        );
    }

    #[test]
    fn pods_of_existing_nodes_stay_unless_terminating_out_of_service() {
        let p = pod("a", Some("n1"), "Running", "2026-01-01T00:00:00Z");
        let healthy = node(true, None);
        assert_eq!(
            decide(&p, Some(NodeView::Cached(&healthy)), Q),
            PodDecision::Keep
        );
        let t = terminating(p.clone());
        assert_eq!(
            decide(&t, Some(NodeView::Cached(&healthy)), Q),
            PodDecision::Keep
        );
        let down = node(false, None);
        assert_eq!(
            decide(&t, Some(NodeView::Cached(&down)), Q),
            PodDecision::Keep
        );
        let oos = node(false, Some(OUT_OF_SERVICE_TAINT));
        assert_eq!(
            decide(&t, Some(NodeView::Cached(&oos)), Q),
            PodDecision::Delete
        );
        assert_eq!(
            decide(&p, Some(NodeView::Cached(&oos)), Q),
            PodDecision::Keep
        );
        let ready_oos = node(true, Some(OUT_OF_SERVICE_TAINT));
        assert_eq!(
            decide(&t, Some(NodeView::Cached(&ready_oos)), Q),
            PodDecision::Keep
        );
    }

    #[test]
    fn unscheduled_pods_go_only_when_terminating() {
        let p = pod("a", None, "Pending", "2026-01-01T00:00:00Z");
        assert_eq!(decide(&p, None, Q), PodDecision::Keep);
        assert_eq!(decide(&terminating(p), None, Q), PodDecision::Delete);
    }

    #[test]
    fn terminated_pods_beyond_the_threshold_go_evicted_then_oldest_first() {
        let mut evicted = pod("evicted", Some("n"), "Failed", "2026-01-05T00:00:00Z");
        evicted.status.as_mut().unwrap().reason = Some("Evicted".into());
        let pods: Vec<Arc<Pod>> = vec![
            pod("new", Some("n"), "Succeeded", "2026-01-04T00:00:00Z"),
            pod("running", Some("n"), "Running", "2026-01-01T00:00:00Z"),
            pod("old-b", Some("n"), "Failed", "2026-01-02T00:00:00Z"),
            pod("old-a", Some("n"), "Succeeded", "2026-01-02T00:00:00Z"),
            evicted,
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let names = |v: Vec<Arc<Pod>>| v.iter().map(|p| p.name()).collect::<Vec<_>>();
        assert_eq!(
            names(terminated_to_delete(&pods, 1)),
            ["evicted", "old-a", "old-b"]
        );
        assert_eq!(names(terminated_to_delete(&pods, 3)), ["evicted"]);
        assert!(terminated_to_delete(&pods, 4).is_empty());
        assert!(terminated_to_delete(&pods, 0).is_empty());
    }

    #[test]
    fn the_disruption_condition_replaces_one_of_its_type() {
        let t0 = Time("2026-01-01T00:00:00Z".parse().unwrap());
        let t1 = Time("2026-01-02T00:00:00Z".parse().unwrap());
        let ready = PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        };
        let cond = |status: &str, t: &Time| PodCondition {
            type_: "DisruptionTarget".into(),
            status: status.into(),
            reason: Some(REASON.into()),
            message: Some(ORPHANED_MESSAGE.into()),
            last_transition_time: Some(t.clone()),
            ..Default::default()
        };
        let added = with_condition(std::slice::from_ref(&ready), cond("True", &t0));
        assert_eq!(added.len(), 2);
        // Same status: the earlier transition time stays.
        let again = with_condition(&added, cond("True", &t1));
        assert_eq!(again[1].last_transition_time, Some(t0.clone()));
        let flipped = with_condition(&[ready, cond("False", &t0)], cond("True", &t1));
        assert_eq!(flipped.len(), 2);
        assert_eq!(flipped[1].last_transition_time, Some(t1));
        assert_eq!(flipped[1].status, "True");
    }
}
