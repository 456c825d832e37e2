//! The node IPAM controller (upstream's `nodeipam` with its range allocator): with
//! `--allocate-node-cidrs`, every Node gets `spec.podCIDR` and `spec.podCIDRs`, one subnet of
//! `--node-cidr-mask-size` bits from each `--cluster-cidr` (one per IP family). A node's
//! ranges are set once and never changed; a deleted node's go back to the pool.
//!
//! [`Allocator`] is the pure part: the used subnets of each cluster range, rebuilt from every
//! Node in the cache before the first allocation (so a restarted controller hands out nothing
//! a node already holds), the service range kept out, and round-robin allocation as
//! upstream's `cidrset` does. The reconciler patches the chosen ranges onto the Node; when a
//! range is exhausted it records upstream's `CIDRNotAvailable` event on the Node and looks
//! again later (a deleted node frees a subnet).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use serde_json::json;
use setpoint_api::cidr::Cidr;
use setpoint_runtime::client::{Api, Client, Patch, PatchParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::ObjectKey;

/// The controller's name, upstream's (`--controllers`, work queue, metrics, logs).
pub const NAME: &str = "nodeipam";

/// The reason of the event a node that cannot get a range is given, upstream's.
pub const CIDR_NOT_AVAILABLE: &str = "CIDRNotAvailable";

/// How long a node that found its cluster range exhausted waits before trying again.
const EXHAUSTED_RETRY: Duration = Duration::from_secs(10);

/// The default `--node-cidr-mask-size` of an IPv4 cluster range (upstream's).
pub const DEFAULT_NODE_MASK_V4: u8 = 24;
/// The default node mask of an IPv6 cluster range (upstream's).
pub const DEFAULT_NODE_MASK_V6: u8 = 64;

/// The widest split upstream's `cidrset` allows: at most 2^16 node ranges per cluster range.
const MAX_SPLIT_BITS: u8 = 16;

/// The settings: the cluster ranges and the node mask size of each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeIpamConfig {
    /// `--cluster-cidr`: one range, or one per IP family (dual-stack).
    pub cluster_cidrs: Vec<Cidr>,
    /// The prefix length of each node's range, index for index with `cluster_cidrs`.
    pub node_mask_sizes: Vec<u8>,
    /// Service ranges never handed to nodes where they overlap a cluster range.
    pub service_cidrs: Vec<Cidr>,
}

/// A refused node IPAM configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl NodeIpamConfig {
    /// The configuration of `--cluster-cidr` (comma-separated) and `--node-cidr-mask-size`
    /// (single-stack only, as upstream: dual-stack clusters take each family's default).
    pub fn new(
        cluster_cidr: &str,
        node_mask_size: Option<u8>,
        service_cidrs: Vec<Cidr>,
    ) -> Result<NodeIpamConfig, ConfigError> {
        let cluster_cidrs = cluster_cidr
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<Cidr>().map_err(|e| ConfigError(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        match cluster_cidrs.as_slice() {
            [] => {
                return Err(ConfigError(
                    "--cluster-cidr is required when --allocate-node-cidrs is set".into(),
                ))
            }
            [_] => {}
            [a, b] if a.is_ipv4() != b.is_ipv4() => {
                if node_mask_size.is_some() {
                    return Err(ConfigError(
                        "usage of --node-cidr-mask-size is not allowed with dual-stack clusters"
                            .into(),
                    ));
                }
            }
            _ => {
                return Err(ConfigError(
                    "--cluster-cidr takes one range, or two of different IP families (dual-stack)"
                        .into(),
                ))
            }
        }
        let mut node_mask_sizes = Vec::new();
        for cidr in &cluster_cidrs {
            let default = if cidr.is_ipv4() {
                DEFAULT_NODE_MASK_V4
            } else {
                DEFAULT_NODE_MASK_V6
            };
            let mask = node_mask_size.unwrap_or(default);
            if mask < cidr.prefix() || mask > cidr.bits() {
                return Err(ConfigError(format!(
                    "the node CIDR mask size {mask} does not fit the cluster CIDR {cidr}"
                )));
            }
            if mask - cidr.prefix() > MAX_SPLIT_BITS {
                return Err(ConfigError(
                    "New CIDR set failed; the node CIDR size is too big".into(),
                ));
            }
            node_mask_sizes.push(mask);
        }
        Ok(NodeIpamConfig {
            cluster_cidrs,
            node_mask_sizes,
            service_cidrs,
        })
    }
}

/// The subnets of one cluster range: which are used, and where the next search starts.
#[derive(Clone, Debug)]
struct CidrSet {
    cluster: Cidr,
    mask: u8,
    count: u128,
    used: BTreeSet<u128>,
    next: u128,
}

impl CidrSet {
    fn new(cluster: Cidr, mask: u8) -> CidrSet {
        CidrSet {
            cluster,
            mask,
            count: cluster.subnet_count(mask).unwrap_or(0),
            used: BTreeSet::new(),
            next: 0,
        }
    }

    /// The indices of the subnets `cidr` covers or falls in; empty when outside the range.
    fn indices(&self, cidr: &Cidr) -> Vec<u128> {
        if !self.cluster.overlaps(cidr) || cidr.is_ipv4() != self.cluster.is_ipv4() {
            return Vec::new();
        }
        if cidr.prefix() >= self.mask {
            // Inside one subnet: that subnet.
            let Some(outer) = Cidr::new(cidr.addr(), self.mask) else {
                return Vec::new();
            };
            return self
                .cluster
                .subnet_index(self.mask, &outer)
                .into_iter()
                .collect();
        }
        // Wider than a subnet: every subnet it covers that lies in the cluster range.
        let first = if cidr.prefix() <= self.cluster.prefix() {
            0
        } else {
            match Cidr::new(cidr.addr(), self.mask)
                .and_then(|c| self.cluster.subnet_index(self.mask, &c))
            {
                Some(i) => i,
                None => return Vec::new(),
            }
        };
        let n = cidr
            .subnet_count(self.mask)
            .unwrap_or(0)
            .min(self.count - first);
        (first..first + n).collect()
    }

    fn allocate(&mut self) -> Option<Cidr> {
        for offset in 0..self.count {
            let i = (self.next + offset) % self.count;
            if self.used.insert(i) {
                self.next = (i + 1) % self.count;
                return self.cluster.subnet(self.mask, i);
            }
        }
        None
    }
}

/// What a node needs now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// It has its ranges (now counted as used), or it is gone (its ranges freed).
    Nothing,
    /// Set these ranges on it (`spec.podCIDR` is the first).
    Assign(Vec<Cidr>),
    /// A cluster range has no free subnet left.
    Exhausted,
}

