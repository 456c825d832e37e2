//! The process runtime: each container of a pod is a local process.
//!
//! - A container runs `command` + `args` (with `$(VAR)` expansion, see [`expand`]) under a
//!   small supervising `sh` wrapper in its own process group ([`launch`]), so it survives the agent
//!   and its exit status is recorded even while no agent runs. A container with no command
//!   cannot run as a process (its image's entrypoint is unknown and images are not pulled);
//!   it is simulated: reported running, with `imageID` `simulated://<image>` and a pod
//!   reason `SimulatedContainer` saying so.
//! - Each pod gets its own loopback address ([`ipam`]) as `status.podIP`; or, given a
//!   [`netns::PodNetwork`] (`--process-pod-network bridge`, as root), a network namespace of
//!   its own on the node's pod bridge, whose CNI address is its `status.podIP` ([`netns`]).
//!   Such a pod also gets its own `/etc/resolv.conf`, composed from its `dnsPolicy` and
//!   `dnsConfig` and the cluster DNS, bind-mounted in its containers' mount namespaces.
//! - Everything needed to find the processes again is in `<root>/pods/<uid>/pod.json`
//!   ([`state`]): a new [`ProcessRuntime`] over the same root adopts the running processes
//!   (pid plus `/proc` start time, so a reused pid is never mistaken for them) and records
//!   the exits that happened while it was away. One runtime at a time owns a directory
//!   (an exclusive `flock` on `<root>/lock`).
//! - Exited containers restart as `restartPolicy` says with CrashLoopBackOff ([`backoff`]);
//!   probes ([`probe`]) set `started` and `ready` and stop containers that fail liveness.
//! - Init containers run one after the other, each to success, before the app containers;
//!   sidecars (`restartPolicy: Always`) only need to be running.
//! - Output goes to one log file per run with timestamps on the side ([`logs`]).
//! - `status.containerStatuses[].containerID` is `process://<pid>` of the workload process
//!   (not of its wrapper), so a test or a person can signal the real process.
//!
//! A monitor task polls the processes and the logs and sends the pod's uid to the
//! subscriber whenever an exit happened, a probe verdict flipped or a back-off expired.
//!
//! - Volumes are set up on every sync by a [`VolumeManager`] under `<root>/volumes`; a
//!   container that mounts them runs in a mount namespace of its own with each mount bound
//!   at its `mountPath` ([`mounts`]), which `exec` and exec probes join. Without the
//!   privilege for it, such a container waits with `CreateContainerConfigError`.
//!
//! The environment is [`expand::container_env`]'s (ConfigMaps, Secrets, resource and pod
//! fields, Services; `docs/environment.md`).
//!
//! Not done: statuses of init containers (the runtime
//! contract has no place for them: the pod's reason and message say which one runs or
//! failed, and app containers wait with `PodInitializing`), lifecycle hooks (a container
//! with one waits with `CreateContainerConfigError` saying so), resource limits (ignored),
//! and restarting a container whose `image` was changed in place.

pub mod backoff;
mod exec;
pub mod expand;
pub mod ipam;
pub mod launch;
pub mod logs;
pub mod mounts;
pub mod netns;
pub mod portforward;
pub mod probe;
pub mod state;

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::{mpsc, Notify};
use tokio::task::AbortHandle;

use crate::runtime::{
    ExecRequest, LogOptions, LogStream, NodeContext, PodRuntime, RuntimeError, RuntimeEvent,
    RuntimePod, RuntimeStatus, StreamIo,
};
use crate::status::{is_sidecar, restart_policy, Disposition};
use crate::volumes::{ContainerMount, VolumeManager};
use backoff::{format_delay, BackoffPolicy};
use expand::FieldContext;
use ipam::IpRange;
use launch::{LaunchSpec, RunHandle};
use probe::{ProbeSet, ProbeStatus, ProbeTarget};
use state::{now_ms, ContainerRecord, ExitRecord, PodPaths, PodRecord, RunRecord};

/// Tunables of a [`ProcessRuntime`].
#[derive(Clone, Debug)]
pub struct ProcessRuntimeOptions {
    /// Restart delays (default: Kubernetes' 10 s doubling to 5 min, reset after 10 min).
    pub backoff: BackoffPolicy,
    /// The loopback addresses pods get. `None` (the default): the state directory's own
    /// block, chosen at its first start among those nothing on the host uses and kept there
    /// ([`IpRange::for_state_dir`]), so agents and clusters sharing a host do not collide.
    pub pod_ips: Option<IpRange>,
    /// A run's live log is rotated once it passes this size (default 10 MiB).
    pub log_max_bytes: u64,
    /// How often the monitor looks at processes and logs (default 250 ms).
    pub poll_interval: Duration,
    /// The pod network new pods join, each in a network namespace of its own ([`netns`]).
    /// `None` (the default): new pods get loopback addresses from `pod_ips` and share the
    /// node's network. Pods keep what they started with either way.
    pub network: Option<netns::PodNetwork>,
    /// The cluster DNS (the kubelet's `--cluster-dns` and `--cluster-domain`) a pod on the pod
    /// network is told in its own `/etc/resolv.conf` (see [`ProcessRuntime::resolv_conf_mount`]);
    /// pods on the node's network read the node's.
    pub cluster_dns: setpoint_network::dns::ClusterDns,
}

impl Default for ProcessRuntimeOptions {
    fn default() -> Self {
        Self {
            backoff: BackoffPolicy::default(),
            pod_ips: None,
            log_max_bytes: 10 * 1024 * 1024,
            poll_interval: Duration::from_millis(250),
            network: None,
            cluster_dns: Default::default(),
        }
    }
}

/// Runs pods' containers as local processes. See the [module docs](self).
pub struct ProcessRuntime {
    inner: Arc<Inner>,
    monitor: AbortHandle,
    /// Holds an exclusive lock on the state directory: two runtimes over one directory
    /// would start each other's containers twice. The kernel drops it when the agent dies.
    _lock: std::fs::File,
}

type Subscribers = Arc<Mutex<Vec<mpsc::UnboundedSender<String>>>>;

struct Inner {
    root: PathBuf,
    options: ProcessRuntimeOptions,
    pods: Mutex<HashMap<String, Arc<tokio::sync::Mutex<PodState>>>>,
    ips: Mutex<HashSet<Ipv4Addr>>,
    /// Where pod addresses come from: set once the adopted pods' addresses are known.
    pod_range: std::sync::OnceLock<IpRange>,
    subscribers: Subscribers,
    /// Wakes the monitor early (a wrapper the agent started exited).
    wake: Arc<Notify>,
    /// Tasks to stop when the runtime is dropped (wrapper waiters, probes).
    tasks: Mutex<Vec<AbortHandle>>,
    /// The back-off expiry last announced per (uid, container), so it is announced once.
    announced: Mutex<HashMap<(String, String), i64>>,
    /// How much of each live log the timestamp checkpoints cover.
    indexed: Mutex<HashMap<PathBuf, u64>>,
    /// Sets up the pods' volumes under `<root>/volumes`.
    volumes: VolumeManager,
    /// The mount points the runtime created on the node ([`mounts::MountPoints`]).
    mount_points: Mutex<mounts::MountPoints>,
    /// Where the Events the runtime reports go ([`PodRuntime::events`]), once asked for.
    events: Mutex<Option<mpsc::UnboundedSender<RuntimeEvent>>>,
}

struct PodState {
    paths: PodPaths,
    record: PodRecord,
    /// Probe tasks and verdicts per container, for the run they watch.
    probes: HashMap<String, ProbeRun>,
    /// Why a container could not be started at the last sync (reason, message).
    errors: HashMap<String, (String, String)>,
    /// Why the pod's volumes could not be set up at the last sync, if they could not.
    volume_error: Option<String>,
    /// Why the pod was evicted (an emptyDir over its `sizeLimit`): its containers were
    /// killed and none starts again.
    evicted: Option<String>,
    /// Set by `kill_pod`: the state is being torn down.
    gone: bool,
}

