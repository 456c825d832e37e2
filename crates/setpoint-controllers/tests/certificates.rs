//! The CSR approving and signing controllers on a test cluster: a node client request is
//! approved after a SubjectAccessReview and signed by the cluster signing CA; an API client
//! request waits for a person's approval, then is signed.

use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value};
use setpoint_controllers::csrsigning::{SigningCa, DEFAULT_DURATION};
use setpoint_controllers::manager::Options;
use setpoint_runtime::client::Client;
use setpoint_runtime::decision::{self, DecisionRecord};
use setpoint_testing::{eventually, TestCluster};

const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

fn ca() -> SigningCa {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "signing-ca");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    SigningCa {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        max_duration: DEFAULT_DURATION,
    }
}

fn request(name: &str, cn: &str, org: &str, signer: &str) -> Value {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, org);
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(pem),
            "signerName": signer,
            "usages": ["digital signature", "key encipherment", "client auth"],
            "expirationSeconds": 3600,
        },
    })
}

async fn send(client: &Client, method: http::Method, path: &str, body: &Value) -> Value {
    client
        .request(
            method,
            path,
            Some("application/json"),
            Bytes::from(serde_json::to_vec(body).unwrap()),
        )
        .await
        .unwrap()
}

async fn get(client: &Client, name: &str) -> Value {
    client
        .request(
            http::Method::GET,
            &format!("{CSRS}/{name}"),
            None,
            Bytes::new(),
        )
        .await
        .unwrap()
}

/// The certificate, once issued, as (subject CN, issuer CN, lifetime in seconds).
fn issued(csr: &Value) -> Option<(String, String, i64)> {
    let b64 = csr.pointer("/status/certificate")?.as_str()?;
    let pem = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let (_, block) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let cert = block.parse_x509().ok()?;
    let cn = |n: &x509_parser::x509::X509Name| {
        n.iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let v = cert.validity();
    Some((
        cn(cert.subject()),
        cn(cert.issuer()),
        v.not_after.timestamp() - v.not_before.timestamp(),
    ))
}

/// The finished decision records of `controller` about the request `name`.
fn records(controller: &str, name: &str) -> Vec<std::sync::Arc<DecisionRecord>> {
    decision::ring().about(controller, name)
}

/// The first finished record of `controller` about `name` that took an action.
fn acted(controller: &str, name: &str) -> Option<std::sync::Arc<DecisionRecord>> {
    records(controller, name)
        .into_iter()
        .find(|r| !r.actions.is_empty())
}

/// No record of the CSR controllers carries PEM material.
fn assert_no_pem(name: &str) {
    for controller in ["csrapproving", "csrsigning"] {
        for r in records(controller, name) {
            let text = serde_json::to_string(&*r).unwrap();
            assert!(!text.contains("-----BEGIN"), "{text}");
        }
    }
}

#[tokio::test]
async fn node_client_requests_are_approved_and_signed_and_others_wait_for_a_person() {
    let c = TestCluster::start_with_controller_options(Options {
        cluster_signing: Some(ca()),
        ..Options::default()
    })
    .await;
    let client = c.client();
    let node = request(
        "node-csr",
        "system:node:n1",
        "system:nodes",
        "kubernetes.io/kube-apiserver-client-kubelet",
    );
    send(&client, http::Method::POST, CSRS, &node).await;
    let done = eventually("the node client certificate", || async {
        let csr = get(&client, "node-csr").await;
        issued(&csr).map(|cert| (csr, cert))
    })
    .await;
    let (csr, (subject, issuer, lifetime)) = done;
    assert_eq!(subject, "system:node:n1");
    assert_eq!(issuer, "signing-ca");
    assert_eq!(lifetime, 3600);
    let cond = &csr["status"]["conditions"][0];
    assert_eq!(cond["type"], "Approved");
    assert_eq!(cond["reason"], "AutoApproved");
    // Both decisions are recorded: what the request asks for, and the rule of each action.
    let (approving, signing) = eventually("the decision records of node-csr", || async {
        Some((
            acted("csrapproving", "node-csr")?,
            acted("csrsigning", "node-csr")?,
        ))
    })
    .await;
    assert!(
        approving.observed[0].starts_with(
            "signer kubernetes.io/kube-apiserver-client-kubelet, usages [digital signature, key encipherment, client auth], requestor "
        ),
        "{approving:?}"
    );
    assert!(
        approving.actions[0].action.starts_with("approve")
            && approving.actions[0]
                .rule
                .contains("may create certificatesigningrequests/"),
        "{approving:?}"
    );
    assert!(
        signing.observed[0].starts_with("signer kubernetes.io/kube-apiserver-client-kubelet"),
        "{signing:?}"
    );
    assert!(
        signing.actions[0].action.contains("(valid 3600s)")
            && signing.actions[0].rule.starts_with("approved"),
        "{signing:?}"
    );
    assert_no_pem("node-csr");

    // A user's client certificate is not approved automatically: it is signed once a person
    // approves it, and the only condition is theirs.
    let user = request(
        "alice-csr",
        "alice",
        "dev",
        "kubernetes.io/kube-apiserver-client",
    );
    let created = send(&client, http::Method::POST, CSRS, &user).await;
    let still = get(&client, "alice-csr").await;
    assert!(still["status"].get("conditions").is_none(), "{still}");
    let mut approve = created.clone();
    approve["status"]["conditions"] =
        json!([{"type": "Approved", "status": "True", "reason": "ByHand", "message": "ok"}]);
    send(
        &client,
        http::Method::PUT,
        &format!("{CSRS}/alice-csr/approval"),
        &approve,
    )
    .await;
    let (subject, issuer, _) = eventually("alice's certificate", || async {
        issued(&get(&client, "alice-csr").await)
    })
    .await;
    assert_eq!((subject.as_str(), issuer.as_str()), ("alice", "signing-ca"));
    let csr = get(&client, "alice-csr").await;
    assert_eq!(csr["status"]["conditions"].as_array().unwrap().len(), 1);
    assert_eq!(csr["status"]["conditions"][0]["reason"], "ByHand");
    // The approver said why it left the request to a person; the signer signed it.
    let signing = eventually("the signing record of alice-csr", || async {
        acted("csrsigning", "alice-csr")
    })
    .await;
    assert!(signing.actions[0].action.starts_with("sign"), "{signing:?}");
    // (Already approved by then, or not for the kubelet signer: the approver's reads may
    // coalesce with the person's approval.)
    eventually("the approver's reason to leave alice-csr alone", || async {
        records("csrapproving", "alice-csr")
            .iter()
            .any(|r| {
                r.observed
                    .iter()
                    .any(|o| o.starts_with("signer kubernetes.io/kube-apiserver-client,"))
                    && r.observed
                        .iter()
                        .any(|o| o.starts_with("not auto-approved: "))
                    && r.actions.is_empty()
            })
            .then_some(())
    })
    .await;
    assert_no_pem("alice-csr");
    c.stop().await;
}
