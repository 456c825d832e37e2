//! `pods/eviction` against the in-process server (no controllers, so the tests set budgets'
//! status as the disruption controller would): concurrent evictions use a budget's allowed
//! disruptions by a compare-and-swap, so exactly that many pass; the refused ones get 429
//! with upstream's Status, and pods no budget guards or that are Pending go at once.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const NS: &str = "/api/v1/namespaces/default";
const PDBS: &str = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";

/// A pod labelled `app`, Running and Ready unless `phase` is `Pending`.
async fn pod(r: &setpoint_apiserver::server::Running, name: &str, app: &str, phase: &str) {
    let resp = post(
        r,
        &format!("{NS}/pods"),
        &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": app}},
                "spec": {"automountServiceAccountToken": false,
                         "containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let mut p = resp.body;
    let ready = if phase == "Running" { "True" } else { "False" };
    p["status"] = json!({"phase": phase, "conditions": [{"type": "Ready", "status": ready}]});
    let resp = put(r, &format!("{NS}/pods/{name}/status"), &p).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
}

/// A budget over `app=web` whose status allows `allowed` disruptions, once the watch cache
/// (which eviction reads budgets from) has it.
async fn budget(r: &setpoint_apiserver::server::Running, name: &str, allowed: i64) {
    let resp = post(
        r,
        PDBS,
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name},
                "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "web"}}}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let mut b = resp.body;
    b["status"] = json!({"observedGeneration": 1, "currentHealthy": 3 + allowed,
        "desiredHealthy": 3, "expectedPods": 3 + allowed, "disruptionsAllowed": allowed});
    let resp = put(r, &format!("{PDBS}/{name}/status"), &b).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    setpoint_testing::eventually_within(Duration::from_secs(10), "the budget cached", || async {
        let list = get(r, &format!("{PDBS}?resourceVersion=0")).await.body;
        list["items"]
            .as_array()
            .is_some_and(|items| {
                items.iter().any(|b| {
                    b["metadata"]["name"] == name && b["status"]["disruptionsAllowed"] == allowed
                })
            })
            .then_some(())
    })
    .await;
}

fn eviction(name: &str) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}})
}

