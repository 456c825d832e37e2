//! The HTTP front: authentication, routing, content negotiation, bounded body decoding, and the
//! LIST/WATCH protocol details (pagination tokens, resourceVersion semantics, streaming).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::Router;
use base64::Engine;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use serde_json::{json, Value};
use setpoint_api::selector::{FieldSelector, LabelSelector};
use setpoint_api::{meta, ApiError};
use setpoint_store::Revision;

use crate::objects::{
    BodySyntax, DeleteOptions, FieldValidation, WriteOptions, Written, CACHE_WAIT,
};
use crate::patch::Patch;
use crate::registry::ResourceDef;
use crate::request::{
    bool_param, field_manager_causes, go_quote, int_param, opt_bool_param, parse_path, rv_param,
    ListParams, PathTarget, Query, RvParam,
};
use crate::server::ApiServer;
use crate::strategy::View;
use crate::tls::Identity;
use crate::watchcache::{CachedObject, EventType, Filter, WatchItem, WatchStart};

/// The router: every path goes through [`handle`].
pub fn router(server: Arc<ApiServer>) -> Router {
    Router::new().fallback(handle).with_state(server)
}

fn parse_query(uri: &Uri) -> Query {
    crate::request::parse_query(uri.query())
}

/// A JSON response.
pub fn json_response(code: StatusCode, body: impl Into<Bytes>) -> Response {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.into()))
        .expect("valid response")
}

fn value_response(code: StatusCode, v: &Value) -> Response {
    json_response(code, serde_json::to_vec(v).unwrap_or_default())
}

/// The response to a write through `view`, with the body's duplicate-field warnings `dups`
/// and the write's own: the written object's JSON as stored when the write has it and the
/// resource serves what it stores, else `object` serialized (converted for `res`, unless it
/// is a Scale, which no resource version describes).
fn written_response(
    code: StatusCode,
    res: &ResourceDef,
    view: View,
    w: Written,
    dups: Vec<String>,
) -> Response {
    let r = match w.json {
        Some(json) if !res.transformed_on_read() => json_response(code, json),
        _ if view == View::Scale => value_response(code, &w.object),
        _ => value_response(code, &to_api(res, w.object)),
    };
    with_warnings(r, &[dups, w.warnings].concat())
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

fn text_response(code: StatusCode, body: impl Into<Bytes>) -> Response {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(body.into()))
        .expect("valid response")
}

/// An `/openapi/v2` response with its ETag; 304 when the client already holds it.
fn openapi_v2_response(headers: &http::HeaderMap, doc: crate::openapi::V2Doc) -> Response {
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

fn with_warnings(mut r: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let v = format!("299 - {}", serde_json::to_string(w).unwrap_or_default());
        if let Ok(h) = HeaderValue::from_str(&v) {
            r.headers_mut().append(http::header::WARNING, h);
        }
    }
    r
}

/// The verb for metrics and logs.
fn verb_of(method: &Method, target: &Result<PathTarget, ApiError>, q: &Query) -> &'static str {
    match (method, target) {
        (&Method::GET, Ok(PathTarget::Collection { .. })) if bool_param(q, "watch") => "WATCH",
        (&Method::GET, Ok(PathTarget::Collection { .. })) => "LIST",
        (&Method::GET, _) => "GET",
        (&Method::POST, _) => "POST",
        (&Method::PUT, _) => "PUT",
        (&Method::PATCH, _) => "PATCH",
        (&Method::DELETE, Ok(PathTarget::Collection { .. })) => "DELETECOLLECTION",
        (&Method::DELETE, _) => "DELETE",
        _ => "OTHER",
    }
}

fn resource_label(target: &Result<PathTarget, ApiError>) -> String {
    match target {
        Ok(PathTarget::Collection { plural, .. }) => plural.clone(),
        Ok(PathTarget::Object {
            plural,
            subresource: Some(s),
            ..
        }) => format!("{plural}/{s}"),
        Ok(PathTarget::Object { plural, .. }) => plural.clone(),
        Ok(_) => "discovery".into(),
        Err(_) => "".into(),
    }
}

