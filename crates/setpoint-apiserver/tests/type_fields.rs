//! The server owns `apiVersion` and `kind`: on every write path (create, update, each patch
//! type, server-side apply, subresources) the stored object's type is the resource's, and a
//! body or patch naming another type gets upstream's answer.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::server::Running;

const DEPLOY: &str = "/apis/apps/v1/namespaces/default/deployments";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const SMP: &str = "application/strategic-merge-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

fn deployment(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    })
}

/// The object as stored, read back; its type must be the resource's whatever happened.
async fn stored_type(r: &Running, path: &str) -> (Value, Value) {
    let g = get(r, path).await;
    assert_eq!(g.status, 200, "{}", g.body);
    (g.body["apiVersion"].clone(), g.body["kind"].clone())
}

/// Every patch of `path` (the main resource or `/status`) that leaves another type, another
/// JSON type, or a non-object `metadata` is refused with upstream's 422, and changes nothing.
async fn patches_cannot_change_the_type(r: &Running, obj: &str, path: &str) {
    let before = get(r, obj).await.body["metadata"]["resourceVersion"].clone();
    let cases = [
        (MERGE, json!({"kind": "Pod"})),
        (MERGE, json!({"kind": 5})),
        (MERGE, json!({"apiVersion": "v1"})),
        (MERGE, json!({"apiVersion": ["apps/v1"]})),
        (MERGE, json!({"metadata": 5})),
        (MERGE, json!({"metadata": "x"})),
        (
            JSON_PATCH,
            json!([{"op": "replace", "path": "/kind", "value": "Pod"}]),
        ),
        (
            JSON_PATCH,
            json!([{"op": "replace", "path": "/apiVersion", "value": null}, {"op": "add", "path": "/kind", "value": true}]),
        ),
        (
            JSON_PATCH,
            json!([{"op": "replace", "path": "/metadata", "value": []}]),
        ),
        (SMP, json!({"kind": 7})),
    ];
    for (ct, p) in cases {
        let resp = patch(r, path, ct, &p).await;
        assert_eq!(resp.status, 422, "{ct} {p} on {path}: {}", resp.body);
        assert_eq!(resp.body["reason"], "Invalid");
        assert_eq!(resp.body["details"]["causes"][0]["field"], "patch");
        let msg = resp.body["message"].as_str().unwrap();
        assert!(
            msg.starts_with(" \"\" is invalid: patch: Invalid value: "),
            "{msg}"
        );
    }
    let after = get(r, obj).await.body["metadata"]["resourceVersion"].clone();
    assert_eq!(before, after, "a refused patch wrote something");
}

