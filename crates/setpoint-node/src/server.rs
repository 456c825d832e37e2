//! The kubelet HTTPS endpoint: `GET /containerLogs/{namespace}/{pod}/{container}` streams a
//! container's log from the runtime (what the API server's `pods/log` proxies to), and
//! `GET /metrics` is the node agent's Prometheus exposition ([`NodeMetrics`]).
//! `GET /stats/summary` (the kubelet's Summary API) and `GET /metrics/resource` report the
//! CPU and memory the node and its pods use ([`crate::stats`]). A server hosting several
//! nodes (simulated ones) serves each node's figures under `?node=<name>`; with one node the
//! parameter may be left out.
//! The kubelet's streaming endpoints (`/exec`, `/attach`) are [`crate::streaming`]'s.
//!
//! TLS with a self-signed serving certificate generated at start (the API server, like
//! kube-apiserver without `--kubelet-certificate-authority`, does not verify it), and a client
//! certificate signed by the configured CA is required: a connection without one fails the
//! handshake, so nothing is served to anonymous clients. Connections are accepted by the
//! runtime's shared loop ([`setpoint_runtime::serving`]).
//!
//! Query parameters follow `pods/log`: `follow`, `previous`, `timestamps` (booleans),
//! `tailLines` (≥ 0), `sinceSeconds` and `limitBytes` (≥ 1). Bad values get 400, unknown
//! pods or containers 404.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use setpoint_runtime::informer::Store;
use setpoint_runtime::serving::{self, ClientCertificates};
use setpoint_runtime::ObjectKey;
use tokio::net::TcpListener;

use crate::metrics::NodeMetrics;
use crate::runtime::{LogOptions, PodRuntime, RuntimeError, RuntimePod};

/// What can go wrong starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Binding the listen address failed.
    #[error("listening on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    /// The client CA or the generated certificate is unusable.
    #[error("TLS: {0}")]
    Tls(String),
}

/// Where log requests go and what the kubelet gauges count: the runtimes of the nodes this
/// process hosts, found through the pod informer's cache (pod → `spec.nodeName` → runtime).
pub struct LogTargets {
    pods: Store<Pod>,
    runtimes: HashMap<String, Arc<dyn PodRuntime>>,
    /// Per node, the previous CPU sample of each series, for `usageNanoCores`.
    rates: HashMap<String, Arc<crate::stats::CpuRates>>,
}

impl LogTargets {
    /// Targets resolving pods through `pods`.
    pub fn new(pods: Store<Pod>) -> Self {
        LogTargets {
            pods,
            runtimes: HashMap::new(),
            rates: HashMap::new(),
        }
    }

    /// Serves the logs of pods bound to `node` from `runtime`.
    pub fn add(&mut self, node: &str, runtime: Arc<dyn PodRuntime>) {
        self.runtimes.insert(node.to_string(), runtime);
        self.rates
            .insert(node.to_string(), crate::stats::CpuRates::new());
    }

    /// The runtime holding `namespace/name`, and the pod as it knows it.
    pub(crate) async fn find(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<(Arc<dyn PodRuntime>, RuntimePod)> {
        let matches = |p: &RuntimePod, uid: Option<&str>| {
            p.namespace == namespace && p.name == name && uid.is_none_or(|u| u == p.uid)
        };
        if let Some(pod) = self.pods.get(&ObjectKey::new(Some(namespace), name)) {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            if let Some(rt) = node.and_then(|n| self.runtimes.get(n)) {
                let uid = pod.metadata.uid.as_deref();
                if let Some(p) = rt.pods().await.into_iter().find(|p| matches(p, uid)) {
                    return Some((rt.clone(), p));
                }
            }
        }
        // Gone from the API but still held (being killed): ask every runtime.
        for rt in self.runtimes.values() {
            if let Some(p) = rt.pods().await.into_iter().find(|p| matches(p, None)) {
                return Some((rt.clone(), p));
            }
        }
        None
    }

    /// Every pod the runtimes hold, each with the pod as the informer cache has it when that
    /// is the same pod (same uid).
    async fn held(&self) -> Vec<Option<Arc<Pod>>> {
        let mut held = Vec::new();
        for rt in self.runtimes.values() {
            for p in rt.pods().await {
                let cached = self
                    .pods
                    .get(&ObjectKey::new(Some(&p.namespace), &p.name))
                    .filter(|c| c.metadata.uid.as_deref() == Some(p.uid.as_str()));
                held.push(cached);
            }
        }
        held
    }
}

/// What the endpoint's handlers share.
#[derive(Clone)]
struct Shared {
    targets: Arc<LogTargets>,
    metrics: Arc<NodeMetrics>,
}

fn parse_bool(q: &HashMap<String, String>, name: &str) -> Result<bool, String> {
    match q.get(name).map(String::as_str) {
        None | Some("") => Ok(false),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
        Some(v) => Err(format!("{name}: invalid boolean {v:?}")),
    }
}

fn parse_int(q: &HashMap<String, String>, name: &str, min: i64) -> Result<Option<u64>, String> {
    let Some(v) = q.get(name) else {
        return Ok(None);
    };
    let n: i64 = v
        .parse()
        .map_err(|_| format!("{name}: invalid integer {v:?}"))?;
    if n < min {
        return Err(format!("{name}: must be at least {min}, got {n}"));
    }
    Ok(Some(n as u64))
}

/// The log options a query asks for, or why they are invalid.
pub fn parse_options(q: &HashMap<String, String>) -> Result<LogOptions, String> {
    Ok(LogOptions {
        follow: parse_bool(q, "follow")?,
        previous: parse_bool(q, "previous")?,
        timestamps: parse_bool(q, "timestamps")?,
        tail_lines: parse_int(q, "tailLines", 0)?,
        since_seconds: parse_int(q, "sinceSeconds", 1)?,
        limit_bytes: parse_int(q, "limitBytes", 1)?,
    })
}

fn text(code: StatusCode, msg: String) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        msg,
    )
        .into_response()
}

