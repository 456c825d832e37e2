//! A test cluster for operator authors: a real Setpoint API server on an in-memory store,
//! inside the test process, started in milliseconds, with a [`Client`] pointed at it.
//!
//! ```no_run
//! # async fn demo() {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use setpoint_runtime::client::{Api, PostParams};
//! let cluster = setpoint_testing::TestCluster::start().await;
//! let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("settings".into());
//! cms.create(&PostParams::default(), &cm).await.unwrap();
//! # }
//! ```
//!
//! Each cluster is independent, so many can run in parallel in one test binary. The
//! in-process transport goes through the same request pipeline as HTTPS, without sockets;
//! [`TestCluster::start_https`] also serves HTTPS on a free loopback port for tests that need
//! the real wire.

use std::sync::Arc;

pub mod webhook;

use setpoint_apiserver::server::Running;
use setpoint_apiserver::{ApiServer, ServerConfig, StoreConfig};
use setpoint_runtime::client::{Client, HttpsTransport, Kubeconfig, ServiceTransport};

/// A running in-process cluster.
pub struct TestCluster {
    server: Arc<ApiServer>,
    client: Client,
    running: Option<Running>,
    controllers: Option<setpoint_controllers::manager::InProcess>,
}

impl TestCluster {
    /// Starts an API server on an in-memory store with an in-process client.
    pub async fn start() -> TestCluster {
        let config = ServerConfig {
            listen: "127.0.0.1:0".parse().expect("address"),
            ..ServerConfig::default()
        };
        let store = ApiServer::open_store(&config).await.expect("memory store");
        let server = ApiServer::new(config, store).await.expect("API server");
        let client = Client::new(ServiceTransport::new(setpoint_apiserver::http::router(
            server.clone(),
        )));
        TestCluster {
            server,
            client,
            running: None,
            controllers: None,
        }
    }

    /// Starts an API server that also serves HTTPS on a free loopback port, with a client that
    /// connects over it using the admin certificate.
    pub async fn start_https() -> TestCluster {
        let config = ServerConfig {
            listen: "127.0.0.1:0".parse().expect("address"),
            store: StoreConfig::Memory,
            ..ServerConfig::default()
        };
        let store = ApiServer::open_store(&config).await.expect("memory store");
        let server = ApiServer::new(config, store).await.expect("API server");
        let running = server.serve().await.expect("serving HTTPS");
        let pki = running.pki.clone().expect("HTTPS has certificates");
        let kc = Kubeconfig {
            server: running.url.clone(),
            ca_pem: Some(pki.ca_cert.clone()),
            client_cert_pem: Some(pki.admin_cert.clone()),
            client_key_pem: Some(pki.admin_key.clone()),
            ..Kubeconfig::default()
        };
        let client = Client::new(HttpsTransport::from_kubeconfig(&kc).expect("HTTPS client"));
        TestCluster {
            server,
            client,
            running: Some(running),
            controllers: None,
        }
    }

    /// Like [`TestCluster::start`], with Setpoint's built-in controllers running against it
    /// (namespaces really terminate, garbage collection really happens).
    pub async fn start_with_controllers() -> TestCluster {
        TestCluster::start_with_controller_options(Default::default()).await
    }

    /// Like [`TestCluster::start_with_controllers`], with settings (e.g. a short node grace
    /// period).
    pub async fn start_with_controller_options(
        options: setpoint_controllers::manager::Options,
    ) -> TestCluster {
        let mut c = TestCluster::start().await;
        c.controllers = Some(setpoint_controllers::manager::InProcess::start_with(
            c.client.clone(),
            options,
        ));
        c
    }

    /// Like [`TestCluster::start_https`], with Setpoint's built-in controllers running.
    pub async fn start_https_with_controllers() -> TestCluster {
        let mut c = TestCluster::start_https().await;
        c.controllers = Some(setpoint_controllers::manager::InProcess::start(
            c.client.clone(),
        ));
        c
    }

    /// Starts Setpoint's built-in controllers on `informers` (built by the caller on this
    /// cluster's [`client`](TestCluster::client), e.g. with metrics, and shut down by it),
    /// unless controllers already run.
    pub fn start_controllers_on(
        &mut self,
        options: setpoint_controllers::manager::Options,
        informers: setpoint_runtime::informer::SharedInformers,
    ) {
        self.start_controllers_with(self.client.clone(), options, informers);
    }

