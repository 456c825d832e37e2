//! A node agent keeps the ConfigMaps and Secrets its pods use in per-object watches: a LIST
//! and WATCH narrowed by `fieldSelector=metadata.name=<name>`. The Node authorizer lets a node
//! do that for an object one of its pods refers to, and for nothing else, as upstream's
//! request info carries the selected name to the authorizer.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::server::Running;

const NODE_HEADERS: [(&str, &str); 2] = [
    ("Impersonate-User", "system:node:n1"),
    ("Impersonate-Group", "system:nodes"),
];

async fn as_node(r: &Running, path: &str) -> Resp {
    call_with(r, "GET", path, None, None, &NODE_HEADERS).await
}

fn message(resp: &Resp) -> &str {
    resp.body["message"].as_str().unwrap_or_default()
}

async fn create(r: &Running, path: &str, v: &Value) {
    let resp = post(r, path, v).await;
    assert_eq!(resp.status, 201, "{:?}", resp.body);
}

#[tokio::test]
async fn a_node_watches_one_referenced_config_map_and_nothing_else() {
    let r = start().await;
    let cms = "/api/v1/namespaces/default/configmaps";
    for name in ["used", "unused"] {
        create(
            &r,
            cms,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "1"}}),
        )
        .await;
    }
    create(
        &r,
        "/api/v1/namespaces/default/pods",
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "image": "busybox",
                "envFrom": [{"configMapRef": {"name": "used"}}]}]
        }}),
    )
    .await;

    // The authorizer reads the pod from the watch cache, which follows the write by a moment.
    let list_used = format!("{cms}?fieldSelector=metadata.name%3Dused");
    let (router, url) = (&r, &list_used);
    let listed = setpoint_testing::eventually_within(
        Duration::from_secs(10),
        "the node allowed to list the ConfigMap its pod uses",
        || async move {
            let resp = as_node(router, url).await;
            (resp.status == 200).then_some(resp)
        },
    )
    .await;
    let items = listed.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["metadata"]["name"], "used");
    let rv = listed.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    // The watch from the list's revision sees the change of the one object it names.
    let (status, mut watch) = WatchStream::open_with(
        &r,
        &format!("{list_used}&watch=true&resourceVersion={rv}"),
        &NODE_HEADERS,
    )
    .await;
    assert_eq!(status, 200);
    let resp = put(
        &r,
        &format!("{cms}/unused"),
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unused"}, "data": {"k": "2"}}),
    )
    .await;
    assert_eq!(resp.status, 200);
    let resp = put(
        &r,
        &format!("{cms}/used"),
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "used"}, "data": {"k": "2"}}),
    )
    .await;
    assert_eq!(resp.status, 200);
    let event = watch.next().await.expect("an event");
    assert_eq!(event["type"], "MODIFIED");
    assert_eq!(event["object"]["metadata"]["name"], "used");
    assert_eq!(event["object"]["data"]["k"], "2");

    // Neither an unreferenced object nor the whole collection.
    let resp = as_node(
        &r,
        &format!("{cms}?watch=true&fieldSelector=metadata.name%3Dunused"),
    )
    .await;
    assert_eq!(resp.status, 403);
    assert_eq!(
        message(&resp),
        "configmaps \"unused\" is forbidden: User \"system:node:n1\" cannot watch resource \"configmaps\" in API group \"\" in the namespace \"default\": no relationship found between node 'n1' and this object"
    );
    let resp = as_node(&r, &format!("{cms}?watch=true")).await;
    assert_eq!(resp.status, 403);
    assert!(
        message(&resp).ends_with(": No Object name found"),
        "{}",
        message(&resp)
    );
    // A selector that does not pin the name names nothing.
    let resp = as_node(&r, &format!("{cms}?fieldSelector=metadata.name!%3Dunused")).await;
    assert_eq!(resp.status, 403);
    // The same name in another namespace is another object.
    let resp = as_node(
        &r,
        "/api/v1/namespaces/kube-system/configmaps?fieldSelector=metadata.name%3Dused",
    )
    .await;
    assert_eq!(resp.status, 403);
}