/// Every request enters here.
pub async fn handle(State(server): State<Arc<ApiServer>>, req: http::Request<Body>) -> Response {
    let start = Instant::now();
    let (parts, body) = req.into_parts();
    let identity = parts
        .extensions
        .get::<Identity>()
        .cloned()
        .unwrap_or(Identity::Unauthenticated);
    let path = parts.uri.path().to_string();
    let span = tracing::debug_span!("request", method = %parts.method, path = %path);
    let _enter = span.enter();
    if let Some((code, text)) =
        crate::health::answer(&server, &path, parts.uri.query().unwrap_or("")).await
    {
        return text_response(code, text);
    }
    if path == "/version" {
        return value_response(StatusCode::OK, &crate::discovery::version());
    }
    if identity == Identity::Anonymous {
        return error_response(&ApiError::unauthorized());
    }
    if path == "/metrics" {
        use setpoint_api::exposition;
        let accept = parts
            .headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let text = server.metrics.render();
        let (content_type, body) = if exposition::wants_openmetrics(accept) {
            (exposition::OPENMETRICS_TEXT, text)
        } else {
            (
                exposition::PROMETHEUS_TEXT,
                exposition::to_prometheus_text(&text),
            )
        };
        return Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Body::from(body))
            .expect("valid response");
    }
    if path == "/openapi/v2" {
        let accept = parts
            .headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        return match crate::openapi::v2(&server, accept) {
            Ok(doc) => openapi_v2_response(&parts.headers, doc),
            Err(e) => error_response(&e),
        };
    }
    if path == "/openapi/v3" || path.starts_with("/openapi/v3/") {
        return match crate::openapi::v3(&server, &path) {
            Some(doc) => value_response(StatusCode::OK, &doc),
            None => error_response(&ApiError::not_found_path()),
        };
    }
    if !(path == "/api"
        || path.starts_with("/api/")
        || path == "/apis"
        || path.starts_with("/apis/"))
    {
        return error_response(&ApiError::not_found_path());
    }
    let q = parse_query(&parts.uri);
    let target = parse_path(&path);
    let verb = verb_of(&parts.method, &target, &q);
    let resource = resource_label(&target);
    let response = match target {
        Err(e) => error_response(&e),
        Ok(t) => match serve(&server, &parts.method, t, &q, &parts.headers, body).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        },
    };
    server
        .metrics
        .request(verb, &resource, response.status().as_u16(), start.elapsed());
    tracing::debug!(
        status = response.status().as_u16(),
        elapsed_ms = start.elapsed().as_secs_f64() * 1000.0,
        "done"
    );
    response
}

async fn read_body(server: &ApiServer, body: Body) -> Result<Bytes, ApiError> {
    crate::server::connection::read_body(
        body,
        server.config.max_body_bytes,
        server.config.connection.body_read_timeout,
    )
    .await
}

