//! What gets stored, and what is refused before anything is: unknown fields of built-in kinds
//! are dropped (warned about one by one, or refused with `Strict`), no object over the storage
//! limit is written by any path, YAML aliases and JSON patches cannot make the server allocate
//! far more than they weigh, values of the wrong type get the decoder's 400, and the three
//! system namespaces cannot be deleted. Each answer is Kubernetes'.

mod common;

use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::server::Running;

const CMS: &str = "/api/v1/namespaces/lim/configmaps";
const DEPLOYS: &str = "/apis/apps/v1/namespaces/lim/deployments";
const JSON_PATCH: &str = "application/json-patch+json";
const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

async fn setup() -> Running {
    let r = start().await;
    let resp = post(
        &r,
        "/api/v1/namespaces",
        &json!({"metadata": {"name": "lim"}}),
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

fn deployment(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "c", "image": "nginx"}]}}
        }
    })
}

/// The object as the server now holds it.
async fn stored(r: &Running, path: &str) -> Value {
    let resp = get(r, path).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    resp.body
}

fn message(resp: &Resp) -> &str {
    resp.body["message"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn unknown_fields_of_builtin_kinds_are_dropped_and_warned_about_one_by_one() {
    let r = setup().await;
    let mut d = deployment("web");
    d["spec"]["foo"] = json!("bar");
    d["x"] = json!(1);
    d["spec"]["template"]["spec"]["containers"][0]["imagee"] = json!("typo");
    let resp = post(&r, DEPLOYS, &d).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let mut w = warnings(&resp);
    w.sort();
    assert_eq!(
        w,
        vec![
            r#"299 - "unknown field \"spec.foo\"""#,
            r#"299 - "unknown field \"spec.template.spec.containers[0].imagee\"""#,
            r#"299 - "unknown field \"x\"""#,
        ]
    );
    for obj in [
        resp.body.clone(),
        stored(&r, &format!("{DEPLOYS}/web")).await,
    ] {
        assert!(obj.get("x").is_none(), "{obj}");
        assert!(obj["spec"].get("foo").is_none(), "{obj}");
        assert!(obj["spec"]["template"]["spec"]["containers"][0]
            .get("imagee")
            .is_none());
        assert_eq!(obj["spec"]["replicas"], 1);
    }

    // Ignore drops them without a word; Strict refuses, naming every one.
    let mut d = deployment("quiet");
    d["spec"]["foo"] = json!("bar");
    let resp = post(&r, &format!("{DEPLOYS}?fieldValidation=Ignore"), &d).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    assert!(warnings(&resp).is_empty());
    assert!(resp.body["spec"].get("foo").is_none());
    let mut d = deployment("strict");
    d["spec"]["foo"] = json!("bar");
    d["x"] = json!(1);
    let resp = post(&r, &format!("{DEPLOYS}?fieldValidation=Strict"), &d).await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert_eq!(resp.body["reason"], "BadRequest");
    assert_eq!(
        message(&resp),
        r#"Deployment in version "v1" cannot be handled as a Deployment: strict decoding error: unknown field "spec.foo", unknown field "x""#
    );
    assert_eq!(get(&r, &format!("{DEPLOYS}/strict")).await.status, 404);
}

#[tokio::test]
async fn unknown_fields_are_dropped_on_update_and_every_patch_type() {
    let r = setup().await;
    let path = format!("{CMS}/cm");
    let resp = post(
        &r,
        CMS,
        &json!({"metadata": {"name": "cm"}, "data": {"a": "1"}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);

    let mut cm = stored(&r, &path).await;
    cm["extra"] = json!({"deep": true});
    let resp = put(&r, &path, &cm).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(warnings(&resp), vec![r#"299 - "unknown field \"extra\"""#]);
    assert!(stored(&r, &path).await.get("extra").is_none());

    for (ct, body) in [
        (MERGE, json!({"junk": "m", "data": {"b": "2"}})),
        (STRATEGIC, json!({"junk": "s", "data": {"b": "2"}})),
        (
            JSON_PATCH,
            json!([{"op": "add", "path": "/junk", "value": "j"}]),
        ),
    ] {
        let resp = patch(&r, &path, ct, &body).await;
        assert_eq!(resp.status, 200, "{ct}: {}", resp.body);
        assert_eq!(
            warnings(&resp),
            vec![r#"299 - "unknown field \"junk\"""#],
            "{ct}"
        );
        let now = stored(&r, &path).await;
        assert!(now.get("junk").is_none(), "{ct}: {now}");
        let resp = patch(&r, &format!("{path}?fieldValidation=Strict"), ct, &body).await;
        assert_eq!(resp.status, 400, "{ct}: {}", resp.body);
        assert!(
            message(&resp).ends_with(r#"strict decoding error: unknown field "junk""#),
            "{ct}: {}",
            message(&resp)
        );
    }
}

#[tokio::test]
async fn unknown_fields_are_dropped_from_status_writes_too() {
    let r = setup().await;
    let resp = post(&r, DEPLOYS, &deployment("st")).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let path = format!("{DEPLOYS}/st/status");
    let mut d = resp.body.clone();
    d["status"] = json!({"replicas": 1, "bogus": "x"});
    let resp = put(&r, &path, &d).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        warnings(&resp),
        vec![r#"299 - "unknown field \"status.bogus\"""#]
    );
    let resp = patch(&r, &path, MERGE, &json!({"status": {"other": 1}})).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(
        warnings(&resp),
        vec![r#"299 - "unknown field \"status.other\"""#]
    );
    let now = stored(&r, &format!("{DEPLOYS}/st")).await;
    assert_eq!(now["status"]["replicas"], 1);
    assert!(now["status"].get("bogus").is_none(), "{now}");
    assert!(now["status"].get("other").is_none(), "{now}");
}

#[tokio::test]
async fn apply_refuses_unknown_fields_whatever_field_validation_says() {
    let r = setup().await;
    let mut d = deployment("applied");
    d["spec"]["foo"] = json!("bar");
    for q in ["", "&fieldValidation=Ignore", "&fieldValidation=Warn"] {
        let resp = patch(
            &r,
            &format!("{DEPLOYS}/applied?fieldManager=me{q}"),
            APPLY,
            &d,
        )
        .await;
        assert_eq!(resp.status, 400, "{q}: {}", resp.body);
        assert_eq!(
            message(&resp),
            "failed to create typed patch object (lim/applied; apps/v1, Kind=Deployment): .spec.foo: field not declared in schema"
        );
    }
    assert_eq!(get(&r, &format!("{DEPLOYS}/applied")).await.status, 404);
    // List items are named by their keys, and several fields are listed one per line.
    d["spec"]["template"]["spec"]["containers"][0]["imagee"] = json!("typo");
    let resp = patch(&r, &format!("{DEPLOYS}/applied?fieldManager=me"), APPLY, &d).await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert_eq!(
        message(&resp),
        "failed to create typed patch object (lim/applied; apps/v1, Kind=Deployment): errors:\n  .spec.foo: field not declared in schema\n  .spec.template.spec.containers[name=\"c\"].imagee: field not declared in schema"
    );
    let resp = patch(
        &r,
        &format!("{DEPLOYS}/applied?fieldManager=me"),
        APPLY,
        &deployment("applied"),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
}

#[tokio::test]
async fn an_unknown_field_cannot_carry_an_object_past_the_size_limit() {
    let r = setup().await;
    // 2.5 MB in a field ConfigMaps do not have: dropped, so the object stored is small.
    let big = "x".repeat(2_500_000);
    let resp = post(
        &r,
        CMS,
        &json!({"metadata": {"name": "smuggle"}, "data": {"a": "1"}, "payload": big}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    assert!(stored(&r, &format!("{CMS}/smuggle"))
        .await
        .get("payload")
        .is_none());
}

/// A Deployment whose container has `args`: a field no rule bounds, so only the storage limit
/// stands in its way.
fn with_args(name: &str, args: &[&str]) -> Value {
    let mut d = deployment(name);
    d["spec"]["template"]["spec"]["containers"][0]["args"] = json!(args);
    d
}

#[tokio::test]
async fn no_write_path_stores_an_object_over_the_limit() {
    let r = setup().await;
    let over = "y".repeat(1600 * 1024);
    let too_large = |resp: &Resp| {
        assert_eq!(resp.status, 413, "{}", resp.body);
        assert_eq!(resp.body["reason"], "RequestEntityTooLarge");
        assert_eq!(resp.body["message"], "etcdserver: request is too large");
    };
    too_large(&post(&r, DEPLOYS, &with_args("big", &[&over])).await);
    assert_eq!(get(&r, &format!("{DEPLOYS}/big")).await.status, 404);

    let path = format!("{DEPLOYS}/small");
    let resp = post(&r, DEPLOYS, &with_args("small", &["a"])).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let before = stored(&r, &path).await;
    let mut grown = before.clone();
    grown["spec"]["template"]["spec"]["containers"][0]["args"] = json!([over]);
    too_large(&put(&r, &path, &grown).await);
    let args =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "args": [over]}]}}}});
    too_large(&patch(&r, &path, STRATEGIC, &args).await);
    too_large(&patch(&r, &path, MERGE, &grown).await);
    too_large(
        &patch(
            &r,
            &format!("{path}?fieldManager=big&force=true"),
            APPLY,
            &with_args("small", &[&over]),
        )
        .await,
    );
    assert_eq!(stored(&r, &path).await, before);

    // A patch far smaller than the limit that doubles a value already near it.
    let half = "z".repeat(900 * 1024);
    let mut t = before.clone();
    t["spec"]["template"]["spec"]["containers"][0]["args"] = json!([half]);
    let resp = put(&r, &path, &t).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let before = stored(&r, &path).await;
    let copy = json!([{"op": "copy", "from": "/spec/template/spec/containers/0/args/0",
                       "path": "/spec/template/spec/containers/0/args/-"}]);
    too_large(&patch(&r, &path, JSON_PATCH, &copy).await);
    assert_eq!(stored(&r, &path).await, before);
}

#[tokio::test]
async fn yaml_aliases_cannot_expand_past_the_bound() {
    let r = setup().await;
    // Under 1.3 KB of YAML that names tens of megabytes of strings.
    let mut doc = String::from(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: laughs\nx:\n  a0: &a0 [\"lolololololololololol\",\"lolololololololololol\",\"lolololololololololol\",\"lolololololololololol\",\"lolololololololololol\",\"lolololololololololol\",\"lolololololololololol\",\"lolololololololololol\",\"lolololololololololol\",\"lolololololololololol\"]\n",
    );
    for i in 1..=6 {
        let refs = vec![format!("*a{}", i - 1); 10].join(",");
        doc.push_str(&format!("  a{i}: &a{i} [{refs}]\n"));
    }
    assert!(doc.len() < 1300, "{}", doc.len());
    let resp = call(
        &r,
        "POST",
        CMS,
        Some("application/yaml"),
        Some(doc.into_bytes()),
    )
    .await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert_eq!(
        message(&resp),
        r#"ConfigMap in version "v1" cannot be handled as a ConfigMap: yaml: document contains excessive aliasing"#
    );
    assert_eq!(get(&r, &format!("{CMS}/laughs")).await.status, 404);
}

#[tokio::test]
async fn json_patches_with_too_many_operations_or_copies_are_refused_and_change_nothing() {
    let r = setup().await;
    let path = format!("{CMS}/target");
    let value = "v".repeat(500 * 1024);
    let resp = post(
        &r,
        CMS,
        &json!({"metadata": {"name": "target"}, "data": {"v": value}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let before = stored(&r, &path).await;

    let add = json!({"op": "add", "path": "/data/x", "value": "y"});
    let ops = Value::Array(vec![add; 10_001]);
    let resp = patch(&r, &path, JSON_PATCH, &ops).await;
    assert_eq!(resp.status, 413, "{}", resp.body);
    assert_eq!(resp.body["reason"], "RequestEntityTooLarge");
    assert_eq!(
        message(&resp),
        "The allowed maximum operations in a JSON patch is 10000, got 10001"
    );
    assert_eq!(stored(&r, &path).await, before);

    // 2,000 copies of a 500 KB value: refused at the seventh, when the copies pass 3 MiB.
    let copies: Vec<Value> = (0..2000)
        .map(|i| json!({"op": "copy", "from": "/data/v", "path": format!("/data/c{i}")}))
        .collect();
    let resp = patch(&r, &path, JSON_PATCH, &Value::Array(copies)).await;
    assert_eq!(resp.status, 422, "{}", resp.body);
    assert_eq!(resp.body["reason"], "Invalid");
    let copied = 7 * (500 * 1024 + 2);
    assert!(
        message(&resp).ends_with(&format!(
            "Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the limit 3145728"
        )),
        "{}",
        message(&resp)
    );
    assert_eq!(stored(&r, &path).await, before);
}

#[tokio::test]
async fn values_of_the_wrong_type_get_the_decoders_400() {
    let r = setup().await;
    let resp = post(
        &r,
        "/api/v1/namespaces/lim/pods",
        &json!({"metadata": {"name": 5}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
    )
    .await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert_eq!(resp.body["reason"], "BadRequest");
    assert_eq!(
        message(&resp),
        r#"Pod in version "v1" cannot be handled as a Pod: json: cannot unmarshal number into Go struct field ObjectMeta.metadata.name of type string"#
    );

    let resp = post(&r, DEPLOYS, &deployment("typed")).await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    let mut numbered = resp.body.clone();
    numbered["metadata"]["name"] = json!(5);
    let resp = put(&r, &format!("{DEPLOYS}/typed"), &numbered).await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert_eq!(
        message(&resp),
        r#"Deployment in version "v1" cannot be handled as a Deployment: json: cannot unmarshal number into Go struct field ObjectMeta.metadata.name of type string"#
    );
    let resp = patch(
        &r,
        &format!("{DEPLOYS}/typed"),
        MERGE,
        &json!({"spec": {"replicas": "3"}}),
    )
    .await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert_eq!(
        message(&resp),
        r#"Deployment in version "v1" cannot be handled as a Deployment: json: cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"#
    );

    // `-0` is a float to the JSON decoder, which an integer field cannot take.
    let resp = call(
        &r,
        "POST",
        "/api/v1/namespaces/lim/pods?dryRun=All&fieldValidation=Strict",
        Some("application/json"),
        Some(br#"{"apiVersion":"v1","kind":"Pod","spec":{"activeDeadlineSeconds":-2,"priority":-0}}"#.to_vec()),
    )
    .await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert!(
        message(&resp).contains("cannot unmarshal number -0")
            && message(&resp).ends_with("Go struct field PodSpec.spec.priority of type int32"),
        "{}",
        message(&resp)
    );

    // Bodies that are not JSON get Go's decoder's words.
    let resp = call(
        &r,
        "POST",
        CMS,
        Some("application/json"),
        Some(b"{bad".to_vec()),
    )
    .await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    assert!(
        message(&resp)
            .ends_with("invalid character 'b' looking for beginning of object key string"),
        "{}",
        message(&resp)
    );
    for ct in [MERGE, STRATEGIC, JSON_PATCH] {
        let resp = call(
            &r,
            "PATCH",
            &format!("{DEPLOYS}/typed"),
            Some(ct),
            Some(b"[1 2]".to_vec()),
        )
        .await;
        assert_eq!(resp.status, 400, "{ct}: {}", resp.body);
        assert_eq!(
            message(&resp),
            "error decoding patch: invalid character '2' after array element"
        );
    }

    // No parser hint for Rust programmers reaches a client.
    let resp = call(
        &r,
        "POST",
        CMS,
        Some("application/yaml"),
        Some(b"metadata:\n  name: a\n---\nmetadata:\n  name: b\n".to_vec()),
    )
    .await;
    assert_eq!(resp.status, 400, "{}", resp.body);
    for hint in ["Option<", "from_str_multiple", "DuplicateKeyPolicy"] {
        assert!(!message(&resp).contains(hint), "{}", message(&resp));
    }
}

#[tokio::test]
async fn the_system_namespaces_cannot_be_deleted() {
    let r = setup().await;
    for ns in ["default", "kube-system", "kube-public"] {
        let resp = delete(&r, &format!("/api/v1/namespaces/{ns}")).await;
        assert_eq!(resp.status, 403, "{ns}: {}", resp.body);
        assert_eq!(resp.body["reason"], "Forbidden");
        assert_eq!(
            message(&resp),
            format!(r#"namespaces "{ns}" is forbidden: this namespace may not be deleted"#)
        );
        let still = stored(&r, &format!("/api/v1/namespaces/{ns}")).await;
        assert!(still["metadata"].get("deletionTimestamp").is_none());
    }
    // Other namespaces, kube-node-lease among them, can be.
    let resp = delete(&r, "/api/v1/namespaces/kube-node-lease").await;
    assert!(matches!(resp.status, 200 | 202), "{}", resp.body);
}
