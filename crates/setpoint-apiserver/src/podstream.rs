//! `pods/exec`, `pods/attach` and `pods/portforward`: upgraded connections proxied to the
//! node agent that runs the pod.
//!
//! The API server checks the request as kube-apiserver does (the container: the one named,
//! else the pod's only one; the pod must be bound to a node), turns the options into the
//! kubelet's query (`stdin=1`, `command=...`), and opens a TLS connection to the agent with
//! the same client certificate `pods/log` uses ([`crate::podlogs`]). It forwards the request
//! with its upgrade headers (WebSocket or SPDY; the API server speaks neither, it only
//! relays). When the agent answers 101 Switching Protocols, the client gets 101 with the
//! agent's protocol headers and the two upgraded connections are spliced byte for byte until
//! either side closes; any other answer becomes the client's error.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderName, Method, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::Value;
use setpoint_api::status::ApiError;

// The same connect deadline (here also for the agent's answer to the upgrade) and bound on
// relayed refusals as `pods/log`.
use crate::podlogs::{agent_address, agent_error, CONNECT_TIMEOUT, MAX_ERROR_BODY};

/// The request headers that negotiate the upgraded protocol, passed on to the agent; and
/// the response headers passed back.
const UPGRADE_HEADERS: &[&str] = &[
    "connection",
    "upgrade",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-accept",
    "x-stream-protocol-version",
];

/// A streaming subresource of pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subresource {
    /// `pods/exec`.
    Exec,
    /// `pods/attach`.
    Attach,
    /// `pods/portforward`.
    PortForward,
}

impl Subresource {
    /// The subresource a path segment names, if it is a streaming one.
    pub fn parse(name: &str) -> Option<Subresource> {
        match name {
            "exec" => Some(Subresource::Exec),
            "attach" => Some(Subresource::Attach),
            "portforward" => Some(Subresource::PortForward),
            _ => None,
        }
    }

    /// The agent's path segment (the kubelet's).
    fn agent_segment(self) -> &'static str {
        match self {
            Subresource::Exec => "exec",
            Subresource::Attach => "attach",
            Subresource::PortForward => "portforward",
        }
    }
}

/// Whether the request asks to switch protocols (WebSocket or SPDY).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    let has_token = |name: HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .unwrap_or("")
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        })
    };
    has_token(http::header::CONNECTION, "upgrade") && headers.contains_key(http::header::UPGRADE)
}

/// Whether the request is a WebSocket handshake (a GET, which upstream authorizes a second
/// time with the `create` verb).
pub fn is_websocket(headers: &HeaderMap) -> bool {
    is_upgrade(headers)
        && headers
            .get_all(http::header::UPGRADE)
            .iter()
            .any(|v| v.to_str().unwrap_or("").eq_ignore_ascii_case("websocket"))
}

/// A boolean option as kube-apiserver converts query parameters: absent is false; `0` and
/// `false` (any case) are false; anything else, even empty, is true.
fn query_bool(pairs: &[(String, String)], name: &str) -> bool {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .is_some_and(|(_, v)| !(v == "0" || v.eq_ignore_ascii_case("false")))
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn container_names(pod: &Value, field: &str) -> Vec<String> {
    pod.get("spec")
        .and_then(|s| s.get(field))
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str))
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// The container an exec or attach is about, with kube-apiserver's errors: a container
/// named must be one of the pod's (regular, init or ephemeral); none named means the only
/// container. (kubectl applies the `kubectl.kubernetes.io/default-container` annotation
/// itself, before it asks; the API server does not read it.)
pub fn pick_container(pod: &Value, requested: Option<&str>) -> Result<String, ApiError> {
    let name = str_at(pod, "/metadata/name");
    let containers = container_names(pod, "containers");
    let init = container_names(pod, "initContainers");
    let ephemeral = container_names(pod, "ephemeralContainers");
    match requested.filter(|c| !c.is_empty()) {
        Some(c)
            if containers
                .iter()
                .chain(&init)
                .chain(&ephemeral)
                .any(|n| n == c) =>
        {
            Ok(c.to_string())
        }
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None if containers.len() == 1 => Ok(containers[0].clone()),
        None if containers.is_empty() => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}"
        ))),
        None => {
            let mut message = format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            );
            if !init.is_empty() {
                message.push_str(&format!(
                    " or one of the init containers: [{}]",
                    init.join(" ")
                ));
            }
            Err(ApiError::bad_request(message))
        }
    }
}

/// The agent's path and query for the request (the kubelet's `streamLocation` and
/// `streamParams`).
pub fn agent_path(
    subresource: Subresource,
    pod: &Value,
    raw_query: Option<&str>,
) -> Result<String, ApiError> {
    let pairs: Vec<(String, String)> = raw_query
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default();
    let namespace = str_at(pod, "/metadata/namespace");
    let name = str_at(pod, "/metadata/name");
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let mut query = form_urlencoded::Serializer::new(String::new());
    let path = match subresource {
        Subresource::PortForward => {
            let ports: Vec<&str> = pairs
                .iter()
                .filter(|(k, _)| k == "ports")
                .map(|(_, v)| v.as_str())
                .collect();
            for p in &ports {
                let ok = p.parse::<i64>().is_ok_and(|n| (1..=65535).contains(&n));
                if !ok {
                    return Err(ApiError::bad_request(format!(
                        "ports: Invalid value: {p:?}: must be between 1 and 65535, inclusive"
                    )));
                }
            }
            if !ports.is_empty() {
                query.append_pair("port", &ports.join(","));
            }
            format!("/portforward/{}/{}", enc(namespace), enc(name))
        }
        Subresource::Exec | Subresource::Attach => {
            let requested = pairs
                .iter()
                .find(|(k, _)| k == "container")
                .map(|(_, v)| v.as_str());
            let container = pick_container(pod, requested)?;
            for stream in ["stdin", "stdout", "stderr", "tty"] {
                if query_bool(&pairs, stream) {
                    query.append_pair(stream, "1");
                }
            }
            if subresource == Subresource::Exec {
                for (_, c) in pairs.iter().filter(|(k, _)| k == "command") {
                    query.append_pair("command", c);
                }
            }
            format!(
                "/{}/{}/{}/{}",
                subresource.agent_segment(),
                enc(namespace),
                enc(name),
                enc(&container)
            )
        }
    };
    let query = query.finish();
    Ok(if query.is_empty() {
        path
    } else {
        format!("{path}?{query}")
    })
}

