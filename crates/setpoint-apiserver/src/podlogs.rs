//! `GET pods/<name>/log`: container logs, streamed from the node agent that runs the pod.
//!
//! The API server does not hold logs. It finds the pod's node, and proxies the request to the
//! agent's HTTPS endpoint (`https://<InternalIP>:<kubeletEndpoint.Port>/containerLogs/...`),
//! authenticating with a client certificate the cluster CA signs — the agent only serves
//! callers the CA vouches for. Like kube-apiserver without `--kubelet-certificate-authority`,
//! the agent's serving certificate is not verified (agents make their own), but the
//! connection is TLS and the agent's handshake signature is still checked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::StatusCode;
use http_body_util::BodyExt;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use setpoint_api::status::ApiError;

// Logs name their container by the same rule as exec and attach.
pub use crate::podstream::pick_container;

/// How long connecting to an agent may take before the request fails.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of an agent's error body relayed into the Status message.
pub(crate) const MAX_ERROR_BODY: usize = 16 * 1024;
/// Query parameters passed on to the agent (the rest are the API server's own).
const FORWARDED: &[&str] = &[
    "follow",
    "previous",
    "tailLines",
    "sinceSeconds",
    "sinceTime",
    "timestamps",
    "limitBytes",
];

/// The TLS client configuration for talking to node agents: the given client certificate
/// (signed by the cluster CA) and no verification of the agents' serving certificates.
pub fn agent_client_config(
    cert_pem: &str,
    key_pem: &str,
) -> Result<Arc<rustls::ClientConfig>, crate::tls::TlsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::PrivateKeyDer;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| crate::tls::TlsError::Pem(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| crate::tls::TlsError::Pem(e.to_string()))?;
    let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(setpoint_api::tls::AnyServerCert::new(provider))
        .with_client_auth_cert(certs, key)?;
    Ok(Arc::new(cfg))
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(*k))?.as_str()
}

