//! Pods' own operations: `pods/log` (streamed from the node agent) and `pods/binding`.

use std::sync::Arc;

use axum::response::Response;
use http::{HeaderMap, StatusCode};
use serde_json::{json, Value};
use setpoint_api::ApiError;

use crate::registry::ResourceDef;
use crate::request::Query;
use crate::state::ApiServer;

use super::negotiation::decode_object_body;
use super::options::write_options;
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
