//! The pod garbage collector against a real in-process API server: terminated pods beyond
//! the threshold go oldest first, and an unscheduled terminating pod is marked `Failed` and
//! force-deleted.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use setpoint_controllers::podgc::PodGcConfig;
use setpoint_runtime::client::{Api, Client, DeleteParams, Patch, PatchParams, PostParams};
use setpoint_runtime::decision::{self, ActionRecord, DecisionRecord};
use setpoint_runtime::informer::SharedInformers;
use setpoint_testing::TestCluster;

fn start(client: &Client, config: PodGcConfig) -> tokio::task::JoinHandle<()> {
    let informers = SharedInformers::new(client.clone());
    let c = setpoint_controllers::podgc::controller(client.clone(), &informers, config);
    tokio::spawn(async move {
        c.run(std::future::pending()).await;
        informers.shutdown().await;
    })
}

fn pod(name: &str, node: Option<&str>, finalizer: bool) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name,
                     "finalizers": if finalizer { json!(["setpoint.dev/test-hold"]) } else { json!(null) }},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx"}]}
    }))
    .unwrap()
}

/// The newest finished decision record of the collector about `name` with an action whose
/// description starts with `action`, and that action.
fn decided(name: &str, action: &str) -> Option<(Arc<DecisionRecord>, ActionRecord)> {
    decision::ring()
        .about(setpoint_controllers::podgc::NAME, name)
        .into_iter()
        .rev()
        .find_map(|r| {
            let a = r
                .actions
                .iter()
                .find(|a| a.action.starts_with(action))?
                .clone();
            Some((r, a))
        })
}

async fn names(pods: &Api<Pod>) -> Vec<String> {
    let mut v: Vec<String> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn terminated_pods_beyond_the_threshold_go_oldest_first() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Created in this order, so `a` is the oldest (a tie in seconds goes by name).
    for name in ["a", "b", "c", "d", "running"] {
        pods.create(&PostParams::default(), &pod(name, Some("n1"), false))
            .await
            .unwrap();
    }
    for name in ["a", "b", "c", "d"] {
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .unwrap();
    }
    let task = start(
        &client,
        PodGcConfig {
            terminated_pod_gc_threshold: 2,
            ..PodGcConfig::default()
        },
    );
    setpoint_testing::eventually_within(Duration::from_secs(30), "two oldest gone", || async {
        (names(&pods).await == ["c", "d", "running"]).then_some(())
    })
    .await;
    let (record, action) =
        setpoint_testing::eventually_within(Duration::from_secs(30), "its record", || async {
            decided(
                "terminated-pods",
                "delete 2 terminated pod(s): default/a, default/b",
            )
        })
        .await;
    assert_eq!(
        action.rule,
        "4 terminated > 2 threshold; evicted first, then oldest"
    );
    assert_eq!(record.observed, ["4 terminated pod(s) of 5, threshold 2"]);
    task.abort();
    cluster.stop().await;
}

#[tokio::test]
async fn an_unscheduled_terminating_pod_is_failed_and_force_deleted() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("u", None, true))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("waiting", None, false))
        .await
        .unwrap();
    let task = start(&client, PodGcConfig::default());
    // The finalizer keeps it after the deletion, so what the collector did shows.
    pods.delete("u", &DeleteParams::default()).await.unwrap();
    let p = setpoint_testing::eventually_within(Duration::from_secs(30), "u failed", || async {
        let p = pods.get("u").await.unwrap();
        (p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")).then_some(p)
    })
    .await;
    assert!(p.metadata.deletion_timestamp.is_some());
    let (record, action) =
        setpoint_testing::eventually_within(Duration::from_secs(30), "its record", || async {
            decided("u", "mark pod default/u Failed, then delete it")
        })
        .await;
    assert!(action.rule.contains("bound to no node"), "{action:?}");
    assert!(
        record
            .observed
            .iter()
            .any(|o| o.contains("terminating, bound to no node")),
        "{record:?}"
    );
    // A pending pod that is not being deleted is left alone.
    let w = pods.get("waiting").await.unwrap();
    assert!(w.metadata.deletion_timestamp.is_none());
    assert_ne!(w.status.and_then(|s| s.phase).as_deref(), Some("Failed"));
    task.abort();
    cluster.stop().await;
}
