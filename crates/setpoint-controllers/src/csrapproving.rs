//! The CSR approving controller (kube-controller-manager's `csrapproving`): approves node client
//! certificate requests that the requestor may have approved automatically.
//!
//! A pending request for the signer `kubernetes.io/kube-apiserver-client-kubelet` that is a
//! kubelet client request ([`validate_kubelet_client`]: `system:node:<name>` in `system:nodes`,
//! no alternative names, client usages) is approved when a SubjectAccessReview says its
//! requestor may `create` `certificatesigningrequests/selfnodeclient` (a node renewing its own
//! certificate: the requestor is the subject) or `certificatesigningrequests/nodeclient` (a
//! bootstrapper asking for a node's first certificate). Otherwise the request waits for a
//! person (`kubectl certificate approve`). [`recognize`] and [`approval`] are the decision.

use std::sync::Arc;

use bytes::Bytes;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{json, Value};
use setpoint_runtime::client::Client;
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::ObjectKey;

/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "csrapproving";
/// The signer of node (kubelet) client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The signer of API client certificates.
pub const API_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";
/// The prefix of a node's user name.
pub const NODE_USER_PREFIX: &str = "system:node:";
/// The group of nodes.
pub const NODES_GROUP: &str = "system:nodes";

/// What a PEM certificate request says, as far as the signers and approvers look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The subject's common name.
    pub common_name: String,
    /// The subject's organizations.
    pub organizations: Vec<String>,
    /// Whether the request asks for any subject alternative name (DNS, IP, email, URI).
    pub has_alt_names: bool,
}

/// Parses a PEM `CERTIFICATE REQUEST`.
pub fn parse_request(pem: &[u8]) -> Result<Request, String> {
    use x509_parser::prelude::*;
    let (_, block) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|e| format!("PEM block type must be CERTIFICATE REQUEST: {e}"))?;
    if block.label != "CERTIFICATE REQUEST" {
        return Err("PEM block type must be CERTIFICATE REQUEST".into());
    }
    let (_, csr) = X509CertificationRequest::from_der(&block.contents)
        .map_err(|e| format!("parsing the certificate request: {e}"))?;
    let subject = &csr.certification_request_info.subject;
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    let organizations = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    let has_alt_names = csr
        .requested_extensions()
        .into_iter()
        .flatten()
        .any(|ext| matches!(ext, ParsedExtension::SubjectAlternativeName(san) if !san.general_names.is_empty()));
    Ok(Request {
        common_name,
        organizations,
        has_alt_names,
    })
}

/// Upstream's `ValidateKubeletClientCSR`: why `request` with `usages` is not a node client
/// certificate request, if it is not.
pub fn validate_kubelet_client(request: &Request, usages: &[String]) -> Result<(), String> {
    if request.organizations != [NODES_GROUP] {
        return Err(format!("subject organization is not {NODES_GROUP}"));
    }
    if !request.common_name.starts_with(NODE_USER_PREFIX) {
        return Err(format!(
            "subject common name does not begin with {NODE_USER_PREFIX}"
        ));
    }
    if request.has_alt_names {
        return Err("subject alternative names are not allowed".into());
    }
    let mut set: Vec<&str> = usages.iter().map(String::as_str).collect();
    set.sort_unstable();
    set.dedup();
    let with_rsa = ["client auth", "digital signature", "key encipherment"];
    let without_rsa = ["client auth", "digital signature"];
    if set != with_rsa && set != without_rsa {
        return Err(format!(
            "usages did not match {:?}",
            ["digital signature", "key encipherment", "client auth"]
        ));
    }
    Ok(())
}

fn has_condition(csr: &CertificateSigningRequest, kind: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == kind))
}

/// Whether a person or a controller already decided, or the certificate is there.
pub fn decided(csr: &CertificateSigningRequest) -> bool {
    has_condition(csr, "Approved")
        || has_condition(csr, "Denied")
        || csr
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .is_some_and(|c| !c.0.is_empty())
}

