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
use crate::strategy::View;

/// Serves `method` on the collection of `r.res` in `namespace` (all namespaces when `None`).
pub(super) async fn serve(
    r: Request<'_>,
    method: &Method,
    namespace: Option<&str>,
    body: Body,
) -> Result<Response, ApiError> {
    let Request { server, res, q, .. } = r;
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
    let obj = to_storage(res, obj);
    let w = server.create(&sres, ns, obj, &opts).await?;
    Ok(written_response(
        StatusCode::CREATED,
        res,
        View::Main,
        w,
        dups,
    ))
}
