//! Kubernetes `Status` errors: every failed request answers with one, with the HTTP code equal
//! to `code` and a machine-readable `reason` that clients (kubectl, client-go, kopf) act on.

use serde_json::{json, Map, Value};

use crate::GroupResource;

/// One cause of an `Invalid` (or conflict) error: which field, why, and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`, `FieldValueDuplicate`,
    /// `FieldValueForbidden`, `FieldValueTooLong`, `FieldManagerConflict`, …
    pub reason: String,
    /// `StatusCause.message`: the human-readable explanation, without the field path.
    pub message: String,
    /// The field path, e.g. `metadata.name` or `spec.template.spec.containers[0].image`.
    pub field: String,
}

impl Cause {
    /// A cause with the given `reason` (a `metav1.CauseType` such as `FieldValueInvalid`),
    /// field path and message, taken as they are.
    pub fn new(reason: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause {
            reason: reason.into(),
            field: field.into(),
            message: message.into(),
        }
    }
    /// `field: Invalid value: <value>: <detail>`, as Kubernetes words it.
    pub fn invalid(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        let field = field.into();
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        Cause::new(
            "FieldValueInvalid",
            field,
            format!("Invalid value: {shown}: {detail}"),
        )
    }
    /// `field: Required value[: detail]`.
    pub fn required(field: impl Into<String>, detail: &str) -> Self {
        let msg = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        Cause::new("FieldValueRequired", field, msg)
    }
    /// `field: Unsupported value: <value>: supported values: "a", "b"`.
    pub fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Cause::new(
            "FieldValueNotSupported",
            field,
            format!(
                "Unsupported value: {value}: supported values: {}",
                list.join(", ")
            ),
        )
    }
    /// `field: Forbidden: <detail>`.
    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        Cause::new("FieldValueForbidden", field, format!("Forbidden: {detail}"))
    }
    /// `field: Duplicate value: <value>`.
    pub fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        Cause::new(
            "FieldValueDuplicate",
            field,
            format!("Duplicate value: {value}"),
        )
    }
    /// `field: Too long: may not be more than N bytes` (or a custom detail).
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        Cause::new(
            "FieldValueTooLong",
            field,
            format!("Too long: may not be more than {max} bytes"),
        )
    }
    /// `field: Invalid value: <value>: field is immutable`.
    pub fn immutable(field: impl Into<String>, value: &Value) -> Self {
        Cause::invalid(field, value, "field is immutable")
    }

    /// `metav1.StatusCause`, whose fields are all `omitempty`: a cause about no field (such as
    /// `ResourceVersionTooLarge`) has no `field`.
    fn to_json(&self) -> Value {
        let mut m = Map::new();
        for (k, v) in [
            ("reason", &self.reason),
            ("message", &self.message),
            ("field", &self.field),
        ] {
            if !v.is_empty() {
                m.insert(k.into(), json!(v));
            }
        }
        Value::Object(m)
    }
}

/// A failed API request, rendered as a `metav1.Status`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// `Status.code`: the HTTP status code the response carries (404, 409, 422, …).
    pub code: u16,
    /// `Status.reason`: the machine-readable `metav1.StatusReason` (`NotFound`, `AlreadyExists`,
    /// `Conflict`, `Invalid`, …) clients branch on.
    pub reason: String,
    /// `Status.message`: the human-readable description kubectl prints.
    pub message: String,
    /// `Status.details`, when the error names an object, carries causes or a retry delay;
    /// boxed to keep the error small.
    pub details: Option<Box<Details>>,
}

/// `Status.details`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Details {
    /// `details.name`: the name of the object the error is about; empty if none.
    pub name: String,
    /// `details.group`: the API group of that object's resource; empty for the core group.
    pub group: String,
    /// `details.kind`: the kind or, as upstream fills it for most errors, the resource
    /// (`deployments`); empty if none.
    pub kind: String,
    /// `details.uid`: the UID of the object, when the error is about one; empty otherwise.
    pub uid: String,
    /// `details.causes`: the individual field errors (or conflicts), in order.
    pub causes: Vec<Cause>,
    /// `details.retryAfterSeconds`: how long a client should wait before retrying, if set.
    pub retry_after_seconds: Option<u32>,
}