struct ProbeRun {
    index: u32,
    status: Arc<ProbeStatus>,
    task: AbortHandle,
}

/// The list of mount points the runtime created, under its root.
const MOUNT_POINTS: &str = "mountpoints.json";
/// The node's resolver configuration, and where a pod on the pod network gets its own.
const HOST_RESOLV_CONF: &str = "/etc/resolv.conf";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere must not wedge the runtime: the data stays usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn internal(context: &str) -> impl FnOnce(std::io::Error) -> RuntimeError + '_ {
    move |e| RuntimeError::Internal(format!("{context}: {e}"))
}

fn notify_all(subscribers: &Subscribers, uid: &str) {
    lock(subscribers).retain(|tx| tx.send(uid.to_string()).is_ok());
}

/// Takes the exclusive lock of a state directory, failing if another runtime holds it.
// The state lock is `flock`, a system call.
#[allow(unsafe_code)]
fn lock_dir(root: &Path) -> Result<std::fs::File, RuntimeError> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join("lock"))
        .map_err(internal("opening the state lock"))?;
    // SAFETY: plain syscall on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(RuntimeError::Internal(format!(
            "{} is in use by another process runtime",
            root.display()
        )));
    }
    Ok(file)
}

fn time(ms: i64) -> Time {
    Time(Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH))
}

impl ProcessRuntime {
    /// A runtime keeping its state under `root_dir`, with Kubernetes' default timings.
    /// Adopts the pods a previous runtime over the same directory left running. Must be
    /// called inside a Tokio runtime (it starts the monitor task).
    pub fn new(root_dir: impl Into<PathBuf>) -> Result<Self, RuntimeError> {
        Self::with_options(root_dir, ProcessRuntimeOptions::default())
    }

    /// Like [`new`](Self::new) with other restart back-off delays (tests use short ones).
    pub fn with_backoff(
        root_dir: impl Into<PathBuf>,
        base: Duration,
        max: Duration,
    ) -> Result<Self, RuntimeError> {
        let mut options = ProcessRuntimeOptions::default();
        options.backoff.base = base;
        options.backoff.max = max;
        Self::with_options(root_dir, options)
    }

    /// Like [`new`](Self::new) with every tunable given.
    pub fn with_options(
        root_dir: impl Into<PathBuf>,
        options: ProcessRuntimeOptions,
    ) -> Result<Self, RuntimeError> {
        let root = root_dir.into();
        let pods_dir = root.join("pods");
        std::fs::create_dir_all(&pods_dir).map_err(internal("creating the state directory"))?;
        let lock_file = lock_dir(&root)?;
        let inner = Arc::new(Inner {
            options,
            pods: Mutex::new(HashMap::new()),
            ips: Mutex::new(HashSet::new()),
            pod_range: std::sync::OnceLock::new(),
            subscribers: Arc::new(Mutex::new(Vec::new())),
            wake: Arc::new(Notify::new()),
            tasks: Mutex::new(Vec::new()),
            announced: Mutex::new(HashMap::new()),
            indexed: Mutex::new(HashMap::new()),
            volumes: VolumeManager::new(root.join("volumes")),
            mount_points: Mutex::new(mounts::MountPoints::load(&root.join(MOUNT_POINTS))),
            events: Mutex::new(None),
            root,
        });
        inner.adopt(&pods_dir)?;
        inner.forget_orphans();
        let range = match inner.options.pod_ips {
            Some(range) => range,
            None => IpRange::for_state_dir(&inner.root, &lock(&inner.ips))
                .map_err(internal("choosing the pod address range"))?,
        };
        let _ = inner.pod_range.set(range);
        let monitor = tokio::spawn(Inner::monitor(Arc::clone(&inner))).abort_handle();
        Ok(Self {
            inner,
            monitor,
            _lock: lock_file,
        })
    }

    /// The directory the runtime keeps its state in.
    pub fn root_dir(&self) -> &Path {
        &self.inner.root
    }
}

impl Drop for ProcessRuntime {
    /// Stops the runtime's tasks but never its containers: they outlive the agent, and the
    /// next runtime over the same directory adopts them.
    fn drop(&mut self) {
        self.monitor.abort();
        for task in lock(&self.inner.tasks).drain(..) {
            task.abort();
        }
    }
}

impl Inner {
    /// Loads the pods a previous runtime left and records what ended meanwhile.
    fn adopt(&self, pods_dir: &Path) -> Result<(), RuntimeError> {
        let entries =
            std::fs::read_dir(pods_dir).map_err(internal("reading the state directory"))?;
        for entry in entries.flatten() {
            let dir = entry.path();
            let uid = entry.file_name().to_string_lossy().into_owned();
            let paths = PodPaths::new(&self.root, &uid);
            let mut record = match PodRecord::load(&paths.record()) {
                Ok(r) => r,
                Err(e) => {
                    // The record is written before any process starts: a directory without
                    // one never ran anything.
                    tracing::warn!(?dir, error = %e, "removing pod directory without a readable record");
                    let _ = std::fs::remove_dir_all(&dir);
                    continue;
                }
            };
            if let Ok(ip) = record.ip.parse() {
                lock(&self.ips).insert(ip);
            }
            for (name, c) in &record.containers {
                if let Some(run) = c.run.as_ref().filter(|r| !r.simulated && r.exit.is_none()) {
                    let log = paths.run_file(name, run.index, "log");
                    let size = logs::indexed_size(&log);
                    lock(&self.indexed).insert(log, size);
                }
            }
            if observe(&paths, &mut record) {
                record
                    .save(&paths.record())
                    .map_err(internal("saving pod record"))?;
            }
            tracing::info!(uid, pod = %record.name, "adopted pod");
            let state = PodState {
                paths,
                record,
                probes: HashMap::new(),
                errors: HashMap::new(),
                volume_error: None,
                evicted: None,
                gone: false,
            };
            lock(&self.pods).insert(uid, Arc::new(tokio::sync::Mutex::new(state)));
        }
        Ok(())
    }

    /// Removes the volumes and releases the mount points of pods that have no state any
    /// more (an agent stopped between removing a pod's state and its volumes). The volumes of
    /// adopted pods stay as they are: their containers' mounts live in the containers' own
    /// namespaces, and the next sync sets the volumes up idempotently.
    fn forget_orphans(&self) {
        let known: HashSet<String> = lock(&self.pods).keys().cloned().collect();
        let volume_pods = self.root.join("volumes").join("pods");
        for entry in std::fs::read_dir(&volume_pods)
            .into_iter()
            .flatten()
            .flatten()
        {
            let uid = entry.file_name().to_string_lossy().into_owned();
            if !known.contains(&uid) {
                if let Err(e) = self.volumes.cleanup(&uid) {
                    tracing::warn!(uid, error = %e, "removing the volumes of a pod without state");
                }
            }
        }
        let orphans: Vec<String> = lock(&self.mount_points)
            .uids()
            .into_iter()
            .filter(|uid| !known.contains(uid))
            .collect();
        for uid in orphans {
            self.release_mount_points(&uid);
        }
        // Networks of pods without state (an agent stopped between the two) are torn down
        // in the background: the plugins take a while, and nothing waits for them.
        let netns_dir = self.root.join(netns::DIR);
        let stale: Vec<String> = netns::uids(&netns_dir)
            .into_iter()
            .filter(|uid| !known.contains(uid))
            .collect();
        if !stale.is_empty() {
            tokio::spawn(async move {
                for uid in stale {
                    if let Err(e) = netns::teardown(&netns_dir, &uid).await {
                        tracing::warn!(uid, error = %e, "tearing down the network of a pod without state");
                    }
                }
            });
        }
    }

