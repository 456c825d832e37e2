//! The HTTP front: who is calling, which endpoint a path names, and the dispatch of API
//! requests to the handlers of a collection ([`collection`]) or an object ([`object`]).
//!
//! The rest is one concern a module: content negotiation and body decoding
//! ([`negotiation`]), the options of writes and deletes ([`options`]), the LIST protocol
//! ([`list`]: selectors, pagination tokens, resourceVersion semantics), WATCH streaming
//! ([`watch`]), pods' own operations ([`pods`]) and the responses built from API objects
//! ([`respond`]).

mod collection;
mod list;
mod negotiation;
mod object;
mod options;
mod pods;
mod respond;
mod watch;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, Uri};
use setpoint_api::ApiError;

use crate::authentication::{Identity, UserInfo};
use crate::authorization::Attributes;
use crate::registry::ResourceDef;
use crate::request::{bool_param, parse_path, PathTarget, Query};
use crate::state::ApiServer;

use self::respond::discovery_response;
use self::respond::openapi_v2_response;
use crate::response::error_response;
use crate::response::text_response;
use crate::response::value_response;

/// The router: every path goes through [`handle`].
pub fn router(server: Arc<ApiServer>) -> Router {
    Router::new().fallback(handle).with_state(server)
}

fn parse_query(uri: &Uri) -> Query {
    crate::request::parse_query(uri.query())
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
    // The live view's static files need no identity: the page authenticates its own API
    // calls (docs/ui.md).
    if crate::ui::is_ui_path(req.uri().path()) {
        return crate::ui::serve(req.method(), req.uri().path());
    }
    // Injected latency (tests only): every request but the switch's own, so a harness can
    // always end it.
    if let Some(faults) = &server.faults {
        if req.uri().path() != crate::faults::FAULTS_PATH {
            faults.delay().await;
        }
    }
    let (parts, body) = req.into_parts();
    let identity = parts
        .extensions
        .get::<Identity>()
        .cloned()
        .unwrap_or(Identity::Internal);
    let path = parts.uri.path().to_string();
    let span = tracing::debug_span!("request", method = %parts.method, path = %path);
    let _enter = span.enter();
    let audit_id = crate::audit::audit_id(&parts.headers);
    let mut response = match server
        .authenticators
        .authenticate(&identity, &parts.headers)
    {
        Ok(user) => match &server.audit {
            None => dispatch(&server, parts, body, path, user, None, start).await,
            Some(_) => audited(&server, parts, body, path, user, &audit_id, start).await,
        },
        Err(e) => error_response(&e),
    };
    response
        .headers_mut()
        .insert(crate::audit::AUDIT_ID_HEADER, audit_id);
    response
}

/// [`dispatch`] under audit: the policy's level for the authenticated user's request, its
/// body captured when the level records it, its stages written, a panic recorded.
async fn audited(
    server: &Arc<ApiServer>,
    parts: http::request::Parts,
    body: Body,
    path: String,
    user: Arc<UserInfo>,
    audit_id: &http::HeaderValue,
    start: Instant,
) -> Response {
    use futures::FutureExt;
    let q = parse_query(&parts.uri);
    let attributes = match is_api_path(&path).then(|| parse_path(&path)) {
        Some(Ok(t)) => Attributes::for_request(user.clone(), &parts.method, &path, &t, &q),
        _ => Attributes::non_resource(user.clone(), &parts.method, &path),
    };
    let id = audit_id.to_str().unwrap_or_default();
    let begun = server
        .audit
        .as_ref()
        .and_then(|a| a.begin(&attributes, &parts, id));
    let Some(mut rec) = begun else {
        return dispatch(server, parts, body, path, user, None, start).await;
    };
    let body = match rec.capture_request(server, &parts, body).await {
        Ok(body) => body,
        Err(e) => return rec.finish(error_response(&e)).await,
    };
    // Admission's audit annotations are gathered while the request is handled.
    let (handled, notes) = crate::audit::collect_annotations(
        std::panic::AssertUnwindSafe(dispatch(
            server,
            parts,
            body,
            path,
            user,
            Some(&mut rec),
            start,
        ))
        .catch_unwind(),
    )
    .await;
    rec.admission_annotations(notes);
    match handled {
        Ok(response) => rec.finish(response).await,
        Err(panic) => {
            rec.panicked(&*panic);
            std::panic::resume_unwind(panic)
        }
    }
}

fn is_api_path(path: &str) -> bool {
    path == "/api" || path.starts_with("/api/") || path == "/apis" || path.starts_with("/apis/")
}

