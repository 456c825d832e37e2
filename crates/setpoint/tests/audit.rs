//! End to end with the real kubectl: `setpoint up --audit-policy-file … --audit-log-path …`.
//! Every line of the log parses as an `audit.k8s.io/v1` Event (no field the type lacks), and
//! the levels follow the policy: nothing for the `None` rule (RBAC), `Metadata` for Secrets (no
//! bodies), `RequestResponse` for ConfigMaps (both bodies); a watch writes `ResponseStarted`
//! and `ResponseComplete`; the user is kubectl's; the `Audit-Id` header names the event.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

mod support;

use support::{eventually, Setpoint};

/// `audit.k8s.io/v1` `Event`, every field it has and no other.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct Event {
    kind: String,
    api_version: String,
    level: String,
    #[serde(rename = "auditID")]
    audit_id: String,
    stage: String,
    #[serde(rename = "requestURI")]
    request_uri: String,
    verb: String,
    user: UserInfo,
    impersonated_user: Option<UserInfo>,
    #[serde(rename = "sourceIPs", default)]
    source_ips: Vec<String>,
    #[serde(default)]
    user_agent: String,
    object_ref: Option<ObjectRef>,
    response_status: Option<Status>,
    request_object: Option<Value>,
    response_object: Option<Value>,
    request_received_timestamp: String,
    stage_timestamp: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct UserInfo {
    #[serde(default)]
    username: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    extra: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    api_group: String,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    resource_version: String,
    #[serde(default)]
    subresource: String,
}

/// `metav1.Status` as an event carries it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Status {
    metadata: Value,
    #[serde(default)]
    status: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    reason: String,
    details: Option<Value>,
    code: u16,
}

const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: None
  resources:
  - group: rbac.authorization.k8s.io
- level: Metadata
  resources:
  - group: ""
    resources: ["secrets"]
- level: RequestResponse
  resources:
  - group: ""
    resources: ["configmaps"]
- level: Metadata
"#;

fn read_events(path: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| {
            serde_json::from_str::<Event>(l)
                .unwrap_or_else(|e| panic!("not an audit.k8s.io/v1 Event ({e}): {l}"))
        })
        .collect()
}

fn is(e: &Event, resource: &str, name: &str, verb: &str) -> bool {
    e.verb == verb
        && e.user.username == "admin"
        && e.object_ref
            .as_ref()
            .is_some_and(|r| r.resource == resource && r.name == name)
}