    /// Forgets that the pod `uid` needs the mount points the runtime created, and removes
    /// those no pod needs any more if they are still empty.
    fn release_mount_points(&self, uid: &str) {
        let mut points = lock(&self.mount_points);
        let free = points.release(uid);
        if free.is_empty() {
            return;
        }
        // A path some other namespace still mounts at (another agent's container, or one of
        // ours not quite gone) stays, with the levels above it, and is looked at again at the
        // next release.
        let in_use = mounts::mounted_elsewhere(&free);
        for path in &free {
            if in_use.iter().any(|u| u.starts_with(path)) {
                points.keep(path);
            } else {
                mounts::remove_if_empty(path);
            }
        }
        if let Err(e) = points.save(&self.root.join(MOUNT_POINTS)) {
            tracing::warn!(error = %e, "saving the mount points");
        }
    }

    /// Hands an Event to the agent, if it asked for them.
    fn emit(&self, event: RuntimeEvent) {
        if let Some(tx) = lock(&self.events).as_ref() {
            let _ = tx.send(event);
        }
    }

    /// Removes the pod's volumes and releases its mount points.
    fn forget_volumes(&self, uid: &str) {
        if let Err(e) = self.volumes.cleanup(uid) {
            tracing::warn!(uid, error = %e, "removing the pod's volumes");
        }
        self.release_mount_points(uid);
    }

    fn notify(&self, uid: &str) {
        notify_all(&self.subscribers, uid);
    }

    fn track(&self, task: AbortHandle) {
        let mut tasks = lock(&self.tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    /// Polls processes, logs and back-off timers; announces changes.
    async fn monitor(self: Arc<Self>) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.options.poll_interval) => {}
                () = self.wake.notified() => {}
            }
            let entries: Vec<(String, Arc<tokio::sync::Mutex<PodState>>)> = lock(&self.pods)
                .iter()
                .map(|(k, v)| (k.clone(), Arc::clone(v)))
                .collect();
            let now = now_ms();
            for (uid, entry) in entries {
                // A pod being synced or killed is looked at next time.
                let Ok(mut st) = entry.try_lock() else {
                    continue;
                };
                if st.gone {
                    continue;
                }
                self.index_logs(&st);
                let st = &mut *st;
                let changed = observe(&st.paths, &mut st.record);
                prune_probes(st);
                if changed {
                    if let Err(e) = st.record.save(&st.paths.record()) {
                        tracing::warn!(uid, error = %e, "saving pod record");
                    }
                    self.index_logs(st);
                }
                let mut due = false;
                for (name, c) in &st.record.containers {
                    if let Some(at) = c.restart_at_ms.filter(|at| *at <= now) {
                        let key = (uid.clone(), name.clone());
                        let mut announced = lock(&self.announced);
                        if announced.get(&key) != Some(&at) {
                            announced.insert(key, at);
                            due = true;
                        }
                    }
                }
                if changed || due {
                    self.notify(&uid);
                }
            }
        }
    }

    fn index_logs(&self, st: &PodState) {
        for (name, c) in &st.record.containers {
            let Some(run) = c.run.as_ref().filter(|r| !r.simulated) else {
                continue;
            };
            // A run that just ended gets one last checkpoint.
            let ended_long_ago = run
                .exit
                .as_ref()
                .is_some_and(|e| now_ms() - e.finished_at_ms > 5_000);
            if ended_long_ago {
                continue;
            }
            let log = st.paths.run_file(name, run.index, "log");
            let mut indexed = lock(&self.indexed);
            let size = indexed.entry(log.clone()).or_insert(0);
            if let Err(e) = logs::index(&log, size, self.options.log_max_bytes) {
                tracing::debug!(?log, error = %e, "indexing log");
            }
        }
    }

    fn pod_entry(&self, uid: &str) -> Option<Arc<tokio::sync::Mutex<PodState>>> {
        lock(&self.pods).get(uid).cloned()
    }

    /// The pod's state, created (address allocated, record written) on first sight.
    /// `host_ip` is the address of a `hostNetwork` pod, which gets no address of its own.
    fn pod_entry_or_create(
        &self,
        uid: &str,
        namespace: &str,
        name: &str,
        host_ip: Option<&str>,
    ) -> Result<Arc<tokio::sync::Mutex<PodState>>, RuntimeError> {
        let mut pods = lock(&self.pods);
        if let Some(entry) = pods.get(uid) {
            return Ok(Arc::clone(entry));
        }
        // With a pod network the address comes from its IPAM when the pod's namespace is set
        // up (`sync_pod`); until then the record has none.
        let allocated = match host_ip {
            Some(_) => None,
            None if self.options.network.is_some() => None,
            None => {
                let mut ips = lock(&self.ips);
                // Addresses another process has a socket on are not free either.
                let mut taken = ipam::in_use_on_host();
                taken.extend(ips.iter().copied());
                let range = self.pod_range.get().copied().unwrap_or_default();
                let ip = range.allocate(&taken).ok_or_else(|| {
                    RuntimeError::Internal("no free pod address left in the range".to_string())
                })?;
                ips.insert(ip);
                Some(ip)
            }
        };
        let ip = allocated.map_or_else(
            || host_ip.unwrap_or_default().to_string(),
            |ip| ip.to_string(),
        );
        // (Empty until the pod network gives one, for a pod on it.)
        let paths = PodPaths::new(&self.root, uid);
        let record = PodRecord {
            uid: uid.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            ip,
            start_time_ms: now_ms(),
            containers: Default::default(),
        };
        let saved = std::fs::create_dir_all(&paths.dir).and_then(|()| record.save(&paths.record()));
        if let Err(e) = saved {
            if let Some(ip) = allocated {
                lock(&self.ips).remove(&ip);
            }
            return Err(RuntimeError::Internal(format!("creating pod state: {e}")));
        }
        let state = PodState {
            paths,
            record,
            probes: HashMap::new(),
            errors: HashMap::new(),
            volume_error: None,
            evicted: None,
            gone: false,
        };
        let entry = Arc::new(tokio::sync::Mutex::new(state));
        pods.insert(uid.to_string(), Arc::clone(&entry));
        Ok(entry)
    }
}

/// Stops the probe tasks of runs that have ended: an exited container is not probed.
fn prune_probes(st: &mut PodState) {
    let record = &st.record;
    st.probes.retain(|name, p| {
        let current = record.containers.get(name).and_then(|c| c.run.as_ref());
        let live = current.is_some_and(|r| r.index == p.index && r.exit.is_none());
        if !live {
            p.task.abort();
        }
        live
    });
}

/// The handle of a run that has (or had) processes.
fn run_handle(paths: &PodPaths, name: &str, run: &RunRecord) -> RunHandle {
    RunHandle {
        wrapper_pid: run.wrapper_pid,
        wrapper_start: run.wrapper_start,
        workload: run.pid.map(|p| (p, run.pid_start.unwrap_or(0))),
        exit_file: paths.run_file(name, run.index, "exit"),
    }
}