/// An authenticated request: impersonation, authorization, then the endpoint the path names.
/// `audit` records what the audit events need to know on the way.
async fn dispatch(
    server: &Arc<ApiServer>,
    mut parts: http::request::Parts,
    body: Body,
    path: String,
    user: Arc<UserInfo>,
    mut audit: Option<&mut crate::audit::Recorder>,
    start: Instant,
) -> Response {
    // `kubectl --as`: from here on the request is the impersonated user's, if it may be.
    use crate::authentication::impersonation::{impersonate, Refusal};
    let authenticated = user.clone();
    let user = match impersonate(&server.authorizers, user, &parts.headers) {
        Ok(user) => user,
        Err(Refusal::Forbidden(e)) => return error_response(&e),
        Err(Refusal::Malformed(m)) => {
            let uri = parts
                .uri
                .path_and_query()
                .map_or(path.as_str(), |p| p.as_str());
            return text_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Internal Server Error: {uri:?}: {m}\n"),
            );
        }
    };
    if let Some(rec) = audit.as_deref_mut() {
        if !Arc::ptr_eq(&authenticated, &user) {
            rec.impersonated(&user);
        }
    }
    let q = parse_query(&parts.uri);
    let target = is_api_path(&path).then(|| parse_path(&path));
    let attributes = match &target {
        Some(Ok(t)) => Attributes::for_request(user, &parts.method, &path, t, &q),
        _ => Attributes::non_resource(user, &parts.method, &path),
    };
    let decision = server.authorizers.decide(&attributes);
    if let Some(rec) = audit {
        rec.authorized(&decision);
    }
    if let Err(e) = decision.into_result(&attributes) {
        return error_response(&e);
    }
    // Decision records pushed by a component of this process, as they are (no JSON body).
    if path == setpoint_api::trail::DECISIONS_PATH {
        if let Some(local) = parts.extensions.remove::<setpoint_api::trail::LocalPush>() {
            let user = &attributes.user.username;
            return match crate::trail::push_local(server, &parts.method, user, local) {
                Ok((code, v)) => value_response(code, &v),
                Err(e) => error_response(&e),
            };
        }
    }
    if let Some((code, text)) =
        crate::health::answer(server, &path, parts.uri.query().unwrap_or("")).await
    {
        return text_response(code, text);
    }
    if path == "/version" {
        return value_response(StatusCode::OK, &crate::discovery::version());
    }
    // `setpoint why`'s endpoints: decision records in, causal chains out.
    if path.starts_with("/debug/setpoint/") {
        let body = match read_body(server, body).await {
            Ok(b) => b,
            Err(e) => return error_response(&e),
        };
        // The fault-injection switch, when the server was started with it.
        if let Some(answer) =
            crate::faults::serve(server.faults.as_ref(), &parts.method, &path, &body)
        {
            return match answer {
                Ok((code, state)) => value_response(code, &serde_json::json!(state)),
                Err(e) => error_response(&e),
            };
        }
        let user = attributes.user.username.clone();
        let query = parts.uri.query();
        let answer = crate::trail::serve(server, &parts.method, &path, query, &user, body).await;
        // The live view asks for the chain as `kubectl why` prints it (one rendering, in
        // setpoint_api::trail), with `Accept: text/plain`.
        let wants_text = parts
            .headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|a| a.starts_with("text/plain"));
        return match answer {
            Some(Ok((code, v))) if wants_text && path == setpoint_api::trail::WHY_PATH => {
                match serde_json::from_value::<setpoint_api::trail::Explanation>(v) {
                    Ok(e) => text_response(code, setpoint_api::trail::render(&e)),
                    Err(e) => error_response(&ApiError::internal(e.to_string())),
                }
            }
            Some(Ok((code, v))) => value_response(code, &v),
            Some(Err(e)) => error_response(&e),
            None => error_response(&ApiError::not_found_path()),
        };
    }
    // The service-account issuer's discovery documents.
    if path == "/.well-known/openid-configuration" || path == "/openid/v1/jwks" {
        let issuer = &server.service_accounts;
        let (doc, content_type) = if path == "/openid/v1/jwks" {
            (issuer.jwks(), "application/jwk-set+json")
        } else {
            let address = server.address.read().clone();
            (issuer.openid_configuration(&address), "application/json")
        };
        return Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Body::from(doc.to_string()))
            .expect("valid response");
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
        return match crate::openapi::v2(server, accept) {
            Ok(doc) => openapi_v2_response(&parts.headers, doc),
            Err(e) => error_response(&e),
        };
    }
    if path == "/openapi/v3" || path.starts_with("/openapi/v3/") {
        return match crate::openapi::v3(server, &path) {
            Some(doc) => value_response(StatusCode::OK, &doc),
            None => error_response(&ApiError::not_found_path()),
        };
    }
    let Some(target) = target else {
        return error_response(&ApiError::not_found_path());
    };
    let verb = verb_of(&parts.method, &target, &q);
    let resource = resource_label(&target);
    // A group/version an APIService delegates to an extension server is relayed there.
    if let Some(api_service) = crate::aggregator::proxied(server, &path) {
        // An upgrade request's connection, which the relay splices once switched.
        let client_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
        let response = crate::aggregator::proxy(
            server,
            &api_service,
            &attributes.user,
            &parts.method,
            &path,
            parts.uri.query(),
            &parts.headers,
            body,
            client_upgrade,
        )
        .await;
        let status = response.status().as_u16();
        server
            .metrics
            .request(verb, &resource, status, start.elapsed());
        return response;
    }
    let response = match target {
        Err(e) => error_response(&e),
        // `pods/proxy`, `services/proxy` and `nodes/proxy` relay the request, body and all.
        Ok(PathTarget::Object {
            group,
            plural,
            namespace,
            name,
            subresource: Some(sub),
            version,
        }) if group.is_empty()
            && version == "v1"
            && sub == "proxy"
            && crate::proxy::PROXIED.contains(&plural.as_str())
            && namespace.is_some() == (plural != "nodes") =>
        {
            // A WebSocket through the proxy switches protocols: the relay splices it.
            let upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
            crate::proxy::serve(
                server,
                &plural,
                namespace.as_deref(),
                &name,
                &path,
                parts.uri.query(),
                &parts.method,
                &parts.headers,
                body,
                upgrade,
            )
            .await
            .unwrap_or_else(|e| error_response(&e))
        }
        // exec, attach and portforward switch protocols: they need the connection's upgrade.
        Ok(PathTarget::Object {
            group,
            plural,
            namespace: Some(ns),
            name,
            subresource: Some(sub),
            version,
        }) if group.is_empty()
            && version == "v1"
            && plural == "pods"
            && crate::podstream::Subresource::parse(&sub).is_some() =>
        {
            let upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
            let sub = crate::podstream::Subresource::parse(&sub).expect("checked above");
            pods::pod_stream(
                server,
                &attributes,
                sub,
                &ns,
                &name,
                &parts.method,
                &parts.headers,
                parts.uri.query(),
                upgrade,
            )
            .await
            .unwrap_or_else(|e| error_response(&e))
        }
        Ok(t) => {
            // Writes leave a record in the trail `setpoint why` reads.
            let subresource = match &t {
                PathTarget::Object { subresource, .. } => subresource.clone(),
                _ => None,
            };
            let user = &attributes.user;
            let serving = serve(server, user, &parts.method, t, &q, &parts.headers, body);
            let served = server
                .trail
                .record(
                    &user.username,
                    &parts.method,
                    subresource.as_deref(),
                    &parts.headers,
                    serving,
                )
                .await;
            served.unwrap_or_else(|e| error_response(&e))
        }
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
    crate::connection::read_body(
        body,
        server.config.max_body_bytes,
        server.config.connection.body_read_timeout,
    )
    .await
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

/// Serves a request for an API path: discovery documents, or a collection or object of a
/// served resource.
async fn serve(
    server: &Arc<ApiServer>,
    user: &Arc<UserInfo>,
    method: &Method,
    target: PathTarget,
    q: &Query,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // metrics.k8s.io: served from the figures scraped from the agents, not from storage.
    if let Some(r) = crate::resourcemetrics::serve(server, method, &target, q) {
        return r;
    }
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
            let res = served(server, &group, &version, &plural)?;
            if !res.namespaced && namespace.is_some() {
                return Err(ApiError::not_found_path());
            }
            let request = Request {
                server,
                user,
                res: &res,
                q,
                headers,
            };
            collection::serve(request, method, namespace.as_deref(), body).await
        }
        PathTarget::Object {
            group,
            version,
            plural,
            namespace,
            name,
            subresource,
        } => {
            let res = served(server, &group, &version, &plural)?;
            // Reviews have no objects to name.
            if res.namespaced != namespace.is_some() || res.is_create_only() {
                return Err(ApiError::not_found_path());
            }
            let request = Request {
                server,
                user,
                res: &res,
                q,
                headers,
            };
            let ns = namespace.unwrap_or_default();
            object::serve(request, method, &ns, &name, subresource.as_deref(), body).await
        }
    }
}