#[tokio::test]
async fn every_write_path_keeps_the_resources_type() {
    let r = start().await;
    let obj = format!("{DEPLOY}/a");

    // create: another kind, another version, or a non-string type is a 400.
    let mut pod = deployment("a");
    pod["kind"] = json!("Pod");
    let resp = post(&r, DEPLOY, &pod).await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert_eq!(
        resp.body["message"],
        "the kind in the data (Pod) does not match the expected kind (Deployment)"
    );
    let mut v1 = deployment("a");
    v1["apiVersion"] = json!("v1");
    let resp = post(&r, DEPLOY, &v1).await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert_eq!(
        resp.body["message"],
        "the API version in the data (v1) does not match the expected API version (apps/v1)"
    );
    let mut five = deployment("a");
    five["kind"] = json!(5);
    let resp = post(&r, DEPLOY, &five).await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert!(resp.body["message"]
        .as_str()
        .unwrap()
        .starts_with("the object provided is unrecognized (must be of type Deployment): couldn't get version/kind; json parse error: json: cannot unmarshal number into Go struct field .kind of type string ("));

    // A body without a type gets the resource's.
    let mut untyped = deployment("a");
    untyped.as_object_mut().unwrap().remove("kind");
    untyped["apiVersion"] = Value::Null;
    let resp = post(&r, DEPLOY, &untyped).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    assert_eq!(
        stored_type(&r, &obj).await,
        (json!("apps/v1"), json!("Deployment"))
    );

    // update (main and /status): another kind is a 400.
    for path in [obj.clone(), format!("{obj}/status")] {
        let mut body = get(&r, &obj).await.body;
        body["kind"] = json!("Pod");
        let resp = put(&r, &path, &body).await;
        assert_eq!(resp.status, 400, "PUT {path}: {}", resp.body);
        assert_eq!(
            resp.body["message"],
            "the kind in the data (Pod) does not match the expected kind (Deployment)"
        );
    }

    // Every patch type, through the main resource and /status.
    patches_cannot_change_the_type(&r, &obj, &obj).await;
    patches_cannot_change_the_type(&r, &obj, &format!("{obj}/status")).await;

    // The exact message for the reproduction.
    let resp = patch(&r, &obj, MERGE, &json!({"kind": "Pod"})).await;
    assert!(resp.body["message"].as_str().unwrap().ends_with(
        ": no kind \"Pod\" is registered for version \"apps/v1\" in scheme \"pkg/api/legacyscheme/scheme.go:30\""
    ), "{}", resp.body);

    // Patches that remove the type get it back; a strategic merge patch decodes into the
    // kind's own type, so another type string is dropped (200).
    for (ct, p) in [
        (MERGE, json!({"kind": null, "apiVersion": null})),
        (JSON_PATCH, json!([{"op": "remove", "path": "/kind"}])),
        (
            SMP,
            json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"labels": {"x": "1"}}}),
        ),
    ] {
        let resp = patch(&r, &obj, ct, &p).await;
        assert_eq!(resp.status, 200, "{ct} {p}: {}", resp.body);
        assert_eq!(resp.body["kind"], "Deployment");
        assert_eq!(
            stored_type(&r, &obj).await,
            (json!("apps/v1"), json!("Deployment"))
        );
    }

    // A patch cannot rename or move the object (upstream's checkName answers).
    let resp = patch(&r, &obj, MERGE, &json!({"metadata": {"name": "b"}})).await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert_eq!(
        resp.body["message"],
        "the name of the object (b) does not match the name on the URL (a)"
    );
    let resp = patch(
        &r,
        &obj,
        MERGE,
        &json!({"metadata": {"namespace": "kube-system"}}),
    )
    .await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert_eq!(
        resp.body["message"],
        "the namespace of the object (kube-system) does not match the namespace on the request (default)"
    );
    let resp = patch(&r, &obj, MERGE, &json!({"metadata": null})).await;
    assert_eq!(resp.status, 400, "{}", resp.body);

    // Server-side apply: a configuration of another kind is a 400.
    let mut applied = deployment("a");
    applied["kind"] = json!("Pod");
    let resp = call(
        &r,
        "PATCH",
        &format!("{obj}?fieldManager=test"),
        Some(APPLY),
        Some(serde_json::to_vec(&applied).unwrap()),
    )
    .await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert_eq!(
        stored_type(&r, &obj).await,
        (json!("apps/v1"), json!("Deployment"))
    );

    // /scale is its own type: a patch of it changes replicas only.
    let resp = patch(
        &r,
        &format!("{obj}/scale"),
        MERGE,
        &json!({"kind": "Pod", "spec": {"replicas": 3}}),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let g = get(&r, &obj).await.body;
    assert_eq!(g["spec"]["replicas"], 3);
    assert_eq!(g["kind"], "Deployment");
}

const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

/// A custom resource decodes as an unstructured object: validation says what its type must be.
#[tokio::test]
async fn custom_resources_keep_their_type() {
    let r = start().await;
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "gadgets", "kind": "Gadget"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                   "x-kubernetes-preserve-unknown-fields": true}}}]}
    });
    assert_eq!(post(&r, CRDS, &crd).await.status, 201);
    let path = "/apis/example.com/v1/namespaces/default/gadgets";
    setpoint_testing::eventually_within(Duration::from_secs(10), "gadgets served", || async {
        (get(&r, path).await.status == 200).then_some(())
    })
    .await;
    let created = post(
        &r,
        path,
        &json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let obj = format!("{path}/g");

    let resp = patch(&r, &obj, MERGE, &json!({"kind": "Widget"})).await;
    assert_eq!(resp.status, 422, "{}", resp.body);
    assert_eq!(
        resp.body["message"],
        "Gadget.example.com \"g\" is invalid: kind: Invalid value: \"Widget\": must be Gadget"
    );
    let resp = patch(&r, &obj, MERGE, &json!({"apiVersion": "example.com/v2"})).await;
    assert_eq!(resp.status, 422, "{}", resp.body);
    assert_eq!(resp.body["details"]["causes"][0]["field"], "apiVersion");
    let resp = patch(&r, &obj, MERGE, &json!({"kind": null})).await;
    assert_eq!(resp.status, 422, "{}", resp.body);
    assert_eq!(resp.body["details"]["causes"][0]["field"], "patch");
    assert_eq!(
        stored_type(&r, &obj).await,
        (json!("example.com/v1"), json!("Gadget"))
    );
}