/// What may approve `csr` automatically: the subresource of `certificatesigningrequests` its
/// requestor must be allowed to `create` (`selfnodeclient` or `nodeclient`) and the message of
/// the approval; `None` when it is not a node client request this controller approves.
pub fn recognize(csr: &CertificateSigningRequest) -> Option<(&'static str, &'static str)> {
    recognition(csr).ok()
}

/// [`recognize`], with the reason when it is not a request this controller approves.
pub fn recognition(
    csr: &CertificateSigningRequest,
) -> Result<(&'static str, &'static str), String> {
    if decided(csr) {
        return Err("already approved, denied or issued".into());
    }
    if csr.spec.signer_name != KUBELET_CLIENT_SIGNER {
        return Err(format!("the signer is not {KUBELET_CLIENT_SIGNER}"));
    }
    let request = parse_request(&csr.spec.request.0)?;
    let usages = csr.spec.usages.clone().unwrap_or_default();
    validate_kubelet_client(&request, &usages)?;
    if csr.spec.username.as_deref() == Some(request.common_name.as_str()) {
        Ok((
            "selfnodeclient",
            "Auto approving self kubelet client certificate after SubjectAccessReview.",
        ))
    } else {
        Ok((
            "nodeclient",
            "Auto approving kubelet client certificate after SubjectAccessReview.",
        ))
    }
}

/// The request's signer, usages and requestor, for decision records (never the request's
/// key material).
pub fn summary(csr: &CertificateSigningRequest) -> String {
    let spec = &csr.spec;
    format!(
        "signer {}, usages [{}], requestor {}",
        spec.signer_name,
        spec.usages.as_deref().unwrap_or_default().join(", "),
        spec.username.as_deref().unwrap_or("(none)"),
    )
}

/// The SubjectAccessReview asking whether `csr`'s requestor may `create`
/// `certificatesigningrequests/<subresource>`.
pub fn access_review(csr: &CertificateSigningRequest, subresource: &str) -> Value {
    let spec = &csr.spec;
    let mut review = json!({
        "user": spec.username.clone().unwrap_or_default(),
        "groups": spec.groups.clone().unwrap_or_default(),
        "resourceAttributes": {
            "group": "certificates.k8s.io",
            "resource": "certificatesigningrequests",
            "subresource": subresource,
            "verb": "create",
        },
    });
    if let Some(uid) = &spec.uid {
        review["uid"] = json!(uid);
    }
    if let Some(extra) = &spec.extra {
        review["extra"] = json!(extra);
    }
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": review})
}

/// `csr` with the `Approved` condition this controller adds.
pub fn approval(csr: &CertificateSigningRequest, message: &str) -> CertificateSigningRequest {
    let mut out = csr.clone();
    out.metadata.managed_fields = None;
    let now = Time(
        k8s_openapi::jiff::Timestamp::from_second(chrono::Utc::now().timestamp())
            .unwrap_or_default(),
    );
    out.status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new)
        .push(CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some("AutoApproved".into()),
            message: Some(message.into()),
            last_update_time: Some(now.clone()),
            last_transition_time: Some(now),
        });
    out
}

struct Approver {
    client: Client,
    csrs: Store<CertificateSigningRequest>,
}

