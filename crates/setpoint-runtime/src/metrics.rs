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
