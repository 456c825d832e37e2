//! Requests on a collection: LIST, WATCH, create (POST) and DELETE of the collection.

use axum::body::Body;
use axum::response::Response;
use http::{Method, StatusCode};
use setpoint_api::ApiError;

use super::list::{delete_collection, list};
use super::negotiation::decode_object_body;
use super::respond::{to_storage, written_response};
use super::watch::watch;
use super::{storage_def, write_request, Request};
use crate::request::bool_param;
use crate::response::{value_response, with_warnings};
use crate::strategy::View;

/// Serves `method` on the collection of `r.res` in `namespace` (all namespaces when `None`).
pub(super) async fn serve(
    r: Request<'_>,
    method: &Method,
    namespace: Option<&str>,
    body: Body,
) -> Result<Response, ApiError> {
    let Request { server, res, q, .. } = r;
    // Reviews are only ever created: upstream registers no other handler for them.
    if res.is_create_only() {
        return match *method {
            Method::POST => review(r, namespace.unwrap_or_default(), body).await,
            _ => Err(ApiError::method_not_allowed()),
        };
    }
    match *method {
        Method::GET if bool_param(q, "watch") => watch(r, namespace).await,
        Method::GET => list(r, namespace).await,
        Method::POST => {
            let ns = match (namespace, res.namespaced) {
                (Some(ns), true) => ns.to_string(),
                (None, true) => return Err(ApiError::method_not_allowed()),
                _ => String::new(),
            };
            create(r, &ns, body).await
        }
        Method::DELETE => delete_collection(server, res, namespace, q, body).await,
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// POST: creates the object in the body.
async fn create(r: Request<'_>, ns: &str, body: Body) -> Result<Response, ApiError> {
    let Request {
        server,
        res,
        headers,
        ..
    } = r;
    let (opts, bytes) = write_request(r, "CreateOptions", body).await?;
    let (obj, syntax) = decode_object_body(res, headers, &bytes)?;
    let dups = server.check_duplicate_fields(res, syntax, &bytes, &opts)?;
    let sres = storage_def(server, res);
    let obj = to_storage(server, res, obj).await?;
    let w = server.create(&sres, ns, obj, &opts).await?;
    written_response(server, StatusCode::CREATED, res, View::Main, w, dups).await
}

/// POST of a review: decoded and checked as a create is, then answered by [`crate::reviews`]
/// with nothing stored.
async fn review(r: Request<'_>, ns: &str, body: Body) -> Result<Response, ApiError> {
    let Request {
        server,
        res,
        headers,
        ..
    } = r;
    let (opts, bytes) = write_request(r, "CreateOptions", body).await?;
    let (mut obj, syntax) = decode_object_body(res, headers, &bytes)?;
    let dups = server.check_duplicate_fields(res, syntax, &bytes, &opts)?;
    crate::typemeta::check_body(res, &mut obj)?;
    let check = setpoint_kinds::validation::check_types(&res.group, &res.version, &res.kind, &obj);
    if let Some(e) = crate::decoding::type_error(res, &obj, &check.type_errors) {
        return Err(e);
    }
    check.drop_unknown(&mut obj);
    let unknown = crate::objects::field_policy(res, &check.unknown, "unknown", &opts)?;
    // A namespaced review takes its namespace from the path, as every create does.
    if res.namespaced {
        let meta = &mut obj["metadata"];
        if !meta.is_object() {
            *meta = serde_json::json!({});
        }
        match meta.get("namespace").and_then(serde_json::Value::as_str) {
            None | Some("") => meta["namespace"] = ns.into(),
            Some(given) if given != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            Some(_) => {}
        }
    }
    let rbac_rules = |user: &crate::authentication::UserInfo, namespace: &str| {
        server
            .rbac
            .rules_for(user, namespace)
            .iter()
            .filter_map(|rule| serde_json::to_value(rule).ok())
            .collect()
    };
    let reviewer = crate::reviews::Reviewer {
        authenticators: &server.authenticators,
        api_audiences: server.service_accounts.api_audiences(),
        authorizers: &server.authorizers,
        caller: r.user,
        rules: Some(&rbac_rules),
    };
    let answer = reviewer.review(res, ns, obj)?;
    Ok(with_warnings(
        value_response(StatusCode::CREATED, &answer),
        &[dups, unknown].concat(),
    ))
}
