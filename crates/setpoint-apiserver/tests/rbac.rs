//! RBAC against the in-process server: the bootstrap policy and its reconciliation, the
//! validation of the four kinds, and authorization and escalation prevention for users the
//! internal caller impersonates (plain-HTTP callers are `system:masters`).

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::server::Running;
use setpoint_apiserver::ApiServer;

const RBAC: &str = "/apis/rbac.authorization.k8s.io/v1";
const G: &str = "rbac.authorization.k8s.io";

async fn as_user(r: &Running, method: &str, path: &str, body: Option<&Value>, user: &str) -> Resp {
    call_with(
        r,
        method,
        path,
        body.map(|_| "application/json"),
        body.map(|b| serde_json::to_vec(b).unwrap()),
        &[("Impersonate-User", user)],
    )
    .await
}

/// Polls until `check` holds, failing after a deadline (RBAC reads the watch cache, which
/// follows writes by a moment).
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within 10s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn binding(ns: &str, name: &str, kind: &str, role: &str, user: &str) -> Value {
    json!({"apiVersion": format!("{G}/v1"), "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": G, "kind": kind, "name": role},
        "subjects": [{"kind": "User", "apiGroup": G, "name": user}]})
}

#[tokio::test]
async fn bootstrap_policy_is_served_and_reconciled() {
    let config = memory_config();
    let store = ApiServer::open_store(&config).await.unwrap();
    let first = ApiServer::new(config.clone(), store.clone()).await.unwrap();
    let r = first.serve().await.unwrap();
    let admin = get(&r, &format!("{RBAC}/clusterroles/cluster-admin")).await;
    assert_eq!(admin.status, 200);
    assert_eq!(
        admin.body["metadata"]["labels"]["kubernetes.io/bootstrapping"],
        "rbac-defaults"
    );
    assert_eq!(
        admin.body["rules"],
        json!([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
               {"verbs": ["*"], "nonResourceURLs": ["*"]}])
    );
    let public = get(
        &r,
        &format!("{RBAC}/clusterrolebindings/system:public-info-viewer"),
    )
    .await;
    let groups: Vec<&str> = public.body["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(groups, ["system:authenticated", "system:unauthenticated"]);

    // A user narrows one role, and protects another with autoupdate=false.
    let path = format!("{RBAC}/clusterroles/system:discovery");
    let mut discovery = get(&r, &path).await.body;
    discovery["rules"] = json!([{"verbs": ["get"], "nonResourceURLs": ["/custom"]}]);
    assert_eq!(put(&r, &path, &discovery).await.status, 200);
    let path = format!("{RBAC}/clusterroles/system:basic-user");
    let mut basic = get(&r, &path).await.body;
    basic["metadata"]["annotations"]["rbac.authorization.kubernetes.io/autoupdate"] =
        json!("false");
    basic["rules"] = json!([]);
    assert_eq!(put(&r, &path, &basic).await.status, 200);

    // And a binding is made again with another role.
    let path = format!("{RBAC}/clusterrolebindings/system:basic-user");
    assert_eq!(call(&r, "DELETE", &path, None, None).await.status, 200);
    let moved = json!({"metadata": {"name": "system:basic-user"},
        "roleRef": {"apiGroup": G, "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "User", "apiGroup": G, "name": "erin"}]});
    let resp = post(&r, &format!("{RBAC}/clusterrolebindings"), &moved).await;
    assert_eq!(resp.status, 201, "{}", resp.body);

    // The next start puts the missing rules back, keeps the user's own, and leaves the
    // protected role alone.
    let second = ApiServer::new(config, store).await.unwrap();
    let r2 = second.serve().await.unwrap();
    let discovery = get(&r2, &format!("{RBAC}/clusterroles/system:discovery"))
        .await
        .body;
    let urls: Vec<&Value> = discovery["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["nonResourceURLs"].as_array().unwrap())
        .collect();
    assert!(urls.contains(&&json!("/custom")), "{discovery}");
    assert!(urls.contains(&&json!("/apis/*")), "{discovery}");
    let basic = get(&r2, &format!("{RBAC}/clusterroles/system:basic-user"))
        .await
        .body;
    assert_eq!(basic["rules"], json!([]), "{basic}");
    // The binding is recreated with its role, keeping the subjects it had.
    let b = get(
        &r2,
        &format!("{RBAC}/clusterrolebindings/system:basic-user"),
    )
    .await
    .body;
    assert_eq!(b["roleRef"]["name"], "system:basic-user", "{b}");
    let names: Vec<&str> = b["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["erin", "system:authenticated"]);
    r2.shutdown().await;
    r.shutdown().await;
}

#[tokio::test]
async fn validation_refuses_what_upstream_refuses() {
    let r = start().await;
    assert_eq!(
        post(
            &r,
            "/api/v1/namespaces",
            &json!({"metadata": {"name": "a"}})
        )
        .await
        .status,
        201
    );
    let mut bad = binding("a", "b", "Secret", "x", "alice");
    bad["subjects"][0]["kind"] = json!("Robot");
    let resp = post(&r, &format!("{RBAC}/namespaces/a/rolebindings"), &bad).await;
    assert_eq!(resp.status, 422, "{}", resp.body);
    let msg = resp.body["message"].as_str().unwrap();
    assert!(
        msg.contains(
            r#"roleRef.kind: Unsupported value: "Secret": supported values: "Role", "ClusterRole""#
        ),
        "{msg}"
    );
    assert!(
        msg.contains("subjects[0].kind: Unsupported value: \"Robot\""),
        "{msg}"
    );

    let role = json!({"metadata": {"name": "r"}, "rules": [{"verbs": ["get"], "nonResourceURLs": ["/x"]}]});
    let resp = post(&r, &format!("{RBAC}/namespaces/a/roles"), &role).await;
    assert_eq!(resp.status, 422);
    assert!(resp.body["message"]
        .as_str()
        .unwrap()
        .contains("namespaced rules cannot apply to non-resource URLs"));

    let ok = binding("a", "b", "ClusterRole", "view", "alice");
    let resp = post(&r, &format!("{RBAC}/namespaces/a/rolebindings"), &ok).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let mut changed = resp.body.clone();
    changed["roleRef"]["name"] = json!("edit");
    let resp = put(&r, &format!("{RBAC}/namespaces/a/rolebindings/b"), &changed).await;
    assert_eq!(resp.status, 422);
    assert!(resp.body["message"]
        .as_str()
        .unwrap()
        .contains("cannot change roleRef"));
    r.shutdown().await;
}

#[tokio::test]
async fn bindings_authorize_and_escalation_is_refused() {
    let r = start().await;
    for ns in ["a", "b"] {
        post(&r, "/api/v1/namespaces", &json!({"metadata": {"name": ns}})).await;
    }
    let pods_a = "/api/v1/namespaces/a/pods";
    let resp = as_user(&r, "GET", pods_a, None, "alice").await;
    assert_eq!(resp.status, 403);
    assert_eq!(
        resp.body["message"],
        r#"pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "a""#
    );
    let reader = json!({"metadata": {"name": "pod-reader"},
        "rules": [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}]});
    assert_eq!(
        post(&r, &format!("{RBAC}/namespaces/a/roles"), &reader)
            .await
            .status,
        201
    );
    let rb = binding("a", "read", "Role", "pod-reader", "alice");
    assert_eq!(
        post(&r, &format!("{RBAC}/namespaces/a/rolebindings"), &rb)
            .await
            .status,
        201
    );
    until("alice lists pods in a", async || {
        as_user(&r, "GET", pods_a, None, "alice").await.status == 200
    })
    .await;
    let resp = as_user(&r, "GET", "/api/v1/namespaces/b/pods", None, "alice").await;
    assert_eq!(resp.status, 403);

    // carol administers a (without the aggregation controller, through the roles `admin`
    // and `edit` aggregate): she may bind what she holds there, but not cluster-admin, and
    // may not write a role beyond her own rules.
    let rbs = format!("{RBAC}/namespaces/a/rolebindings");
    for role in ["system:aggregate-to-admin", "system:aggregate-to-edit"] {
        let rb = binding("a", role, "ClusterRole", role, "carol");
        assert_eq!(post(&r, &rbs, &rb).await.status, 201);
    }
    let edit = binding(
        "a",
        "dave",
        "ClusterRole",
        "system:aggregate-to-edit",
        "dave",
    );
    until("carol binds edit", async || {
        as_user(&r, "POST", &rbs, Some(&edit), "carol").await.status == 201
    })
    .await;
    let root = binding("a", "root", "ClusterRole", "cluster-admin", "carol");
    let resp = as_user(&r, "POST", &rbs, Some(&root), "carol").await;
    assert_eq!(resp.status, 403, "{}", resp.body);
    assert_eq!(
        resp.body["message"],
        "rolebindings.rbac.authorization.k8s.io \"root\" is forbidden: user \"carol\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"*\"], Resources:[\"*\"], Verbs:[\"*\"]}\n{NonResourceURLs:[\"*\"], Verbs:[\"*\"]}"
    );
    let nodes = json!({"metadata": {"name": "nodes"},
        "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["nodes"]}]});
    let resp = as_user(
        &r,
        "POST",
        &format!("{RBAC}/namespaces/a/roles"),
        Some(&nodes),
        "carol",
    )
    .await;
    assert_eq!(resp.status, 403, "{}", resp.body);
    assert!(resp.body["message"].as_str().unwrap().ends_with(
        "not currently held:\n{APIGroups:[\"\"], Resources:[\"nodes\"], Verbs:[\"get\"]}"
    ));
    // The same binding by the internal (system:masters) caller is fine.
    assert_eq!(post(&r, &rbs, &root).await.status, 201);
    r.shutdown().await;
}