async fn container_logs(
    State(Shared { targets, .. }): State<Shared>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let options = match parse_options(&query) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let Some((runtime, held)) = targets.find(&namespace, &pod).await else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{pod} is not running on this node"),
        );
    };
    match runtime.logs(&held, &container, &options).await {
        Ok(stream) => {
            // An error mid-stream ends the response; what was sent stays sent.
            let body = stream.map(|chunk| chunk.map_err(|e| std::io::Error::other(e.to_string())));
            Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "text/plain")
                .body(Body::from_stream(body))
                .unwrap_or_else(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
        }
        Err(RuntimeError::NotFound(what)) => {
            text(StatusCode::NOT_FOUND, format!("{what} not found"))
        }
        Err(RuntimeError::BadRequest(msg)) => text(StatusCode::BAD_REQUEST, msg),
        Err(RuntimeError::Internal(msg)) => text(StatusCode::INTERNAL_SERVER_ERROR, msg),
    }
}

/// Why a stats request cannot be answered: the status and a message.
type Refusal = (StatusCode, String);

/// The node a stats request names (`?node=`), or the only one hosted.
fn stats_node<'a>(
    targets: &'a LogTargets,
    query: &HashMap<String, String>,
) -> Result<(&'a str, &'a Arc<dyn PodRuntime>), Refusal> {
    match query.get("node") {
        Some(n) => targets
            .runtimes
            .get_key_value(n.as_str())
            .map(|(k, v)| (k.as_str(), v))
            .ok_or_else(|| {
                (
                    StatusCode::NOT_FOUND,
                    format!("node {n:?} is not served here"),
                )
            }),
        None if targets.runtimes.len() == 1 => Ok(targets
            .runtimes
            .iter()
            .next()
            .map(|(k, v)| (k.as_str(), v))
            .expect("one runtime")),
        None => Err((
            StatusCode::BAD_REQUEST,
            format!(
                "this endpoint serves {} nodes: name one with ?node=<name>",
                targets.runtimes.len()
            ),
        )),
    }
}

/// One node's figures now: its pods', and the node's own (the runtime's, or the host's).
async fn measure(
    runtime: &Arc<dyn PodRuntime>,
) -> Result<(crate::stats::NodeUsage, crate::stats::RuntimeStats), Refusal> {
    let stats = runtime.stats().await.map_err(|e| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("measuring pods: {e}"),
        )
    })?;
    let node = match &stats.node {
        Some(n) => n.clone(),
        None => tokio::task::spawn_blocking(crate::stats::procfs::host_usage)
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r)
            .map_err(|e| {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("measuring the node: {e}"),
                )
            })?,
    };
    for e in &stats.errors {
        tracing::warn!(error = %e, "resource usage");
    }
    Ok((node, stats))
}