#[tokio::test]
async fn concurrent_evictions_use_the_budget_exactly() {
    let r = start().await;
    let names: Vec<String> = (0..5).map(|i| format!("web-{i}")).collect();
    for n in &names {
        pod(&r, n, "web", "Running").await;
    }
    budget(&r, "web", 2).await;

    let answers = futures::future::join_all(names.iter().map(|n| {
        let (r, path, body) = (&r, format!("{NS}/pods/{n}/eviction"), eviction(n));
        async move { post(r, &path, &body).await }
    }))
    .await;
    let mut evicted = Vec::new();
    for (n, a) in names.iter().zip(&answers) {
        match a.status {
            201 => {
                assert_eq!(a.body["status"], "Success", "{}", a.body);
                evicted.push(n.clone());
            }
            429 => {
                assert_eq!(a.body["reason"], "TooManyRequests", "{}", a.body);
                assert_eq!(
                    a.body["message"],
                    "Cannot evict pod as it would violate the pod's disruption budget."
                );
                assert_eq!(
                    a.body["details"]["causes"][0]["reason"], "DisruptionBudget",
                    "{}",
                    a.body
                );
                assert_eq!(
                    a.body["details"]["causes"][0]["message"],
                    "The disruption budget web needs 3 healthy pods and has 5 currently"
                );
            }
            other => panic!("{n}: {other} {}", a.body),
        }
    }
    assert_eq!(evicted.len(), 2, "exactly the allowed disruptions pass");
    let b = get(&r, &format!("{PDBS}/web")).await.body;
    assert_eq!(b["status"]["disruptionsAllowed"], 0, "{b}");
    let mut recorded: Vec<String> = b["status"]["disruptedPods"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    recorded.sort();
    evicted.sort();
    assert_eq!(recorded, evicted);
    let cond = &b["status"]["conditions"][0];
    assert_eq!(
        (&cond["type"], &cond["status"], &cond["reason"]),
        (
            &json!("DisruptionAllowed"),
            &json!("False"),
            &json!("InsufficientPods")
        )
    );
    for n in &evicted {
        assert_eq!(get(&r, &format!("{NS}/pods/{n}")).await.status, 404, "{n}");
    }
}

#[tokio::test]
async fn unguarded_pending_and_mismatched_evictions() {
    let r = start().await;
    pod(&r, "lone", "other", "Running").await;
    pod(&r, "starting", "web", "Pending").await;
    pod(&r, "guarded", "web", "Running").await;
    budget(&r, "web", 0).await;
    // No budget selects it: deleted.
    let a = post(&r, &format!("{NS}/pods/lone/eviction"), &eviction("lone")).await;
    assert_eq!(a.status, 201, "{}", a.body);
    // Pending pods were never available: deleted whatever the budget says.
    let a = post(
        &r,
        &format!("{NS}/pods/starting/eviction"),
        &eviction("starting"),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let a = post(
        &r,
        &format!("{NS}/pods/guarded/eviction"),
        &eviction("guarded"),
    )
    .await;
    assert_eq!(a.status, 429, "{}", a.body);
    // The body must name the pod of the URL.
    let a = post(
        &r,
        &format!("{NS}/pods/guarded/eviction"),
        &eviction("lone"),
    )
    .await;
    assert_eq!(
        (a.status, a.body["message"].as_str()),
        (
            400,
            Some("name in URL does not match name in Eviction object")
        )
    );
    // Two budgets over one pod.
    budget(&r, "web-2", 1).await;
    let a = post(
        &r,
        &format!("{NS}/pods/guarded/eviction"),
        &eviction("guarded"),
    )
    .await;
    assert_eq!(a.status, 500, "{}", a.body);
    assert_eq!(
        a.body["message"],
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    );
    assert_eq!(get(&r, &format!("{NS}/pods/guarded")).await.status, 200);
}

#[tokio::test]
async fn an_evicted_pod_gets_the_disruption_target_condition_before_it_goes() {
    let r = start().await;
    // Bound to a node, so the delete is graceful and the pod can still be read.
    let resp = post(
        &r,
        &format!("{NS}/pods"),
        &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "bound", "labels": {"app": "other"}},
                "spec": {"automountServiceAccountToken": false, "nodeName": "n1",
                         "containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let rv = resp.body["metadata"]["resourceVersion"].clone();
    // The caller's resourceVersion precondition holds against the pod as read, though the
    // condition's write moves the version before the delete.
    let mut ev = eviction("bound");
    ev["deleteOptions"] = json!({"preconditions": {"resourceVersion": rv}});
    let a = post(&r, &format!("{NS}/pods/bound/eviction"), &ev).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let p = get(&r, &format!("{NS}/pods/bound")).await.body;
    assert!(p["metadata"]["deletionTimestamp"].is_string(), "{p}");
    let c = p["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "DisruptionTarget"))
        .cloned()
        .unwrap_or_else(|| panic!("no DisruptionTarget in {p}"));
    assert_eq!(
        (&c["status"], &c["reason"], &c["message"]),
        (
            &json!("True"),
            &json!("EvictionByEvictionAPI"),
            &json!("Eviction API: evicting")
        )
    );
    // A stale precondition is a conflict, and the pod is left alone.
    let resp = post(
        &r,
        &format!("{NS}/pods"),
        &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "stale", "labels": {"app": "other"}},
                "spec": {"automountServiceAccountToken": false, "nodeName": "n1",
                         "containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let mut ev = eviction("stale");
    ev["deleteOptions"] = json!({"preconditions": {"resourceVersion": "1"}});
    let a = post(&r, &format!("{NS}/pods/stale/eviction"), &ev).await;
    assert_eq!(a.status, 409, "{}", a.body);
    let p = get(&r, &format!("{NS}/pods/stale")).await.body;
    assert!(p["metadata"]["deletionTimestamp"].is_null(), "{p}");
}