    /// Like [`TestCluster::start_controllers_on`], with the controllers writing through
    /// `client` (e.g. over a transport that injects faults or holds requests).
    pub fn start_controllers_with(
        &mut self,
        client: Client,
        options: setpoint_controllers::manager::Options,
        informers: setpoint_runtime::informer::SharedInformers,
    ) {
        if self.controllers.is_none() {
            self.controllers = Some(setpoint_controllers::manager::InProcess::start_on(
                client, options, informers,
            ));
        }
    }

    /// Stops the controllers (if any run) and waits for their reconciles in flight; the
    /// server keeps serving.
    pub async fn stop_controllers(&mut self) {
        if let Some(c) = self.controllers.take() {
            c.stop().await;
        }
    }

    /// A client for this cluster (cheap to clone).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The server, e.g. to read its metrics.
    pub fn server(&self) -> &Arc<ApiServer> {
        &self.server
    }

    /// Writes `value` to the store key `key` as it is, past the API server's decoding,
    /// defaulting and validation: the way to put a malformed object in front of clients
    /// (a Deployment whose `kind` is `Pod`, a field of the wrong type). Keys are
    /// `/registry/<group or "core">/<plural>/<namespace>/<name>`; values are the object's
    /// JSON without `resourceVersion`. Returns the write's revision.
    pub async fn put_raw(&self, key: &str, value: &[u8]) -> i64 {
        let kv = self
            .server
            .store()
            .put(
                key,
                bytes::Bytes::copy_from_slice(value),
                setpoint_store::Precondition::None,
            )
            .await
            .unwrap_or_else(|e| panic!("writing {key} to the store: {e}"));
        kv.mod_revision
    }

    /// Deletes the store key `key` past the API server (no finalizers, no cascading), as
    /// [`TestCluster::put_raw`] writes. Returns the deletion's revision.
    pub async fn delete_raw(&self, key: &str) -> i64 {
        let (_, revision) = self
            .server
            .store()
            .delete(key, setpoint_store::Precondition::None)
            .await
            .unwrap_or_else(|e| panic!("deleting {key} from the store: {e}"));
        revision
    }

    /// The store's current revision (the `resourceVersion` of the latest write).
    pub async fn revision(&self) -> i64 {
        self.server
            .store()
            .current_revision()
            .await
            .expect("store revision")
    }

    /// Every change committed under the store key prefix `prefix` after revision `after`, up
    /// to the current revision, in order: what happened, including objects created and
    /// deleted again since.
    pub async fn history(&self, prefix: &str, after: i64) -> Vec<Change> {
        use futures::StreamExt;
        let store = self.server.store();
        let until = store.current_revision().await.expect("store revision");
        let mut out = Vec::new();
        if until <= after {
            return out;
        }
        let mut watch = store
            .watch(prefix, after)
            .await
            .unwrap_or_else(|e| panic!("reading history under {prefix}: {e}"));
        // Progress notifications end the wait when the prefix has no change up to `until`.
        watch.request_progress();
        while let Some(batch) = watch.next().await {
            let batch = batch.unwrap_or_else(|e| panic!("reading history under {prefix}: {e}"));
            for event in batch.events {
                let revision = event.revision();
                if revision > until {
                    return out;
                }
                out.push(match event {
                    setpoint_store::Event::Put { kv, prev } => Change {
                        key: kv.key.to_string(),
                        revision,
                        kind: if prev.is_none() {
                            ChangeKind::Created
                        } else {
                            ChangeKind::Updated
                        },
                    },
                    setpoint_store::Event::Delete { key, .. } => Change {
                        key: key.to_string(),
                        revision,
                        kind: ChangeKind::Deleted,
                    },
                });
            }
            if batch.revision >= until {
                break;
            }
            watch.request_progress();
        }
        out
    }

    /// An admin kubeconfig for the HTTPS endpoint (for processes started by a test), when
    /// serving.
    pub fn kubeconfig(&self) -> Option<String> {
        let r = self.running.as_ref()?;
        Some(r.pki.as_ref()?.kubeconfig(&r.url))
    }

    /// The HTTPS URL, when serving.
    pub fn url(&self) -> Option<&str> {
        self.running.as_ref().map(|r| r.url.as_str())
    }