async fn stats_summary(
    State(Shared { targets, .. }): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let (name, runtime) = match stats_node(&targets, &query) {
        Ok(x) => x,
        Err((code, msg)) => return text(code, msg),
    };
    let (node, stats) = match measure(runtime).await {
        Ok(x) => x,
        Err((code, msg)) => return text(code, msg),
    };
    let rates = targets.rates.get(name).cloned().unwrap_or_default();
    let now = crate::status::wall_now();
    let doc = crate::stats::summary(name, &node, &stats.pods, now, &rates);
    (
        [(header::CONTENT_TYPE, "application/json")],
        doc.to_string(),
    )
        .into_response()
}

async fn metrics_resource(
    State(Shared { targets, .. }): State<Shared>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let (_, runtime) = match stats_node(&targets, &query) {
        Ok(x) => x,
        Err((code, msg)) => return text(code, msg),
    };
    let (node, stats) = match measure(runtime).await {
        Ok(x) => x,
        Err((code, msg)) => return text(code, msg),
    };
    let now = crate::status::wall_now();
    let body = crate::stats::resource_metrics(&node, &stats.pods, now, !stats.errors.is_empty());
    (
        [(
            header::CONTENT_TYPE,
            setpoint_api::exposition::PROMETHEUS_TEXT,
        )],
        body,
    )
        .into_response()
}

async fn metrics(State(shared): State<Shared>, headers: axum::http::HeaderMap) -> Response {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let held = shared.targets.held().await;
    let (content_type, body) = shared
        .metrics
        .exposition(held.iter().map(Option::as_deref), accept);
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// The endpoint's routes: container logs from `targets`, and `metrics` with the kubelet
/// gauges computed from `targets` at each scrape.
pub fn router(targets: Arc<LogTargets>, metrics: Arc<NodeMetrics>) -> Router {
    Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container_logs),
        )
        .route("/metrics", get(self::metrics))
        .route("/metrics/resource", get(metrics_resource))
        .route("/stats/summary", get(stats_summary))
        .with_state(Shared {
            targets: targets.clone(),
            metrics,
        })
        .merge(crate::streaming::router(targets))
}

/// The rustls configuration: a fresh self-signed certificate for `names` (DNS names or IP
/// addresses), client certificates required and verified against `client_ca_pem`.
pub fn tls_config(
    names: &[String],
    client_ca_pem: &str,
) -> Result<rustls::ServerConfig, ServerError> {
    let generated = rcgen::generate_simple_self_signed(names.to_vec())
        .map_err(|e| ServerError::Tls(e.to_string()))?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        generated.signing_key.serialize_der(),
    ));
    serving::tls_config(
        vec![generated.cert.der().clone()],
        key,
        Some(client_ca_pem),
        ClientCertificates::Required,
    )
    .map_err(|e| ServerError::Tls(e.to_string()))
}

/// A running endpoint; stops accepting connections when [`stop`](Self::stop)ped or dropped.
pub struct LogServer {
    server: serving::Server,
}

impl LogServer {
    /// Binds `listen` (port 0 picks a free port) and serves logs from `targets` and the
    /// exposition of `metrics` over TLS.
    pub async fn start(
        listen: SocketAddr,
        tls: rustls::ServerConfig,
        targets: Arc<LogTargets>,
        metrics: Arc<NodeMetrics>,
    ) -> Result<LogServer, ServerError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| ServerError::Bind(listen, e))?;
        let app = router(targets, metrics);
        let server = serving::serve(listener, Some(Arc::new(tls)), "node agent", move |_| {
            hyper_util::service::TowerToHyperService::new(app.clone())
        })
        .map_err(|e| ServerError::Bind(listen, e))?;
        Ok(LogServer { server })
    }

    /// The bound address (with the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Stops accepting connections.
    pub async fn stop(self) {
        self.server.stop().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn options_parse_and_validate() {
        let o = parse_options(&q(&[
            ("follow", "true"),
            ("tailLines", "0"),
            ("sinceSeconds", "5"),
            ("limitBytes", "10"),
            ("timestamps", "1"),
        ]))
        .unwrap();
        assert!(o.follow && o.timestamps && !o.previous);
        assert_eq!(o.tail_lines, Some(0));
        assert_eq!(o.since_seconds, Some(5));
        assert_eq!(o.limit_bytes, Some(10));
        assert!(parse_options(&q(&[])).unwrap().tail_lines.is_none());
        for bad in [
            ("follow", "yes"),
            ("tailLines", "-1"),
            ("tailLines", "x"),
            ("sinceSeconds", "0"),
            ("limitBytes", "0"),
        ] {
            assert!(parse_options(&q(&[bad])).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tls_needs_a_ca() {
        assert!(tls_config(&["localhost".into()], "").is_err());
    }
}
