//! Bootstrap tokens against the in-process server: a `bootstrap-token-<id>` Secret in
//! `kube-system` makes `<id>.<secret>` a bearer token of `system:bootstrap:<id>`, and the
//! bootstrap policy lets bootstrappers ask for node client certificates.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const AUTHN: &str = "/apis/authentication.k8s.io/v1";
const AUTHZ: &str = "/apis/authorization.k8s.io/v1";

fn review(token: &str) -> Value {
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
}

fn token_secret(id: &str, expiration: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": id,
            "token-secret": "0123456789abcdef",
            "usage-bootstrap-authentication": "true",
            "auth-extra-groups": "system:bootstrappers:worker",
            "expiration": expiration,
        },
    })
}

/// The TokenReview status of `token`, once the authenticator's cache answers `settled`.
async fn review_until(
    r: &setpoint_apiserver::server::Running,
    token: &str,
    settled: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp = post(r, &format!("{AUTHN}/tokenreviews"), &review(token)).await;
        assert_eq!(resp.status, 201, "{}", resp.body);
        let status = resp.body["status"].clone();
        if settled(&status) || Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_bootstrap_secret_makes_its_token_valid_until_it_expires() {
    let r = start().await;
    let token = "abcdef.0123456789abcdef";
    let before = review_until(&r, token, |_| true).await;
    assert_eq!(before["authenticated"], Value::Null);

    let future = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let created = post(
        &r,
        "/api/v1/namespaces/kube-system/secrets",
        &token_secret("abcdef", &future),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let status = review_until(&r, token, |s| s["authenticated"] == true).await;
    assert_eq!(
        status["user"],
        json!({
            "username": "system:bootstrap:abcdef",
            "groups": ["system:bootstrappers", "system:bootstrappers:worker", "system:authenticated"],
        })
    );
    // Another secret for the same id is not the token.
    let wrong = review_until(&r, "abcdef.0123456789abcdee", |_| true).await;
    assert_eq!(wrong["authenticated"], Value::Null);

    // An expired token is refused.
    let past = (chrono::Utc::now() - chrono::Duration::seconds(1)).to_rfc3339();
    let created = post(
        &r,
        "/api/v1/namespaces/kube-system/secrets",
        &token_secret("expird", &past),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let expired = review_until(&r, "expird.0123456789abcdef", |s| {
        s["error"].is_string() && s["authenticated"].is_null()
    })
    .await;
    assert_eq!(expired["authenticated"], Value::Null);
    assert!(expired["error"].is_string(), "{expired}");
    r.shutdown().await;
}

#[tokio::test]
async fn bootstrappers_may_request_node_client_certificates_and_nodes_renew_them() {
    let r = start().await;
    let can = |user: &str, group: &str, resource: &str, subresource: &str, verb: &str| {
        json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": [group, "system:authenticated"],
                "resourceAttributes": {
                    "group": "certificates.k8s.io",
                    "resource": resource,
                    "subresource": subresource,
                    "verb": verb,
                },
            },
        })
    };
    let path = format!("{AUTHZ}/subjectaccessreviews");
    for (user, group, resource, sub, verb, allowed) in [
        (
            "system:bootstrap:abcdef",
            "system:bootstrappers",
            "certificatesigningrequests",
            "",
            "create",
            true,
        ),
        (
            "system:bootstrap:abcdef",
            "system:bootstrappers",
            "certificatesigningrequests",
            "",
            "watch",
            true,
        ),
        (
            "system:bootstrap:abcdef",
            "system:bootstrappers",
            "certificatesigningrequests",
            "nodeclient",
            "create",
            true,
        ),
        (
            "system:bootstrap:abcdef",
            "system:bootstrappers",
            "certificatesigningrequests",
            "selfnodeclient",
            "create",
            false,
        ),
        (
            "system:bootstrap:abcdef",
            "system:bootstrappers",
            "certificatesigningrequests",
            "approval",
            "update",
            false,
        ),
        (
            "system:node:n1",
            "system:nodes",
            "certificatesigningrequests",
            "selfnodeclient",
            "create",
            true,
        ),
        (
            "someone",
            "dev",
            "certificatesigningrequests",
            "nodeclient",
            "create",
            false,
        ),
    ] {
        let resp = post(&r, &path, &can(user, group, resource, sub, verb)).await;
        assert_eq!(resp.status, 201, "{}", resp.body);
        assert_eq!(
            resp.body["status"]["allowed"], allowed,
            "{user} {verb} {resource}/{sub}: {}",
            resp.body
        );
    }
    r.shutdown().await;
}
