//! The scheduler's view of the cluster: every node with the sum of what its pods request,
//! kept current incrementally from informer events and from the scheduler's own decisions.
//!
//! A pod counts on its node from the moment the scheduler chooses the node (it is
//! *assumed*), not from when the informer shows the binding, so two decisions in a row never
//! overcommit a node. The informer later confirms the assumption (same key, now bound); a
//! failed bind forgets it. Pods bound to nodes the cache does not know (yet, or any more)
//! are kept on a "ghost" entry, so a node that appears late starts with the right totals.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Node;
use setpoint_runtime::ObjectKey;

use crate::decision::{self, Diagnosis, NodeFacts, NodeInfo, PodFacts, Rng};
use crate::resources::PodRequests;

#[derive(Clone, Debug)]
struct PlacedPod {
    node: String,
    requests: PodRequests,
    /// Chosen by this scheduler, not yet seen bound by the informer.
    assumed: bool,
}

/// Node infos plus the pods placed on them.
#[derive(Debug, Default)]
pub struct Cache {
    /// Known nodes, in the order searches walk them.
    nodes: Vec<NodeInfo>,
    /// Node name → index in `nodes`.
    index: HashMap<String, usize>,
    /// Aggregates of pods on nodes that are not in `nodes`.
    ghosts: HashMap<String, NodeInfo>,
    pods: HashMap<ObjectKey, PlacedPod>,
    /// Where the next search starts (round-robin, as kube-scheduler).
    next_start: usize,
}

impl Cache {
    /// An empty cache.
    pub fn new() -> Cache {
        Cache::default()
    }

