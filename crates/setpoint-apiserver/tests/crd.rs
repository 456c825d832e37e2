//! Custom resources through the HTTP API: establishing, defaults on read, watch and list of a
//! resource defined at run time, and a CRD name conflict.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::server::Running;

/// How long the server may take to act on a CRD change.
const WITHIN: Duration = Duration::from_secs(10);

const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

fn crd(schema: Value) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "gadgets", "kind": "Gadget"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": schema}}]}
    })
}

async fn established(r: &Running) {
    setpoint_testing::eventually_within(WITHIN, "the CRD to be established", || async {
        let c = get(r, &format!("{CRDS}/gadgets.example.com")).await;
        c.body["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
            })
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn defaults_added_later_show_on_read() {
    let r = start().await;
    let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
        "properties": {"size": {"type": "integer"}}}}});
    assert_eq!(post(&r, CRDS, &crd(schema)).await.status, 201);
    established(&r).await;
    let path = "/apis/example.com/v1/namespaces/default/gadgets";
    let created = post(
        &r,
        path,
        &json!({"apiVersion": "example.com/v1", "kind": "Gadget",
        "metadata": {"name": "g"}, "spec": {"size": 1}}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert!(created.body["spec"].get("color").is_none());

    // The schema gains a default: existing objects show it when read.
    let mut current = get(&r, &format!("{CRDS}/gadgets.example.com")).await.body;
    current["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"]["color"] = json!({"type": "string", "default": "blue"});
    let updated = put(&r, &format!("{CRDS}/gadgets.example.com"), &current).await;
    assert_eq!(updated.status, 200, "{}", updated.body);
    setpoint_testing::eventually_within(WITHIN, "the default on read", || async {
        let g = get(&r, &format!("{path}/g")).await;
        (g.body["spec"]["color"] == "blue").then_some(())
    })
    .await;
    let list = get(&r, path).await;
    assert_eq!(list.body["items"][0]["spec"]["color"], "blue");
}

#[tokio::test]
async fn a_crd_whose_kind_is_taken_is_not_accepted() {
    let r = start().await;
    assert_eq!(
        post(&r, CRDS, &crd(json!({"type": "object"}))).await.status,
        201
    );
    established(&r).await;
    // Another plural for the same kind in the same group version.
    let mut clash = crd(json!({"type": "object"}));
    clash["metadata"]["name"] = json!("doohickeys.example.com");
    clash["spec"]["names"]["plural"] = json!("doohickeys");
    assert_eq!(post(&r, CRDS, &clash).await.status, 201);
    let n = setpoint_testing::eventually_within(WITHIN, "a NamesAccepted condition", || async {
        let c = get(&r, &format!("{CRDS}/doohickeys.example.com")).await;
        c.body["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "NamesAccepted").cloned())
    })
    .await;
    assert_eq!(n["status"], "False", "{n}");
    assert_eq!(n["reason"], "NameConflict");
    // Not served; the first one still is.
    assert_eq!(
        get(&r, "/apis/example.com/v1/namespaces/default/doohickeys")
            .await
            .status,
        404
    );
    assert_eq!(
        get(&r, "/apis/example.com/v1/namespaces/default/gadgets")
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn invalid_crds_are_rejected() {
    let r = start().await;
    let mut bad = crd(json!({"type": "object"}));
    bad["metadata"]["name"] = json!("wrong.example.com");
    bad["spec"]["scope"] = json!("Everywhere");
    let resp = post(&r, CRDS, &bad).await;
    assert_eq!(resp.status, 422, "{}", resp.body);
    let causes: Vec<&str> = resp.body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect();
    assert!(
        causes.contains(&"metadata.name") && causes.contains(&"spec.scope"),
        "{causes:?}"
    );
}
