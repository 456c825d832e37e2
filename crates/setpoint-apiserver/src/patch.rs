//! Patch bodies: JSON merge patch (RFC 7386) and JSON patch (RFC 6902).
//!
//! Strategic merge patch and server-side apply are separate pieces of work; until they exist
//! those media types are refused with 415 so that clients see a clear answer.

use serde_json::Value;
use setpoint_api::ApiError;

/// The patch media types the server understands.
pub const MERGE_PATCH: &str = "application/merge-patch+json";
pub const JSON_PATCH: &str = "application/json-patch+json";
pub const STRATEGIC_MERGE_PATCH: &str = "application/strategic-merge-patch+json";
pub const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// A decoded patch.
#[derive(Clone, Debug)]
pub enum Patch {
    Merge(Value),
    Json(Vec<Value>),
}

impl Patch {
    /// Decodes a PATCH body by its content type.
    pub fn decode(content_type: &str, body: &[u8]) -> Result<Patch, ApiError> {
        match content_type {
            MERGE_PATCH => {
                let v: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                if !v.is_object() {
                    return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                }
                Ok(Patch::Merge(v))
            }
            JSON_PATCH => {
                let v: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                match v {
                    Value::Array(ops) => Ok(Patch::Json(ops)),
                    _ => Err(ApiError::bad_request(
                        "a JSON patch must be an array of operations",
                    )),
                }
            }
            other => Err(ApiError::unsupported_media_type(
                other,
                &[JSON_PATCH, MERGE_PATCH],
            )),
        }
    }

    /// Applies the patch to `target`, returning the patched document.
    pub fn apply(&self, target: &Value) -> Result<Value, ApiError> {
        match self {
            Patch::Merge(p) => Ok(merge_patch(target, p)),
            Patch::Json(ops) => json_patch(target, ops),
        }
    }

    /// The `metadata.resourceVersion` a merge patch carries as a precondition, if any.
    pub fn resource_version(&self) -> Option<&str> {
        match self {
            Patch::Merge(p) => p
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

/// RFC 6902. A failed `test` or an operation on a missing path is 422, as kopf expects.
pub fn json_patch(target: &Value, ops: &[Value]) -> Result<Value, ApiError> {
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops.to_vec()))
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let mut doc = target.clone();
    json_patch::patch(&mut doc, &patch).map_err(|e| {
        ApiError::new(
            422,
            "Invalid",
            format!("the server rejected our request due to an error in our request: {e}"),
        )
    })?;
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
    fn failed_test_is_422() {
        let t = json!({"metadata": {"resourceVersion": "5"}});
        let ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": "4"})];
        assert_eq!(json_patch(&t, &ops).unwrap_err().code, 422);
    }
}