    /// Known nodes.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// A known node by name.
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.index.get(name).map(|&i| &self.nodes[i])
    }

    /// Pods counted (bound or assumed).
    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Whether the pod is assumed (chosen, binding not yet observed).
    pub fn is_assumed(&self, key: &ObjectKey) -> bool {
        self.pods.get(key).is_some_and(|p| p.assumed)
    }

    /// Whether the pod is counted on some node, and which.
    pub fn node_of(&self, key: &ObjectKey) -> Option<&str> {
        self.pods.get(key).map(|p| p.node.as_str())
    }

    fn info_mut(&mut self, name: &str) -> &mut NodeInfo {
        match self.index.get(name) {
            Some(&i) => &mut self.nodes[i],
            None => self
                .ghosts
                .entry(name.to_string())
                .or_insert_with(|| NodeInfo::new(name, NodeFacts::default())),
        }
    }

    /// Adds or updates a node. Returns whether anything scheduling looks at changed (so
    /// pods that did not fit before may fit now).
    pub fn set_node(&mut self, node: &Node) -> bool {
        let Some(name) = node.metadata.name.as_deref() else {
            return false;
        };
        let facts = NodeFacts::of(node);
        if let Some(&i) = self.index.get(name) {
            let info = &mut self.nodes[i];
            if info.facts == facts {
                return false;
            }
            info.facts = facts;
            return true;
        }
        let mut info = self
            .ghosts
            .remove(name)
            .unwrap_or_else(|| NodeInfo::new(name, NodeFacts::default()));
        info.facts = facts;
        self.index.insert(name.to_string(), self.nodes.len());
        self.nodes.push(info);
        true
    }

    /// Forgets a node. Its pods stay counted (on a ghost entry) until they go away.
    pub fn remove_node(&mut self, name: &str) {
        let Some(i) = self.index.remove(name) else {
            return;
        };
        let info = self.nodes.swap_remove(i);
        if let Some(moved) = self.nodes.get(i) {
            self.index.insert(moved.name.clone(), i);
        }
        if info.pods > 0 {
            self.ghosts.insert(name.to_string(), info);
        }
    }

    fn unplace(&mut self, p: &PlacedPod) {
        let info = self.info_mut(&p.node);
        info.remove(&p.requests);
        let empty_ghost = info.pods <= 0 && !self.index.contains_key(&p.node);
        if empty_ghost {
            self.ghosts.remove(&p.node);
        }
    }

    fn place(&mut self, key: ObjectKey, node: &str, requests: PodRequests, assumed: bool) {
        if let Some(old) = self.pods.remove(&key) {
            self.unplace(&old);
        }
        self.info_mut(node).add(&requests);
        self.pods.insert(
            key,
            PlacedPod {
                node: node.to_string(),
                requests,
                assumed,
            },
        );
    }

    /// Records a pod the informer shows bound to `node` (and not terminated). Confirms an
    /// assumption for it, wherever it was assumed.
    pub fn set_pod(&mut self, key: &ObjectKey, node: &str, requests: PodRequests) {
        if let Some(p) = self.pods.get_mut(key) {
            if p.node == node && p.requests == requests {
                p.assumed = false;
                return;
            }
        }
        self.place(key.clone(), node, requests, false);
    }

    /// Stops counting a pod (deleted, or terminated). Returns whether it was counted.
    pub fn remove_pod(&mut self, key: &ObjectKey) -> bool {
        match self.pods.remove(key) {
            Some(p) => {
                self.unplace(&p);
                true
            }
            None => false,
        }
    }

    /// Counts a pod on `node` now, before its binding is observed.
    pub fn assume(&mut self, key: &ObjectKey, node: &str, requests: PodRequests) {
        self.place(key.clone(), node, requests, true);
    }

    /// Drops an assumption whose bind failed. A pod already seen bound stays. Returns
    /// whether an assumption was dropped.
    pub fn forget(&mut self, key: &ObjectKey) -> bool {
        if !self.is_assumed(key) {
            return false;
        }
        self.remove_pod(key)
    }

    /// Chooses a node for a pod and assumes it there. `percentage` is
    /// percentageOfNodesToScore (0: adaptive). Returns the node's name.
    pub fn schedule(
        &mut self,
        key: &ObjectKey,
        pod: &PodFacts<'_>,
        percentage: u32,
        rng: &mut Rng,
    ) -> Result<String, Diagnosis> {
        self.schedule_explained(key, pod, percentage, rng)
            .map(|(name, _)| name)
    }

    /// [`Cache::schedule`], also saying how the node was chosen (`3 of 5 nodes evaluated, 3
    /// feasible; scores: n2=87 (chosen), n1=80`), for the scheduler's decision record.
    pub fn schedule_explained(
        &mut self,
        key: &ObjectKey,
        pod: &PodFacts<'_>,
        percentage: u32,
        rng: &mut Rng,
    ) -> Result<(String, String), Diagnosis> {
        let n = self.nodes.len();
        let to_find = decision::nodes_to_find(n, percentage);
        let start = if n == 0 { 0 } else { self.next_start % n };
        let placed = decision::schedule(pod, &self.nodes, start, to_find, rng)?;
        self.next_start = (start + placed.evaluated) % n;
        let name = self.nodes[placed.node].name.clone();
        self.assume(key, &name, pod.requests);
        let scores = if placed.scores.is_empty() {
            "the only feasible node, not scored".to_string()
        } else {
            let table: Vec<String> = placed
                .scores
                .iter()
                .map(|&(i, s)| format!("{}={s}", self.nodes[i].name))
                .collect();
            format!("scores: {}", table.join(", "))
        };
        let summary = format!(
            "{} of {n} nodes evaluated, {} feasible; {scores}",
            placed.evaluated, placed.feasible
        );
        Ok((name, summary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Resources;
    use serde_json::json;

    fn node(name: &str, cpu: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {
                "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }))
        .unwrap()
    }

    fn req(cpu: i64) -> PodRequests {
        let r = Resources {
            milli_cpu: cpu,
            memory: 0,
        };
        PodRequests {
            requested: r,
            non_zero: r,
        }
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(Some("default"), name)
    }

    #[test]
    fn pods_add_and_remove_incrementally() {
        let mut c = Cache::new();
        assert!(c.set_node(&node("a", "4")));
        c.set_pod(&key("p1"), "a", req(1000));
        c.set_pod(&key("p2"), "a", req(500));
        assert_eq!(c.node("a").unwrap().requested.milli_cpu, 1500);
        assert_eq!(c.node("a").unwrap().pods, 2);
        // Repeated updates do not double count.
        c.set_pod(&key("p2"), "a", req(500));
        assert_eq!(c.node("a").unwrap().pods, 2);
        assert!(c.remove_pod(&key("p1")));
        assert!(!c.remove_pod(&key("p1")));
        assert_eq!(c.node("a").unwrap().requested.milli_cpu, 500);
        assert_eq!(c.node("a").unwrap().pods, 1);
    }

    #[test]
    fn assumptions_count_until_confirmed_or_forgotten() {
        let mut c = Cache::new();
        c.set_node(&node("a", "4"));
        c.set_node(&node("b", "4"));
        c.assume(&key("p"), "a", req(3000));
        assert!(c.is_assumed(&key("p")));
        assert_eq!(c.node("a").unwrap().requested.milli_cpu, 3000);
        // Confirmed on the same node: still counted once, no longer assumed.
        c.set_pod(&key("p"), "a", req(3000));
        assert!(!c.is_assumed(&key("p")));
        assert!(!c.forget(&key("p")), "a confirmed pod is not forgotten");
        assert_eq!(c.node("a").unwrap().pods, 1);
        // Assumed on a, then observed bound to b (someone else bound it): moves.
        c.assume(&key("q"), "a", req(500));
        c.set_pod(&key("q"), "b", req(500));
        assert_eq!(c.node("a").unwrap().requested.milli_cpu, 3000);
        assert_eq!(c.node("b").unwrap().requested.milli_cpu, 500);
        // A failed bind forgets the assumption.
        c.assume(&key("r"), "b", req(1000));
        assert!(c.forget(&key("r")));
        assert_eq!(c.node("b").unwrap().requested.milli_cpu, 500);
        assert_eq!(c.pod_count(), 2);
    }

    #[test]
    fn node_changes_report_only_relevant_differences() {
        let mut c = Cache::new();
        let mut n = node("a", "4");
        assert!(c.set_node(&n));
        assert!(!c.set_node(&n), "same facts");
        n.metadata.resource_version = Some("9".into());
        assert!(!c.set_node(&n), "metadata noise is not a change");
        n.spec.get_or_insert_default().unschedulable = Some(true);
        assert!(c.set_node(&n));
    }

    #[test]
    fn pods_on_unknown_nodes_are_kept_for_when_the_node_appears() {
        let mut c = Cache::new();
        c.set_pod(&key("p"), "late", req(700));
        assert!(c.node("late").is_none());
        c.set_node(&node("late", "4"));
        assert_eq!(c.node("late").unwrap().requested.milli_cpu, 700);
        c.remove_node("late");
        assert!(c.node("late").is_none());
        c.set_node(&node("late", "4"));
        assert_eq!(c.node("late").unwrap().pods, 1);
        c.remove_node("late");
        c.remove_pod(&key("p"));
        assert!(c.ghosts.is_empty(), "an empty ghost is dropped");
    }

    #[test]
    fn removing_a_node_keeps_the_index_consistent() {
        let mut c = Cache::new();
        for n in ["a", "b", "c"] {
            c.set_node(&node(n, "4"));
        }
        c.remove_node("a");
        assert_eq!(c.nodes().len(), 2);
        for n in ["b", "c"] {
            assert_eq!(c.node(n).unwrap().name, n);
        }
        c.set_pod(&key("p"), "c", req(100));
        assert_eq!(c.node("c").unwrap().pods, 1);
    }

    #[test]
    fn schedule_assumes_and_never_overcommits() {
        let mut c = Cache::new();
        c.set_node(&node("a", "1"));
        c.set_node(&node("b", "1"));
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "400m"}}}]},
        }))
        .unwrap();
        let facts = PodFacts::of(&pod);
        let mut rng = Rng::new(3);
        let mut placed: HashMap<String, usize> = HashMap::new();
        for i in 0..4 {
            let n = c
                .schedule(&key(&format!("p{i}")), &facts, 0, &mut rng)
                .unwrap();
            *placed.entry(n).or_default() += 1;
        }
        assert_eq!(placed.get("a"), Some(&2));
        assert_eq!(placed.get("b"), Some(&2));
        let d = c.schedule(&key("p4"), &facts, 0, &mut rng).unwrap_err();
        assert_eq!(d.message(), "0/2 nodes are available: 2 Insufficient cpu.");
        assert_eq!(c.pod_count(), 4);
    }
}