fn content_type(headers: &HeaderMap) -> String {
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
fn decode_object_body(
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

/// The options of a write from the query, validated as upstream validates them (`kind` is
/// `CreateOptions`, `UpdateOptions` or `PatchOptions`): a bad `fieldManager`, `dryRun` or
/// `fieldValidation` is a 422 Invalid on `<kind>.meta.k8s.io` with a cause each.
fn write_options(q: &Query, kind: &str) -> Result<WriteOptions, ApiError> {
    let manager = q.get("fieldManager").cloned();
    let mut causes = field_manager_causes(manager.as_deref().unwrap_or(""));
    let dry_run = match dry_run_param(q) {
        Ok(d) => d,
        Err(c) => {
            causes.push(c);
            false
        }
    };
    let field_validation = match q.get("fieldValidation").map(String::as_str) {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => {
            causes.push(setpoint_api::Cause::new(
                "FieldValueNotSupported",
                "fieldValidation",
                format!(
                    "Unsupported value: {}: supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"",
                    go_quote(other)
                ),
            ));
            FieldValidation::Warn
        }
    };
    if !causes.is_empty() {
        return Err(ApiError::invalid("meta.k8s.io", kind, "", causes));
    }
    Ok(WriteOptions {
        dry_run,
        field_validation,
        field_manager: manager,
    })
}

/// The `dryRun` parameter: absent is false, `All` is true; anything else is upstream's
/// `dryRun: Unsupported value: []string{"x"}: supported values: "All"`.
fn dry_run_param(q: &Query) -> Result<bool, setpoint_api::Cause> {
    match q.get("dryRun").map(String::as_str) {
        None => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(setpoint_api::Cause::new(
            "FieldValueNotSupported",
            "dryRun",
            format!(
                "Unsupported value: []string{{{}}}: supported values: \"All\"",
                go_quote(other)
            ),
        )),
    }
}

/// Fills in the field manager of a write that names none from the User-Agent's product name
/// (`kubectl/v1.32.4 (linux/amd64) …` → `kubectl`), as Kubernetes does.
fn with_default_manager(mut opts: WriteOptions, headers: &HeaderMap) -> WriteOptions {
    if opts.field_manager.as_deref().is_none_or(str::is_empty) {
        opts.field_manager = headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(|m| m.chars().take(128).collect());
    }
    opts
}

/// Decodes a server-side apply body: YAML (JSON is YAML too), which must be an object. A body
/// that is JSON (as kubectl sends) is read as JSON, which is quicker; the syntax that was read is
/// returned for the duplicate-field scan.
fn decode_apply_body(body: &[u8]) -> Result<(Value, BodySyntax), ApiError> {
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
fn accept_ranges(headers: &HeaderMap) -> impl Iterator<Item = Vec<&str>> {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|range| range.split(';').map(str::trim).collect())
}

fn wants_table(headers: &HeaderMap) -> bool {
    accept_ranges(headers).any(|p| p.contains(&"as=Table") && p.contains(&"g=meta.k8s.io"))
}

/// Whether the response is a Table, with its `TableOptions` checked as upstream checks them
/// before converting: an `includeObject` other than `Metadata`, `Object`, `None` or empty is a
/// 400.
fn table_requested(headers: &HeaderMap, q: &Query) -> Result<bool, ApiError> {
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
fn wants_metadata(headers: &HeaderMap) -> Option<&'static str> {
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
fn partial_metadata(metadata: Value, api_version: &str) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": api_version, "metadata": metadata})
}

/// A `PartialObjectMetadataList` of the given metadata.
fn partial_list(
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

fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("as=APIGroupDiscoveryList") && v.contains("v=v2"))
}

/// The storage-side resource of a request resource (itself, unless converted).
fn storage_def(server: &ApiServer, res: &Arc<ResourceDef>) -> Arc<ResourceDef> {
    if res.is_converted() {
        server
            .registry()
            .all()
            .iter()
            .find(|r| {
                !r.is_converted() && r.group == res.storage_group && r.plural == res.storage_plural
            })
            .cloned()
            .unwrap_or_else(|| res.clone())
    } else {
        res.clone()
    }
}

fn to_api(res: &ResourceDef, obj: Value) -> Value {
    if res.transformed_on_read() {
        crate::convert::from_storage(res, obj)
    } else {
        obj
    }
}

async fn serve(
    server: &Arc<ApiServer>,
    method: &Method,
    target: PathTarget,
    q: &Query,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    match target {
        PathTarget::CoreVersions => Ok(discovery_response(server, headers, true)),
        PathTarget::Groups => Ok(discovery_response(server, headers, false)),
        PathTarget::Group { group } => crate::discovery::group(server, &group)
            .map(|v| value_response(StatusCode::OK, &v))
            .ok_or_else(ApiError::not_found_path),
        PathTarget::ResourceList { group, version } => {
            crate::discovery::resource_list(server, &group, &version)
                .map(|v| value_response(StatusCode::OK, &v))
                .ok_or_else(ApiError::not_found_path)
        }
        PathTarget::Collection {
            group,
            version,
            plural,
            namespace,
        } => {
            let res = server
                .registry()
                .get(&group, &version, &plural)
                .cloned()
                .ok_or_else(ApiError::not_found_path)?;
            if !res.namespaced && namespace.is_some() {
                return Err(ApiError::not_found_path());
            }
            match *method {
                Method::GET if bool_param(q, "watch") => {
                    watch(server, &res, namespace.as_deref(), q, headers).await
                }
                Method::GET => list(server, &res, namespace.as_deref(), q, headers).await,
                Method::POST => {
                    let ns = match (&namespace, res.namespaced) {
                        (Some(ns), true) => ns.clone(),
                        (None, true) => return Err(ApiError::method_not_allowed()),
                        _ => String::new(),
                    };
                    let opts = with_default_manager(write_options(q, "CreateOptions")?, headers);
                    let bytes = read_body(server, body).await?;
                    let (obj, syntax) = decode_object_body(&res, headers, &bytes)?;
                    let dups = server.check_duplicate_fields(&res, syntax, &bytes, &opts)?;
                    let sres = storage_def(server, &res);
                    let obj = if res.is_converted() {
                        crate::convert::to_storage(&res, obj)
                    } else {
                        obj
                    };
                    let w = server.create(&sres, &ns, obj, &opts).await?;
                    Ok(written_response(
                        StatusCode::CREATED,
                        &res,
                        View::Main,
                        w,
                        dups,
                    ))
                }
                Method::DELETE => {
                    delete_collection(server, &res, namespace.as_deref(), q, body).await
                }
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        PathTarget::Object {
            group,
            version,
            plural,
            namespace,
            name,
            subresource,
        } => {
            let res = server
                .registry()
                .get(&group, &version, &plural)
                .cloned()
                .ok_or_else(ApiError::not_found_path)?;
            if res.namespaced != namespace.is_some() {
                return Err(ApiError::not_found_path());
            }
            let ns = namespace.unwrap_or_default();
            let sres = storage_def(server, &res);
            if subresource.as_deref() == Some("binding")
                && res.group.is_empty()
                && res.plural == "pods"
            {
                if *method != Method::POST {
                    return Err(ApiError::method_not_allowed());
                }
                let bytes = read_body(server, body).await?;
                return bind_pod(server, &res, &ns, &name, headers, &bytes, q).await;
            }
            if subresource.as_deref() == Some("log") && res.group.is_empty() && res.plural == "pods"
            {
                if *method != Method::GET {
                    return Err(ApiError::method_not_allowed());
                }
                return pod_log(server, &res, &ns, &name, q).await;
            }
            let view = View::parse(&res, subresource.as_deref())?;
            match *method {
                Method::GET => {
                    if view == View::Finalize {
                        return Err(ApiError::method_not_allowed());
                    }
                    // A GET is served from the store, which is always current: a revision
                    // it names only has to be one the server has reached.
                    if let rv @ RvParam::At(_) = rv_param(q)? {
                        wait_fresh(server, rv.revision()).await?;
                    }
                    let obj = to_api(&res, server.get_object(&sres, &ns, &name).await?);
                    let obj = if view == View::Scale {
                        crate::strategy::scale_of(&res, &obj)
                    } else {
                        obj
                    };
                    if view == View::Main && table_requested(headers, q)? {
                        let rv = meta::resource_version(&obj).to_string();
                        let t = crate::table::table(&res, &[Arc::new(obj)], &rv, None, q, true);
                        return Ok(value_response(StatusCode::OK, &t));
                    }
                    if let Some(v) = wants_metadata(headers).filter(|_| view == View::Main) {
                        let m = obj.get("metadata").cloned().unwrap_or(Value::Null);
                        return Ok(value_response(StatusCode::OK, &partial_metadata(m, v)));
                    }
                    Ok(value_response(StatusCode::OK, &obj))
                }
                Method::PUT => {
                    let opts = with_default_manager(write_options(q, "UpdateOptions")?, headers);
                    let bytes = read_body(server, body).await?;
                    let (obj, syntax) = if view == View::Scale {
                        let obj = serde_json::from_slice(&bytes).map_err(|e| {
                            ApiError::bad_request(format!(
                                "Scale in version \"v1\" cannot be handled as a Scale: {e}"
                            ))
                        })?;
                        (obj, BodySyntax::Json)
                    } else {
                        decode_object_body(&res, headers, &bytes)?
                    };
                    let dups = server.check_duplicate_fields(&res, syntax, &bytes, &opts)?;
                    let obj = if res.is_converted() {
                        crate::convert::to_storage(&res, obj)
                    } else {
                        obj
                    };
                    let w = server.update(&sres, &ns, &name, view, obj, &opts).await?;
                    Ok(written_response(StatusCode::OK, &res, view, w, dups))
                }
                Method::PATCH => {
                    if view == View::Finalize {
                        return Err(ApiError::method_not_allowed());
                    }
                    let opts = with_default_manager(write_options(q, "PatchOptions")?, headers);
                    let bytes = read_body(server, body).await?;
                    let ct = content_type(headers);
                    let is_apply = ct == crate::patch::APPLY_PATCH;
                    // `force` is a pointer upstream: on a non-apply patch, giving it at all is
                    // forbidden, whatever its value.
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
                    if is_apply {
                        let (config, syntax) = decode_apply_body(&bytes)?;
                        if res.is_converted() {
                            return Err(ApiError::method_not_allowed());
                        }
                        let dups = server.check_duplicate_fields(&res, syntax, &bytes, &opts)?;
                        let (w, created) = server
                            .apply(&sres, &ns, &name, view, config, force, &opts)
                            .await?;
                        let code = if created {
                            StatusCode::CREATED
                        } else {
                            StatusCode::OK
                        };
                        return Ok(written_response(code, &res, view, w, dups));
                    }
                    let strategic = crate::patch::strategic_type(&res, view);
                    let patch = Patch::decode(&ct, &bytes, strategic)?;
                    if res.is_converted() {
                        return Err(ApiError::method_not_allowed());
                    }
                    let syntax = match patch {
                        Patch::Merge(_) | Patch::Strategic(..) => BodySyntax::Json,
                        Patch::Json(_) => BodySyntax::Other,
                    };
                    let dups = server.check_duplicate_fields(&res, syntax, &bytes, &opts)?;
                    let w = server.patch(&sres, &ns, &name, view, &patch, &opts).await?;
                    Ok(written_response(StatusCode::OK, &res, view, w, dups))
                }
                Method::DELETE if view == View::Main => {
                    let bytes = read_body(server, body).await?;
                    let opts = delete_options(q, &bytes)?;
                    let d = server.delete(&sres, &ns, &name, &opts).await?;
                    let code = if d.removed {
                        StatusCode::OK
                    } else {
                        StatusCode::ACCEPTED
                    };
                    Ok(value_response(code, &to_api(&res, d.object)))
                }
                _ => Err(ApiError::method_not_allowed()),
            }
        }
    }
}

fn discovery_response(server: &ApiServer, headers: &HeaderMap, core: bool) -> Response {
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

/// `DeleteOptions` from a JSON body (kubectl) or the query (Python client).
fn delete_options(q: &Query, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let mut o = DeleteOptions::default();
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v: Value = if body.starts_with(b"k8s\0") {
            setpoint_protobuf::decode(body)
                .map_err(|e| ApiError::bad_request(format!("decoding DeleteOptions: {e}")))?
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("decoding DeleteOptions: {e}")))?
        };
        o.grace_period_seconds = v.get("gracePeriodSeconds").and_then(Value::as_i64);
        o.propagation_policy = v
            .get("propagationPolicy")
            .and_then(Value::as_str)
            .map(String::from);
        if v.get("orphanDependents").and_then(Value::as_bool) == Some(true)
            && o.propagation_policy.is_none()
        {
            o.propagation_policy = Some("Orphan".into());
        }
        o.precondition_uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from);
        o.precondition_resource_version = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from);
        o.dry_run = v
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "All"));
    }
    if let Some(g) = int_param(q, "gracePeriodSeconds")? {
        o.grace_period_seconds = Some(g);
    }
    let mut causes = Vec::new();
    if let Some(p) = q.get("propagationPolicy") {
        if !matches!(p.as_str(), "Foreground" | "Background" | "Orphan") {
            causes.push(setpoint_api::Cause::new(
                "FieldValueNotSupported",
                "propagationPolicy",
                format!(
                    "Unsupported value: {}: supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\"",
                    go_quote(p)
                ),
            ));
        }
        o.propagation_policy = Some(p.clone());
    }
    match opt_bool_param(q, "orphanDependents") {
        Some(_) if q.contains_key("propagationPolicy") => {
            let p = q.get("propagationPolicy").map_or("", String::as_str);
            causes.insert(
                0,
                setpoint_api::Cause::new(
                    "FieldValueInvalid",
                    "propagationPolicy",
                    format!(
                        "Invalid value: {}: orphanDependents and deletionPropagation cannot be both set",
                        go_quote(p)
                    ),
                ),
            );
        }
        Some(true) if o.propagation_policy.is_none() => {
            o.propagation_policy = Some("Orphan".into());
        }
        _ => {}
    }
    match dry_run_param(q) {
        Ok(true) => o.dry_run = true,
        Ok(false) => {}
        Err(c) => causes.push(c),
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "DeleteOptions",
            "",
            causes,
        ));
    }
    Ok(o)
}

