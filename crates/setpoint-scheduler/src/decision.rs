//! The pure scheduling decision: which nodes a pod fits on (and, when none, why not), and
//! which of them is best. No I/O, no clock: everything it needs is in its arguments.
//!
//! Filters run in Kubernetes' order and a node is rejected by the first that fails:
//! readiness (a not-Ready node counts as tainted `node.kubernetes.io/not-ready`),
//! `spec.unschedulable` (NodeUnschedulable), taints (TaintToleration),
//! `nodeSelector` and required node affinity (NodeAffinity), then requests against
//! allocatable (NodeResourcesFit, which reports every insufficient resource). Scores are
//! the default profile's: NodeResourcesFit's LeastAllocated and
//! NodeResourcesBalancedAllocation (weight 1 each), preferred node affinity (weight 2) and
//! PreferNoSchedule taints (weight 3), the last two normalized across the feasible nodes.
//! Like kube-scheduler, the search stops after finding enough feasible nodes
//! ([`nodes_to_find`]) and the next search starts where this one stopped, so pods spread
//! and large clusters cost less per pod.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, Pod, PreferredSchedulingTerm, Taint, Toleration,
};
use setpoint_api::nodeselector::{node_selector_matches, term_matches};
/// Taint matching is `setpoint_api::taints`' rule, shared with the controllers.
pub use setpoint_api::taints::{tolerates, untolerated_taint};

use crate::resources::{Allocatable, PodRequests, Resources};

/// The largest score a single plugin gives.
pub const MAX_NODE_SCORE: i64 = 100;

/// The taint that stands for `spec.unschedulable`: tolerating it lets a pod onto a cordoned node.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// The taint of a node whose Ready condition is False (or missing).
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// The taint of a node whose Ready condition is Unknown (its agent stopped reporting).
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// Below this many nodes every node is looked at (Kubernetes' `minFeasibleNodesToFind`).
pub const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;

/// What the decision needs to know about a node, derived once per node change.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.taints` with effect `NoSchedule` or `NoExecute` (the ones filtering looks at).
    pub taints: Vec<Taint>,
    /// `spec.taints` with effect `PreferNoSchedule` (the ones scoring looks at).
    pub soft_taints: Vec<Taint>,
    /// Why the node is not Ready, as the taint the node lifecycle controller puts on such a
    /// node (`node.kubernetes.io/not-ready`, or `…/unreachable` when the status is Unknown);
    /// `None` when the `Ready` condition is `True`.
    pub not_ready: Option<&'static str>,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// `status.allocatable`.
    pub allocatable: Allocatable,
}

impl NodeFacts {
    /// The facts of a node object.
    pub fn of(node: &Node) -> NodeFacts {
        let spec = node.spec.as_ref();
        NodeFacts {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: spec
                .and_then(|s| s.taints.as_ref())
                .map(|ts| {
                    ts.iter()
                        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
            soft_taints: spec
                .and_then(|s| s.taints.as_ref())
                .map(|ts| {
                    ts.iter()
                        .filter(|t| t.effect == "PreferNoSchedule")
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
            not_ready: match node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status.as_str())
            {
                Some("True") => None,
                Some("Unknown") => Some(UNREACHABLE_TAINT),
                _ => Some(NOT_READY_TAINT),
            },
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            allocatable: Allocatable::of(node),
        }
    }
}

/// A node with what is already placed on it (bound and assumed pods).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// The node's scheduling-relevant state.
    pub facts: NodeFacts,
    /// Sum of the requests of the pods on it.
    pub requested: Resources,
    /// Sum of the non-zero requests (for scoring) of the pods on it.
    pub non_zero_requested: Resources,
    /// Pods on it.
    pub pods: i64,
}

impl NodeInfo {
    /// An empty node.
    pub fn new(name: &str, facts: NodeFacts) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            facts,
            ..NodeInfo::default()
        }
    }

    /// Counts a pod in.
    pub fn add(&mut self, r: &PodRequests) {
        self.requested = self.requested.plus(r.requested);
        self.non_zero_requested = self.non_zero_requested.plus(r.non_zero);
        self.pods += 1;
    }