/// Records the exits of runs whose processes ended. Returns whether anything changed.
fn observe(paths: &PodPaths, record: &mut PodRecord) -> bool {
    let mut changed = false;
    for (name, c) in record.containers.iter_mut() {
        let Some(run) = c.run.as_mut().filter(|r| !r.simulated && r.exit.is_none()) else {
            continue;
        };
        let handle = run_handle(paths, name, run);
        if handle.running() {
            continue;
        }
        let code = launch::read_i32(&handle.exit_file);
        if code.is_none() && handle.wrapper_alive() {
            // The workload ended and the wrapper is about to write its status.
            continue;
        }
        let (code, message, finished) = match code {
            Some(code) => (
                code,
                None,
                state::mtime_ms(&handle.exit_file).unwrap_or_else(now_ms),
            ),
            None => (
                137,
                Some(
                    "the exit status was not recorded: the container's supervisor was killed"
                        .to_string(),
                ),
                now_ms(),
            ),
        };
        // Background processes the workload left behind end with the container.
        handle.kill_leftovers();
        tracing::info!(pod = %record.name, container = %name, code, "container exited");
        run.exit = Some(ExitRecord {
            code,
            reason: if code == 0 { "Completed" } else { "Error" }.to_string(),
            message,
            started_at_ms: run.started_at_ms,
            finished_at_ms: finished.max(run.started_at_ms),
            container_id: container_id(run),
        });
        changed = true;
    }
    changed
}

fn container_id(run: &RunRecord) -> String {
    match run.pid {
        Some(pid) => format!("process://{pid}"),
        None => format!("process://{}", run.wrapper_pid),
    }
}

/// Whether `restartPolicy` restarts a container that exited with `code`.
fn restarts(policy: &str, code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => code != 0,
        _ => true,
    }
}

/// Whether the container mounts volumes (and so runs in a mount namespace of its own).
fn has_mounts(container: &Container) -> bool {
    container
        .volume_mounts
        .as_ref()
        .is_some_and(|m| !m.is_empty())
}

fn is_simulated(container: &Container) -> bool {
    container.command.as_ref().is_none_or(|c| c.is_empty())
}

fn base_env(pod_name: &str) -> Vec<(String, String)> {
    let path = std::env::var("PATH").unwrap_or_else(|_| {
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()
    });
    let mut env = vec![
        ("PATH".to_string(), path),
        ("HOSTNAME".to_string(), pod_name.to_string()),
    ];
    if let Ok(home) = std::env::var("HOME") {
        env.push(("HOME".to_string(), home));
    }
    env
}

/// A container's environment: the base variables, overridden by the spec's.
fn full_env(base: Vec<(String, String)>, spec: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = base
        .into_iter()
        .filter(|(k, _)| !spec.iter().any(|(s, _)| s == k))
        .collect();
    env.extend(spec);
    env
}

struct Prepared {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    workdir: PathBuf,
    /// The container's volume mounts; none: it runs in the node's mount namespace.
    mounts: Vec<ContainerMount>,
}

/// The container's mounts, or why it cannot be created yet: the pod's volumes could not be
/// set up, or one it mounts was never set up (the container stays `ContainerCreating`, as the
/// kubelet's waits for its volumes), or a mount cannot be given (`CreateContainerConfigError`).
fn container_mounts(
    container: &Container,
    ctx: &FieldContext,
    volume_error: Option<&str>,
    env: &[(String, String)],
) -> Result<Vec<ContainerMount>, (String, String)> {
    if !has_mounts(container) {
        return Ok(Vec::new());
    }
    let creating = |message: String| ("ContainerCreating".to_string(), message);
    if let Some(e) = volume_error {
        return Err(creating(e.to_string()));
    }
    // Only a volume never set up is waited for: one whose update failed keeps its last
    // contents, as the CRI runtime and the kubelet treat it.
    if let Some(e) = ctx.volumes.waiting_for(container) {
        return Err(creating(e.to_string()));
    }
    let config = |message: String| ("CreateContainerConfigError".to_string(), message);
    let mounts = ctx.volumes.mounts_for(container, env).map_err(config)?;
    if !mounts.is_empty() && !mounts::namespaces_permitted() {
        return Err(config(mounts::NOT_PERMITTED.to_string()));
    }
    Ok(mounts)
}

fn prepare(
    pod: &Pod,
    container: &Container,
    ctx: &FieldContext,
    paths: &PodPaths,
    volume_error: Option<&str>,
) -> Result<Prepared, (String, String)> {
    let name = container.name.as_str();
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        // The name becomes a directory name; the API never lets such a name through.
        return Err((
            "CreateContainerConfigError".to_string(),
            format!("invalid container name {name:?}"),
        ));
    }
    if let Some(why) = crate::unsupported::in_process(container) {
        return Err(("CreateContainerConfigError".to_string(), why));
    }
    let spec_env = expand::container_env(pod, container, ctx)
        .map_err(|e| ("CreateContainerConfigError".to_string(), e))?;
    let mounts = container_mounts(container, ctx, volume_error, &spec_env)?;
    let env = full_env(
        base_env(pod.metadata.name.as_deref().unwrap_or_default()),
        spec_env,
    );
    let argv = expand::command_line(container, &env).ok_or_else(|| {
        (
            "CreateContainerConfigError".to_string(),
            "no command".to_string(),
        )
    })?;
    let workdir = match container.working_dir.as_deref().filter(|w| !w.is_empty()) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            // A directory inside a volume is looked for in the volume.
            if !mounts::node_path_of(&dir, &mounts).is_dir() {
                return Err((
                    "CreateContainerError".to_string(),
                    format!("workingDir {} does not exist on this node", dir.display()),
                ));
            }
            dir
        }
        None => {
            let dir = paths.workdir(&container.name);
            std::fs::create_dir_all(&dir).map_err(|e| {
                (
                    "CreateContainerError".to_string(),
                    format!("creating {}: {e}", dir.display()),
                )
            })?;
            dir
        }
    };
    Ok(Prepared {
        argv,
        env,
        workdir,
        mounts,
    })
}

impl ProcessRuntime {
    /// Tears down the pod's network, if it has one; a failure is logged and retried by the
    /// next runtime over the directory (the state stays).
    async fn forget_network(&self, uid: &str) {
        let dir = self.inner.root.join(netns::DIR);
        if let Err(e) = netns::teardown(&dir, uid).await {
            tracing::warn!(uid, error = %e, "tearing down the pod's network");
        }
    }

    /// The pod's own network namespace, if it has one ([`netns`]).
    fn pod_netns(&self, uid: &str) -> Option<PathBuf> {
        let dir = self.inner.root.join(netns::DIR);
        netns::exists(&dir, uid).then(|| netns::path(&dir, uid))
    }

    /// Gives a pod without an address one from the pod network: its namespace is created
    /// and the CNI plugins are run on it ([`netns::setup`]). Returns whether the record
    /// changed.
    async fn ensure_pod_network(&self, st: &mut PodState) -> Result<bool, RuntimeError> {
        let Some(network) = &self.inner.options.network else {
            return Ok(false);
        };
        if !st.record.ip.is_empty() {
            return Ok(false);
        }
        let dir = self.inner.root.join(netns::DIR);
        let ip = netns::setup(network, &dir, &st.record.uid)
            .await
            .map_err(|e| {
                RuntimeError::Internal(format!(
                    "failed to set up the network of pod {}/{}: {e}",
                    st.record.namespace, st.record.name
                ))
            })?;
        tracing::info!(pod = %st.record.name, %ip, "pod network set up");
        st.record.ip = ip.to_string();
        st.record
            .save(&st.paths.record())
            .map_err(internal("saving pod record"))?;
        Ok(true)
    }

