//! `AdmissionReview` (`admission.k8s.io/v1`, or `v1beta1` for a webhook that lists only
//! that): the request a webhook receives and what its answer may say, checked as upstream's
//! `VerifyAdmissionResponse` does. Pure.

use base64::Engine;
use serde_json::{json, Value};
use setpoint_api::status::ApiError;

use super::matching::Resource;

/// What a webhook said.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Verdict {
    pub allowed: bool,
    /// The answer's `status` (its `message`, `reason` and `code` explain a refusal).
    pub status: Value,
    /// RFC 6902 operations, for mutating webhooks.
    pub patch: Option<Vec<Value>>,
    pub warnings: Vec<String>,
    pub audit_annotations: Vec<(String, String)>,
}

/// The `request` of an `AdmissionReview` for a call that matched `matched` (the request's own
/// resource or an equivalent one), with the object and old object as that resource shows them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn request(
    uid: &str,
    matched: &Resource,
    requested: &Resource,
    subresource: &str,
    operation: &str,
    namespace: &str,
    name: &str,
    object: Option<&Value>,
    old_object: Option<&Value>,
    dry_run: bool,
    user: Option<&crate::authentication::UserInfo>,
    options: &Value,
) -> Value {
    let gvk = |r: &Resource| json!({"group": r.group, "version": r.version, "kind": r.kind});
    let gvr =
        |r: &Resource| json!({"group": r.group, "version": r.version, "resource": r.resource});
    let mut req = json!({
        "uid": uid,
        "kind": gvk(matched),
        "resource": gvr(matched),
        "requestKind": gvk(requested),
        "requestResource": gvr(requested),
        "name": name,
        "operation": operation,
        "userInfo": user.map(|u| {
            let mut info = json!({"username": u.username});
            if !u.uid.is_empty() {
                info["uid"] = json!(u.uid);
            }
            if !u.groups.is_empty() {
                info["groups"] = json!(u.groups);
            }
            if !u.extra.is_empty() {
                info["extra"] = json!(u.extra);
            }
            info
        }).unwrap_or_else(|| json!({})),
        "object": object.cloned().unwrap_or(Value::Null),
        "oldObject": old_object.cloned().unwrap_or(Value::Null),
        "dryRun": dry_run,
        "options": options,
    });
    if !namespace.is_empty() {
        req["namespace"] = json!(namespace);
    }
    if !subresource.is_empty() {
        req["subResource"] = json!(subresource);
        req["requestSubResource"] = json!(subresource);
    }
    req
}

/// The `AdmissionReview` versions this server sends, in the order it prefers them.
const REVIEW_VERSIONS: &[&str] = &["v1", "v1beta1"];

/// The `AdmissionReview` version webhook `spec` is sent: the first of its
/// `admissionReviewVersions` this server sends, as upstream picks it (validation makes sure
/// one is listed; `v1` otherwise).
pub(crate) fn version_for(spec: &Value) -> &'static str {
    spec.get("admissionReviewVersions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|v| REVIEW_VERSIONS.iter().copied().find(|known| *known == v))
        .unwrap_or(REVIEW_VERSIONS[0])
}

/// The whole review sent to a webhook, in `version` (`v1` or `v1beta1`).
pub(crate) fn review(request: Value, version: &str) -> Value {
    json!({
        "apiVersion": format!("admission.k8s.io/{version}"),
        "kind": "AdmissionReview",
        "request": request,
    })
}

/// Reads a webhook's answer to the request `uid`, sent as a `version` review; the error is
/// the reason upstream gives after `received invalid webhook response: `. A `v1beta1` answer
/// is checked as loosely as upstream checks one: its kind, version and `response.uid` are not
/// looked at, a mutating webhook's patch is taken as a JSON Patch whatever its `patchType`,
/// and a validating webhook's is ignored.
pub(crate) fn verdict(
    body: &[u8],
    uid: &str,
    mutating: bool,
    version: &str,
) -> Result<Verdict, String> {
    let review: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if version == "v1beta1" {
        let Some(response) = review.get("response").filter(|r| r.is_object()) else {
            return Err("webhook response was absent".into());
        };
        let patch = match response.get("patch").and_then(Value::as_str) {
            Some(b64) if mutating && !b64.is_empty() => Some(json_patch(b64)?),
            _ => None,
        };
        return Ok(answer_of(response, patch));
    }
    let (api_version, kind) = (
        review
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or(""),
        review.get("kind").and_then(Value::as_str).unwrap_or(""),
    );
    if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
        return Err(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {api_version}, Kind={kind}"
        ));
    }
    let Some(response) = review.get("response").filter(|r| r.is_object()) else {
        return Err("webhook response was absent".into());
    };
    let got = response.get("uid").and_then(Value::as_str).unwrap_or("");
    if got != uid {
        return Err(format!("expected response.uid=\"{uid}\", got \"{got}\""));
    }
    let patch_type = response.get("patchType").and_then(Value::as_str);
    let patch = match response.get("patch").and_then(Value::as_str) {
        None | Some("") => {
            if let Some(t) = patch_type {
                return Err(format!("webhook returned patchType {t} but not patch"));
            }
            None
        }
        Some(b64) => {
            if !mutating {
                return Err("validating webhook may not return response.patch".into());
            }
            match patch_type {
                Some("JSONPatch") => {}
                None => {
                    return Err("webhook returned response.patch but not response.patchType".into())
                }
                Some(other) => {
                    return Err(format!(
                        "webhook returned invalid response.patchType of {other:?}"
                    ))
                }
            }
            Some(json_patch(b64)?)
        }
    };
    Ok(answer_of(response, patch))
}