    /// Counts a pod out.
    pub fn remove(&mut self, r: &PodRequests) {
        self.requested = self.requested.minus(r.requested);
        self.non_zero_requested = self.non_zero_requested.minus(r.non_zero);
        self.pods -= 1;
    }
}

/// What the decision needs to know about a pod, borrowed from it.
#[derive(Clone, Copy, Debug)]
pub struct PodFacts<'a> {
    /// Its requests.
    pub requests: PodRequests,
    /// `spec.nodeSelector`.
    pub node_selector: Option<&'a BTreeMap<String, String>>,
    /// `spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
    pub required_affinity: Option<&'a NodeSelector>,
    /// `spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution`.
    pub preferred_affinity: &'a [PreferredSchedulingTerm],
    /// `spec.tolerations`.
    pub tolerations: &'a [Toleration],
    /// The required node affinity of the volumes bound to the pod's claims (VolumeBinding).
    pub volume_affinity: &'a [NodeSelector],
    /// One of the pod's claims is bound to a volume that does not exist.
    pub missing_volume: bool,
}

impl<'a> PodFacts<'a> {
    /// The facts of a pod.
    pub fn of(pod: &'a Pod) -> PodFacts<'a> {
        let spec = pod.spec.as_ref();
        let node_affinity = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref());
        PodFacts {
            requests: PodRequests::of(pod),
            node_selector: spec.and_then(|s| s.node_selector.as_ref()),
            preferred_affinity: node_affinity
                .and_then(|a| {
                    a.preferred_during_scheduling_ignored_during_execution
                        .as_deref()
                })
                .unwrap_or(&[]),
            required_affinity: node_affinity.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
            tolerations: spec.and_then(|s| s.tolerations.as_deref()).unwrap_or(&[]),
            volume_affinity: &[],
            missing_volume: false,
        }
    }
}

/// Why a node was rejected; the text is Kubernetes' so messages read the same.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The Ready condition is not True, and the pod does not tolerate that.
    NotReady,
    /// Cordoned, and the pod does not tolerate it.
    Unschedulable,
    /// A NoSchedule/NoExecute taint the pod does not tolerate.
    UntoleratedTaint {
        /// The taint's `key`.
        key: String,
        /// The taint's `value` (may be empty).
        value: String,
    },
    /// `nodeSelector` or required node affinity does not match.
    NodeAffinity,
    /// Not enough CPU left.
    InsufficientCpu,
    /// Not enough memory left.
    InsufficientMemory,
    /// The node holds its maximum number of pods.
    TooManyPods,
    /// A volume bound to one of the pod's claims cannot be reached from the node.
    VolumeNodeAffinityConflict,
    /// One of the pod's claims is bound to a volume that does not exist.
    VolumeMissing,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NotReady => f.write_str("node(s) were not ready"),
            Reason::Unschedulable => f.write_str("node(s) were unschedulable"),
            Reason::UntoleratedTaint { key, value } => {
                write!(f, "node(s) had untolerated taint {{{key}: {value}}}")
            }
            Reason::NodeAffinity => {
                f.write_str("node(s) didn't match Pod's node affinity/selector")
            }
            Reason::InsufficientCpu => f.write_str("Insufficient cpu"),
            Reason::InsufficientMemory => f.write_str("Insufficient memory"),
            Reason::TooManyPods => f.write_str("Too many pods"),
            Reason::VolumeNodeAffinityConflict => {
                f.write_str("node(s) had volume node affinity conflict")
            }
            Reason::VolumeMissing => f.write_str(
                "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)",
            ),
        }
    }
}

/// Whether `spec.nodeSelector` and required node affinity both match.
pub fn affinity_matches(pod: &PodFacts<'_>, name: &str, labels: &BTreeMap<String, String>) -> bool {
    if let Some(sel) = pod.node_selector {
        if !sel.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            return false;
        }
    }
    pod.required_affinity
        .is_none_or(|a| node_selector_matches(a, name, labels))
}