    /// Evicts the pod as the kubelet evicts one over its local storage limit (an emptyDir
    /// over its `sizeLimit`): its running containers are killed at once, none starts again,
    /// and the kubelet's `Evicted` Event is reported. Returns whether the record changed.
    async fn evict(&self, st: &mut PodState, message: &str) -> bool {
        tracing::warn!(pod = %st.record.name, %message, "evicting the pod");
        for (_, p) in st.probes.drain() {
            p.task.abort();
        }
        let handles: Vec<RunHandle> = st
            .record
            .containers
            .iter()
            .filter_map(|(name, c)| {
                c.run
                    .as_ref()
                    .filter(|r| !r.simulated && r.exit.is_none())
                    .map(|r| run_handle(&st.paths, name, r))
            })
            .collect();
        futures::future::join_all(handles.iter().map(|h| h.terminate(Duration::ZERO))).await;
        for c in st.record.containers.values_mut() {
            c.restart_at_ms = None;
        }
        st.evicted = Some(message.to_string());
        self.inner.emit(RuntimeEvent {
            pod: RuntimePod {
                uid: st.record.uid.clone(),
                namespace: st.record.namespace.clone(),
                name: st.record.name.clone(),
            },
            field_path: None,
            warning: true,
            reason: crate::volumes::emptydir::EVICTED_REASON.to_string(),
            message: message.to_string(),
        });
        observe(&st.paths, &mut st.record) | !handles.is_empty()
    }

    /// The mount namespace a run of a container with mounts starts in ([`mounts`]), with
    /// its missing mount points created and recorded; `None` for a container without.
    fn mount_namespace(
        &self,
        st: &PodState,
        prepared: &Prepared,
    ) -> Result<Option<Arc<mounts::Namespace>>, (String, String)> {
        if prepared.mounts.is_empty() {
            return Ok(None);
        }
        let mut points = lock(&self.inner.mount_points);
        let (namespace, changed) = mounts::Namespace::prepare(
            &prepared.mounts,
            &prepared.workdir,
            &st.record.uid,
            &self.inner.root,
            &mut points,
        )
        .map_err(|e| {
            let reason = match e {
                mounts::MountError::Io { .. } => "CreateContainerError",
                _ => "CreateContainerConfigError",
            };
            (reason.to_string(), e.to_string())
        })?;
        if changed {
            if let Err(e) = points.save(&self.inner.root.join(MOUNT_POINTS)) {
                tracing::warn!(error = %e, "saving the mount points");
            }
        }
        Ok(Some(Arc::new(namespace)))
    }

    /// For a pod with a network namespace of its own, its `/etc/resolv.conf`, composed as the
    /// kubelet composes a sandbox's from `dnsPolicy`, `dnsConfig`, the cluster DNS and the
    /// node's `resolv.conf` ([`setpoint_network::dns::resolvconf::pod_dns`]), written under
    /// the pod's directory and bind-mounted over `/etc/resolv.conf` in the container's mount
    /// namespace: the node's own may name resolvers (a loopback stub) the pod cannot reach.
    /// The kubelet's warnings about it become the pod's Events. `None` for a pod on the
    /// node's network, which resolves as the node does.
    fn resolv_conf_mount(
        &self,
        st: &PodState,
        pod: &Pod,
    ) -> Result<Option<ContainerMount>, (String, String)> {
        if self.pod_netns(&st.record.uid).is_none() {
            return Ok(None);
        }
        let host = setpoint_network::dns::ResolvConf::parse(
            &std::fs::read_to_string(HOST_RESOLV_CONF).unwrap_or_default(),
        );
        let composed =
            setpoint_network::dns::resolvconf::pod_dns(pod, &self.inner.options.cluster_dns, &host);
        for warning in composed.warnings {
            self.inner.emit(RuntimeEvent {
                pod: RuntimePod {
                    uid: st.record.uid.clone(),
                    namespace: st.record.namespace.clone(),
                    name: st.record.name.clone(),
                },
                field_path: None,
                warning: true,
                reason: warning.reason.to_string(),
                message: warning.message,
            });
        }
        let path = st.paths.resolv_conf();
        std::fs::write(&path, composed.config.render()).map_err(|e| {
            (
                "CreateContainerError".to_string(),
                format!("writing {}: {e}", path.display()),
            )
        })?;
        Ok(Some(ContainerMount {
            host_path: path,
            container_path: HOST_RESOLV_CONF.to_string(),
            read_only: false,
        }))
    }

    async fn start_run(
        &self,
        st: &mut PodState,
        pod: &Pod,
        container: &Container,
        mut prepared: Prepared,
        index: u32,
    ) -> Result<(), (String, String)> {
        if let Some(mount) = self.resolv_conf_mount(st, pod)? {
            prepared.mounts.push(mount);
        }
        let name = &container.name;
        let dir = st.paths.container(name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| ("RunContainerError".to_string(), e.to_string()))?;
        // Keep the logs of this run and the previous one only (`--previous`).
        if let Some(old) = index.checked_sub(2) {
            for ext in ["log", "log.1", "times", "times.1", "pid", "exit"] {
                let _ = std::fs::remove_file(st.paths.run_file(name, old, ext));
            }
            lock(&self.inner.indexed).remove(&st.paths.run_file(name, old, "log"));
        }
        let namespace = self.mount_namespace(st, &prepared)?;
        let spec = LaunchSpec {
            argv: prepared.argv,
            env: prepared.env.clone(),
            workdir: prepared.workdir.clone(),
            log: st.paths.run_file(name, index, "log"),
            pid_file: st.paths.run_file(name, index, "pid"),
            exit_file: st.paths.run_file(name, index, "exit"),
            namespace,
            netns: self.pod_netns(&st.record.uid),
        };
        for path in [&spec.log, &spec.pid_file, &spec.exit_file] {
            let _ = std::fs::remove_file(path);
        }
        let mut launched = launch::launch(&spec).await.map_err(|e| {
            (
                "RunContainerError".to_string(),
                format!("starting {}: {e}", spec.argv[0]),
            )
        })?;
        let started_at_ms = now_ms();
        let run = RunRecord {
            index,
            simulated: false,
            wrapper_pid: launched.wrapper_pid,
            wrapper_start: launched.wrapper_start,
            pid: launched.workload.map(|w| w.0),
            pid_start: launched.workload.map(|w| w.1),
            started_at_ms,
            exit: None,
        };
        tracing::info!(pod = %st.record.name, container = %name, pid = ?run.pid, index, "container started");
        lock(&self.inner.indexed).insert(spec.log.clone(), 0);
        let rec = st.record.containers.entry(name.clone()).or_default();
        // The restart and the new run are recorded together: a crash of the agent in
        // between must not lose the restart count or leave a stale back-off expiry.
        if let Some(exit) = rec.run.take().and_then(|r| r.exit) {
            rec.last = Some(exit);
            rec.restart_count += 1;
            rec.restart_at_ms = None;
        }
        rec.run = Some(run);
        if let Err(e) = st.record.save(&st.paths.record()) {
            tracing::warn!(error = %e, "saving pod record");
        }
        // Reap the wrapper as soon as it exits and look at the pod right away.
        let wake = Arc::clone(&self.inner.wake);
        let waiter = tokio::spawn(async move {
            let _ = launched.child.wait().await;
            wake.notify_one();
        });
        self.inner.track(waiter.abort_handle());
        self.ensure_probes(st, pod, container, &prepared.env, &prepared.workdir);
        Ok(())
    }

