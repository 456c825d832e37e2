//! How the API server starts (store, caches, bootstrap objects, TLS) and serves; its state
//! is [`crate::state`].

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::json;
use setpoint_api::ApiError;
use setpoint_store::Store;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use crate::connection::ConnectionConfig;
use crate::metrics::Metrics;
use crate::objects::WriteOptions;
use crate::registry::Registry;
pub use crate::state::{ApiServer, ServerConfig, StoreConfig};
use crate::watchcache::Caches;
pub use setpoint_store::COMPACTION_GUARD_KEY;

/// Store responses the watch cache may have queued. The cache is the store's one watcher and
/// must not be dropped in a write burst; queued responses share their values, so a deep queue
/// costs little.
const CACHE_WATCH_BUFFER: usize = 65_536;

/// A running server: its address, the files a client needs, and a handle to stop it.
pub struct Running {
    /// The server's shared state.
    pub server: Arc<ApiServer>,
    /// The address it listens on (the port chosen when the config asked for port 0).
    pub addr: SocketAddr,
    /// `https://…` or `http://…`: the listen address, or loopback for an unspecified one (as
    /// clients on this machine reach it; the certificate names loopback).
    pub url: String,
    /// Where pods and other machines reach it: the `kubernetes` Service's endpoint
    /// ([`ApiServer::advertise_address`]) and the port.
    pub advertised: SocketAddr,
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
        let mut authenticators =
            crate::authentication::Authenticators::from_config(&config.authentication)
                .map_err(|e| start_error::Error(format!("authentication: {e}")))?;
        let registry = Registry::builtin();
        let metrics = Metrics::new();
        let prefixes = registry
            .all()
            .iter()
            // Reviews are never stored, so they have nothing to cache.
            .filter(|r| !r.is_create_only())
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
        let service_accounts = service_account_issuer(&config, &*store).await?;
        authenticators.push(Box::new(
            crate::authentication::serviceaccount::Authenticator::new(
                service_accounts.clone(),
                caches.clone(),
            ),
        ));
        // Bootstrap tokens of joining machines, from `bootstrap-token-<id>` Secrets.
        authenticators.push(Box::new(
            crate::authentication::bootstrap_token::Authenticator::new(caches.clone()),
        ));
        // RBAC decides after the privileged-groups check, from the caches just loaded.
        let rbac = crate::authorization::rbac::Rbac::new(caches.clone());
        let mut authorizers = crate::authorization::Authorizers::default();
        // Node, RBAC: upstream's `--authorization-mode=Node,RBAC`.
        authorizers.push(Box::new(crate::authorization::node::NodeAuthorizer::new(
            caches.clone(),
            rbac.clone(),
        )));
        authorizers.push(Box::new(rbac.clone()));
        let authorizers = Arc::new(authorizers);
        let audit = crate::audit::Auditor::start(&config.audit, &metrics)
            .map_err(|e| start_error::Error(e.to_string()))?;
        let server = Arc::new(ApiServer {
            trail: Default::default(),
            store,
            registry: parking_lot::RwLock::new(Arc::new(registry)),
            caches,
            metrics,
            address: parking_lot::RwLock::new(config.listen.to_string()),
            agent_tls: parking_lot::RwLock::new(None),
            resource_metrics: Default::default(),
            audit,
            aggregator: Default::default(),
            faults: config.fault_injection.then(Default::default),
            authenticators,
            authorizers,
            rbac,
            service_accounts,
            config,
            ready: AtomicBool::new(false),
            stopping,
        });
        // Admission policies' status (it waits for policies to appear in the watch cache).
        tokio::spawn(server.clone().policy_status_loop());
        server
            .bootstrap()
            .await
            .map_err(|e| start_error::Error(format!("bootstrap: {e}")))?;
        // Custom resources are served from the first request on, not once a loop catches up.
        server.sync_crds().await;
        tokio::spawn(server.clone().crd_loop());
        tokio::spawn(crate::aggregator::run(server.clone()));
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

    /// Creates the namespaces and the `kubernetes` service every cluster has, if missing.
    async fn bootstrap(&self) -> Result<(), ApiError> {
        self.bootstrap_rbac().await?;
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
        // Its create reserves 10.96.0.1, which the allocator hands out to no other Service.
        let kubernetes = kubernetes_service(self.config.listen.port());
        match self
            .create(&svc, "default", kubernetes, &WriteOptions::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.reason == "AlreadyExists" || e.code == 422 => Ok(()),
            Err(e) => Err(e),
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
        let advertised = SocketAddr::new(self.advertise_address(addr), addr.port());
        // A client on this machine reaches a server on every address at loopback.
        let local = match addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => {
                SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, addr.port()))
            }
            IpAddr::V6(ip) if ip.is_unspecified() => {
                SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, addr.port()))
            }
            _ => addr,
        };
        tokio::spawn(self.clone().master_endpoints_loop(addr));
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
                url: format!("http://{local}"),
                advertised,
                kubeconfig: None,
                pki: None,
                shutdown: tx,
                task,
            });
        }
        let pki = crate::tls::Pki::load_or_create_naming(
            self.config.data_dir.as_deref(),
            &[addr.ip(), advertised.ip()],
        )
        .map_err(|e| start_error::Error(format!("certificates: {e}")))?;
        let url = format!("https://{local}");
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
        tokio::spawn(crate::resourcemetrics::scrape_loop(self.clone()));
        self.aggregator.set_client_ca(pki.ca_cert.clone());
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
            advertised,
            kubeconfig,
            pki: Some(pki),
            shutdown: tx,
            task,
        })
    }
}

/// The `default/kubernetes` Service, its port the API server's (`port`).
pub(crate) fn kubernetes_service(port: u16) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1",
                 "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]}
    })
}

/// The service-account token issuer, with the key servers on one shared store share (see
/// [`crate::authentication::serviceaccount::key`]).
async fn service_account_issuer(
    config: &ServerConfig,
    store: &dyn Store,
) -> start_error::Result<Arc<crate::authentication::serviceaccount::Issuer>> {
    use crate::authentication::serviceaccount::{key::SigningKey, Issuer};
    let key =
        SigningKey::load_or_create(store, config.store.is_shared(), config.data_dir.as_deref())
            .await
            .map_err(|e| start_error::Error(format!("service-account key: {e}")))?;
    let authn = &config.authentication;
    if authn.service_account_issuer.is_empty() {
        return Err(start_error::Error(
            "service-account-issuer: must not be empty".into(),
        ));
    }
    Ok(Arc::new(Issuer::with_audiences(
        key,
        &authn.service_account_issuer,
        authn.api_audiences.clone(),
    )))
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
