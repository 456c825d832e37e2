//! How objects sit in the store: compressed JSON without `resourceVersion`, and plain JSON
//! written before compression (or by an older server on a shared store) still reads, lists,
//! watches and updates the same way.

mod common;

use bytes::Bytes;
use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::ApiServer;
use setpoint_store::{compression, Precondition};

const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn data() -> Value {
    json!({"greeting": "hello ".repeat(50), "n": "1"})
}

#[tokio::test]
async fn objects_are_stored_compressed_and_plain_values_still_serve() {
    let config = memory_config;
    let store = ApiServer::open_store(&config()).await.unwrap();
    // As a server before compression stored a ConfigMap: plain JSON, no resourceVersion.
    let old = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "old", "namespace": "default", "uid": "4d1c7f2e-0000-4000-8000-000000000001",
                     "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"era": "plain"}},
        "data": data(),
    });
    let written = store
        .put(
            "/registry/core/configmaps/default/old",
            Bytes::from(serde_json::to_vec(&old).unwrap()),
            Precondition::NotExists,
        )
        .await
        .unwrap();
    let r = ApiServer::new(config(), store.clone())
        .await
        .unwrap()
        .serve()
        .await
        .unwrap();

    // Read, listed (from the watch cache, with a selector on a label) and as metadata only.
    let got = get(&r, &format!("{CMS}/old")).await;
    assert_eq!(got.status, 200, "{}", got.body);
    assert_eq!(got.body["data"], data());
    assert_eq!(
        got.body["metadata"]["resourceVersion"],
        written.mod_revision.to_string()
    );
    let listed = get(&r, &format!("{CMS}?labelSelector=era%3Dplain")).await;
    assert_eq!(listed.body["items"][0]["data"], data(), "{}", listed.body);
    let meta = call_with(
        &r,
        "GET",
        &format!("{CMS}/old"),
        None,
        None,
        &[(
            "accept",
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        )],
    )
    .await;
    assert_eq!(
        meta.body["metadata"]["labels"]["era"], "plain",
        "{}",
        meta.body
    );

    // A create through the API is stored compressed, without its resourceVersion.
    let (_, mut w) = WatchStream::open(
        &r,
        &format!("{CMS}?watch=true&resourceVersion={}", written.mod_revision),
    )
    .await;
    let created = post(
        &r,
        CMS,
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "new"}, "data": data()}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let kv = store
        .get("/registry/core/configmaps/default/new")
        .await
        .unwrap()
        .unwrap();
    assert!(compression::is_compressed(&kv.value));
    let stored: Value = serde_json::from_slice(&compression::plain(&kv.value).unwrap()).unwrap();
    assert!(stored["metadata"].get("resourceVersion").is_none());
    assert_eq!(stored["data"], data());
    assert!(kv.value.len() < serde_json::to_vec(&stored).unwrap().len());

    // Updating the plain object stores it compressed; watchers see both, whole.
    let mut changed = got.body.clone();
    changed["data"]["n"] = json!("2");
    let updated = put(&r, &format!("{CMS}/old"), &changed).await;
    assert_eq!(updated.status, 200, "{}", updated.body);
    assert!(compression::is_compressed(
        &store
            .get("/registry/core/configmaps/default/old")
            .await
            .unwrap()
            .unwrap()
            .value
    ));
    let added = w.next().await.unwrap();
    assert_eq!(added["type"], "ADDED");
    assert_eq!(added["object"], created.body);
    let modified = w.next().await.unwrap();
    assert_eq!(modified["type"], "MODIFIED");
    assert_eq!(modified["object"], updated.body);
    assert_eq!(modified["object"]["data"]["n"], "2");
    assert_eq!(get(&r, &format!("{CMS}/old")).await.body, updated.body);
}
