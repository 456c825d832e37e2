//! Prometheus metrics served at `/metrics`: request counts and latency by verb and resource,
//! registered watchers, watchers dropped for being slow, and store latency.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: String,
    resource: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbResource {
    verb: String,
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabel {
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: String,
}

fn latency_histogram() -> Histogram {
    // 100 µs … ~52 s.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0001, 2.0, 20,
    ))
}

struct Inner {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<VerbResource, Histogram, fn() -> Histogram>,
    watchers: Family<ResourceLabel, Gauge>,
    watchers_dropped: Family<ResourceLabel, Counter>,
    store_latency: Family<OperationLabel, Histogram, fn() -> Histogram>,
    /// Registries of components running in this process (`setpoint up`'s controllers and
    /// informers), served at the same `/metrics`.
    included: parking_lot::RwLock<Vec<Arc<Registry>>>,
}

/// The server's metrics; cheap to clone.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<VerbResource, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let watchers = Family::<ResourceLabel, Gauge>::default();
        let watchers_dropped = Family::<ResourceLabel, Counter>::default();
        let store_latency =
            Family::<OperationLabel, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        registry.register(
            "apiserver_request",
            "Requests by verb, resource and HTTP code",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Request latency by verb and resource (watches: time to start)",
            latency.clone(),
        );
        registry.register(
            "apiserver_registered_watchers",
            "Open watches by resource",
            watchers.clone(),
        );
        registry.register(
            "apiserver_watchers_dropped",
            "Watchers closed because they did not keep up",
            watchers_dropped.clone(),
        );
        registry.register(
            "setpoint_store_request_duration_seconds",
            "Store operation latency by operation",
            store_latency.clone(),
        );
        Metrics(Arc::new(Inner {
            registry,
            requests,
            latency,
            watchers,
            watchers_dropped,
            store_latency,
            included: parking_lot::RwLock::new(Vec::new()),
        }))
    }

    /// Serves the metrics of `registry` with the server's own, for components that run in
    /// the server's process and have no endpoint of their own. Their names must not collide
    /// with the server's.
    pub fn include(&self, registry: Arc<Registry>) {
        self.0.included.write().push(registry);
    }

    /// Records one finished request.
    pub fn request(&self, verb: &str, resource: &str, code: u16, elapsed: Duration) {
        self.0
            .requests
            .get_or_create(&RequestLabels {
                verb: verb.into(),
                resource: resource.into(),
                code: code.to_string(),
            })
            .inc();
        self.0
            .latency
            .get_or_create(&VerbResource {
                verb: verb.into(),
                resource: resource.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Adjusts the open-watch gauge of a resource.
    pub fn watchers_changed(&self, resource: &str, delta: i64) {
        self.0
            .watchers
            .get_or_create(&ResourceLabel {
                resource: resource.into(),
            })
            .inc_by(delta);
    }

    /// Counts watchers dropped for being slow.
    pub fn watchers_dropped(&self, resource: &str, n: u64) {
        self.0
            .watchers_dropped
            .get_or_create(&ResourceLabel {
                resource: resource.into(),
            })
            .inc_by(n);
    }

    /// Records one store operation.
    pub fn store(&self, operation: &str, elapsed: Duration) {
        self.0
            .store_latency
            .get_or_create(&OperationLabel {
                operation: operation.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        let _ = encode_registry(&mut out, &self.0.registry);
        for r in self.0.included.read().iter() {
            let _ = encode_registry(&mut out, r);
        }
        let _ = encode_eof(&mut out);
        out
    }
}
