//! What a node's pods refer to, read through the node's own identity ([`ApiSources`], the
//! node's [`ObjectSource`]), cheaply and driven by changes as the kubelet's watch-based
//! ConfigMap and Secret managers are:
//!
//! - The pods bound to the node are tracked from the pod informer ([`ApiSources::observe`]):
//!   which ConfigMaps and Secrets each one names (environment, volumes, image pull secrets).
//! - The first read of such an object starts a watch of that one object (LIST and WATCH in
//!   its namespace with `fieldSelector=metadata.name=<name>`, which the Node authorizer
//!   allows for an object of the node's pods), shared by every pod naming it. Reads are
//!   served from its cache; when the object changes, appears or goes away, every pod naming
//!   it is synced again. The watch stops when no tracked pod names the object any more. An
//!   object no tracked pod names (a pod the informer has not shown yet) is read by a GET.
//! - Services come from one informer over all Services, started by the first read.
//! - Service-account tokens are kept per request and asked again when 80 % of their lifetime
//!   has passed or they are older than 24 hours (the kubelet's rule), so the work per pod
//!   does not grow with time; a deleted pod's tokens are dropped.
//! - Claims and volumes are read by a GET each time (they are read once per pod start).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;
use setpoint_runtime::client::{Api, Client};
use setpoint_runtime::informer::{Event, Informer, InformerOptions};
use setpoint_runtime::object::{Object, ObjectKey};

use crate::runtime::{ApiServerAddress, IssuedToken, ObjectSource, SourceFuture, TokenRequestFor};

/// How long a read waits for a new watch's first LIST before answering with the kubelet's
/// error (its managers poll for a second).
const SYNC_WAIT: Duration = Duration::from_secs(1);
/// How long the first read of Services waits for their informer's first LIST.
const SERVICES_WAIT: Duration = Duration::from_secs(5);
/// The kubelet's longest token lifetime before a refresh (`maxTTL`).
const TOKEN_MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// What re-syncs a pod: the node's pod workers' enqueue.
pub type Resync = Box<dyn Fn(ObjectKey) + Send + Sync>;

