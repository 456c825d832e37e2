//! Pod Security admission against the in-process server: the whole `Status` of a refusal
//! (403 for a pod, 422 for labels), the `Warning` headers of `warn`, workloads' templates
//! warned about but never refused, and pod updates held to `enforce` only when they change
//! what the checks read.

mod common;

use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::server::Running;

async fn namespace(r: &Running, name: &str, labels: Value) -> Resp {
    post(
        r,
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels}}),
    )
    .await
}

fn pod(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

fn warnings(resp: &Resp) -> Vec<String> {
    resp.headers
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

/// A consistent LIST of namespaces returns only once the watch cache (which admission reads
/// namespaces from) holds every write so far.
async fn caught_up(r: &Running) {
    assert_eq!(get(r, "/api/v1/namespaces").await.status, 200);
}

#[tokio::test]
async fn enforce_refuses_with_upstreams_status() {
    let r = start().await;
    let resp = namespace(
        &r,
        "base",
        json!({"pod-security.kubernetes.io/enforce": "baseline",
            "pod-security.kubernetes.io/enforce-version": "v1.30"}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let resp = post(
        &r,
        "/api/v1/namespaces/base/pods",
        &pod(
            "p",
            json!({"hostPID": true, "containers": [
                {"name": "a", "image": "x", "securityContext": {"privileged": true}},
                {"name": "b", "image": "x", "securityContext": {"privileged": true,
                    "capabilities": {"add": ["NET_ADMIN"]}}}
            ]}),
        ),
    )
    .await;
    assert_eq!(resp.status, 403, "{}", resp.body);
    assert_eq!(resp.body["reason"], "Forbidden");
    assert_eq!(
        resp.body["message"],
        r#"pods "p" is forbidden: violates PodSecurity "baseline:v1.30": host namespaces (hostPID=true), privileged (containers "a", "b" must not set securityContext.privileged=true), non-default capabilities (container "b" must not include "NET_ADMIN" in securityContext.capabilities.add)"#
    );
    assert_eq!(resp.body["details"]["name"], "p");
    assert_eq!(resp.body["details"]["kind"], "pods");
    assert!(warnings(&resp).is_empty(), "no warning beside a refusal");
    // Nothing was stored.
    assert_eq!(get(&r, "/api/v1/namespaces/base/pods/p").await.status, 404);

    // Workloads are never refused by enforce: their pods are, when they are created.
    let resp = post(
        &r,
        "/apis/apps/v1/namespaces/base/deployments",
        &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"hostIPC": true, "containers": [{"name": "c", "image": "x"}]}}}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    assert!(warnings(&resp).is_empty());
}

#[tokio::test]
async fn warn_answers_with_warning_headers_for_pods_and_templates() {
    let r = start().await;
    let resp = namespace(
        &r,
        "w",
        json!({"pod-security.kubernetes.io/warn": "restricted"}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let resp = post(
        &r,
        "/api/v1/namespaces/w/pods",
        &pod("p", json!({"containers": [{"name": "c", "image": "x"}]})),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    assert_eq!(
        warnings(&resp),
        vec![
            r#"299 - "would violate PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"c\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"c\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or container \"c\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container \"c\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")""#
        ]
    );

    // A CronJob's template, on create and on update.
    let mut cron = json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj"},
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "image": "x", "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}}}}}});
    let resp = post(&r, "/apis/batch/v1/namespaces/w/cronjobs", &cron).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    assert!(warnings(&resp).is_empty(), "{:?}", warnings(&resp));
    cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        ["runAsUser"] = json!(0);
    let resp = put(&r, "/apis/batch/v1/namespaces/w/cronjobs/cj", &cron).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        warnings(&resp),
        vec![
            r#"299 - "would violate PodSecurity \"restricted:latest\": runAsUser=0 (container \"c\" must not set runAsUser=0)""#
        ]
    );
}

#[tokio::test]
async fn server_side_apply_of_a_template_warns_on_create_and_update() {
    let r = start().await;
    let resp = namespace(
        &r,
        "w",
        json!({"pod-security.kubernetes.io/warn": "baseline"}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let path = "/apis/apps/v1/namespaces/w/deployments/d?fieldManager=test";
    let deployment = |spec: Value| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
                "metadata": {"labels": {"a": "b"}}, "spec": spec}}})
    };
    let fine = deployment(json!({"containers": [{"name": "c", "image": "x"}]}));
    let resp = patch(&r, path, "application/apply-patch+yaml", &fine).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    assert!(warnings(&resp).is_empty(), "{:?}", warnings(&resp));
    let host_ports = deployment(json!({"containers": [{"name": "c", "image": "x",
        "ports": [{"containerPort": 80, "hostPort": 80}]}]}));
    let resp = patch(&r, path, "application/apply-patch+yaml", &host_ports).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        warnings(&resp),
        vec![
            r#"299 - "would violate PodSecurity \"baseline:latest\": hostPort (container \"c\" uses hostPort 80)""#
        ]
    );
}

