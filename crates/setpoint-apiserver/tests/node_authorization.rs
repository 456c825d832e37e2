//! The Node authorizer and NodeRestriction admission against the in-process server, for nodes
//! the internal caller impersonates (`system:node:<name>` in `system:nodes`): a node reads
//! only the Secrets and ConfigMaps its pods use, writes only its own Node and Lease and its
//! pods' status, and gets upstream's 403s otherwise.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::server::Running;

async fn as_node(r: &Running, node: &str, method: &str, path: &str, body: Option<&Value>) -> Resp {
    let user = format!("system:node:{node}");
    call_with(
        r,
        method,
        path,
        body.map(|_| "application/json"),
        body.map(|b| serde_json::to_vec(b).unwrap()),
        &[
            ("Impersonate-User", &user),
            ("Impersonate-Group", "system:nodes"),
        ],
    )
    .await
}

fn message(resp: &Resp) -> &str {
    resp.body["message"].as_str().unwrap_or_default()
}

/// Polls until `check` holds (the authorizer reads the watch cache, which follows writes by
/// a moment), failing after a deadline.
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within 10s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn nodes_read_only_what_their_pods_use() {
    let r = start().await;
    for s in ["pull", "env-secret", "other"] {
        let resp = post(
            &r,
            "/api/v1/namespaces/default/secrets",
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": s}}),
        )
        .await;
        assert_eq!(resp.status, 201, "{:?}", resp.body);
    }
    let resp = post(
        &r,
        "/api/v1/namespaces/default/configmaps",
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}),
    )
    .await;
    assert_eq!(resp.status, 201);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "nodeName": "n1",
        "imagePullSecrets": [{"name": "pull"}],
        "containers": [{"name": "c", "image": "busybox", "env": [
            {"name": "A", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}}
        ]}],
        "volumes": [{"name": "v", "configMap": {"name": "cm"}}]
    }});
    let resp = post(&r, "/api/v1/namespaces/default/pods", &pod).await;
    assert_eq!(resp.status, 201, "{:?}", resp.body);

    until("n1 reads its pod's pull secret", async || {
        as_node(
            &r,
            "n1",
            "GET",
            "/api/v1/namespaces/default/secrets/pull",
            None,
        )
        .await
        .status
            == 200
    })
    .await;
    for path in [
        "/api/v1/namespaces/default/secrets/env-secret",
        "/api/v1/namespaces/default/configmaps/cm",
    ] {
        assert_eq!(
            as_node(&r, "n1", "GET", path, None).await.status,
            200,
            "{path}"
        );
    }
    let resp = as_node(
        &r,
        "n1",
        "GET",
        "/api/v1/namespaces/default/secrets/other",
        None,
    )
    .await;
    assert_eq!(resp.status, 403);
    assert_eq!(resp.body["reason"], "Forbidden");
    assert_eq!(
        message(&resp),
        "secrets \"other\" is forbidden: User \"system:node:n1\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node 'n1' and this object"
    );
    // Another node has no pod using it.
    let resp = as_node(
        &r,
        "n2",
        "GET",
        "/api/v1/namespaces/default/secrets/pull",
        None,
    )
    .await;
    assert_eq!(resp.status, 403);
    let resp = as_node(&r, "n1", "GET", "/api/v1/namespaces/default/secrets", None).await;
    assert_eq!(
        message(&resp),
        "secrets is forbidden: User \"system:node:n1\" cannot list resource \"secrets\" in API group \"\" in the namespace \"default\": No Object name found"
    );
    let resp = as_node(
        &r,
        "n1",
        "DELETE",
        "/api/v1/namespaces/default/secrets/pull",
        None,
    )
    .await;
    assert_eq!(resp.status, 403);
    assert!(message(&resp).ends_with(": can only read resources of this type"));
    // What upstream's system:node rules grant: listing pods and services.
    assert_eq!(
        as_node(&r, "n1", "GET", "/api/v1/pods", None).await.status,
        200
    );
    // Upstream's node authorizer cannot list what it allows.
    let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": "default"}});
    let resp = as_node(
        &r,
        "n1",
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        Some(&review),
    )
    .await;
    assert_eq!(resp.status, 201, "{:?}", resp.body);
    assert_eq!(resp.body["status"]["incomplete"], true);
    assert_eq!(
        resp.body["status"]["evaluationError"],
        "node authorizer does not support user rule resolution"
    );
    // A user that is not in system:nodes is not a node.
    let resp = call_with(
        &r,
        "GET",
        "/api/v1/namespaces/default/secrets/pull",
        None,
        None,
        &[("Impersonate-User", "system:node:n1")],
    )
    .await;
    assert_eq!(resp.status, 403);
}