/// The resources a node lacks for a pod (Kubernetes' `Fits`); empty when it fits.
fn insufficient(pod: &PodFacts<'_>, node: &NodeInfo, out: &mut Vec<Reason>) {
    let alloc = &node.facts.allocatable;
    if node.pods + 1 > alloc.pods {
        out.push(Reason::TooManyPods);
    }
    let want = pod.requests.requested;
    let used = node.requested;
    if want.milli_cpu > 0 && want.milli_cpu > alloc.resources.milli_cpu - used.milli_cpu {
        out.push(Reason::InsufficientCpu);
    }
    if want.memory > 0 && want.memory > alloc.resources.memory - used.memory {
        out.push(Reason::InsufficientMemory);
    }
}

/// Whether the pod tolerates a `key:NoSchedule` taint with no value.
fn tolerates_no_schedule(pod: &PodFacts<'_>, key: &str) -> bool {
    let taint = Taint {
        key: key.into(),
        effect: "NoSchedule".into(),
        ..Taint::default()
    };
    pod.tolerations.iter().any(|t| tolerates(t, &taint))
}

/// Runs every filter; `Err` holds why the node was rejected (several reasons only from
/// the resource filter).
pub fn filter(pod: &PodFacts<'_>, node: &NodeInfo) -> Result<(), Vec<Reason>> {
    let facts = &node.facts;
    // A node that is not Ready takes only pods that tolerate its not-ready taint (as
    // DaemonSet pods do), whether or not the taint has been applied yet.
    if let Some(taint) = facts.not_ready {
        if !tolerates_no_schedule(pod, taint) {
            return Err(vec![Reason::NotReady]);
        }
    }
    if facts.unschedulable && !tolerates_no_schedule(pod, UNSCHEDULABLE_TAINT) {
        return Err(vec![Reason::Unschedulable]);
    }
    if let Some(t) = untolerated_taint(&facts.taints, pod.tolerations) {
        return Err(vec![Reason::UntoleratedTaint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
        }]);
    }
    if !affinity_matches(pod, &node.name, &facts.labels) {
        return Err(vec![Reason::NodeAffinity]);
    }
    if pod.missing_volume {
        return Err(vec![Reason::VolumeMissing]);
    }
    if !pod
        .volume_affinity
        .iter()
        .all(|sel| node_selector_matches(sel, &node.name, &facts.labels))
    {
        return Err(vec![Reason::VolumeNodeAffinityConflict]);
    }
    let mut reasons = Vec::new();
    insufficient(pod, node, &mut reasons);
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons)
    }
}

/// `(capacity - requested) / capacity` scaled to 0..=100; 0 when full or over.
fn least_requested(requested: i64, capacity: i64) -> i64 {
    if capacity <= 0 || requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_NODE_SCORE / capacity
}

/// NodeResourcesFit's LeastAllocated score: the mean free share of CPU and memory after
/// placing the pod, counting unset requests at their defaults.
pub fn least_allocated_score(pod: &PodFacts<'_>, node: &NodeInfo) -> i64 {
    let used = node.non_zero_requested.plus(pod.requests.non_zero);
    let alloc = node.facts.allocatable.resources;
    (least_requested(used.milli_cpu, alloc.milli_cpu) + least_requested(used.memory, alloc.memory))
        / 2
}

/// NodeResourcesBalancedAllocation: 100 × (1 − the standard deviation of the CPU and memory
/// fractions after placing the pod), so nodes whose CPU and memory fill evenly win.
pub fn balanced_allocation_score(pod: &PodFacts<'_>, node: &NodeInfo) -> i64 {
    let used = node.requested.plus(pod.requests.requested);
    let alloc = node.facts.allocatable.resources;
    let fraction = |u: i64, a: i64| (a > 0).then(|| (u as f64 / a as f64).min(1.0));
    let std = match (
        fraction(used.milli_cpu, alloc.milli_cpu),
        fraction(used.memory, alloc.memory),
    ) {
        (Some(c), Some(m)) => ((c - m) / 2.0).abs(),
        _ => 0.0,
    };
    ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
}

