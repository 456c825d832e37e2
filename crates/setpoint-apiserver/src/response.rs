//! HTTP responses every layer builds: JSON, plain text, a `Status` for an error, warnings.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use serde_json::Value;
use setpoint_api::ApiError;

/// A JSON response.
pub fn json_response(code: StatusCode, body: impl Into<Bytes>) -> Response {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.into()))
        .expect("valid response")
}

pub(crate) fn value_response(code: StatusCode, v: &Value) -> Response {
    json_response(code, serde_json::to_vec(v).unwrap_or_default())
}

/// The `Status` response for an error.
pub fn error_response(e: &ApiError) -> Response {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = value_response(code, &e.to_status());
    if let Some(secs) = e.details.as_ref().and_then(|d| d.retry_after_seconds) {
        r.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    r
}

pub(crate) fn text_response(code: StatusCode, body: impl Into<Bytes>) -> Response {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(body.into()))
        .expect("valid response")
}

pub(crate) fn with_warnings(mut r: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let v = format!("299 - {}", serde_json::to_string(w).unwrap_or_default());
        if let Ok(h) = HeaderValue::from_str(&v) {
            r.headers_mut().append(http::header::WARNING, h);
        }
    }
    r
}
