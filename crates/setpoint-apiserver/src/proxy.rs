//! `services/proxy`, `pods/proxy` and `nodes/proxy`: HTTP requests relayed through the API
//! server to a Service's endpoint, a pod or a node's agent, as kube-apiserver relays them
//! (`kubectl proxy` and dashboards use these paths).
//!
//! The object's name may carry a scheme and a port, `[scheme:]name[:port]` (upstream's
//! `SplitSchemeNamePort`). A Service's port (a number or a port name) picks the endpoint port
//! of its Endpoints, and one of its ready addresses at random; a pod's port defaults to its
//! first container port; a node without a port (or with its agent's port) is its agent,
//! reached over TLS with the API server's client certificate as `pods/log` is.
//!
//! What is relayed: the method, the path after `/proxy`, the query, the headers without the
//! hop-by-hop ones and without the caller's credentials (the API server consumed them), and
//! the body, streamed both ways. A redirect to an absolute path of the backend is rewritten to
//! stay under the proxy path. A request that asks to switch protocols (`Connection: Upgrade`
//! with an `Upgrade` header: a WebSocket handshake through `kubectl proxy`) is relayed with its
//! upgrade headers, and once the backend answers 101 Switching Protocols the caller's and the
//! backend's connections are spliced ([`forward_upgrade`]), as upstream's upgrade-aware proxy
//! does; it is authorized as any other request through the proxy, with its method's verb (a
//! WebSocket handshake, a GET, needs `get` on `pods/proxy` or `services/proxy`). Links inside
//! HTML bodies are not rewritten.
//!
//! Which addresses may be reached is upstream's rule, that a pod's or endpoint's address be a
//! global unicast one, widened for the process runtime: its pod IPs are loopback addresses
//! `127.B.x.y` with `B ≥ 1`, so those are allowed, and `127.0.0.0/16` (the host's own
//! `127.0.0.1`, `127.0.0.53` …) never is.

use std::net::IpAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Method};
use http_body_util::BodyExt;
use rustls::pki_types::ServerName;
use serde_json::Value;
use setpoint_api::status::ApiError;

use crate::podlogs::{agent_address, CONNECT_TIMEOUT};
use crate::state::ApiServer;

/// The resources with a `proxy` subresource.
pub(crate) const PROXIED: &[&str] = &["pods", "services", "nodes"];

/// Headers that describe one connection and are not relayed (RFC 9110 §7.6.1), and the
/// caller's credentials, which were for the API server.
const DROPPED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "authorization",
];

/// `[scheme:]name[:port]` split as upstream's `SplitSchemeNamePort`: the scheme, when given,
/// is `http` or `https`, and the name is not empty.
pub(crate) fn split_scheme_name_port(id: &str) -> Option<(&str, &str, &str)> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] => (*scheme, *name, *port),
        _ => return None,
    };
    (!name.is_empty() && matches!(scheme, "" | "http" | "https")).then_some((scheme, name, port))
}

/// Whether the API server may open a connection to `ip` on a caller's behalf.
pub(crate) fn proxyable(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            // A process pod's loopback address, never the host's own 127.0.x.y.
            if o[0] == 127 {
                return o[1] != 0;
            }
            !(v4.is_unspecified()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation())
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || (first & 0xffc0) == 0xfe80)
        }
    }
}

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// `http` or `https`.
    pub scheme: String,
    /// An address or host name.
    pub host: String,
    /// The port.
    pub port: u16,
    /// Whether this is a node's agent, reached with the API server's client certificate.
    pub agent: bool,
}

/// The pod's address and port for `pods/<id>/proxy`.
pub(crate) fn pod_target(pod: &Value, scheme: &str, port: &str) -> Result<Target, ApiError> {
    let port = if port.is_empty() {
        first_container_port(pod).unwrap_or(80)
    } else {
        port.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| ApiError::bad_request(format!("invalid port {port:?}")))?
    };
    let ip = pod
        .pointer("/status/podIPs/0/ip")
        .or_else(|| pod.pointer("/status/podIP"))
        .and_then(Value::as_str)
        .and_then(|ip| ip.parse::<IpAddr>().ok())
        .filter(|ip| proxyable(*ip))
        .ok_or_else(|| ApiError::bad_request("address not allowed"))?;
    Ok(Target {
        scheme: if scheme.is_empty() { "http" } else { scheme }.into(),
        host: ip.to_string(),
        port,
        agent: false,
    })
}

fn first_container_port(pod: &Value) -> Option<u16> {
    pod.pointer("/spec/containers")?
        .as_array()?
        .iter()
        .find_map(|c| c.pointer("/ports/0/containerPort")?.as_u64())
        .and_then(|p| u16::try_from(p).ok())
}

