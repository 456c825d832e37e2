//! Patch bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and, for built-in kinds,
//! strategic merge patch ([`strategic`]).
//!
//! A strategic merge patch needs the type of what it patches, so it is decoded together with it
//! ([`strategic_type`]); kinds without a type (custom resources) answer 415, as Kubernetes does.
//! Server-side apply bodies are not patches of this kind: the HTTP layer hands them to
//! [`crate::apply`] and [`Patch::decode`] refuses them.

pub mod strategic;

use serde::Deserialize as _;
use serde_json::Value;
use setpoint_api::ApiError;
use setpoint_protobuf::types::{self, TypeRef};

use crate::registry::ResourceDef;
use crate::strategy::View;

/// A JSON merge patch (RFC 7386), `kubectl patch --type merge`.
pub const MERGE_PATCH: &str = "application/merge-patch+json";
/// A JSON patch (RFC 6902), `kubectl patch --type json`.
pub const JSON_PATCH: &str = "application/json-patch+json";
/// A strategic merge patch, kubectl's default for built-in kinds.
pub const STRATEGIC_MERGE_PATCH: &str = "application/strategic-merge-patch+json";
/// A server-side apply configuration, `kubectl apply --server-side`.
pub const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// A decoded patch.
#[derive(Clone, Debug)]
pub enum Patch {
    /// A JSON merge patch document.
    Merge(Value),
    /// A JSON patch's operations.
    Json(Vec<Value>),
    /// A strategic merge patch and the type of the object (or subresource view) it patches.
    Strategic(Value, TypeRef),
}

/// The type a strategic merge patch of `res` through `view` applies to: the kind's own type
/// (also for `/status`), autoscaling/v1 `Scale` for `/scale`. `None` for kinds the type graph does
/// not describe, which cannot take a strategic merge patch.
pub fn strategic_type(res: &ResourceDef, view: View) -> Option<TypeRef> {
    match view {
        View::Scale => types::for_kind("autoscaling", "v1", "Scale"),
        View::Main | View::Status | View::Finalize | View::Approval => {
            types::for_kind(&res.group, &res.version, &res.kind)
        }
    }
}

impl Patch {
    /// Decodes a PATCH body by its content type. `strategic` is the type a strategic merge patch
    /// would apply to ([`strategic_type`]); without one that media type is refused with 415.
    pub fn decode(
        content_type: &str,
        body: &[u8],
        strategic: Option<TypeRef>,
    ) -> Result<Patch, ApiError> {
        match (content_type, strategic) {
            (MERGE_PATCH, _) => {
                let v: Value = serde_json::from_slice(body).map_err(|e| undecodable(body, &e))?;
                if !v.is_object() {
                    return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                }
                Ok(Patch::Merge(v))
            }
            (JSON_PATCH, _) => {
                let v: Value = serde_json::from_slice(body).map_err(|e| undecodable(body, &e))?;
                match v {
                    Value::Array(ops) => {
                        check_operation_count(ops.len())?;
                        Ok(Patch::Json(ops))
                    }
                    _ => Err(ApiError::bad_request(
                        "a JSON patch must be an array of operations",
                    )),
                }
            }
            (STRATEGIC_MERGE_PATCH, Some(ty)) => {
                let v: Value = serde_json::from_slice(body).map_err(|e| undecodable(body, &e))?;
                if !v.is_object() {
                    return Err(ApiError::bad_request(
                        "a strategic merge patch must be a JSON object",
                    ));
                }
                Ok(Patch::Strategic(v, ty))
            }
            (other, _) => {
                let accepted: &[&str] = if strategic.is_some() {
                    &[JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH]
                } else {
                    &[JSON_PATCH, MERGE_PATCH, APPLY_PATCH]
                };
                Err(ApiError::unsupported_media_type(other, accepted))
            }
        }
    }

    /// Applies the patch to `target`, returning the patched document.
    pub fn apply(&self, target: &Value) -> Result<Value, ApiError> {
        match self {
            Patch::Merge(p) => Ok(merge_patch(target, p)),
            Patch::Json(ops) => json_patch(target, ops),
            Patch::Strategic(p, ty) => strategic::apply(target, p, *ty),
        }
    }

    /// The `metadata.resourceVersion` a merge patch carries as a precondition, if any.
    pub fn resource_version(&self) -> Option<&str> {
        match self {
            Patch::Merge(p) | Patch::Strategic(p, _) => p
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str),
            Patch::Json(_) => None,
        }
    }
}