/// A `response.patch`: base64 of a JSON Patch.
fn json_patch(b64: &str) -> Result<Vec<Value>, String> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("response.patch is not base64: {e}"))?;
    serde_json::from_slice(&raw).map_err(|e| format!("response.patch is not a JSON patch: {e}"))
}

/// The verdict a checked `response` gives, with its `patch`.
fn answer_of(response: &Value, patch: Option<Vec<Value>>) -> Verdict {
    let allowed = response
        .get("allowed")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let warnings = response
        .get("warnings")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(String::from)
        .collect();
    let audit_annotations = response
        .get("auditAnnotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
        .collect();
    Verdict {
        allowed,
        status: response.get("status").cloned().unwrap_or(Value::Null),
        patch,
        warnings,
        audit_annotations,
    }
}

/// Upstream's `ToStatusErr`: a webhook's refusal, with its code (at least 400) and reason,
/// and the message `admission webhook "<name>" denied the request: <message>`.
pub(crate) fn denial(webhook: &str, status: &Value) -> ApiError {
    let denied = format!("admission webhook \"{webhook}\" denied the request");
    let text = |k: &str| status.get(k).and_then(Value::as_str).unwrap_or("");
    let message = if !text("message").is_empty() {
        format!("{denied}: {}", text("message"))
    } else if !text("reason").is_empty() {
        format!("{denied}: {}", text("reason"))
    } else {
        format!("{denied} without explanation")
    };
    let code = status
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (400..600).contains(c))
        .unwrap_or(400);
    ApiError::new(code, text("reason"), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(response: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1",
                                   "kind": "AdmissionReview", "response": response}))
        .unwrap()
    }

    #[test]
    fn an_answer_must_name_the_request() {
        let body = answer(json!({"uid": "other", "allowed": true}));
        assert_eq!(
            verdict(&body, "u1", false, "v1").unwrap_err(),
            "expected response.uid=\"u1\", got \"other\""
        );
        let ok = verdict(
            &answer(json!({"uid": "u1", "allowed": true})),
            "u1",
            false,
            "v1",
        )
        .unwrap();
        assert!(ok.allowed);
    }

    #[test]
    fn patches_come_base64_encoded_as_json_patch() {
        let ops = json!([{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]);
        let b64 = base64::engine::general_purpose::STANDARD.encode(ops.to_string());
        let body = answer(json!({"uid": "u", "allowed": true, "patch": b64,
                                 "patchType": "JSONPatch", "warnings": ["w1"],
                                 "auditAnnotations": {"k": "v"}}));
        let v = verdict(&body, "u", true, "v1").unwrap();
        assert_eq!(v.patch, Some(ops.as_array().unwrap().clone()));
        assert_eq!(v.warnings, vec!["w1".to_string()]);
        assert_eq!(
            v.audit_annotations,
            vec![("k".to_string(), "v".to_string())]
        );
        assert!(
            verdict(&body, "u", false, "v1").is_err(),
            "validating webhooks may not patch"
        );
    }

    #[test]
    fn v1beta1_is_sent_only_to_webhooks_without_v1_and_answered_loosely() {
        let spec = |versions: Value| json!({"admissionReviewVersions": versions});
        assert_eq!(version_for(&spec(json!(["v1beta1"]))), "v1beta1");
        assert_eq!(
            version_for(&spec(json!(["v2", "v1beta1", "v1"]))),
            "v1beta1"
        );
        assert_eq!(version_for(&spec(json!(["v1", "v1beta1"]))), "v1");
        assert_eq!(
            review(json!({"uid": "u"}), "v1beta1")["apiVersion"],
            "admission.k8s.io/v1beta1"
        );
        let ops = json!([{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]);
        let b64 = base64::engine::general_purpose::STANDARD.encode(ops.to_string());
        // No kind, version, uid or patchType: all fine in v1beta1, not in v1.
        let body = serde_json::to_vec(
            &json!({"response": {"allowed": true, "patch": b64, "warnings": ["w"]}}),
        )
        .unwrap();
        let v = verdict(&body, "u", true, "v1beta1").unwrap();
        assert!(v.allowed);
        assert_eq!(v.patch, Some(ops.as_array().unwrap().clone()));
        assert_eq!(v.warnings, vec!["w".to_string()]);
        assert_eq!(verdict(&body, "u", false, "v1beta1").unwrap().patch, None);
        assert!(verdict(&body, "u", true, "v1").is_err());
        assert_eq!(
            verdict(b"{}", "u", true, "v1beta1").unwrap_err(),
            "webhook response was absent"
        );
    }

    #[test]
    fn denials_read_as_upstreams() {
        let e = denial(
            "x.example.com",
            &json!({"message": "no forbidden keys", "code": 403}),
        );
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "admission webhook \"x.example.com\" denied the request: no forbidden keys"
        );
        let e = denial("x.example.com", &Value::Null);
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "admission webhook \"x.example.com\" denied the request without explanation"
        );
    }
}
