//! CertificateSigningRequests against the in-process server: validation, the requestor the
//! server records, `/approval` authorized by the `approve` verb on the signer, and `/status`.
//! Plain-HTTP callers are `system:masters`; other users are impersonated.

mod common;

use base64::Engine;
use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::server::Running;

const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

fn request_pem(cn: &str, org: &str) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, org);
    params.serialize_request(&key).unwrap().pem().unwrap()
}

fn csr(name: &str, signer: &str) -> Value {
    let pem = request_pem("system:node:n1", "system:nodes");
    json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(pem),
            "signerName": signer,
            "usages": ["client auth", "digital signature", "key encipherment"],
            "username": "someone-else",
        },
    })
}

async fn send_as(r: &Running, method: &str, path: &str, body: &Value, user: &str) -> Resp {
    call_with(
        r,
        method,
        path,
        Some("application/json"),
        Some(serde_json::to_vec(body).unwrap()),
        &[("Impersonate-User", user)],
    )
    .await
}

fn approved(mut obj: Value) -> Value {
    obj["status"]["conditions"] =
        json!([{"type": "Approved", "status": "True", "reason": "Test", "message": "ok"}]);
    obj
}

#[tokio::test]
async fn csrs_record_their_requestor_and_are_approved_through_approval() {
    let r = start().await;
    let created = post(&r, CSRS, &csr("c1", "kubernetes.io/kube-apiserver-client")).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["spec"]["username"], "system:apiserver");
    assert_eq!(created.body["status"], json!({}));

    // A main update changes neither spec nor conditions.
    let mut changed = approved(created.body.clone());
    changed["spec"]["signerName"] = json!("example.com/other");
    let put_main = put(&r, &format!("{CSRS}/c1"), &changed).await;
    assert_eq!(put_main.status, 200, "{}", put_main.body);
    assert_eq!(
        put_main.body["spec"]["signerName"],
        "kubernetes.io/kube-apiserver-client"
    );
    assert!(put_main.body["status"].get("conditions").is_none());

    let approval = put(&r, &format!("{CSRS}/c1/approval"), &approved(put_main.body)).await;
    assert_eq!(approval.status, 200, "{}", approval.body);
    let cond = &approval.body["status"]["conditions"][0];
    assert_eq!(cond["type"], "Approved");
    assert!(cond["lastUpdateTime"].is_string());

    // /status sets the certificate but cannot take the approval back.
    let mut status = approval.body.clone();
    status["status"]["certificate"] = json!("Y2VydA==");
    status["status"]["conditions"] = json!([]);
    let written = put(&r, &format!("{CSRS}/c1/status"), &status).await;
    assert_eq!(written.status, 200, "{}", written.body);
    assert_eq!(written.body["status"]["certificate"], "Y2VydA==");
    assert_eq!(written.body["status"]["conditions"][0]["type"], "Approved");

    // The table kubectl prints.
    let table = call_with(
        &r,
        "GET",
        CSRS,
        None,
        None,
        &[("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")],
    )
    .await;
    let names: Vec<&str> = table.body["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "Name",
            "Age",
            "SignerName",
            "Requestor",
            "RequestedDuration",
            "Condition"
        ]
    );
    let cells = &table.body["rows"][0]["cells"];
    assert_eq!(cells[3], "system:apiserver");
    assert_eq!(cells[5], "Approved,Issued");
    r.shutdown().await;
}

#[tokio::test]
async fn approving_needs_the_approve_verb_on_the_signer() {
    let r = start().await;
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "csr-approver"},
        "rules": [
            {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests", "certificatesigningrequests/approval"], "verbs": ["get", "list", "create", "update"]},
            {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"], "resourceNames": ["example.com/*"], "verbs": ["approve"]},
        ],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "csr-approver"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "csr-approver"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}],
    });
    for (path, body) in [
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", &role),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            &binding,
        ),
    ] {
        let resp = post(&r, path, body).await;
        assert_eq!(resp.status, 201, "{}", resp.body);
    }
    let mine = send_as(&r, "POST", CSRS, &csr("mine", "example.com/mine"), "alice").await;
    assert_eq!(mine.status, 201, "{}", mine.body);
    assert_eq!(mine.body["spec"]["username"], "alice");
    let kubelet = send_as(
        &r,
        "POST",
        CSRS,
        &csr("kubelet", "kubernetes.io/kube-apiserver-client-kubelet"),
        "alice",
    )
    .await;
    assert_eq!(kubelet.status, 201, "{}", kubelet.body);

    // The RBAC index follows the caches: wait until alice may approve her domain's signer.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let ok = send_as(
            &r,
            "PUT",
            &format!("{CSRS}/mine/approval"),
            &approved(mine.body.clone()),
            "alice",
        )
        .await;
        if ok.status == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", ok.body);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let refused = send_as(
        &r,
        "PUT",
        &format!("{CSRS}/kubelet/approval"),
        &approved(kubelet.body.clone()),
        "alice",
    )
    .await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(
        refused.body["message"],
        "certificatesigningrequests.certificates.k8s.io \"kubelet\" is forbidden: user not permitted to approve requests with signerName \"kubernetes.io/kube-apiserver-client-kubelet\""
    );
    r.shutdown().await;
}

#[tokio::test]
async fn invalid_requests_get_upstreams_messages() {
    let r = start().await;
    let mut bad = csr("bad", "");
    bad["spec"]["request"] = json!(base64::engine::general_purpose::STANDARD.encode("not a pem"));
    bad["spec"]["usages"] = json!(["flying"]);
    let resp = post(&r, CSRS, &bad).await;
    assert_eq!(resp.status, 422, "{}", resp.body);
    let causes: Vec<String> = resp.body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            format!(
                "{}: {}",
                c["field"].as_str().unwrap(),
                c["message"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        causes
            .iter()
            .any(|c| c.starts_with("spec.request: Invalid value")
                && c.ends_with("PEM block type must be CERTIFICATE REQUEST")),
        "{causes:?}"
    );
    assert!(
        causes
            .iter()
            .any(|c| c.starts_with("spec.usages[0]: Unsupported value: \"flying\"")),
        "{causes:?}"
    );
    assert!(
        causes.contains(&"spec.signerName: Required value".to_string()),
        "{causes:?}"
    );
    r.shutdown().await;
}
