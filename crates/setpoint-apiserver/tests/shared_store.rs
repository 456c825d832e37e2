//! Two API servers on one store, as several servers share etcd: a write through one is never
//! missed by the next update through the other.

mod common;

use common::*;
use serde_json::json;
use setpoint_apiserver::server::Running;
use setpoint_apiserver::ApiServer;

async fn two_servers() -> (Running, Running) {
    let config = memory_config;
    let store = ApiServer::open_store(&config()).await.unwrap();
    let a = ApiServer::new(config(), store.clone()).await.unwrap();
    let b = ApiServer::new(config(), store).await.unwrap();
    (a.serve().await.unwrap(), b.serve().await.unwrap())
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test]
async fn an_update_sees_what_another_server_wrote_since() {
    let (a, b) = two_servers().await;
    let created = post(
        &a,
        CMS,
        &json!({"metadata": {"name": "cfg"}, "data": {"from": "a"}}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let rv1 = created.body["metadata"]["resourceVersion"].clone();

    // B replaces it; A last wrote (and remembers) the first version.
    let mut replaced = created.body.clone();
    replaced["data"] = json!({"from": "b"});
    let r = put(&b, &format!("{CMS}/cfg"), &replaced).await;
    assert_eq!(r.status, 200, "{}", r.body);

    // A patch through A applies to B's version.
    let p = patch(
        &a,
        &format!("{CMS}/cfg"),
        "application/merge-patch+json",
        &json!({"data": {"also": "a"}}),
    )
    .await;
    assert_eq!(p.status, 200, "{}", p.body);
    assert_eq!(p.body["data"], json!({"from": "b", "also": "a"}));

    // A replace through A that names the first version is stale.
    let mut stale = created.body.clone();
    stale["metadata"]["resourceVersion"] = rv1;
    stale["data"] = json!({"from": "stale"});
    let s = put(&a, &format!("{CMS}/cfg"), &stale).await;
    assert_eq!(s.status, 409, "{}", s.body);

    // Both read the same object, with the same fields in the same order.
    let (ga, gb) = (
        get(&a, &format!("{CMS}/cfg")).await,
        get(&b, &format!("{CMS}/cfg")).await,
    );
    assert_eq!(ga.raw, gb.raw);
    assert_eq!(ga.body["data"], json!({"from": "b", "also": "a"}));

    // Deleted through B and created again through A: A's update applies to the new object.
    assert_eq!(delete(&b, &format!("{CMS}/cfg")).await.status, 200);
    let again = post(
        &a,
        CMS,
        &json!({"metadata": {"name": "cfg"}, "data": {"n": "2"}}),
    )
    .await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(delete(&b, &format!("{CMS}/cfg")).await.status, 200);
    let recreated = post(
        &b,
        CMS,
        &json!({"metadata": {"name": "cfg"}, "data": {"n": "3"}}),
    )
    .await;
    assert_eq!(recreated.status, 201, "{}", recreated.body);
    let p = patch(
        &a,
        &format!("{CMS}/cfg"),
        "application/merge-patch+json",
        &json!({"data": {"m": "a"}}),
    )
    .await;
    assert_eq!(p.status, 200, "{}", p.body);
    assert_eq!(p.body["data"], json!({"n": "3", "m": "a"}));
    assert_eq!(
        p.body["metadata"]["uid"], recreated.body["metadata"]["uid"],
        "{}",
        p.body
    );
}

#[tokio::test]
async fn an_update_right_after_a_write_answers_as_a_read_would() {
    let (a, _b) = two_servers().await;
    let created = post(
        &a,
        CMS,
        &json!({"metadata": {"name": "x", "labels": {"k": "v"}}, "data": {"a": "1"}}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    // A no-op update answers with the object as stored, as a GET does.
    let same = put(&a, &format!("{CMS}/x"), &created.body).await;
    assert_eq!(same.status, 200, "{}", same.body);
    let read = get(&a, &format!("{CMS}/x")).await;
    assert_eq!(same.body, read.body);
    assert_eq!(
        serde_json::to_string(&same.body).unwrap(),
        serde_json::to_string(&read.body).unwrap(),
        "same fields in the same order"
    );
}