/// A ready endpoint of the Service for `services/<id>/proxy`, upstream's
/// `ResourceLocation`: a numeric port names the Service port it is, the Endpoints' subsets
/// give the addresses, `pick` chooses among the candidates (at random in the server).
pub(crate) fn service_target(
    svc: &Value,
    endpoints: Option<&Value>,
    scheme: &str,
    port: &str,
    pick: impl Fn(usize) -> usize,
) -> Result<Target, ApiError> {
    let name = svc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut port_name = port.to_string();
    if let Ok(number) = port.parse::<i64>() {
        let ports = svc.pointer("/spec/ports").and_then(Value::as_array);
        port_name = ports
            .into_iter()
            .flatten()
            .find(|p| p.get("port").and_then(Value::as_i64) == Some(number))
            .map(|p| {
                p.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            })
            .ok_or_else(|| {
                ApiError::unavailable(format!(
                    "no service port {number} found for service {}",
                    setpoint_api::strconv::quote(name)
                ))
            })?;
    }
    let none = || {
        ApiError::unavailable(format!(
            "no endpoints available for service {}",
            setpoint_api::strconv::quote(name)
        ))
    };
    let subsets: &[Value] = endpoints
        .and_then(|e| e.get("subsets"))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut candidates: Vec<(String, u16)> = vec![];
    for subset in subsets {
        let port = subset
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str).unwrap_or("") == port_name)
            .and_then(|p| p.get("port").and_then(Value::as_u64))
            .and_then(|p| u16::try_from(p).ok());
        let Some(port) = port else { continue };
        for address in subset
            .get("addresses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let ip = address.get("ip").and_then(Value::as_str).unwrap_or("");
            if ip.parse::<IpAddr>().is_ok_and(proxyable) {
                candidates.push((ip.to_string(), port));
            }
        }
    }
    if candidates.is_empty() {
        return Err(none());
    }
    let (host, port) = candidates.swap_remove(pick(candidates.len()) % candidates.len());
    Ok(Target {
        scheme: if scheme.is_empty() { "http" } else { scheme }.into(),
        host,
        port,
        agent: false,
    })
}

/// The node's agent (no port, or the agent's own) or another port on the node's address.
pub(crate) fn node_target(node: &Value, scheme: &str, port: &str) -> Result<Target, ApiError> {
    let (host, agent_port) = agent_address(node)?;
    if port.is_empty() || port == agent_port.to_string() {
        return Ok(Target {
            scheme: "https".into(),
            host,
            port: agent_port,
            agent: true,
        });
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| ApiError::bad_request(format!("invalid port {port:?}")))?;
    Ok(Target {
        scheme: if scheme.is_empty() { "http" } else { scheme }.into(),
        host,
        port,
        agent: false,
    })
}

/// Splits a raw request path at its `/proxy` segment: the proxy's base path and the rest
/// (`/` when nothing follows). `proxy_index` is the segment's position counted from the
/// path's first segment.
pub(crate) fn split_proxy_path(path: &str, proxy_index: usize) -> Option<(String, String)> {
    let trimmed = path.strip_prefix('/')?;
    let mut base_len = 1;
    let mut segments = trimmed.split('/');
    for _ in 0..=proxy_index {
        base_len += segments.next()?.len() + 1;
    }
    let base = &path[..base_len - 1];
    if !base.ends_with("/proxy") {
        return None;
    }
    let rest = &path[base_len - 1..];
    let rest = if rest.is_empty() { "/" } else { rest };
    Some((base.to_string(), rest.to_string()))
}

/// Relays one request to `target` and its answer back. An upgrade request whose connection
/// the server can hand over (`client_upgrade`) is spliced to the backend once it switches.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn relay(
    server: &Arc<ApiServer>,
    target: Target,
    base: &str,
    rest: &str,
    raw_query: Option<&str>,
    method: &Method,
    headers: &HeaderMap,
    body: Body,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Result<Response, ApiError> {
    let address = format!("{}:{}", target.host, target.port);
    let tls = if target.scheme == "https" {
        let config = if target.agent {
            server.agent_tls.read().clone().ok_or_else(|| {
                ApiError::unavailable(
                    "the node proxy needs TLS towards the node agents; this API server serves plain HTTP",
                )
            })?
        } else {
            insecure_tls()
        };
        Some((config, target.host.clone()))
    } else {
        None
    };
    let to = Destination {
        host: &target.host,
        port: target.port,
        tls,
    };
    // Without the caller's connection (HTTP/2 has no upgrades) the request goes as a plain
    // one, its upgrade headers dropped as hop-by-hop.
    let relayed = match client_upgrade.filter(|_| crate::podstream::is_upgrade(headers)) {
        Some(client) => forward_upgrade(to, rest, raw_query, method, headers, body, client).await,
        None => forward(to, base, rest, raw_query, method, headers, body).await,
    };
    relayed.map_err(|e| ApiError::unavailable(format!("error trying to reach {address}: {e}")))
}

