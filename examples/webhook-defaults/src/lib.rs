//! Admission webhooks for a `Website` custom resource (`example.com/v1`), the two a
//! kubebuilder project generates for a kind:
//!
//! - **defaulting** (a mutating webhook at [`MUTATE_PATH`]): a Website without
//!   `spec.replicas` gets 1 and without `spec.port` gets 8080, as JSON Patch operations
//!   ([`defaults`]);
//! - **validating** (at [`VALIDATE_PATH`]): `spec.replicas` from 1 to 10, a port from 1 to
//!   65535, and an image pinned to a tag other than `latest` or to a digest ([`validate`]).
//!
//! [`answer`] turns an `AdmissionReview` request into its response; the binary serves it over
//! HTTPS, and the tests serve it from the test process with `setpoint-testing`'s
//! `WebhookServer`. [`crd`] and [`webhook_configurations`] are what a cluster needs to call
//! them.

use base64::Engine;
use serde_json::{json, Value};

/// The group of the Website resource.
pub const GROUP: &str = "example.com";
/// Where the defaulting webhook is served.
pub const MUTATE_PATH: &str = "/mutate-example-com-v1-website";
/// Where the validating webhook is served.
pub const VALIDATE_PATH: &str = "/validate-example-com-v1-website";
/// The most replicas a Website may ask for.
pub const MAX_REPLICAS: i64 = 10;
/// The replica count a Website without one gets.
pub const DEFAULT_REPLICAS: i64 = 1;
/// The port a Website without one gets.
pub const DEFAULT_PORT: i64 = 8080;

/// The Website CustomResourceDefinition: `spec.image` (required), `spec.replicas`,
/// `spec.port`.
pub fn crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("websites.{GROUP}")},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "websites", "singular": "website", "kind": "Website",
                      "shortNames": ["web"]},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "required": ["image"], "properties": {
                        "image": {"type": "string"},
                        "replicas": {"type": "integer"},
                        "port": {"type": "integer"}}}}}},
                "additionalPrinterColumns": [
                    {"name": "Image", "type": "string", "jsonPath": ".spec.image"},
                    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}]
            }]
        }
    })
}

/// The JSON Patch operations that fill in what `website` leaves out.
pub fn defaults(website: &Value) -> Vec<Value> {
    let spec = website.get("spec");
    let missing = |field: &str| spec.and_then(|s| s.get(field)).is_none_or(Value::is_null);
    let mut ops = Vec::new();
    if spec.is_none_or(|s| !s.is_object()) {
        ops.push(json!({"op": "add", "path": "/spec", "value": {}}));
    }
    if missing("replicas") {
        ops.push(json!({"op": "add", "path": "/spec/replicas", "value": DEFAULT_REPLICAS}));
    }
    if missing("port") {
        ops.push(json!({"op": "add", "path": "/spec/port", "value": DEFAULT_PORT}));
    }
    ops
}