/// RFC 7386: objects merge recursively, `null` removes a key, anything else replaces.
pub fn merge_patch(target: &Value, patch: &Value) -> Value {
    match patch {
        Value::Object(p) => {
            let mut out = match target {
                Value::Object(t) => t.clone(),
                _ => serde_json::Map::new(),
            };
            for (k, v) in p {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = merge_patch(out.get(k).unwrap_or(&Value::Null), v);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// 400 for a patch body that is not JSON, in Go's decoder's words as Kubernetes gives them.
fn undecodable(body: &[u8], e: &serde_json::Error) -> ApiError {
    ApiError::bad_request(format!(
        "error decoding patch: {}",
        crate::decoding::json_syntax_error(body, e)
    ))
}

/// The most operations a JSON patch may have: Kubernetes' `maxJSONPatchOperations`.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// How much a JSON patch's `copy` operations may add to the document, in bytes of JSON
/// (the sum of the copied values' sizes): the API server's `JSONPatchMaxCopyBytes`, 3 MiB, twice
/// etcd's 1.5 MiB request limit. `copy` is the one operation whose result can outgrow the patch
/// (each copies a value already in the document, however large), so this is what bounds the
/// memory a patch can make the server allocate.
pub const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// 413 for a JSON patch of more than [`MAX_JSON_PATCH_OPERATIONS`] operations, in Kubernetes'
/// words; checked as soon as the operations are counted, before any is applied.
fn check_operation_count(n: usize) -> Result<(), ApiError> {
    if n > MAX_JSON_PATCH_OPERATIONS {
        return Err(ApiError::too_large(format!(
            "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {n}"
        )));
    }
    Ok(())
}

/// The 422 a JSON patch that cannot be applied gets (Kubernetes answers with a generic
/// "unprocessable" response carrying the patch library's message).
fn unprocessable(detail: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("the server rejected our request due to an error in our request: {detail}"),
    )
}

/// The length of `v` serialized as compact JSON, counted without building the text.
pub fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, v);
    count.0
}

/// RFC 6902. A failed `test` or an operation on a missing path is 422, as kopf expects. More than
/// [`MAX_JSON_PATCH_OPERATIONS`] operations are refused with 413 before anything is applied, and
/// a `copy` that would take the copied bytes past [`MAX_JSON_PATCH_COPY_BYTES`] is refused (422,
/// with the json-patch library's message Kubernetes passes on) before it copies.
pub fn json_patch(target: &Value, ops: &[Value]) -> Result<Value, ApiError> {
    check_operation_count(ops.len())?;
    // An operation the RFC does not define is json-patch's "Unexpected kind" (422), as in
    // Kubernetes, rather than a decoding error listing Rust's variants.
    if let Some(kind) = ops.iter().find_map(|op| {
        op.get("op")
            .and_then(Value::as_str)
            .filter(|k| !["add", "remove", "replace", "move", "copy", "test"].contains(k))
    }) {
        return Err(unprocessable(format!("Unexpected kind: {kind}")));
    }
    let ops: Vec<json_patch::PatchOperation> = ops
        .iter()
        .map(json_patch::PatchOperation::deserialize)
        .collect::<Result<_, _>>()
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let mut doc = target.clone();
    let mut copied = 0usize;
    for (i, op) in ops.iter().enumerate() {
        if let json_patch::PatchOperation::Copy(copy) = op {
            // A missing source is left to the patch below, which reports it.
            if let Some(from) = doc.pointer(copy.from.as_str()) {
                copied = copied.saturating_add(json_len(from));
                if copied > MAX_JSON_PATCH_COPY_BYTES {
                    return Err(unprocessable(format!(
                        "Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the limit {MAX_JSON_PATCH_COPY_BYTES}"
                    )));
                }
            }
        }
        // On a copy, so a failed patch needs no undo: `json_patch::patch` undoes and panics when
        // it cannot (a `move` of a child onto its parent followed by a failing op).
        // One operation at a time, so that a copy is measured against the document it copies
        // from; the error names the operation by its place in the whole patch.
        json_patch::patch_unsafe(&mut doc, std::slice::from_ref(op)).map_err(|mut e| {
            e.operation = i;
            unprocessable(e)
        })?;
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc7386() {
        let t = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        let p = json!({"a": "z", "c": {"f": null}, "l": [3]});
        assert_eq!(
            merge_patch(&t, &p),
            json!({"a": "z", "c": {"d": "e"}, "l": [3]})
        );
    }

    #[test]
    fn strategic_merge_patch_needs_a_type() {
        let body = br#"{"spec":{"replicas":3}}"#;
        let e = Patch::decode(STRATEGIC_MERGE_PATCH, body, None).unwrap_err();
        assert_eq!(e.code, 415);
        let ty = types::for_kind("apps", "v1", "Deployment");
        let p = Patch::decode(STRATEGIC_MERGE_PATCH, body, ty).unwrap();
        let out = p
            .apply(&json!({"spec": {"replicas": 1, "paused": true}}))
            .unwrap();
        assert_eq!(out, json!({"spec": {"replicas": 3, "paused": true}}));
        assert_eq!(
            Patch::decode(STRATEGIC_MERGE_PATCH, b"[]", ty)
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(Patch::decode(APPLY_PATCH, body, ty).unwrap_err().code, 415);
    }

    #[test]
    fn every_builtin_kind_takes_strategic_merge_patches() {
        let registry = crate::registry::Registry::builtin();
        for res in registry.all() {
            let ty = strategic_type(res, View::Main).unwrap_or_else(|| {
                panic!("no type for {}/{} {}", res.group, res.version, res.kind)
            });
            assert_eq!(ty.short_name(), res.kind);
            if res.scale {
                let scale = strategic_type(res, View::Scale).unwrap();
                assert_eq!(scale.name(), "k8s.io.api.autoscaling.v1.Scale");
            }
        }
    }

    #[test]
    fn strategic_patch_carries_a_resource_version_precondition() {
        let ty = types::for_kind("apps", "v1", "Deployment");
        let p = Patch::decode(
            STRATEGIC_MERGE_PATCH,
            br#"{"metadata":{"resourceVersion":"127"}}"#,
            ty,
        )
        .unwrap();
        assert_eq!(p.resource_version(), Some("127"));
    }

    #[test]
    fn failed_patch_after_moving_a_child_onto_its_parent_is_422() {
        let t = json!({"0": [null, null]});
        let ops = vec![
            json!({"op": "move", "from": "/0/0", "path": "/0"}),
            json!({"op": "test", "path": "/a", "value": 1}),
        ];
        assert_eq!(json_patch(&t, &ops).unwrap_err().code, 422);
        assert_eq!(json_patch(&t, &ops[..1]).unwrap(), json!({"0": null}));
    }

    #[test]
    fn more_than_ten_thousand_operations_are_413_before_any_is_applied() {
        let op = r#"{"op":"add","path":"/x","value":"y"}"#;
        let body = format!("[{}]", vec![op; MAX_JSON_PATCH_OPERATIONS + 1].join(","));
        let e = Patch::decode(JSON_PATCH, body.as_bytes(), None).unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (413, "RequestEntityTooLarge"));
        assert_eq!(
            e.message,
            "The allowed maximum operations in a JSON patch is 10000, got 10001"
        );
        let body = format!("[{}]", vec![op; MAX_JSON_PATCH_OPERATIONS].join(","));
        let p = Patch::decode(JSON_PATCH, body.as_bytes(), None).unwrap();
        assert_eq!(p.apply(&json!({})).unwrap(), json!({"x": "y"}));
    }

    #[test]
    fn copies_stop_at_the_accumulated_copy_limit() {
        // 1 MiB copied three times is exactly the limit; a fourth copy is refused.
        let value = "x".repeat(1024 * 1024 - 2);
        let doc = json!({ "a": value });
        let copy = |to: &str| json!({"op": "copy", "from": "/a", "path": to});
        let three = vec![copy("/b"), copy("/c"), copy("/d")];
        let out = json_patch(&doc, &three).unwrap();
        assert_eq!(out["d"], doc["a"]);
        let mut four = three.clone();
        four.push(copy("/e"));
        let e = json_patch(&doc, &four).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message.ends_with(
                "Unable to complete the copy, the accumulated size increase of copy is 4194304, exceeding the limit 3145728"
            ),
            "{}",
            e.message
        );
        // A copy of a copy counts what it copies.
        let small = json!({"a": "x".repeat(600 * 1024)});
        let doubling: Vec<Value> = (0..4)
            .map(|i| json!({"op": "copy", "from": "/a", "path": format!("/b{i}")}))
            .chain([json!({"op": "copy", "from": "", "path": "/all"})])
            .collect();
        assert_eq!(json_patch(&small, &doubling).unwrap_err().code, 422);
    }

    #[test]
    fn failed_operations_are_named_by_their_place_in_the_patch() {
        let ops = vec![
            json!({"op": "add", "path": "/a", "value": 1}),
            json!({"op": "remove", "path": "/missing"}),
        ];
        let e = json_patch(&json!({}), &ops).unwrap_err();
        assert!(e.message.contains("operation '/1'"), "{}", e.message);
    }

    #[test]
    fn failed_test_is_422() {
        let t = json!({"metadata": {"resourceVersion": "5"}});
        let ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": "4"})];
        assert_eq!(json_patch(&t, &ops).unwrap_err().code, 422);
    }
}
