//! [`CriRuntime`]: a [`PodRuntime`] that runs pods through a CRI runtime (containerd), as
//! the kubelet does.
//!
//! - One sandbox per pod ([`super::sandbox`]); a sandbox that stopped is replaced by a new
//!   attempt, whose containers all start again (init containers first). The pod's address
//!   is the sandbox's (CNI).
//! - Init containers run one after the other, each to success (restarted on failure
//!   unless the pod's policy is `Never`); sidecars (`restartPolicy: Always`) only need to
//!   be running. Then the app containers start.
//! - Images are pulled per `imagePullPolicy` ([`super::images`]), with the kubelet's
//!   back-off after a failed pull, with the credentials of the pod's `imagePullSecrets`
//!   that match the image's registry ([`super::auth`], read through
//!   [`NodeContext::sources`]).
//! - Exited containers restart per `restartPolicy` with CrashLoopBackOff
//!   ([`crate::process::backoff`]); the restart count is the CRI attempt number.
//! - Nothing is kept on the agent's side that CRI does not hold: sandboxes and containers
//!   carry the pod's uid, name and namespace and the container's name as labels, so a new
//!   runtime over the same containerd finds the running pods and starts nothing twice. Only
//!   the back-off timers live in memory (after a restart of the agent, the next restart of
//!   a crashed container is immediate).
//! - A monitor task polls CRI's container and sandbox states and announces the pods whose
//!   state changed or whose back-off expired.
//!
//! - Probes are the process runtime's ([`crate::process::probe`]), with exec probes run
//!   through CRI `ExecSync` and a liveness failure stopping the container through CRI.
//! - Lifecycle hooks ([`super::hooks`]): postStart right after a container started (a
//!   failure kills the run, which waits with `PostStartHookError` and restarts per policy),
//!   preStop before every stop the agent makes; failures are reported as Events through
//!   [`PodRuntime::events`].
//!
//! - Volumes are set up on every sync by a [`VolumeManager`] under the data directory
//!   (`<data_dir>/pods/<uid>/volumes`), so ConfigMap, Secret, downwardAPI and projected
//!   files follow their objects at each sync; a volume that fails is a `FailedMount` Event
//!   and keeps the containers that mount it in `ContainerCreating` until it is set up; an
//!   emptyDir over its
//!   `sizeLimit` evicts the pod. They are removed with the pod.
//!
//! Not done yet: compressing rotated logs.
//!
//! Unused images are garbage-collected as the kubelet's image manager does ([`super::gc`]):
//! over `image_gc_high_threshold` percent of the image filesystem, least recently used
//! first, down to `image_gc_low_threshold`; never an image a container uses or the
//! sandbox image. Exited containers beyond the two latest runs of each container are
//! collected too.
//!
//! Logs of running containers are rotated past a size, keeping a number of files, as the
//! kubelet's `containerLogMaxSize` and `containerLogMaxFiles` do; `kubectl logs` reads the
//! live file.
//!
//! A container whose `image` was changed in the pod (the one mutable field of a container)
//! is stopped and started again with the new image, as its next attempt.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::api as cri;
use super::client::{CriClient, CriError};
use super::images::{self, ImageAction, PullBackoff};
use super::sandbox::{
    self, CONTAINER_NAME_LABEL, POD_NAMESPACE_LABEL, POD_NAME_LABEL, POD_UID_LABEL,
};
use super::state::{self, Latest, Plan};
use super::{auth, containers, gc, hooks, logs, resources};
use crate::process::backoff::BackoffPolicy;
use crate::process::expand::FieldContext;
use crate::process::probe::{ProbeActions, ProbeSet, ProbeStatus, ProbeTarget};
use crate::runtime::{
    LogOptions, LogStream, NodeContext, PodRuntime, RuntimeError, RuntimeEvent, RuntimePod,
    RuntimeStatus, Sources,
};
use crate::status::{is_sidecar, restart_policy, Disposition};
use crate::volumes::{emptydir::EVICTED_REASON, VolumeManager};

/// Tunables of a [`CriRuntime`].
#[derive(Clone, Debug)]
pub struct CriRuntimeOptions {
    /// Where pods' log directories go (`<data_dir>/pods/<namespace>_<name>_<uid>`).
    pub data_dir: PathBuf,
    /// Restart delays (default: Kubernetes' 10 s doubling to 5 min, reset after 10 min).
    pub backoff: BackoffPolicy,
    /// How often the monitor looks at CRI's containers (default 1 s).
    pub poll_interval: Duration,
    /// The DNS configuration pods get, in `resolv.conf` syntax (default: the node's
    /// `/etc/resolv.conf`).
    pub resolv_conf: Option<String>,
    /// The node's cluster DNS (the kubelet's `--cluster-dns` and `--cluster-domain`), which
    /// pods of `dnsPolicy: ClusterFirst` resolve through; none: they fall back to `Default`.
    pub cluster_dns: setpoint_network::dns::ClusterDns,
    /// A running container's log is rotated once it passes this size (the kubelet's
    /// `containerLogMaxSize`, 10 MiB).
    pub log_max_bytes: u64,
    /// How many log files a container keeps, the live one included (the kubelet's
    /// `containerLogMaxFiles`, 5).
    pub log_max_files: usize,
    /// How often log sizes are looked at (default 10 s).
    pub log_check_interval: Duration,
    /// Image garbage collection starts when the image filesystem is this full, in percent
    /// (the kubelet's `--image-gc-high-threshold`, 85).
    pub image_gc_high_threshold: u8,
    /// ... and removes unused images until it is this full (`--image-gc-low-threshold`, 80).
    pub image_gc_low_threshold: u8,
    /// An image first seen less than this ago is never collected
    /// (`--minimum-image-ttl-duration`, 2 min).
    pub image_minimum_age: Duration,
    /// How often images are looked at for collection (the kubelet's 5 min).
    pub image_gc_interval: Duration,
    /// How often exited containers are collected (the kubelet's 1 min).
    pub container_gc_interval: Duration,
}

impl CriRuntimeOptions {
    /// Defaults, with logs under `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            backoff: BackoffPolicy::default(),
            poll_interval: Duration::from_secs(1),
            resolv_conf: None,
            cluster_dns: setpoint_network::dns::ClusterDns {
                servers: Vec::new(),
                domain: setpoint_network::dns::DEFAULT_CLUSTER_DOMAIN.to_string(),
            },
            log_max_bytes: 10 * 1024 * 1024,
            log_max_files: 5,
            log_check_interval: Duration::from_secs(10),
            image_gc_high_threshold: gc::DEFAULT_HIGH_THRESHOLD,
            image_gc_low_threshold: gc::DEFAULT_LOW_THRESHOLD,
            image_minimum_age: gc::DEFAULT_MINIMUM_AGE,
            image_gc_interval: Duration::from_secs(300),
            container_gc_interval: Duration::from_secs(60),
        }
    }
}

type Subscribers = Arc<Mutex<Vec<mpsc::UnboundedSender<String>>>>;

/// The restart decided for the exited run of one container.
#[derive(Clone, Debug)]
struct Restart {
    /// The exited container it is about.
    container_id: String,
    /// When the restart may happen (ns since the epoch).
    at_ns: i64,
    /// The wait it was given, for the CrashLoopBackOff message.
    wait: Duration,
    /// The delay to remember for the next exit.
    next: Option<Duration>,
}

struct Inner {
    client: CriClient,
    /// The runtime's name (`containerd`), the scheme of container ids.
    runtime_name: String,
    options: CriRuntimeOptions,
    resolv_conf: String,
    node_memory: i64,
    /// One sync, kill or log read per pod at a time.
    pod_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per (pod uid, container name).
    restarts: Mutex<HashMap<(String, String), Restart>>,
    pulls: Mutex<PullBackoff>,
    subscribers: Subscribers,
    /// The probe tasks and verdicts per running container id.
    probes: Mutex<HashMap<String, ProbeRun>>,
    /// Where Events go once the agent asked for them ([`PodRuntime::events`]).
    events: Mutex<Option<mpsc::UnboundedSender<RuntimeEvent>>>,
    /// The pods' volumes, under the data directory.
    volumes: VolumeManager,
}