/// The options of a write (named `kind` in errors: `CreateOptions`, `UpdateOptions`,
/// `PatchOptions`), with the client's default field manager, and its body.
async fn write_request(
    r: Request<'_>,
    kind: &str,
    body: Body,
) -> Result<(crate::objects::WriteOptions, Bytes), ApiError> {
    let mut opts = options::with_default_manager(options::write_options(r.q, kind)?, r.headers);
    opts.user = Some(r.user.clone());
    if r.res.is_converted() {
        opts.requested = Some(r.res.clone());
    }
    let bytes = read_body(r.server, body).await?;
    Ok((opts, bytes))
}

/// The served resource a path names, or 404.
fn served(
    server: &ApiServer,
    group: &str,
    version: &str,
    plural: &str,
) -> Result<Arc<ResourceDef>, ApiError> {
    server
        .registry()
        .get(group, version, plural)
        .cloned()
        .ok_or_else(ApiError::not_found_path)
}

/// What every handler of a resource request needs: the server, the resource the path names,
/// the query and the headers.
#[derive(Clone, Copy)]
struct Request<'a> {
    server: &'a Arc<ApiServer>,
    /// Who asks.
    user: &'a Arc<UserInfo>,
    res: &'a Arc<ResourceDef>,
    q: &'a Query,
    headers: &'a HeaderMap,
}
