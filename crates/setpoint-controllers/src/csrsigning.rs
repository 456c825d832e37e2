//! The CSR signing controller (kube-controller-manager's `csrsigning`): signs approved
//! requests for `kubernetes.io/kube-apiserver-client-kubelet` and
//! `kubernetes.io/kube-apiserver-client` with the cluster CA
//! (`--cluster-signing-cert-file`/`--cluster-signing-key-file`).
//!
//! A request the signer cannot honour (a kubelet signer request that is not a node client
//! request, usages a client certificate cannot have) gets a `Failed` condition, as upstream's.
//! The certificate is valid from five minutes ago (clocks differ) for the request's
//! `expirationSeconds` (at least 10 minutes) or the signer's maximum
//! (`--cluster-signing-duration`, a year by default), whichever is shorter. [`sign`] is the
//! decision and the signature.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::ByteString;
use setpoint_runtime::client::{Api, Client, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::decision;
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::ObjectKey;

use crate::csrapproving::{
    parse_request, summary, validate_kubelet_client, API_CLIENT_SIGNER, KUBELET_CLIENT_SIGNER,
};

/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "csrsigning";
/// `--cluster-signing-duration`'s default: a year.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far before now a certificate becomes valid, for clocks that lag (upstream's backdate).
const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// The shortest validity a request may ask for.
const MIN_DURATION: Duration = Duration::from_secs(600);

/// The CA the controller signs with and the longest validity it gives.
#[derive(Clone)]
pub struct SigningCa {
    /// The CA certificate (PEM).
    pub cert_pem: String,
    /// The CA's private key (PEM).
    pub key_pem: String,
    /// `--cluster-signing-duration`.
    pub max_duration: Duration,
}

impl std::fmt::Debug for SigningCa {
    // The key stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningCa")
            .field("max_duration", &self.max_duration)
            .finish_non_exhaustive()
    }
}

impl SigningCa {
    /// Reads the CA from the files of `--cluster-signing-cert-file` and `-key-file`.
    pub fn load(
        cert: &std::path::Path,
        key: &std::path::Path,
        max_duration: Duration,
    ) -> Result<SigningCa, String> {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()))
        };
        let ca = SigningCa {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
            max_duration,
        };
        ca.issuer_key()?;
        Ok(ca)
    }

    fn issuer_key(&self) -> Result<rcgen::KeyPair, String> {
        rcgen::KeyPair::from_pem(&self.key_pem).map_err(|e| format!("the CA key: {e}"))
    }
}

/// What the signer does with a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not this signer's, not approved, failed or already signed: nothing.
    Skip,
    /// The signer refuses: a `Failed` condition with this message.
    Fail(String),
    /// The certificate (PEM).
    Signed(String),
}

fn has_condition(csr: &CertificateSigningRequest, kind: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == kind))
}

/// The certificate's validity: `expirationSeconds` (at least 10 minutes) capped by the
/// signer's maximum.
pub fn duration(expiration_seconds: Option<i32>, max: Duration) -> Duration {
    match expiration_seconds {
        Some(s) => Duration::from_secs(u64::try_from(s).unwrap_or(0))
            .max(MIN_DURATION)
            .min(max),
        None => max,
    }
}

/// Why the signer leaves `csr` alone ([`Outcome::Skip`]), if it does: another signer's, not
/// approved, denied, failed or already issued.
pub fn skip_reason(csr: &CertificateSigningRequest) -> Option<&'static str> {
    let signer = csr.spec.signer_name.as_str();
    if signer != KUBELET_CLIENT_SIGNER && signer != API_CLIENT_SIGNER {
        return Some("not a signer this controller signs for");
    }
    let issued = csr
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty());
    if !has_condition(csr, "Approved") {
        Some("not approved")
    } else if has_condition(csr, "Denied") {
        Some("denied")
    } else if has_condition(csr, "Failed") {
        Some("failed")
    } else if issued {
        Some("the certificate is issued already")
    } else {
        None
    }
}

