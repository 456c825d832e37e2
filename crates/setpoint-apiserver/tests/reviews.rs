//! Reviews (TokenReview, SelfSubjectReview, the access reviews, SelfSubjectRulesReview) and
//! impersonation against the in-process server. Plain-HTTP callers act as the internal
//! `system:masters` user, which may impersonate anyone.

mod common;

use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::server::Running;
use setpoint_apiserver::ApiServer;

const AUTHZ: &str = "/apis/authorization.k8s.io/v1";
const AUTHN: &str = "/apis/authentication.k8s.io/v1";

async fn post_as(r: &Running, path: &str, body: &Value, headers: &[(&str, &str)]) -> Resp {
    call_with(
        r,
        "POST",
        path,
        Some("application/json"),
        Some(serde_json::to_vec(body).unwrap()),
        headers,
    )
    .await
}

fn sar(spec: Value) -> Value {
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
}

#[tokio::test]
async fn discovery_lists_only_create_and_other_verbs_are_refused() {
    let r = start().await;
    let doc = get(&r, AUTHZ).await.body;
    let names: Vec<(&str, &Value)> = doc["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), &e["verbs"]))
        .collect();
    for name in [
        "localsubjectaccessreviews",
        "selfsubjectaccessreviews",
        "selfsubjectrulesreviews",
        "subjectaccessreviews",
    ] {
        let (_, verbs) = names.iter().find(|(n, _)| *n == name).unwrap();
        assert_eq!(**verbs, json!(["create"]), "{name}");
    }
    let lsar = doc["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "localsubjectaccessreviews")
        .unwrap();
    assert_eq!(lsar["namespaced"], true);
    let doc = get(&r, AUTHN).await.body;
    assert_eq!(doc["resources"].as_array().unwrap().len(), 2);

    // OpenAPI describes the POST alone.
    let doc = get(&r, "/openapi/v3/apis/authorization.k8s.io/v1")
        .await
        .body;
    let paths = doc["paths"].as_object().unwrap();
    let sar_path = &paths["/apis/authorization.k8s.io/v1/subjectaccessreviews"];
    assert_eq!(
        sar_path.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["post"]
    );
    assert!(!paths.keys().any(|p| p.ends_with("{name}")), "{paths:?}");
    // Without a PATCH, kubectl validates bodies against the schema: metadata is optional.
    let schema = &doc["components"]["schemas"]["io.k8s.api.authorization.v1.SubjectAccessReview"];
    assert_eq!(schema["required"], json!(["spec"]));

    let list = get(&r, &format!("{AUTHZ}/subjectaccessreviews")).await;
    assert_eq!(list.status, 405);
    assert_eq!(list.body["reason"], "MethodNotAllowed");
    let del = call(
        &r,
        "DELETE",
        &format!("{AUTHZ}/subjectaccessreviews"),
        None,
        None,
    )
    .await;
    assert_eq!(del.status, 405);
    let one = get(&r, &format!("{AUTHZ}/subjectaccessreviews/x")).await;
    assert_eq!(one.status, 404);
    assert_eq!(one.body["reason"], "NotFound");
    // The cluster-scoped reviews have no namespaced path.
    let ns = post(
        &r,
        &format!("{AUTHZ}/namespaces/a/subjectaccessreviews"),
        &sar(json!({})),
    )
    .await;
    assert_eq!(ns.status, 404);
    r.shutdown().await;
}

#[tokio::test]
async fn subject_access_reviews_ask_the_authorizers() {
    let r = start().await;
    let path = format!("{AUTHZ}/subjectaccessreviews");
    let attrs = json!({"namespace": "a", "verb": "list", "resource": "pods"});
    let alice = post(
        &r,
        &path,
        &sar(json!({"user": "alice", "resourceAttributes": attrs})),
    )
    .await;
    assert_eq!(alice.status, 201, "{}", alice.body);
    assert_eq!(alice.body["status"], json!({"allowed": false}));
    assert_eq!(alice.body["spec"]["user"], "alice");
    assert_eq!(alice.body["kind"], "SubjectAccessReview");
    let admin = post(
        &r,
        &path,
        &sar(json!({"user": "root", "groups": ["system:masters"], "resourceAttributes": attrs})),
    )
    .await;
    assert_eq!(admin.body["status"]["allowed"], true);
    // Nothing was stored: there is no cache or key for it.
    let anyone = post(
        &r,
        &path,
        &sar(json!({"groups": ["system:authenticated"],
                    "nonResourceAttributes": {"path": "/version", "verb": "get"}})),
    )
    .await;
    assert_eq!(anyone.body["status"]["allowed"], true, "{}", anyone.body);

    let none = post(&r, &path, &sar(json!({"resourceAttributes": attrs}))).await;
    assert_eq!(none.status, 422);
    assert_eq!(
        none.body["message"],
        r#"SubjectAccessReview.authorization.k8s.io "" is invalid: spec.user: Invalid value: "": at least one of user or group must be specified"#
    );
    let neither = post(&r, &path, &sar(json!({"user": "x"}))).await;
    assert_eq!(
        neither.body["message"],
        r#"SubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: Invalid value: "null": exactly one of nonResourceAttributes or resourceAttributes must be specified"#
    );
    let both = post(
        &r,
        &path,
        &sar(json!({"user": "x", "resourceAttributes": attrs,
                    "nonResourceAttributes": {"path": "/x", "verb": "get"}})),
    )
    .await;
    assert_eq!(
        both.body["message"],
        r#"SubjectAccessReview.authorization.k8s.io "" is invalid: spec.nonResourceAttributes: Invalid value: "authorization.NonResourceAttributes{Path:\"/x\", Verb:\"get\"}": cannot be specified in combination with resourceAttributes"#
    );
    let wrong_kind = post(
        &r,
        &path,
        &json!({"apiVersion": "authorization.k8s.io/v1", "kind": "TokenReview", "spec": {}}),
    )
    .await;
    assert_eq!(wrong_kind.status, 400);
    r.shutdown().await;
}

#[tokio::test]
async fn local_reviews_stay_in_their_namespace() {
    let r = start().await;
    let path = format!("{AUTHZ}/namespaces/a/localsubjectaccessreviews");
    let review = |ns: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
               "spec": {"groups": ["system:masters"],
                        "resourceAttributes": {"namespace": ns, "verb": "get", "resource": "pods"}}})
    };
    let ok = post(&r, &path, &review("a")).await;
    assert_eq!(ok.status, 201, "{}", ok.body);
    assert_eq!(ok.body["metadata"]["namespace"], "a");
    assert_eq!(ok.body["status"]["allowed"], true);
    let other = post(&r, &path, &review("b")).await;
    assert_eq!(other.status, 422);
    assert_eq!(
        other.body["message"],
        r#"LocalSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes.namespace: Invalid value: "b": must match metadata.namespace"#
    );
    let mut elsewhere = review("b");
    elsewhere["metadata"] = json!({"namespace": "b"});
    let e = post(&r, &path, &elsewhere).await;
    assert_eq!(e.status, 400);
    assert_eq!(
        e.body["message"],
        "the namespace of the provided object does not match the namespace sent on the request"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn self_reviews_describe_the_caller_or_whom_it_impersonates() {
    let r = start().await;
    let whoami = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let mut named = whoami.clone();
    named["metadata"] = json!({"name": "ignored", "labels": {"a": "b"}});
    let me = post(&r, &format!("{AUTHN}/selfsubjectreviews"), &named).await;
    assert_eq!(me.status, 201, "{}", me.body);
    assert_eq!(
        me.body["status"]["userInfo"]["username"],
        "system:apiserver"
    );
    assert!(me.body["metadata"]["creationTimestamp"].is_string());
    assert_eq!(me.body["metadata"].as_object().unwrap().len(), 1);
    assert_eq!(me.body["kind"], "SelfSubjectReview");
    assert_eq!(me.body["apiVersion"], "authentication.k8s.io/v1");
    // What upstream's system:basic-user grants every user, here for alice alone.
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "reviewer"},
        "rules": [{"apiGroups": ["authentication.k8s.io", "authorization.k8s.io"],
                   "resources": ["selfsubjectreviews", "selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                   "verbs": ["create"]}]});
    let created = post(&r, "/apis/rbac.authorization.k8s.io/v1/clusterroles", &role).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "reviewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reviewer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]});
    let created = post(
        &r,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        &binding,
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    // The authorizer sees the binding once its cache has it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let alice = loop {
        let resp = post_as(
            &r,
            &format!("{AUTHN}/selfsubjectreviews"),
            &whoami,
            &[
                ("Impersonate-User", "alice"),
                ("Impersonate-Group", "dev"),
                ("Impersonate-Extra-Scopes", "a"),
            ],
        )
        .await;
        if resp.status != 403 || std::time::Instant::now() > deadline {
            break resp;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(
        alice.body["status"]["userInfo"],
        json!({"username": "alice", "groups": ["dev", "system:authenticated"],
               "extra": {"scopes": ["a"]}})
    );

    let ssar = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                      "spec": {"resourceAttributes": {"namespace": "a", "verb": "list", "resource": "pods"}}});
    let path = format!("{AUTHZ}/selfsubjectaccessreviews");
    let yes = post(&r, &path, &ssar).await;
    assert_eq!(yes.body["status"]["allowed"], true, "{}", yes.body);
    let no = post_as(&r, &path, &ssar, &[("Impersonate-User", "alice")]).await;
    assert_eq!(no.status, 201);
    assert_eq!(no.body["status"]["allowed"], false);

    let named = post(
        &r,
        &path,
        &json!({"metadata": {"name": "x"}, "spec": ssar["spec"]}),
    )
    .await;
    assert_eq!(named.status, 422);
    assert!(
        named.body["message"]
            .as_str()
            .unwrap()
            .ends_with(": must be empty"),
        "{}",
        named.body
    );

    let rules = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
                       "spec": {"namespace": "a"}});
    let ssrr = post(&r, &format!("{AUTHZ}/selfsubjectrulesreviews"), &rules).await;
    assert_eq!(ssrr.status, 201, "{}", ssrr.body);
    let status = &ssrr.body["status"];
    assert!(status["resourceRules"]
        .as_array()
        .unwrap()
        .contains(&json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})));
    assert_eq!(status["incomplete"], false);
    let theirs = post_as(
        &r,
        &format!("{AUTHZ}/selfsubjectrulesreviews"),
        &rules,
        &[("Impersonate-User", "alice")],
    )
    .await;
    assert_eq!(theirs.status, 201, "{}", theirs.body);
    assert!(theirs.body["status"]["resourceRules"]
        .as_array()
        .unwrap()
        .contains(&json!({"verbs": ["create"],
            "apiGroups": ["authentication.k8s.io", "authorization.k8s.io"],
            "resources": ["selfsubjectreviews", "selfsubjectaccessreviews", "selfsubjectrulesreviews"]})),
        "{}", theirs.body);
    assert!(!theirs.body["status"]["resourceRules"]
        .as_array()
        .unwrap()
        .contains(&json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})));
    let no_ns = post(
        &r,
        &format!("{AUTHZ}/selfsubjectrulesreviews"),
        &json!({"spec": {}}),
    )
    .await;
    assert_eq!(no_ns.status, 400);
    assert_eq!(no_ns.body["message"], "no namespace on request");
    r.shutdown().await;
}

