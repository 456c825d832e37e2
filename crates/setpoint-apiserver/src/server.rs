//! The API server: its state, how it starts (store, caches, bootstrap objects, TLS), and
//! background upkeep (compaction).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use setpoint_api::ApiError;
use setpoint_store::Store;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::objects::WriteOptions;
use crate::registry::Registry;
use crate::watchcache::{CacheConfig, Caches};

pub mod connection;

pub use connection::ConnectionConfig;

/// Which store backs the server.
#[derive(Clone, Debug)]
pub enum StoreConfig {
    /// In memory (tests): nothing survives the process.
    Memory,
    /// The durable embedded store in this directory.
    Embedded(PathBuf),
    /// An etcd cluster, which several API servers may share (see [`COMPACTION_GUARD_KEY`]).
    Etcd(setpoint_store::etcd::EtcdOptions),
}

impl StoreConfig {
    /// Whether other API servers may be writing to (and compacting) the same store.
    pub fn is_shared(&self) -> bool {
        matches!(self, StoreConfig::Etcd(_))
    }
}

pub use setpoint_store::COMPACTION_GUARD_KEY;

/// How to run the API server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to listen on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Where certificates and the kubeconfig go (and the embedded store, by default).
    pub data_dir: Option<PathBuf>,
    pub store: StoreConfig,
    /// Serve plain HTTP without authentication instead of HTTPS.
    pub insecure_http: bool,
    /// Largest request body accepted (bigger ones get 413).
    pub max_body_bytes: usize,
    /// Connection limits and timeouts (request heads, idle connections, TLS handshakes, how
    /// long a request body may take); see [`ConnectionConfig`] for the upstream values.
    pub connection: ConnectionConfig,
    pub cache: CacheConfig,
    /// How often old revisions are compacted, keeping this much history.
    pub compaction_interval: Duration,
    /// How long new pods tolerate their node being not ready or unreachable before they are
    /// evicted (the `tolerationSeconds` added to pods that set none).
    pub default_toleration_seconds: i64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:6443".parse().expect("valid address"),
            data_dir: None,
            store: StoreConfig::Memory,
            insecure_http: false,
            max_body_bytes: 3 * 1024 * 1024,
            connection: ConnectionConfig::default(),
            cache: CacheConfig::default(),
            compaction_interval: Duration::from_secs(300),
            default_toleration_seconds: 300,
        }
    }
}

/// Store responses the watch cache may have queued. The cache is the store's one watcher and
/// must not be dropped in a write burst; queued responses share their values, so a deep queue
/// costs little.
const CACHE_WATCH_BUFFER: usize = 65_536;

/// The server's shared state. Request handlers get an `Arc<ApiServer>`.
pub struct ApiServer {
    pub(crate) store: Arc<dyn Store>,
    /// The served resources: a snapshot replaced whole when custom resources change, so a
    /// request sees one consistent set.
    registry: parking_lot::RwLock<Arc<Registry>>,
    pub(crate) caches: Arc<Caches>,
    pub(crate) metrics: Metrics,
    pub(crate) config: ServerConfig,
    /// The address the server actually serves on (for discovery's serverAddress).
    pub(crate) address: parking_lot::RwLock<String>,
    ready: AtomicBool,
    /// Turns true when the server stops; background tasks end on it.
    stopping: watch::Sender<bool>,
    /// TLS towards node agents (for `pods/log`); set once serving HTTPS.
    pub(crate) agent_tls: parking_lot::RwLock<Option<Arc<rustls::ClientConfig>>>,
}

/// A running server: its address, the files a client needs, and a handle to stop it.
pub struct Running {
    pub server: Arc<ApiServer>,
    pub addr: SocketAddr,
    /// `https://…` or `http://…`.
    pub url: String,
    /// The admin kubeconfig (HTTPS with a data dir only).
    pub kubeconfig: Option<PathBuf>,
    /// The certificates (HTTPS only), for clients that connect without a kubeconfig file.
    pub pki: Option<crate::tls::Pki>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting connections, ends the background tasks and closes the store.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
        self.server.stop().await;
    }
}