/// Decides and signs `csr` at `now` (seconds since the epoch).
pub fn sign(csr: &CertificateSigningRequest, ca: &SigningCa, now: u64) -> Outcome {
    if skip_reason(csr).is_some() {
        return Outcome::Skip;
    }
    let signer = csr.spec.signer_name.as_str();
    let usages = csr.spec.usages.clone().unwrap_or_default();
    let request = match parse_request(&csr.spec.request.0) {
        Ok(r) => r,
        Err(e) => return Outcome::Fail(e),
    };
    if signer == KUBELET_CLIENT_SIGNER {
        if let Err(e) = validate_kubelet_client(&request, &usages) {
            return Outcome::Fail(e);
        }
    }
    let mut key_usages = Vec::new();
    for usage in &usages {
        match usage.as_str() {
            "digital signature" => key_usages.push(rcgen::KeyUsagePurpose::DigitalSignature),
            "key encipherment" => key_usages.push(rcgen::KeyUsagePurpose::KeyEncipherment),
            "client auth" => {}
            other => {
                return Outcome::Fail(format!("invalid usage for client certificate: {other}"))
            }
        }
    }
    let pem = String::from_utf8_lossy(&csr.spec.request.0).into_owned();
    let mut params = match rcgen::CertificateSigningRequestParams::from_pem(&pem) {
        Ok(p) => p,
        Err(e) => return Outcome::Fail(format!("the certificate request: {e}")),
    };
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let not_before = epoch + Duration::from_secs(now.saturating_sub(BACKDATE.as_secs()));
    let p = &mut params.params;
    p.not_before = not_before;
    p.not_after = not_before + duration(csr.spec.expiration_seconds, ca.max_duration);
    p.is_ca = rcgen::IsCa::ExplicitNoCa;
    p.key_usages = key_usages;
    p.extended_key_usages = if usages.iter().any(|u| u == "client auth") {
        vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth]
    } else {
        vec![]
    };
    p.subject_alt_names.clear();
    p.use_authority_key_identifier_extension = true;
    let mut serial = [0u8; 16];
    for (i, b) in uuid_bytes().iter().enumerate() {
        serial[i] = *b;
    }
    serial[0] &= 0x7f;
    p.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
    let key = match ca.issuer_key() {
        Ok(k) => k,
        Err(e) => return Outcome::Fail(e),
    };
    let issuer = match rcgen::Issuer::from_ca_cert_pem(&ca.cert_pem, &key) {
        Ok(i) => i,
        Err(e) => return Outcome::Fail(format!("the CA certificate: {e}")),
    };
    match params.signed_by(&issuer) {
        Ok(cert) => Outcome::Signed(cert.pem()),
        Err(e) => Outcome::Fail(format!("signing: {e}")),
    }
}

/// 16 random bytes for a serial number.
fn uuid_bytes() -> [u8; 16] {
    let mut out = [0u8; 16];
    let rng = ring::rand::SystemRandom::new();
    // A failing system RNG leaves zeros; the serial is then still unique enough by time.
    if ring::rand::SecureRandom::fill(&rng, &mut out).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        out = t.to_be_bytes();
    }
    out
}

struct Signer {
    client: Client,
    ca: SigningCa,
    csrs: Store<CertificateSigningRequest>,
}

#[async_trait::async_trait]
impl Reconciler for Signer {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(csr) = self.csrs.get(key) else {
            ctx.observe("the CertificateSigningRequest is gone");
            return Ok(Action::Done);
        };
        decision::observe_with(|| summary(&csr));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let mut out = (*csr).clone();
        out.metadata.managed_fields = None;
        let status = out.status.get_or_insert_with(Default::default);
        match sign(&csr, &self.ca, now) {
            Outcome::Skip => {
                decision::observe_with(|| {
                    format!("not signing: {}", skip_reason(&csr).unwrap_or_default())
                });
                return Ok(Action::Done);
            }
            Outcome::Signed(pem) => {
                if ctx.recording() {
                    let valid = duration(csr.spec.expiration_seconds, self.ca.max_duration);
                    ctx.action(
                        format!(
                            "sign: update status with the certificate (valid {}s)",
                            valid.as_secs()
                        ),
                        "approved, and a valid client certificate request for this signer",
                    );
                }
                status.certificate = Some(ByteString(pem.into_bytes()))
            }
            Outcome::Fail(message) => {
                tracing::info!(csr = %key.name, %message, "refusing to sign");
                ctx.action(
                    "update status: condition Failed (SignerValidationFailure)",
                    format!("the signer cannot honour the request: {message}"),
                );
                let t = Time(
                    k8s_openapi::jiff::Timestamp::from_second(chrono::Utc::now().timestamp())
                        .unwrap_or_default(),
                );
                status.conditions.get_or_insert_with(Vec::new).push(
                    CertificateSigningRequestCondition {
                        type_: "Failed".into(),
                        status: "True".into(),
                        reason: Some("SignerValidationFailure".into()),
                        message: Some(message),
                        last_update_time: Some(t.clone()),
                        last_transition_time: Some(t),
                    },
                );
            }
        }
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        match api
            .replace_status(&key.name, &PostParams::default(), &out)
            .await
        {
            Ok(_) => Ok(Action::Done),
            Err(e) if matches!(e.code(), Some(404 | 409)) => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

/// Builds the CSR signing controller for the CA `ca`.
pub fn controller(client: Client, informers: &SharedInformers, ca: SigningCa) -> Controller {
    let reconciler = Signer {
        client,
        ca,
        csrs: informers
            .typed::<CertificateSigningRequest>(Scope::all())
            .store(),
    };
    Controller::for_type::<CertificateSigningRequest>(NAME, informers, None)
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csrapproving::approval;
    use crate::csrapproving::tests::{csr, request_pem};

    fn ca() -> SigningCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "test-ca");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        SigningCa {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            max_duration: DEFAULT_DURATION,
        }
    }