/// Where a node's agent serves: its first InternalIP (else any address) and its kubelet port.
pub fn agent_address(node: &Value) -> Result<(String, u16), ApiError> {
    let name = str_at(node, &["metadata", "name"]).unwrap_or_default();
    let addresses = node
        .get("status")
        .and_then(|s| s.get("addresses"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let of_type = |t: &str| {
        addresses
            .iter()
            .find(|a| a.get("type").and_then(Value::as_str) == Some(t))
            .and_then(|a| a.get("address").and_then(Value::as_str))
            .map(String::from)
    };
    let host = of_type("InternalIP")
        .or_else(|| of_type("ExternalIP"))
        .or_else(|| of_type("Hostname"))
        .ok_or_else(|| ApiError::unavailable(format!("node {name} reports no address")))?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .filter(|p| (1..=65535).contains(p))
        .ok_or_else(|| ApiError::unavailable(format!("node {name} reports no agent port")))?;
    Ok((host, port as u16))
}

/// The agent's path and query for a log request.
pub fn agent_path(
    namespace: &str,
    pod: &str,
    container: &str,
    q: &HashMap<String, String>,
) -> String {
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let mut query = form_urlencoded::Serializer::new(String::new());
    for k in FORWARDED {
        if let Some(v) = q.get(*k) {
            query.append_pair(k, v);
        }
    }
    let query = query.finish();
    let mut path = format!(
        "/containerLogs/{}/{}/{}",
        enc(namespace),
        enc(pod),
        enc(container)
    );
    if !query.is_empty() {
        path.push('?');
        path.push_str(&query);
    }
    path
}

/// Checks the numeric parameters the way the API server validates `PodLogOptions`.
fn validate(q: &HashMap<String, String>) -> Result<(), ApiError> {
    for k in ["tailLines", "sinceSeconds", "limitBytes"] {
        if let Some(v) = q.get(k) {
            // Upstream decodes the options before validating them: a value that is not an
            // integer is the decoder's 400.
            let n = crate::request::go_parse_int(v).map_err(ApiError::bad_request)?;
            let ok = if k == "tailLines" { n >= 0 } else { n >= 1 };
            if !ok {
                return Err(ApiError::bad_request(format!(
                    "{k}: Invalid value: {n}: must be {}",
                    if k == "tailLines" {
                        "greater than or equal to 0"
                    } else {
                        "greater than 0"
                    }
                )));
            }
        }
    }
    if q.contains_key("sinceSeconds") && q.contains_key("sinceTime") {
        return Err(ApiError::bad_request(
            "at most one of `sinceTime` or `sinceSeconds` may be specified",
        ));
    }
    Ok(())
}

/// Streams one container's log from the agent running the pod.
pub async fn stream(
    tls: Option<Arc<rustls::ClientConfig>>,
    pod: &Value,
    node: &Value,
    q: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    validate(q)?;
    let namespace = str_at(pod, &["metadata", "namespace"]).unwrap_or_default();
    let name = str_at(pod, &["metadata", "name"]).unwrap_or_default();
    let container = pick_container(pod, q.get("container").map(String::as_str))?;
    let tls = tls.ok_or_else(|| {
        ApiError::unavailable(
            "pod logs need TLS towards the node agents; this API server serves plain HTTP",
        )
    })?;
    let (host, port) = agent_address(node)?;
    let path = agent_path(namespace, name, &container, q);
    let unreachable =
        |e: &dyn std::fmt::Display| ApiError::unavailable(format!("node agent {host}:{port}: {e}"));
    let tcp = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    .map_err(|_| unreachable(&"connection timed out"))?
    .map_err(|e| unreachable(&e))?;
    let _ = tcp.set_nodelay(true);
    let server_name = ServerName::try_from(host.clone()).map_err(|e| unreachable(&e))?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(server_name, tcp)
        .await
        .map_err(|e| unreachable(&e))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(&e))?;
    tokio::spawn(async move {
        // Ends when the response body is dropped (the client went away) or finished.
        let _ = conn.await;
    });
    let req = http::Request::get(&path)
        .header(http::header::HOST, format!("{host}:{port}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| unreachable(&e))?;
    let status = resp.status();
    if !status.is_success() {
        let body = http_body_util::Limited::new(resp.into_body(), MAX_ERROR_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(agent_error(status, &body));
    }
    let body = resp
        .into_body()
        .map_err(|e| std::io::Error::other(e.to_string()));
    Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "text/plain")
        .header(http::header::CACHE_CONTROL, "no-cache, private")
        .body(Body::new(body))
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// Turns an agent's error answer (a Status, or plain text) into the API's Status.
pub(crate) fn agent_error(status: StatusCode, body: &[u8]) -> ApiError {
    let code = status.as_u16();
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if v.get("kind").and_then(Value::as_str) == Some("Status") {
            return setpoint_api::status::ApiError::new(
                code,
                v.get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("InternalError"),
                v.get("message").and_then(Value::as_str).unwrap_or_default(),
            );
        }
    }
    let text = String::from_utf8_lossy(body).trim().to_string();
    let reason = match code {
        400 => "BadRequest",
        404 => "NotFound",
        _ => "InternalError",
    };
    ApiError::new(code, reason, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn container_choice_follows_kubernetes() {
        let one = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "web"}]}});
        assert_eq!(pick_container(&one, None).unwrap(), "web");
        assert_eq!(pick_container(&one, Some("web")).unwrap(), "web");
        let e = pick_container(&one, Some("db")).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(e.message.contains("container db is not valid for pod p"));
        let two = json!({"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "a"}, {"name": "b"}],
            "initContainers": [{"name": "setup"}]}});
        let e = pick_container(&two, None).unwrap_err();
        assert!(e.message.contains("choose one of: [a b]"), "{}", e.message);
        assert_eq!(pick_container(&two, Some("setup")).unwrap(), "setup");
    }

    #[test]
    fn agent_address_prefers_internal_ip() {
        let node = json!({"metadata": {"name": "n"}, "status": {
            "addresses": [{"type": "Hostname", "address": "h"}, {"type": "InternalIP", "address": "10.0.0.2"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}});
        assert_eq!(agent_address(&node).unwrap(), ("10.0.0.2".into(), 10250));
        let no_port = json!({"metadata": {"name": "n"}, "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.2"}]}});
        assert_eq!(agent_address(&no_port).unwrap_err().code, 503);
    }

    #[test]
    fn path_forwards_only_log_options_and_escapes() {
        let q: HashMap<String, String> = [
            ("follow", "true"),
            ("tailLines", "5"),
            ("container", "web"),
            ("pretty", "true"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let p = agent_path("ns", "pod-1", "web", &q);
        assert!(p.starts_with("/containerLogs/ns/pod%2D1/web?"), "{p}");
        assert!(p.contains("follow=true") && p.contains("tailLines=5"));
        assert!(!p.contains("pretty") && !p.contains("container="));
    }

    #[test]
    fn bad_numbers_are_rejected() {
        let q = |k: &str, v: &str| -> HashMap<String, String> {
            [(k.to_string(), v.to_string())].into_iter().collect()
        };
        assert!(validate(&q("tailLines", "-1")).is_err());
        assert!(validate(&q("tailLines", "0")).is_ok());
        assert!(validate(&q("sinceSeconds", "0")).is_err());
        assert!(validate(&q("limitBytes", "x")).is_err());
    }

    #[test]
    fn agent_errors_become_statuses() {
        let e = agent_error(StatusCode::NOT_FOUND, b"container web not found");
        assert_eq!(
            (e.code, e.message.as_str()),
            (404, "container web not found")
        );
        let status =
            json!({"kind": "Status", "reason": "BadRequest", "message": "no previous run"});
        let e = agent_error(
            StatusCode::BAD_REQUEST,
            serde_json::to_vec(&status).unwrap().as_slice(),
        );
        assert_eq!(e.message, "no previous run");
    }

    #[test]
    fn numbers_that_do_not_parse_are_the_decoders_400() {
        let q: HashMap<String, String> = [("tailLines".to_string(), "ten".to_string())].into();
        let e = validate(&q).unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
        assert_eq!(
            e.message,
            "strconv.ParseInt: parsing \"ten\": invalid syntax"
        );
    }
}