/// Builds the list/watch filter from the request.
fn filter_for(
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
fn encode_continue(rev: Revision, key: &str) -> String {
    let j = json!({"v": "setpoint/v1", "rv": rev, "start": key});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(j.to_string())
}

fn decode_continue(token: &str) -> Result<(Revision, String), ApiError> {
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
async fn wait_fresh(server: &ApiServer, at_least: Option<Revision>) -> Result<(), ApiError> {
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

async fn list(
    server: &Arc<ApiServer>,
    res: &Arc<ResourceDef>,
    namespace: Option<&str>,
    q: &Query,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
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
    let items: Vec<Arc<Value>> = if res.transformed_on_read() {
        items
            .into_iter()
            .map(|o| Arc::new(to_api(res, (*o).clone())))
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
fn list_bytes(res: &ResourceDef, objs: &[Arc<CachedObject>], revision: Revision) -> Bytes {
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

async fn delete_collection(
    server: &Arc<ApiServer>,
    res: &Arc<ResourceDef>,
    namespace: Option<&str>,
    q: &Query,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(server, body).await?;
    let opts = delete_options(q, &bytes)?;
    let filter = filter_for(server, res, namespace, q)?;
    let sres = storage_def(server, res);
    wait_fresh(server, None).await?;
    let cache = server.caches.get(&sres.storage_prefix());
    let (objs, revision) = cache.list(&sres.namespace_prefix(filter.namespace.as_deref()), &filter);
    let mut items = Vec::new();
    for o in objs {
        let (ns, name) = (o.attrs.namespace().to_string(), o.attrs.name().to_string());
        match server.delete(&sres, &ns, &name, &opts).await {
            Ok(d) => items.push(to_api(res, d.object)),
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

/// `GET pods/<name>/log`: proxied to the agent of the pod's node.
async fn pod_log(
    server: &Arc<ApiServer>,
    res: &Arc<ResourceDef>,
    ns: &str,
    name: &str,
    q: &Query,
) -> Result<Response, ApiError> {
    let pod = server.get_object(res, ns, name).await?;
    let node_name = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if node_name.is_empty() {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    }
    let nodes = server
        .registry()
        .get("", "v1", "nodes")
        .cloned()
        .ok_or_else(ApiError::not_found_path)?;
    let node = server.get_object(&nodes, "", &node_name).await?;
    let tls = server.agent_tls.read().clone();
    crate::podlogs::stream(tls, &pod, &node, q).await
}

/// `POST pods/<name>/binding`: sets `spec.nodeName` once.
async fn bind_pod(
    server: &Arc<ApiServer>,
    res: &Arc<ResourceDef>,
    ns: &str,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
    q: &Query,
) -> Result<Response, ApiError> {
    let binding_def = ResourceDef {
        kind: "Binding".into(),
        ..(**res).clone()
    };
    let (binding, _) = decode_object_body(&binding_def, headers, body)?;
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if node.is_empty() {
        return Err(ApiError::invalid(
            "",
            "Binding",
            name,
            vec![setpoint_api::Cause::required("target.name", "")],
        ));
    }
    let opts = write_options(q, "CreateOptions")?;
    server.bind(res, ns, name, &node, &opts).await?;
    Ok(value_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

/// Formats one watch event line.
fn event_line(kind: &str, object: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(object.len() + kind.len() + 24);
    event_line_into(&mut b, kind, |b| b.extend_from_slice(object));
    b.freeze()
}

/// Appends `{"type":<kind>,"object":<what write_object appends>}` and a newline.
fn event_line_into(b: &mut BytesMut, kind: &str, write_object: impl FnOnce(&mut BytesMut)) {
    b.extend_from_slice(b"{\"type\":\"");
    b.extend_from_slice(kind.as_bytes());
    b.extend_from_slice(b"\",\"object\":");
    write_object(b);
    b.extend_from_slice(b"}\n");
}

/// A 200 whose body is one watch ERROR event carrying `e`'s `Status`: how a watch reports a
/// problem found after its parameters were accepted (upstream: "once we have ... successfully
/// parsed a resource version, other errors must fail with a watch event of type ERROR").
fn watch_error(e: &ApiError) -> Response {
    let line = event_line(
        "ERROR",
        &serde_json::to_vec(&e.to_status()).unwrap_or_default(),
    );
    json_response(StatusCode::OK, line)
}

async fn watch(
    server: &Arc<ApiServer>,
    res: &Arc<ResourceDef>,
    namespace: Option<&str>,
    q: &Query,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let params = ListParams::parse(q)?;
    let filter = filter_for(server, res, namespace, q)?;
    let sres = storage_def(server, res);
    let rv = params.resource_version;
    let send_initial = params.send_initial_events;
    let bookmarks = params.allow_watch_bookmarks;
    let fresh = match (rv, send_initial) {
        // A consistent initial state: the cache catches up with the store first.
        (RvParam::Unset, Some(true)) => wait_fresh(server, None).await,
        // Any other named revision must be one the cache reaches.
        (RvParam::At(_), _) => wait_fresh(server, rv.revision()).await,
        _ => Ok(()),
    };
    if let Err(e) = fresh {
        return Ok(watch_error(&e));
    }
    let start = match (rv, send_initial) {
        (_, Some(true)) | (RvParam::Unset | RvParam::Any, None) => WatchStart::CurrentState,
        // No initial events: changes from the newest revision on.
        (RvParam::Unset | RvParam::Any, Some(false)) => WatchStart::After(server.caches.revision()),
        (RvParam::At(_), _) => WatchStart::After(rv.revision().unwrap_or(0)),
    };
    let initial_end_bookmark = send_initial == Some(true) && bookmarks;
    let timeout = match params.timeout_seconds {
        // Upstream's watch runs under a context whose deadline is already past: it ends at once.
        Some(t) if t < 0 => return Ok(json_response(StatusCode::OK, Bytes::new())),
        Some(t) if t > 0 => Duration::from_secs(t.unsigned_abs()),
        // Kubernetes spreads long watches over 30–60 minutes so reconnects don't bunch up.
        _ => Duration::from_secs(1800 + rand::random::<u64>() % 1800),
    };
    let cache = server.caches.get(&sres.storage_prefix());
    let table = table_requested(headers, q)?;
    let metadata_as = wants_metadata(headers).filter(|_| !table);
    let handle = match cache.watch(start, filter, bookmarks) {
        Ok(h) => h,
        // Clients expect a 200 with an ERROR event for an expired resourceVersion.
        Err(e) => return Ok(watch_error(&e)),
    };
    let res = res.clone();
    let q = q.clone();
    let state = WatchState {
        res,
        table,
        metadata_as,
        first_table: true,
        q,
    };
    let revision = handle.revision;
    // A deadline far past any real one still fits the clock.
    let deadline =
        tokio::time::Instant::now() + timeout.min(Duration::from_secs(10 * 365 * 24 * 3600));
    let stream = futures::stream::unfold(
        (state, handle, initial_end_bookmark, revision),
        move |(mut state, mut handle, mut end_bookmark, revision)| async move {
            // Initial events are taken one at a time, as the connection asks for more, so
            // only what the connection has room for is ever serialized.
            let item = if let Some(i) = handle.next_initial() {
                Some(i)
            } else if end_bookmark {
                end_bookmark = false;
                let line = state.bookmark(revision, true);
                return Some((
                    Ok::<Bytes, Infallible>(line),
                    (state, handle, end_bookmark, revision),
                ));
            } else {
                match tokio::time::timeout_at(deadline, handle.next_live()).await {
                    Ok(Some(i)) => Some(i),
                    _ => None,
                }
            };
            let item = item?;
            let line = match item {
                WatchItem::Event(t, obj) => state.event(t, &obj),
                WatchItem::Bookmark(rv) => state.bookmark(rv, false),
            };
            Some((Ok(line), (state, handle, end_bookmark, revision)))
        },
    );
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CACHE_CONTROL, "no-cache, private")
        .body(Body::from_stream(coalesced(stream)))
        .expect("valid response"))
}

/// At most this many watch events go out in one body chunk.
const EVENTS_PER_CHUNK: usize = 64;
/// A chunk stops growing past this size (an event is never split).
const CHUNK_BYTES: usize = 256 * 1024;

/// Joins the events of `lines` that are ready together into one body chunk, never waiting for
/// more. Under load a watcher is sent one HTTP/2 frame, TLS record and write for many events
/// instead of one each: the writes were about a twentieth of the server's CPU with one
/// client watching 30,000 pods start. An idle watch sends each event alone, at once.
///
/// It takes an event from `lines` only when it has room for it in the chunk it is building,
/// so what a watcher holds serialized is at most one chunk and one event, however far its
/// client is behind: joining a fixed number of ready events instead held 64 whole objects per
/// stalled watch (64 MiB for objects of 1 MiB).
fn coalesced(
    lines: impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> futures::stream::BoxStream<'static, Result<Bytes, Infallible>> {
    Coalesced {
        lines: lines.boxed(),
        held: None,
        done: false,
    }
    .boxed()
}

/// The stream [`coalesced`] returns.
struct Coalesced {
    lines: futures::stream::BoxStream<'static, Result<Bytes, Infallible>>,
    /// An event taken that did not fit the last chunk: the next chunk starts with it.
    held: Option<Bytes>,
    /// `lines` has ended.
    done: bool,
}

impl futures::Stream for Coalesced {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        // The first event of the chunk, kept as it is until a second one joins it.
        let mut first: Option<Bytes> = this.held.take();
        let mut joined: Option<BytesMut> = None;
        let mut events = usize::from(first.is_some());
        loop {
            let len = joined
                .as_ref()
                .map_or_else(|| first.as_ref().map_or(0, Bytes::len), BytesMut::len);
            if this.done || events >= EVENTS_PER_CHUNK || len >= CHUNK_BYTES {
                break;
            }
            let line = match this.lines.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(line))) => line,
                Poll::Ready(None) => {
                    this.done = true;
                    break;
                }
                Poll::Pending => break,
            };
            if len > 0 && len + line.len() > CHUNK_BYTES {
                this.held = Some(line);
                break;
            }
            events += 1;
            match (&mut joined, first.take()) {
                (Some(j), _) => j.extend_from_slice(&line),
                (None, Some(f)) => {
                    let mut j = BytesMut::with_capacity((f.len() + line.len()) * 2);
                    j.extend_from_slice(&f);
                    j.extend_from_slice(&line);
                    joined = Some(j);
                }
                (None, None) => first = Some(line),
            }
        }
        match (joined, first) {
            (Some(j), _) => Poll::Ready(Some(Ok(j.freeze()))),
            (None, Some(f)) => Poll::Ready(Some(Ok(f))),
            (None, None) if this.done => Poll::Ready(None),
            (None, None) => Poll::Pending,
        }
    }
}

struct WatchState {
    res: Arc<ResourceDef>,
    table: bool,
    /// Objects go out as `PartialObjectMetadata` of this `meta.k8s.io` version.
    metadata_as: Option<&'static str>,
    first_table: bool,
    q: Query,
}

impl WatchState {
    fn event(&mut self, t: EventType, obj: &Arc<CachedObject>) -> Bytes {
        if self.table {
            let o = Arc::new(to_api(&self.res, obj.object()));
            let rv = meta::resource_version(&o).to_string();
            let tbl = crate::table::table(&self.res, &[o], &rv, None, &self.q, self.first_table);
            self.first_table = false;
            return event_line(t.as_str(), &serde_json::to_vec(&tbl).unwrap_or_default());
        }
        if let Some(v) = self.metadata_as {
            // What `partial_metadata` serializes to, without parsing the object.
            let mut b = BytesMut::with_capacity(obj.json_len().min(4096) + 96);
            event_line_into(&mut b, t.as_str(), |b| {
                b.extend_from_slice(b"{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":");
                let _ = serde_json::to_writer(bytes::BufMut::writer(&mut *b), v);
                b.extend_from_slice(b",\"metadata\":");
                obj.write_metadata_json(b);
                b.extend_from_slice(b"}");
            });
            return b.freeze();
        }
        if self.res.transformed_on_read() {
            let o = to_api(&self.res, obj.object());
            return event_line(t.as_str(), &serde_json::to_vec(&o).unwrap_or_default());
        }
        let kind = t.as_str();
        let mut b = BytesMut::with_capacity(obj.json_len() + kind.len() + 24);
        event_line_into(&mut b, kind, |b| obj.write_json(b));
        b.freeze()
    }

    fn bookmark(&self, rv: Revision, initial_end: bool) -> Bytes {
        let mut m = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            m["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let (kind, api_version) = if self.table {
            ("Table".to_string(), "meta.k8s.io/v1".to_string())
        } else if let Some(v) = self.metadata_as {
            ("PartialObjectMetadata".to_string(), v.to_string())
        } else {
            (self.res.kind.clone(), self.res.api_version())
        };
        let o = json!({"kind": kind, "apiVersion": api_version, "metadata": m});
        event_line("BOOKMARK", &serde_json::to_vec(&o).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize, size: usize) -> Vec<Bytes> {
        (0..n)
            .map(|i| {
                let mut l = vec![b'a' + (i % 26) as u8; size - 1];
                l.push(b'\n');
                Bytes::from(l)
            })
            .collect()
    }

    fn chunks_of(input: Vec<Bytes>) -> Vec<Bytes> {
        let stream = futures::stream::iter(input.into_iter().map(Ok::<_, Infallible>));
        futures::executor::block_on(coalesced(stream).map(|r| r.unwrap()).collect())
    }

    #[test]
    fn ready_events_go_out_together_within_bounds() {
        for (n, size) in [(1, 10), (3, 10), (200, 100), (10, 100_000), (3, 300_000)] {
            let input = lines(n, size);
            let chunks = chunks_of(input.clone());
            assert_eq!(chunks.concat(), input.concat(), "{n} x {size}");
            for c in &chunks {
                let events = c.iter().filter(|b| **b == b'\n').count();
                assert!(events <= EVENTS_PER_CHUNK, "{n} x {size}");
                // Only an event bigger than the bound makes a bigger chunk, and goes alone.
                assert!(c.len() <= CHUNK_BYTES || events == 1, "{n} x {size}");
                assert!(c.ends_with(b"\n"), "events are never split");
            }
            assert!(chunks.len() >= n.div_ceil(EVENTS_PER_CHUNK));
        }
        assert_eq!(chunks_of(lines(200, 100)).len(), 4);
    }

    /// The coalescer takes an event only when it can send it with the chunk it builds (or
    /// next): a stalled watcher holds one chunk and one event serialized, not a batch.
    #[test]
    fn events_are_taken_only_as_chunks_go_out() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let taken = Arc::new(AtomicUsize::new(0));
        let counted = taken.clone();
        let input = lines(1000, 100_000);
        let stream = futures::stream::iter(input).map(move |l| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Infallible>(l)
        });
        let mut chunks = coalesced(stream);
        let mut sent = 0;
        for _ in 0..5 {
            let chunk = futures::executor::block_on(chunks.next()).unwrap().unwrap();
            assert!(chunk.len() <= CHUNK_BYTES);
            sent += chunk.iter().filter(|b| **b == b'\n').count();
            assert!(taken.load(Ordering::SeqCst) <= sent + 1, "{sent}");
        }
    }
}
