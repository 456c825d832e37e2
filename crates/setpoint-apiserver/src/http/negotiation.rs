//! Content negotiation: what a request body is (JSON, YAML, protobuf, apply configuration)
//! and what the client accepts back (a Table, partial object metadata, aggregated discovery).

use http::HeaderMap;
use serde_json::{json, Value};
use setpoint_api::ApiError;
use setpoint_store::Revision;

use crate::objects::BodySyntax;
use crate::registry::ResourceDef;
use crate::request::{go_quote, Query};

pub(super) fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|s| {
            s.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

/// Decodes a create/update body: JSON (also when no Content-Type is given), YAML, or
/// Kubernetes protobuf. Also returns the syntax the duplicate-field check must scan the body
/// as: JSON only when the decode met a repeated key, YAML always, else none (`Other`).
pub(super) fn decode_object_body(
    res: &ResourceDef,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Value, BodySyntax), ApiError> {
    let ct = content_type(headers);
    let cannot = |e: String| {
        ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            res.kind, res.version, res.kind
        ))
    };
    let (v, scan): (Value, BodySyntax) = match ct.as_str() {
        "" | "application/json" | "*/*" => {
            let (v, repeated) = crate::dupfields::decode_json(body)
                .map_err(|e| cannot(crate::decoding::json_syntax_error(body, &e)))?;
            let scan = if repeated {
                BodySyntax::Json
            } else {
                BodySyntax::Other
            };
            (v, scan)
        }
        "application/yaml" | "application/x-yaml" | "text/yaml" => {
            let text = std::str::from_utf8(body).map_err(|e| cannot(e.to_string()))?;
            let v = crate::yamlbody::decode(text).map_err(cannot)?;
            (v, BodySyntax::Yaml)
        }
        "application/vnd.kubernetes.protobuf" => {
            let v = setpoint_protobuf::decode(body).map_err(|e| cannot(e.to_string()))?;
            (v, BodySyntax::Other)
        }
        other => {
            return Err(ApiError::unsupported_media_type(
                other,
                &[
                    "application/json",
                    "application/yaml",
                    "application/vnd.kubernetes.protobuf",
                ],
            ))
        }
    };
    if !v.is_object() {
        return Err(cannot("the body must be an object".into()));
    }
    Ok((v, scan))
}

/// Decodes a server-side apply body: YAML (JSON is YAML too), which must be an object. A body
/// that is JSON (as kubectl sends) is read as JSON, which is quicker; the syntax that was read is
/// returned for the duplicate-field scan.
pub(super) fn decode_apply_body(body: &[u8]) -> Result<(Value, BodySyntax), ApiError> {
    if body.trim_ascii_start().starts_with(b"{") {
        if let Ok(v @ Value::Object(_)) = serde_json::from_slice::<Value>(body) {
            return Ok((v, BodySyntax::Json));
        }
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    let v: Value = crate::yamlbody::decode(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "an apply patch must be a YAML or JSON object",
        ));
    }
    Ok((v, BodySyntax::Yaml))
}

/// The `;`-separated parts of each media range the `Accept` headers list.
pub(super) fn accept_ranges(headers: &HeaderMap) -> impl Iterator<Item = Vec<&str>> {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|range| range.split(';').map(str::trim).collect())
}

pub(super) fn wants_table(headers: &HeaderMap) -> bool {
    accept_ranges(headers).any(|p| p.contains(&"as=Table") && p.contains(&"g=meta.k8s.io"))
}

/// Whether the response is a Table, with its `TableOptions` checked as upstream checks them
/// before converting: an `includeObject` other than `Metadata`, `Object`, `None` or empty is a
/// 400.
pub(super) fn table_requested(headers: &HeaderMap, q: &Query) -> Result<bool, ApiError> {
    if !wants_table(headers) {
        return Ok(false);
    }
    match q.get("includeObject").map(String::as_str) {
        None | Some("" | "Metadata" | "Object" | "None") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "Unable to convert to Table as requested: includeObject: Invalid value: {}: must be 'Metadata', 'Object', 'None', or empty",
            go_quote(other)
        ))),
    }
}

/// The `meta.k8s.io` version the client asked to receive objects in as
/// `PartialObjectMetadata` (`Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1`,
/// `as=PartialObjectMetadataList` for lists), as metadata-only informers do; `None` otherwise.
pub(super) fn wants_metadata(headers: &HeaderMap) -> Option<&'static str> {
    accept_ranges(headers).find_map(|p| {
        let partial =
            p.contains(&"as=PartialObjectMetadata") || p.contains(&"as=PartialObjectMetadataList");
        if !partial || !p.contains(&"g=meta.k8s.io") {
            return None;
        }
        if p.contains(&"v=v1") {
            Some("meta.k8s.io/v1")
        } else if p.contains(&"v=v1beta1") {
            Some("meta.k8s.io/v1beta1")
        } else {
            None
        }
    })
}

/// An object's `PartialObjectMetadata` form.
pub(super) fn partial_metadata(metadata: Value, api_version: &str) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": api_version, "metadata": metadata})
}

/// A `PartialObjectMetadataList` of the given metadata.
pub(super) fn partial_list(
    api_version: &str,
    items: impl Iterator<Item = Value>,
    revision: Revision,
    cont: Option<&str>,
    remaining: Option<usize>,
) -> Value {
    let mut metadata = serde_json::Map::new();
    metadata.insert("resourceVersion".into(), json!(revision.to_string()));
    if let Some(c) = cont {
        metadata.insert("continue".into(), json!(c));
        if let Some(r) = remaining {
            metadata.insert("remainingItemCount".into(), json!(r));
        }
    }
    json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": api_version,
        "metadata": Value::Object(metadata),
        "items": items.map(|m| partial_metadata(m, api_version)).collect::<Vec<_>>(),
    })
}

pub(super) fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("as=APIGroupDiscoveryList") && v.contains("v=v2"))
}
