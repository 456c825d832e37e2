//! `certificates.k8s.io/v1` CertificateSigningRequests: what the server owns of them, as
//! upstream's CSR strategies and its `CertificateApproval` and `CertificateSigning` admission
//! plugins decide it.
//!
//! - On create, `spec.username`, `uid`, `groups` and `extra` are the caller's, whatever the
//!   body said, and the status starts empty.
//! - Main updates change neither spec nor status; `/status` changes the certificate and the
//!   conditions other than Approved and Denied; `/approval` changes the conditions only.
//! - Writing `/approval` needs the `approve` verb on the `signers` resource named by the
//!   request's signer (or `<domain>/*`); setting the certificate through `/status` needs `sign`.

use std::sync::Arc;

use serde_json::{json, Map, Value};
use setpoint_api::ApiError;

use crate::authentication::UserInfo;
use crate::authorization::{Attributes, Decision};
use crate::registry::ResourceDef;
use crate::state::ApiServer;

/// The API group of CertificateSigningRequests and signers.
pub const GROUP: &str = "certificates.k8s.io";

/// Whether `res` is the CertificateSigningRequest resource.
pub fn is_csr(res: &ResourceDef) -> bool {
    res.group == GROUP && res.plural == "certificatesigningrequests" && res.custom.is_none()
}

