//! A node's pod range (`spec.podCIDR`), read before its pod network is configured.
//!
//! When the cluster allocates node ranges (kube-controller-manager's
//! `--allocate-node-cidrs`, the node IPAM controller), the node's pod bridge and the CNI
//! network its pods join must use the range the controller gave its Node, as flannel's
//! host-gw backend does: the other nodes route exactly that range to this node's address. The
//! range is only given once the Node exists, so the agent registers its Node first (a bare
//! one; the agent's full registration follows when it starts), waits for the range, and only
//! then opens its runtime. The range is set once: a restarted agent finds it at once.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use setpoint_api::cidr::Cidr;
use setpoint_runtime::client::{Api, Client, ClientError, ListParams, PostParams};
use tokio::time::Instant;

use crate::agent::AgentConfig;

/// How often the Node is read again while waiting for its range.
const POLL: Duration = Duration::from_millis(200);

/// How long to wait for the Node's range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodCidrWait {
    /// The cluster is known to allocate node ranges (`setpoint up --allocate-node-cidrs`):
    /// wait up to this long, then fail.
    Allocated(Duration),
    /// Whether the cluster allocates is not known (a joining agent): wait up to `timeout`
    /// when another Node has a range (so the cluster allocates them), up to `grace` when this
    /// is the only Node (nothing tells yet), and not at all when other Nodes exist and none
    /// has a range (the cluster does not allocate).
    IfAllocated {
        /// The wait when the cluster allocates ranges.
        timeout: Duration,
        /// The wait when this is the cluster's only Node.
        grace: Duration,
    },
}

/// Why the node's range could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PodCidrError {
    /// Reading or creating the Node failed.
    #[error("registering node {node} to read its pod CIDR: {source}")]
    Api {
        /// The node.
        node: String,
        /// The API's answer.
        source: ClientError,
    },
    /// The cluster allocates ranges, but this node got none in time.
    #[error("node {node} was given no spec.podCIDR within {waited:?} although the cluster allocates node ranges: the node IPAM controller may have run out of ranges (see the Node's CIDRNotAvailable events) or be stopped")]
    Timeout {
        /// The node.
        node: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The Node's range does not parse.
    #[error("node {node} has an invalid spec.podCIDR: {source}")]
    Invalid {
        /// The node.
        node: String,
        /// Why it does not parse.
        source: setpoint_api::cidr::CidrError,
    },
}

/// The range of `node`, if it has one.
pub fn pod_cidr_of(node: &Node) -> Option<&str> {
    node.spec
        .as_ref()?
        .pod_cidr
        .as_deref()
        .filter(|c| !c.is_empty())
}

/// How long `wait` waits for node `name`'s range, given the cluster's Nodes at `now`
/// (`None`: not at all, the cluster does not allocate ranges). A node IPAM controller gives a
/// new Node its range within moments, so a Node without one that is older than the grace
/// (another, or this one after a restart) shows the cluster gives none, while a younger one
/// may just not have it yet.
pub fn wait_time(
    wait: PodCidrWait,
    name: &str,
    nodes: &[Node],
    now: k8s_openapi::jiff::Timestamp,
) -> Option<Duration> {
    match wait {
        PodCidrWait::Allocated(timeout) => Some(timeout),
        PodCidrWait::IfAllocated { timeout, grace } => {
            let others: Vec<&Node> = nodes
                .iter()
                .filter(|n| n.metadata.name.as_deref() != Some(name))
                .collect();
            if others.iter().any(|n| pod_cidr_of(n).is_some()) {
                return Some(timeout);
            }
            let settled = |n: &Node| {
                n.metadata.creation_timestamp.as_ref().is_some_and(|t| {
                    now.duration_since(t.0)
                        .try_into()
                        .is_ok_and(|age: Duration| age >= grace)
                })
            };
            // This node itself, registered long ago and still without a range (a restart
            // in a cluster that gives none), tells as much as another.
            if nodes.iter().any(settled) {
                None
            } else {
                Some(grace)
            }
        }
    }
}

