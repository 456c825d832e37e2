//! Requests on one object or one of its subresources: GET, PUT, PATCH (including server-side
//! apply) and DELETE.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use http::{Method, StatusCode};
use serde_json::Value;
use setpoint_api::{meta, ApiError};

use super::list::wait_fresh;
use super::negotiation::{
    content_type, decode_apply_body, decode_object_body, partial_metadata, table_requested,
    wants_metadata,
};
use super::options::delete_options;
use super::pods::{bind_pod, evict_pod, pod_log};
use super::respond::{to_api, to_storage, written_response};
use super::{read_body, storage_def, write_request, Request};
use crate::objects::BodySyntax;
use crate::patch::Patch;
use crate::registry::ResourceDef;
use crate::request::{opt_bool_param, rv_param, RvParam};
use crate::response::value_response;
use crate::state::ApiServer;
use crate::strategy::View;

/// Serves `method` on the object `ns`/`name` of `r.res`, or on its `subresource`.
pub(super) async fn serve(
    r: Request<'_>,
    method: &Method,
    ns: &str,
    name: &str,
    subresource: Option<&str>,
    body: Body,
) -> Result<Response, ApiError> {
    let Request { server, res, q, .. } = r;
    // Pods' binding and log are not views of the object but operations of their own, served
    // by handlers of their own, as upstream registers them.
    let is_pods = res.group.is_empty() && res.plural == "pods";
    match subresource {
        Some("binding") if is_pods => {
            if *method != Method::POST {
                return Err(ApiError::method_not_allowed());
            }
            let bytes = read_body(server, body).await?;
            return bind_pod(server, res, ns, name, r.headers, &bytes, q).await;
        }
        // TokenRequest: a token minted for the service account, never stored.
        Some("token") if res.group.is_empty() && res.plural == "serviceaccounts" => {
            if *method != Method::POST {
                return Err(ApiError::method_not_allowed());
            }
            let bytes = read_body(server, body).await?;
            let def = crate::registry::ResourceDef {
                group: "authentication.k8s.io".into(),
                kind: "TokenRequest".into(),
                ..(**res).clone()
            };
            let (request, _) = decode_object_body(&def, r.headers, &bytes)?;
            let out = crate::authentication::serviceaccount::tokenrequest::create(
                server, ns, name, request,
            )
            .await?;
            return Ok(value_response(StatusCode::CREATED, &out));
        }
        Some("eviction") if is_pods => {
            if *method != Method::POST {
                return Err(ApiError::method_not_allowed());
            }
            let bytes = read_body(server, body).await?;
            return evict_pod(server, res, ns, name, r.headers, &bytes, q, r.user).await;
        }
        Some("log") if is_pods => {
            if *method != Method::GET {
                return Err(ApiError::method_not_allowed());
            }
            return pod_log(server, res, ns, name, q).await;
        }
        _ => {}
    }
    let view = View::parse(res, subresource)?;
    match *method {
        Method::GET if view != View::Finalize => get(r, ns, name, view).await,
        Method::PUT => put(r, ns, name, view, body).await,
        Method::PATCH if view != View::Finalize => patch(r, ns, name, view, body).await,
        Method::DELETE if view == View::Main => delete(r, ns, name, body).await,
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// GET: the object (as a Table or partial metadata when the client asks), or its scale.
async fn get(r: Request<'_>, ns: &str, name: &str, view: View) -> Result<Response, ApiError> {
    let Request {
        server,
        res,
        q,
        headers,
        ..
    } = r;
    // A GET is served from the store, which is always current: a revision it names only has
    // to be one the server has reached.
    if let rv @ RvParam::At(_) = rv_param(q)? {
        wait_fresh(server, rv.revision()).await?;
    }
    let sres = storage_def(server, res);
    let stored = server.get_object(&sres, ns, name).await?;
    let table = view == View::Main && table_requested(headers, q)?;
    if let Some(v) = wants_metadata(headers).filter(|_| view == View::Main && !table) {
        // Metadata is the same in every version: upstream calls no conversion webhook for
        // it, so a metadata-only read (the garbage collector's) never fails on one.
        let m = stored.get("metadata").cloned().unwrap_or(Value::Null);
        return Ok(value_response(StatusCode::OK, &partial_metadata(m, v)));
    }
    let obj = to_api(server, res, stored).await?;
    let obj = if view == View::Scale {
        crate::strategy::scale_of(res, &obj)
    } else {
        obj
    };
    if table {
        let rv = meta::resource_version(&obj).to_string();
        let t = crate::table::table(res, &[Arc::new(obj)], &rv, None, q, true);
        return Ok(value_response(StatusCode::OK, &t));
    }
    Ok(value_response(StatusCode::OK, &obj))
}

/// PUT: replaces the object (or its status, scale or finalizers) with the body.
async fn put(
    r: Request<'_>,
    ns: &str,
    name: &str,
    view: View,
    body: Body,
) -> Result<Response, ApiError> {
    let Request {
        server,
        res,
        headers,
        ..
    } = r;
    let (opts, bytes) = write_request(r, "UpdateOptions", body).await?;
    let (obj, syntax) = if view == View::Scale {
        let obj = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::bad_request(format!(
                "Scale in version \"v1\" cannot be handled as a Scale: {e}"
            ))
        })?;
        (obj, BodySyntax::Json)
    } else {
        decode_object_body(res, headers, &bytes)?
    };
    let dups = server.check_duplicate_fields(res, syntax, &bytes, &opts)?;
    let obj = if view == View::Scale {
        // A Scale is no version of the resource: only its apiVersion is the storage one's.
        if res.is_converted() {
            crate::convert::to_storage(res, obj)
        } else {
            obj
        }
    } else {
        to_storage(server, res, obj).await?
    };
    let sres = storage_def(server, res);
    let w = server.update(&sres, ns, name, view, obj, &opts).await?;
    written_response(server, StatusCode::OK, res, view, w, dups).await
}