/// Where [`forward`] connects: host and port, and for HTTPS the client configuration and the
/// name the server's certificate must hold.
pub(crate) struct Destination<'a> {
    pub host: &'a str,
    pub port: u16,
    pub tls: Option<(Arc<rustls::ClientConfig>, String)>,
}

/// Why [`forward`] got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    /// The TCP connection failed.
    #[error("{0}")]
    Connect(std::io::Error),
    /// The TCP connection did not complete within [`CONNECT_TIMEOUT`].
    #[error("connection timed out")]
    Timeout,
    /// TLS or HTTP failed.
    #[error("{0}")]
    Exchange(String),
}

/// Sends one request (the method, `rest` and the query, the headers but the hop-by-hop ones
/// and the caller's credentials, the body) to `to` and streams its answer back, a redirect to
/// one of the backend's absolute paths kept under `base`.
pub(crate) async fn forward(
    to: Destination<'_>,
    base: &str,
    rest: &str,
    raw_query: Option<&str>,
    method: &Method,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ForwardError> {
    let request = outgoing(&to, rest, raw_query, method, headers, false, body)?;
    let response = exchange(to, request).await?;
    Ok(relayed(response, base))
}

/// Relays a request that asks to switch protocols (`Connection: Upgrade`, a WebSocket or
/// SPDY handshake) to `to`, as upstream's upgrade-aware proxy does: the upgrade headers go
/// along, and when the backend answers 101 Switching Protocols the caller gets that answer,
/// its headers included, and the two connections are spliced byte for byte until either side
/// closes. Any other answer is relayed as [`forward`] relays it. `client` is the caller's
/// connection once the server has switched it.
pub(crate) async fn forward_upgrade(
    to: Destination<'_>,
    rest: &str,
    raw_query: Option<&str>,
    method: &Method,
    headers: &HeaderMap,
    body: Body,
    client: hyper::upgrade::OnUpgrade,
) -> Result<Response, ForwardError> {
    let request = outgoing(&to, rest, raw_query, method, headers, true, body)?;
    let mut response = exchange(to, request).await?;
    if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        return Ok(relayed(response, ""));
    }
    let backend = hyper::upgrade::on(&mut response);
    splice(client, backend);
    let (parts, _) = response.into_parts();
    Ok(Response::from_parts(parts, Body::empty()))
}

/// Once both sides have switched protocols, copies bytes between the caller's and the
/// backend's connections until either side closes (each direction's end is passed on).
pub(crate) fn splice(client: hyper::upgrade::OnUpgrade, backend: hyper::upgrade::OnUpgrade) {
    tokio::spawn(async move {
        let (client, backend) = match tokio::join!(client, backend) {
            (Ok(c), Ok(b)) => (c, b),
            (c, b) => {
                tracing::debug!(client = ?c.err(), backend = ?b.err(), "upgrade failed");
                return;
            }
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut backend = hyper_util::rt::TokioIo::new(backend);
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut backend).await {
            tracing::debug!(error = %e, "upgraded connection ended");
        }
    });
}

/// The request sent to `to`: the method, `rest` and the query, the headers but the
/// hop-by-hop ones (except, for an upgrade, `Connection` and `Upgrade`) and the caller's
/// credentials, and the body.
fn outgoing(
    to: &Destination<'_>,
    rest: &str,
    raw_query: Option<&str>,
    method: &Method,
    headers: &HeaderMap,
    upgrade: bool,
    body: Body,
) -> Result<http::Request<Body>, ForwardError> {
    let mut path = rest.to_string();
    if let Some(q) = raw_query.filter(|q| !q.is_empty()) {
        path.push('?');
        path.push_str(q);
    }
    let mut request = http::Request::builder().method(method.clone()).uri(&path);
    for (name, value) in headers {
        let lower = name.as_str();
        let kept = upgrade && (lower == "connection" || lower == "upgrade");
        if !kept
            && (DROPPED.contains(&lower) || lower.starts_with("impersonate-") || lower == "host")
        {
            continue;
        }
        request = request.header(name, value);
    }
    request = request.header(http::header::HOST, format!("{}:{}", to.host, to.port));
    request
        .body(body)
        .map_err(|e| ForwardError::Exchange(e.to_string()))
}