    /// Stops the server.
    pub async fn stop(mut self) {
        if let Some(c) = self.controllers.take() {
            c.stop().await;
        }
        match self.running.take() {
            Some(r) => r.shutdown().await,
            None => self.server.stop().await,
        }
    }
}

/// One committed change to a store key (see [`TestCluster::history`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The store key (`/registry/core/pods/default/web-1`).
    pub key: String,
    /// The revision the change was committed at.
    pub revision: i64,
    /// Whether the key was created, updated or deleted.
    pub kind: ChangeKind,
}

/// What a [`Change`] did to its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// A put to a key that had no value.
    Created,
    /// A put to a key that had a value.
    Updated,
    /// The key was deleted.
    Deleted,
}

/// Polls `check` every 50 ms until it returns `Some`, and returns that; panics naming `what`
/// if `within` passes first. Tests wait on conditions with this instead of sleeping.
pub async fn eventually_within<T, F>(
    within: std::time::Duration,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T
where
    F: std::future::Future<Output = Option<T>>,
{
    tokio::time::timeout(within, async {
        loop {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out after {within:?} waiting for {what}"))
}

/// [`eventually_within`] for code that is not async (tests driving processes and `kubectl`):
/// polls `check` every 100 ms until it returns `Some`, panicking after `within`.
pub fn eventually_blocking<T>(
    what: &str,
    within: std::time::Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Waits (30 s) for a finished decision record of `controller` about `namespace/name`, in this
/// process's ring, that observed something containing `seen` and took an action containing
/// `action`; returns its observations and that action's rule.
pub async fn decision(
    controller: &str,
    namespace: &str,
    name: &str,
    seen: &str,
    action: &str,
) -> (Vec<String>, String) {
    eventually(
        &format!("a {controller} decision about {namespace}/{name}: {seen}; {action}"),
        || async {
            let records = setpoint_runtime::decision::ring().about(controller, name);
            records.iter().rev().find_map(|r| {
                if r.object.namespace != namespace || !r.observed.iter().any(|o| o.contains(seen)) {
                    return None;
                }
                let a = r.actions.iter().find(|a| a.action.contains(action))?;
                Some((r.observed.clone(), a.rule.clone()))
            })
        },
    )
    .await
}

/// [`eventually_within`] with a 30 s deadline.
pub async fn eventually<T, F>(what: &str, check: impl FnMut() -> F) -> T
where
    F: std::future::Future<Output = Option<T>>,
{
    eventually_within(std::time::Duration::from_secs(30), what, check).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use setpoint_runtime::client::{Api, ListParams, PostParams};

    async fn round_trip(cluster: &TestCluster) {
        let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("settings".into());
        cm.data = Some([("a".to_string(), "b".to_string())].into());
        let created = cms.create(&PostParams::default(), &cm).await.unwrap();
        assert!(created.metadata.uid.is_some());
        let again = cms.create(&PostParams::default(), &cm).await.unwrap_err();
        assert!(again.is_already_exists());
        let list = cms.list(&ListParams::default()).await.unwrap();
        assert_eq!(list.items.len(), 1);
        assert!(!list.resource_version.is_empty());
    }

    #[tokio::test]
    async fn in_process_cluster_serves_the_api() {
        let started = std::time::Instant::now();
        let cluster = TestCluster::start().await;
        let startup = started.elapsed();
        round_trip(&cluster).await;
        cluster.stop().await;
        assert!(startup.as_secs() < 5, "start took {startup:?}");
    }

    #[tokio::test]
    async fn with_controllers_namespaces_really_terminate() {
        use k8s_openapi::api::core::v1::Namespace;
        use setpoint_runtime::client::DeleteParams;
        let cluster = TestCluster::start_with_controllers().await;
        let namespaces: Api<Namespace> = Api::all(cluster.client());
        let mut ns = Namespace::default();
        ns.metadata.name = Some("short-lived".into());
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        namespaces
            .delete("short-lived", &DeleteParams::default())
            .await
            .unwrap();
        let gone = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            while namespaces.get_opt("short-lived").await.unwrap().is_some() {
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(gone.is_ok(), "the namespace was not removed");
        cluster.stop().await;
    }

    #[tokio::test]
    async fn https_cluster_serves_the_api() {
        let cluster = TestCluster::start_https().await;
        assert!(cluster.url().unwrap().starts_with("https://127.0.0.1:"));
        round_trip(&cluster).await;
        cluster.stop().await;
    }
}