impl ApiServer {
    /// Opens the store named by the config.
    pub async fn open_store(config: &ServerConfig) -> start_error::Result<Arc<dyn Store>> {
        Ok(match &config.store {
            StoreConfig::Memory => Arc::new(setpoint_store::memory::MemoryStore::with_options(
                setpoint_store::memory::MemoryOptions {
                    watch_buffer: CACHE_WATCH_BUFFER,
                    ..Default::default()
                },
            )),
            StoreConfig::Embedded(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| start_error::Error(format!("creating {}: {e}", dir.display())))?;
                let dir = dir.clone();
                let options = setpoint_store::embedded::EmbeddedOptions {
                    watch_buffer: CACHE_WATCH_BUFFER,
                    ..Default::default()
                };
                let store =
                    setpoint_store::embedded::EmbeddedStore::open(&dir, options).map_err(|e| {
                        start_error::Error(format!("opening store in {}: {e}", dir.display()))
                    })?;
                Arc::new(store)
            }
            StoreConfig::Etcd(options) => {
                let store = setpoint_store::etcd::EtcdStore::connect(options.clone())
                    .await
                    .map_err(|e| start_error::Error(format!("opening the etcd store: {e}")))?;
                Arc::new(store)
            }
        })
    }

    /// Builds the server over a store: loads the caches and writes the bootstrap objects.
    pub async fn new(
        config: ServerConfig,
        store: Arc<dyn Store>,
    ) -> start_error::Result<Arc<ApiServer>> {
        let registry = Registry::builtin();
        let metrics = Metrics::new();
        let prefixes = registry
            .all()
            .iter()
            .map(|r| r.storage_prefix())
            .collect::<std::collections::BTreeSet<_>>();
        let (stopping, stop_rx) = watch::channel(false);
        let caches = Caches::start(
            store.clone(),
            prefixes.into_iter().collect(),
            config.cache.clone(),
            metrics.clone(),
            stop_rx,
        )
        .await
        .map_err(|e| start_error::Error(format!("loading the watch cache: {e}")))?;
        let server = Arc::new(ApiServer {
            store,
            registry: parking_lot::RwLock::new(Arc::new(registry)),
            caches,
            metrics,
            address: parking_lot::RwLock::new(config.listen.to_string()),
            agent_tls: parking_lot::RwLock::new(None),
            config,
            ready: AtomicBool::new(false),
            stopping,
        });
        server
            .bootstrap()
            .await
            .map_err(|e| start_error::Error(format!("bootstrap: {e}")))?;
        // Custom resources are served from the first request on, not once a loop catches up.
        server.sync_crds().await;
        tokio::spawn(server.clone().crd_loop());
        server.ready.store(true, Ordering::SeqCst);
        let s = server.clone();
        tokio::spawn(async move { s.compaction_loop().await });
        Ok(server)
    }

    /// Ends the background tasks and closes the store (pending writes finish first).
    pub async fn stop(&self) {
        self.ready.store(false, Ordering::SeqCst);
        let _ = self.stopping.send(true);
        if let Err(e) = self.store.close().await {
            tracing::warn!(error = %e, "closing the store");
        }
    }

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

    /// Creates the namespaces and the `kubernetes` service every cluster has, if missing.
    async fn bootstrap(&self) -> Result<(), ApiError> {
        let ns = self
            .registry()
            .get("", "v1", "namespaces")
            .expect("built in")
            .clone();
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
            match self.create(&ns, "", obj, &WriteOptions::default()).await {
                Ok(_) => {}
                Err(e) if e.reason == "AlreadyExists" => {}
                Err(e) => return Err(e),
            }
        }
        let svc = self
            .registry()
            .get("", "v1", "services")
            .expect("built in")
            .clone();
        self.reserve_cluster_ip("10.96.0.1").await;
        let kubernetes = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1",
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": self.config.listen.port() as i64}]}
        });
        match self
            .create(&svc, "default", kubernetes, &WriteOptions::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.reason == "AlreadyExists" || e.code == 422 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every interval, compacts the store to the revision seen one interval earlier, so that
    /// watchers and paginated lists get at least one interval of history.
    ///
    /// A shared store (etcd with several API servers) uses [`Self::compact_if_first`] instead, so
    /// that the servers compact once per interval between them rather than each on its own
    /// clock.
    async fn compaction_loop(self: Arc<Self>) {
        let interval = self.config.compaction_interval;
        let shared = self.config.store.is_shared();
        let mut previous = None;
        let mut guard = GuardSeen::default();
        let mut stop = self.stopping.subscribe();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if shared {
                self.compact_if_first(&mut guard).await;
                continue;
            }
            if let Some(rev) = previous {
                self.compact_to(rev).await;
            }
            previous = self.store.current_revision().await.ok();
        }
    }

    async fn compact_to(&self, rev: setpoint_store::Revision) {
        if let Err(e) = self.store.compact(rev).await {
            tracing::warn!(error = %e, revision = rev, "compaction failed");
        } else {
            tracing::debug!(revision = rev, "compacted");
        }
    }

    /// One compaction tick on a shared store, after the scheme Kubernetes uses on etcd.
    ///
    /// Every server remembers the `mod_revision` of [`COMPACTION_GUARD_KEY`] as it last saw it
    /// and the revision it saw it at. Each tick it rewrites the key with a compare-and-swap on
    /// that `mod_revision` (one etcd transaction):
    /// - if the swap succeeds, nobody has compacted since this server's previous tick, so it
    ///   compacts to the revision it remembered at its previous tick (one interval old), and
    ///   remembers the new one;
    /// - if it fails, another server swapped (and compacted) in the meantime: this server
    ///   adopts the key's new `mod_revision` and the current revision, and tries again next
    ///   tick.
    ///
    /// So at most one server compacts per interval, always to a revision at least one interval
    /// old, and when that server goes away another takes over after one more interval.
    async fn compact_if_first(&self, seen: &mut GuardSeen) {
        let precondition = match seen.mod_revision {
            Some(r) => setpoint_store::Precondition::ModRevision(r),
            None => setpoint_store::Precondition::NotExists,
        };
        let value = bytes::Bytes::from(seen.target.unwrap_or(0).to_string());
        match self
            .store
            .put(COMPACTION_GUARD_KEY, value, precondition)
            .await
        {
            Ok(kv) => {
                if let Some(target) = seen.target {
                    self.compact_to(target).await;
                }
                seen.mod_revision = Some(kv.mod_revision);
                seen.target = Some(kv.mod_revision);
            }
            Err(setpoint_store::StoreError::Conflict { current, .. }) => {
                seen.mod_revision = current.map(|kv| kv.mod_revision);
                seen.target = self.store.current_revision().await.ok();
            }
            Err(setpoint_store::StoreError::AlreadyExists { .. }) => {
                match self.store.get(COMPACTION_GUARD_KEY).await {
                    Ok(kv) => seen.mod_revision = kv.map(|kv| kv.mod_revision),
                    Err(e) => tracing::warn!(error = %e, "reading the compaction guard"),
                }
                seen.target = self.store.current_revision().await.ok();
            }
            Err(e) => tracing::warn!(error = %e, "compaction guard"),
        }
    }

    /// Binds the listener and serves until shut down. With a data dir and HTTPS, writes the
    /// certificates and an admin kubeconfig there.
    pub async fn serve(self: &Arc<Self>) -> start_error::Result<Running> {
        let listener = TcpListener::bind(self.config.listen)
            .await
            .map_err(|e| start_error::Error(format!("binding {}: {e}", self.config.listen)))?;
        let addr = listener
            .local_addr()
            .map_err(|e| start_error::Error(e.to_string()))?;
        *self.address.write() = addr.to_string();
        let (tx, rx) = watch::channel(false);
        let router = crate::http::router(self.clone());
        if self.config.insecure_http {
            let task = tokio::spawn(crate::tls::serve_plain(
                listener,
                router,
                self.config.connection.clone(),
                rx,
            ));
            return Ok(Running {
                server: self.clone(),
                addr,
                url: format!("http://{addr}"),
                kubeconfig: None,
                pki: None,
                shutdown: tx,
                task,
            });
        }
        let pki = crate::tls::Pki::load_or_create(self.config.data_dir.as_deref(), addr)
            .map_err(|e| start_error::Error(format!("certificates: {e}")))?;
        let url = format!("https://{addr}");
        let kubeconfig = match &self.config.data_dir {
            Some(dir) => Some(
                pki.write_kubeconfig(dir, &url)
                    .map_err(|e| start_error::Error(format!("kubeconfig: {e}")))?,
            ),
            None => None,
        };
        let tls = pki
            .server_config()
            .map_err(|e| start_error::Error(format!("TLS: {e}")))?;
        let (agent_cert, agent_key) = pki
            .issue_agent_client()
            .map_err(|e| start_error::Error(format!("certificates: {e}")))?;
        *self.agent_tls.write() = Some(
            crate::podlogs::agent_client_config(&agent_cert, &agent_key)
                .map_err(|e| start_error::Error(format!("TLS: {e}")))?,
        );
        let task = tokio::spawn(crate::tls::serve_tls(
            listener,
            router,
            tls,
            self.config.connection.clone(),
            rx,
        ));
        Ok(Running {
            server: self.clone(),
            addr,
            url,
            kubeconfig,
            pki: Some(pki),
            shutdown: tx,
            task,
        })
    }
}

/// What a server last saw of [`COMPACTION_GUARD_KEY`] (see `ApiServer::compact_if_first`).
#[derive(Debug, Default)]
struct GuardSeen {
    /// The key's `mod_revision` when this server last looked (`None`: absent).
    mod_revision: Option<setpoint_store::Revision>,
    /// The revision to compact to if this server's next swap succeeds: the one it saw at its
    /// previous tick, so one interval old by then.
    target: Option<setpoint_store::Revision>,
}

/// A tiny error type for start-up failures, so the library needs no `anyhow`.
pub mod start_error {
    /// A start-up failure with a message.
    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    pub struct Error(pub String);
    /// Result alias.
    pub type Result<T> = std::result::Result<T, Error>;
}
