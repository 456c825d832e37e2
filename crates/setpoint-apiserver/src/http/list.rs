//! LIST: label and field selectors, pagination with continue tokens, the resourceVersion
//! rules (served from the watch cache), and DELETE of a collection.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use base64::Engine;
use bytes::{Bytes, BytesMut};
use http::StatusCode;
use serde_json::{json, Value};
use setpoint_api::selector::{FieldSelector, LabelSelector};
use setpoint_api::ApiError;
use setpoint_store::Revision;

use crate::objects::CACHE_WAIT;
use crate::registry::ResourceDef;
use crate::request::{ListParams, Query, RvParam};
use crate::state::ApiServer;
use crate::watchcache::{CachedObject, Filter};

use super::negotiation::partial_list;
use super::negotiation::table_requested;
use super::negotiation::wants_metadata;
use super::options::delete_options;
use super::read_body;
use super::respond::{to_api, to_api_all};
use super::{storage_def, Request};
use crate::response::json_response;
use crate::response::value_response;

/// Builds the list/watch filter from the request.
pub(super) fn filter_for(
    server: &ApiServer,
    res: &ResourceDef,
    namespace: Option<&str>,
    q: &Query,
) -> Result<Filter, ApiError> {
    let labels = match q.get("labelSelector") {
        Some(s) if !s.is_empty() => {
            Some(LabelSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?)
        }
        _ => None,
    };
    let fields = match q.get("fieldSelector") {
        Some(s) if !s.is_empty() => {
            Some(FieldSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?)
        }
        _ => None,
    };
    let (group, kind) = (res.group.clone(), res.kind.clone());
    if let Some(f) = &fields {
        for r in f.requirements() {
            if !setpoint_kinds::fields::supported(&group, &kind, &r.field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {}",
                    r.field
                )));
            }
        }
    }
    let name = fields
        .as_ref()
        .and_then(|f| f.exact_match("metadata.name"))
        .map(String::from);
    let predicate: Option<crate::watchcache::Predicate> = if labels.is_none() && fields.is_none() {
        None
    } else {
        // Filters read the attributes the cache recorded from the stored form; a resource
        // served under another group's names (events.k8s.io) names the same fields differently.
        let converted = res.is_converted();
        Some(Box::new(move |attrs: &crate::watchcache::Attrs| {
            if let Some(l) = &labels {
                if !l.matches(|k| attrs.label(k)) {
                    return false;
                }
            }
            if let Some(f) = &fields {
                let value = |field: &str| match converted {
                    true => attrs
                        .field(&setpoint_kinds::fields::stored_field(&group, &kind, field))
                        .to_string(),
                    false => attrs.field(field).to_string(),
                };
                if !f.matches(value) {
                    return false;
                }
            }
            true
        }))
    };
    let _ = server;
    Ok(Filter {
        namespace: if res.namespaced {
            namespace.map(String::from)
        } else {
            None
        },
        name,
        predicate,
    })
}

/// The opaque `continue` token: the revision of the first page and the last key returned.
pub(super) fn encode_continue(rev: Revision, key: &str) -> String {
    let j = json!({"v": "setpoint/v1", "rv": rev, "start": key});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(j.to_string())
}

pub(super) fn decode_continue(token: &str) -> Result<(Revision, String), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rev = v.get("rv").and_then(Value::as_i64).ok_or_else(bad)?;
    let key = v
        .get("start")
        .and_then(Value::as_str)
        .ok_or_else(bad)?
        .to_string();
    Ok((rev, key))
}

/// Waits until the watch cache has caught up with the store (a consistent read), or with a
/// client-named revision: the one wait every read that names a revision goes through (LIST,
/// WATCH, GET). A revision the cache does not reach within [`CACHE_WAIT`] is upstream's 504
/// `Too large resource version`.
pub(super) async fn wait_fresh(
    server: &ApiServer,
    at_least: Option<Revision>,
) -> Result<(), ApiError> {
    let target = match at_least {
        Some(r) => r,
        None => server
            .store
            .current_revision()
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?,
    };
    if server.caches.wait_for(target, CACHE_WAIT).await {
        Ok(())
    } else {
        Err(ApiError::too_large_resource_version(
            target.max(0).unsigned_abs(),
            server.caches.revision(),
        ))
    }
}