/// The probes of one running container.
struct ProbeRun {
    uid: String,
    status: Arc<ProbeStatus>,
    task: AbortHandle,
}

/// Exec probes through CRI `ExecSync`; a liveness failure stops the container through CRI,
/// with its preStop hook.
struct CriProbeActions {
    client: CriClient,
    id: String,
    inner: std::sync::Weak<Inner>,
}

impl ProbeActions for CriProbeActions {
    fn exec(
        &self,
        argv: Vec<String>,
        timeout: Duration,
    ) -> futures::future::BoxFuture<'static, Result<(), String>> {
        let (client, id) = (self.client.clone(), self.id.clone());
        Box::pin(async move {
            match client.exec_sync(&id, argv, Some(timeout)).await {
                Ok(out) if out.exit_code == 0 => Ok(()),
                Ok(out) => Err(format!("command exited with {}", out.exit_code)),
                Err(e) => Err(e.message()),
            }
        })
    }

    fn stop(&self, grace: Duration) -> futures::future::BoxFuture<'static, ()> {
        let (inner, id) = (self.inner.clone(), self.id.clone());
        Box::pin(async move {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            if let Err(e) = inner.stop_container(&id, grace).await {
                tracing::warn!(id, error = %e, "stopping a container after a probe failure");
            }
        })
    }
}

/// Runs pods through CRI. See the [module docs](self).
pub struct CriRuntime {
    inner: Arc<Inner>,
    monitor: AbortHandle,
    rotation: AbortHandle,
    image_gc: AbortHandle,
    container_gc: AbortHandle,
}

impl Drop for CriRuntime {
    /// Stops the monitor, never the pods: they outlive the agent and the next runtime over
    /// the same containerd adopts them.
    fn drop(&mut self) {
        self.monitor.abort();
        self.rotation.abort();
        self.image_gc.abort();
        self.container_gc.abort();
        for (_, p) in lock(&self.inner.probes).drain() {
            p.task.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn internal(context: &str) -> impl FnOnce(CriError) -> RuntimeError + '_ {
    move |e| RuntimeError::Internal(format!("{context}: {e}"))
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// A container's place in its pod, as an Event's `fieldPath` names it.
fn field_path(pod: &Pod, name: &str) -> String {
    let init = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == name));
    if init {
        format!("spec.initContainers{{{name}}}")
    } else {
        format!("spec.containers{{{name}}}")
    }
}

fn label<'a>(labels: &'a HashMap<String, String>, key: &str) -> &'a str {
    labels.get(key).map(String::as_str).unwrap_or_default()
}

fn attempt_of(c: &cri::Container) -> u32 {
    c.metadata.as_ref().map_or(0, |m| m.attempt)
}

/// Everything one sync knows about the pod.
struct PodView<'a> {
    pod: &'a Pod,
    uid: String,
    name: String,
    namespace: String,
    sandbox_id: String,
    sandbox_config: cri::PodSandboxConfig,
    ctx: FieldContext,
    /// The pod's CRI containers, newest attempt first per name.
    containers: Vec<cri::Container>,
    /// How the node reads the pod's image pull secrets.
    secrets: Option<Sources>,
}

impl PodView<'_> {
    fn runs(&self, name: &str) -> Vec<&cri::Container> {
        let mut runs: Vec<&cri::Container> = self
            .containers
            .iter()
            .filter(|c| label(&c.labels, CONTAINER_NAME_LABEL) == name)
            .collect();
        runs.sort_by_key(|c| std::cmp::Reverse((attempt_of(c), c.created_at)));
        runs
    }
}

impl CriRuntime {
    /// A runtime over `client`; adopts whatever pods the CRI runtime holds. Must be called
    /// inside a Tokio runtime (it starts the monitor task).
    pub async fn new(client: CriClient, options: CriRuntimeOptions) -> Result<Self, RuntimeError> {
        let version = client
            .version()
            .await
            .map_err(internal("asking the CRI runtime its version"))?;
        let resolv_conf = match &options.resolv_conf {
            Some(r) => r.clone(),
            None => std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
        };
        let volumes = VolumeManager::new(&options.data_dir);
        let inner = Arc::new(Inner {
            client,
            runtime_name: version.runtime_name,
            resolv_conf,
            node_memory: resources::node_memory(),
            options,
            pod_locks: Mutex::new(HashMap::new()),
            restarts: Mutex::new(HashMap::new()),
            pulls: Mutex::new(PullBackoff::default()),
            subscribers: Arc::new(Mutex::new(Vec::new())),
            probes: Mutex::new(HashMap::new()),
            events: Mutex::new(None),
            volumes,
        });
        inner.remove_orphaned_volumes().await;
        let monitor = tokio::spawn(Arc::clone(&inner).monitor()).abort_handle();
        let rotation = tokio::spawn(Arc::clone(&inner).rotate_logs()).abort_handle();
        let image_gc = tokio::spawn(Arc::clone(&inner).collect_images()).abort_handle();
        let container_gc = tokio::spawn(Arc::clone(&inner).collect_containers()).abort_handle();
        Ok(Self {
            inner,
            monitor,
            rotation,
            image_gc,
            container_gc,
        })
    }

    /// The CRI runtime's name (`containerd`), which prefixes container ids.
    pub fn runtime_name(&self) -> &str {
        &self.inner.runtime_name
    }
}

fn uid_filter(uid: &str) -> HashMap<String, String> {
    HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())])
}