/// The resource scores of a node for the pod: LeastAllocated + BalancedAllocation.
pub fn score(pod: &PodFacts<'_>, node: &NodeInfo) -> i64 {
    least_allocated_score(pod, node) + balanced_allocation_score(pod, node)
}

/// NodeAffinity's raw score: the summed weights of the preferred terms the node matches.
pub fn preferred_affinity_score(pod: &PodFacts<'_>, node: &NodeInfo) -> i64 {
    pod.preferred_affinity
        .iter()
        .filter(|t| t.weight != 0 && term_matches(&t.preference, &node.name, &node.facts.labels))
        .map(|t| i64::from(t.weight))
        .sum()
}

/// TaintToleration's raw score: PreferNoSchedule taints not tolerated by the pod's
/// tolerations for that effect (or for any effect). Fewer is better.
pub fn intolerable_soft_taints(pod: &PodFacts<'_>, node: &NodeInfo) -> i64 {
    node.facts
        .soft_taints
        .iter()
        .filter(|taint| {
            !pod.tolerations.iter().any(|t| {
                matches!(
                    t.effect.as_deref(),
                    None | Some("") | Some("PreferNoSchedule")
                ) && tolerates(t, taint)
            })
        })
        .count() as i64
}

/// Kubernetes' default normalization: scales raw scores to 0..=100 by the largest one,
/// reversed when lower raw scores are better.
fn normalize(raw: i64, max: i64, reverse: bool) -> i64 {
    let s = if max == 0 {
        0
    } else {
        raw * MAX_NODE_SCORE / max
    };
    if reverse {
        MAX_NODE_SCORE - s
    } else {
        s
    }
}

/// Plugin weights of the default profile.
const RESOURCE_WEIGHT: i64 = 1;
const NODE_AFFINITY_WEIGHT: i64 = 2;
const TAINT_TOLERATION_WEIGHT: i64 = 3;

/// Total scores of the feasible nodes (indexes into `nodes`), in order: resource scores
/// plus NodeAffinity (weight 2) and TaintToleration (weight 3), each normalized across the
/// feasible nodes as Kubernetes does.
pub fn scores(pod: &PodFacts<'_>, nodes: &[NodeInfo], feasible: &[usize]) -> Vec<i64> {
    let affinity: Vec<i64> = if pod.preferred_affinity.is_empty() {
        vec![0; feasible.len()]
    } else {
        feasible
            .iter()
            .map(|&i| preferred_affinity_score(pod, &nodes[i]))
            .collect()
    };
    let taints: Vec<i64> = feasible
        .iter()
        .map(|&i| intolerable_soft_taints(pod, &nodes[i]))
        .collect();
    let max_affinity = affinity.iter().copied().max().unwrap_or(0);
    let max_taints = taints.iter().copied().max().unwrap_or(0);
    feasible
        .iter()
        .enumerate()
        .map(|(j, &i)| {
            RESOURCE_WEIGHT * score(pod, &nodes[i])
                + NODE_AFFINITY_WEIGHT * normalize(affinity[j], max_affinity, false)
                + TAINT_TOLERATION_WEIGHT * normalize(taints[j], max_taints, true)
        })
        .collect()
}

/// How many feasible nodes to find before choosing, out of `all`
/// (Kubernetes' `numFeasibleNodesToFind`). `percentage` 0 means adaptive: 50% minus one
/// percent per 125 nodes, at least 5%; never fewer than [`MIN_FEASIBLE_NODES_TO_FIND`].
pub fn nodes_to_find(all: usize, percentage: u32) -> usize {
    if all < MIN_FEASIBLE_NODES_TO_FIND || percentage >= 100 {
        return all;
    }
    let p = if percentage == 0 {
        (50usize.saturating_sub(all / 125)).max(5)
    } else {
        percentage as usize
    };
    (all * p / 100).clamp(MIN_FEASIBLE_NODES_TO_FIND, all)
}