/// PATCH: a JSON, merge or strategic merge patch, or server-side apply.
async fn patch(
    r: Request<'_>,
    ns: &str,
    name: &str,
    view: View,
    body: Body,
) -> Result<Response, ApiError> {
    let Request {
        server,
        res,
        q,
        headers,
        ..
    } = r;
    let (opts, bytes) = write_request(r, "PatchOptions", body).await?;
    let ct = content_type(headers);
    let is_apply = ct == crate::patch::APPLY_PATCH;
    // `force` is a pointer upstream: on a non-apply patch, giving it at all is forbidden,
    // whatever its value.
    let force = opt_bool_param(q, "force");
    crate::apply::check_patch_options(
        is_apply,
        q.get("fieldManager").map(String::as_str),
        if is_apply {
            force == Some(true)
        } else {
            force.is_some()
        },
    )?;
    let force = force == Some(true);
    let sres = storage_def(server, res);
    if is_apply {
        let (config, syntax) = decode_apply_body(&bytes)?;
        // Custom objects are applied as the version the client names shows them; other
        // resources served from another's storage take no apply.
        if res.is_converted() && res.custom.is_none() {
            return Err(ApiError::method_not_allowed());
        }
        let dups = server.check_duplicate_fields(res, syntax, &bytes, &opts)?;
        // Managers of a custom resource with a conversion webhook may have written in other
        // versions, whose fields are judged as those versions show the object.
        let by_version =
            res.is_converted() || res.custom.as_ref().is_some_and(|c| c.webhook.is_some());
        let (w, created) = if by_version {
            server
                .apply_converted(res, &sres, ns, name, view, config, force, &opts)
                .await?
        } else {
            server
                .apply(&sres, ns, name, view, config, force, &opts)
                .await?
        };
        let code = if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        return written_response(server, code, res, view, w, dups).await;
    }
    let strategic = crate::patch::strategic_type(res, view);
    let patch = Patch::decode(&ct, &bytes, strategic)?;
    // Custom objects are patched as the version the client names shows them; other
    // resources served from another's storage take no patches.
    let converted_custom =
        res.is_converted() && res.custom.is_some() && matches!(view, View::Main | View::Status);
    if res.is_converted() && !converted_custom {
        return Err(ApiError::method_not_allowed());
    }
    let syntax = match patch {
        Patch::Merge(_) | Patch::Strategic(..) => BodySyntax::Json,
        Patch::Json(_) => BodySyntax::Other,
    };
    let dups = server.check_duplicate_fields(res, syntax, &bytes, &opts)?;
    if converted_custom {
        let w = patch_converted(server, res, &sres, ns, name, view, &patch, &opts).await?;
        return written_response(server, StatusCode::OK, res, view, w, dups).await;
    }
    let w = server.patch(&sres, ns, name, view, &patch, &opts).await?;
    written_response(server, StatusCode::OK, res, view, w, dups).await
}

/// How many times a patch through a converted version is re-applied when the object changed
/// between its read and its write.
const CONVERTED_PATCH_ATTEMPTS: usize = 16;

/// PATCH of a custom object through a version it is not stored in: the patch applies to the
/// object as that version shows it (converted by the CRD's webhook, when it has one), and
/// the result is converted back and written if the object has not changed meanwhile, else
/// all again, as upstream's update loop does.
#[allow(clippy::too_many_arguments)]
async fn patch_converted(
    server: &ApiServer,
    res: &ResourceDef,
    sres: &ResourceDef,
    ns: &str,
    name: &str,
    view: View,
    patch: &Patch,
    opts: &crate::objects::WriteOptions,
) -> Result<crate::objects::Written, ApiError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let current = server.get_object(sres, ns, name).await?;
        let rv = meta::resource_version(&current).to_string();
        let shown = to_api(server, res, current).await?;
        let mut patched = patch.apply(&shown)?;
        crate::typemeta::check_patched(res, patch, &mut patched)?;
        // The patch's own resourceVersion is the client's precondition; without one the
        // write is conditional on the version the patch was applied to.
        let precondition = patch.resource_version().is_some();
        if !precondition {
            meta::set_meta(&mut patched, "resourceVersion", Value::String(rv));
        }
        let stored = to_storage(server, res, patched).await?;
        match server.update(sres, ns, name, view, stored, opts).await {
            Err(e) if e.code == 409 && !precondition && attempt < CONVERTED_PATCH_ATTEMPTS => {
                continue
            }
            result => return result,
        }
    }
}

/// DELETE: deletes the object now, or marks it for deletion (202) while finalizers or a grace
/// period hold it.
async fn delete(r: Request<'_>, ns: &str, name: &str, body: Body) -> Result<Response, ApiError> {
    let Request {
        server,
        res,
        q,
        user,
        ..
    } = r;
    let bytes = read_body(server, body).await?;
    let mut opts = delete_options(q, &bytes)?;
    opts.user = Some(user.clone());
    if res.is_converted() {
        opts.requested = Some(res.clone());
    }
    let sres = storage_def(server, res);
    let d = server.delete(&sres, ns, name, &opts).await?;
    let code = if d.removed {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok(value_response(code, &to_api(server, res, d.object).await?))
}