impl Inner {
    fn pod_lock(&self, uid: &str) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(lock(&self.pod_locks).entry(uid.to_string()).or_default())
    }

    fn notify(&self, uid: &str) {
        lock(&self.subscribers).retain(|tx| tx.send(uid.to_string()).is_ok());
    }

    fn container_id(&self, id: &str) -> String {
        format!("{}://{id}", self.runtime_name)
    }

    /// Hands an Event to the agent, if it asked for them.
    fn emit(&self, event: RuntimeEvent) {
        if let Some(tx) = lock(&self.events).as_ref() {
            let _ = tx.send(event);
        }
    }

    /// Removes the volumes of pods that have no sandbox any more (killed while the agent
    /// was down), as the kubelet cleans up orphaned pod directories. Called before any
    /// sync, so no pod is setting its volumes up meanwhile; a pod whose volumes go here
    /// only because its sandbox was not made yet gets them again at its next sync.
    async fn remove_orphaned_volumes(&self) {
        let sandboxes = match self.client.list_pod_sandbox(&HashMap::new()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "listing sandboxes for orphaned volumes");
                return;
            }
        };
        let held: HashSet<&str> = sandboxes
            .iter()
            .filter_map(|s| s.labels.get(POD_UID_LABEL).map(String::as_str))
            .collect();
        for uid in self.volumes.pods_with_volumes() {
            if held.contains(uid.as_str()) {
                continue;
            }
            match self.volumes.cleanup(&uid) {
                Ok(()) => tracing::info!(%uid, "removed the volumes of a pod that is gone"),
                Err(e) => tracing::warn!(%uid, error = %e, "removing an orphaned pod's volumes"),
            }
        }
    }

    /// Kills the pod's running containers at once (no grace, as the kubelet's eviction of a
    /// pod over its local storage limit) and reports the eviction as the kubelet's
    /// `Evicted` Event.
    async fn evict(
        &self,
        view: &PodView<'_>,
        pod: &RuntimePod,
        message: &str,
    ) -> Result<(), RuntimeError> {
        let running: Vec<&cri::Container> = view
            .containers
            .iter()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
            .collect();
        if running.is_empty() {
            return Ok(());
        }
        tracing::warn!(pod = %pod.name, %message, "evicting the pod");
        for c in running {
            if let Err(e) = self.client.stop_container(&c.id, Duration::ZERO).await {
                if !e.is_not_found() {
                    return Err(internal("stopping an evicted pod's container")(e));
                }
            }
        }
        self.emit(RuntimeEvent {
            pod: pod.clone(),
            field_path: None,
            warning: true,
            reason: EVICTED_REASON.to_string(),
            message: message.to_string(),
        });
        Ok(())
    }

    /// The address of the pod `uid`'s ready sandbox, if it has one.
    async fn pod_ip_of(&self, uid: &str) -> Option<String> {
        let sandboxes = self.client.list_pod_sandbox(&uid_filter(uid)).await.ok()?;
        let ready = sandboxes
            .iter()
            .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
            .max_by_key(|s| s.created_at)?;
        let status = self
            .client
            .pod_sandbox_status(&ready.id, false)
            .await
            .ok()?
            .status?;
        status.network.map(|n| n.ip).filter(|ip| !ip.is_empty())
    }

    /// Stops a container as the kubelet does: a running container's preStop hook first
    /// (from its annotations, bounded by `grace`; a failure is a `FailedPreStopHook` Event),
    /// then the stop signal with what is left of `grace` (at least 2 s after a hook).
    async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), CriError> {
        let began = Instant::now();
        let mut grace = grace;
        let status = match self.inner_status(id).await {
            Ok(s) => s,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        let running = status
            .as_ref()
            .is_some_and(|s| s.state == cri::ContainerState::ContainerRunning as i32);
        let hook = status
            .as_ref()
            .filter(|_| running && !grace.is_zero())
            .and_then(|s| hooks::pre_stop_of(&s.annotations).map(|h| (s, h)));
        if let Some((status, (handler, ports))) = hook {
            let pod = RuntimePod {
                uid: label(&status.labels, POD_UID_LABEL).to_string(),
                namespace: label(&status.labels, POD_NAMESPACE_LABEL).to_string(),
                name: label(&status.labels, POD_NAME_LABEL).to_string(),
            };
            let container = label(&status.labels, CONTAINER_NAME_LABEL).to_string();
            let needs_ip = handler
                .http_get
                .as_ref()
                .is_some_and(|h| h.host.as_deref().unwrap_or_default().is_empty());
            let pod_ip = match needs_ip {
                true => self.pod_ip_of(&pod.uid).await.unwrap_or_default(),
                false => String::new(),
            };
            let who = hooks::pod_display(&pod.name, &pod.namespace, &pod.uid);
            let target = hooks::HookTarget {
                client: Some(&self.client),
                container_id: id,
                container_name: &container,
                pod: &who,
                pod_ip: &pod_ip,
                ports: &ports,
            };
            let outcome = match tokio::time::timeout(grace, hooks::run(&handler, &target)).await {
                Ok(outcome) => outcome,
                Err(_) => Err(format!(
                    "PreStop hook for Container {container:?} in Pod {who:?} did not complete within {}s",
                    grace.as_secs()
                )),
            };
            if let Err(message) = outcome {
                tracing::warn!(pod = %who, container, message, "PreStop hook failed");
                // The hook's output may hold secrets: the Event says only that it failed.
                self.emit(RuntimeEvent {
                    pod,
                    field_path: Some(format!("spec.containers{{{container}}}")),
                    warning: true,
                    reason: "FailedPreStopHook".to_string(),
                    message: "PreStopHook failed".to_string(),
                });
            }
            grace = hooks::grace_after_hook(grace, began.elapsed());
        }
        match self.client.stop_container(id, grace).await {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        }
    }

    /// Runs the container's postStart hook, if it has one; a failure kills the run (with
    /// its preStop hook, as the kubelet's kill does) and is returned as the kubelet's
    /// message, for the container's waiting state.
    async fn post_start(
        &self,
        view: &PodView<'_>,
        container: &Container,
        id: &str,
    ) -> Option<String> {
        let handler = container.lifecycle.as_ref()?.post_start.as_ref()?;
        let who = hooks::pod_display(&view.name, &view.namespace, &view.uid);
        let ports = container.ports.clone().unwrap_or_default();
        let target = hooks::HookTarget {
            client: Some(&self.client),
            container_id: id,
            container_name: &container.name,
            pod: &who,
            pod_ip: &view.ctx.pod_ip,
            ports: &ports,
        };
        let message = hooks::run(handler, &target).await.err()?;
        tracing::warn!(pod = %who, container = %container.name, message, "Failed to execute PostStartHook");
        let field_path = Some(field_path(view.pod, &container.name));
        let pod = RuntimePod {
            uid: view.uid.clone(),
            namespace: view.namespace.clone(),
            name: view.name.clone(),
        };
        // The hook's output may hold secrets: the Event says only that it failed.
        self.emit(RuntimeEvent {
            pod: pod.clone(),
            field_path: field_path.clone(),
            warning: true,
            reason: "FailedPostStartHook".to_string(),
            message: "PostStartHook failed".to_string(),
        });
        self.emit(RuntimeEvent {
            pod,
            field_path,
            warning: false,
            reason: "Killing".to_string(),
            message: "FailedPostStartHook".to_string(),
        });
        if let Err(e) = self
            .stop_container(id, crate::status::grace_period(view.pod))
            .await
        {
            tracing::warn!(pod = %who, container = %container.name, error = %e, "Failed to kill container");
        }
        Some(message)
    }

    /// Polls CRI; announces pods whose containers or sandboxes changed state and pods
    /// whose back-off expired.
    async fn monitor(self: Arc<Self>) {
        let mut seen: HashMap<String, (String, i32)> = HashMap::new();
        let mut announced: HashSet<(String, String, i64)> = HashSet::new();
        loop {
            tokio::time::sleep(self.options.poll_interval).await;
            let mut now_seen = HashMap::new();
            match self.client.list_containers("", &HashMap::new()).await {
                Ok(list) => {
                    for c in list {
                        let uid = label(&c.labels, POD_UID_LABEL).to_string();
                        if !uid.is_empty() {
                            now_seen.insert(c.id.clone(), (uid, c.state));
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "listing CRI containers");
                    continue;
                }
            }
            match self.client.list_pod_sandbox(&HashMap::new()).await {
                Ok(list) => {
                    for s in list {
                        let uid = label(&s.labels, POD_UID_LABEL).to_string();
                        if !uid.is_empty() {
                            now_seen.insert(format!("sandbox:{}", s.id), (uid, s.state));
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "listing CRI sandboxes");
                    continue;
                }
            }
            let mut changed: HashSet<String> = HashSet::new();
            for (id, (uid, st)) in &now_seen {
                if seen.get(id).map(|s| s.1) != Some(*st) {
                    changed.insert(uid.clone());
                }
            }
            for (id, (uid, _)) in &seen {
                if !now_seen.contains_key(id) {
                    changed.insert(uid.clone());
                }
            }
            seen = now_seen;
            let now = now_ns();
            for ((uid, name), r) in lock(&self.restarts).iter() {
                if r.at_ns <= now && announced.insert((uid.clone(), name.clone(), r.at_ns)) {
                    changed.insert(uid.clone());
                }
            }
            let instant = Instant::now();
            let pod_uids: Vec<String> = lock(&self.pod_locks).keys().cloned().collect();
            {
                let pulls = lock(&self.pulls);
                for uid in pod_uids {
                    if pulls.expired_since(&uid, instant, self.options.poll_interval) {
                        changed.insert(uid);
                    }
                }
            }
            announced.retain(|(_, _, at)| now - *at < 3_600_000_000_000);
            for uid in changed {
                self.notify(&uid);
            }
        }
    }

    /// Removes exited containers beyond what the kubelet keeps ([`gc`]), every
    /// `container_gc_interval`. Only pods this runtime syncs are touched, each under its
    /// pod's lock so that no sync is reading the runs it removes; what is left of a pod
    /// that is gone goes when the agent kills it.
    async fn collect_containers(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.options.container_gc_interval).await;
            let all = match self.client.list_containers("", &HashMap::new()).await {
                Ok(all) => all,
                Err(e) => {
                    tracing::warn!(error = %e, "Container garbage collection failed");
                    continue;
                }
            };
            let doomed: HashSet<String> = gc::dead_containers_to_remove(&all).into_iter().collect();
            for c in all.iter().filter(|c| doomed.contains(&c.id)) {
                let uid = label(&c.labels, POD_UID_LABEL);
                let Some(pod_lock) = lock(&self.pod_locks).get(uid).cloned() else {
                    continue;
                };
                let _guard = pod_lock.lock().await;
                match self.client.remove_container(&c.id).await {
                    Ok(()) => tracing::debug!(id = %c.id, uid, "exited container collected"),
                    Err(e) if e.is_not_found() => {}
                    Err(e) => {
                        tracing::warn!(id = %c.id, error = %e, "removing an exited container")
                    }
                }
            }
        }
    }

    /// Removes unused images when the image filesystem is too full ([`gc`]), every
    /// `image_gc_interval`.
    async fn collect_images(self: Arc<Self>) {
        let began = Instant::now();
        let mut memory = gc::ImageUse::default();
        loop {
            tokio::time::sleep(self.options.image_gc_interval).await;
            if let Err(e) = self.collect_images_once(&mut memory, began).await {
                tracing::warn!(error = %e, "Image garbage collection failed");
            }
        }
    }

    async fn collect_images_once(
        &self,
        memory: &mut gc::ImageUse,
        began: Instant,
    ) -> Result<(), String> {
        let images = self
            .client
            .list_images(None)
            .await
            .map_err(|e| e.to_string())?;
        // Every container, exited ones too, keeps its image.
        let containers = self
            .client
            .list_containers("", &HashMap::new())
            .await
            .map_err(|e| e.to_string())?;
        let mut in_use: HashSet<String> = HashSet::new();
        for c in &containers {
            in_use.insert(c.image_ref.clone());
            in_use.insert(c.image_id.clone());
            if let Some(spec) = &c.image {
                in_use.insert(spec.image.clone());
            }
        }
        // An image in use by its name counts by its id; the local sandbox image is kept
        // even where the runtime does not pin it.
        for image in &images {
            let named = image.repo_tags.iter().chain(&image.repo_digests);
            if named
                .clone()
                .any(|n| in_use.contains(n) || n == crate::containerd::PAUSE_IMAGE)
            {
                in_use.insert(image.id.clone());
            }
        }
        let info = self
            .client
            .image_fs_info()
            .await
            .map_err(|e| e.to_string())?;
        let Some(mountpoint) = info
            .image_filesystems
            .first()
            .and_then(|f| f.fs_id.as_ref())
            .map(|id| id.mountpoint.clone())
            .filter(|m| !m.is_empty())
        else {
            return Err("the runtime names no image filesystem".to_string());
        };
        let usage = gc::fs_usage(std::path::Path::new(&mountpoint))
            .map_err(|e| format!("statvfs {mountpoint}: {e}"))?;
        let records = memory.observe(&images, &in_use, began.elapsed().as_secs());
        let doomed = gc::images_to_free(
            &records,
            usage,
            self.options.image_gc_high_threshold,
            self.options.image_gc_low_threshold,
            began.elapsed().as_secs(),
            self.options.image_minimum_age.as_secs(),
        );
        if doomed.is_empty() {
            return Ok(());
        }
        tracing::info!(
            usage = usage.percent_used(),
            high = self.options.image_gc_high_threshold,
            images = doomed.len(),
            "Disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
        );
        for id in doomed {
            let spec = cri::ImageSpec {
                image: id.clone(),
                ..Default::default()
            };
            match self.client.remove_image(spec).await {
                Ok(()) => tracing::info!(image = %id, "Removing image to free bytes"),
                Err(e) if e.is_not_found() => {}
                Err(e) => tracing::warn!(image = %id, error = %e, "removing an unused image"),
            }
        }
        Ok(())
    }

    /// Rotates the logs of running containers that grew past the size limit: the file is
    /// renamed, the runtime told to reopen it, and rotated files beyond the count removed.
    async fn rotate_logs(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.options.log_check_interval).await;
            let running = cri::ContainerFilter {
                state: Some(cri::ContainerStateValue {
                    state: cri::ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            };
            let Ok(list) = self.client.list_containers_filtered(running).await else {
                continue;
            };
            for c in list.iter().filter(|c| c.labels.contains_key(POD_UID_LABEL)) {
                if let Err(e) = self.rotate_one(&c.id).await {
                    tracing::warn!(id = %c.id, error = %e, "rotating a container log");
                }
            }
        }
    }

    async fn rotate_one(&self, id: &str) -> Result<(), String> {
        let Some(status) = self.inner_status(id).await.map_err(|e| e.to_string())? else {
            return Ok(());
        };
        let log = PathBuf::from(&status.log_path);
        let size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        if status.log_path.is_empty() || size <= self.options.log_max_bytes {
            return Ok(());
        }
        let rotated = logs::rotated_name(&log, crate::status::wall_now());
        std::fs::rename(&log, &rotated).map_err(|e| format!("renaming {}: {e}", log.display()))?;
        if let Err(e) = self.client.reopen_container_log(id).await {
            // The runtime keeps writing to the renamed file: take it back.
            let _ = std::fs::rename(&rotated, &log);
            return Err(e.to_string());
        }
        let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else {
            return Ok(());
        };
        let siblings: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| format!("reading {}: {e}", dir.display()))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let keep = self.options.log_max_files.saturating_sub(1);
        for old in logs::excess_rotated(&name.to_string_lossy(), &siblings, keep) {
            let _ = std::fs::remove_file(dir.join(old));
        }
        tracing::debug!(id, log = %log.display(), "container log rotated");
        Ok(())
    }

    /// The pod's ready sandbox, made if there is none (a stopped one is replaced by a new
    /// attempt). Returns its id and its config.
    async fn ensure_sandbox(
        &self,
        pod: &Pod,
        uid: &str,
    ) -> Result<(String, cri::PodSandboxConfig), RuntimeError> {
        let sandboxes = self
            .client
            .list_pod_sandbox(&uid_filter(uid))
            .await
            .map_err(internal("listing sandboxes"))?;
        let ready = sandboxes
            .iter()
            .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
            .max_by_key(|s| s.created_at);
        if let Some(s) = ready {
            let attempt = s.metadata.as_ref().map_or(0, |m| m.attempt);
            let config = sandbox::sandbox_config(
                pod,
                attempt,
                &self.options.data_dir,
                &self.resolv_conf,
                &self.options.cluster_dns,
            );
            return Ok((s.id.clone(), config));
        }
        let attempt = sandboxes
            .iter()
            .map(|s| s.metadata.as_ref().map_or(0, |m| m.attempt) + 1)
            .max()
            .unwrap_or(0);
        // A dead sandbox's network and processes go; its containers stay for their
        // statuses and logs until the pod is killed.
        for s in &sandboxes {
            if let Err(e) = self.client.stop_pod_sandbox(&s.id).await {
                if !e.is_not_found() {
                    tracing::warn!(uid, sandbox = %s.id, error = %e, "stopping a dead sandbox");
                }
            }
        }
        let config = sandbox::sandbox_config(
            pod,
            attempt,
            &self.options.data_dir,
            &self.resolv_conf,
            &self.options.cluster_dns,
        );
        std::fs::create_dir_all(&config.log_directory).map_err(|e| {
            RuntimeError::Internal(format!("creating {}: {e}", config.log_directory))
        })?;
        let id = self
            .client
            .run_pod_sandbox(config.clone(), "")
            .await
            .map_err(internal("running the pod sandbox"))?;
        tracing::info!(uid, sandbox = %id, attempt, "pod sandbox started");
        Ok((id, config))
    }

    /// Makes sure the image is there as the pull policy says. `Err` is the container's
    /// waiting reason and message.
    async fn ensure_image(
        &self,
        view: &PodView<'_>,
        container: &Container,
    ) -> Result<(), (String, String)> {
        self.pull_if_needed(view, container).await?;
        // runAsNonRoot is checked against the user the image runs as.
        let non_root = container
            .security_context
            .as_ref()
            .and_then(|s| s.run_as_non_root)
            .or_else(|| {
                view.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.security_context.as_ref())
                    .and_then(|s| s.run_as_non_root)
            });
        if non_root == Some(true) {
            let image = container.image.clone().unwrap_or_default();
            let status = self
                .client
                .image_status(cri::ImageSpec {
                    image: image.clone(),
                    ..Default::default()
                })
                .await
                .map_err(|e| {
                    (
                        "ErrImageInspect".to_string(),
                        format!("Failed to inspect image \"{image}\": {e}"),
                    )
                })?
                .unwrap_or_default();
            containers::verify_run_as_non_root(
                view.pod,
                container,
                status.uid.map(|u| u.value),
                &status.username,
            )
            .map_err(|e| ("CreateContainerConfigError".to_string(), e))?;
        }
        Ok(())
    }

    /// Pulls the image if the pull policy says so. `Err`: the waiting reason and message.
    async fn pull_if_needed(
        &self,
        view: &PodView<'_>,
        container: &Container,
    ) -> Result<(), (String, String)> {
        let image = container.image.clone().unwrap_or_default();
        let policy = images::pull_policy(container).map_err(|e| ("ErrImagePull".to_string(), e))?;
        let present = self
            .client
            .image_status(cri::ImageSpec {
                image: image.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| {
                (
                    "ErrImageInspect".to_string(),
                    format!("Failed to inspect image \"{image}\": {e}"),
                )
            })?
            .is_some();
        match images::decide(&image, policy, present) {
            ImageAction::Use => Ok(()),
            ImageAction::Wait { reason, message } => Err((reason.to_string(), message)),
            ImageAction::Pull => {
                if let Some((message, _)) =
                    lock(&self.pulls).check(&view.uid, &image, Instant::now())
                {
                    return Err(("ImagePullBackOff".to_string(), message));
                }
                match self.pull(view, &image).await {
                    Ok(()) => {
                        lock(&self.pulls).succeeded(&view.uid, &image);
                        Ok(())
                    }
                    Err(e) => {
                        let message = images::pull_error_message(&image, &e);
                        lock(&self.pulls).failed(
                            &view.uid,
                            &image,
                            message.clone(),
                            Instant::now(),
                        );
                        Err(("ErrImagePull".to_string(), message))
                    }
                }
            }
        }
    }

    /// The entries of the pod's `imagePullSecrets`, in order. A Secret that cannot be read
    /// or parsed is left out with a warning, as the kubelet goes on to pull without it.
    async fn pull_secrets(
        &self,
        view: &PodView<'_>,
    ) -> Vec<std::collections::BTreeMap<String, auth::DockerConfigEntry>> {
        let names: Vec<String> = view
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref())
            .into_iter()
            .flatten()
            .map(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return Vec::new();
        }
        let Some(reader) = &view.secrets else {
            tracing::warn!(pod = %view.name, "the pod names imagePullSecrets but this node reads no Secrets; pulling without them");
            return Vec::new();
        };
        let mut out = Vec::new();
        for name in names {
            let secret = match reader.0.secret(&view.namespace, &name).await {
                Ok(Some(secret)) => secret,
                Ok(None) => {
                    tracing::warn!(pod = %view.name, secret = %name, "Unable to retrieve some image pull secrets; attempting to pull the image may not succeed.");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(pod = %view.name, secret = %name, error = %e, "Unable to retrieve some image pull secrets; attempting to pull the image may not succeed.");
                    continue;
                }
            };
            let data: std::collections::BTreeMap<String, Vec<u8>> = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            match auth::parse_secret(secret.type_.as_deref().unwrap_or_default(), &data) {
                Ok(entries) => out.push(entries),
                Err(e) => {
                    tracing::warn!(pod = %view.name, secret = %name, error = %e, "an image pull secret is not a docker config");
                }
            }
        }
        out
    }

    /// Pulls `image` with each credential of the pod's pull secrets that matches it, in turn,
    /// until one works (anonymously when none matches). `Err`: the runtime's error, or each
    /// credential's error as `[e1, e2]` when there were several.
    async fn pull(&self, view: &PodView<'_>, image: &str) -> Result<(), String> {
        let credentials = auth::credentials_for(image, &self.pull_secrets(view).await);
        let attempts: Vec<Option<cri::AuthConfig>> = if credentials.is_empty() {
            vec![None]
        } else {
            credentials.into_iter().map(Some).collect()
        };
        let mut errors = Vec::new();
        for auth in attempts {
            let spec = cri::ImageSpec {
                image: image.to_string(),
                ..Default::default()
            };
            match self
                .client
                .pull_image(spec, auth, Some(view.sandbox_config.clone()))
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) => errors.push(e.message()),
            }
        }
        Err(if errors.len() == 1 {
            errors.remove(0)
        } else {
            format!("[{}]", errors.join(", "))
        })
    }

    /// Creates and starts the `attempt`-th run of `container` and runs its postStart hook.
    /// Returns the container's id and, when the hook failed (and the run was killed), the
    /// hook's message. `Err`: waiting reason and message.
    async fn start(
        &self,
        view: &PodView<'_>,
        container: &Container,
        attempt: u32,
    ) -> Result<(String, Option<String>), (String, String)> {
        // Nothing is pulled or created before the volumes it mounts are set up.
        if let Some(message) = view.ctx.volumes.waiting_for(container) {
            return Err(("ContainerCreating".to_string(), message.to_string()));
        }
        self.ensure_image(view, container).await?;
        let config =
            containers::container_config(view.pod, container, attempt, &view.ctx, self.node_memory)
                .map_err(|e| ("CreateContainerConfigError".to_string(), e))?;
        let dir = PathBuf::from(&view.sandbox_config.log_directory).join(&container.name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| ("CreateContainerError".to_string(), e.to_string()))?;
        let id = self
            .client
            .create_container(&view.sandbox_id, config, view.sandbox_config.clone())
            .await
            .map_err(|e| ("CreateContainerError".to_string(), e.to_string()))?;
        self.client
            .start_container(&id)
            .await
            .map_err(|e| ("RunContainerError".to_string(), e.to_string()))?;
        tracing::info!(pod = %view.name, container = %container.name, attempt, id, "container started");
        let hook_error = self.post_start(view, container, &id).await;
        Ok((id, hook_error))
    }

    /// The probe verdicts (started, ready) of a running container, its probes started if
    /// they do not run yet.
    fn probe_verdict(
        self: &Arc<Self>,
        view: &PodView<'_>,
        container: &Container,
        cur: &cri::ContainerStatus,
    ) -> (bool, bool) {
        let has_probes = container.startup_probe.is_some()
            || container.liveness_probe.is_some()
            || container.readiness_probe.is_some();
        if !has_probes {
            return (true, true);
        }
        let mut probes = lock(&self.probes);
        let run = probes.entry(cur.id.clone()).or_insert_with(|| {
            let status = Arc::new(ProbeStatus::default());
            status.started.store(
                container.startup_probe.is_none(),
                std::sync::atomic::Ordering::SeqCst,
            );
            let grace = view
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .map_or(Duration::from_secs(30), |s| {
                    Duration::from_secs(s.max(0) as u64)
                });
            // Initial delays count from the container's start, also for an adopted one.
            let age = Duration::from_nanos(u64::try_from(now_ns() - cur.started_at).unwrap_or(0));
            let started_at = tokio::time::Instant::now()
                .checked_sub(age)
                .unwrap_or_else(tokio::time::Instant::now);
            let weak = Arc::downgrade(self);
            let uid = view.uid.clone();
            let set = ProbeSet {
                startup: container.startup_probe.clone(),
                liveness: container.liveness_probe.clone(),
                readiness: container.readiness_probe.clone(),
                target: ProbeTarget {
                    pod_ip: view.ctx.pod_ip.clone(),
                    ports: container.ports.clone().unwrap_or_default(),
                    env: Vec::new(),
                    workdir: std::env::temp_dir(),
                },
                status: Arc::clone(&status),
                on_change: Arc::new(move || {
                    if let Some(inner) = weak.upgrade() {
                        inner.notify(&uid);
                    }
                }),
                run: None,
                actions: Some(Arc::new(CriProbeActions {
                    client: self.client.clone(),
                    id: cur.id.clone(),
                    inner: Arc::downgrade(self),
                })),
                grace,
                started_at,
            };
            ProbeRun {
                uid: view.uid.clone(),
                status,
                task: tokio::spawn(set.run()).abort_handle(),
            }
        });
        let started = run.status.started.load(std::sync::atomic::Ordering::SeqCst);
        let ready = started
            && (container.readiness_probe.is_none()
                || run.status.ready.load(std::sync::atomic::Ordering::SeqCst));
        (started, ready)
    }

    /// Stops the probes of the pod's containers that no longer run.
    fn prune_probes(&self, uid: &str, running: &HashSet<String>) {
        lock(&self.probes).retain(|id, p| {
            let keep = p.uid != uid || running.contains(id);
            if !keep {
                p.task.abort();
            }
            keep
        });
    }

    /// A container's CRI status; `None` when the runtime has none to give.
    async fn inner_status(&self, id: &str) -> Result<Option<cri::ContainerStatus>, CriError> {
        Ok(self.client.container_status(id, false).await?.status)
    }

    /// Removes a container's runs older than the latest (which `--previous` reads).
    async fn prune(&self, runs: &[&cri::Container]) {
        for old in runs.iter().skip(1) {
            if let Err(e) = self.client.remove_container(&old.id).await {
                if !e.is_not_found() {
                    tracing::warn!(id = %old.id, error = %e, "removing an old container");
                }
            }
        }
    }

    /// Brings one container to what `policy` asks (only reports it when `act` is false)
    /// and returns its status.
    async fn sync_container(
        self: &Arc<Self>,
        view: &PodView<'_>,
        container: &Container,
        policy: &str,
        act: bool,
    ) -> Result<(ContainerStatus, Disposition), RuntimeError> {
        let name = &container.name;
        let runs = view.runs(name);
        let in_sandbox: Vec<&cri::Container> = runs
            .iter()
            .copied()
            .filter(|c| c.pod_sandbox_id == view.sandbox_id)
            .collect();
        let latest = in_sandbox.first().copied();
        let latest_status = match latest {
            Some(c) => match self.inner_status(&c.id).await {
                Ok(s) => s,
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(internal("reading container status")(e)),
            },
            None => None,
        };
        let kind = match &latest_status {
            None => Latest::None,
            Some(s) => match cri::ContainerState::try_from(s.state) {
                Ok(cri::ContainerState::ContainerRunning) => Latest::Running,
                Ok(cri::ContainerState::ContainerCreated) => Latest::Created,
                _ => Latest::Exited {
                    code: s.exit_code,
                    ran_for: Duration::from_nanos(
                        u64::try_from(s.finished_at - s.started_at).unwrap_or(0),
                    ),
                },
            },
        };
        let key = (view.uid.clone(), name.clone());
        let (plan, restart) = match (&kind, &latest_status) {
            (Latest::Exited { .. }, Some(s)) => {
                let previous = lock(&self.restarts).get(&key).cloned();
                match previous {
                    Some(r) if r.container_id == s.id => (Plan::BackOff(r.wait), Some(r)),
                    previous => {
                        let (plan, next) = state::plan(
                            kind,
                            policy,
                            &self.options.backoff,
                            previous.and_then(|p| p.next),
                        );
                        match plan {
                            Plan::BackOff(wait) => {
                                let r = Restart {
                                    container_id: s.id.clone(),
                                    at_ns: s.finished_at.max(s.started_at) + wait.as_nanos() as i64,
                                    wait,
                                    next,
                                };
                                lock(&self.restarts).insert(key.clone(), r.clone());
                                (plan, Some(r))
                            }
                            other => (other, None),
                        }
                    }
                }
            }
            _ => (
                state::plan(kind, policy, &self.options.backoff, None).0,
                None,
            ),
        };
        let mut error = None;
        let mut started = None;
        let mut hook_error = None;
        let spec_image = container.image.clone().unwrap_or_default();
        let changed = latest.filter(|c| {
            matches!(kind, Latest::Running | Latest::Created)
                && c.annotations
                    .get(containers::IMAGE_ANNOTATION)
                    .is_some_and(|i| *i != spec_image)
        });
        let mut latest_status = latest_status;
        if let Some(c) = changed.filter(|_| act) {
            tracing::info!(pod = %view.name, container = %name, image = %spec_image, "container definition changed, will be restarted");
            let grace = crate::status::grace_period(view.pod);
            self.stop_container(&c.id, grace)
                .await
                .map_err(internal("stopping a changed container"))?;
            latest_status = self.inner_status(&c.id).await.ok().flatten();
            self.prune(&runs).await;
        }
        let plan = if changed.is_some() { Plan::Start } else { plan };
        if act {
            let next_attempt = runs.first().map_or(0, |c| attempt_of(c) + 1);
            match plan {
                Plan::Start => match self.start(view, container, next_attempt).await {
                    Ok((id, hook)) => (started, hook_error) = (Some(id), hook),
                    Err(e) => error = Some(e),
                },
                Plan::StartCreated => {
                    if let Some(c) = latest {
                        if let Err(e) = self.client.start_container(&c.id).await {
                            error = Some(("RunContainerError".to_string(), e.to_string()));
                        }
                    }
                }
                Plan::BackOff(_) if restart.as_ref().is_some_and(|r| r.at_ns <= now_ns()) => {
                    self.prune(&runs).await;
                    match self.start(view, container, next_attempt).await {
                        Ok((id, hook)) => (started, hook_error) = (Some(id), hook),
                        Err(e) => error = Some(e),
                    }
                }
                _ => {}
            }
        }
        let image = container.image.clone().unwrap_or_default();
        let mut status = ContainerStatus {
            name: name.clone(),
            image: image.clone(),
            ready: false,
            started: Some(false),
            restart_count: 0,
            ..Default::default()
        };
        // The run to report: the one just started, else the latest.
        let (current, previous) = match &started {
            Some(id) => {
                let s = self.inner_status(id).await.ok().flatten();
                (s, latest_status.clone())
            }
            None => {
                let prev = match in_sandbox
                    .get(1)
                    .or(runs.iter().find(|c| c.pod_sandbox_id != view.sandbox_id))
                {
                    Some(c) => self.inner_status(&c.id).await.ok().flatten(),
                    None => None,
                };
                (latest_status.clone(), prev)
            }
        };
        if let Some(p) = previous
            .as_ref()
            .filter(|p| p.state == cri::ContainerState::ContainerExited as i32)
        {
            status.last_state = Some(state::terminated(p, &self.container_id(&p.id)));
        }
        let Some(cur) = current else {
            let (reason, message) =
                error.unwrap_or_else(|| ("ContainerCreating".to_string(), String::new()));
            status.restart_count = runs.first().map_or(0, |c| attempt_of(c) as i32);
            status.state = Some(state::waiting(&reason, Some(message)));
            return Ok((status, Disposition::NotStarted));
        };
        status.restart_count = cur.metadata.as_ref().map_or(0, |m| m.attempt) as i32;
        status.container_id = Some(self.container_id(&cur.id));
        status.image_id = cur.image_ref.clone();
        let running = cur.state == cri::ContainerState::ContainerRunning as i32;
        let exited = cur.state == cri::ContainerState::ContainerExited as i32;
        if running {
            let (started, ready) = self.probe_verdict(view, container, &cur);
            status.started = Some(started);
            status.ready = ready;
        } else {
            status.started = Some(false);
        }
        if exited && started.is_none() {
            let this = state::terminated(&cur, &self.container_id(&cur.id));
            if let Some(e) = error {
                // The restart is due but could not be done.
                status.last_state = Some(this);
                status.state = Some(state::waiting(&e.0, Some(e.1)));
                return Ok((status, Disposition::Active));
            }
            if let Some(r) = restart.filter(|r| r.at_ns > now_ns()) {
                status.last_state = Some(this);
                status.state = Some(state::waiting(
                    "CrashLoopBackOff",
                    Some(state::crash_loop_message(
                        r.wait,
                        name,
                        &view.name,
                        &view.namespace,
                        &view.uid,
                    )),
                ));
                return Ok((status, Disposition::Active));
            }
            if plan == Plan::Nothing {
                status.state = Some(this);
                return Ok((status, Disposition::Done(cur.exit_code)));
            }
            status.state = Some(this);
            return Ok((status, Disposition::Active));
        }
        if let Some(message) = hook_error.filter(|_| exited) {
            // The run was killed for its postStart hook: it waits for its restart with the
            // hook's message, or ends there when the policy does not restart it.
            let this = state::terminated(&cur, &self.container_id(&cur.id));
            if !state::restarts(policy, cur.exit_code) {
                status.state = Some(this);
                return Ok((status, Disposition::Done(cur.exit_code)));
            }
            status.last_state = Some(this);
            status.state = Some(state::waiting(hooks::POST_START_HOOK_ERROR, Some(message)));
            return Ok((status, Disposition::Active));
        }
        status.state = Some(state::container_state(&cur, &self.container_id(&cur.id)));
        Ok((status, Disposition::Active))
    }
}