#[test]
fn audit_log_follows_the_policy() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let log = dir.path().join("audit").join("audit.log");
    let s = Setpoint::start(
        &[
            "up",
            "--no-node",
            "--audit-policy-file",
            policy.to_str().unwrap(),
            "--audit-log-path",
            log.to_str().unwrap(),
            "--audit-log-maxbackup",
            "2",
        ],
        &dir.path().join("data"),
    );

    s.ok(&["create", "secret", "generic", "s1", "--from-literal=k=v"]);
    s.ok(&["get", "secret", "s1"]);
    s.fails(&["get", "secret", "missing"]);
    s.ok(&["create", "configmap", "c1", "--from-literal=a=b"]);
    s.ok(&["create", "role", "r1", "--verb=get", "--resource=pods"]);
    s.ok(&["get", "roles"]);
    // A watch that the server ends after a second: a long-running request.
    s.ok(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1",
    ]);
    // The `Audit-Id` response header names the request's events.
    let verbose = s.kubectl(&["get", "configmap", "c1", "-o", "json", "-v=8"]);
    let stderr = String::from_utf8_lossy(&verbose.stderr).to_string();
    let audit_id = stderr
        .lines()
        .find_map(|l| l.split("Audit-Id: ").nth(1))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no Audit-Id header in kubectl's trace: {stderr}"));

    // Blocking mode: each request's events are written before it answers.
    let events = read_events(&log);
    assert!(!events.is_empty());
    for e in &events {
        assert_eq!(
            (e.kind.as_str(), e.api_version.as_str()),
            ("Event", "audit.k8s.io/v1")
        );
        assert!(
            ["Metadata", "Request", "RequestResponse"].contains(&e.level.as_str()),
            "{e:?}"
        );
        assert!(
            ["RequestReceived", "ResponseStarted", "ResponseComplete"].contains(&e.stage.as_str()),
            "{e:?}"
        );
        assert!(!e.audit_id.is_empty());
        // RFC 3339 with microseconds.
        assert_eq!(
            e.stage_timestamp.len(),
            "2026-01-01T00:00:00.000000Z".len(),
            "{e:?}"
        );
        assert!(e.request_received_timestamp <= e.stage_timestamp, "{e:?}");
        // The None rule: nothing about RBAC objects.
        let group = e.object_ref.as_ref().map_or("", |r| r.api_group.as_str());
        assert_ne!(group, "rbac.authorization.k8s.io", "{e:?}");
        if e.stage == "ResponseComplete" {
            assert!(e.response_status.is_some(), "{e:?}");
        }
    }
    let find = |resource: &str, name: &str, verb: &str, stage: &str| -> &Event {
        events
            .iter()
            .find(|e| is(e, resource, name, verb) && e.stage == stage)
            .unwrap_or_else(|| {
                let seen: Vec<String> = events
                    .iter()
                    .filter(|e| {
                        e.object_ref
                            .as_ref()
                            .is_some_and(|r| r.resource == resource)
                    })
                    .map(|e| format!("{e:?}"))
                    .collect();
                panic!("no {stage} event of {verb} {resource}/{name} among {seen:#?}")
            })
    };

    // Secrets: Metadata, no bodies.
    let created = find("secrets", "", "create", "ResponseComplete");
    assert_eq!(created.level, "Metadata");
    assert!(created.request_object.is_none() && created.response_object.is_none());
    assert_eq!(created.response_status.as_ref().unwrap().code, 201);
    let received = find("secrets", "", "create", "RequestReceived");
    assert_eq!(received.audit_id, created.audit_id);
    assert!(received.response_status.is_none());
    let got = find("secrets", "s1", "get", "ResponseComplete");
    assert_eq!(got.level, "Metadata");
    assert!(got.request_object.is_none() && got.response_object.is_none());
    assert!(
        got.user.groups.contains(&"system:masters".to_string()),
        "{got:?}"
    );
    assert!(got.source_ips.contains(&"127.0.0.1".to_string()), "{got:?}");
    assert!(got.user_agent.starts_with("kubectl"), "{got:?}");
    assert_eq!(got.request_uri, "/api/v1/namespaces/default/secrets/s1");
    let r = got.object_ref.as_ref().unwrap();
    assert_eq!(
        (
            r.namespace.as_str(),
            r.api_version.as_str(),
            r.api_group.as_str()
        ),
        ("default", "v1", "")
    );
    assert_eq!(got.annotations["authorization.k8s.io/decision"], "allow");
    let missing = find("secrets", "missing", "get", "ResponseComplete");
    let status = missing.response_status.as_ref().unwrap();
    assert_eq!(
        (status.code, status.status.as_str(), status.reason.as_str()),
        (404, "Failure", "NotFound")
    );
    assert_eq!(status.message, "secrets \"missing\" not found");

    // ConfigMaps: RequestResponse, both bodies.
    let cm = find("configmaps", "c1", "create", "ResponseComplete");
    assert_eq!(cm.level, "RequestResponse");
    let sent = cm.request_object.as_ref().expect("requestObject");
    assert_eq!(sent["data"]["a"], "b");
    let stored = cm.response_object.as_ref().expect("responseObject");
    assert_eq!(stored["kind"], "ConfigMap");
    assert_eq!(stored["metadata"]["name"], "c1");
    assert!(stored["metadata"]["uid"].is_string());
    let get = find("configmaps", "c1", "get", "ResponseComplete");
    assert_eq!(get.audit_id, audit_id);
    assert!(get.request_object.is_none(), "a GET has no body: {get:?}");
    assert_eq!(get.response_object.as_ref().unwrap()["data"]["a"], "b");

    // The watch: started, then complete, one id; no bodies of a stream.
    let started = find("configmaps", "", "watch", "ResponseStarted");
    let ended = events
        .iter()
        .find(|e| e.audit_id == started.audit_id && e.stage == "ResponseComplete")
        .expect("the watch's ResponseComplete");
    assert_eq!(ended.response_status.as_ref().unwrap().code, 200);
    assert!(ended.response_object.is_none());

    // The metrics count the events.
    let metrics = eventually("audit metrics", Duration::from_secs(10), || {
        let m = s.ok(&["get", "--raw", "/metrics"]);
        m.contains("apiserver_audit_event_total").then_some(m)
    });
    let count: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("apiserver_audit_event_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("apiserver_audit_event_total");
    assert!(count >= events.len() as f64, "{count} < {}", events.len());
    assert!(metrics.contains("apiserver_audit_level_total{level=\"None\"}"));
    s.stop();
}