/// Records the creator in a new CSR's spec (`None` is the server itself, which keeps what the
/// body says).
pub fn prepare_for_create(res: &ResourceDef, obj: &mut Value, user: Option<&UserInfo>) {
    if !is_csr(res) {
        return;
    }
    let Some(user) = user else {
        return;
    };
    let Some(spec) = obj
        .as_object_mut()
        .map(|o| o.entry("spec").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for field in ["username", "uid", "groups", "extra"] {
        spec.remove(field);
    }
    spec.insert("username".into(), json!(user.username));
    if !user.uid.is_empty() {
        spec.insert("uid".into(), json!(user.uid));
    }
    if !user.groups.is_empty() {
        spec.insert("groups".into(), json!(user.groups));
    }
    if !user.extra.is_empty() {
        spec.insert("extra".into(), json!(user.extra));
    }
}

/// A main update keeps the spec (the status is kept for every kind with a status subresource).
pub fn prepare_for_update(res: &ResourceDef, new: &mut Value, old: &Value) {
    if !is_csr(res) {
        return;
    }
    if let (Some(obj), Some(spec)) = (new.as_object_mut(), old.get("spec")) {
        obj.insert("spec".into(), spec.clone());
    }
}

fn conditions(obj: &Value) -> Vec<Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn is_decision(c: &Value) -> bool {
    matches!(
        c.get("type").and_then(Value::as_str),
        Some("Approved" | "Denied")
    )
}

/// A `/status` write of a CSR (after the generic one took the new status): the Approved and
/// Denied conditions stay as they were, since only `/approval` decides.
pub fn status_update(res: &ResourceDef, new: &mut Value, old: &Value, now: &str) {
    if !is_csr(res) {
        return;
    }
    let mut kept: Vec<Value> = conditions(old).into_iter().filter(is_decision).collect();
    kept.extend(conditions(new).into_iter().filter(|c| !is_decision(c)));
    set_conditions(new, kept, old, now);
}

/// The stored CSR for an `/approval` write: the old object with the new conditions.
pub fn apply_approval(old: &Value, desired: &Value, now: &str) -> Value {
    let mut out = old.clone();
    set_conditions(&mut out, conditions(desired), old, now);
    if let Some(rv) = desired.pointer("/metadata/resourceVersion") {
        if let Some(m) = out.get_mut("metadata").and_then(Value::as_object_mut) {
            m.insert("resourceVersion".into(), rv.clone());
        }
    }
    out
}

/// Sets the conditions, filling in their times as upstream's `populateConditionTimestamps`:
/// `lastUpdateTime` now when unset, `lastTransitionTime` the old one when the status did not
/// change, else now.
fn set_conditions(obj: &mut Value, mut conds: Vec<Value>, old: &Value, now: &str) {
    let old_conds = conditions(old);
    for c in &mut conds {
        let Some(m) = c.as_object_mut() else {
            continue;
        };
        if m.get("lastUpdateTime").is_none_or(Value::is_null) {
            m.insert("lastUpdateTime".into(), json!(now));
        }
        if m.get("lastTransitionTime").is_none_or(Value::is_null) {
            let same = old_conds
                .iter()
                .find(|o| o.get("type") == m.get("type") && o.get("status") == m.get("status"))
                .and_then(|o| o.get("lastTransitionTime"))
                .filter(|t| !t.is_null());
            let t = same.cloned().unwrap_or_else(|| json!(now));
            m.insert("lastTransitionTime".into(), t);
        }
    }
    let Some(o) = obj.as_object_mut() else {
        return;
    };
    let status = o
        .entry("status")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(s) = status.as_object_mut() {
        if conds.is_empty() {
            s.remove("conditions");
        } else {
            s.insert("conditions".into(), Value::Array(conds));
        }
    }
}

/// The attributes of `verb` on the signer `name`.
fn signer_attributes(user: &Arc<UserInfo>, verb: &str, name: &str) -> Attributes {
    let mut a = Attributes::non_resource(user.clone(), &http::Method::POST, "");
    a.verb = verb.to_string();
    a.resource_request = true;
    a.api_group = GROUP.to_string();
    a.api_version = "*".to_string();
    a.resource = "signers".to_string();
    a.name = name.to_string();
    a
}

/// Upstream's `IsAuthorizedForSignerName`: `verb` on the signer itself, or on all of its
/// domain's signers (`<domain>/*`).
pub fn authorized_for_signer(
    decide: impl Fn(&Attributes) -> Decision,
    user: &Arc<UserInfo>,
    verb: &str,
    signer: &str,
) -> bool {
    if decide(&signer_attributes(user, verb, signer)) == Decision::Allow {
        return true;
    }
    let Some((domain, _)) = signer.split_once('/') else {
        return false;
    };
    decide(&signer_attributes(user, verb, &format!("{domain}/*"))) == Decision::Allow
}

impl ApiServer {
    /// The `CertificateApproval` and `CertificateSigning` admission checks of an `/approval`
    /// (`approving`) or `/status` write of a CSR by `user` (`None`: the server itself).
    pub(crate) fn check_csr_write(
        &self,
        res: &ResourceDef,
        approving: bool,
        new: &Value,
        old: &Value,
        user: Option<&Arc<UserInfo>>,
    ) -> Result<(), ApiError> {
        if !is_csr(res) {
            return Ok(());
        }
        let Some(user) = user else {
            return Ok(());
        };
        let verb = if approving {
            "approve"
        } else if new.pointer("/status/certificate") != old.pointer("/status/certificate") {
            "sign"
        } else {
            return Ok(());
        };
        let signer = new
            .pointer("/spec/signerName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if authorized_for_signer(|a| self.authorizers.decide(a), user, verb, signer) {
            return Ok(());
        }
        let name = new
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        Err(ApiError::forbidden(
            &res.group_resource(),
            name,
            &format!("user not permitted to {verb} requests with signerName {signer:?}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> Arc<UserInfo> {
        Arc::new(UserInfo::authenticated("u", vec![]))
    }

    #[test]
    fn a_signer_is_authorized_by_name_or_by_domain_wildcard() {
        let only = |allowed: &'static str| {
            move |a: &Attributes| {
                if a.resource == "signers" && a.verb == "approve" && a.name == allowed {
                    Decision::Allow
                } else {
                    Decision::NoOpinion
                }
            }
        };
        let signer = "example.com/my-signer";
        assert!(authorized_for_signer(
            only(signer),
            &user(),
            "approve",
            signer
        ));
        assert!(authorized_for_signer(
            only("example.com/*"),
            &user(),
            "approve",
            signer
        ));
        assert!(!authorized_for_signer(
            only("other.com/*"),
            &user(),
            "approve",
            signer
        ));
        assert!(!authorized_for_signer(
            only(signer),
            &user(),
            "sign",
            signer
        ));
    }

    #[test]
    fn approval_changes_only_conditions_and_status_keeps_decisions() {
        let now = "2030-01-01T00:00:00Z";
        let old = json!({"metadata": {"name": "c"}, "spec": {"signerName": "a.io/b"}, "status": {"certificate": "Zm9v"}});
        let desired = json!({"metadata": {"name": "c"}, "spec": {"signerName": "evil.io/x"}, "status": {"certificate": "YmFy", "conditions": [{"type": "Approved", "status": "True", "reason": "ok"}]}});
        let approved = apply_approval(&old, &desired, now);
        assert_eq!(approved["spec"]["signerName"], "a.io/b");
        assert_eq!(approved["status"]["certificate"], "Zm9v");
        assert_eq!(approved["status"]["conditions"][0]["reason"], "ok");
        assert_eq!(approved["status"]["conditions"][0]["lastUpdateTime"], now);
        assert_eq!(
            approved["status"]["conditions"][0]["lastTransitionTime"],
            now
        );

        let res = crate::registry::Registry::builtin()
            .get(GROUP, "v1", "certificatesigningrequests")
            .unwrap()
            .clone();
        let mut status = json!({"status": {"certificate": "YmFy", "conditions": [{"type": "Denied", "status": "True"}, {"type": "Failed", "status": "True"}]}});
        status_update(&res, &mut status, &approved, "2030-01-02T00:00:00Z");
        let types: Vec<&str> = status["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["Approved", "Failed"]);
        assert_eq!(
            status["status"]["conditions"][0]["lastTransitionTime"], now,
            "an unchanged condition keeps its time"
        );
    }

    #[test]
    fn the_creator_is_recorded_whatever_the_body_says() {
        let res = crate::registry::Registry::builtin()
            .get(GROUP, "v1", "certificatesigningrequests")
            .unwrap()
            .clone();
        let mut obj = json!({"spec": {"username": "admin", "groups": ["system:masters"]}});
        let mut u = UserInfo::authenticated(
            "system:bootstrap:abcdef",
            vec!["system:bootstrappers".into()],
        );
        u.extra.insert("k".into(), vec!["v".into()]);
        prepare_for_create(&res, &mut obj, Some(&u));
        assert_eq!(
            obj["spec"],
            json!({"username": "system:bootstrap:abcdef", "groups": ["system:bootstrappers", "system:authenticated"], "extra": {"k": ["v"]}})
        );
    }
}