#[async_trait]
impl PodRuntime for CriRuntime {
    async fn sync_pod(&self, pod: &Pod, node: &NodeContext) -> Result<RuntimeStatus, RuntimeError> {
        let (name, namespace, uid) = sandbox::identity(pod);
        if uid.is_empty() {
            return Err(RuntimeError::BadRequest(
                "pod has no metadata.uid".to_string(),
            ));
        }
        let inner = &self.inner;
        let pod_lock = inner.pod_lock(&uid);
        let _guard = pod_lock.lock().await;
        let volumes = inner
            .volumes
            .prepare(pod, node)
            .await
            .map_err(|e| RuntimeError::Internal(format!("preparing the pod's volumes: {e}")))?;
        let runtime_pod = RuntimePod {
            uid: uid.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
        };
        for message in volumes.failures() {
            inner.emit(RuntimeEvent {
                pod: runtime_pod.clone(),
                field_path: None,
                warning: true,
                reason: "FailedMount".to_string(),
                message: message.to_string(),
            });
        }
        let (sandbox_id, sandbox_config) = inner.ensure_sandbox(pod, &uid).await?;
        let sandbox_status = inner
            .client
            .pod_sandbox_status(&sandbox_id, false)
            .await
            .map_err(internal("reading the sandbox status"))?
            .status
            .unwrap_or_default();
        let pod_ip = sandbox_status
            .network
            .as_ref()
            .map(|n| n.ip.clone())
            .filter(|ip| !ip.is_empty())
            .or_else(|| sandbox::host_network(pod).then(|| node.host_ip.clone()));
        let containers = inner
            .client
            .list_containers("", &uid_filter(&uid))
            .await
            .map_err(internal("listing containers"))?;
        let view = PodView {
            pod,
            uid: uid.clone(),
            name: name.clone(),
            namespace,
            sandbox_id,
            sandbox_config,
            ctx: FieldContext {
                pod_ip: pod_ip.clone().unwrap_or_default(),
                node_name: node.node_name.clone(),
                host_ip: node.host_ip.clone(),
                env: std::sync::Arc::new(crate::env::gather(pod, node).await),
                volumes: std::sync::Arc::new(volumes),
            },
            containers,
            secrets: node.sources.clone(),
        };
        // An emptyDir over its sizeLimit: the kubelet evicts the pod, its containers killed
        // at once and none started again; the pod fails with the eviction's message.
        let evicted = view.ctx.volumes.eviction().map(str::to_string);
        if let Some(message) = &evicted {
            inner.evict(&view, &runtime_pod, message).await?;
        }
        let policy = restart_policy(pod);
        let spec = pod.spec.clone().unwrap_or_default();
        let inits = spec.init_containers.clone().unwrap_or_default();
        let mut init_statuses = Vec::new();
        let mut initialized = evicted.is_none();
        let mut init_failed = false;
        for init in &inits {
            let sidecar = is_sidecar(init);
            let init_policy = state::init_policy(sidecar, &policy);
            let (mut status, disposition) = inner
                .sync_container(&view, init, init_policy, initialized)
                .await?;
            if !initialized && disposition == Disposition::NotStarted {
                // Waits for the init containers before it.
                status.state = Some(state::waiting("PodInitializing", None));
            }
            if initialized {
                let done = crate::status::init_container_done(sidecar, &status);
                if matches!(disposition, Disposition::Done(code) if code != 0) {
                    init_failed = true;
                }
                initialized = done;
            }
            init_statuses.push(status);
        }
        let mut statuses = Vec::new();
        let mut dispositions = Vec::new();
        for container in &spec.containers {
            let (mut status, disposition) = inner
                .sync_container(&view, container, &policy, initialized)
                .await?;
            if evicted.is_some() {
                dispositions.push(disposition);
                statuses.push(status);
                continue;
            }
            if !initialized && disposition == Disposition::NotStarted {
                status.state = Some(state::waiting("PodInitializing", None));
            }
            statuses.push(status);
            dispositions.push(disposition);
        }
        let mut phase = crate::status::pod_phase(&dispositions);
        if init_failed || evicted.is_some() {
            phase = "Failed";
        }
        if evicted.is_some() {
            // Killed for good: each shows its last run, not a restart that will not come.
            for s in statuses.iter_mut().chain(init_statuses.iter_mut()) {
                if s.state.as_ref().is_some_and(|st| st.waiting.is_some()) {
                    if let Some(last) = s.last_state.take() {
                        s.state = Some(last);
                    }
                }
                s.ready = false;
            }
        }
        let running_ids: HashSet<String> = statuses
            .iter()
            .chain(&init_statuses)
            .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
            .filter_map(|c| c.container_id.as_deref())
            .map(|id| id.rsplit("://").next().unwrap_or(id).to_string())
            .collect();
        inner.prune_probes(&uid, &running_ids);
        let start_time = (sandbox_status.created_at > 0)
            .then(|| Timestamp::from_nanosecond(i128::from(sandbox_status.created_at)).ok())
            .flatten();
        Ok(RuntimeStatus {
            pod_ip,
            phase: phase.to_string(),
            container_statuses: statuses,
            init_container_statuses: init_statuses,
            start_time,
            reason: evicted.as_ref().map(|_| EVICTED_REASON.to_string()),
            message: evicted,
        })
    }