#[tokio::test]
async fn namespace_labels_are_validated() {
    let r = start().await;
    let resp = namespace(
        &r,
        "bad",
        json!({"pod-security.kubernetes.io/enforce": "strict",
            "pod-security.kubernetes.io/warn-version": "1.30"}),
    )
    .await;
    assert_eq!(resp.status, 422, "{}", resp.body);
    assert_eq!(resp.body["reason"], "Invalid");
    assert_eq!(
        resp.body["message"],
        r#"namespaces "bad" is invalid: [metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "strict": must be one of privileged, baseline, restricted, metadata.labels[pod-security.kubernetes.io/warn-version]: Invalid value: "1.30": must be "latest" or "v1.x"]"#
    );
    assert_eq!(resp.body["details"]["kind"], "namespaces");

    let resp = namespace(&r, "ok", json!({})).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let resp = patch(
        &r,
        "/api/v1/namespaces/ok",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"pod-security.kubernetes.io/audit": "everything"}}}),
    )
    .await;
    assert_eq!(resp.status, 422, "{}", resp.body);
    assert_eq!(
        resp.body["message"],
        r#"namespaces "ok" is invalid: metadata.labels[pod-security.kubernetes.io/audit]: Invalid value: "everything": must be one of privileged, baseline, restricted"#
    );
    let resp = patch(
        &r,
        "/api/v1/namespaces/ok",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"pod-security.kubernetes.io/audit": "restricted",
            "pod-security.kubernetes.io/audit-version": "v1.32"}}}),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
}

#[tokio::test]
async fn pod_updates_are_enforced_only_when_what_the_checks_read_changes() {
    let r = start().await;
    assert_eq!(namespace(&r, "late", json!({})).await.status, 201);
    let resp = post(
        &r,
        "/api/v1/namespaces/late/pods",
        &pod(
            "p",
            json!({"hostNetwork": true, "containers": [{"name": "c", "image": "x:1"}]}),
        ),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    // A consistent LIST: the pod cache the namespace update reads holds the pod.
    assert_eq!(get(&r, "/api/v1/namespaces/late/pods").await.status, 200);
    let resp = patch(
        &r,
        "/api/v1/namespaces/late",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    // The namespace's new enforce level is checked against the pods already there.
    assert_eq!(
        warnings(&resp),
        vec![
            r#"299 - "existing pods in namespace \"late\" violate the new PodSecurity enforce level \"baseline:latest\"""#,
            r#"299 - "p: host namespaces""#,
        ]
    );
    caught_up(&r).await;
    // Relaxing it checks nothing.
    let resp = patch(
        &r,
        "/api/v1/namespaces/late",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"team": "x"}}}),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert!(warnings(&resp).is_empty(), "{:?}", warnings(&resp));

    // A label change is not re-checked...
    let resp = patch(
        &r,
        "/api/v1/namespaces/late/pods/p",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    // ...a new image is, and the pod that predates the label is refused it.
    let resp = patch(
        &r,
        "/api/v1/namespaces/late/pods/p",
        "application/strategic-merge-patch+json",
        &json!({"spec": {"containers": [{"name": "c", "image": "x:2"}]}}),
    )
    .await;
    assert_eq!(resp.status, 403, "{}", resp.body);
    assert_eq!(
        resp.body["message"],
        r#"pods "p" is forbidden: violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true)"#
    );
}