#[async_trait::async_trait]
impl Reconciler for Approver {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(csr) = self.csrs.get(key) else {
            ctx.observe("the CertificateSigningRequest is gone");
            return Ok(Action::Done);
        };
        decision::observe_with(|| summary(&csr));
        let (subresource, message) = match recognition(&csr) {
            Ok(r) => r,
            Err(why) => {
                decision::observe_with(|| format!("not auto-approved: {why}"));
                return Ok(Action::Done);
            }
        };
        let review = access_review(&csr, subresource);
        let answer = self
            .client
            .request(
                http::Method::POST,
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                Some("application/json"),
                Bytes::from(serde_json::to_vec(&review).map_err(ReconcileError::terminal)?),
            )
            .await?;
        if answer.pointer("/status/allowed") != Some(&Value::Bool(true)) {
            tracing::debug!(csr = %key.name, subresource, "not auto-approving: the requestor may not");
            decision::observe_with(|| {
                format!("the requestor may not create certificatesigningrequests/{subresource} (SubjectAccessReview): left to a person")
            });
            return Ok(Action::Done);
        }
        ctx.action(
            "approve (condition Approved, reason AutoApproved)",
            format!("a node client request, and the requestor may create certificatesigningrequests/{subresource} (SubjectAccessReview)"),
        );
        let approved = approval(&csr, message);
        let body = serde_json::to_vec(&approved).map_err(ReconcileError::terminal)?;
        let path = format!(
            "/apis/certificates.k8s.io/v1/certificatesigningrequests/{}/approval",
            key.name
        );
        match self
            .client
            .request(
                http::Method::PUT,
                &path,
                Some("application/json"),
                body.into(),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(csr = %key.name, "approved a node client certificate request");
                Ok(Action::Done)
            }
            // Gone, or changed since the cache saw it: the next event brings it back.
            Err(e) if matches!(e.code(), Some(404 | 409)) => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

/// Builds the CSR approving controller.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = Approver {
        client,
        csrs: informers
            .typed::<CertificateSigningRequest>(Scope::all())
            .store(),
    };
    Controller::for_type::<CertificateSigningRequest>(NAME, informers, None)
        .build(Arc::new(reconciler))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::CertificateSigningRequestSpec;
    use k8s_openapi::ByteString;

    pub(crate) fn request_pem(cn: &str, org: &str, san: Option<&str>) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(san.map(|s| vec![s.to_string()]).unwrap_or_default())
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, org);
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    pub(crate) fn csr(
        pem: &str,
        signer: &str,
        user: &str,
        usages: &[&str],
    ) -> CertificateSigningRequest {
        CertificateSigningRequest {
            spec: CertificateSigningRequestSpec {
                request: ByteString(pem.as_bytes().to_vec()),
                signer_name: signer.into(),
                username: Some(user.into()),
                groups: Some(vec!["system:bootstrappers".into()]),
                usages: Some(usages.iter().map(|u| u.to_string()).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    const USAGES: &[&str] = &["digital signature", "key encipherment", "client auth"];

    #[test]
    fn node_client_requests_are_recognized_by_requestor() {
        let pem = request_pem("system:node:n1", "system:nodes", None);
        let bootstrap = csr(
            &pem,
            KUBELET_CLIENT_SIGNER,
            "system:bootstrap:abcdef",
            USAGES,
        );
        assert_eq!(recognize(&bootstrap).unwrap().0, "nodeclient");
        let renewal = csr(&pem, KUBELET_CLIENT_SIGNER, "system:node:n1", USAGES);
        assert_eq!(recognize(&renewal).unwrap().0, "selfnodeclient");
        let review = access_review(&bootstrap, "nodeclient");
        assert_eq!(review["spec"]["user"], "system:bootstrap:abcdef");
        assert_eq!(
            review["spec"]["resourceAttributes"]["subresource"],
            "nodeclient"
        );

        // Other signers, subjects, names and usages wait for a person.
        assert!(recognize(&csr(&pem, API_CLIENT_SIGNER, "u", USAGES)).is_none());
        let masters = request_pem("system:node:n1", "system:masters", None);
        assert!(recognize(&csr(&masters, KUBELET_CLIENT_SIGNER, "u", USAGES)).is_none());
        let user = request_pem("alice", "system:nodes", None);
        assert!(recognize(&csr(&user, KUBELET_CLIENT_SIGNER, "u", USAGES)).is_none());
        let san = request_pem("system:node:n1", "system:nodes", Some("n1.example.com"));
        assert!(recognize(&csr(&san, KUBELET_CLIENT_SIGNER, "u", USAGES)).is_none());
        let serving = csr(
            &pem,
            KUBELET_CLIENT_SIGNER,
            "u",
            &["digital signature", "server auth"],
        );
        assert!(recognize(&serving).is_none());

        // Decided requests are left alone.
        let approved = approval(&bootstrap, "ok");
        assert!(decided(&approved));
        assert!(recognize(&approved).is_none());
        let cond = &approved.status.unwrap().conditions.unwrap()[0];
        assert_eq!(
            (cond.type_.as_str(), cond.reason.as_deref()),
            ("Approved", Some("AutoApproved"))
        );
    }
}