/// Serves a streaming subresource request: checks it, proxies it to the pod's agent, and
/// splices the connections once both sides have switched protocols.
#[allow(clippy::too_many_arguments)]
pub async fn connect(
    tls: Option<Arc<rustls::ClientConfig>>,
    subresource: Subresource,
    pod: &Value,
    node: Option<&Value>,
    method: &Method,
    headers: &HeaderMap,
    raw_query: Option<&str>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Result<Response, ApiError> {
    let name = str_at(pod, "/metadata/name");
    let path = agent_path(subresource, pod, raw_query)?;
    let Some(node) = node else {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    };
    if !is_upgrade(headers) {
        return Err(ApiError::bad_request("Upgrade request required"));
    }
    let client_upgrade =
        client_upgrade.ok_or_else(|| ApiError::bad_request("Upgrade request required"))?;
    let tls = tls.ok_or_else(|| {
        ApiError::unavailable(
            "streaming to pods needs TLS towards the node agents; this API server serves plain HTTP",
        )
    })?;
    let (host, port) = agent_address(node)?;
    let unreachable = |e: &dyn std::fmt::Display| {
        ApiError::unavailable(format!(
            "error dialing backend: node agent {host}:{port}: {e}"
        ))
    };
    let sender = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| unreachable(&e))?;
        let _ = tcp.set_nodelay(true);
        let server_name = ServerName::try_from(host.clone()).map_err(|e| unreachable(&e))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(server_name, tcp)
            .await
            .map_err(|e| unreachable(&e))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(&e))?;
        tokio::spawn(async move {
            // Upgrades need the connection task to hand the stream over.
            let _ = conn.with_upgrades().await;
        });
        let mut request = http::Request::builder()
            .method(method.clone())
            .uri(&path)
            .header(http::header::HOST, format!("{host}:{port}"));
        for h in UPGRADE_HEADERS {
            for v in headers.get_all(*h) {
                request = request.header(*h, v);
            }
        }
        let request = request
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| ApiError::internal(e.to_string()))?;
        sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(&e))
    };
    let mut answer = tokio::time::timeout(CONNECT_TIMEOUT, sender)
        .await
        .map_err(|_| unreachable(&"timed out"))??;
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = answer.status();
        let body = http_body_util::Limited::new(answer.into_body(), MAX_ERROR_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(agent_error(status, &body));
    }
    let mut response = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for h in UPGRADE_HEADERS {
        for v in answer.headers().get_all(*h) {
            response = response.header(*h, v);
        }
    }
    crate::proxy::splice(client_upgrade, hyper::upgrade::on(&mut answer));
    response
        .body(Body::empty())
        .map_err(|e| ApiError::internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {
            "containers": [{"name": "a"}, {"name": "b"}],
            "initContainers": [{"name": "setup"}]}})
    }

    #[test]
    fn container_errors_are_upstreams() {
        let e = pick_container(&pod(), None).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                400,
                "a container name must be specified for pod p, choose one of: [a b] or one of the init containers: [setup]"
            )
        );
        let e = pick_container(&pod(), Some("z")).unwrap_err();
        assert_eq!(e.message, "container z is not valid for pod p");
        assert_eq!(pick_container(&pod(), Some("setup")).unwrap(), "setup");
        let one = json!({"metadata": {"name": "q"}, "spec": {"containers": [{"name": "only"}]}});
        assert_eq!(pick_container(&one, None).unwrap(), "only");
    }

    #[test]
    fn options_become_the_kubelets_query() {
        let p = agent_path(
            Subresource::Exec,
            &pod(),
            Some("container=a&command=sh&command=-c&command=echo%20hi&stdin=true&stdout=1&stderr=false&tty="),
        )
        .unwrap();
        assert_eq!(
            p,
            "/exec/ns/p/a?stdin=1&stdout=1&tty=1&command=sh&command=-c&command=echo+hi"
        );
        let p = agent_path(
            Subresource::Attach,
            &pod(),
            Some("container=b&stdout=true&command=x"),
        )
        .unwrap();
        assert_eq!(p, "/attach/ns/p/b?stdout=1");
        let p = agent_path(Subresource::PortForward, &pod(), Some("ports=80&ports=443")).unwrap();
        assert_eq!(p, "/portforward/ns/p?port=80%2C443");
        assert!(agent_path(Subresource::PortForward, &pod(), Some("ports=0")).is_err());
        assert_eq!(
            agent_path(Subresource::PortForward, &pod(), None).unwrap(),
            "/portforward/ns/p"
        );
    }

    #[test]
    fn upgrades_are_recognized() {
        let mut h = HeaderMap::new();
        h.insert(http::header::CONNECTION, "Upgrade".parse().unwrap());
        h.insert(http::header::UPGRADE, "SPDY/3.1".parse().unwrap());
        assert!(is_upgrade(&h) && !is_websocket(&h));
        h.insert(http::header::UPGRADE, "websocket".parse().unwrap());
        assert!(is_websocket(&h));
        h.remove(http::header::CONNECTION);
        assert!(!is_upgrade(&h));
    }
}