/// Connects to `to` (TLS when it says so) and sends `request`.
async fn exchange(
    to: Destination<'_>,
    request: http::Request<Body>,
) -> Result<http::Response<hyper::body::Incoming>, ForwardError> {
    let tcp = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((to.host, to.port)),
    )
    .await
    .map_err(|_| ForwardError::Timeout)?
    .map_err(ForwardError::Connect)?;
    let _ = tcp.set_nodelay(true);
    let exchange = |e: &dyn std::fmt::Display| ForwardError::Exchange(e.to_string());
    match to.tls {
        Some((config, server_name)) => {
            let name = ServerName::try_from(server_name).map_err(|e| exchange(&e))?;
            let stream = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| exchange(&e))?;
            send(stream, request).await
        }
        None => send(tcp, request).await,
    }
    .map_err(|e| exchange(&e))
}

/// A backend's answer as the caller gets it: without the hop-by-hop headers, a redirect to
/// one of the backend's absolute paths kept under `base`, the body streamed.
fn relayed(response: http::Response<hyper::body::Incoming>, base: &str) -> Response {
    let (mut parts, body) = response.into_parts();
    for name in DROPPED {
        parts.headers.remove(*name);
    }
    if parts.status.is_redirection() {
        if let Some(location) = parts.headers.get(http::header::LOCATION) {
            if let Some(rewritten) = rewrite_location(location, base) {
                parts.headers.insert(http::header::LOCATION, rewritten);
            }
        }
    }
    let body = body.map_err(|e| std::io::Error::other(e.to_string()));
    Response::from_parts(parts, Body::new(body))
}

async fn send<S>(
    stream: S,
    request: http::Request<Body>,
) -> Result<http::Response<hyper::body::Incoming>, hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        // Ends when the response body is finished or dropped (the caller went away), or once
        // an upgraded connection has been handed over.
        let _ = conn.with_upgrades().await;
    });
    sender.send_request(request).await
}

/// A backend's redirect to one of its own absolute paths, kept under the proxy path.
fn rewrite_location(location: &HeaderValue, base: &str) -> Option<HeaderValue> {
    let location = location.to_str().ok()?;
    if !location.starts_with('/') || location.starts_with("//") || location.starts_with(base) {
        return None;
    }
    HeaderValue::from_str(&format!("{base}{location}")).ok()
}