    async fn kill_pod(&self, pod: &RuntimePod, grace: Duration) -> Result<(), RuntimeError> {
        let inner = &self.inner;
        let pod_lock = inner.pod_lock(&pod.uid);
        let _guard = pod_lock.lock().await;
        let containers = inner
            .client
            .list_containers("", &uid_filter(&pod.uid))
            .await
            .map_err(internal("listing containers"))?;
        // Each running container's preStop hook, then its stop, all at once (as the kubelet
        // kills a pod's containers in parallel).
        let stops = containers
            .iter()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
            .map(|c| inner.stop_container(&c.id, grace));
        for result in futures::future::join_all(stops).await {
            if let Err(e) = result {
                if !e.is_not_found() {
                    return Err(internal("stopping a container")(e));
                }
            }
        }
        for c in &containers {
            if let Err(e) = inner.client.remove_container(&c.id).await {
                if !e.is_not_found() {
                    return Err(internal("removing a container")(e));
                }
            }
        }
        let sandboxes = inner
            .client
            .list_pod_sandbox(&uid_filter(&pod.uid))
            .await
            .map_err(internal("listing sandboxes"))?;
        for s in &sandboxes {
            for result in [
                inner.client.stop_pod_sandbox(&s.id).await,
                inner.client.remove_pod_sandbox(&s.id).await,
            ] {
                if let Err(e) = result {
                    if !e.is_not_found() {
                        return Err(internal("removing the pod sandbox")(e));
                    }
                }
            }
        }
        // Volumes go with the sandbox; an error is logged, as the pod is gone from the runtime.
        if let Err(e) = inner.volumes.cleanup(&pod.uid) {
            tracing::warn!(uid = %pod.uid, error = %e, "removing the pod's volumes");
        }
        let logs =
            sandbox::log_directory_of(&inner.options.data_dir, &pod.namespace, &pod.name, &pod.uid);
        match std::fs::remove_dir_all(&logs) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(uid = %pod.uid, error = %e, "removing the pod's log directory");
            }
            _ => {}
        }
        inner.prune_probes(&pod.uid, &HashSet::new());
        lock(&inner.restarts).retain(|(uid, _), _| *uid != pod.uid);
        lock(&inner.pulls).forget_pod(&pod.uid);
        lock(&inner.pod_locks).remove(&pod.uid);
        tracing::info!(uid = %pod.uid, pod = %pod.name, "pod killed");
        Ok(())
    }

    /// A connection to `localhost:<port>` inside the pod's sandbox ([`super::portforward`]).
    async fn port_forward(
        &self,
        pod: &RuntimePod,
        port: u16,
    ) -> Result<Box<dyn crate::runtime::Duplex>, RuntimeError> {
        super::portforward::connect(&self.inner.client, &pod.uid, port).await
    }

    /// Runs a command in the container through CRI `Exec` ([`super::streaming`]).
    async fn exec(
        &self,
        pod: &RuntimePod,
        request: crate::runtime::ExecRequest,
        io: crate::runtime::StreamIo,
    ) -> Result<i32, RuntimeError> {
        super::streaming::exec(&self.inner.client, &pod.uid, request, io).await
    }

    /// Attaches to the container through CRI `Attach` ([`super::streaming`]).
    async fn attach(
        &self,
        pod: &RuntimePod,
        container: &str,
        tty: bool,
        io: crate::runtime::StreamIo,
    ) -> Result<(), RuntimeError> {
        super::streaming::attach(&self.inner.client, &pod.uid, container, tty, io).await
    }

    async fn pods(&self) -> Vec<RuntimePod> {
        let sandboxes = match self.inner.client.list_pod_sandbox(&HashMap::new()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "listing sandboxes");
                return Vec::new();
            }
        };
        let mut seen = HashSet::new();
        sandboxes
            .into_iter()
            .filter_map(|s| {
                let uid = label(&s.labels, POD_UID_LABEL).to_string();
                (!uid.is_empty() && seen.insert(uid.clone())).then(|| RuntimePod {
                    uid,
                    namespace: label(&s.labels, POD_NAMESPACE_LABEL).to_string(),
                    name: label(&s.labels, POD_NAME_LABEL).to_string(),
                })
            })
            .collect()
    }

    fn subscribe(&self) -> mpsc::UnboundedReceiver<String> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.inner.subscribers).push(tx);
        rx
    }

    /// From the runtime's own figures (its containers' cgroups): [`crate::stats::from_cri`].
    async fn stats(&self) -> Result<crate::stats::RuntimeStats, RuntimeError> {
        let client = &self.inner.client;
        let (stats, running) = tokio::join!(
            client.list_container_stats(),
            client.list_containers_filtered(Default::default())
        );
        Ok(crate::stats::RuntimeStats {
            pods: crate::stats::from_cri(
                &stats.map_err(internal("listing container stats"))?,
                &running.map_err(internal("listing containers"))?,
            ),
            node: None,
            errors: Vec::new(),
        })
    }

    async fn images(&self) -> Option<Vec<k8s_openapi::api::core::v1::ContainerImage>> {
        match self.inner.client.list_images(None).await {
            Ok(images) => Some(gc::node_images(&images)),
            Err(e) => {
                // Left as reported last time rather than emptied by a passing failure.
                tracing::warn!(error = %e, "listing images for the node status");
                None
            }
        }
    }

    fn events(&self) -> Option<mpsc::UnboundedReceiver<RuntimeEvent>> {
        let (tx, rx) = mpsc::unbounded_channel();
        *lock(&self.inner.events) = Some(tx);
        Some(rx)
    }

    async fn logs(
        &self,
        pod: &RuntimePod,
        container: &str,
        options: &LogOptions,
    ) -> Result<LogStream, RuntimeError> {
        let mut filter = uid_filter(&pod.uid);
        filter.insert(CONTAINER_NAME_LABEL.to_string(), container.to_string());
        let mut runs = self
            .inner
            .client
            .list_containers("", &filter)
            .await
            .map_err(internal("listing containers"))?;
        runs.sort_by_key(|c| std::cmp::Reverse((attempt_of(c), c.created_at)));
        let run = if options.previous {
            runs.get(1).ok_or_else(|| {
                RuntimeError::BadRequest(format!(
                    "previous terminated container \"{container}\" in pod \"{}\" not found",
                    pod.name
                ))
            })?
        } else {
            runs.first().ok_or_else(|| {
                RuntimeError::BadRequest(format!(
                    "container \"{container}\" in pod \"{}\" is waiting to start",
                    pod.name
                ))
            })?
        };
        let status = self
            .inner
            .inner_status(&run.id)
            .await
            .map_err(internal("reading container status"))?
            .ok_or_else(|| RuntimeError::NotFound(format!("container {container}")))?;
        let path = PathBuf::from(&status.log_path);
        let content = read_from(&path, 0)?;
        let running = status.state == cri::ContainerState::ContainerRunning as i32;
        if !options.follow || !running {
            let out = logs::render(
                &String::from_utf8_lossy(&content),
                options,
                crate::status::wall_now(),
            );
            return Ok(Box::pin(futures::stream::once(async move {
                Ok(bytes::Bytes::from(out))
            })));
        }
        // Follow: what is there now (as the options select it), then each new whole line
        // as it is written, until the container has exited and its log is read to the end.
        let cut = logs::complete_len(&content);
        let first = logs::render(
            &String::from_utf8_lossy(&content[..cut]),
            options,
            crate::status::wall_now(),
        );
        let state = Follow {
            client: self.inner.client.clone(),
            id: run.id.clone(),
            path,
            offset: cut as u64,
            timestamps: options.timestamps,
            remaining: options.limit_bytes,
            exited: false,
            interval: self
                .inner
                .options
                .poll_interval
                .min(Duration::from_millis(250)),
            pending: Some(first),
        };
        Ok(Box::pin(futures::stream::unfold(
            Some(state),
            |state| async move {
                let mut st = state?;
                match st.next().await {
                    Ok(Some(chunk)) => Some((Ok(chunk), Some(st))),
                    Ok(None) => None,
                    Err(e) => Some((Err(e), None)),
                }
            },
        )))
    }
}

