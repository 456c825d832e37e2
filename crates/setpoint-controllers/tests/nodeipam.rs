//! The node IPAM controller against a real in-process API server: nodes get pod ranges in
//! order, a node's existing range is kept and never handed out again (also after a restart
//! of the controller), an exhausted cluster range gives `CIDRNotAvailable`, and a deleted
//! node's range goes to the next node that needs one.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node};
use serde_json::json;
use setpoint_api::cidr::Cidr;
use setpoint_controllers::nodeipam::NodeIpamConfig;
use setpoint_runtime::client::{Api, Client, DeleteParams, PostParams};
use setpoint_runtime::decision;
use setpoint_runtime::informer::SharedInformers;
use setpoint_testing::TestCluster;

fn start(client: &Client, config: &NodeIpamConfig) -> tokio::task::JoinHandle<()> {
    let informers = SharedInformers::new(client.clone());
    let c = setpoint_controllers::nodeipam::controller(client.clone(), &informers, config);
    tokio::spawn(async move {
        c.run(std::future::pending()).await;
        informers.shutdown().await;
    })
}

async fn create(nodes: &Api<Node>, name: &str, cidr: Option<&str>) {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"podCIDR": cidr, "podCIDRs": cidr.map(|c| vec![c])}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
}

async fn cidrs_of(nodes: &Api<Node>, name: &str) -> Option<(String, Vec<String>)> {
    let node = nodes.get_opt(name).await.unwrap()?;
    let spec = node.spec?;
    Some((spec.pod_cidr?, spec.pod_cidrs?))
}

async fn wait_for(nodes: &Api<Node>, name: &str) -> String {
    setpoint_testing::eventually_within(Duration::from_secs(30), "a pod CIDR", || async {
        let (one, list) = cidrs_of(nodes, name).await?;
        assert_eq!(list, std::slice::from_ref(&one), "podCIDRs is [podCIDR]");
        Some(one)
    })
    .await
}

#[tokio::test]
async fn ranges_are_handed_out_kept_exhausted_and_released() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    // A /22 in /24s: four ranges; the first is already held by a node.
    let config = NodeIpamConfig::new("10.244.0.0/22", Some(24), vec![]).unwrap();
    create(&nodes, "held", Some("10.244.0.0/24")).await;
    let task = start(&client, &config);
    create(&nodes, "n1", None).await;
    assert_eq!(wait_for(&nodes, "n1").await, "10.244.1.0/24");
    // Its decision record: what the pool looked like, what was set and why.
    let record = setpoint_testing::eventually_within(
        Duration::from_secs(30),
        "the decision record of n1",
        || async {
            decision::ring()
                .about(setpoint_controllers::nodeipam::NAME, "n1")
                .into_iter()
                .rev()
                .find(|r| !r.actions.is_empty())
        },
    )
    .await;
    assert_eq!(
        record.observed,
        [
            "the node has no podCIDR",
            "10.244.0.0/22 (/24 per node, 2 of 4 used)"
        ]
    );
    assert_eq!(
        record.actions[0].action,
        "set podCIDR 10.244.1.0/24 (podCIDRs 10.244.1.0/24)"
    );
    assert_eq!(
        record.actions[0].rule,
        "the node has no podCIDR: the next free subnet of each cluster CIDR"
    );
    create(&nodes, "n2", None).await;
    assert_eq!(wait_for(&nodes, "n2").await, "10.244.2.0/24");

    // A restarted controller rebuilds what is used from the nodes.
    task.abort();
    let _ = task.await;
    let task = start(&client, &config);
    create(&nodes, "n3", None).await;
    assert_eq!(wait_for(&nodes, "n3").await, "10.244.3.0/24");
    assert_eq!(wait_for(&nodes, "held").await, "10.244.0.0/24");

    // Nothing left: the node is told so, as upstream's range allocator does.
    create(&nodes, "n4", None).await;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    setpoint_testing::eventually_within(Duration::from_secs(30), "CIDRNotAvailable", || async {
        let list = events.list(&Default::default()).await.unwrap();
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("CIDRNotAvailable")
                && e.involved_object.name.as_deref() == Some("n4")
                && e.message.as_deref() == Some("Node n4 status is now: CIDRNotAvailable")
        })
    })
    .await;
    assert_eq!(cidrs_of(&nodes, "n4").await, None);

    // A deleted node's range is free again.
    nodes.delete("n2", &DeleteParams::default()).await.unwrap();
    assert_eq!(wait_for(&nodes, "n4").await, "10.244.2.0/24");
    // Every range is distinct and inside the cluster range.
    let cluster_range: Cidr = "10.244.0.0/22".parse().unwrap();
    let mut seen = Vec::new();
    for name in ["held", "n1", "n3", "n4"] {
        let c: Cidr = wait_for(&nodes, name).await.parse().unwrap();
        assert!(cluster_range.contains(&c.addr()));
        assert!(!seen.contains(&c), "{c} handed out twice");
        seen.push(c);
    }
    task.abort();
}
