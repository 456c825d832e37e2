//! `fieldValidation` and keys repeated in request bodies: `Strict` answers 400, `Warn` (the
//! default) adds a `Warning` header, `Ignore` keeps the last value silently, for creates, updates
//! and merge, strategic and apply patches, in JSON and YAML.

mod common;

use common::*;
use serde_json::json;
use setpoint_apiserver::server::Running;

const DEPLOYS: &str = "/apis/apps/v1/namespaces/dup/deployments";
const WARNING: &str = r#"299 - "duplicate field \"spec.replicas\"""#;

/// A Deployment body with `spec.replicas` given twice (first 1, then `replicas`).
fn deployment_json(name: &str, replicas: i64) -> Vec<u8> {
    format!(
        r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"{name}"}},
        "spec":{{"replicas":1,"selector":{{"matchLabels":{{"app":"web"}}}},
        "template":{{"metadata":{{"labels":{{"app":"web"}}}},
        "spec":{{"containers":[{{"name":"c","image":"nginx"}}]}}}},"replicas":{replicas}}}}}"#
    )
    .into_bytes()
}

fn deployment_yaml(name: &str, replicas: i64) -> Vec<u8> {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: 1\n  \
         selector:\n    matchLabels: {{app: web}}\n  template:\n    metadata:\n      labels: {{app: web}}\n    \
         spec:\n      containers:\n      - name: c\n        image: nginx\n  replicas: {replicas}\n"
    )
    .into_bytes()
}