#[tokio::test]
async fn impersonating_groups_without_a_user_is_upstreams_500() {
    let r = start().await;
    let resp = call_with(
        &r,
        "GET",
        "/api/v1/namespaces?limit=1",
        None,
        None,
        &[("Impersonate-Group", "system:masters")],
    )
    .await;
    assert_eq!(resp.status, 500);
    assert_eq!(
        std::str::from_utf8(&resp.raw).unwrap(),
        "Internal Server Error: \"/api/v1/namespaces?limit=1\": requested [{Group  system:masters    }] without impersonating a user\n"
    );
    r.shutdown().await;
}

#[tokio::test]
async fn token_reviews_run_the_token_authenticators() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens.csv");
    std::fs::write(&file, "secret-1,carol,c-1,\"dev,ops\"\n").unwrap();
    let mut config = memory_config();
    config.authentication.token_auth_file = Some(file);
    let store = ApiServer::open_store(&config).await.unwrap();
    let r = ApiServer::new(config, store)
        .await
        .unwrap()
        .serve()
        .await
        .unwrap();
    let path = format!("{AUTHN}/tokenreviews");
    let review = |spec: Value| json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec});
    let good = post(&r, &path, &review(json!({"token": "secret-1"}))).await;
    assert_eq!(good.status, 201, "{}", good.body);
    let status = &good.body["status"];
    assert_eq!(status["authenticated"], true);
    assert_eq!(
        status["user"],
        json!({"username": "carol", "uid": "c-1", "groups": ["dev", "ops", "system:authenticated"]})
    );
    assert_eq!(
        status["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    let bad = post(&r, &path, &review(json!({"token": "nope"}))).await;
    assert_eq!(
        bad.body["status"],
        json!({"user": {}, "error": "invalid bearer token"})
    );
    // A token meant for another audience is not one this server's tokens can be.
    let elsewhere = post(
        &r,
        &path,
        &review(json!({"token": "secret-1", "audiences": ["vault"]})),
    )
    .await;
    assert_eq!(elsewhere.body["status"]["authenticated"], Value::Null);
    let empty = post(&r, &path, &review(json!({}))).await;
    assert_eq!(empty.status, 400);
    assert_eq!(
        empty.body["message"],
        "token is required for TokenReview in authentication"
    );
    r.shutdown().await;
}
