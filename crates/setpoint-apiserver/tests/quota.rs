//! ResourceQuota and LimitRange admission against the in-process server (no controllers, so
//! the tests set a quota's status themselves): concurrent creates are each charged exactly
//! once, refusals carry upstream's messages, and LimitRange defaults and bounds apply.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

fn pod(name: &str, resources: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": resources}]}})
}

async fn namespace(r: &setpoint_apiserver::server::Running, name: &str) {
    let resp = post(
        r,
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
}

/// Sets a quota's status as the controller would.
async fn set_status(r: &setpoint_apiserver::server::Running, ns: &str, status: Value) {
    set_status_of(r, ns, "q", status).await
}

/// Sets the status of the quota `name`.
async fn set_status_of(
    r: &setpoint_apiserver::server::Running,
    ns: &str,
    name: &str,
    status: Value,
) {
    let path = format!("/api/v1/namespaces/{ns}/resourcequotas/{name}");
    let mut q = get(r, &path).await.body;
    q["status"] = status;
    let resp = put(r, &format!("{path}/status"), &q).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
}

/// Retries `f` until it returns `Some` (the watch cache admission reads from may be a
/// moment behind a write), within a deadline.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within 5s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn concurrent_creates_are_charged_exactly_once() {
    let r = start().await;
    namespace(&r, "qa").await;
    let quota = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"},
        "spec": {"hard": {"pods": "3", "count/configmaps": "5"}}});
    let resp = post(&r, "/api/v1/namespaces/qa/resourcequotas", &quota).await;
    assert_eq!(resp.status, 201, "{}", resp.body);

    // Enforced limits are the status's: usage known for pods only refuses a ConfigMap.
    set_status(
        &r,
        "qa",
        json!({"hard": {"pods": "3", "count/configmaps": "5"}, "used": {"pods": "0"}}),
    )
    .await;
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
    let refused = eventually("the quota's status is seen", || async {
        let resp = post(&r, "/api/v1/namespaces/qa/configmaps?dryRun=All", &cm).await;
        (resp.status == 403).then_some(resp)
    })
    .await;
    assert_eq!(refused.body["reason"], "Forbidden");
    assert_eq!(
        refused.body["message"],
        r#"configmaps "c" is forbidden: status unknown for quota: q, resources: count/configmaps"#
    );

    set_status(
        &r,
        "qa",
        json!({"hard": {"pods": "3", "count/configmaps": "5"},
               "used": {"pods": "0", "count/configmaps": "0"}}),
    )
    .await;
    // Ten creates at once: exactly three fit.
    let creates = (0..10).map(|i| {
        let r = &r;
        async move {
            post(
                r,
                "/api/v1/namespaces/qa/pods",
                &pod(&format!("p{i}"), json!({})),
            )
            .await
        }
    });
    let results = futures::future::join_all(creates).await;
    let created = results.iter().filter(|r| r.status == 201).count();
    let refused: Vec<&Resp> = results.iter().filter(|r| r.status == 403).collect();
    assert_eq!(
        created,
        3,
        "{:?}",
        results.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    assert_eq!(refused.len(), 7);
    let msg = refused[0].body["message"].as_str().unwrap();
    assert!(
        msg.ends_with(
            "is forbidden: exceeded quota: q, requested: pods=1, used: pods=3, limited: pods=3"
        ),
        "{msg}"
    );
    let q = get(&r, "/api/v1/namespaces/qa/resourcequotas/q").await.body;
    assert_eq!(q["status"]["used"]["pods"], "3");
    // A dry run is checked but not charged.
    let resp = post(
        &r,
        "/api/v1/namespaces/qa/configmaps?dryRun=All",
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d"}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let q = get(&r, "/api/v1/namespaces/qa/resourcequotas/q").await.body;
    assert_eq!(q["status"]["used"]["count/configmaps"], "0");
}

#[tokio::test]
async fn compute_quotas_require_amounts_and_scopes_select_pods() {
    let r = start().await;
    namespace(&r, "cq").await;
    let quota = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"},
        "spec": {"hard": {"requests.cpu": "1"}, "scopes": ["NotBestEffort"]}});
    assert_eq!(
        post(&r, "/api/v1/namespaces/cq/resourcequotas", &quota)
            .await
            .status,
        201
    );
    set_status(
        &r,
        "cq",
        json!({"hard": {"requests.cpu": "1"}, "used": {"requests.cpu": "0"}}),
    )
    .await;
    // A BestEffort pod is outside the scope.
    let free = eventually("the quota's status is seen", || async {
        let resp = post(
            &r,
            "/api/v1/namespaces/cq/pods?dryRun=All",
            &pod("limited", json!({"limits": {"memory": "64Mi"}})),
        )
        .await;
        (resp.status == 403).then_some(resp)
    })
    .await;
    assert_eq!(
        free.body["message"],
        r#"pods "limited" is forbidden: failed quota: q: must specify requests.cpu for: c"#
    );
    let resp = post(&r, "/api/v1/namespaces/cq/pods", &pod("free", json!({}))).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let resp = post(
        &r,
        "/api/v1/namespaces/cq/pods",
        &pod("a", json!({"requests": {"cpu": "600m"}})),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let resp = post(
        &r,
        "/api/v1/namespaces/cq/pods",
        &pod("b", json!({"requests": {"cpu": "600m"}})),
    )
    .await;
    assert_eq!(resp.status, 403);
    assert_eq!(
        resp.body["message"],
        r#"pods "b" is forbidden: exceeded quota: q, requested: requests.cpu=600m, used: requests.cpu=600m, limited: requests.cpu=1"#
    );
}

