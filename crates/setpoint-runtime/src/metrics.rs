//! The runtime's Prometheus metrics, with the names Go operators already dashboard.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
/// The registry every metric here registers into (re-exported, so a program can build one
/// without naming the Prometheus crate).
pub use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbCode {
    verb: String,
    code: String,
}

fn histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0005, 2.0, 16,
    ))
}

/// `rest_client_request_duration_seconds{verb,code}`: API request latency as the client saw it.
pub struct ClientMetrics {
    latency: Family<VerbCode, Histogram, fn() -> Histogram>,
}

impl ClientMetrics {
    /// Creates the metrics and registers them.
    pub fn new(registry: &mut Registry) -> Self {
        let latency =
            Family::<VerbCode, Histogram, fn() -> Histogram>::new_with_constructor(histogram);
        registry.register(
            "rest_client_request_duration_seconds",
            "API request latency as the client saw it, by verb and status code",
            latency.clone(),
        );
        ClientMetrics { latency }
    }

    pub(crate) fn observe(&self, verb: &str, code: &str, elapsed: Duration) {
        self.latency
            .get_or_create(&VerbCode {
                verb: verb.into(),
                code: code.into(),
            })
            .observe(elapsed.as_secs_f64());
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseName {
    name: String,
}

/// `leader_election_master_status{name}`: 1 while this process holds the lease `name`, 0
/// otherwise (the name and meaning client-go uses, so existing alerts work unchanged).
///
/// Create it once per registry and hand clones to every
/// [`LeaderElector`](crate::leader::LeaderElector): registering the same name twice would
/// produce duplicate series.
#[derive(Clone, Debug, Default)]
pub struct LeaderMetrics {
    master_status: Family<LeaseName, prometheus_client::metrics::gauge::Gauge>,
}

impl LeaderMetrics {
    /// Creates the gauge and registers it.
    pub fn new(registry: &mut Registry) -> Self {
        let m = LeaderMetrics::default();
        registry.register(
            "leader_election_master_status",
            "Whether this process is the leader of the named lease (1) or a standby (0)",
            m.master_status.clone(),
        );
        m
    }

    pub(crate) fn set_leading(&self, name: &str, leading: bool) {
        self.master_status
            .get_or_create(&LeaseName { name: name.into() })
            .set(i64::from(leading));
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropReason {
    reason: String,
}

/// `event_recorder_dropped_total{reason}`: events the [`EventRecorder`](crate::events::EventRecorder)
/// did not write, by why (`rate_limited`, `queue_full`, `closed`).
#[derive(Clone, Debug, Default)]
pub struct EventMetrics {
    dropped: Family<DropReason, prometheus_client::metrics::counter::Counter>,
}

impl EventMetrics {
    /// Creates the counter and registers it.
    pub fn new(registry: &mut Registry) -> Self {
        let m = EventMetrics::default();
        registry.register(
            "event_recorder_dropped",
            "Events dropped by the recorder instead of being written, by reason",
            m.dropped.clone(),
        );
        m
    }

    pub(crate) fn dropped(&self, reason: &str) {
        self.dropped
            .get_or_create(&DropReason {
                reason: reason.into(),
            })
            .inc();
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabel {
    resource: String,
}

/// `informer_decode_errors_total{resource}`: objects an informer received (in a LIST or a
/// watch event) that did not decode as its type and were skipped, by resource
/// (`deployments.apps`, `pods`). Anything above zero means a stored object is malformed, and
/// the controllers of that type cannot see it.
///
/// Create it once per registry and hand clones to the informers
/// ([`InformerOptions::metrics`](crate::informer::InformerOptions::metrics)).
#[derive(Clone, Debug, Default)]
pub struct InformerMetrics {
    decode_errors: Family<ResourceLabel, prometheus_client::metrics::counter::Counter>,
}

impl InformerMetrics {
    /// Creates the counter and registers it.
    pub fn new(registry: &mut Registry) -> Self {
        let m = InformerMetrics::default();
        registry.register(
            "informer_decode_errors",
            "Objects informers skipped because they did not decode as the informer's type, by resource",
            m.decode_errors.clone(),
        );
        m
    }

    /// How many objects of `resource` were skipped so far.
    pub fn decode_errors(&self, resource: &str) -> u64 {
        self.decode_errors
            .get_or_create(&ResourceLabel {
                resource: resource.into(),
            })
            .get()
    }

    pub(crate) fn decode_error(&self, resource: &str) {
        self.decode_errors
            .get_or_create(&ResourceLabel {
                resource: resource.into(),
            })
            .inc();
    }
}

/// The Prometheus exposition of `registry` for a scrape that sent `accept`: OpenMetrics
/// text when the scraper asks for it, the classic text format otherwise. Returns the
/// `Content-Type` and the body.
pub fn exposition(registry: &Registry, accept: &str) -> (&'static str, String) {
    use prometheus_client::encoding::text::encode;
    use setpoint_api::exposition;
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, registry);
    if exposition::wants_openmetrics(accept) {
        (exposition::OPENMETRICS_TEXT, text)
    } else {
        (
            exposition::PROMETHEUS_TEXT,
            exposition::to_prometheus_text(&text),
        )
    }
}

/// A running metrics endpoint (see [`serve`]); stops when dropped or [`stop`](Self::stop)ped.
pub struct MetricsServer {
    server: crate::serving::Server,
}

impl MetricsServer {
    /// The bound address (with the port chosen when `addr` named port 0).
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.server.local_addr()
    }

    /// Stops accepting scrapes.
    pub async fn stop(self) {
        self.server.stop().await;
    }
}

/// Serves `registry` at `GET /metrics` on `addr` over plain HTTP, as controller-runtime's
/// manager does on `:8080` by default: one call gives an operator built on this runtime a
/// Prometheus scrape target. Any other path answers 404. Plain HTTP has no authentication,
/// so bind a loopback or pod-network address, not a public one.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use std::sync::Arc;
/// use setpoint_runtime::controller::ControllerMetrics;
/// use setpoint_runtime::metrics::{serve, Registry};
///
/// let mut registry = Registry::default();
/// let metrics = ControllerMetrics::new();
/// metrics.register(&mut registry);
/// // Hand `metrics` to the controllers (`Controller::with_metrics`), then:
/// let server = serve("127.0.0.1:8080".parse().unwrap(), Arc::new(registry)).await?;
/// println!("metrics at http://{}/metrics", server.local_addr());
/// # Ok(()) }
/// ```
pub async fn serve(
    addr: std::net::SocketAddr,
    registry: std::sync::Arc<Registry>,
) -> std::io::Result<MetricsServer> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let server = crate::serving::serve(listener, None, "metrics endpoint", move |_| {
        let registry = registry.clone();
        hyper::service::service_fn(move |req| {
            let registry = registry.clone();
            async move { Ok::<_, std::convert::Infallible>(metrics_response(&registry, &req)) }
        })
    })?;
    Ok(MetricsServer { server })
}

fn metrics_response<B>(
    registry: &Registry,
    req: &http::Request<B>,
) -> http::Response<http_body_util::Full<bytes::Bytes>> {
    let text = |status: http::StatusCode, body: &str| {
        http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_owned(),
            )))
            .expect("valid response")
    };
    if req.uri().path() != "/metrics" {
        return text(http::StatusCode::NOT_FOUND, "404 page not found\n");
    }
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return text(http::StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    let accept = req
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let (content_type, body) = exposition(registry, accept);
    http::Response::builder()
        .status(http::StatusCode::OK)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .expect("valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serve_answers_metrics_and_only_metrics() {
        let mut registry = Registry::default();
        let leader = LeaderMetrics::new(&mut registry);
        leader.set_leading("demo", true);
        let server = serve(
            "127.0.0.1:0".parse().unwrap(),
            std::sync::Arc::new(registry),
        )
        .await
        .unwrap();
        let get = |path: &'static str| {
            let addr = server.local_addr();
            async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                s.write_all(
                    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await
                .unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).await.unwrap();
                out
            }
        };
        let metrics = get("/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(
            metrics.contains("leader_election_master_status{name=\"demo\"} 1"),
            "{metrics}"
        );
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        server.stop().await;
    }
}