impl ApiError {
    /// An error with the given HTTP code, `reason` and message, and no details.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, gr: &GroupResource, name: &str) -> Self {
        self.details = Some(Box::new(Details {
            name: name.into(),
            group: gr.group.clone(),
            kind: gr.resource.clone(),
            ..Default::default()
        }));
        self
    }

    /// 404 `deployments.apps "x" not found`.
    pub fn not_found(gr: &GroupResource, name: &str) -> Self {
        ApiError::new(404, "NotFound", format!("{gr} \"{name}\" not found")).with_details(gr, name)
    }
    /// 404 for a path that names nothing.
    pub fn not_found_path() -> Self {
        let mut e = ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        e.details = Some(Box::default());
        e
    }
    /// 409 `deployments.apps "x" already exists`.
    pub fn already_exists(gr: &GroupResource, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{gr} \"{name}\" already exists"),
        )
        .with_details(gr, name)
    }
    /// 409 Conflict with the standard "object has been modified" wording.
    pub fn conflict(gr: &GroupResource, name: &str, detail: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {gr} \"{name}\": {detail}"),
        )
        .with_details(gr, name)
    }
    /// The usual optimistic-concurrency conflict.
    pub fn stale(gr: &GroupResource, name: &str) -> Self {
        ApiError::conflict(
            gr,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    /// 422 `Kind.group "name" is invalid: [cause, cause]`.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let list: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let mut e = ApiError::new(
            422,
            "Invalid",
            format!("{qualified} \"{name}\" is invalid: {joined}"),
        );
        e.details = Some(Box::new(Details {
            name: name.into(),
            group: group.into(),
            kind: kind.into(),
            causes,
            ..Default::default()
        }));
        e
    }
    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }
    /// 410 Expired (`too old resource version`, expired continue tokens).
    pub fn expired(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }
    /// 410 for a watch/list at a compacted revision.
    pub fn too_old_resource_version(requested: i64, oldest: i64) -> Self {
        ApiError::expired(format!("too old resource version: {requested} ({oldest})"))
    }
    /// 413 RequestEntityTooLarge.
    pub fn too_large(message: impl Into<String>) -> Self {
        ApiError::new(413, "RequestEntityTooLarge", message)
    }
    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(content_type: &str, accepted: &[&str]) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
        .with_media_type_note(content_type)
    }
    fn with_media_type_note(mut self, content_type: &str) -> Self {
        if !content_type.is_empty() {
            self.message = format!("{} (got {content_type:?})", self.message);
        }
        self
    }
    /// 405 MethodNotAllowed.
    pub fn method_not_allowed() -> Self {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }
    /// 406 NotAcceptable.
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        ApiError::new(406, "NotAcceptable", message)
    }
    /// 403 Forbidden.
    pub fn forbidden(gr: &GroupResource, name: &str, detail: &str) -> Self {
        let msg = if name.is_empty() {
            format!("{gr} is forbidden: {detail}")
        } else {
            format!("{gr} \"{name}\" is forbidden: {detail}")
        };
        ApiError::new(403, "Forbidden", msg).with_details(gr, name)
    }
    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }
    /// 429 TooManyRequests with Retry-After.
    pub fn too_many_requests(message: impl Into<String>, retry_after_seconds: u32) -> Self {
        let mut e = ApiError::new(429, "TooManyRequests", message);
        e.details = Some(Box::new(Details {
            retry_after_seconds: Some(retry_after_seconds),
            ..Default::default()
        }));
        e
    }
    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }
    /// 503 ServiceUnavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(503, "ServiceUnavailable", message)
    }
    /// 504 Timeout.
    pub fn timeout(message: impl Into<String>) -> Self {
        ApiError::new(504, "Timeout", message)
    }
    /// 504 for a read that names a `resourceVersion` the server has not reached within its
    /// wait: upstream's `NewTooLargeResourceVersionError` (a `NewTimeoutError`, hence the
    /// `Timeout: ` prefix), with the `ResourceVersionTooLarge` cause client-go's reflector
    /// recognises and `retryAfterSeconds` 1, as the watch cache answers.
    pub fn too_large_resource_version(requested: u64, current: i64) -> Self {
        let mut e = ApiError::timeout(format!(
            "Timeout: Too large resource version: {requested}, current: {current}"
        ));
        e.details = Some(Box::new(Details {
            causes: vec![Cause::new(
                "ResourceVersionTooLarge",
                "",
                "Too large resource version",
            )],
            retry_after_seconds: Some(1),
            ..Default::default()
        }));
        e
    }

    /// The `metav1.Status` JSON object.
    pub fn to_status(&self) -> Value {
        let mut status = Map::new();
        status.insert("kind".into(), json!("Status"));
        status.insert("apiVersion".into(), json!("v1"));
        status.insert("metadata".into(), json!({}));
        status.insert("status".into(), json!("Failure"));
        status.insert("message".into(), json!(self.message));
        status.insert("reason".into(), json!(self.reason));
        if let Some(d) = &self.details {
            let mut dm = Map::new();
            if !d.name.is_empty() {
                dm.insert("name".into(), json!(d.name));
            }
            if !d.group.is_empty() {
                dm.insert("group".into(), json!(d.group));
            }
            if !d.kind.is_empty() {
                dm.insert("kind".into(), json!(d.kind));
            }
            if !d.uid.is_empty() {
                dm.insert("uid".into(), json!(d.uid));
            }
            if !d.causes.is_empty() {
                dm.insert(
                    "causes".into(),
                    Value::Array(d.causes.iter().map(Cause::to_json).collect()),
                );
            }
            if let Some(r) = d.retry_after_seconds {
                dm.insert("retryAfterSeconds".into(), json!(r));
            }
            status.insert("details".into(), Value::Object(dm));
        }
        status.insert("code".into(), json!(self.code));
        Value::Object(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_wording_matches_kubernetes() {
        let gr = GroupResource {
            group: "apps".into(),
            resource: "deployments".into(),
        };
        let s = ApiError::not_found(&gr, "web").to_status();
        assert_eq!(s["message"], "deployments.apps \"web\" not found");
        assert_eq!(s["code"], 404);
        assert_eq!(s["details"]["kind"], "deployments");
        let core = GroupResource {
            group: "".into(),
            resource: "pods".into(),
        };
        assert_eq!(
            ApiError::not_found(&core, "p").message,
            "pods \"p\" not found"
        );
    }

    #[test]
    fn invalid_lists_causes() {
        let e = ApiError::invalid(
            "apps",
            "Deployment",
            "Bad_Name",
            vec![Cause::invalid(
                "metadata.name",
                &json!("Bad_Name"),
                "must be lowercase",
            )],
        );
        let s = e.to_status();
        assert_eq!(s["code"], 422);
        assert_eq!(s["details"]["causes"][0]["field"], "metadata.name");
        assert!(e
            .message
            .starts_with("Deployment.apps \"Bad_Name\" is invalid: metadata.name: Invalid value"));
    }
}