/// The pure allocator: the used subnets of each cluster range and which node holds which.
#[derive(Debug)]
pub struct Allocator {
    sets: Vec<CidrSet>,
    /// The ranges held per node, as last seen on the node or as handed to it.
    held: HashMap<String, Vec<Cidr>>,
}

impl Allocator {
    /// An allocator with nothing used but the service ranges.
    pub fn new(config: &NodeIpamConfig) -> Allocator {
        let mut sets: Vec<CidrSet> = config
            .cluster_cidrs
            .iter()
            .zip(&config.node_mask_sizes)
            .map(|(c, m)| CidrSet::new(*c, *m))
            .collect();
        for set in &mut sets {
            for service in &config.service_cidrs {
                let indices = set.indices(service);
                set.used.extend(indices);
            }
        }
        Allocator {
            sets,
            held: HashMap::new(),
        }
    }

    /// Counts `node`'s existing ranges as used (what a restart rebuilds from every node).
    pub fn occupy(&mut self, name: &str, pod_cidrs: &[String]) {
        let cidrs: Vec<Cidr> = pod_cidrs.iter().filter_map(|c| c.parse().ok()).collect();
        if cidrs.is_empty() {
            return;
        }
        for set in &mut self.sets {
            for cidr in &cidrs {
                let indices = set.indices(cidr);
                set.used.extend(indices);
            }
        }
        if let Some(old) = self.held.insert(name.to_string(), cidrs.clone()) {
            if old != cidrs {
                self.free(&old);
            }
        }
    }

    /// Frees the ranges `name` held (it was deleted).
    pub fn release(&mut self, name: &str) {
        if let Some(old) = self.held.remove(name) {
            self.free(&old);
        }
    }

    fn free(&mut self, cidrs: &[Cidr]) {
        let still: Vec<Cidr> = self.held.values().flatten().copied().collect();
        for set in &mut self.sets {
            for cidr in cidrs {
                // Another node may claim the same range (set by hand): keep it used then.
                if still.contains(cidr) {
                    continue;
                }
                for i in set.indices(cidr) {
                    set.used.remove(&i);
                }
            }
        }
    }

