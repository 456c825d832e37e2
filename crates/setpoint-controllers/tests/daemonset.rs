//! The DaemonSet controller against a real in-process API server with the built-in
//! controllers, on Node objects written by the test (no scheduler or node agent runs: a daemon
//! pod's node is the one its `matchFields metadata.name` affinity names).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use serde_json::json;
use setpoint_controllers::daemonset::placement::target_node;
use setpoint_runtime::client::{Api, Client, ListParams, Patch, PatchParams, PostParams};
use setpoint_runtime::decision::{self, DecisionRecord};
use setpoint_testing::TestCluster;

async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, check: impl FnMut() -> F) -> T {
    setpoint_testing::eventually_within(Duration::from_secs(30), what, check).await
}

async fn add_node(client: &Client, name: &str, tier: &str) {
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"tier": tier}}}))
            .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

async fn patch_node(client: &Client, name: &str, patch: serde_json::Value) {
    Api::<Node>::all(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// The nodes the live daemon pods of `ns` are for.
async fn daemon_nodes(client: &Client, ns: &str) -> BTreeSet<String> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    pods.items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(target_node)
        .collect()
}

/// The finished decision records of the `daemonset` controller about `{ns}/{name}` so far.
fn decisions(ns: &str, name: &str) -> Vec<Arc<DecisionRecord>> {
    decision::ring()
        .about("daemonset", name)
        .into_iter()
        .filter(|r| r.object.namespace == ns)
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn pods_follow_nodes_labels_and_taints() {
    let cluster = TestCluster::start_with_controllers().await;
    let client = cluster.client();
    let ns = "daemons";
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    for n in ["n1", "n2", "n3"] {
        add_node(&client, n, "a").await;
    }
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {"nodeSelector": {"tier": "a"},
                         "containers": [{"name": "c", "image": "busybox"}]},
            },
        }
    }))
    .unwrap();
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    sets.create(&PostParams::default(), &ds).await.unwrap();

    eventually("a pod for each of 3 nodes", || async {
        (daemon_nodes(&client, ns).await == set(&["n1", "n2", "n3"])).then_some(())
    })
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    for p in &pods.items {
        let r = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((r.kind.as_str(), r.controller), ("DaemonSet", Some(true)));
        assert!(p.metadata.labels.as_ref().unwrap()["controller-revision-hash"].len() > 3);
    }

    add_node(&client, "n4", "a").await;
    eventually("the joining node gets a pod", || async {
        (daemon_nodes(&client, ns).await == set(&["n1", "n2", "n3", "n4"])).then_some(())
    })
    .await;
    // The decision that made it says what it saw and which rule chose the node.
    let record = eventually("the decision record creating n4's pod", || async {
        decisions(ns, "agent").into_iter().find(|r| {
            r.actions
                .iter()
                .any(|a| a.action == "create a daemon pod for node n4")
        })
    })
    .await;
    assert!(
        record
            .observed
            .iter()
            .any(|o| o.starts_with("4 nodes: 4 should run the daemon pod, 3 have one, ")),
        "{record:?}"
    );
    let create = record
        .actions
        .iter()
        .find(|a| a.action == "create a daemon pod for node n4")
        .unwrap();
    assert_eq!(create.rule, "node n4 should run a daemon pod and has none");

    // NoSchedule keeps an existing pod (it is counted misscheduled); NoExecute removes it.
    patch_node(
        &client,
        "n1",
        json!({"spec": {"taints": [{"key": "dedicated", "effect": "NoSchedule"}]}}),
    )
    .await;
    eventually("n1 no longer desired, its pod kept", || async {
        let s = sets.get("agent").await.ok()?.status?;
        (s.desired_number_scheduled == 3 && s.number_misscheduled == 1).then_some(())
    })
    .await;
    assert_eq!(
        daemon_nodes(&client, ns).await,
        set(&["n1", "n2", "n3", "n4"])
    );
    patch_node(
        &client,
        "n1",
        json!({"spec": {"taints": [{"key": "dedicated", "effect": "NoExecute"}]}}),
    )
    .await;
    // A label the selector no longer matches removes the pod too.
    patch_node(
        &client,
        "n2",
        json!({"metadata": {"labels": {"tier": "b"}}}),
    )
    .await;
    eventually("pods only on n3 and n4", || async {
        (daemon_nodes(&client, ns).await == set(&["n3", "n4"])).then_some(())
    })
    .await;
    let rule = eventually("the decision record deleting n1's pod", || async {
        decisions(ns, "agent")
            .iter()
            .flat_map(|r| r.actions.clone())
            .find(|a| a.action.starts_with("delete pod ") && a.rule.starts_with("node n1 "))
            .map(|a| a.rule)
    })
    .await;
    assert_eq!(rule, "node n1 should not run the daemon pod (nodeName, nodeSelector, node affinity or an untolerated NoExecute taint)");
    eventually("the status counts 2 nodes", || async {
        let s = sets.get("agent").await.ok()?.status?;
        (s.desired_number_scheduled == 2
            && s.current_number_scheduled == 2
            && s.number_misscheduled == 0
            && s.updated_number_scheduled == Some(2)
            && s.number_unavailable == Some(2))
        .then_some(())
    })
    .await;
    cluster.stop().await;
}

/// The names and revision hashes of the live pods of `ns`.
async fn pod_hashes(client: &Client, ns: &str) -> BTreeSet<(String, String)> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    pods.items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            (
                p.metadata.name.clone().unwrap_or_default(),
                labels
                    .get("controller-revision-hash")
                    .cloned()
                    .unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn on_delete_replaces_only_deleted_pods() {
    let cluster = TestCluster::start_with_controllers().await;
    let client = cluster.client();
    let ns = "ondelete";
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    for n in ["m1", "m2"] {
        add_node(&client, n, "a").await;
    }
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "updateStrategy": {"type": "OnDelete"},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "c", "image": "busybox:1"}]},
            },
        }
    }))
    .unwrap();
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    sets.create(&PostParams::default(), &ds).await.unwrap();
    let before = eventually("a pod for each node", || async {
        let pods = pod_hashes(&client, ns).await;
        (pods.len() == 2).then_some(pods)
    })
    .await;

    let image = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "c", "image": "busybox:2"}]}}}});
    let updated = sets
        .patch("agent", &PatchParams::default(), &Patch::Strategic(image))
        .await
        .unwrap();
    let generation = updated.metadata.generation;
    eventually("the new template observed, no pod updated", || async {
        let s = sets.get("agent").await.ok()?.status?;
        (s.observed_generation == generation && s.updated_number_scheduled == Some(0)).then_some(())
    })
    .await;
    assert_eq!(
        pod_hashes(&client, ns).await,
        before,
        "OnDelete replaces nothing"
    );

    let (victim, old_hash) = before.iter().next().unwrap().clone();
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(&victim, &Default::default())
        .await
        .unwrap();
    let after = eventually("the deleted pod replaced at the new revision", || async {
        let pods = pod_hashes(&client, ns).await;
        (pods.len() == 2 && !pods.iter().any(|(n, _)| *n == victim)).then_some(pods)
    })
    .await;
    let hashes: Vec<&String> = after.iter().map(|(_, h)| h).collect();
    assert_eq!(
        hashes.iter().filter(|h| ***h == old_hash).count(),
        1,
        "only the deleted pod changed revision: {after:?}"
    );
    cluster.stop().await;
}