    /// Starts the probe task of the container's current run unless it runs already.
    fn ensure_probes(
        &self,
        st: &mut PodState,
        pod: &Pod,
        container: &Container,
        env: &[(String, String)],
        workdir: &Path,
    ) {
        let name = &container.name;
        let Some(run) = st.record.containers.get(name).and_then(|c| c.run.as_ref()) else {
            return;
        };
        if run.simulated || run.exit.is_some() {
            return;
        }
        if st.probes.get(name).is_some_and(|p| p.index == run.index) {
            return;
        }
        if let Some(old) = st.probes.remove(name) {
            old.task.abort();
        }
        let status = Arc::new(ProbeStatus::default());
        status
            .started
            .store(container.startup_probe.is_none(), Ordering::SeqCst);
        let grace = pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or(Duration::from_secs(30));
        // Initial delays count from the run's start, also for an adopted run.
        let age = Duration::from_millis(u64::try_from(now_ms() - run.started_at_ms).unwrap_or(0));
        let started_at = tokio::time::Instant::now()
            .checked_sub(age)
            .unwrap_or_else(tokio::time::Instant::now);
        let subscribers = Arc::clone(&self.inner.subscribers);
        let uid = st.record.uid.clone();
        let target = ProbeTarget {
            pod_ip: st.record.ip.clone(),
            ports: container.ports.clone().unwrap_or_default(),
            env: env.to_vec(),
            workdir: workdir.to_path_buf(),
        };
        let handle = run_handle(&st.paths, name, run);
        // A container with mounts has its own mount namespace, a pod on the pod network its
        // own network namespace: exec probes run in them.
        let own_namespaces = has_mounts(container) || self.pod_netns(&uid).is_some();
        let actions = run.pid.filter(|_| own_namespaces).map(|pid| {
            Arc::new(probe::InMountNamespace {
                pid,
                start: run.pid_start.unwrap_or(0),
                target: target.clone(),
                run: handle.clone(),
            }) as Arc<dyn probe::ProbeActions>
        });
        let set = ProbeSet {
            startup: container.startup_probe.clone(),
            liveness: container.liveness_probe.clone(),
            readiness: container.readiness_probe.clone(),
            target,
            status: Arc::clone(&status),
            on_change: Arc::new(move || notify_all(&subscribers, &uid)),
            run: Some(handle),
            actions,
            grace,
            started_at,
        };
        let index = run.index;
        let task = tokio::spawn(set.run()).abort_handle();
        self.inner.track(task.clone());
        st.probes.insert(
            name.clone(),
            ProbeRun {
                index,
                status,
                task,
            },
        );
    }

    /// Runs the init containers in order, each to successful completion before the next
    /// (sidecars — init containers with `restartPolicy: Always` — only need to be running).
    /// Failed ones restart unless the pod's policy is `Never`.
    async fn sync_init_containers(
        &self,
        st: &mut PodState,
        pod: &Pod,
        inits: &[Container],
        ctx: &FieldContext,
        policy: &str,
        changed: &mut bool,
    ) -> InitProgress {
        for (i, init) in inits.iter().enumerate() {
            let sidecar = is_sidecar(init);
            if is_simulated(init) && !sidecar {
                continue;
            }
            let exit = |st: &PodState| {
                st.record
                    .containers
                    .get(&init.name)
                    .and_then(|c| c.run.as_ref())
                    .map(|r| r.exit.clone())
            };
            if !sidecar && exit(st).flatten().is_some_and(|e| e.code == 0) {
                continue;
            }
            let init_policy = match (sidecar, policy) {
                (true, _) => "Always",
                (false, "Never") => "Never",
                (false, _) => "OnFailure",
            };
            *changed |= self.sync_container(st, pod, init, ctx, init_policy).await;
            let label = format!("init container {} ({}/{})", init.name, i + 1, inits.len());
            match exit(st) {
                Some(None) if sidecar => continue,
                Some(Some(e)) if e.code == 0 && !sidecar => continue,
                Some(Some(e)) if !restarts(init_policy, e.code) => {
                    return InitProgress::Failed {
                        note: format!("{label} failed with exit code {}", e.code),
                    };
                }
                _ => {}
            }
            let (status, _) = Self::container_status(st, pod, init);
            let state = status.state.unwrap_or_default();
            let detail = if state.running.is_some() {
                "is running".to_string()
            } else if let Some(w) = state.waiting {
                let reason = w.reason.unwrap_or_default();
                match w.message {
                    Some(m) => format!("is waiting ({reason}): {m}"),
                    None => format!("is waiting ({reason})"),
                }
            } else {
                "has not completed".to_string()
            };
            return InitProgress::Waiting {
                note: format!("{label} {detail}"),
            };
        }
        InitProgress::Done
    }

    /// Brings one container to what the spec asks. Returns whether the record changed.
    async fn sync_container(
        &self,
        st: &mut PodState,
        pod: &Pod,
        container: &Container,
        ctx: &FieldContext,
        policy: &str,
    ) -> bool {
        let name = container.name.clone();
        let now = now_ms();
        let rec = st.record.containers.entry(name.clone()).or_default();
        if is_simulated(container) {
            if rec.run.is_none() {
                rec.run = Some(RunRecord {
                    simulated: true,
                    started_at_ms: now,
                    ..Default::default()
                });
                return true;
            }
            return false;
        }
        let next_index = match &rec.run {
            None => Some(0),
            Some(run) => match &run.exit {
                None => None,
                Some(exit) if restarts(policy, exit.code) => {
                    let mut changed = false;
                    if rec.restart_at_ms.is_none() {
                        let ran = Duration::from_millis(
                            u64::try_from(exit.finished_at_ms - exit.started_at_ms).unwrap_or(0),
                        );
                        let current = rec.backoff_ms.map(Duration::from_millis);
                        let (wait, next) = self.inner.options.backoff.after_exit(current, ran);
                        rec.backoff_ms = Some(next.as_millis() as u64);
                        // Waits count from the exit, so time spent while no agent ran counts.
                        rec.restart_at_ms = Some(exit.finished_at_ms + wait.as_millis() as i64);
                        changed = true;
                    }
                    if rec.restart_at_ms.is_some_and(|at| at > now) {
                        return changed;
                    }
                    Some(run.index + 1)
                }
                Some(_) => None,
            },
        };
        let prepared = prepare(pod, container, ctx, &st.paths, st.volume_error.as_deref());
        let Some(index) = next_index else {
            // Running (perhaps adopted): make sure its probes run.
            if let Ok(p) = prepared {
                self.ensure_probes(st, pod, container, &p.env, &p.workdir);
            }
            return false;
        };
        let prepared = match prepared {
            Ok(p) => p,
            Err(err) => {
                st.errors.insert(name, err);
                return false;
            }
        };
        if let Err(err) = self.start_run(st, pod, container, prepared, index).await {
            st.errors.insert(name, err);
        }
        true
    }

    fn container_status(
        st: &PodState,
        pod: &Pod,
        container: &Container,
    ) -> (ContainerStatus, Disposition) {
        let name = &container.name;
        let image = container.image.clone().unwrap_or_default();
        let rec = st
            .record
            .containers
            .get(name)
            .cloned()
            .unwrap_or_else(ContainerRecord::default);
        let mut status = ContainerStatus {
            name: name.clone(),
            image: image.clone(),
            image_id: String::new(),
            restart_count: rec.restart_count,
            last_state: rec.last.as_ref().map(terminated_state),
            ready: false,
            started: Some(false),
            ..Default::default()
        };
        let Some(run) = &rec.run else {
            let (reason, message) = st
                .errors
                .get(name)
                .cloned()
                .unwrap_or_else(|| ("ContainerCreating".to_string(), String::new()));
            status.state = Some(waiting(&reason, (!message.is_empty()).then_some(message)));
            return (status, Disposition::NotStarted);
        };
        if run.simulated {
            status.image_id = format!("simulated://{image}");
            status.container_id = Some(format!("simulated://{}/{name}", st.record.uid));
            status.state = Some(running(run.started_at_ms));
            status.started = Some(true);
            status.ready = container.readiness_probe.is_none();
            return (status, Disposition::Active);
        }
        status.container_id = Some(container_id(run));
        let Some(exit) = &run.exit else {
            let probes = st.probes.get(name).filter(|p| p.index == run.index);
            let started = container.startup_probe.is_none()
                || probes.is_some_and(|p| p.status.started.load(Ordering::SeqCst));
            let ready = started
                && (container.readiness_probe.is_none()
                    || probes.is_some_and(|p| p.status.ready.load(Ordering::SeqCst)));
            status.state = Some(running(run.started_at_ms));
            status.started = Some(started);
            status.ready = ready;
            return (status, Disposition::Active);
        };
        match rec.restart_at_ms {
            Some(at) => {
                let delay =
                    Duration::from_millis(u64::try_from(at - exit.finished_at_ms).unwrap_or(0));
                let (pod_name, ns) = (st.record.name.as_str(), st.record.namespace.as_str());
                let message = format!(
                    "back-off {} restarting failed container={name} pod={pod_name}_{ns}({})",
                    format_delay(delay),
                    st.record.uid
                );
                status.state = Some(waiting("CrashLoopBackOff", Some(message)));
                status.last_state = Some(terminated_state(exit));
                (status, Disposition::Active)
            }
            None => {
                let policy = restart_policy(pod);
                status.state = Some(terminated_state(exit));
                if restarts(&policy, exit.code) {
                    // Restart pending but not scheduled yet (error while preparing).
                    (status, Disposition::Active)
                } else {
                    (status, Disposition::Done(exit.code))
                }
            }
        }
    }
}