/// LIST of the collection: from the watch cache (or the store, for an exact revision), one
/// page at a time when the client gives a limit; a Table or partial metadata when it asks.
pub(super) async fn list(r: Request<'_>, namespace: Option<&str>) -> Result<Response, ApiError> {
    let Request {
        server,
        res,
        q,
        headers,
        ..
    } = r;
    let params = ListParams::parse(q)?;
    let filter = filter_for(server, res, namespace, q)?;
    let limit = params
        .limit
        .filter(|l| *l > 0)
        .map(|l| usize::try_from(l).unwrap_or(usize::MAX));
    let rv = params.resource_version;
    let rv_match = params.resource_version_match.as_str();
    let sres = storage_def(server, res);
    let prefix = sres.namespace_prefix(filter.namespace.as_deref());
    let table = table_requested(headers, q)?;
    let metadata_as = wants_metadata(headers).filter(|_| !table);

    // Continuation pages and exact-revision reads come from the store at that revision.
    let from_store = if let Some(token) = &params.continue_token {
        let (rev, key) = decode_continue(token)?;
        Some((Some(key), Some(rev)))
    } else if rv_match == "Exact" {
        // Validation has made sure an exact read names a revision.
        Some((None, rv.revision()))
    } else {
        None
    };
    let (items, revision, cont, remaining): (
        Vec<Arc<Value>>,
        Revision,
        Option<String>,
        Option<usize>,
    ) = if let Some((start, rev)) = from_store {
        let (objs, revision, next, remaining) = server
                .list_from_store(&sres, &prefix, start, rev, limit.unwrap_or(usize::MAX), &filter)
                .await
                .map_err(|e| {
                    if e.code == 410 {
                        ApiError::expired("the continue token is too old: the revision it lists at has been compacted; start a new list without it")
                    } else {
                        e
                    }
                })?;
        let cont = next.map(|k| encode_continue(revision, &k));
        (
            objs.into_iter().map(Arc::new).collect(),
            revision,
            cont,
            remaining,
        )
    } else {
        match rv {
            RvParam::Any => {}
            RvParam::Unset => wait_fresh(server, None).await?,
            RvParam::At(_) => wait_fresh(server, rv.revision()).await?,
        }
        let cache = server.caches.get(&sres.storage_prefix());
        let (objs, revision) = cache.list(&prefix, &filter);
        match limit {
            Some(l) if objs.len() > l && rv != RvParam::Any => {
                let last = objs[l - 1].key.clone();
                let remaining = filter.predicate.is_none().then(|| objs.len() - l);
                let page: Vec<Arc<Value>> =
                    objs[..l].iter().map(|o| Arc::new(o.object())).collect();
                (
                    page,
                    revision,
                    Some(encode_continue(revision, &last)),
                    remaining,
                )
            }
            _ => {
                if let Some(v) = metadata_as {
                    let items = objs.iter().map(|o| o.metadata());
                    let list = partial_list(v, items, revision, None, None);
                    return Ok(value_response(StatusCode::OK, &list));
                }
                if table || res.transformed_on_read() {
                    (
                        objs.iter().map(|o| Arc::new(o.object())).collect(),
                        revision,
                        None,
                        None,
                    )
                } else {
                    // Fast path: splice the cached JSON of each object.
                    return Ok(json_response(
                        StatusCode::OK,
                        list_bytes(res, &objs, revision),
                    ));
                }
            }
        }
    };
    // Metadata is the same in every version (upstream converts no object for it).
    let items: Vec<Arc<Value>> = if res.transformed_on_read() && metadata_as.is_none() {
        let objs = items.into_iter().map(|o| (*o).clone()).collect();
        to_api_all(server, res, objs)
            .await?
            .into_iter()
            .map(Arc::new)
            .collect()
    } else {
        items
    };
    if table {
        let t = crate::table::table(res, &items, &revision.to_string(), cont.as_deref(), q, true);
        return Ok(value_response(StatusCode::OK, &t));
    }
    if let Some(v) = metadata_as {
        let metadata = items
            .iter()
            .map(|o| o.get("metadata").cloned().unwrap_or(Value::Null));
        let list = partial_list(v, metadata, revision, cont.as_deref(), remaining);
        return Ok(value_response(StatusCode::OK, &list));
    }
    let mut metadata = serde_json::Map::new();
    metadata.insert("resourceVersion".into(), json!(revision.to_string()));
    if let Some(c) = &cont {
        metadata.insert("continue".into(), json!(c));
    }
    if let (Some(r), Some(_)) = (remaining, &cont) {
        metadata.insert("remainingItemCount".into(), json!(r));
    }
    let list = json!({
        "kind": format!("{}List", res.kind),
        "apiVersion": res.api_version(),
        "metadata": Value::Object(metadata),
        "items": items.iter().map(|o| (**o).clone()).collect::<Vec<_>>(),
    });
    Ok(value_response(StatusCode::OK, &list))
}

/// A list document built from cached JSON without re-serializing each object.
pub(super) fn list_bytes(
    res: &ResourceDef,
    objs: &[Arc<CachedObject>],
    revision: Revision,
) -> Bytes {
    let size: usize = objs.iter().map(|o| o.json_len() + 1).sum();
    let mut b = BytesMut::with_capacity(size + 128);
    b.extend_from_slice(
        format!(
            "{{\"kind\":\"{}List\",\"apiVersion\":\"{}\",\"metadata\":{{\"resourceVersion\":\"{revision}\"}},\"items\":[",
            res.kind,
            res.api_version()
        )
        .as_bytes(),
    );
    for (i, o) in objs.iter().enumerate() {
        if i > 0 {
            b.extend_from_slice(b",");
        }
        o.write_json(&mut b);
    }
    b.extend_from_slice(b"]}");
    b.freeze()
}

pub(super) async fn delete_collection(
    server: &Arc<ApiServer>,
    res: &Arc<ResourceDef>,
    namespace: Option<&str>,
    q: &Query,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(server, body).await?;
    let mut opts = delete_options(q, &bytes)?;
    if res.is_converted() {
        opts.requested = Some(res.clone());
    }
    let filter = filter_for(server, res, namespace, q)?;
    let sres = storage_def(server, res);
    wait_fresh(server, None).await?;
    let cache = server.caches.get(&sres.storage_prefix());
    let (objs, revision) = cache.list(&sres.namespace_prefix(filter.namespace.as_deref()), &filter);
    let mut items = Vec::new();
    for o in objs {
        let (ns, name) = (o.attrs.namespace().to_string(), o.attrs.name().to_string());
        match server.delete(&sres, &ns, &name, &opts).await {
            Ok(d) => items.push(to_api(server, res, d.object).await?),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let list = json!({
        "kind": format!("{}List", res.kind),
        "apiVersion": res.api_version(),
        "metadata": {"resourceVersion": revision.to_string()},
        "items": items,
    });
    Ok(value_response(StatusCode::OK, &list))
}