/// Why `website` is refused, if it is.
pub fn validate(website: &Value) -> Result<(), String> {
    let spec = website.get("spec").unwrap_or(&Value::Null);
    let mut problems = Vec::new();
    if let Some(r) = spec.get("replicas").and_then(Value::as_i64) {
        if !(1..=MAX_REPLICAS).contains(&r) {
            problems.push(format!(
                "spec.replicas: {r} is not between 1 and {MAX_REPLICAS}"
            ));
        }
    }
    if let Some(p) = spec.get("port").and_then(Value::as_i64) {
        if !(1..=65535).contains(&p) {
            problems.push(format!("spec.port: {p} is not a port number"));
        }
    }
    let image = spec.get("image").and_then(Value::as_str).unwrap_or("");
    if !image_is_pinned(image) {
        problems.push(format!(
            "spec.image: {image:?} must name a tag other than \"latest\", or a digest"
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Whether an image reference names a digest or a tag other than `latest`.
fn image_is_pinned(image: &str) -> bool {
    if image.contains('@') {
        return true;
    }
    // The tag follows the last ':' after the last '/' (a registry's port comes before it).
    let last = image.rsplit('/').next().unwrap_or(image);
    matches!(last.rsplit_once(':'), Some((_, tag)) if !tag.is_empty() && tag != "latest")
}

/// The `response` of an `AdmissionReview` whose `request` reached `path`.
pub fn answer(path: &str, request: &Value) -> Value {
    let uid = request.get("uid").cloned().unwrap_or(Value::Null);
    let object = request.get("object").unwrap_or(&Value::Null);
    match path {
        MUTATE_PATH => {
            let ops = defaults(object);
            if ops.is_empty() {
                return json!({"uid": uid, "allowed": true});
            }
            let patch =
                base64::engine::general_purpose::STANDARD.encode(Value::Array(ops).to_string());
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": patch})
        }
        VALIDATE_PATH => match validate(object) {
            Ok(()) => json!({"uid": uid, "allowed": true}),
            Err(message) => json!({"uid": uid, "allowed": false, "status": {
                "code": 403, "reason": "Forbidden", "message": message}}),
        },
        other => json!({"uid": uid, "allowed": false, "status": {
            "code": 404, "message": format!("no webhook is served at {other}")}}),
    }
}

/// The webhook configurations pointing at the two webhooks: `client_config(path)` is the
/// `clientConfig` of the webhook at `path` (a `url` or `service`, and the `caBundle`).
pub fn webhook_configurations(client_config: impl Fn(&str) -> Value) -> [Value; 2] {
    let rules = json!([{"operations": ["CREATE", "UPDATE"], "apiGroups": [GROUP],
                        "apiVersions": ["v1"], "resources": ["websites"]}]);
    let hook = |name: &str, path: &str| {
        json!({"name": name, "sideEffects": "None", "admissionReviewVersions": ["v1"],
               "failurePolicy": "Fail", "clientConfig": client_config(path), "rules": rules})
    };
    [
        json!({"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "MutatingWebhookConfiguration",
               "metadata": {"name": "website-defaults"},
               "webhooks": [hook("mwebsite.example.com", MUTATE_PATH)]}),
        json!({"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "ValidatingWebhookConfiguration",
               "metadata": {"name": "website-validation"},
               "webhooks": [hook("vwebsite.example.com", VALIDATE_PATH)]}),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_fields_are_defaulted_and_given_ones_kept() {
        let ops = defaults(&json!({"spec": {"image": "nginx:1.27"}}));
        assert_eq!(
            ops,
            vec![
                json!({"op": "add", "path": "/spec/replicas", "value": 1}),
                json!({"op": "add", "path": "/spec/port", "value": 8080}),
            ]
        );
        assert!(defaults(&json!({"spec": {"replicas": 3, "port": 80}})).is_empty());
        assert_eq!(defaults(&json!({}))[0]["path"], "/spec");
    }

    #[test]
    fn validation_names_every_problem() {
        assert!(validate(&json!({"spec": {"image": "nginx:1.27", "replicas": 2}})).is_ok());
        assert!(validate(&json!({"spec": {"image": "registry:5000/nginx@sha256:ab"}})).is_ok());
        let err = validate(&json!({"spec": {"image": "registry:5000/nginx", "replicas": 11}}))
            .unwrap_err();
        assert_eq!(
            err,
            "spec.replicas: 11 is not between 1 and 10; spec.image: \"registry:5000/nginx\" must name a tag other than \"latest\", or a digest"
        );
        assert!(validate(&json!({"spec": {"image": "nginx:latest"}})).is_err());
    }

    #[test]
    fn answers_carry_the_uid_and_a_base64_patch() {
        let request = json!({"uid": "u", "object": {"spec": {"image": "nginx:1"}}});
        let a = answer(MUTATE_PATH, &request);
        assert_eq!(
            (a["uid"].as_str(), a["allowed"].as_bool()),
            (Some("u"), Some(true))
        );
        let patch = base64::engine::general_purpose::STANDARD
            .decode(a["patch"].as_str().unwrap())
            .unwrap();
        let ops: Value = serde_json::from_slice(&patch).unwrap();
        assert_eq!(ops.as_array().unwrap().len(), 2);
        let denied = answer(
            VALIDATE_PATH,
            &json!({"uid": "u", "object": {"spec": {"image": "nginx"}}}),
        );
        assert_eq!(denied["allowed"], false);
        assert_eq!(denied["status"]["code"], 403);
    }
}
