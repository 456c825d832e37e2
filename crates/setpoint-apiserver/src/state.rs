//! The API server's shared state and its configuration: what every request handler and
//! background loop reads. How the server starts and serves is in [`crate::server`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use setpoint_store::Store;
use tokio::sync::watch;

use crate::connection::ConnectionConfig;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::watchcache::{CacheConfig, Caches};

/// Which store backs the server.
#[derive(Clone, Debug)]
pub enum StoreConfig {
    /// In memory (tests): nothing survives the process.
    Memory,
    /// The durable embedded store in this directory.
    Embedded(PathBuf),
    /// An etcd cluster, which several API servers may share (see [`crate::COMPACTION_GUARD_KEY`]).
    Etcd(setpoint_store::etcd::EtcdOptions),
}

impl StoreConfig {
    /// Whether other API servers may be writing to (and compacting) the same store.
    pub fn is_shared(&self) -> bool {
        matches!(self, StoreConfig::Etcd(_))
    }
}

/// How to run the API server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to listen on (port 0 picks a free port): kube-apiserver's `--bind-address` and
    /// `--secure-port` in one.
    pub listen: SocketAddr,
    /// The address the `kubernetes` Service's endpoints name, where pods and other machines
    /// reach this server (kube-apiserver's `--advertise-address`). `None` (or an unspecified
    /// address): the listen address, or for an unspecified one the address of the interface
    /// with the default route ([`crate::masterendpoints::advertised`]).
    pub advertise_address: Option<std::net::IpAddr>,
    /// Where certificates and the kubeconfig go (and the embedded store, by default).
    pub data_dir: Option<PathBuf>,
    /// Which store backs the server.
    pub store: StoreConfig,
    /// Serve plain HTTP without authentication instead of HTTPS.
    pub insecure_http: bool,
    /// Largest request body accepted (bigger ones get 413).
    pub max_body_bytes: usize,
    /// Connection limits and timeouts (request heads, idle connections, TLS handshakes, how
    /// long a request body may take); see [`ConnectionConfig`] for the upstream values.
    pub connection: ConnectionConfig,
    /// The watch cache's history and buffer sizes.
    pub cache: CacheConfig,
    /// How callers are authenticated (anonymous requests, the static token file).
    pub authentication: crate::authentication::AuthenticationConfig,
    /// How often old revisions are compacted, keeping this much history.
    pub compaction_interval: Duration,
    /// How often every node's agent is scraped for the resource metrics API
    /// (`metrics.k8s.io`, metrics-server's `--metric-resolution`).
    pub metric_resolution: Duration,
    /// How long new pods tolerate their node being not ready or unreachable before they are
    /// evicted (the `tolerationSeconds` added to pods that set none).
    pub default_toleration_seconds: i64,
    /// Whether the `ServiceAccount` admission step runs on new pods (`setpoint server` and
    /// `up` turn it on, as kube-apiserver enables it by default; off for bare in-process
    /// servers in tests, which run no controller to create the `default` accounts).
    pub service_account_admission: bool,
    /// The ports `NodePort` and `LoadBalancer` Services' `nodePort`s come from
    /// (kube-apiserver's `--service-node-port-range`, 30000-32767 by default).
    pub service_node_port_range: std::ops::RangeInclusive<u16>,
    /// Audit logging (`--audit-policy-file`, `--audit-log-*`); off by default.
    pub audit: crate::audit::AuditOptions,
    /// Serve [`crate::faults::FAULTS_PATH`], through which tests drop watches, force 410s and
    /// add latency (`--enable-fault-injection`); never on in normal use.
    pub fault_injection: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:6443".parse().expect("valid address"),
            advertise_address: None,
            data_dir: None,
            store: StoreConfig::Memory,
            insecure_http: false,
            max_body_bytes: 3 * 1024 * 1024,
            metric_resolution: crate::resourcemetrics::DEFAULT_RESOLUTION,
            connection: ConnectionConfig::default(),
            cache: CacheConfig::default(),
            authentication: Default::default(),
            compaction_interval: Duration::from_secs(300),
            default_toleration_seconds: 300,
            service_account_admission: false,
            service_node_port_range: 30000..=32767,
            audit: Default::default(),
            fault_injection: false,
        }
    }
}

/// The server's shared state. Request handlers get an `Arc<ApiServer>`.
pub struct ApiServer {
    pub(crate) store: Arc<dyn Store>,
    /// Recent writes and pushed decision records, for `setpoint why` (bounded rings).
    pub trail: crate::trail::Trail,
    /// The served resources: a snapshot replaced whole when custom resources change, so a
    /// request sees one consistent set.
    pub(crate) registry: parking_lot::RwLock<Arc<Registry>>,
    pub(crate) caches: Arc<Caches>,
    pub(crate) metrics: Metrics,
    pub(crate) config: ServerConfig,
    /// The address the server actually serves on (for discovery's serverAddress).
    pub(crate) address: parking_lot::RwLock<String>,
    pub(crate) ready: AtomicBool,
    /// Turns true when the server stops; background tasks end on it.
    pub(crate) stopping: watch::Sender<bool>,
    /// Who is calling: the token authenticators and whether anonymous requests are allowed.
    pub(crate) authenticators: crate::authentication::Authenticators,
    /// What callers may do; shared with the admission policies' `authorizer` variable.
    pub(crate) authorizers: Arc<crate::authorization::Authorizers>,
    /// The RBAC authorizer (also on `authorizers`), for what asks which rules a user holds:
    /// escalation checks and rules reviews.
    pub(crate) rbac: crate::authorization::rbac::Rbac,
    /// The service-account token issuer (its key, name and the API's audiences).
    pub(crate) service_accounts: Arc<crate::authentication::serviceaccount::Issuer>,
    /// TLS towards node agents (for `pods/log`); set once serving HTTPS.
    pub(crate) agent_tls: parking_lot::RwLock<Option<Arc<rustls::ClientConfig>>>,
    /// The latest figures of the resource metrics API, scraped from the agents.
    pub(crate) resource_metrics: crate::resourcemetrics::ResourceMetrics,
    /// The audit backend, when audit logging is on.
    pub(crate) audit: Option<Arc<crate::audit::Auditor>>,
    /// The aggregation layer's state: the front-proxy identity and the extension servers'
    /// resources.
    pub(crate) aggregator: crate::aggregator::Aggregator,
    /// The fault-injection switch, only when [`ServerConfig::fault_injection`] is on.
    pub(crate) faults: Option<crate::faults::Faults>,
}

impl ServerConfig {
    /// The configuration of the built-in admission steps.
    pub(crate) fn admission(&self) -> crate::admission::AdmissionConfig {
        crate::admission::AdmissionConfig {
            default_toleration_seconds: self.default_toleration_seconds,
        }
    }
}

impl ApiServer {
    /// Whether the server has loaded its caches and bootstrap objects.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Whether the server has begun to stop.
    pub fn is_stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// The registry of served resources.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.read().clone()
    }

    /// Replaces the served resources (custom resources were established or removed).
    /// A receiver that turns true when the server stops (for its background loops).
    pub(crate) fn stopping_signal(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    pub(crate) fn set_registry(&self, registry: Registry) {
        *self.registry.write() = Arc::new(registry);
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}