    /// Each cluster range with its node mask and how many of its subnets are used, for the
    /// decision record.
    fn usage(&self) -> String {
        self.sets
            .iter()
            .map(|s| {
                format!(
                    "{} (/{} per node, {} of {} used)",
                    s.cluster,
                    s.mask,
                    s.used.len(),
                    s.count
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The decision for the node `name`: `pod_cidrs` as its `spec.podCIDRs` says, `None`
    /// when it is gone.
    pub fn decide(&mut self, name: &str, pod_cidrs: Option<&[String]>) -> Decision {
        let Some(pod_cidrs) = pod_cidrs else {
            self.release(name);
            return Decision::Nothing;
        };
        if !pod_cidrs.is_empty() {
            self.occupy(name, pod_cidrs);
            return Decision::Nothing;
        }
        // Handed out before but not on the node yet (the patch failed or the cache is
        // behind): the same ranges again, never a second set.
        if let Some(held) = self.held.get(name) {
            return Decision::Assign(held.clone());
        }
        let mut chosen = Vec::new();
        for i in 0..self.sets.len() {
            match self.sets[i].allocate() {
                Some(c) => chosen.push(c),
                None => {
                    // Give back what the other families gave.
                    for (set, cidr) in self.sets.iter_mut().zip(&chosen) {
                        for i in set.indices(cidr) {
                            set.used.remove(&i);
                        }
                    }
                    return Decision::Exhausted;
                }
            }
        }
        self.held.insert(name.to_string(), chosen.clone());
        Decision::Assign(chosen)
    }
}

/// A node's `spec.podCIDRs`, or its `spec.podCIDR` alone as older writers set it.
pub fn pod_cidrs(node: &Node) -> Vec<String> {
    let Some(spec) = node.spec.as_ref() else {
        return Vec::new();
    };
    match (&spec.pod_cidrs, &spec.pod_cidr) {
        (Some(list), _) if !list.is_empty() => list.clone(),
        (_, Some(one)) if !one.is_empty() => vec![one.clone()],
        _ => Vec::new(),
    }
}

struct NodeIpamController {
    client: Client,
    nodes: Store<Node>,
    allocator: Mutex<(bool, Allocator)>,
    events: EventRecorder,
}

#[async_trait::async_trait]
impl Reconciler for NodeIpamController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let node = self.nodes.get(key);
        let (decision, held_before) = {
            let mut guard = self.allocator.lock().unwrap_or_else(|e| e.into_inner());
            let (rebuilt, allocator) = &mut *guard;
            if !*rebuilt {
                // Before anything is handed out, every range a node already holds is used.
                for n in self.nodes.list() {
                    allocator.occupy(n.metadata.name.as_deref().unwrap_or(""), &pod_cidrs(&n));
                }
                *rebuilt = true;
            }
            let cidrs = node.as_ref().map(|n| pod_cidrs(n));
            let held_before = allocator.held.contains_key(&key.name);
            let decision = allocator.decide(&key.name, cidrs.as_deref());
            if ctx.recording() {
                ctx.observe(match cidrs.as_deref() {
                    None if held_before => {
                        "the node is gone: its ranges go back to the pool".into()
                    }
                    None => "the node is gone".into(),
                    Some([]) => "the node has no podCIDR".into(),
                    Some(list) => format!("the node has podCIDRs {}: kept", list.join(", ")),
                });
                ctx.observe(allocator.usage());
            }
            (decision, held_before)
        };
        let Some(node) = node else {
            return Ok(Action::Done);
        };
        match decision {
            Decision::Nothing => Ok(Action::Done),
            Decision::Exhausted => {
                ctx.observe("a cluster CIDR has no free subnet: retrying later");
                tracing::warn!(node = %key.name, "no pod CIDR left in the cluster CIDR");
                self.events.publish(
                    &node.object_reference(),
                    EventType::Normal,
                    CIDR_NOT_AVAILABLE,
                    &format!("Node {} status is now: {CIDR_NOT_AVAILABLE}", key.name),
                );
                Ok(Action::RequeueAfter(EXHAUSTED_RETRY))
            }
            Decision::Assign(cidrs) => {
                let list: Vec<String> = cidrs.iter().map(Cidr::to_string).collect();
                let api: Api<Node> = Api::all(self.client.clone());
                let patch = json!({"spec": {"podCIDR": list[0], "podCIDRs": list}});
                ctx.action(
                    format!("set podCIDR {} (podCIDRs {})", list[0], list.join(", ")),
                    if held_before {
                        "handed to this node before but not on it yet: the same ranges again"
                    } else {
                        "the node has no podCIDR: the next free subnet of each cluster CIDR"
                    },
                );
                match api
                    .patch(&key.name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                {
                    Ok(_) => {
                        tracing::info!(node = %key.name, cidrs = ?list, "Set Node PodCIDR");
                        Ok(Action::Done)
                    }
                    Err(e) if e.is_not_found() => {
                        let mut guard = self.allocator.lock().unwrap_or_else(|e| e.into_inner());
                        guard.1.release(&key.name);
                        Ok(Action::Done)
                    }
                    // Kept reserved for this node: the retry sets the same ranges.
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

/// The node IPAM controller on `informers`.
pub fn controller(
    client: Client,
    informers: &SharedInformers,
    config: &NodeIpamConfig,
) -> Controller {
    let reconciler = NodeIpamController {
        events: EventRecorder::new(client.clone(), Reporter::new("cidrAllocator")),
        client,
        nodes: informers.typed::<Node>(Scope::all()).store(),
        allocator: Mutex::new((false, Allocator::new(config))),
    };
    // One worker: allocation is a sequence of decisions over one shared pool.
    Controller::for_type::<Node>(NAME, informers, None)
        .build(Arc::new(reconciler))
        .with_workers(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(cidr: &str, mask: Option<u8>) -> NodeIpamConfig {
        NodeIpamConfig::new(cidr, mask, vec!["10.96.0.0/12".parse().unwrap()]).unwrap()
    }

    fn assign(a: &mut Allocator, name: &str) -> Vec<String> {
        match a.decide(name, Some(&[])) {
            Decision::Assign(c) => c.iter().map(ToString::to_string).collect(),
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn nodes_get_subnets_in_order_and_keep_them() {
        let mut a = Allocator::new(&config("10.244.0.0/16", None));
        assert_eq!(assign(&mut a, "n1"), ["10.244.0.0/24"]);
        assert_eq!(assign(&mut a, "n2"), ["10.244.1.0/24"]);
        // Not on the node yet: the same one again.
        assert_eq!(assign(&mut a, "n1"), ["10.244.0.0/24"]);
        // On the node: nothing to do.
        assert_eq!(
            a.decide("n1", Some(&["10.244.0.0/24".into()])),
            Decision::Nothing
        );
    }

    #[test]
    fn a_restart_rebuilds_the_used_set_from_the_nodes() {
        let mut a = Allocator::new(&config("10.244.0.0/16", None));
        a.occupy("old", &["10.244.0.0/24".into()]);
        a.occupy("other", &["10.244.1.0/24".into()]);
        assert_eq!(assign(&mut a, "new"), ["10.244.2.0/24"]);
    }

    #[test]
    fn a_deleted_node_frees_its_range_and_exhaustion_is_reported() {
        let mut a = Allocator::new(&config("10.244.0.0/23", Some(24)));
        assert_eq!(assign(&mut a, "n1"), ["10.244.0.0/24"]);
        a.occupy("n1", &["10.244.0.0/24".into()]);
        assert_eq!(assign(&mut a, "n2"), ["10.244.1.0/24"]);
        assert_eq!(a.decide("n3", Some(&[])), Decision::Exhausted);
        assert_eq!(a.decide("n1", None), Decision::Nothing);
        assert_eq!(assign(&mut a, "n3"), ["10.244.0.0/24"]);
    }

    #[test]
    fn the_service_range_is_never_handed_out() {
        // 10.96.0.0/12 sits in 10.0.0.0/8: 10.96.0.0/16 .. 10.111.0.0/16 stay out.
        let mut a = Allocator::new(&config("10.0.0.0/8", Some(16)));
        for i in 0..96 {
            assert_eq!(assign(&mut a, &format!("n{i}")), [format!("10.{i}.0.0/16")]);
        }
        assert_eq!(assign(&mut a, "next"), ["10.112.0.0/16"]);
    }

    #[test]
    fn dual_stack_gives_one_range_per_family() {
        let c = NodeIpamConfig::new("10.244.0.0/16,fd00:10:244::/56", None, vec![]).unwrap();
        assert_eq!(c.node_mask_sizes, [24, 64]);
        let mut a = Allocator::new(&c);
        assert_eq!(assign(&mut a, "n1"), ["10.244.0.0/24", "fd00:10:244::/64"]);
    }

    #[test]
    fn bad_configurations_are_refused() {
        let err = |s: &str, m: Option<u8>| NodeIpamConfig::new(s, m, vec![]).unwrap_err().0;
        assert_eq!(
            err("10.0.0.0/33", None),
            "invalid CIDR address: 10.0.0.0/33"
        );
        assert_eq!(
            err("10.0.0.0/8", Some(25)),
            "New CIDR set failed; the node CIDR size is too big"
        );
        assert_eq!(
            err("10.0.0.0/16,fd00::/48", Some(24)),
            "usage of --node-cidr-mask-size is not allowed with dual-stack clusters"
        );
        assert!(err("", None).contains("--cluster-cidr is required"));
        assert!(err("10.1.0.0/24", Some(16)).contains("does not fit"));
    }
}