/// A file's bytes from `offset` on (none when it does not exist).
fn read_from(path: &std::path::Path, offset: u64) -> Result<Vec<u8>, RuntimeError> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(RuntimeError::Internal(format!(
                "reading {}: {e}",
                path.display()
            )))
        }
    };
    let mut out = Vec::new();
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.read_to_end(&mut out))
        .map_err(|e| RuntimeError::Internal(format!("reading {}: {e}", path.display())))?;
    Ok(out)
}

/// A followed container log: where reading stands.
struct Follow {
    client: CriClient,
    id: String,
    path: PathBuf,
    offset: u64,
    timestamps: bool,
    /// What `limitBytes` still allows.
    remaining: Option<u64>,
    /// The container has exited: read to the end once more, then stop.
    exited: bool,
    interval: Duration,
    /// The first chunk, not sent yet.
    pending: Option<Vec<u8>>,
}

impl Follow {
    /// Caps a chunk by `limitBytes`.
    fn limit(&mut self, mut chunk: Vec<u8>) -> Option<bytes::Bytes> {
        if let Some(left) = &mut self.remaining {
            if *left == 0 {
                return None;
            }
            chunk.truncate(usize::try_from(*left).unwrap_or(usize::MAX));
            *left -= chunk.len() as u64;
        }
        Some(bytes::Bytes::from(chunk))
    }

