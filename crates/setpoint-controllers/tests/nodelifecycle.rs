//! The node lifecycle controller against a real in-process API server: a node whose Lease
//! stops being renewed goes `Unknown`, is tainted, loses the pods whose tolerations run out,
//! and is untainted when it reports again.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use setpoint_controllers::manager::Options;
use setpoint_controllers::nodelifecycle::{NodeLifecycleConfig, UNREACHABLE};
use setpoint_runtime::client::{Api, Client, Patch, PatchParams, PostParams};
use setpoint_runtime::decision::{self, DecisionRecord};
use setpoint_testing::{eventually, TestCluster};

fn now() -> String {
    setpoint_api::time::now_rfc3339()
}

fn micro_now() -> String {
    // Lease times are MicroTime.
    setpoint_api::time::now_micro()
}

async fn report_ready(client: &Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "ready", "lastHeartbeatTime": now(), "lastTransitionTime": now()
            }]}})),
        )
        .await
        .unwrap();
}

async fn renew(client: &Client, name: &str) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let body = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro_now()}
    });
    match leases.get_opt(name).await.unwrap() {
        None => {
            leases
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(body).unwrap(),
                )
                .await
                .unwrap();
        }
        Some(_) => {
            leases
                .patch(name, &PatchParams::default(), &Patch::Merge(body))
                .await
                .unwrap();
        }
    }
}

async fn pod(client: &Client, name: &str, tolerations: serde_json::Value) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let body = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}],
                 "tolerations": tolerations}
    });
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(body).unwrap(),
    )
    .await
    .unwrap()
}

fn ready_status(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

/// The newest finished decision record of the node lifecycle controller about `name` with
/// an action whose description starts with `action`.
fn record_with_action(name: &str, action: &str) -> Option<Arc<DecisionRecord>> {
    decision::ring()
        .about(setpoint_controllers::nodelifecycle::NAME, name)
        .into_iter()
        .rev()
        .find(|r| r.actions.iter().any(|a| a.action.starts_with(action)))
}

fn has_taint(node: &Node, key: &str, effect: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key && t.effect == effect))
}

#[tokio::test]
async fn silent_node_is_tainted_its_pods_evicted_and_it_recovers() {
    let cluster = TestCluster::start_with_controller_options(Options {
        node_lifecycle: NodeLifecycleConfig {
            grace_period: Duration::from_secs(2),
        },
        ..Options::default()
    })
    .await;
    let client = cluster.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    report_ready(&client, "n1").await;
    renew(&client, "n1").await;

    // Admission gives a pod without tolerations the default 300 s ones: it outlives the test.
    let patient = pod(&client, "patient", json!([])).await;
    let tolerations = patient.spec.unwrap().tolerations.unwrap();
    assert!(tolerations
        .iter()
        .any(|t| t.key.as_deref() == Some(UNREACHABLE) && t.toleration_seconds == Some(300)));
    pod(
        &client,
        "brief",
        json!([{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}]),
    )
    .await;

    // Silence: Unknown and tainted after the grace period.
    let n = eventually("the node to turn Unknown and tainted", || async {
        let n = nodes.get("n1").await.unwrap();
        (ready_status(&n).as_deref() == Some("Unknown")
            && has_taint(&n, UNREACHABLE, "NoExecute")
            && has_taint(&n, UNREACHABLE, "NoSchedule"))
        .then_some(n)
    })
    .await;
    let ready = n
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason.as_deref(), Some("NodeStatusUnknown"));
    // The decision that did it says what it saw and by which rule.
    let marked = eventually("the decision record marking n1 Unknown", || async {
        record_with_action("n1", "mark the node's conditions Unknown")
    })
    .await;
    assert!(
        marked
            .observed
            .iter()
            .any(|o| o.starts_with("Ready=True, last heard")),
        "{marked:?}"
    );
    let rule = &marked
        .actions
        .iter()
        .find(|a| a.action.starts_with("mark the node's conditions Unknown"))
        .unwrap()
        .rule;
    assert!(rule.contains(">= 2s grace"), "{rule}");

    // The pod tolerating the taint for 1 s is evicted; the patient one stays.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let brief = eventually("the briefly tolerating pod to be evicted", || async {
        let p = pods.get("brief").await.unwrap();
        p.metadata.deletion_timestamp.is_some().then_some(p)
    })
    .await;
    // Bound to a node, it is deleted gracefully: still there, marked as upstream marks it.
    let marked = brief.status.unwrap().conditions.unwrap_or_default();
    assert!(
        marked.iter().any(|c| c.type_ == "DisruptionTarget"
            && c.status == "True"
            && c.reason.as_deref() == Some("DeletionByTaintManager")),
        "{marked:?}"
    );
    let patient = pods.get("patient").await.unwrap();
    assert!(patient.metadata.deletion_timestamp.is_none());
    let evicted = eventually("the decision record evicting brief", || async {
        record_with_action("n1", "evict pod default/brief")
    })
    .await;
    let eviction = evicted
        .actions
        .iter()
        .find(|a| a.action.starts_with("evict pod default/brief"))
        .unwrap();
    assert!(
        eviction.rule.starts_with("its tolerationSeconds ran out"),
        "{eviction:?}"
    );
    assert!(!evicted.observed.is_empty());

    // The agent comes back: the taints go.
    renew(&client, "n1").await;
    report_ready(&client, "n1").await;
    eventually("the node to be untainted", || async {
        let n = nodes.get("n1").await.unwrap();
        (!has_taint(&n, UNREACHABLE, "NoExecute") && !has_taint(&n, UNREACHABLE, "NoSchedule"))
            .then_some(())
    })
    .await;
    cluster.stop().await;
}