/// The pod range of the Node of `config`, registering a bare Node when there is none yet and
/// waiting for the range as `wait` says. `Ok(None)`: the cluster gives no ranges.
pub async fn node_pod_cidr(
    client: &Client,
    config: &AgentConfig,
    wait: PodCidrWait,
) -> Result<Option<Cidr>, PodCidrError> {
    let name = config.node_name.as_str();
    let api: Api<Node> = Api::all(client.clone());
    let failed = |source| PodCidrError::Api {
        node: name.to_string(),
        source,
    };
    let parse = |text: &str| {
        text.parse::<Cidr>()
            .map_err(|source| PodCidrError::Invalid {
                node: name.to_string(),
                source,
            })
    };
    match api.get_opt(name).await.map_err(failed)? {
        Some(node) => {
            if let Some(cidr) = pod_cidr_of(&node) {
                return parse(cidr).map(Some);
            }
        }
        None => {
            // The full registration (status, daemon endpoint) is the agent's when it starts;
            // the controller only needs the Node to exist to give it a range.
            let node = crate::node::new_node(config, 0, crate::status::now());
            match api.create(&PostParams::default(), &node).await {
                Ok(_) => tracing::info!(node = %name, "node registered to be given a pod CIDR"),
                Err(e) if e.is_already_exists() => {}
                Err(e) => return Err(failed(e)),
            }
        }
    }
    let waited = match wait {
        PodCidrWait::Allocated(timeout) => timeout,
        PodCidrWait::IfAllocated { .. } => {
            let nodes = api
                .list(&ListParams::default())
                .await
                .map_err(failed)?
                .items;
            match wait_time(wait, name, &nodes, crate::status::now()) {
                Some(w) => w,
                None => return Ok(None),
            }
        }
    };
    tracing::info!(node = %name, within = ?waited, "waiting for the node's spec.podCIDR before configuring the pod network");
    let deadline = Instant::now() + waited;
    loop {
        if let Some(node) = api.get_opt(name).await.map_err(failed)? {
            if let Some(cidr) = pod_cidr_of(&node) {
                tracing::info!(node = %name, pod_cidr = %cidr, "the node's pod CIDR");
                return parse(cidr).map(Some);
            }
        }
        if Instant::now() >= deadline {
            return match wait {
                PodCidrWait::Allocated(_) => Err(PodCidrError::Timeout {
                    node: name.to_string(),
                    waited,
                }),
                PodCidrWait::IfAllocated { .. } => {
                    // Was another node's range the sign the cluster allocates? Then this
                    // node should have one too.
                    let nodes = api
                        .list(&ListParams::default())
                        .await
                        .map_err(failed)?
                        .items;
                    let allocates = nodes.iter().any(|n| {
                        n.metadata.name.as_deref() != Some(name) && pod_cidr_of(n).is_some()
                    });
                    if allocates {
                        Err(PodCidrError::Timeout {
                            node: name.to_string(),
                            waited,
                        })
                    } else {
                        Ok(None)
                    }
                }
            };
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidr: Option<&str>) -> Node {
        aged(name, cidr, "2026-01-01T00:00:00Z")
    }

    fn aged(name: &str, cidr: Option<&str>, created: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": cidr.map(|c| serde_json::json!({"podCIDR": c})).unwrap_or_default(),
        }))
        .unwrap()
    }

    #[test]
    fn a_joining_node_waits_only_where_the_cluster_allocates() {
        let (timeout, grace) = (Duration::from_secs(60), Duration::from_secs(5));
        let wait = PodCidrWait::IfAllocated { timeout, grace };
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        // Another node has a range: the cluster allocates them.
        let allocating = [node("a", Some("10.244.0.0/24")), node("me", None)];
        assert_eq!(wait_time(wait, "me", &allocating, now), Some(timeout));
        // Other nodes, long there, and none has one: no IPAM, no wait.
        let plain = [node("a", None), node("b", None), node("me", None)];
        assert_eq!(wait_time(wait, "me", &plain, now), None);
        // Alone and new, or beside a node too new to tell: a short grace.
        let fresh = aged("me", None, "2026-01-01T00:00:59Z");
        assert_eq!(
            wait_time(wait, "me", std::slice::from_ref(&fresh), now),
            Some(grace)
        );
        let young = [aged("a", None, "2026-01-01T00:00:58Z"), fresh];
        assert_eq!(wait_time(wait, "me", &young, now), Some(grace));
        // Restarted alone, registered long ago and still without a range: none comes.
        assert_eq!(wait_time(wait, "me", &[node("me", None)], now), None);
        // Known to allocate: the whole time regardless.
        let known = PodCidrWait::Allocated(timeout);
        assert_eq!(wait_time(known, "me", &plain, now), Some(timeout));
    }

    #[test]
    fn an_empty_range_is_none() {
        assert_eq!(pod_cidr_of(&node("a", Some(""))), None);
        assert_eq!(pod_cidr_of(&node("a", None)), None);
        assert_eq!(
            pod_cidr_of(&node("a", Some("10.1.2.0/24"))),
            Some("10.1.2.0/24")
        );
    }
}
