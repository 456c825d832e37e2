//! ServiceAccount tokens against the in-process server: the `serviceaccounts/token`
//! subresource (TokenRequest) with upstream's answers to bad requests, tokens the server's
//! authenticator accepts (asked through TokenReview) until their bound object is gone, and the
//! issuer's documents, whose key verifies the tokens.

mod common;

use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::authentication::serviceaccount::{jwt, key};

const SAS: &str = "/api/v1/namespaces/default/serviceaccounts";

async fn token_request(r: &setpoint_apiserver::server::Running, sa: &str, spec: Value) -> Resp {
    post(
        r,
        &format!("{SAS}/{sa}/token"),
        &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}),
    )
    .await
}

async fn review(r: &setpoint_apiserver::server::Running, token: &str) -> Value {
    let resp = post(
        r,
        "/apis/authentication.k8s.io/v1/tokenreviews",
        &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    resp.body["status"].clone()
}

#[tokio::test]
async fn token_requests_mint_tokens_the_server_accepts() {
    let r = start().await;
    let missing = token_request(&r, "bot", json!({})).await;
    assert_eq!(missing.status, 404, "{}", missing.body);
    assert_eq!(
        missing.body["message"],
        r#"serviceaccounts "bot" not found"#
    );

    let sa = post(&r, SAS, &json!({"metadata": {"name": "bot"}})).await;
    assert_eq!(sa.status, 201, "{}", sa.body);
    let sa_uid = sa.body["metadata"]["uid"].as_str().unwrap().to_string();
    let minted = token_request(&r, "bot", json!({})).await;
    assert_eq!(minted.status, 201, "{}", minted.body);
    assert_eq!(minted.body["kind"], "TokenRequest");
    assert_eq!(minted.body["spec"]["expirationSeconds"], 3600);
    assert_eq!(
        minted.body["spec"]["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    assert!(minted.body["status"]["expirationTimestamp"].is_string());
    let token = minted.body["status"]["token"].as_str().unwrap().to_string();

    let status = review(&r, &token).await;
    assert_eq!(status["authenticated"], true, "{status}");
    assert_eq!(
        status["user"]["username"],
        "system:serviceaccount:default:bot"
    );
    assert_eq!(status["user"]["uid"], sa_uid.as_str());
    let groups = status["user"]["groups"].as_array().unwrap();
    for g in [
        "system:serviceaccounts",
        "system:serviceaccounts:default",
        "system:authenticated",
    ] {
        assert!(groups.iter().any(|x| x == g), "{g} in {groups:?}");
    }

    // The issuer's keys verify the token.
    let jwks = get(&r, "/openid/v1/jwks").await;
    assert_eq!(jwks.status, 200);
    let parsed = jwt::parse(&token).unwrap();
    let jwk = &jwks.body["keys"][0];
    assert_eq!(jwk["kid"], parsed.header["kid"]);
    assert!(parsed.verify_with(&key::public_key_of_jwk(jwk).unwrap()));
    let config = get(&r, "/.well-known/openid-configuration").await;
    assert_eq!(config.status, 200);
    assert_eq!(
        config.body["issuer"],
        "https://kubernetes.default.svc.cluster.local"
    );

    // Discovery names the subresource and what it answers with.
    let v1 = get(&r, "/api/v1").await;
    let entry = v1.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "serviceaccounts/token")
        .cloned()
        .expect("serviceaccounts/token in discovery");
    assert_eq!(entry["kind"], "TokenRequest");
    assert_eq!(entry["group"], "authentication.k8s.io");
    assert_eq!(entry["verbs"], json!(["create"]));

    // Only POST.
    let wrong = get(&r, &format!("{SAS}/bot/token")).await;
    assert_eq!(wrong.status, 405, "{}", wrong.body);

    // Deleting the account ends its tokens.
    assert_eq!(delete(&r, &format!("{SAS}/bot")).await.status, 200);
    until_refused(&r, &token, "the token outlived its service account").await;
}

/// Waits (with a deadline) until the server no longer accepts `token`.
async fn until_refused(r: &setpoint_apiserver::server::Running, token: &str, what: &str) {
    setpoint_testing::eventually(what, || async {
        (review(r, token).await["authenticated"] != true).then_some(())
    })
    .await
}

#[tokio::test]
async fn bound_tokens_follow_their_object() {
    let r = start().await;
    post(&r, SAS, &json!({"metadata": {"name": "bot"}})).await;
    let pods = "/api/v1/namespaces/default/pods";
    let pod = |name: &str, sa: &str| {
        json!({"metadata": {"name": name},
               "spec": {"serviceAccountName": sa, "containers": [{"name": "c", "image": "busybox"}]}})
    };
    let p = post(&r, pods, &pod("p", "bot")).await;
    assert_eq!(p.status, 201, "{}", p.body);
    let pod_uid = p.body["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(post(&r, pods, &pod("other", "default")).await.status, 201);

    let bound = |kind: &str, name: &str, uid: &str| json!({"boundObjectRef": {"apiVersion": "v1", "kind": kind, "name": name, "uid": uid}});
    let e = token_request(&r, "bot", bound("Pod", "p", "not-its-uid")).await;
    assert_eq!(e.status, 409, "{}", e.body);
    assert_eq!(
        e.body["message"],
        r#"Operation cannot be fulfilled on Pod "p": the UID in the bound object reference (not-its-uid) does not match the UID in record. The object might have been deleted and then recreated"#
    );
    let e = token_request(&r, "bot", bound("Pod", "other", "")).await;
    assert_eq!(e.status, 400, "{}", e.body);
    assert_eq!(
        e.body["message"],
        r#"cannot bind token for serviceaccount "bot" to pod running with different serviceaccount name."#
    );
    let e = token_request(&r, "bot", bound("ConfigMap", "c", "")).await;
    assert_eq!(e.status, 400, "{}", e.body);
    assert_eq!(
        e.body["message"],
        "cannot bind token to object of type /v1, Kind=ConfigMap"
    );
    let e = token_request(&r, "bot", json!({"expirationSeconds": 60})).await;
    assert_eq!(e.status, 422, "{}", e.body);

    let minted = token_request(&r, "bot", bound("Pod", "p", &pod_uid)).await;
    assert_eq!(minted.status, 201, "{}", minted.body);
    assert_eq!(
        minted.body["spec"]["boundObjectRef"]["uid"],
        pod_uid.as_str()
    );
    let token = minted.body["status"]["token"].as_str().unwrap().to_string();
    let status = review(&r, &token).await;
    assert_eq!(status["authenticated"], true, "{status}");
    assert_eq!(
        status["user"]["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["p"])
    );
    assert_eq!(
        status["user"]["extra"]["authentication.kubernetes.io/pod-uid"],
        json!([pod_uid])
    );

    // Gone at once (an unscheduled pod is removed without a grace period): the token with it.
    let d = call(
        &r,
        "DELETE",
        &format!("{pods}/p?gracePeriodSeconds=0"),
        None,
        None,
    )
    .await;
    assert_eq!(d.status, 200, "{}", d.body);
    until_refused(&r, &token, "the token outlived its pod").await;

    // Bound to a node (`kubectl create token --bound-object-kind Node`).
    let node = post(&r, "/api/v1/nodes", &json!({"metadata": {"name": "n1"}})).await;
    assert_eq!(node.status, 201, "{}", node.body);
    let minted = token_request(&r, "bot", bound("Node", "n1", "")).await;
    assert_eq!(minted.status, 201, "{}", minted.body);
    let token = minted.body["status"]["token"].as_str().unwrap().to_string();
    let status = review(&r, &token).await;
    assert_eq!(status["authenticated"], true, "{status}");
    assert_eq!(
        status["user"]["extra"]["authentication.kubernetes.io/node-name"],
        json!(["n1"])
    );
    assert_eq!(delete(&r, "/api/v1/nodes/n1").await.status, 200);
    until_refused(&r, &token, "the token outlived its node").await;
}
