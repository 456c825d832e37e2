//! `certificates.k8s.io/v1` CertificateSigningRequests, with the rules and messages of
//! upstream's `pkg/apis/certificates/validation`.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};
use setpoint_api::Cause;

use super::fields::{arr, at, index, int, not_supported, s};

/// The key usages a CSR may ask for (upstream's `allValidUsages`).
pub const VALID_USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// The message of a signer name that is not `<domain>/<path>`.
const SIGNER_FORM: &str =
    "must be a fully qualified domain and path of the form 'example.com/signer-name'";

/// The DER of a PEM `CERTIFICATE REQUEST` block, or upstream's error text.
pub fn csr_der(pem: &[u8]) -> Result<Vec<u8>, String> {
    const WRONG: &str = "PEM block type must be CERTIFICATE REQUEST";
    let text = std::str::from_utf8(pem).map_err(|_| WRONG.to_string())?;
    let begin = "-----BEGIN CERTIFICATE REQUEST-----";
    let end = "-----END CERTIFICATE REQUEST-----";
    let start = text.find(begin).ok_or(WRONG)? + begin.len();
    let stop = text[start..].find(end).ok_or(WRONG)? + start;
    let body: String = text[start..stop].split_whitespace().collect();
    STANDARD.decode(body).map_err(|_| WRONG.to_string())
}

/// Whether `der` is a PKCS#10 certification request; the reason when it is not.
pub fn parse_request(der: &[u8]) -> Result<(), String> {
    use x509_parser::prelude::FromDer;
    match x509_parser::certification_request::X509CertificationRequest::from_der(der) {
        Ok(([], _)) => Ok(()),
        Ok(_) => Err("x509: trailing data after certificate request".into()),
        Err(e) => Err(format!("x509: malformed certificate request: {e}")),
    }
}

/// A CertificateSigningRequest. `parse_request` checks the DER of the request, answering
/// with the reason it is not a CSR.
pub(super) fn csr(
    e: &mut Vec<Cause>,
    obj: &Value,
    old: Option<&Value>,
    parse_request: fn(&[u8]) -> Result<(), String>,
) {
    let spec = at(obj, "spec");
    let request = s(spec, "request");
    // On updates only status changes (the server keeps the spec), so the request was checked
    // when it was created.
    if old.is_none() {
        let pem = STANDARD.decode(request).unwrap_or_default();
        if let Err(reason) = csr_der(&pem).and_then(|der| parse_request(&der)) {
            e.push(Cause::invalid("spec.request", &json!(request), &reason));
        }
    }
    let usages = arr(spec, "usages");
    if usages.is_empty() {
        e.push(Cause::required("spec.usages", "usages must be provided"));
    }
    let mut seen = Vec::new();
    for (i, usage) in usages.iter().enumerate() {
        let usage = usage.as_str().unwrap_or_default();
        if !VALID_USAGES.contains(&usage) {
            not_supported(e, index("spec.usages", i), usage, VALID_USAGES);
        } else if old.is_none() && seen.contains(&usage) {
            e.push(Cause::duplicate(index("spec.usages", i), &json!(usage)));
        }
        seen.push(usage);
    }
    signer_name(e, s(spec, "signerName"));
    if let Some(seconds) = int(spec, "expirationSeconds") {
        if seconds < 600 {
            e.push(Cause::invalid(
                "spec.expirationSeconds",
                &json!(seconds),
                "may not specify a duration less than 600 seconds (10 minutes)",
            ));
        }
    }
    conditions(e, obj);
}

/// `ValidateSignerName`: `<fully qualified domain>/<path>`.
fn signer_name(e: &mut Vec<Cause>, name: &str) {
    const PATH: &str = "spec.signerName";
    if name.is_empty() {
        e.push(Cause::required(PATH, ""));
        return;
    }
    let Some((domain, path)) = name.split_once('/') else {
        e.push(Cause::invalid(PATH, &json!(name), SIGNER_FORM));
        return;
    };
    if path.is_empty() || !domain.contains('.') {
        e.push(Cause::invalid(PATH, &json!(name), SIGNER_FORM));
        return;
    }
    if setpoint_api::names::is_dns1123_subdomain(domain).is_err() {
        e.push(Cause::invalid(PATH, &json!(name), SIGNER_FORM));
        return;
    }
    if path.len() > 571 - domain.len() || path.split('/').any(|seg| seg.is_empty()) {
        e.push(Cause::invalid(PATH, &json!(name), SIGNER_FORM));
    }
}