#[tokio::test]
async fn node_restriction_limits_writes_to_the_nodes_own_objects() {
    let r = start().await;
    let node = |name: &str, labels: Value| json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}});
    let resp = as_node(
        &r,
        "n1",
        "POST",
        "/api/v1/nodes",
        Some(&node("n1", json!({"kubernetes.io/hostname": "n1"}))),
    )
    .await;
    assert_eq!(resp.status, 201, "{:?}", resp.body);
    let resp = as_node(
        &r,
        "n1",
        "POST",
        "/api/v1/nodes",
        Some(&node("n2", json!({}))),
    )
    .await;
    assert_eq!(resp.status, 403);
    assert_eq!(
        message(&resp),
        "nodes \"n2\" is forbidden: node \"n1\" is not allowed to modify node \"n2\""
    );
    let resp = as_node(
        &r,
        "n3",
        "POST",
        "/api/v1/nodes",
        Some(&node("n3", json!({"node-restriction.kubernetes.io/trusted": "yes", "node-role.kubernetes.io/control-plane": ""}))),
    )
    .await;
    assert_eq!(resp.status, 403);
    assert_eq!(
        message(&resp),
        "nodes \"n3\" is forbidden: node \"n3\" is not allowed to set the following labels: node-restriction.kubernetes.io/trusted, node-role.kubernetes.io/control-plane"
    );

    let lease = |name: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}});
    let leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    let resp = as_node(&r, "n1", "POST", leases, Some(&lease("n1"))).await;
    assert_eq!(resp.status, 201, "{:?}", resp.body);
    let resp = as_node(&r, "n1", "POST", leases, Some(&lease("n2"))).await;
    assert_eq!(resp.status, 403);
    assert_eq!(
        message(&resp),
        "leases.coordination.k8s.io \"n2\" is forbidden: can only access node lease with the same name as the requesting node"
    );
    let resp = as_node(&r, "n1", "GET", &format!("{leases}/n2"), None).await;
    assert_eq!(resp.status, 403);

    // No pods from nodes; status only of pods bound to the node.
    let pod = |name: &str, node: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
            "nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})
    };
    let resp = as_node(
        &r,
        "n1",
        "POST",
        "/api/v1/namespaces/default/pods",
        Some(&pod("mine", "n1")),
    )
    .await;
    assert_eq!(resp.status, 403);
    assert_eq!(
        message(&resp),
        "pods \"mine\" is forbidden: pod does not have \"kubernetes.io/config.mirror\" annotation, node \"n1\" can only create mirror pods"
    );
    for (name, n) in [("on-n1", "n1"), ("on-n2", "n2")] {
        assert_eq!(
            post(&r, "/api/v1/namespaces/default/pods", &pod(name, n))
                .await
                .status,
            201
        );
    }
    let status = json!({"status": {"phase": "Running"}});
    let patch_status = async |name: &str| {
        call_with(
            &r,
            "PATCH",
            &format!("/api/v1/namespaces/default/pods/{name}/status"),
            Some("application/merge-patch+json"),
            Some(serde_json::to_vec(&status).unwrap()),
            &[
                ("Impersonate-User", "system:node:n1"),
                ("Impersonate-Group", "system:nodes"),
            ],
        )
        .await
    };
    assert_eq!(patch_status("on-n1").await.status, 200);
    let resp = patch_status("on-n2").await;
    assert_eq!(resp.status, 403);
    assert_eq!(
        message(&resp),
        "pods \"on-n2\" is forbidden: node \"n1\" can only update pod status for pods with spec.nodeName set to itself"
    );
    // Deletes: only its own pods.
    let resp = as_node(
        &r,
        "n1",
        "DELETE",
        "/api/v1/namespaces/default/pods/on-n2",
        None,
    )
    .await;
    assert_eq!(resp.status, 403);
    assert_eq!(
        message(&resp),
        "pods \"on-n2\" is forbidden: node \"n1\" can only delete pods with spec.nodeName set to itself"
    );
    let resp = as_node(
        &r,
        "n1",
        "DELETE",
        "/api/v1/namespaces/default/pods/on-n1",
        None,
    )
    .await;
    assert!(resp.status == 200 || resp.status == 202, "{:?}", resp.body);
}