/// The node's [`ObjectSource`] over its client; see the module documentation.
pub struct ApiSources {
    client: Client,
    api_server: Option<ApiServerAddress>,
    config_maps: Watches<ConfigMap>,
    secrets: Watches<Secret>,
    services: OnceLock<Informer<Service>>,
    tokens: Arc<Mutex<HashMap<TokenRequestFor, IssuedToken>>>,
    /// Per tracked pod (by uid), its key and the names it refers to.
    pods: Arc<Mutex<HashMap<String, TrackedPod>>>,
    resync: Arc<OnceLock<Resync>>,
    /// Set by the first read of a ConfigMap or Secret: a node whose runtime never reads any
    /// (simulated nodes) tracks no pods.
    active: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct TrackedPod {
    key: Option<ObjectKey>,
    config_maps: BTreeSet<String>,
    secrets: BTreeSet<String>,
}

impl ApiSources {
    /// Sources reading through `client`; `api_server` is where pods that share the node's
    /// network reach the API server.
    pub fn new(client: Client, api_server: Option<ApiServerAddress>) -> ApiSources {
        let resync = Arc::new(OnceLock::new());
        ApiSources {
            config_maps: Watches::new(client.clone(), "configmap", resync.clone()),
            secrets: Watches::new(client.clone(), "secret", resync.clone()),
            client,
            api_server,
            services: OnceLock::new(),
            tokens: Arc::new(Mutex::new(HashMap::new())),
            pods: Arc::new(Mutex::new(HashMap::new())),
            resync,
            active: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Sets what syncs a pod again when an object it names changes (once; later calls do
    /// nothing).
    pub fn set_resync(&self, resync: Resync) {
        let _ = self.resync.set(resync);
    }

    /// Follows a pod informer event of a pod bound to this node: the objects it names are
    /// tracked while it exists, and a deleted pod's watches and tokens are let go.
    pub fn observe(&self, event: &Event<Pod>) {
        let pod = event.object();
        if !self.active.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let (config_maps, secrets) = match event {
            Event::Deleted(_) => (BTreeSet::new(), BTreeSet::new()),
            _ if event.is_resync() => return,
            _ => pod_references(pod),
        };
        let key = ObjectKey::new(
            Some(&namespace),
            pod.metadata.name.as_deref().unwrap_or_default(),
        );
        let previous = {
            let mut pods = self.pods.lock();
            let entry = pods.entry(uid.clone()).or_default();
            let previous = std::mem::take(entry);
            entry.key = Some(key.clone());
            entry.config_maps = config_maps.clone();
            entry.secrets = secrets.clone();
            if matches!(event, Event::Deleted(_)) {
                pods.remove(&uid);
            }
            previous
        };
        self.config_maps
            .retrack(&namespace, &key, &previous.config_maps, &config_maps);
        self.secrets
            .retrack(&namespace, &key, &previous.secrets, &secrets);
        if matches!(event, Event::Deleted(_)) {
            self.tokens.lock().retain(|r, _| r.pod_uid != uid);
        }
    }

    fn activate(&self) {
        self.active
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many single-object watches run (for tests and metrics).
    pub fn watches(&self) -> usize {
        self.config_maps.running() + self.secrets.running()
    }

    fn get<K>(&self, namespace: Option<&str>, name: &str) -> SourceFuture<Option<K>>
    where
        K: k8s_openapi::Resource + serde::de::DeserializeOwned + serde::Serialize + Send + 'static,
        K::Scope: 'static,
    {
        let api: Api<K> = match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let name = name.to_string();
        Box::pin(async move { found(api.get(&name).await) })
    }

    fn services_informer(&self) -> Informer<Service> {
        self.services
            .get_or_init(|| {
                let informer =
                    Informer::new(Api::all(self.client.clone()), InformerOptions::lean());
                informer.start();
                informer
            })
            .clone()
    }
}

impl Drop for ApiSources {
    fn drop(&mut self) {
        self.config_maps.stop_all();
        self.secrets.stop_all();
        if let Some(s) = self.services.get() {
            s.stop();
        }
    }
}

/// The ConfigMaps and Secrets a pod names, as the kubelet's managers register them: its
/// containers' environments, its volumes (projected ones too) and, for Secrets, its image
/// pull secrets.
pub fn pod_references(pod: &Pod) -> (BTreeSet<String>, BTreeSet<String>) {
    let (env_cms, env_secrets) = crate::env::env_references(pod);
    let mut config_maps: BTreeSet<String> = env_cms.into_iter().collect();
    let mut secrets: BTreeSet<String> = env_secrets.into_iter().collect();
    let Some(spec) = &pod.spec else {
        return (config_maps, secrets);
    };
    for s in spec.image_pull_secrets.iter().flatten() {
        secrets.insert(s.name.clone());
    }
    for v in spec.volumes.iter().flatten() {
        if let Some(cm) = &v.config_map {
            config_maps.insert(cm.name.clone());
        }
        if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            secrets.insert(name);
        }
        for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(cm) = &p.config_map {
                config_maps.insert(cm.name.clone());
            }
            if let Some(s) = &p.secret {
                secrets.insert(s.name.clone());
            }
        }
    }
    config_maps.remove("");
    secrets.remove("");
    (config_maps, secrets)
}

/// Whether a token issued for `expiration_seconds` and expiring at `expires` must be asked
/// again at `now` (the kubelet's token manager): when 80 % of its lifetime has passed, or
/// when it is older than 24 hours.
pub fn token_needs_refresh(now: Timestamp, expires: Timestamp, expiration_seconds: i64) -> bool {
    let lifetime = k8s_openapi::jiff::SignedDuration::from_secs(expiration_seconds.max(0));
    let issued = expires - lifetime;
    let max_age = k8s_openapi::jiff::SignedDuration::from_secs(TOKEN_MAX_AGE.as_secs() as i64);
    if now > issued + max_age {
        return true;
    }
    let fifth = k8s_openapi::jiff::SignedDuration::from_secs(expiration_seconds.max(0) * 20 / 100);
    now > expires - fifth
}

/// Where a client of `url` (a kubeconfig's `server`, `https://host[:port]`) reaches the API
/// server, as pods that share the node's network are told: the host (an IPv6 address without
/// its brackets) and the port (443 when the URL names none). `None` for a URL without a host.
pub fn api_server_address(url: &str) -> Option<ApiServerAddress> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let default_port = if scheme.eq_ignore_ascii_case("http") {
        80
    } else {
        443
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => default_port,
    };
    (!host.is_empty()).then(|| ApiServerAddress {
        host: host.to_string(),
        port,
    })
}

/// `Ok(None)` for a 404, the error's text otherwise.
fn found<T>(result: Result<T, setpoint_runtime::client::ClientError>) -> Result<Option<T>, String> {
    match result {
        Ok(object) => Ok(Some(object)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// The watched objects of one kind by namespace and name, shared with their watches'
/// handlers.
type WatchState<K> = Arc<Mutex<HashMap<(String, String), Watched<K>>>>;

/// Single-object watches of one kind, keyed by namespace and name.
struct Watches<K: Object> {
    client: Client,
    /// The singular resource the kubelet's managers name in their errors.
    resource: &'static str,
    state: WatchState<K>,
    resync: Arc<OnceLock<Resync>>,
}

struct Watched<K> {
    /// The tracked pods naming the object.
    pods: HashSet<ObjectKey>,
    /// Its watch, from the first read on.
    informer: Option<Informer<K>>,
}

impl<K: Object + k8s_openapi::Resource> Watches<K>
where
    K: k8s_openapi::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    fn new(client: Client, resource: &'static str, resync: Arc<OnceLock<Resync>>) -> Self {
        Watches {
            client,
            resource,
            state: Arc::new(Mutex::new(HashMap::new())),
            resync,
        }
    }

    /// Moves `pod` from the objects it named before to those it names now.
    fn retrack(
        &self,
        namespace: &str,
        pod: &ObjectKey,
        before: &BTreeSet<String>,
        now: &BTreeSet<String>,
    ) {
        let mut stopped = Vec::new();
        {
            let mut state = self.state.lock();
            for name in now.difference(before) {
                state
                    .entry((namespace.to_string(), name.clone()))
                    .or_insert_with(|| Watched {
                        pods: HashSet::new(),
                        informer: None,
                    })
                    .pods
                    .insert(pod.clone());
            }
            for name in before.difference(now) {
                let key = (namespace.to_string(), name.clone());
                let Some(w) = state.get_mut(&key) else {
                    continue;
                };
                w.pods.remove(pod);
                if w.pods.is_empty() {
                    if let Some(i) = state.remove(&key).and_then(|w| w.informer) {
                        stopped.push(i);
                    }
                }
            }
        }
        for informer in stopped {
            tracing::debug!(
                resource = self.resource,
                "no pod names the object: its watch stops"
            );
            informer.stop();
        }
    }

    fn running(&self) -> usize {
        self.state
            .lock()
            .values()
            .filter(|w| w.informer.is_some())
            .count()
    }

    fn stop_all(&self) {
        for w in self.state.lock().values_mut() {
            if let Some(i) = w.informer.take() {
                i.stop();
            }
        }
    }

    /// The object's watch, started now if a tracked pod names it and it has none yet;
    /// `None` when no tracked pod names it.
    fn watch(&self, namespace: &str, name: &str) -> Option<Informer<K>> {
        let key = (namespace.to_string(), name.to_string());
        let mut state = self.state.lock();
        let watched = state.get_mut(&key)?;
        if let Some(i) = &watched.informer {
            return Some(i.clone());
        }
        let options = InformerOptions {
            field_selector: Some(format!("metadata.name={name}")),
            ..InformerOptions::lean()
        };
        let informer = Informer::new(Api::namespaced(self.client.clone(), namespace), options);
        let (state_ref, resync) = (Arc::downgrade(&self.state), self.resync.clone());
        let handler_key = key.clone();
        informer.subscribe(Arc::new(move |event: &Event<K>| {
            if event.is_resync() {
                return;
            }
            let Some(state) = state_ref.upgrade() else {
                return;
            };
            let pods: Vec<ObjectKey> = state
                .lock()
                .get(&handler_key)
                .map(|w| w.pods.iter().cloned().collect())
                .unwrap_or_default();
            if let Some(resync) = resync.get() {
                for pod in pods {
                    resync(pod);
                }
            }
        }));
        informer.start();
        tracing::debug!(
            resource = self.resource,
            namespace,
            name,
            "watching one object for the node's pods"
        );
        watched.informer = Some(informer.clone());
        Some(informer)
    }

    /// The object, from its watch when a tracked pod names it, else by a GET.
    fn read(&self, namespace: &str, name: &str) -> SourceFuture<Option<K>> {
        let resource = self.resource;
        let Some(informer) = self.watch(namespace, name) else {
            let api: Api<K> = Api::namespaced(self.client.clone(), namespace);
            let name = name.to_string();
            return Box::pin(async move { found(api.get(&name).await) });
        };
        let key = ObjectKey::new(Some(namespace), name);
        Box::pin(async move {
            if tokio::time::timeout(SYNC_WAIT, informer.wait_synced())
                .await
                .map_or(true, |r| r.is_err())
            {
                return Err(format!(
                    "failed to sync {resource} cache: timed out waiting for the condition"
                ));
            }
            Ok(informer.store().get(&key).map(|o| (*o).clone()))
        })
    }
}

impl ObjectSource for ApiSources {
    fn secret(&self, namespace: &str, name: &str) -> SourceFuture<Option<Secret>> {
        self.activate();
        self.secrets.read(namespace, name)
    }

    fn config_map(&self, namespace: &str, name: &str) -> SourceFuture<Option<ConfigMap>> {
        self.activate();
        self.config_maps.read(namespace, name)
    }

    fn claim(&self, namespace: &str, name: &str) -> SourceFuture<Option<PersistentVolumeClaim>> {
        self.get(Some(namespace), name)
    }

    fn volume(&self, name: &str) -> SourceFuture<Option<PersistentVolume>> {
        self.get(None, name)
    }

    fn services(&self, namespace: &str) -> SourceFuture<Vec<Service>> {
        let informer = self.services_informer();
        let namespace = namespace.to_string();
        Box::pin(async move {
            if tokio::time::timeout(SERVICES_WAIT, informer.wait_synced())
                .await
                .map_or(true, |r| r.is_err())
            {
                return Err(
                    "services have not yet been read at least once, cannot construct envvars"
                        .to_string(),
                );
            }
            Ok(informer
                .store()
                .by_namespace(&namespace)
                .into_iter()
                .map(|s| (*s).clone())
                .collect())
        })
    }

    fn token(&self, request: &TokenRequestFor) -> SourceFuture<IssuedToken> {
        if let Some(t) = self.tokens.lock().get(request) {
            if !token_needs_refresh(crate::status::now(), t.expires, request.expiration_seconds) {
                let t = t.clone();
                return Box::pin(async move { Ok(t) });
            }
        }
        let issue = request_token(&self.client, request);
        let request = request.clone();
        let (tokens, pods) = (self.tokens.clone(), self.pods.clone());
        Box::pin(async move {
            let token = issue.await?;
            // Kept only for a pod still tracked, so a deleted pod's token is not kept again.
            if pods.lock().contains_key(&request.pod_uid) {
                tokens.lock().insert(request, token.clone());
            }
            Ok(token)
        })
    }

    fn api_server(&self) -> Option<ApiServerAddress> {
        self.api_server.clone()
    }
}

/// Asks the API for a token (`serviceaccounts/<name>/token`, bound to the pod).
fn request_token(client: &Client, request: &TokenRequestFor) -> SourceFuture<IssuedToken> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &request.namespace);
    let mut spec = serde_json::json!({
        "expirationSeconds": request.expiration_seconds,
        "boundObjectRef": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": request.pod_name,
            "uid": request.pod_uid,
        },
    });
    if !request.audience.is_empty() {
        spec["audiences"] = serde_json::json!([request.audience]);
    }
    let body = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": spec,
    });
    let account = request.service_account.clone();
    Box::pin(async move {
        let answer = api
            .create_subresource(&account, "token", &body)
            .await
            .map_err(|e| e.to_string())?;
        let token = answer["status"]["token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or("the TokenRequest answer has no token")?
            .to_string();
        let expires = answer["status"]["expirationTimestamp"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .ok_or("the TokenRequest answer has no expirationTimestamp")?;
        Ok(IssuedToken { token, expires })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapVolumeSource, Container, LocalObjectReference, PodSpec, ProjectedVolumeSource,
        SecretProjection, SecretVolumeSource, Volume, VolumeProjection,
    };

    #[test]
    fn the_api_servers_address_comes_from_its_url() {
        let a = |url: &str| api_server_address(url).map(|a| (a.host, a.port));
        assert_eq!(
            a("https://127.0.0.1:6443"),
            Some(("127.0.0.1".into(), 6443))
        );
        assert_eq!(a("https://10.0.0.5:6443/"), Some(("10.0.0.5".into(), 6443)));
        assert_eq!(a("https://[::1]:6443"), Some(("::1".into(), 6443)));
        assert_eq!(
            a("https://api.example.com"),
            Some(("api.example.com".into(), 443))
        );
        assert_eq!(a("http://localhost"), Some(("localhost".into(), 80)));
        assert_eq!(a(""), None);
        assert_eq!(a("https://:6443"), None);
        assert_eq!(a("https://h:port"), None);
    }

    #[test]
    fn tokens_are_asked_again_at_80_percent_or_after_a_day() {
        let expires: Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        let at = |s: &str| -> Timestamp { s.parse().unwrap() };
        // One hour: refreshed after 48 minutes.
        assert!(!token_needs_refresh(
            at("2026-01-01T00:00:00Z"),
            expires,
            3600
        ));
        assert!(!token_needs_refresh(
            at("2026-01-01T00:47:59Z"),
            expires,
            3600
        ));
        assert!(token_needs_refresh(
            at("2026-01-01T00:48:01Z"),
            expires,
            3600
        ));
        // A year-long token: refreshed after a day, long before 80 %.
        let year = 365 * 24 * 3600;
        let long: Timestamp = "2027-01-01T00:00:00Z".parse().unwrap();
        assert!(!token_needs_refresh(at("2026-01-01T23:59:00Z"), long, year));
        assert!(token_needs_refresh(at("2026-01-02T00:00:01Z"), long, year));
    }

    #[test]
    fn a_pod_names_its_environment_volume_and_pull_objects() {
        let pod = Pod {
            spec: Some(PodSpec {
                image_pull_secrets: Some(vec![LocalObjectReference {
                    name: "pull".into(),
                }]),
                containers: vec![Container {
                    name: "c".into(),
                    ..Default::default()
                }],
                volumes: Some(vec![
                    Volume {
                        name: "a".into(),
                        config_map: Some(ConfigMapVolumeSource {
                            name: "files".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    Volume {
                        name: "b".into(),
                        secret: Some(SecretVolumeSource {
                            secret_name: Some("certs".into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    Volume {
                        name: "c".into(),
                        projected: Some(ProjectedVolumeSource {
                            sources: Some(vec![VolumeProjection {
                                secret: Some(SecretProjection {
                                    name: "proj".into(),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }]),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (cms, secrets) = pod_references(&pod);
        assert_eq!(cms.into_iter().collect::<Vec<_>>(), ["files"]);
        assert_eq!(
            secrets.into_iter().collect::<Vec<_>>(),
            ["certs", "proj", "pull"]
        );
    }
}