/// A tiny random source for tie-breaking (SplitMix64): no dependency, seedable in tests.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0); the slight modulo bias is irrelevant for tie-breaking.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Where a pod goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Index of the chosen node in the slice searched.
    pub node: usize,
    /// Nodes looked at (the next search starts after them).
    pub evaluated: usize,
    /// Feasible nodes found.
    pub feasible: usize,
    /// The best-scored candidates (index, score), best first, at most [`TOP_SCORES`];
    /// empty when only one node was feasible (nothing to score).
    pub scores: Vec<(usize, i64)>,
}

/// How many candidates' scores a [`Placement`] keeps (for decision records).
pub const TOP_SCORES: usize = 3;

/// Why a pod fits nowhere: per reason, how many nodes gave it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnosis {
    /// Nodes considered.
    pub nodes: usize,
    /// Nodes rejected per reason.
    pub reasons: HashMap<Reason, usize>,
}

impl Diagnosis {
    /// Kubernetes' FailedScheduling text: `0/5 nodes are available: 2 Insufficient cpu, 3
    /// node(s) didn't match Pod's node affinity/selector.` (entries sorted as text, as
    /// kube-scheduler sorts them).
    pub fn message(&self) -> String {
        if self.nodes == 0 {
            return "no nodes available to schedule pods".into();
        }
        let mut parts: Vec<String> = self
            .reasons
            .iter()
            .map(|(r, n)| format!("{n} {r}"))
            .collect();
        parts.sort();
        format!(
            "0/{} nodes are available: {}.",
            self.nodes,
            parts.join(", ")
        )
    }
}

/// Chooses a node for a pod among `nodes`: searches from `start` (wrapping) until
/// `to_find` feasible nodes are found or every node was looked at, then takes the best
/// score, breaking ties uniformly at random.
pub fn schedule(
    pod: &PodFacts<'_>,
    nodes: &[NodeInfo],
    start: usize,
    to_find: usize,
    rng: &mut Rng,
) -> Result<Placement, Diagnosis> {
    let n = nodes.len();
    let mut feasible: Vec<usize> = Vec::with_capacity(to_find.min(n));
    let mut diagnosis = Diagnosis {
        nodes: n,
        ..Diagnosis::default()
    };
    let mut evaluated = 0;
    for i in 0..n {
        let idx = (start + i) % n;
        evaluated += 1;
        match filter(pod, &nodes[idx]) {
            Ok(()) => {
                feasible.push(idx);
                if feasible.len() >= to_find {
                    break;
                }
            }
            Err(reasons) => {
                for r in reasons {
                    *diagnosis.reasons.entry(r).or_default() += 1;
                }
            }
        }
    }
    let mut top: Vec<(usize, i64)> = Vec::new();
    let chosen = match feasible.as_slice() {
        [] => return Err(diagnosis),
        // One candidate: no need to score.
        [only] => *only,
        _ => {
            let (mut best, mut best_score, mut ties) = (feasible[0], i64::MIN, 0u64);
            for (&idx, s) in feasible.iter().zip(scores(pod, nodes, &feasible)) {
                // The few best, kept sorted (stable: earlier candidates first among equals).
                let at = top.partition_point(|&(_, t)| t >= s);
                if at < TOP_SCORES {
                    top.insert(at, (idx, s));
                    top.truncate(TOP_SCORES);
                }
                if s > best_score {
                    (best, best_score, ties) = (idx, s, 1);
                } else if s == best_score {
                    // Reservoir sampling: each of the k tied nodes ends up chosen with
                    // probability 1/k.
                    ties += 1;
                    if rng.below(ties) == 0 {
                        best = idx;
                    }
                }
            }
            best
        }
    };
    // The chosen node leads the table (a tie may have picked another than the first).
    match top.iter().position(|&(i, _)| i == chosen) {
        Some(pos) => {
            let entry = top.remove(pos);
            top.insert(0, entry);
        }
        // A tie beyond the table: it has the best score, which the table's first holds.
        None if !top.is_empty() => {
            top.insert(0, (chosen, top[0].1));
            top.truncate(TOP_SCORES);
        }
        None => {}
    }
    Ok(Placement {
        node: chosen,
        evaluated,
        feasible: feasible.len(),
        scores: top,
    })
}

#[cfg(test)]
mod tests;
