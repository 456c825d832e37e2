//! Responses built from API objects: a written object (as the client's version sees it), the
//! OpenAPI v2 document with its ETag, and the discovery documents.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::Value;
use setpoint_api::ApiError;

use crate::objects::Written;
use crate::registry::ResourceDef;
use crate::state::ApiServer;
use crate::strategy::View;

use super::negotiation::wants_aggregated;
use crate::response::json_response;
use crate::response::value_response;
use crate::response::with_warnings;

/// The response to a write through `view`, with the body's duplicate-field warnings `dups`
/// and the write's own: the written object's JSON as stored when the write has it and the
/// resource serves what it stores, else `object` serialized (converted for `res`, unless it
/// is a Scale, which no resource version describes).
pub(super) async fn written_response(
    server: &ApiServer,
    code: StatusCode,
    res: &ResourceDef,
    view: View,
    w: Written,
    dups: Vec<String>,
) -> Result<Response, ApiError> {
    let r = match w.json {
        Some(json) if !res.transformed_on_read() => json_response(code, json),
        _ if view == View::Scale => value_response(code, &w.object),
        _ => value_response(code, &to_api(server, res, w.object).await?),
    };
    Ok(with_warnings(r, &[dups, w.warnings].concat()))
}

/// An `/openapi/v2` response with its ETag; 304 when the client already holds it.
pub(super) fn openapi_v2_response(
    headers: &http::HeaderMap,
    doc: crate::openapi::V2Doc,
) -> Response {
    use crate::openapi::V2Body;
    let etag = format!("\"{}\"", doc.etag);
    let (content_type, body) = match doc.body {
        V2Body::Json(v) => (
            "application/json",
            Bytes::from(serde_json::to_vec(&v).unwrap_or_default()),
        ),
        V2Body::Protobuf(b) => (crate::openapi::V2_PROTOBUF, b),
    };
    let unchanged = headers
        .get_all(http::header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            let t = t.trim();
            t == "*" || t.trim_start_matches("W/") == etag
        });
    let builder = Response::builder()
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::ETAG, &etag)
        // One URL, two encodings: caches must key on Accept.
        .header(http::header::VARY, "Accept");
    let r = if unchanged {
        builder.status(StatusCode::NOT_MODIFIED).body(Body::empty())
    } else {
        builder.status(StatusCode::OK).body(Body::from(body))
    };
    r.expect("valid response")
}

/// An object in a request's version as its storage version holds it (the inverse of
/// [`to_api`]); a custom resource with a conversion webhook is converted by it.
pub(super) async fn to_storage(
    server: &ApiServer,
    res: &ResourceDef,
    obj: Value,
) -> Result<Value, ApiError> {
    if !res.is_converted() {
        return Ok(obj);
    }
    if res.custom.is_some() {
        return server.custom_to_storage(res, obj).await;
    }
    Ok(crate::convert::to_storage(res, obj))
}

/// A stored object as the request's version shows it.
pub(super) async fn to_api(
    server: &ApiServer,
    res: &ResourceDef,
    obj: Value,
) -> Result<Value, ApiError> {
    Ok(to_api_all(server, res, vec![obj])
        .await?
        .pop()
        .unwrap_or(Value::Null))
}

/// Stored objects as the request's version shows them: a custom resource's conversion
/// webhook gets them all in one review (upstream sends a list page in one request).
pub(super) async fn to_api_all(
    server: &ApiServer,
    res: &ResourceDef,
    objs: Vec<Value>,
) -> Result<Vec<Value>, ApiError> {
    if !res.transformed_on_read() {
        return Ok(objs);
    }
    if res.custom.is_some() {
        return server.custom_from_storage(res, objs).await;
    }
    Ok(objs
        .into_iter()
        .map(|o| crate::convert::from_storage(res, o))
        .collect())
}

pub(super) fn discovery_response(server: &ApiServer, headers: &HeaderMap, core: bool) -> Response {
    if wants_aggregated(headers) {
        let doc = crate::discovery::aggregated(server, core);
        let mut r = value_response(StatusCode::OK, &doc);
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            ),
        );
        r.headers_mut()
            .insert(http::header::VARY, HeaderValue::from_static("Accept"));
        return r;
    }
    let doc = if core {
        crate::discovery::core_versions(server)
    } else {
        crate::discovery::groups(server)
    };
    let mut r = value_response(StatusCode::OK, &doc);
    r.headers_mut()
        .insert(http::header::VARY, HeaderValue::from_static("Accept"));
    r
}