    /// The next chunk of output; `None` once the container exited and all is sent.
    async fn next(&mut self) -> Result<Option<bytes::Bytes>, RuntimeError> {
        if let Some(first) = self.pending.take() {
            if !first.is_empty() {
                return Ok(self.limit(first));
            }
        }
        loop {
            if self.remaining == Some(0) {
                return Ok(None);
            }
            // A live file shorter than what was read is a new one after a rotation: read it
            // from its start (what the old one got after the last read is not sent).
            let size = std::fs::metadata(&self.path).map_or(0, |m| m.len());
            if size < self.offset {
                self.offset = 0;
            }
            let new = read_from(&self.path, self.offset)?;
            // Once the container is gone, a trailing partial line is all there will be.
            let cut = if self.exited {
                new.len()
            } else {
                logs::complete_len(&new)
            };
            if cut > 0 {
                self.offset += cut as u64;
                let options = LogOptions {
                    timestamps: self.timestamps,
                    ..Default::default()
                };
                let out = logs::render(
                    &String::from_utf8_lossy(&new[..cut]),
                    &options,
                    crate::status::wall_now(),
                );
                if !out.is_empty() {
                    return Ok(self.limit(out));
                }
                continue;
            }
            if self.exited {
                return Ok(None);
            }
            let running = match self.client.container_status(&self.id, false).await {
                Ok(r) => r
                    .status
                    .is_some_and(|s| s.state == cri::ContainerState::ContainerRunning as i32),
                Err(e) if e.is_not_found() => false,
                Err(e) => return Err(internal("reading container status")(e)),
            };
            if !running {
                self.exited = true;
                continue;
            }
            tokio::time::sleep(self.interval).await;
        }
    }
}
