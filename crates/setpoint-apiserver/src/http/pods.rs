//! Pods' own operations: `pods/log` (streamed from the node agent), `pods/exec`,
//! `pods/attach` and `pods/portforward` (upgraded connections spliced to the node agent) and
//! `pods/binding` and `pods/eviction`.

use std::sync::Arc;

use axum::response::Response;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Value};
use setpoint_api::ApiError;

use crate::authorization::Attributes;
use crate::podstream::Subresource;
use crate::registry::ResourceDef;
use crate::request::Query;
use crate::state::ApiServer;

use super::negotiation::decode_object_body;
use super::options::{delete_options_from, write_options};
use crate::response::value_response;

/// `GET pods/<name>/log`: proxied to the agent of the pod's node.
pub(super) async fn pod_log(
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

/// `pods/<name>/exec`, `attach` and `portforward` (GET or POST, upgrading the connection):
/// proxied to the agent of the pod's node. A WebSocket handshake is a GET, authorized as
/// `get` like any GET; as kube-apiserver does since 1.35 (`AuthorizePodWebsocketUpgrade
/// CreatePermission`, on by default), it must also be allowed `create`, the verb the SPDY
/// POST is authorized with, so the protocol never widens what a user may do.
#[allow(clippy::too_many_arguments)]
pub(super) async fn pod_stream(
    server: &Arc<ApiServer>,
    attributes: &Attributes,
    subresource: Subresource,
    ns: &str,
    name: &str,
    method: &Method,
    headers: &HeaderMap,
    raw_query: Option<&str>,
    upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Result<Response, ApiError> {
    if *method != Method::GET && *method != Method::POST {
        return Err(ApiError::method_not_allowed());
    }
    if *method == Method::GET && crate::podstream::is_websocket(headers) {
        let create = Attributes {
            verb: "create".into(),
            ..attributes.clone()
        };
        server.authorizers.authorize(&create)?;
    }
    let pods = server
        .registry()
        .get("", "v1", "pods")
        .cloned()
        .ok_or_else(ApiError::not_found_path)?;
    let pod = server.get_object(&pods, ns, name).await?;
    let node_name = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let node = if node_name.is_empty() {
        None
    } else {
        let nodes = server
            .registry()
            .get("", "v1", "nodes")
            .cloned()
            .ok_or_else(ApiError::not_found_path)?;
        Some(server.get_object(&nodes, "", &node_name).await?)
    };
    let tls = server.agent_tls.read().clone();
    crate::podstream::connect(
        tls,
        subresource,
        &pod,
        node.as_ref(),
        method,
        headers,
        raw_query,
        upgrade,
    )
    .await
}

/// `POST pods/<name>/binding`: sets `spec.nodeName` once.
pub(super) async fn bind_pod(
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

/// `POST pods/<name>/eviction`: a policy/v1 (or v1beta1) Eviction, answered as upstream's
/// eviction REST does: 201 with a `Success` Status when the pod is deleted, 429 when a budget
/// forbids it, 500 when several budgets guard the pod.
#[allow(clippy::too_many_arguments)]
pub(super) async fn evict_pod(
    server: &Arc<ApiServer>,
    res: &Arc<ResourceDef>,
    ns: &str,
    name: &str,
    headers: &HeaderMap,
    body: &[u8],
    q: &Query,
    user: &Arc<crate::authentication::UserInfo>,
) -> Result<Response, ApiError> {
    // kubectl sends the version discovery lists for pods/eviction (policy/v1); clients of
    // older servers send policy/v1beta1, whose Eviction has the same fields.
    let version = match serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            v.get("apiVersion")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .as_deref()
    {
        Some("policy/v1beta1") => "v1beta1",
        _ => "v1",
    };
    let eviction_def = ResourceDef {
        group: "policy".into(),
        version: version.into(),
        kind: "Eviction".into(),
        ..(**res).clone()
    };
    let (eviction, _) = decode_object_body(&eviction_def, headers, body)?;
    let named = eviction
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if named != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let mut opts = match eviction.get("deleteOptions") {
        Some(v) if v.is_object() => delete_options_from(v),
        _ => crate::objects::DeleteOptions::default(),
    };
    // dryRun on the request applies to the delete too (upstream's propagateDryRun).
    opts.dry_run |= write_options(q, "CreateOptions")?.dry_run;
    opts.user = Some(user.clone());
    match server.evict(ns, name, opts).await? {
        crate::eviction::Evicted::Deleted => Ok(value_response(
            StatusCode::CREATED,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        )),
        crate::eviction::Evicted::TooManyBudgets => Ok(value_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": crate::eviction::TOO_MANY_BUDGETS, "code": 500}),
        )),
    }
}