#[tokio::test]
async fn limit_ranges_default_and_bound_pods() {
    let r = start().await;
    namespace(&r, "lr").await;
    let lr = json!({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr"},
        "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"},
            "default": {"cpu": "500m", "memory": "128Mi"}, "defaultRequest": {"cpu": "100m"}}]}});
    let resp = post(&r, "/api/v1/namespaces/lr/limitranges", &lr).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    eventually("the LimitRange is seen", || async {
        let resp = post(
            &r,
            "/api/v1/namespaces/lr/pods?dryRun=All",
            &pod("plain", json!({})),
        )
        .await;
        assert_eq!(resp.status, 201, "{}", resp.body);
        resp.body["metadata"]["annotations"]["kubernetes.io/limit-ranger"]
            .is_string()
            .then_some(())
    })
    .await;
    let created = post(&r, "/api/v1/namespaces/lr/pods", &pod("plain", json!({}))).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let created = created.body;
    assert_eq!(
        created["spec"]["containers"][0]["resources"],
        json!({"limits": {"cpu": "500m", "memory": "128Mi"},
               "requests": {"cpu": "100m", "memory": "128Mi"}})
    );
    assert_eq!(
        created["metadata"]["annotations"]["kubernetes.io/limit-ranger"],
        "LimitRanger plugin set: cpu, memory request for container c; cpu, memory limit for container c"
    );
    // Defaults made it Burstable, not BestEffort.
    assert_eq!(created["status"]["qosClass"], "Burstable");
    let resp = post(
        &r,
        "/api/v1/namespaces/lr/pods",
        &pod("big", json!({"limits": {"cpu": "3"}})),
    )
    .await;
    assert_eq!(resp.status, 403, "{}", resp.body);
    assert_eq!(resp.body["reason"], "Forbidden");
    assert_eq!(
        resp.body["message"],
        r#"pods "big" is forbidden: maximum cpu usage per Container is 2, but limit is 3"#
    );
}

#[tokio::test]
async fn a_refusal_by_one_quota_charges_none() {
    let r = start().await;
    namespace(&r, "two").await;
    for (name, hard) in [("a", "10"), ("b", "1")] {
        let quota = json!({"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": name}, "spec": {"hard": {"pods": hard}}});
        let resp = post(&r, "/api/v1/namespaces/two/resourcequotas", &quota).await;
        assert_eq!(resp.status, 201, "{}", resp.body);
    }
    set_status_of(
        &r,
        "two",
        "a",
        json!({"hard": {"pods": "10"}, "used": {"pods": "0"}}),
    )
    .await;
    set_status_of(
        &r,
        "two",
        "b",
        json!({"hard": {"pods": "1"}, "used": {"pods": "1"}}),
    )
    .await;
    let refused = eventually("both quotas are seen", || async {
        let resp = post(
            &r,
            "/api/v1/namespaces/two/pods?dryRun=All",
            &pod("x", json!({})),
        )
        .await;
        (resp.body["message"]
            == r#"pods "x" is forbidden: exceeded quota: b, requested: pods=1, used: pods=1, limited: pods=1"#)
            .then_some(resp)
    })
    .await;
    assert_eq!(refused.status, 403);
    let resp = post(&r, "/api/v1/namespaces/two/pods", &pod("x", json!({}))).await;
    assert_eq!(resp.status, 403, "{}", resp.body);
    let a = get(&r, "/api/v1/namespaces/two/resourcequotas/a")
        .await
        .body;
    assert_eq!(a["status"]["used"]["pods"], "0");
}
