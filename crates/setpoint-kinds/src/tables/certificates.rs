//! The printer for `certificates.k8s.io` CertificateSigningRequests: who asked which signer for
//! how long, and where the request stands.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{age, arr_at, at, col, human_duration, name_cell, str_at, Column, AGE, NAME};

/// CertificateSigningRequest.
pub(super) const CSR: &[Column] = &[
    NAME,
    AGE,
    col("SignerName", "string", "The signer the request is for."),
    col("Requestor", "string", "Who created the request."),
    col(
        "RequestedDuration",
        "string",
        "The duration the request asks the certificate to be valid for.",
    ),
    col("Condition", "string", "Where the request stands."),
];

pub(super) fn csr(r: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let duration = match at(r, "spec.expirationSeconds").and_then(Value::as_i64) {
        Some(s) => human_duration(chrono::Duration::seconds(s)),
        None => "<none>".to_string(),
    };
    vec![
        name_cell(r),
        age(r, now),
        Value::from(str_at(r, "spec.signerName")),
        Value::from(str_at(r, "spec.username")),
        Value::from(duration),
        Value::from(condition(r)),
    ]
}

/// `Denied` over `Approved` over `Pending`, then `,Failed` and `,Issued` as they apply, as
/// upstream's printer says it.
pub fn condition(r: &Value) -> String {
    let has = |kind: &str| {
        arr_at(r, "status.conditions")
            .iter()
            .any(|c| str_at(c, "type") == kind)
    };
    let mut out = if has("Denied") {
        "Denied".to_string()
    } else if has("Approved") {
        "Approved".to_string()
    } else {
        "Pending".to_string()
    };
    if has("Failed") {
        out.push_str(",Failed");
    }
    if !str_at(r, "status.certificate").is_empty() {
        out.push_str(",Issued");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_say_who_asked_and_where_it_stands() {
        let now = chrono::Utc::now();
        let created = (now - chrono::Duration::seconds(30)).to_rfc3339();
        let csr = json!({
            "metadata": {"name": "node-csr-1", "creationTimestamp": created},
            "spec": {"signerName": "kubernetes.io/kube-apiserver-client-kubelet", "username": "system:bootstrap:abcdef", "expirationSeconds": 86400},
            "status": {"conditions": [{"type": "Approved", "status": "True"}], "certificate": "Zm9v"},
        });
        let cells = super::csr(&csr, now);
        assert_eq!(cells[2], "kubernetes.io/kube-apiserver-client-kubelet");
        assert_eq!(cells[3], "system:bootstrap:abcdef");
        assert_eq!(cells[4], "24h");
        assert_eq!(cells[5], "Approved,Issued");
        let pending = json!({"metadata": {"name": "x"}, "spec": {}});
        assert_eq!(super::csr(&pending, now)[4], "<none>");
        assert_eq!(condition(&pending), "Pending");
        let denied = json!({"status": {"conditions": [{"type": "Denied"}, {"type": "Failed"}]}});
        assert_eq!(condition(&denied), "Denied,Failed");
    }
}