/// TLS towards pods and endpoints: their certificates are not verified, as kube-apiserver's
/// proxy transport does not verify them (a pod's certificate names nothing the API server
/// could check).
fn insecure_tls() -> Arc<rustls::ClientConfig> {
    static CONFIG: std::sync::OnceLock<Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("ring supports the default versions")
                .dangerous()
                .with_custom_certificate_verifier(setpoint_api::tls::AnyServerCert::new(provider))
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

/// Serves `<resource>/<id>/proxy/<rest>` for `pods`, `services` and `nodes`; `client_upgrade`
/// is the caller's connection once switched, for requests that ask to switch protocols.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    server: &Arc<ApiServer>,
    plural: &str,
    namespace: Option<&str>,
    id: &str,
    path: &str,
    raw_query: Option<&str>,
    method: &Method,
    headers: &HeaderMap,
    body: Body,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Result<Response, ApiError> {
    let kind = match plural {
        "pods" => "pod",
        "services" => "service",
        _ => "node",
    };
    let (scheme, name, port) = split_scheme_name_port(id)
        .ok_or_else(|| ApiError::bad_request(format!("invalid {kind} request {id:?}")))?;
    // /api/v1/namespaces/<ns>/<plural>/<id>/proxy or /api/v1/<plural>/<id>/proxy
    let proxy_index = if namespace.is_some() { 6 } else { 4 };
    let (base, rest) = split_proxy_path(path, proxy_index).ok_or_else(ApiError::not_found_path)?;
    let registry = server.registry();
    let def = |plural: &str| {
        registry
            .get("", "v1", plural)
            .map(|def| (**def).clone())
            .ok_or_else(ApiError::not_found_path)
    };
    let ns = namespace.unwrap_or("");
    let target = match plural {
        "pods" => pod_target(
            &server.get_object(&def("pods")?, ns, name).await?,
            scheme,
            port,
        )?,
        "services" => {
            let svc = server.get_object(&def("services")?, ns, name).await?;
            let endpoints = match server.get_object(&def("endpoints")?, ns, name).await {
                Ok(e) => Some(e),
                Err(e) if e.code == 404 => None,
                Err(e) => return Err(e),
            };
            service_target(&svc, endpoints.as_ref(), scheme, port, |n| {
                rand::random::<u32>() as usize % n
            })?
        }
        _ => node_target(
            &server.get_object(&def("nodes")?, "", name).await?,
            scheme,
            port,
        )?,
    };
    tracing::debug!(target = %format!("{}://{}:{}", target.scheme, target.host, target.port), "proxying");
    relay(
        server,
        target,
        &base,
        &rest,
        raw_query,
        method,
        headers,
        body,
        client_upgrade,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_split_as_upstream() {
        assert_eq!(split_scheme_name_port("web"), Some(("", "web", "")));
        assert_eq!(split_scheme_name_port("web:80"), Some(("", "web", "80")));
        assert_eq!(
            split_scheme_name_port("https:web:tls"),
            Some(("https", "web", "tls"))
        );
        assert_eq!(split_scheme_name_port("ftp:web:21"), None);
        assert_eq!(split_scheme_name_port(":80"), None);
        assert_eq!(split_scheme_name_port("a:b:c:d"), None);
    }

    #[test]
    fn only_pod_like_addresses_are_proxied() {
        let ok = |s: &str| proxyable(s.parse().unwrap());
        assert!(ok("10.244.1.7") && ok("127.3.0.9"));
        assert!(!ok("127.0.0.1") && !ok("127.0.0.53") && !ok("169.254.169.254"));
        assert!(!ok("0.0.0.0") && !ok("::1") && !ok("fe80::1") && !ok("224.0.0.1"));
        assert!(ok("fd00::5"));
    }

    #[test]
    fn a_services_port_picks_the_endpoint_port_of_its_name() {
        let svc = json!({"metadata": {"name": "web"}, "spec": {"ports": [
            {"name": "http", "port": 80}, {"name": "admin", "port": 9000}]}});
        let eps = json!({"subsets": [
            {"addresses": [{"ip": "10.244.0.5"}, {"ip": "10.244.0.6"}],
             "ports": [{"name": "http", "port": 8080}, {"name": "admin", "port": 9090}]}]});
        let t = service_target(&svc, Some(&eps), "", "80", |_| 1).unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.scheme.as_str()),
            ("10.244.0.6", 8080, "http")
        );
        let t = service_target(&svc, Some(&eps), "https", "admin", |_| 0).unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.scheme.as_str()),
            ("10.244.0.5", 9090, "https")
        );
        let e = service_target(&svc, Some(&eps), "", "81", |_| 0).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (503, "no service port 81 found for service \"web\"")
        );
        let e = service_target(&svc, None, "", "80", |_| 0).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (503, "no endpoints available for service \"web\"")
        );
    }

    #[test]
    fn a_pods_port_defaults_to_its_first_container_port() {
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "ports": [{"containerPort": 8080}]}]},
                         "status": {"podIP": "10.244.0.9"}});
        assert_eq!(pod_target(&pod, "", "").unwrap().port, 8080);
        assert_eq!(pod_target(&pod, "", "9000").unwrap().port, 9000);
        let host_loopback = json!({"spec": {"containers": []}, "status": {"podIP": "127.0.0.1"}});
        assert_eq!(
            pod_target(&host_loopback, "", "80").unwrap_err().message,
            "address not allowed"
        );
        let no_ip = json!({"spec": {"containers": []}, "status": {}});
        assert_eq!(pod_target(&no_ip, "", "80").unwrap_err().code, 400);
    }

    #[test]
    fn paths_split_at_the_proxy_segment() {
        let p = "/api/v1/namespaces/x/services/web:80/proxy/a/b/";
        assert_eq!(
            split_proxy_path(p, 6),
            Some((
                "/api/v1/namespaces/x/services/web:80/proxy".into(),
                "/a/b/".into()
            ))
        );
        assert_eq!(
            split_proxy_path("/api/v1/nodes/n1/proxy", 4),
            Some(("/api/v1/nodes/n1/proxy".into(), "/".into()))
        );
        assert_eq!(split_proxy_path("/api/v1/nodes/n1/status", 4), None);
    }

    #[test]
    fn redirects_stay_under_the_proxy() {
        let base = "/api/v1/namespaces/x/services/web/proxy";
        let r = rewrite_location(&HeaderValue::from_static("/login"), base).unwrap();
        assert_eq!(r, "/api/v1/namespaces/x/services/web/proxy/login");
        assert!(rewrite_location(&HeaderValue::from_static("http://elsewhere/"), base).is_none());
    }
}
