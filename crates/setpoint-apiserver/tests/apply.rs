//! Server-side apply (`application/apply-patch+yaml`) and `managedFields` against an
//! in-process server.

mod common;

use common::*;
use serde_json::{json, Value};

const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const DEPLOY: &str = "/apis/apps/v1/namespaces/ssa/deployments";

fn deployment(replicas: i64, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "ssa"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "nginx", "image": image}]}}}
    })
}

async fn setup() -> setpoint_apiserver::server::Running {
    let r = start().await;
    let resp = post(
        &r,
        "/api/v1/namespaces",
        &json!({"metadata": {"name": "ssa"}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    r
}

async fn apply(r: &setpoint_apiserver::server::Running, manager: &str, body: &Value) -> Resp {
    patch(
        r,
        &format!("{DEPLOY}/web?fieldManager={manager}&fieldValidation=Strict"),
        APPLY,
        body,
    )
    .await
}

/// The `managedFields` entry of `manager` with `operation`.
fn entry<'a>(obj: &'a Value, manager: &str, operation: &str) -> Option<&'a Value> {
    obj["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|e| e["manager"] == manager && e["operation"] == operation)
}

#[tokio::test]
async fn apply_creates_then_merges_and_records_ownership() {
    let r = setup().await;
    let created = apply(&r, "alice", &deployment(3, "nginx:1.25")).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let e = entry(&created.body, "alice", "Apply").expect("an Apply entry");
    assert_eq!(e["apiVersion"], "apps/v1");
    assert_eq!(e["fieldsType"], "FieldsV1");
    assert!(e["time"].is_string());
    assert_eq!(
        e["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"nginx\"}"],
        json!({".": {}, "f:image": {}, "f:name": {}})
    );
    assert_eq!(e["fieldsV1"]["f:spec"]["f:replicas"], json!({}));
    // Server-owned and defaulted fields are not the applier's.
    assert!(e["fieldsV1"]["f:metadata"].is_null());
    assert!(e["fieldsV1"]["f:status"].is_null());
    assert!(e["fieldsV1"]["f:spec"]["f:strategy"].is_null());
    let rv = created.body["metadata"]["resourceVersion"].clone();

    // The same configuration again writes nothing.
    let again = apply(&r, "alice", &deployment(3, "nginx:1.25")).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["metadata"]["resourceVersion"], rv);
    assert_eq!(
        again.body["metadata"]["managedFields"],
        created.body["metadata"]["managedFields"]
    );

    // YAML works, and a change bumps generation.
    let yaml = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 5\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n      - name: nginx\n        image: nginx:1.26\n";
    let resp = call(
        &r,
        "PATCH",
        &format!("{DEPLOY}/web?fieldManager=alice"),
        Some(APPLY),
        Some(yaml.as_bytes().to_vec()),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.body["spec"]["replicas"], 5);
    assert_eq!(
        resp.body["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.26"
    );
    assert_eq!(resp.body["metadata"]["generation"], 2);
    assert_eq!(resp.body["metadata"]["namespace"], "ssa");
}

#[tokio::test]
async fn apply_removes_what_the_manager_dropped_but_never_replaces() {
    let r = setup().await;
    let mut full = deployment(3, "nginx:1.25");
    full["spec"]["paused"] = json!(true);
    full["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "side", "image": "busybox", "args": ["sleep", "1"]}));
    assert_eq!(apply(&r, "alice", &full).await.status, 201);

    // Another manager applies only an annotation: the spec stays (kubectl-last-applied).
    let annotation = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "ssa",
                     "annotations": {"note": "x"}}});
    let resp = apply(&r, "kubectl-last-applied", &annotation).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.body["spec"]["replicas"], 3);
    assert_eq!(resp.body["spec"]["paused"], true);
    assert_eq!(resp.body["metadata"]["annotations"]["note"], "x");
    assert_eq!(
        resp.body["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // A merge patch by someone else co-owns nothing, but sets a label that stays.
    let resp = patch(
        &r,
        &format!("{DEPLOY}/web?fieldManager=bob"),
        MERGE,
        &json!({"metadata": {"labels": {"team": "a"}}}),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert!(entry(&resp.body, "bob", "Update").is_some());

    // Alice drops `paused` and the sidecar: both go; bob's label and the annotation stay.
    let resp = apply(&r, "alice", &deployment(3, "nginx:1.25")).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert!(resp.body["spec"].get("paused").is_none(), "{}", resp.body);
    let containers = resp.body["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0]["name"], "nginx");
    assert_eq!(resp.body["metadata"]["labels"]["team"], "a");
    assert_eq!(resp.body["metadata"]["annotations"]["note"], "x");

    // A field two appliers own survives when one of them drops it.
    let mut with_paused = deployment(3, "nginx:1.25");
    with_paused["spec"]["paused"] = json!(true);
    assert_eq!(apply(&r, "alice", &with_paused).await.status, 200);
    let carol = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"}, "spec": {"paused": true}});
    assert_eq!(apply(&r, "carol", &carol).await.status, 200);
    let resp = apply(&r, "alice", &deployment(3, "nginx:1.25")).await;
    assert_eq!(resp.body["spec"]["paused"], true, "{}", resp.body);
}

#[tokio::test]
async fn conflicts_are_409_unless_forced() {
    let r = setup().await;
    assert_eq!(
        apply(&r, "alice", &deployment(3, "nginx:1.25"))
            .await
            .status,
        201
    );
    let bob = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"}, "spec": {"replicas": 5}});
    let resp = apply(&r, "bob", &bob).await;
    assert_eq!(resp.status, 409, "{}", resp.body);
    assert_eq!(resp.body["reason"], "Conflict");
    assert_eq!(
        resp.body["message"],
        "Apply failed with 1 conflict: conflict with \"alice\" using apps/v1: .spec.replicas"
    );
    assert_eq!(
        resp.body["details"]["causes"],
        json!([{"reason": "FieldManagerConflict",
                "message": "conflict with \"alice\" using apps/v1",
                "field": ".spec.replicas"}])
    );

    // The same value is no conflict: ownership is shared.
    let same = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"}, "spec": {"replicas": 3}});
    let resp = apply(&r, "carol", &same).await;
    assert_eq!(resp.status, 200, "{}", resp.body);

    // Both owners are named.
    let resp = apply(&r, "bob", &bob).await;
    assert_eq!(resp.status, 409, "{}", resp.body);
    assert_eq!(resp.body["details"]["causes"].as_array().unwrap().len(), 2);
    assert!(resp.body["message"]
        .as_str()
        .unwrap()
        .starts_with("Apply failed with 2 conflicts: conflicts with \"alice\" using apps/v1:\n- .spec.replicas\n"));

    let resp = patch(
        &r,
        &format!("{DEPLOY}/web?fieldManager=bob&force=true"),
        APPLY,
        &bob,
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.body["spec"]["replicas"], 5);
    let alice = entry(&resp.body, "alice", "Apply").unwrap();
    assert!(alice["fieldsV1"]["f:spec"].get("f:replicas").is_none());
    assert!(alice["fieldsV1"]["f:spec"].get("f:selector").is_some());
    let bob_entry = entry(&resp.body, "bob", "Apply").unwrap();
    assert_eq!(bob_entry["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
    // Carol owned only replicas and lost it: her entry is gone.
    assert!(entry(&resp.body, "carol", "Apply").is_none());

    // Alice now conflicts with bob.
    let resp = apply(&r, "alice", &deployment(3, "nginx:1.25")).await;
    assert_eq!(resp.status, 409);
    assert_eq!(
        resp.body["details"]["causes"][0]["message"],
        "conflict with \"bob\" using apps/v1"
    );
}

#[tokio::test]
async fn updates_take_fields_from_appliers() {
    let r = setup().await;
    assert_eq!(
        apply(&r, "alice", &deployment(3, "nginx:1.25"))
            .await
            .status,
        201
    );
    let resp = patch(
        &r,
        &format!("{DEPLOY}/web/scale?fieldManager=scaler"),
        MERGE,
        &json!({"spec": {"replicas": 7}}),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let obj = get(&r, &format!("{DEPLOY}/web")).await.body;
    let scaler = obj["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "scaler")
        .unwrap();
    assert_eq!(scaler["operation"], "Update");
    assert_eq!(scaler["subresource"], "scale");
    assert_eq!(scaler["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
    let alice = entry(&obj, "alice", "Apply").unwrap();
    assert!(alice["fieldsV1"]["f:spec"].get("f:replicas").is_none());

    // Re-applying a different value now conflicts with the updater.
    let resp = apply(&r, "alice", &deployment(3, "nginx:1.25")).await;
    assert_eq!(resp.status, 409, "{}", resp.body);
    assert!(resp.body["message"]
        .as_str()
        .unwrap()
        .contains("conflict with \"scaler\""));

    // A status write records its subresource.
    let resp = patch(
        &r,
        &format!("{DEPLOY}/web/status?fieldManager=ctrl"),
        MERGE,
        &json!({"status": {"observedGeneration": 1}}),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let ctrl = entry(&resp.body, "ctrl", "Update").unwrap();
    assert_eq!(ctrl["subresource"], "status");
    assert_eq!(
        ctrl["fieldsV1"],
        json!({"f:status": {"f:observedGeneration": {}}})
    );

    // A create records an Update for everything it set, under the User-Agent's product name
    // when no fieldManager is given.
    let resp = call_with(
        &r,
        "POST",
        "/api/v1/namespaces/ssa/configmaps",
        Some("application/json"),
        Some(br#"{"metadata":{"name":"c"},"data":{"a":"1"}}"#.to_vec()),
        &[("user-agent", "mytool/1.0 (linux)")],
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let e = entry(&resp.body, "mytool", "Update").unwrap();
    assert_eq!(e["fieldsV1"], json!({"f:data": {"f:a": {}}}));
}

#[tokio::test]
async fn client_supplied_managed_fields_are_kept() {
    let r = setup().await;
    let created = post(
        &r,
        &format!("{DEPLOY}?fieldManager=old"),
        &deployment(3, "x"),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let mut entries = created.body["metadata"]["managedFields"].clone();
    entries[0]["manager"] = json!("new");
    entries[0]["operation"] = json!("Apply");
    let rv = created.body["metadata"]["resourceVersion"].clone();
    let resp = patch(
        &r,
        &format!("{DEPLOY}/web?fieldManager=migrate"),
        JSON_PATCH,
        &json!([{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "replace", "path": "/metadata/managedFields", "value": entries}]),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.body["metadata"]["managedFields"], entries);

    // Invalid ones are ignored.
    let resp = patch(
        &r,
        &format!("{DEPLOY}/web?fieldManager=migrate"),
        MERGE,
        &json!({"metadata": {"managedFields": [{"manager": "x", "operation": "Bogus"}]}}),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.body["metadata"]["managedFields"], entries);
}

#[tokio::test]
async fn options_are_validated_and_dry_run_stores_nothing() {
    let r = setup().await;
    let resp = patch(&r, &format!("{DEPLOY}/web"), APPLY, &deployment(1, "x")).await;
    assert_eq!(resp.status, 422, "{}", resp.body);
    assert_eq!(resp.body["reason"], "Invalid");
    assert_eq!(resp.body["details"]["kind"], "PatchOptions");
    assert_eq!(resp.body["details"]["causes"][0]["field"], "fieldManager");

    let resp = patch(
        &r,
        &format!("{DEPLOY}/web?force=true&fieldManager=a"),
        MERGE,
        &json!({}),
    )
    .await;
    assert_eq!(resp.status, 422, "{}", resp.body);
    assert_eq!(resp.body["details"]["causes"][0]["field"], "force");

    let resp = patch(
        &r,
        &format!("{DEPLOY}/web?fieldManager=a&dryRun=All"),
        APPLY,
        &deployment(1, "x"),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    assert!(entry(&resp.body, "a", "Apply").is_some());
    assert_eq!(get(&r, &format!("{DEPLOY}/web")).await.status, 404);

    let created = apply(&r, "a", &deployment(1, "x")).await;
    assert_eq!(created.status, 201);
    let resp = patch(
        &r,
        &format!("{DEPLOY}/web?fieldManager=a&dryRun=All"),
        APPLY,
        &deployment(4, "x"),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.body["spec"]["replicas"], 4);
    assert_eq!(resp.body["metadata"]["generation"], 2);
    let stored = get(&r, &format!("{DEPLOY}/web")).await.body;
    assert_eq!(stored["spec"]["replicas"], 1);
    assert_eq!(
        stored["metadata"]["resourceVersion"],
        created.body["metadata"]["resourceVersion"]
    );

    // A stale resourceVersion in the configuration is a precondition failure.
    let mut stale = deployment(2, "x");
    stale["metadata"]["resourceVersion"] = json!("1");
    assert_eq!(apply(&r, "a", &stale).await.status, 409);

    // Bad YAML and non-object bodies are 400.
    let resp = call(
        &r,
        "PATCH",
        &format!("{DEPLOY}/web?fieldManager=a"),
        Some(APPLY),
        Some(b"- a\n- b\n".to_vec()),
    )
    .await;
    assert_eq!(resp.status, 400, "{}", resp.body);
}

#[tokio::test]
async fn nulls_unset_and_status_applies_through_its_subresource() {
    let r = setup().await;
    let mut with_paused = deployment(2, "x");
    with_paused["spec"]["paused"] = json!(true);
    assert_eq!(apply(&r, "alice", &with_paused).await.status, 201);
    let mut nulled = deployment(2, "x");
    nulled["spec"]["paused"] = Value::Null;
    let resp = apply(&r, "alice", &nulled).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert!(resp.body["spec"].get("paused").is_none(), "{}", resp.body);
    let alice = entry(&resp.body, "alice", "Apply").unwrap();
    assert!(alice["fieldsV1"]["f:spec"].get("f:paused").is_none());

    // Through /status only the status is applied and owned; the spec in the body is ignored.
    let status = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"}, "spec": {"replicas": 9},
        "status": {"observedGeneration": 2, "replicas": 2}});
    let resp = patch(
        &r,
        &format!("{DEPLOY}/web/status?fieldManager=ctrl"),
        APPLY,
        &status,
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.body["spec"]["replicas"], 2);
    assert_eq!(resp.body["status"]["observedGeneration"], 2);
    let ctrl = entry(&resp.body, "ctrl", "Apply").unwrap();
    assert_eq!(ctrl["subresource"], "status");
    assert_eq!(
        ctrl["fieldsV1"],
        json!({"f:status": {"f:observedGeneration": {}, "f:replicas": {}}})
    );
    // Status written through the main resource is ignored, and not owned.
    let mut main = deployment(2, "x");
    main["status"] = json!({"replicas": 7});
    let resp = apply(&r, "alice", &main).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.body["status"]["replicas"], 2);
    assert!(entry(&resp.body, "alice", "Apply").unwrap()["fieldsV1"]
        .get("f:status")
        .is_none());
}

#[tokio::test]
async fn ports_are_keyed_by_port_and_protocol() {
    let r = setup().await;
    let mut d = deployment(1, "dns");
    d["spec"]["template"]["spec"]["containers"][0]["ports"] = json!([
        {"containerPort": 53, "protocol": "UDP", "name": "dns"},
        {"containerPort": 53, "name": "dns-tcp"}
    ]);
    let created = apply(&r, "alice", &d).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let ports = &created.body["spec"]["template"]["spec"]["containers"][0]["ports"];
    assert_eq!(ports.as_array().unwrap().len(), 2, "{ports}");
    let owned = &entry(&created.body, "alice", "Apply").unwrap()["fieldsV1"]["f:spec"]
        ["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"nginx\"}"]["f:ports"];
    assert!(
        owned
            .get("k:{\"containerPort\":53,\"protocol\":\"UDP\"}")
            .is_some(),
        "{owned}"
    );
    assert!(
        owned
            .get("k:{\"containerPort\":53,\"protocol\":\"TCP\"}")
            .is_some(),
        "{owned}"
    );
    // Re-applied without the UDP port, only that one goes.
    d["spec"]["template"]["spec"]["containers"][0]["ports"] =
        json!([{"containerPort": 53, "name": "dns-tcp"}]);
    let again = apply(&r, "alice", &d).await;
    assert_eq!(again.status, 200, "{}", again.body);
    let ports = &again.body["spec"]["template"]["spec"]["containers"][0]["ports"];
    assert_eq!(
        ports,
        &json!([{"containerPort": 53, "name": "dns-tcp", "protocol": "TCP"}])
    );
}