async fn setup() -> Running {
    let r = start().await;
    let resp = post(
        &r,
        "/api/v1/namespaces",
        &json!({"metadata": {"name": "dup"}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    r
}

fn warnings(resp: &Resp) -> Vec<String> {
    resp.headers
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

fn assert_strict_rejects(resp: &Resp) {
    assert_eq!(resp.status, 400, "{}", resp.body);
    let msg = resp.body["message"].as_str().unwrap();
    assert!(msg.contains(r#"duplicate field "spec.replicas""#), "{msg}");
    assert!(msg.contains("strict decoding error"), "{msg}");
}

fn assert_warns(resp: &Resp, code: u16) {
    assert_eq!(resp.status, code, "{}", resp.body);
    assert_eq!(warnings(resp), vec![WARNING.to_string()]);
}

#[tokio::test]
async fn create_and_update_with_duplicate_fields() {
    let r = setup().await;
    let json_ct = Some("application/json");
    let yaml_ct = Some("application/yaml");

    // Strict: JSON and YAML creates are refused, nothing is stored.
    let resp = call(
        &r,
        "POST",
        &format!("{DEPLOYS}?fieldValidation=Strict"),
        json_ct,
        Some(deployment_json("a", 3)),
    )
    .await;
    assert_strict_rejects(&resp);
    let resp = call(
        &r,
        "POST",
        &format!("{DEPLOYS}?fieldValidation=Strict"),
        yaml_ct,
        Some(deployment_yaml("a", 3)),
    )
    .await;
    assert_strict_rejects(&resp);
    assert_eq!(get(&r, &format!("{DEPLOYS}/a")).await.status, 404);

    // Warn (explicit and the default): created with the last value and a warning.
    let resp = call(
        &r,
        "POST",
        &format!("{DEPLOYS}?fieldValidation=Warn"),
        json_ct,
        Some(deployment_json("a", 3)),
    )
    .await;
    assert_warns(&resp, 201);
    assert_eq!(resp.body["spec"]["replicas"], 3);
    let resp = call(&r, "POST", DEPLOYS, yaml_ct, Some(deployment_yaml("b", 4))).await;
    assert_warns(&resp, 201);
    assert_eq!(resp.body["spec"]["replicas"], 4);

    // Ignore: no warning, last value wins (also for YAML).
    let resp = call(
        &r,
        "POST",
        &format!("{DEPLOYS}?fieldValidation=Ignore"),
        yaml_ct,
        Some(deployment_yaml("c", 5)),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    assert!(warnings(&resp).is_empty());
    assert_eq!(resp.body["spec"]["replicas"], 5);

    // Updates.
    let resp = call(
        &r,
        "PUT",
        &format!("{DEPLOYS}/a?fieldValidation=Strict"),
        json_ct,
        Some(deployment_json("a", 6)),
    )
    .await;
    assert_strict_rejects(&resp);
    let resp = call(
        &r,
        "PUT",
        &format!("{DEPLOYS}/a"),
        json_ct,
        Some(deployment_json("a", 6)),
    )
    .await;
    assert_warns(&resp, 200);
    assert_eq!(resp.body["spec"]["replicas"], 6);

    // A clean body draws no warning.
    let resp = put(
        &r,
        &format!("{DEPLOYS}/a?fieldValidation=Strict"),
        &resp.body,
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert!(warnings(&resp).is_empty());
}

#[tokio::test]
async fn patches_with_duplicate_fields() {
    let r = setup().await;
    let resp = call(
        &r,
        "POST",
        DEPLOYS,
        Some("application/json"),
        Some(deployment_json("p", 2)),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let path = format!("{DEPLOYS}/p");
    let body = br#"{"spec":{"replicas":7,"replicas":8}}"#.to_vec();
    for ct in [
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
    ] {
        let resp = call(
            &r,
            "PATCH",
            &format!("{path}?fieldValidation=Strict"),
            Some(ct),
            Some(body.clone()),
        )
        .await;
        assert_strict_rejects(&resp);
        let resp = call(
            &r,
            "PATCH",
            &format!("{path}?fieldValidation=Warn"),
            Some(ct),
            Some(body.clone()),
        )
        .await;
        assert_warns(&resp, 200);
        assert_eq!(resp.body["spec"]["replicas"], 8);
        let resp = call(
            &r,
            "PATCH",
            &format!("{path}?fieldValidation=Ignore"),
            Some(ct),
            Some(body.clone()),
        )
        .await;
        assert_eq!(resp.status, 200, "{}", resp.body);
        assert!(warnings(&resp).is_empty());
    }

    // Server-side apply, YAML and JSON bodies.
    let apply = "application/apply-patch+yaml";
    let q = "fieldManager=test";
    let resp = call(
        &r,
        "PATCH",
        &format!("{DEPLOYS}/s?{q}&fieldValidation=Strict"),
        Some(apply),
        Some(deployment_yaml("s", 3)),
    )
    .await;
    assert_strict_rejects(&resp);
    let resp = call(
        &r,
        "PATCH",
        &format!("{DEPLOYS}/s?{q}&fieldValidation=Strict"),
        Some(apply),
        Some(deployment_json("s", 3)),
    )
    .await;
    assert_strict_rejects(&resp);
    let resp = call(
        &r,
        "PATCH",
        &format!("{DEPLOYS}/s?{q}"),
        Some(apply),
        Some(deployment_yaml("s", 3)),
    )
    .await;
    assert_warns(&resp, 201);
    assert_eq!(resp.body["spec"]["replicas"], 3);
    let resp = call(
        &r,
        "PATCH",
        &format!("{DEPLOYS}/s?{q}&fieldValidation=Ignore"),
        Some(apply),
        Some(deployment_yaml("s", 4)),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert!(warnings(&resp).is_empty());
    assert_eq!(resp.body["spec"]["replicas"], 4);
}

#[tokio::test]
async fn nested_duplicates_name_their_path() {
    let r = setup().await;
    let body = br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},
        "spec":{"containers":[{"name":"a","image":"x"},{"name":"b","image":"y","image":"z"}]}}"#;
    let resp = call(
        &r,
        "POST",
        "/api/v1/namespaces/dup/pods?fieldValidation=Strict",
        Some("application/json"),
        Some(body.to_vec()),
    )
    .await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    let msg = resp.body["message"].as_str().unwrap();
    assert!(
        msg.contains(r#"duplicate field "spec.containers[1].image""#),
        "{msg}"
    );
}