/// Where a pod's init containers stand.
#[derive(Clone, Debug, PartialEq, Eq)]
enum InitProgress {
    /// All completed (or there are none): the app containers run.
    Done,
    /// One has not completed yet; the note says which and why.
    Waiting { note: String },
    /// One failed and will not be restarted: the pod has failed.
    Failed { note: String },
}

fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message,
        }),
        ..Default::default()
    }
}

fn running(started_ms: i64) -> ContainerState {
    ContainerState {
        running: Some(ContainerStateRunning {
            started_at: Some(time(started_ms)),
        }),
        ..Default::default()
    }
}

fn terminated_state(exit: &ExitRecord) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: exit.code,
            reason: Some(exit.reason.clone()),
            message: exit.message.clone(),
            started_at: Some(time(exit.started_at_ms)),
            finished_at: Some(time(exit.finished_at_ms)),
            container_id: Some(exit.container_id.clone()),
            signal: None,
        }),
        ..Default::default()
    }
}

#[async_trait]
impl PodRuntime for ProcessRuntime {
    async fn sync_pod(&self, pod: &Pod, node: &NodeContext) -> Result<RuntimeStatus, RuntimeError> {
        let meta = &pod.metadata;
        let uid = meta
            .uid
            .as_deref()
            // The uid names the pod's directory: it must stay one path component.
            .filter(|u| !u.is_empty() && !u.contains('/') && *u != "." && *u != "..")
            .ok_or_else(|| {
                RuntimeError::BadRequest("pod has no usable metadata.uid".to_string())
            })?;
        let (name, namespace) = (
            meta.name.clone().unwrap_or_default(),
            meta.namespace.clone().unwrap_or_default(),
        );
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        let host_ip = host_network.then_some(node.host_ip.as_str());
        let mut attempts = 0;
        let entry = loop {
            let entry = self
                .inner
                .pod_entry_or_create(uid, &namespace, &name, host_ip)?;
            // A concurrent kill_pod may have torn this entry down: take a fresh one.
            if !entry.lock().await.gone || attempts > 3 {
                break entry;
            }
            attempts += 1;
            tokio::task::yield_now().await;
        };
        // Read before the pod's lock is taken: they may wait on the API.
        let env = crate::env::gather(pod, node).await;
        let (volumes, volume_error) = match self.inner.volumes.prepare(pod, node).await {
            Ok(volumes) => (volumes, None),
            Err(e) => (crate::volumes::PodVolumes::default(), Some(e.to_string())),
        };
        // The kubelet reports each volume it cannot set up at every attempt.
        for message in volumes.failures() {
            self.inner.emit(RuntimeEvent {
                pod: RuntimePod {
                    uid: uid.to_string(),
                    namespace: namespace.clone(),
                    name: name.clone(),
                },
                field_path: None,
                warning: true,
                reason: "FailedMount".to_string(),
                message: message.to_string(),
            });
        }
        let mut guard = entry.lock().await;
        let st = &mut *guard;
        if host_ip.is_none() {
            self.ensure_pod_network(st).await?;
        }
        let mut changed = observe(&st.paths, &mut st.record);
        prune_probes(st);
        st.errors.clear();
        st.volume_error = volume_error;
        let ctx = FieldContext {
            pod_ip: st.record.ip.clone(),
            node_name: node.node_name.clone(),
            host_ip: node.host_ip.clone(),
            env: std::sync::Arc::new(env),
            volumes: std::sync::Arc::new(volumes),
        };
        let policy = restart_policy(pod);
        let containers = pod
            .spec
            .as_ref()
            .map(|s| s.containers.clone())
            .unwrap_or_default();
        let inits = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.clone())
            .unwrap_or_default();
        if st.evicted.is_none() {
            if let Some(message) = ctx.volumes.eviction() {
                changed |= self.evict(st, message).await;
            }
        }
        let progress = if st.evicted.is_some() {
            InitProgress::Done
        } else {
            self.sync_init_containers(st, pod, &inits, &ctx, &policy, &mut changed)
                .await
        };
        if st.evicted.is_some() {
            // Killed for good: nothing starts again.
        } else if progress == InitProgress::Done {
            for container in &containers {
                changed |= self.sync_container(st, pod, container, &ctx, &policy).await;
            }
        }
        if changed {
            st.record
                .save(&st.paths.record())
                .map_err(internal("saving pod record"))?;
        }
        let mut statuses = Vec::new();
        let mut dispositions = Vec::new();
        let mut notes = Vec::new();
        for container in &inits {
            if is_simulated(container) && !is_sidecar(container) {
                notes.push(format!(
                    "init container {} has no command; image {} is not pulled or run, it is simulated as completed",
                    container.name,
                    container.image.as_deref().unwrap_or("(none)")
                ));
            }
        }
        for container in &containers {
            let (mut status, disposition) = Self::container_status(st, pod, container);
            if progress != InitProgress::Done && disposition == Disposition::NotStarted {
                status.state = Some(waiting("PodInitializing", None));
            }
            if is_simulated(container) {
                notes.push(format!(
                    "container {} has no command; image {} is not pulled or run, the container is simulated",
                    container.name,
                    container.image.as_deref().unwrap_or("(none)")
                ));
            }
            statuses.push(status);
            dispositions.push(disposition);
        }
        let mut reason = (!notes.is_empty()).then(|| "SimulatedContainer".to_string());
        let mut phase = crate::status::pod_phase(&dispositions);
        match &progress {
            InitProgress::Done => {}
            InitProgress::Waiting { note } => {
                notes.insert(0, note.clone());
                reason = Some("PodInitializing".to_string());
            }
            InitProgress::Failed { note } => {
                notes.insert(0, note.clone());
                reason = Some("InitContainerFailed".to_string());
                phase = "Failed";
            }
        }
        if let Some(message) = &st.evicted {
            // Each container shows how its last run ended, not a restart that will not come.
            for status in &mut statuses {
                if status.state.as_ref().is_some_and(|s| s.waiting.is_some()) {
                    if let Some(last) = status.last_state.take() {
                        status.state = Some(last);
                    }
                }
                status.ready = false;
            }
            phase = "Failed";
            reason = Some(crate::volumes::emptydir::EVICTED_REASON.to_string());
            notes = vec![message.clone()];
        }
        let any_started = st.record.containers.values().any(|c| c.run.is_some());
        Ok(RuntimeStatus {
            pod_ip: Some(st.record.ip.clone()),
            phase: phase.to_string(),
            container_statuses: statuses,
            init_container_statuses: Vec::new(),
            start_time: any_started
                .then(|| Timestamp::from_millisecond(st.record.start_time_ms).ok())
                .flatten(),
            reason,
            message: (!notes.is_empty()).then(|| notes.join("; ")),
        })
    }

    async fn kill_pod(&self, pod: &RuntimePod, grace: Duration) -> Result<(), RuntimeError> {
        let Some(entry) = self.inner.pod_entry(&pod.uid) else {
            // Nothing runs; whatever was set up for it goes (idempotent).
            self.inner.forget_volumes(&pod.uid);
            self.forget_network(&pod.uid).await;
            return Ok(());
        };
        let mut st = entry.lock().await;
        if st.gone {
            return Ok(());
        }
        st.gone = true;
        for (_, p) in st.probes.drain() {
            p.task.abort();
        }
        let handles: Vec<RunHandle> = st
            .record
            .containers
            .iter()
            .filter_map(|(name, c)| {
                c.run
                    .as_ref()
                    .filter(|r| !r.simulated)
                    .map(|r| run_handle(&st.paths, name, r))
            })
            .collect();
        futures::future::join_all(handles.iter().map(|h| h.terminate(grace))).await;
        for h in &handles {
            h.kill_leftovers();
        }
        // The containers are gone, and with them their mount namespaces.
        self.inner.forget_volumes(&pod.uid);
        self.forget_network(&pod.uid).await;
        match std::fs::remove_dir_all(&st.paths.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(uid = %pod.uid, error = %e, "removing pod directory");
            }
            _ => {}
        }
        if let Ok(ip) = st.record.ip.parse() {
            lock(&self.inner.ips).remove(&ip);
        }
        lock(&self.inner.indexed).retain(|path, _| !path.starts_with(&st.paths.dir));
        lock(&self.inner.announced).retain(|(uid, _), _| *uid != pod.uid);
        lock(&self.inner.pods).remove(&pod.uid);
        tracing::info!(uid = %pod.uid, pod = %pod.name, "pod killed");
        Ok(())
    }

    /// A connection to the pod's address ([`portforward`]).
    async fn port_forward(
        &self,
        pod: &RuntimePod,
        port: u16,
    ) -> Result<Box<dyn crate::runtime::Duplex>, RuntimeError> {
        let entry = lock(&self.inner.pods).get(&pod.uid).cloned();
        let ip = match entry {
            Some(entry) => {
                let st = entry.lock().await;
                (!st.gone).then(|| st.record.ip.clone())
            }
            None => None,
        };
        let ip = ip.ok_or_else(|| RuntimeError::NotFound(format!("pod {:?}", pod.name)))?;
        portforward::connect(&ip, port).await
    }

    /// Each running container's process tree, measured from `/proc` (see
    /// [`crate::stats::procfs::ProcTable::tree_usage`] for what is approximated).
    async fn stats(&self) -> Result<crate::stats::RuntimeStats, RuntimeError> {
        use crate::stats::{ContainerStats, PodStats};
        let table = tokio::task::spawn_blocking(crate::stats::procfs::ProcTable::read)
            .await
            .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        let ms = |t: i64| Timestamp::from_millisecond(t).unwrap_or(Timestamp::UNIX_EPOCH);
        let entries: Vec<_> = lock(&self.inner.pods).values().cloned().collect();
        let mut pods = Vec::with_capacity(entries.len());
        for entry in entries {
            let st = entry.lock().await;
            if st.gone {
                continue;
            }
            let containers: Vec<ContainerStats> = st
                .record
                .containers
                .iter()
                .filter_map(|(name, c)| {
                    let run = c
                        .run
                        .as_ref()
                        .filter(|r| r.exit.is_none() && !r.simulated)?;
                    let (pid, start) = match run.pid {
                        Some(pid) => (pid, run.pid_start),
                        None => (run.wrapper_pid, Some(run.wrapper_start)),
                    };
                    Some(ContainerStats {
                        name: name.clone(),
                        start_time: ms(run.started_at_ms),
                        usage: table.tree_usage(pid, start)?,
                    })
                })
                .collect();
            if containers.is_empty() {
                continue;
            }
            pods.push(PodStats {
                pod: RuntimePod {
                    uid: st.record.uid.clone(),
                    namespace: st.record.namespace.clone(),
                    name: st.record.name.clone(),
                },
                start_time: ms(st.record.start_time_ms),
                containers,
            });
        }
        Ok(crate::stats::RuntimeStats {
            pods,
            node: None,
            errors: Vec::new(),
        })
    }

    async fn pods(&self) -> Vec<RuntimePod> {
        let entries: Vec<_> = lock(&self.inner.pods).values().cloned().collect();
        let mut out = Vec::new();
        for entry in entries {
            let st = entry.lock().await;
            if !st.gone {
                out.push(RuntimePod {
                    uid: st.record.uid.clone(),
                    namespace: st.record.namespace.clone(),
                    name: st.record.name.clone(),
                });
            }
        }
        out
    }

    fn subscribe(&self) -> mpsc::UnboundedReceiver<String> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.inner.subscribers).push(tx);
        rx
    }

    fn events(&self) -> Option<mpsc::UnboundedReceiver<RuntimeEvent>> {
        let (tx, rx) = mpsc::unbounded_channel();
        *lock(&self.inner.events) = Some(tx);
        Some(rx)
    }

    async fn exec(
        &self,
        pod: &RuntimePod,
        request: ExecRequest,
        io: StreamIo,
    ) -> Result<i32, RuntimeError> {
        self.exec_command(pod, request, io).await
    }

    async fn attach(
        &self,
        pod: &RuntimePod,
        container: &str,
        _tty: bool,
        io: StreamIo,
    ) -> Result<(), RuntimeError> {
        // Workloads never run on a terminal here; the output is the same either way.
        self.attach_container(pod, container, io).await
    }

    async fn logs(
        &self,
        pod: &RuntimePod,
        container: &str,
        options: &LogOptions,
    ) -> Result<LogStream, RuntimeError> {
        let entry = self
            .inner
            .pod_entry(&pod.uid)
            .ok_or_else(|| RuntimeError::NotFound(format!("pod {}/{}", pod.namespace, pod.name)))?;
        let st = entry.lock().await;
        let rec = st.record.containers.get(container).ok_or_else(|| {
            RuntimeError::NotFound(format!(
                "container {container} in pod {}/{}",
                pod.namespace, pod.name
            ))
        })?;
        let Some(run) = &rec.run else {
            return Err(RuntimeError::BadRequest(format!(
                "container \"{container}\" in pod \"{}\" is waiting to start",
                pod.name
            )));
        };
        let no_previous = || {
            RuntimeError::BadRequest(format!(
                "previous terminated container \"{container}\" in pod \"{}\" not found",
                pod.name
            ))
        };
        if run.simulated {
            if options.previous {
                return Err(no_previous());
            }
            return Ok(Box::pin(futures::stream::empty()));
        }
        let index = if options.previous {
            run.index.checked_sub(1).ok_or_else(no_previous)?
        } else {
            run.index
        };
        let log = st.paths.run_file(container, index, "log");
        let active = (!options.previous && run.exit.is_none())
            .then(|| run_handle(&st.paths, container, run));
        drop(st);
        logs::open(&log, options, active)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_policy_decides_restarts() {
        assert!(restarts("Always", 0));
        assert!(restarts("OnFailure", 1));
        assert!(!restarts("OnFailure", 0));
        assert!(!restarts("Never", 1));
    }

    #[test]
    fn spec_env_overrides_the_base() {
        let env = full_env(
            vec![
                ("PATH".into(), "/bin".into()),
                ("HOSTNAME".into(), "p".into()),
            ],
            vec![("PATH".into(), "/opt".into())],
        );
        assert_eq!(
            env,
            [
                ("HOSTNAME".to_string(), "p".to_string()),
                ("PATH".to_string(), "/opt".to_string())
            ]
        );
    }
}