    const USAGES: &[&str] = &["digital signature", "key encipherment", "client auth"];

    #[test]
    fn approved_node_client_requests_are_signed_for_their_duration() {
        let ca = ca();
        let pem = request_pem("system:node:n1", "system:nodes", None);
        let mut request = csr(&pem, KUBELET_CLIENT_SIGNER, "system:bootstrap:a", USAGES);
        request.spec.expiration_seconds = Some(3600);
        assert_eq!(
            sign(&request, &ca, 2_000_000_000),
            Outcome::Skip,
            "not approved"
        );
        let approved = approval(&request, "ok");
        let Outcome::Signed(cert) = sign(&approved, &ca, 2_000_000_000) else {
            panic!("not signed");
        };
        let (_, block) = x509_parser::pem::parse_x509_pem(cert.as_bytes()).unwrap();
        let parsed = block.parse_x509().unwrap();
        let cn = parsed.subject().iter_common_name().next().unwrap();
        assert_eq!(cn.as_str().unwrap(), "system:node:n1");
        let org = parsed.subject().iter_organization().next().unwrap();
        assert_eq!(org.as_str().unwrap(), "system:nodes");
        let validity = parsed.validity();
        assert_eq!(validity.not_before.timestamp(), 2_000_000_000 - 300);
        assert_eq!(validity.not_after.timestamp(), 2_000_000_000 - 300 + 3600);
        let issuer = parsed.issuer().iter_common_name().next().unwrap();
        assert_eq!(issuer.as_str().unwrap(), "test-ca");
    }

    #[test]
    fn requests_the_signer_cannot_honour_fail() {
        let ca = ca();
        let user = request_pem("alice", "dev", None);
        let wrong = approval(&csr(&user, KUBELET_CLIENT_SIGNER, "u", USAGES), "ok");
        assert!(
            matches!(sign(&wrong, &ca, 2_000_000_000), Outcome::Fail(m) if m.contains("system:nodes"))
        );
        let server = approval(
            &csr(
                &user,
                API_CLIENT_SIGNER,
                "u",
                &["digital signature", "server auth"],
            ),
            "ok",
        );
        assert_eq!(
            sign(&server, &ca, 2_000_000_000),
            Outcome::Fail("invalid usage for client certificate: server auth".into())
        );
        let client = approval(&csr(&user, API_CLIENT_SIGNER, "u", USAGES), "ok");
        assert!(matches!(
            sign(&client, &ca, 2_000_000_000),
            Outcome::Signed(_)
        ));
        let other = approval(&csr(&user, "example.com/x", "u", USAGES), "ok");
        assert_eq!(sign(&other, &ca, 2_000_000_000), Outcome::Skip);
    }

    #[test]
    fn durations_are_capped_both_ways() {
        let year = DEFAULT_DURATION;
        assert_eq!(duration(None, year), year);
        assert_eq!(duration(Some(60), year), Duration::from_secs(600));
        assert_eq!(duration(Some(7200), year), Duration::from_secs(7200));
        assert_eq!(duration(Some(i32::MAX), year), year);
    }
}