/// Status conditions: a type each, Approved and Denied exclusive and only `True`, no type twice.
fn conditions(e: &mut Vec<Cause>, obj: &Value) {
    let mut seen: Vec<&str> = Vec::new();
    for (i, c) in arr(at(obj, "status"), "conditions").iter().enumerate() {
        let path = index("status.conditions", i);
        let kind = s(c, "type");
        if kind.is_empty() {
            e.push(Cause::required(format!("{path}.type"), ""));
            continue;
        }
        if matches!(kind, "Approved" | "Denied") && s(c, "status") != "True" {
            not_supported(e, format!("{path}.status"), s(c, "status"), &["True"]);
        }
        let other = match kind {
            "Approved" => Some("Denied"),
            "Denied" => Some("Approved"),
            _ => None,
        };
        if other.is_some_and(|o| seen.contains(&o)) {
            e.push(Cause::invalid(
                format!("{path}.type"),
                &json!(kind),
                "Approved and Denied conditions are mutually exclusive",
            ));
        }
        if seen.contains(&kind) {
            e.push(Cause::duplicate(format!("{path}.type"), &json!(kind)));
        }
        seen.push(kind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(_: &[u8]) -> Result<(), String> {
        Ok(())
    }

    fn pem_b64() -> String {
        STANDARD.encode(
            "-----BEGIN CERTIFICATE REQUEST-----\nMAA=\n-----END CERTIFICATE REQUEST-----\n",
        )
    }

    fn check(spec: Value, status: Value) -> Vec<Cause> {
        let mut e = Vec::new();
        csr(&mut e, &json!({"spec": spec, "status": status}), None, ok);
        e
    }

    #[test]
    fn a_good_request_passes() {
        let e = check(
            json!({"request": pem_b64(), "signerName": "kubernetes.io/kube-apiserver-client", "usages": ["client auth"], "expirationSeconds": 600}),
            json!({}),
        );
        assert!(e.is_empty(), "{e:?}");
    }

    #[test]
    fn upstreams_messages() {
        let e = check(
            json!({"request": STANDARD.encode("nope"), "usages": ["client auth", "client auth", "flying"], "expirationSeconds": 60}),
            json!({"conditions": [{"type": "Approved", "status": "True"}, {"type": "Denied", "status": "False"}]}),
        );
        let got: Vec<(String, String)> = e
            .iter()
            .map(|c| (c.field.clone(), c.message.clone()))
            .collect();
        let want = [
            (
                "spec.request",
                "Invalid value: \"bm9wZQ==\": PEM block type must be CERTIFICATE REQUEST",
            ),
            ("spec.usages[1]", "Duplicate value: \"client auth\""),
            ("spec.usages[2]", "Unsupported value: \"flying\""),
            ("spec.signerName", "Required value"),
            (
                "spec.expirationSeconds",
                "Invalid value: 60: may not specify a duration less than 600 seconds (10 minutes)",
            ),
            (
                "status.conditions[1].status",
                "Unsupported value: \"False\": supported values: \"True\"",
            ),
            (
                "status.conditions[1].type",
                "Invalid value: \"Denied\": Approved and Denied conditions are mutually exclusive",
            ),
        ];
        for (field, prefix) in want {
            assert!(
                got.iter().any(|(f, m)| f == field && m.starts_with(prefix)),
                "{field}: {prefix} not in {got:?}"
            );
        }
    }

    #[test]
    fn signer_names_are_domain_and_path() {
        for (name, good) in [
            ("kubernetes.io/kube-apiserver-client", true),
            ("example.com/a/b", true),
            ("example.com", false),
            ("example/signer", false),
            ("example.com/", false),
            ("Example..com/x", false),
        ] {
            let mut e = Vec::new();
            signer_name(&mut e, name);
            assert_eq!(e.is_empty(), good, "{name}: {e:?}");
        }
    }
}
