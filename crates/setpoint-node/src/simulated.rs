//! A [`PodRuntime`] without processes, for loading a cluster with many nodes from one process.
//!
//! Each container goes `Waiting (ContainerCreating)` → `Running` after
//! [`SimulatedConfig::start_delay`] → ready after [`SimulatedConfig::ready_delay`]. With
//! probability [`SimulatedConfig::failure_rate`] a run ends with exit code 1 after
//! [`SimulatedConfig::fail_after`]; the container is then restarted as `restartPolicy` says,
//! waiting out a CrashLoopBackOff-style back-off (base doubling to a cap), or stays terminated
//! under `Never` (the pod then fails). Simulated containers never finish on their own,
//! unless the pod's [`SIMULATED_SUCCEED_AFTER_ANNOTATION`] gives each run a length: a run then
//! exits with code 0 after it (unless it fails first), and is restarted only under `Always`;
//! a pod whose containers all exited 0 succeeds (a Job's pods complete).
//!
//! Simulated containers outlive their agent, as a real node's processes do: a runtime that
//! meets a pod it does not hold, whose status a simulated runtime wrote (container IDs of the
//! `simulated://` scheme), takes it up where that status left it (address, start times,
//! restart counts, readiness), so an agent that restarts writes no status that is already
//! right instead of starting every pod again.
//!
//! Nothing pretends to be real: image IDs and container IDs use the `simulated://` scheme, the
//! pod's status message says it is simulated, and logs are a one-line note.
//!
//! Usage is steered, not measured: each running container uses the CPU and memory the pod's
//! [`SIMULATED_CPU_ANNOTATION`] and [`SIMULATED_MEMORY_ANNOTATION`] say (`140m`, `64Mi`;
//! none means zero), its cumulative CPU growing at that rate while it runs (a changed
//! annotation takes effect at the pod's next sync), and the node uses the sum of its pods plus
//! [`NODE_BASE_CPU_MILLIS`] and [`NODE_BASE_MEMORY_BYTES`] for itself.
//!
//! Load can also be shared: [`SIMULATED_CPU_TOTAL_ANNOTATION`] and
//! [`SIMULATED_MEMORY_TOTAL_ANNOTATION`] give a total that the running pods of one controller
//! (the same controller ownerReference uid) split evenly, each pod's part split evenly among
//! its containers, so a workload's utilization falls as it scales out (an autoscaler then has
//! a steady state). The runtimes of one simulation host count members through one
//! [`SharedLoad`]; pods hosted elsewhere are not counted. A pod is a member from the first
//! sync or stats read that finds a container of it running until none is, or it is killed.
//!
//! State advances lazily: every `sync_pod` computes where each container is *now* (tokio
//! time, so tests can pause the clock), and the runtime schedules one wake-up per pod at its
//! next transition to tell the agent to sync again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;
use rand::Rng;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::runtime::{
    LogOptions, LogStream, NodeContext, PodRuntime, RuntimeError, RuntimePod, RuntimeStatus,
};
use crate::stats::{
    ContainerStats, NodeUsage, PodStats, RuntimeStats, Usage, SIMULATED_CPU_ANNOTATION,
    SIMULATED_CPU_TOTAL_ANNOTATION, SIMULATED_MEMORY_ANNOTATION, SIMULATED_MEMORY_TOTAL_ANNOTATION,
};
use crate::status::{now as now_truncated, pod_phase, truncate, wall_now, Disposition};

/// The CPU a simulated node uses for itself, beside its pods (millicores).
pub const NODE_BASE_CPU_MILLIS: u64 = 100;
/// The memory a simulated node uses for itself, beside its pods.
pub const NODE_BASE_MEMORY_BYTES: u64 = 256 * 1024 * 1024;

/// The `containerRuntimeVersion` a node running this runtime reports.
pub const RUNTIME_VERSION: &str = "setpoint-simulated://0.1";

/// The pod status message of every simulated pod.
pub const SIMULATED_MESSAGE: &str = "containers are simulated by setpoint: no processes run";

/// The annotation giving the length of each run of a simulated pod's containers, in
/// milliseconds (`"2000"`): a run exits with code 0 after it. Without it a run never ends.
pub const SIMULATED_SUCCEED_AFTER_ANNOTATION: &str = "setpoint.dev/simulated-succeed-after-ms";

/// How long each run of `pod`'s containers lasts before exiting 0: none without the
/// annotation, or why its value is invalid.
fn run_length(pod: &Pod) -> Result<Option<Duration>, String> {
    let annotations = pod.metadata.annotations.as_ref();
    let Some(v) = annotations.and_then(|a| a.get(SIMULATED_SUCCEED_AFTER_ANNOTATION)) else {
        return Ok(None);
    };
    v.parse::<u64>()
        .map(|ms| Some(Duration::from_millis(ms)))
        .map_err(|_| {
            format!("{SIMULATED_SUCCEED_AFTER_ANNOTATION}: {v:?} is not a number of milliseconds")
        })
}

/// How simulated containers behave.
#[derive(Clone, Debug, PartialEq)]
pub struct SimulatedConfig {
    /// From first sync to `Running`.
    pub start_delay: Duration,
    /// From `Running` to `ready: true`.
    pub ready_delay: Duration,
    /// Probability (0.0–1.0) that a run of a container fails.
    pub failure_rate: f64,
    /// How long a failing run lasts before it exits with code 1.
    pub fail_after: Duration,
    /// First restart back-off after a failure; doubles per restart (Kubernetes: 10 s).
    pub backoff_base: Duration,
    /// Back-off cap (Kubernetes: 5 min).
    pub backoff_max: Duration,
}

impl Default for SimulatedConfig {
    fn default() -> Self {
        SimulatedConfig {
            start_delay: Duration::from_secs(1),
            ready_delay: Duration::from_secs(1),
            failure_rate: 0.0,
            fail_after: Duration::from_secs(5),
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
        }
    }
}

/// Pod IPs are unique within the process: 10.64.0.0/10 from one counter.
static NEXT_IP: AtomicU32 = AtomicU32::new(1);

fn next_pod_ip() -> String {
    let n = NEXT_IP.fetch_add(1, Ordering::Relaxed);
    format!(
        "10.{}.{}.{}",
        64 + ((n >> 16) & 63),
        (n >> 8) & 255,
        n & 255
    )
}

#[derive(Clone, Debug)]
enum State {
    /// Not running; becomes Running at `until`. `crashed` marks a back-off after a failure.
    Waiting { until: Instant, crashed: bool },
    /// Running since `since`; `ends` at a time with an exit code if this run is one that
    /// fails, or one of a pod whose runs have a length.
    Running {
        since: Instant,
        ends: Option<(Instant, i32)>,
    },
    /// Exited and not restarted (`restartPolicy: Never`).
    Terminated,
}

#[derive(Clone, Debug)]
struct SimContainer {
    name: String,
    image: String,
    state: State,
    restart_count: i32,
    /// The previous run's end, for `lastState`.
    last_terminated: Option<ContainerStateTerminated>,
    /// The current run's CPU meter: (the run's start, core-nanoseconds used up to
    /// `folded_at`, `folded_at`), folded whenever the pod's rate changes.
    meter: Option<(Instant, u64, Instant)>,
    /// (the run's start, the pod's shared CPU figure when this run was first seen): the run
    /// counts the shared CPU from there, as a restarted container's counters start at zero.
    shared_mark: Option<(Instant, u64)>,
}

impl SimContainer {
    /// The core-nanoseconds the current run has used by `now` at `millis` since the last fold.
    fn cpu_used(&mut self, millis: u64, now: Instant) -> Option<(Instant, u64)> {
        let State::Running { since, ends } = self.state else {
            return None;
        };
        let meter = match self.meter {
            Some(m) if m.0 == since => m,
            // A new run starts from zero, as a restarted container's counters do.
            _ => (since, 0, since),
        };
        self.meter = Some(meter);
        let end = ends.map_or(now, |(f, _)| f.min(now));
        let ran = end.saturating_duration_since(meter.2).as_nanos() as u64;
        Some((since, meter.1 + ran.saturating_mul(millis) / 1000))
    }

    /// Folds the run's usage up to `now` at the old rate, before the rate changes.
    fn fold(&mut self, millis: u64, now: Instant) {
        if let Some((since, used)) = self.cpu_used(millis, now) {
            self.meter = Some((since, used, now));
        }
    }
}

#[derive(Debug)]
struct SimPod {
    namespace: String,
    name: String,
    pod_ip: String,
    start_time: Timestamp,
    restart_policy: String,
    /// How long each run lasts before exiting 0 ([`SIMULATED_SUCCEED_AFTER_ANNOTATION`]), or
    /// why the annotation is invalid (the pod's status message says so).
    run_length: Result<Option<Duration>, String>,
    containers: Vec<SimContainer>,
    /// The wake-up already scheduled, so one is not scheduled twice.
    wake_at: Option<Instant>,
    /// Each running container's steered CPU (millicores) and memory (bytes).
    usage: (u64, u64),
    /// Why the usage annotations could not be read, if they could not.
    usage_error: Option<String>,
    /// The shared load this pod takes part in, if its annotations give one.
    share: Option<Share>,
    /// Shared CPU (core-nanoseconds) of memberships that ended, so the figure never falls.
    shared_banked_ns: u64,
}

/// A pod's part in a [`SharedLoad`] group.
#[derive(Debug, Clone, PartialEq)]
struct Share {
    /// The group: the controller's uid (the pod's own without a controller).
    owner: String,
    /// The group's totals as this pod's annotations give them: (millicores, bytes).
    totals: (u64, u64),
    /// While a member: the group's per-member CPU figure when it joined.
    mark: Option<u64>,
}

/// One controller's shared load.
#[derive(Debug)]
struct LoadGroup {
    totals: (u64, u64),
    members: u64,
    /// Core-nanoseconds one member has used since the group began, as of `at`.
    per_member_ns: u64,
    at: Instant,
}

impl LoadGroup {
    /// Brings `per_member_ns` up to `now` at the current totals and membership.
    fn settle(&mut self, now: Instant) {
        if now <= self.at {
            return;
        }
        if self.members > 0 {
            let ran = now.duration_since(self.at).as_nanos();
            let part = ran * u128::from(self.totals.0) / 1000 / u128::from(self.members);
            self.per_member_ns = self
                .per_member_ns
                .saturating_add(u64::try_from(part).unwrap_or(u64::MAX));
        }
        self.at = now;
    }
}

/// The loads shared by the pods of each controller, across the runtimes of one simulation
/// host (see the module docs). Cloning shares the same groups.
#[derive(Clone, Debug, Default)]
pub struct SharedLoad {
    groups: Arc<Mutex<HashMap<String, LoadGroup>>>,
}

impl SharedLoad {
    /// No groups yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a member to `owner`'s group (its totals now `totals`): the per-member figure then.
    fn join(&self, owner: &str, totals: (u64, u64), now: Instant) -> u64 {
        let mut groups = self.groups.lock();
        let g = groups.entry(owner.to_string()).or_insert(LoadGroup {
            totals,
            members: 0,
            per_member_ns: 0,
            at: now,
        });
        g.settle(now);
        g.totals = totals;
        g.members += 1;
        g.per_member_ns
    }

    /// Removes a member from `owner`'s group: the per-member figure then.
    fn leave(&self, owner: &str, now: Instant) -> u64 {
        let mut groups = self.groups.lock();
        let Some(g) = groups.get_mut(owner) else {
            return 0;
        };
        g.settle(now);
        g.members = g.members.saturating_sub(1);
        let figure = g.per_member_ns;
        if g.members == 0 {
            groups.remove(owner);
        }
        figure
    }

    /// `owner`'s per-member CPU figure and memory part now.
    fn read(&self, owner: &str, now: Instant) -> (u64, u64) {
        let mut groups = self.groups.lock();
        let Some(g) = groups.get_mut(owner) else {
            return (0, 0);
        };
        g.settle(now);
        (g.per_member_ns, g.totals.1 / g.members.max(1))
    }

    /// How many pods share `owner`'s load now.
    pub fn members(&self, owner: &str) -> u64 {
        self.groups.lock().get(owner).map_or(0, |g| g.members)
    }
}

/// The shared load a pod's annotations steer: its group and totals, none without the
/// annotations, or why they are invalid.
fn steered_share(pod: &Pod) -> Result<Option<Share>, String> {
    let annotations = pod.metadata.annotations.as_ref();
    let get = |k: &str| annotations.and_then(|a| a.get(k));
    let (cpu, memory) = (
        get(SIMULATED_CPU_TOTAL_ANNOTATION),
        get(SIMULATED_MEMORY_TOTAL_ANNOTATION),
    );
    if cpu.is_none() && memory.is_none() {
        return Ok(None);
    }
    let cpu = match cpu {
        Some(v) => setpoint_api::quantity::milli_cpu(v)
            .map_err(|e| format!("{SIMULATED_CPU_TOTAL_ANNOTATION}: {v:?}: {e}"))?,
        None => 0,
    };
    let memory = match memory {
        Some(v) => setpoint_api::quantity::units(v)
            .map_err(|e| format!("{SIMULATED_MEMORY_TOTAL_ANNOTATION}: {v:?}: {e}"))?,
        None => 0,
    };
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.clone())
        .or_else(|| pod.metadata.uid.clone())
        .unwrap_or_default();
    Ok(Some(Share {
        owner,
        totals: (cpu.max(0) as u64, memory.max(0) as u64),
        mark: None,
    }))
}

/// A container's cumulative CPU now: its own steered rate's meter plus its part of the pod's
/// shared figure `shared` since the run began, split among `n` containers.
fn container_cpu(
    c: &mut SimContainer,
    millis: u64,
    shared: u64,
    n: u64,
    now: Instant,
) -> Option<(Instant, u64)> {
    let (since, used) = c.cpu_used(millis, now)?;
    let mark = match c.shared_mark {
        Some((t, m)) if t == since => m,
        _ => shared,
    };
    c.shared_mark = Some((since, mark));
    Some((since, used + shared.saturating_sub(mark) / n.max(1)))
}

/// The usage a pod's annotations steer: (millicores, bytes), or why they are invalid.
fn steered_usage(pod: &Pod) -> Result<(u64, u64), String> {
    let annotations = pod.metadata.annotations.as_ref();
    let get = |k: &str| annotations.and_then(|a| a.get(k));
    let cpu = match get(SIMULATED_CPU_ANNOTATION) {
        Some(v) => setpoint_api::quantity::milli_cpu(v)
            .map_err(|e| format!("{SIMULATED_CPU_ANNOTATION}: {v:?}: {e}"))?,
        None => 0,
    };
    let memory = match get(SIMULATED_MEMORY_ANNOTATION) {
        Some(v) => setpoint_api::quantity::units(v)
            .map_err(|e| format!("{SIMULATED_MEMORY_ANNOTATION}: {v:?}: {e}"))?,
        None => 0,
    };
    Ok((cpu.max(0) as u64, memory.max(0) as u64))
}

/// Simulated containers for one node.
pub struct SimulatedRuntime {
    config: SimulatedConfig,
    pods: Mutex<HashMap<String, SimPod>>,
    notify: Arc<Mutex<Option<mpsc::UnboundedSender<String>>>>,
    /// When the node started (its base usage runs from then).
    started: (Instant, Timestamp),
    /// CPU of pods no longer held, so the node's cumulative figure never falls.
    retired_cpu_ns: std::sync::atomic::AtomicU64,
    /// The shared loads, common to every runtime of the simulation host.
    load: SharedLoad,
}

impl SimulatedRuntime {
    /// The pods held that `keep` selects, copied out (only those).
    fn held(&self, keep: impl Fn(&SimPod) -> bool) -> Vec<RuntimePod> {
        self.pods
            .lock()
            .iter()
            .filter(|(_, p)| keep(p))
            .map(|(uid, p)| RuntimePod {
                uid: uid.clone(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
            })
            .collect()
    }

    /// A runtime holding no pods, counting shared loads among its own pods only.
    pub fn new(config: SimulatedConfig) -> Self {
        Self::with_shared_load(config, SharedLoad::new())
    }

    /// A runtime holding no pods, counting shared loads in `load` with the other runtimes
    /// given the same one.
    pub fn with_shared_load(config: SimulatedConfig, load: SharedLoad) -> Self {
        SimulatedRuntime {
            config,
            pods: Mutex::new(HashMap::new()),
            notify: Arc::new(Mutex::new(None)),
            started: (Instant::now(), now_truncated()),
            retired_cpu_ns: std::sync::atomic::AtomicU64::new(0),
            load,
        }
    }

    /// Updates `pod`'s membership of its shared load to what its containers are doing now,
    /// and marks runs first seen: the pod's shared CPU figure and memory part.
    fn observe_share(&self, pod: &mut SimPod, now: Instant) -> (u64, u64) {
        let running = pod
            .containers
            .iter()
            .any(|c| matches!(c.state, State::Running { .. }));
        let (shared, memory) = match pod.share.as_mut() {
            None => (pod.shared_banked_ns, 0),
            Some(share) => {
                match (running, share.mark) {
                    (true, None) => {
                        share.mark = Some(self.load.join(&share.owner, share.totals, now));
                    }
                    (false, Some(mark)) => {
                        let figure = self.load.leave(&share.owner, now);
                        pod.shared_banked_ns += figure.saturating_sub(mark);
                        share.mark = None;
                    }
                    _ => {}
                }
                match share.mark {
                    Some(mark) => {
                        let (figure, memory) = self.load.read(&share.owner, now);
                        (pod.shared_banked_ns + figure.saturating_sub(mark), memory)
                    }
                    None => (pod.shared_banked_ns, 0),
                }
            }
        };
        let n = pod.containers.len() as u64;
        let millis = pod.usage.0;
        for c in &mut pod.containers {
            container_cpu(c, millis, shared, n, now);
        }
        (shared, memory)
    }

    /// Ends `pod`'s membership of its shared load, banking what it used.
    fn leave_share(&self, pod: &mut SimPod, now: Instant) {
        if let Some(share) = pod.share.as_mut() {
            if let Some(mark) = share.mark.take() {
                let figure = self.load.leave(&share.owner, now);
                pod.shared_banked_ns += figure.saturating_sub(mark);
            }
        }
    }

    /// How long the back-off after the `restarts`-th restart lasts.
    fn backoff(&self, restarts: i32) -> Duration {
        let factor = 2u32.saturating_pow(restarts.clamp(0, 30) as u32);
        self.config
            .backoff_base
            .saturating_mul(factor)
            .min(self.config.backoff_max)
    }

    fn run_fails(&self) -> bool {
        self.config.failure_rate > 0.0 && rand::rng().random::<f64>() < self.config.failure_rate
    }

    /// Moves every container of `pod` through the transitions due by `now`.
    fn advance(&self, pod: &mut SimPod, now: Instant) {
        let run_length = pod.run_length.clone().ok().flatten();
        for c in &mut pod.containers {
            loop {
                match c.state.clone() {
                    State::Waiting { until, crashed } if until <= now => {
                        if crashed {
                            c.restart_count += 1;
                        }
                        let fails = self
                            .run_fails()
                            .then(|| (until + self.config.fail_after, 1));
                        let succeeds = run_length.map(|l| (until + l, 0));
                        // Whichever comes first; a failure on a tie.
                        let ends = match (fails, succeeds) {
                            (Some(f), Some(s)) => Some(if s.0 < f.0 { s } else { f }),
                            (f, s) => f.or(s),
                        };
                        c.state = State::Running { since: until, ends };
                    }
                    State::Running {
                        since,
                        ends: Some((t, code)),
                    } if t <= now => {
                        // As the kubelet: `Always` restarts any exit, `OnFailure` a failed one.
                        let restart = match pod.restart_policy.as_str() {
                            "Never" => false,
                            "OnFailure" => code != 0,
                            _ => true,
                        };
                        c.last_terminated = Some(ContainerStateTerminated {
                            exit_code: code,
                            reason: Some(if code == 0 { "Completed" } else { "Error" }.into()),
                            message: (code != 0).then(|| "simulated failure".into()),
                            started_at: Some(Time(wall(since, now))),
                            finished_at: Some(Time(wall(t, now))),
                            container_id: Some(container_id(&pod.pod_ip, &c.name, c.restart_count)),
                            signal: None,
                        });
                        c.state = if restart {
                            State::Waiting {
                                until: t + self.backoff(c.restart_count),
                                crashed: true,
                            }
                        } else {
                            State::Terminated
                        };
                    }
                    _ => break,
                }
            }
        }
    }

    /// The earliest future transition of any container (including turning ready).
    fn next_transition(&self, pod: &SimPod, now: Instant) -> Option<Instant> {
        pod.containers
            .iter()
            .filter_map(|c| match c.state {
                State::Waiting { until, .. } => Some(until),
                State::Running { since, ends } => {
                    let ready_at = since + self.config.ready_delay;
                    match ends.map(|(t, _)| t) {
                        Some(f) if ready_at <= now => Some(f),
                        Some(f) => Some(f.min(ready_at)),
                        None => (ready_at > now).then_some(ready_at),
                    }
                }
                State::Terminated => None,
            })
            .min()
    }

    fn status(&self, pod: &SimPod, now: Instant) -> RuntimeStatus {
        let statuses: Vec<ContainerStatus> = pod
            .containers
            .iter()
            .map(|c| self.container_status(pod, c, now))
            .collect();
        let all_terminated = pod
            .containers
            .iter()
            .all(|c| matches!(c.state, State::Terminated));
        let active = pod.containers.iter().any(|c| {
            matches!(
                c.state,
                State::Running { .. } | State::Waiting { crashed: true, .. }
            )
        });
        let phase = if all_terminated && !pod.containers.is_empty() {
            // Every container finished: Succeeded when all exited 0, else Failed.
            let done: Vec<Disposition> = pod
                .containers
                .iter()
                .map(|c| Disposition::Done(c.last_terminated.as_ref().map_or(1, |t| t.exit_code)))
                .collect();
            pod_phase(&done)
        } else if active {
            "Running"
        } else {
            "Pending"
        };
        RuntimeStatus {
            pod_ip: Some(pod.pod_ip.clone()),
            phase: phase.into(),
            container_statuses: statuses,
            init_container_statuses: Vec::new(),
            start_time: Some(pod.start_time),
            message: Some(match &pod.run_length {
                Err(e) => format!("{SIMULATED_MESSAGE}; {e}"),
                Ok(_) => SIMULATED_MESSAGE.into(),
            }),
            reason: None,
        }
    }

    fn container_status(&self, pod: &SimPod, c: &SimContainer, now: Instant) -> ContainerStatus {
        let (state, ready, started) = match &c.state {
            State::Waiting { crashed: false, .. } => (
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("ContainerCreating".into()),
                        message: None,
                    }),
                    ..Default::default()
                },
                false,
                false,
            ),
            State::Waiting { crashed: true, .. } => (
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("CrashLoopBackOff".into()),
                        message: Some(format!(
                            "back-off {}s restarting failed container={} pod={}",
                            self.backoff(c.restart_count).as_secs(),
                            c.name,
                            pod.name
                        )),
                    }),
                    ..Default::default()
                },
                false,
                false,
            ),
            State::Running { since, .. } => (
                ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(wall(*since, now))),
                    }),
                    ..Default::default()
                },
                *since + self.config.ready_delay <= now,
                true,
            ),
            State::Terminated => (
                ContainerState {
                    terminated: c.last_terminated.clone(),
                    ..Default::default()
                },
                false,
                false,
            ),
        };
        let running_or_done = !matches!(c.state, State::Waiting { crashed: false, .. });
        let last_state = match c.state {
            State::Terminated => None,
            _ => c.last_terminated.clone().map(|t| ContainerState {
                terminated: Some(t),
                ..Default::default()
            }),
        };
        ContainerStatus {
            name: c.name.clone(),
            image: c.image.clone(),
            image_id: format!("simulated://{}", c.image),
            container_id: running_or_done
                .then(|| container_id(&pod.pod_ip, &c.name, c.restart_count)),
            ready,
            started: Some(started),
            restart_count: c.restart_count,
            state: Some(state),
            last_state,
            ..Default::default()
        }
    }

    /// Schedules a notification at `at` unless one is already due then.
    fn wake(&self, uid: &str, pod: &mut SimPod, at: Option<Instant>) {
        let Some(at) = at else { return };
        if pod.wake_at == Some(at) {
            return;
        }
        pod.wake_at = Some(at);
        let notify = self.notify.clone();
        let uid = uid.to_string();
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            if let Some(tx) = notify.lock().as_ref() {
                let _ = tx.send(uid);
            }
        });
    }

    fn send(&self, uid: &str) {
        if let Some(tx) = self.notify.lock().as_ref() {
            let _ = tx.send(uid.to_string());
        }
    }
}

/// The wall-clock time of a tokio instant in the past (or now).
fn wall(at: Instant, now: Instant) -> Timestamp {
    let ago = now.saturating_duration_since(at);
    let t = wall_now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::try_from(ago).unwrap_or_default())
        .unwrap_or(Timestamp::UNIX_EPOCH);
    truncate(t)
}

fn container_id(pod_ip: &str, name: &str, run: i32) -> String {
    format!("simulated://{pod_ip}/{name}/{run}")
}

/// The tokio instant of a wall-clock time in the past, as seen at `now`: half a second past
/// the (whole-second) time given, so [`wall`] truncates it back to the same second.
fn instant_of(t: Timestamp, now: Instant) -> Instant {
    // A time ahead of this clock (another host's) counts as now.
    let ago = Duration::try_from(wall_now().duration_since(t)).unwrap_or_default();
    now.checked_sub(ago)
        .map_or(now, |at| (at + Duration::from_millis(500)).min(now))
}

/// The address counter value of a pod IP [`next_pod_ip`] hands out, if it is one.
fn pod_ip_index(ip: &str) -> Option<u32> {
    let octets: Vec<u32> = ip
        .split('.')
        .map(|o| o.parse().ok())
        .collect::<Option<_>>()?;
    match octets[..] {
        [10, a, b, c] if (64..128).contains(&a) && b < 256 && c < 256 => {
            Some(((a - 64) << 16) | (b << 8) | c)
        }
        _ => None,
    }
}

impl SimulatedRuntime {
    /// The pod as the status a simulated runtime wrote for it shows it, when there is one:
    /// the containers of a simulated node outlive its agent as a real node's processes do, so
    /// an agent that restarts finds them where the API last saw them (same address, start
    /// times, restart counts, readiness) instead of starting every pod again. The status
    /// this runtime then reports is the one the API holds, and nothing is written.
    fn adopt(&self, pod: &Pod, now: Instant) -> Option<SimPod> {
        let status = pod.status.as_ref()?;
        let pod_ip = status.pod_ip.clone()?;
        let start_time = status.start_time.as_ref()?.0;
        let statuses = status.container_statuses.as_deref().unwrap_or_default();
        // Only what a simulated runtime wrote: its container IDs name the `simulated` scheme.
        if statuses.is_empty()
            || statuses
                .iter()
                .filter_map(|c| c.container_id.as_deref())
                .any(|id| !id.starts_with("simulated://"))
        {
            return None;
        }
        // New pods must not be handed the addresses of the pods found again.
        if let Some(n) = pod_ip_index(&pod_ip) {
            NEXT_IP.fetch_max(n + 1, Ordering::Relaxed);
        }
        let spec = pod.spec.clone().unwrap_or_default();
        let run_length = run_length(pod);
        let runs_for = run_length.clone().ok().flatten();
        let containers = spec
            .containers
            .iter()
            .map(|c| {
                let found = statuses.iter().find(|s| s.name == c.name);
                let restart_count = found.map_or(0, |s| s.restart_count);
                let state = found.and_then(|s| s.state.as_ref());
                let last = found
                    .and_then(|s| s.last_state.as_ref())
                    .and_then(|l| l.terminated.clone());
                let fresh = State::Waiting {
                    until: now + self.config.start_delay,
                    crashed: false,
                };
                let (state, last_terminated) = match state {
                    Some(ContainerState {
                        running: Some(r), ..
                    }) => {
                        let mut since = r.started_at.as_ref().map_or(now, |t| instant_of(t.0, now));
                        // Ready in the API: ready here too, whatever the second truncated away.
                        if found.is_some_and(|s| s.ready) {
                            since = since
                                .min(now.checked_sub(self.config.ready_delay).unwrap_or(since));
                        }
                        // The run's end: its length from its start, or a failure drawn anew.
                        let fails = self.run_fails().then(|| (now + self.config.fail_after, 1));
                        let succeeds = runs_for.map(|l| (since + l, 0));
                        let ends = match (fails, succeeds) {
                            (Some(f), Some(s)) => Some(if s.0 < f.0 { s } else { f }),
                            (f, s) => f.or(s),
                        };
                        (State::Running { since, ends }, last)
                    }
                    Some(ContainerState {
                        terminated: Some(t),
                        ..
                    }) => (State::Terminated, Some(t.clone())),
                    Some(ContainerState {
                        waiting: Some(w), ..
                    }) if w.reason.as_deref() == Some("CrashLoopBackOff") => (
                        State::Waiting {
                            until: now + self.backoff(restart_count),
                            crashed: true,
                        },
                        last,
                    ),
                    _ => (fresh, last),
                };
                SimContainer {
                    name: c.name.clone(),
                    // The image it runs: one changed in the spec meanwhile restarts it.
                    image: found
                        .map(|s| s.image.clone())
                        .unwrap_or_else(|| c.image.clone().unwrap_or_default()),
                    state,
                    restart_count,
                    last_terminated,
                    meter: None,
                    shared_mark: None,
                }
            })
            .collect();
        Some(SimPod {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            pod_ip,
            start_time,
            restart_policy: spec.restart_policy.unwrap_or_else(|| "Always".into()),
            run_length,
            containers,
            wake_at: None,
            usage: (0, 0),
            usage_error: None,
            share: None,
            shared_banked_ns: 0,
        })
    }
}

#[async_trait]
impl PodRuntime for SimulatedRuntime {
    async fn sync_pod(
        &self,
        pod: &Pod,
        _node: &NodeContext,
    ) -> Result<RuntimeStatus, RuntimeError> {
        let uid = pod
            .metadata
            .uid
            .clone()
            .ok_or_else(|| RuntimeError::BadRequest("pod has no uid".into()))?;
        let now = Instant::now();
        let mut pods = self.pods.lock();
        if !pods.contains_key(&uid) {
            if let Some(adopted) = self.adopt(pod, now) {
                pods.insert(uid.clone(), adopted);
            }
        }
        let entry = pods.entry(uid.clone()).or_insert_with(|| {
            let spec = pod.spec.clone().unwrap_or_default();
            SimPod {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                pod_ip: next_pod_ip(),
                start_time: now_truncated(),
                restart_policy: spec.restart_policy.unwrap_or_else(|| "Always".into()),
                run_length: run_length(pod),
                containers: spec
                    .containers
                    .iter()
                    .map(|c| SimContainer {
                        name: c.name.clone(),
                        image: c.image.clone().unwrap_or_default(),
                        state: State::Waiting {
                            until: now + self.config.start_delay,
                            crashed: false,
                        },
                        restart_count: 0,
                        last_terminated: None,
                        meter: None,
                        shared_mark: None,
                    })
                    .collect(),
                wake_at: None,
                usage: (0, 0),
                usage_error: None,
                share: None,
                shared_banked_ns: 0,
            }
        });
        self.advance(entry, now);
        // Settle the shared load under the old membership before anything changes it.
        self.observe_share(entry, now);
        let (usage, mut usage_error) = match steered_usage(pod) {
            Ok(u) => (u, None),
            Err(e) => (entry.usage, Some(e)),
        };
        if usage.0 != entry.usage.0 {
            let old = entry.usage.0;
            entry.containers.iter_mut().for_each(|c| c.fold(old, now));
        }
        entry.usage = usage;
        match steered_share(pod) {
            Ok(share) => {
                let same = |a: &Share, b: &Share| a.owner == b.owner && a.totals == b.totals;
                let changed = match (&entry.share, &share) {
                    (Some(a), Some(b)) => !same(a, b),
                    (None, None) => false,
                    _ => true,
                };
                if changed {
                    // Rejoins under the new totals (or leaves) from now on.
                    self.leave_share(entry, now);
                    entry.share = share;
                }
            }
            Err(e) => usage_error = Some(usage_error.map_or(e.clone(), |u| format!("{u}; {e}"))),
        }
        entry.usage_error = usage_error;
        // A container whose image changed in the spec is restarted with the new image, as
        // the kubelet does (the image is the one mutable field of a container).
        for spec in pod.spec.iter().flat_map(|s| &s.containers) {
            let image = spec.image.clone().unwrap_or_default();
            if let Some(c) = entry.containers.iter_mut().find(|c| c.name == spec.name) {
                if c.image != image {
                    c.image = image;
                    c.restart_count += 1;
                    c.state = State::Waiting {
                        until: now + self.config.start_delay,
                        crashed: false,
                    };
                }
            }
        }
        self.observe_share(entry, now);
        let status = self.status(entry, now);
        let next = self.next_transition(entry, now);
        self.wake(&uid, entry, next);
        Ok(status)
    }

    async fn kill_pod(&self, pod: &RuntimePod, _grace: Duration) -> Result<(), RuntimeError> {
        // No process to signal: a simulated container stops at once.
        let removed = self.pods.lock().remove(&pod.uid);
        if let Some(mut p) = removed {
            let now = Instant::now();
            let (shared, _) = self.observe_share(&mut p, now);
            self.leave_share(&mut p, now);
            let millis = p.usage.0;
            let n = p.containers.len() as u64;
            let used: u64 = p
                .containers
                .iter_mut()
                .filter_map(|c| container_cpu(c, millis, shared, n, now))
                .map(|(_, u)| u)
                .sum();
            self.retired_cpu_ns.fetch_add(used, Ordering::Relaxed);
            self.send(&pod.uid);
        }
        Ok(())
    }

    async fn pods(&self) -> Vec<RuntimePod> {
        self.held(|_| true)
    }

    async fn pods_named(&self, namespace: &str, name: &str) -> Vec<RuntimePod> {
        self.held(|p| p.namespace == namespace && p.name == name)
    }

    fn subscribe(&self) -> mpsc::UnboundedReceiver<String> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.notify.lock() = Some(tx);
        rx
    }

    async fn stats(&self) -> Result<RuntimeStats, RuntimeError> {
        let now = Instant::now();
        let mut pods = self.pods.lock();
        let mut out = Vec::with_capacity(pods.len());
        let mut errors = Vec::new();
        for (uid, p) in pods.iter_mut() {
            self.advance(p, now);
            let (shared, shared_memory) = self.observe_share(p, now);
            if let Some(e) = &p.usage_error {
                errors.push(format!("pod {}/{}: {e}", p.namespace, p.name));
            }
            let (millis, memory) = p.usage;
            let n = p.containers.len() as u64;
            let containers: Vec<ContainerStats> = p
                .containers
                .iter_mut()
                .filter_map(|c| {
                    let (since, used) = container_cpu(c, millis, shared, n, now)?;
                    Some(ContainerStats {
                        name: c.name.clone(),
                        start_time: wall(since, now),
                        usage: Usage {
                            cpu_core_nanoseconds: used,
                            memory_working_set_bytes: memory + shared_memory / n.max(1),
                        },
                    })
                })
                .collect();
            if containers.is_empty() {
                continue;
            }
            out.push(PodStats {
                pod: RuntimePod {
                    uid: uid.clone(),
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                },
                start_time: p.start_time,
                containers,
            });
        }
        drop(pods);
        let up = now.saturating_duration_since(self.started.0).as_nanos() as u64;
        let base = Usage {
            cpu_core_nanoseconds: up.saturating_mul(NODE_BASE_CPU_MILLIS) / 1000
                + self.retired_cpu_ns.load(Ordering::Relaxed),
            memory_working_set_bytes: NODE_BASE_MEMORY_BYTES,
        };
        let usage = out.iter().fold(base, |a, p| a + p.usage());
        Ok(RuntimeStats {
            pods: out,
            node: Some(NodeUsage {
                start_time: self.started.1,
                usage,
                memory_available_bytes: None,
            }),
            errors,
        })
    }

    async fn logs(
        &self,
        pod: &RuntimePod,
        container: &str,
        options: &LogOptions,
    ) -> Result<LogStream, RuntimeError> {
        let (image, restarts) = {
            let pods = self.pods.lock();
            let p = pods
                .get(&pod.uid)
                .ok_or_else(|| RuntimeError::NotFound(format!("pod {}", pod.name)))?;
            let c = p
                .containers
                .iter()
                .find(|c| c.name == container)
                .ok_or_else(|| {
                    RuntimeError::NotFound(format!("container {container} in pod {}", pod.name))
                })?;
            (c.image.clone(), c.restart_count)
        };
        if options.previous && restarts == 0 {
            return Err(RuntimeError::BadRequest(format!(
                "previous terminated container {container:?} in pod {:?} not found",
                pod.name
            )));
        }
        let mut text = format!(
            "setpoint simulated container {container} (image {image}): no process runs, so there is no output\n"
        );
        if options.timestamps {
            text = format!("{} {text}", now_truncated());
        }
        if options.tail_lines == Some(0) {
            text.clear();
        }
        if let Some(limit) = options.limit_bytes {
            text.truncate(limit.min(text.len() as u64) as usize);
        }
        // `follow` ends here too: a simulated container never writes more.
        let chunk: Result<Bytes, RuntimeError> = Ok(Bytes::from(text));
        Ok(Box::pin(futures::stream::iter(
            Some(chunk).filter(|c| c.as_ref().is_ok_and(|b| !b.is_empty())),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(policy: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("uid-1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("nginx:1".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    fn config(failure_rate: f64) -> SimulatedConfig {
        SimulatedConfig {
            start_delay: Duration::from_secs(2),
            ready_delay: Duration::from_secs(3),
            failure_rate,
            fail_after: Duration::from_secs(5),
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(40),
        }
    }

    fn node() -> NodeContext {
        NodeContext {
            node_name: "n".into(),
            host_ip: "10.0.0.1".into(),
            sources: None,
        }
    }

    fn waiting_reason(s: &RuntimeStatus) -> Option<String> {
        s.container_statuses[0]
            .state
            .as_ref()?
            .waiting
            .as_ref()?
            .reason
            .clone()
    }

    #[tokio::test(start_paused = true)]
    async fn container_starts_then_turns_ready_and_wakes_the_agent() {
        let rt = SimulatedRuntime::new(config(0.0));
        let mut wakeups = rt.subscribe();
        let p = pod("Always");
        let s = rt.sync_pod(&p, &node()).await.unwrap();
        assert_eq!(s.phase, "Pending");
        assert_eq!(waiting_reason(&s).as_deref(), Some("ContainerCreating"));
        assert!(s.pod_ip.is_some());
        assert_eq!(s.message.as_deref(), Some(SIMULATED_MESSAGE));

        // The runtime asks for a sync when the container starts.
        assert_eq!(wakeups.recv().await.as_deref(), Some("uid-1"));
        let s = rt.sync_pod(&p, &node()).await.unwrap();
        assert_eq!(s.phase, "Running");
        assert!(!s.container_statuses[0].ready);
        assert_eq!(s.container_statuses[0].image_id, "simulated://nginx:1");

        assert_eq!(wakeups.recv().await.as_deref(), Some("uid-1"));
        let s = rt.sync_pod(&p, &node()).await.unwrap();
        assert!(s.container_statuses[0].ready);
        assert_eq!(s.container_statuses[0].started, Some(true));
        // Idempotent: syncing again changes nothing.
        assert_eq!(rt.sync_pod(&p, &node()).await.unwrap(), s);
    }

    #[tokio::test(start_paused = true)]
    async fn steered_usage_accumulates_while_running_and_sums_into_the_node() {
        let rt = SimulatedRuntime::new(config(0.0));
        let mut p = pod("Always");
        p.metadata.annotations = Some(
            [
                (SIMULATED_CPU_ANNOTATION.to_string(), "140m".to_string()),
                (SIMULATED_MEMORY_ANNOTATION.to_string(), "64Mi".to_string()),
            ]
            .into(),
        );
        rt.sync_pod(&p, &node()).await.unwrap();
        // Not running yet: no figures, the node its base.
        let s = rt.stats().await.unwrap();
        assert!(s.pods.is_empty());
        let base = s.node.unwrap().usage;
        assert_eq!(base.memory_working_set_bytes, NODE_BASE_MEMORY_BYTES);
        // Running from 2 s; at 12 s it has used 10 s × 140m = 1.4 core-seconds.
        tokio::time::advance(Duration::from_secs(12)).await;
        let s = rt.stats().await.unwrap();
        let c = &s.pods[0].containers[0];
        assert_eq!(c.usage.cpu_core_nanoseconds, 1_400_000_000);
        assert_eq!(c.usage.memory_working_set_bytes, 64 << 20);
        let total = s.node.unwrap().usage;
        assert_eq!(
            total.cpu_core_nanoseconds,
            12 * NODE_BASE_CPU_MILLIS * 1_000_000 + 1_400_000_000
        );
        assert_eq!(
            total.memory_working_set_bytes,
            NODE_BASE_MEMORY_BYTES + (64 << 20)
        );
        // A new rate counts from the sync that sees it; what was used stays.
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(SIMULATED_CPU_ANNOTATION.into(), "1".into());
        rt.sync_pod(&p, &node()).await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        let s = rt.stats().await.unwrap();
        assert_eq!(
            s.pods[0].containers[0].usage.cpu_core_nanoseconds,
            3_400_000_000
        );
        assert!(s.errors.is_empty());
        // A killed pod's CPU stays in the node's cumulative figure.
        rt.kill_pod(&s.pods[0].pod, Duration::ZERO).await.unwrap();
        let after = rt.stats().await.unwrap();
        assert!(after.pods.is_empty());
        assert_eq!(
            after.node.unwrap().usage.cpu_core_nanoseconds,
            14 * NODE_BASE_CPU_MILLIS * 1_000_000 + 3_400_000_000
        );
        // A bad annotation is reported, not ignored.
        let mut bad = pod("Always");
        bad.metadata.uid = Some("uid-bad".into());
        bad.metadata.annotations =
            Some([(SIMULATED_CPU_ANNOTATION.to_string(), "lots".to_string())].into());
        rt.sync_pod(&bad, &node()).await.unwrap();
        let errors = rt.stats().await.unwrap().errors;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains(SIMULATED_CPU_ANNOTATION), "{errors:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn pods_named_finds_every_pod_under_a_name_and_no_other() {
        let rt = SimulatedRuntime::new(config(0.0));
        let first = pod("Always");
        let mut replaced = pod("Always");
        replaced.metadata.uid = Some("uid-2".into());
        let mut other = pod("Always");
        other.metadata.name = Some("db".into());
        other.metadata.uid = Some("uid-3".into());
        for p in [&first, &replaced, &other] {
            rt.sync_pod(p, &node()).await.unwrap();
        }
        let mut uids: Vec<String> = rt
            .pods_named("default", "web")
            .await
            .into_iter()
            .map(|p| p.uid)
            .collect();
        uids.sort();
        assert_eq!(uids, ["uid-1", "uid-2"]);
        assert!(rt.pods_named("other", "web").await.is_empty());
        // The same answer as the trait's default, which filters `pods()`.
        let mut all = rt.pods().await;
        all.retain(|p| p.namespace == "default" && p.name == "db");
        assert_eq!(rt.pods_named("default", "db").await, all);
    }

    /// `p` as its agent last wrote it: the status composed from `observed`.
    fn as_written(p: &Pod, observed: &RuntimeStatus) -> Pod {
        let mut p = p.clone();
        p.status = Some(crate::status::compose(
            &p,
            observed,
            &node().host_ip,
            now_truncated(),
        ));
        p
    }

    /// What a restarted agent's runtime reports for `written` (the pod as the API holds it),
    /// and whether the agent would write it: it writes only a status that differs.
    async fn after_restart(config: SimulatedConfig, written: &Pod) -> (RuntimeStatus, bool) {
        // A process of its own: a runtime holding nothing.
        let rt = SimulatedRuntime::new(config);
        let s = rt.sync_pod(written, &node()).await.unwrap();
        let composed = crate::status::compose(written, &s, &node().host_ip, now_truncated());
        let writes = written.status.as_ref() != Some(&composed);
        (s, writes)
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_agent_finds_its_pods_as_the_api_saw_them_and_writes_nothing() {
        let before = SimulatedRuntime::new(config(0.0));
        let p = pod("Always");
        before.sync_pod(&p, &node()).await.unwrap();
        // Running from 2 s, ready from 5 s.
        tokio::time::advance(Duration::from_secs(6)).await;
        let ready = before.sync_pod(&p, &node()).await.unwrap();
        assert!(ready.container_statuses[0].ready);
        let written = as_written(&p, &ready);

        let rt = SimulatedRuntime::new(config(0.0));
        let s = rt.sync_pod(&written, &node()).await.unwrap();
        // Same address, start, container ID, readiness: no status write.
        assert_eq!(s, ready);
        assert!(!after_restart(config(0.0), &written).await.1);
        // A pod new to the restarted runtime gets an address of its own.
        let mut other = pod("Always");
        other.metadata.name = Some("other".into());
        other.metadata.uid = Some("uid-2".into());
        let fresh = rt.sync_pod(&other, &node()).await.unwrap();
        assert_ne!(fresh.pod_ip, ready.pod_ip);
        assert_eq!(waiting_reason(&fresh).as_deref(), Some("ContainerCreating"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_agent_keeps_crash_loops_and_starting_pods_as_they_were() {
        // In its back-off after the first failure (started at 2 s, failed at 7 s).
        let before = SimulatedRuntime::new(config(1.0));
        let p = pod("Always");
        before.sync_pod(&p, &node()).await.unwrap();
        tokio::time::advance(Duration::from_secs(8)).await;
        let crashed = before.sync_pod(&p, &node()).await.unwrap();
        assert_eq!(
            waiting_reason(&crashed).as_deref(),
            Some("CrashLoopBackOff")
        );
        let (s, writes) = after_restart(config(1.0), &as_written(&p, &crashed)).await;
        assert_eq!(s, crashed);
        assert!(!writes);

        // Still creating its container.
        let before = SimulatedRuntime::new(config(0.0));
        let creating = before.sync_pod(&p, &node()).await.unwrap();
        let (s, writes) = after_restart(config(0.0), &as_written(&p, &creating)).await;
        assert_eq!(s, creating);
        assert!(!writes);
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_another_runtime_wrote_is_not_adopted() {
        let before = SimulatedRuntime::new(config(0.0));
        let p = pod("Always");
        before.sync_pod(&p, &node()).await.unwrap();
        tokio::time::advance(Duration::from_secs(6)).await;
        let mut ready = before.sync_pod(&p, &node()).await.unwrap();
        ready.container_statuses[0].container_id = Some("containerd://0123".into());
        let (s, writes) = after_restart(config(0.0), &as_written(&p, &ready)).await;
        // Started afresh: there is nothing of its own to find.
        assert_eq!(waiting_reason(&s).as_deref(), Some("ContainerCreating"));
        assert!(writes);
    }

    #[tokio::test(start_paused = true)]
    async fn failing_container_backs_off_and_restarts() {
        let rt = SimulatedRuntime::new(config(1.0));
        let p = pod("Always");
        rt.sync_pod(&p, &node()).await.unwrap();
        // Started at 2 s, fails at 7 s, back-off 10 s.
        tokio::time::advance(Duration::from_secs(8)).await;
        let s = rt.sync_pod(&p, &node()).await.unwrap();
        assert_eq!(s.phase, "Running");
        assert_eq!(waiting_reason(&s).as_deref(), Some("CrashLoopBackOff"));
        let last = s.container_statuses[0].last_state.clone().unwrap();
        assert_eq!(last.terminated.unwrap().exit_code, 1);
        assert_eq!(s.container_statuses[0].restart_count, 0);
        // Restarted at 17 s.
        tokio::time::advance(Duration::from_secs(10)).await;
        let s = rt.sync_pod(&p, &node()).await.unwrap();
        assert_eq!(s.container_statuses[0].restart_count, 1);
        assert!(s.container_statuses[0]
            .state
            .as_ref()
            .unwrap()
            .running
            .is_some());
        // Fails again at 22 s; the second back-off doubles to 20 s.
        tokio::time::advance(Duration::from_secs(6)).await;
        let s = rt.sync_pod(&p, &node()).await.unwrap();
        let msg = s.container_statuses[0]
            .state
            .clone()
            .unwrap()
            .waiting
            .unwrap()
            .message;
        assert!(msg.unwrap().starts_with("back-off 20s"));
    }

    #[tokio::test(start_paused = true)]
    async fn failing_container_with_restart_never_fails_the_pod() {
        let rt = SimulatedRuntime::new(config(1.0));
        let p = pod("Never");
        rt.sync_pod(&p, &node()).await.unwrap();
        tokio::time::advance(Duration::from_secs(8)).await;
        let s = rt.sync_pod(&p, &node()).await.unwrap();
        assert_eq!(s.phase, "Failed");
        let term = s.container_statuses[0].state.clone().unwrap().terminated;
        assert_eq!(term.unwrap().exit_code, 1);
        assert_eq!(s.container_statuses[0].restart_count, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn never_policy_keeps_running_without_failures() {
        let rt = SimulatedRuntime::new(config(0.0));
        let p = pod("Never");
        rt.sync_pod(&p, &node()).await.unwrap();
        tokio::time::advance(Duration::from_secs(3600)).await;
        let s = rt.sync_pod(&p, &node()).await.unwrap();
        assert_eq!(s.phase, "Running");
        assert!(s.container_statuses[0].ready);
    }

    /// The run-length annotation makes a run exit 0: a `Never` or `OnFailure` pod succeeds
    /// (a Job's pod completes), an `Always` one restarts; a bad value is reported.
    #[tokio::test(start_paused = true)]
    async fn runs_of_a_given_length_complete_the_pod() {
        let annotated = |policy: &str, value: &str| {
            let mut p = pod(policy);
            p.metadata.annotations = Some(
                [(
                    SIMULATED_SUCCEED_AFTER_ANNOTATION.to_string(),
                    value.to_string(),
                )]
                .into(),
            );
            p
        };
        for (policy, phase, restarts) in [
            ("Never", "Succeeded", 0),
            ("OnFailure", "Succeeded", 0),
            ("Always", "Running", 1),
        ] {
            let rt = SimulatedRuntime::new(config(0.0));
            let p = annotated(policy, "4000");
            rt.sync_pod(&p, &node()).await.unwrap();
            tokio::time::advance(Duration::from_secs(5)).await;
            let s = rt.sync_pod(&p, &node()).await.unwrap();
            assert_eq!(
                s.phase, "Running",
                "{policy}: the run lasts 4 s from its start at 2 s"
            );
            tokio::time::advance(Duration::from_secs(1)).await;
            let s = rt.sync_pod(&p, &node()).await.unwrap();
            assert_eq!(s.phase, phase, "{policy}");
            assert_eq!(s.container_statuses[0].restart_count, 0, "{policy}");
            let ended = match &s.container_statuses[0].last_state {
                Some(last) => last.terminated.clone(),
                None => s.container_statuses[0].state.clone().unwrap().terminated,
            };
            let ended = ended.unwrap();
            assert_eq!(ended.exit_code, 0);
            assert_eq!(ended.reason.as_deref(), Some("Completed"));
            tokio::time::advance(Duration::from_secs(11)).await;
            let s = rt.sync_pod(&p, &node()).await.unwrap();
            assert_eq!(s.container_statuses[0].restart_count, restarts, "{policy}");
        }
        let rt = SimulatedRuntime::new(config(0.0));
        let s = rt
            .sync_pod(&annotated("Never", "2s"), &node())
            .await
            .unwrap();
        assert!(s
            .message
            .unwrap()
            .contains("is not a number of milliseconds"));
    }

    #[tokio::test(start_paused = true)]
    async fn image_change_restarts_the_container() {
        let rt = SimulatedRuntime::new(config(0.0));
        let mut p = pod("Always");
        rt.sync_pod(&p, &node()).await.unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        let s = rt.sync_pod(&p, &node()).await.unwrap();
        assert!(s.container_statuses[0].ready);
        p.spec.as_mut().unwrap().containers[0].image = Some("nginx:2".into());
        let s = rt.sync_pod(&p, &node()).await.unwrap();
        assert_eq!(s.container_statuses[0].image, "nginx:2");
        assert_eq!(s.container_statuses[0].restart_count, 1);
        assert!(!s.container_statuses[0].ready);
        tokio::time::advance(Duration::from_secs(10)).await;
        let s = rt.sync_pod(&p, &node()).await.unwrap();
        assert!(s.container_statuses[0].ready);
        assert_eq!(s.container_statuses[0].image_id, "simulated://nginx:2");
    }

    #[tokio::test]
    async fn kill_forgets_the_pod_and_logs_are_honest() {
        let rt = SimulatedRuntime::new(config(0.0));
        let p = pod("Always");
        rt.sync_pod(&p, &node()).await.unwrap();
        let held = rt.pods().await;
        assert_eq!(held.len(), 1);
        let mut logs = rt
            .logs(&held[0], "app", &LogOptions::default())
            .await
            .unwrap();
        let line = logs.next().await.unwrap().unwrap();
        assert!(String::from_utf8_lossy(&line).contains("simulated"));
        assert!(matches!(
            rt.logs(&held[0], "nope", &LogOptions::default()).await,
            Err(RuntimeError::NotFound(_))
        ));
        let previous = LogOptions {
            previous: true,
            ..Default::default()
        };
        assert!(matches!(
            rt.logs(&held[0], "app", &previous).await,
            Err(RuntimeError::BadRequest(_))
        ));
        rt.kill_pod(&held[0], Duration::from_secs(30))
            .await
            .unwrap();
        assert!(rt.pods().await.is_empty());
        // Killing again is not an error.
        rt.kill_pod(&held[0], Duration::ZERO).await.unwrap();
    }

    /// A pod of the ReplicaSet `owner` (uid), sharing `cpu` and `memory` among its pods.
    fn shared_pod(uid: &str, owner: Option<&str>, cpu: &str, memory: &str) -> Pod {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let mut p = pod("Always");
        p.metadata.name = Some(uid.into());
        p.metadata.uid = Some(uid.into());
        p.metadata.owner_references = owner.map(|o| {
            vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: "web-1".into(),
                uid: o.into(),
                controller: Some(true),
                ..Default::default()
            }]
        });
        p.metadata.annotations = Some(
            [
                (SIMULATED_CPU_TOTAL_ANNOTATION.to_string(), cpu.to_string()),
                (
                    SIMULATED_MEMORY_TOTAL_ANNOTATION.to_string(),
                    memory.to_string(),
                ),
            ]
            .into(),
        );
        p
    }

    /// (cpu core-nanoseconds, memory bytes) of the one container of pod `uid` in `stats`.
    fn usage_of(stats: &RuntimeStats, uid: &str) -> Option<(u64, u64)> {
        let p = stats.pods.iter().find(|p| p.pod.uid == uid)?;
        let u = p.containers[0].usage;
        Some((u.cpu_core_nanoseconds, u.memory_working_set_bytes))
    }

    #[tokio::test(start_paused = true)]
    async fn a_total_load_is_split_among_the_running_pods_of_one_controller_across_nodes() {
        let load = SharedLoad::new();
        let one = SimulatedRuntime::with_shared_load(config(0.0), load.clone());
        let two = SimulatedRuntime::with_shared_load(config(0.0), load.clone());
        let a = shared_pod("a", Some("rs-1"), "420m", "300Mi");
        let b = shared_pod("b", Some("rs-1"), "420m", "300Mi");
        let c = shared_pod("c", Some("rs-1"), "420m", "300Mi");
        // Another controller's pods and an unowned pod form groups of their own.
        let other = shared_pod("other", Some("rs-2"), "100m", "10Mi");
        let lone = shared_pod("lone", None, "50m", "0");
        for p in [&a, &b, &other, &lone] {
            one.sync_pod(p, &node()).await.unwrap();
        }
        two.sync_pod(&c, &node()).await.unwrap();
        // Not running yet: nobody shares anything.
        assert_eq!(load.members("rs-1"), 0);

        // Running from 2 s: the three split 420m, 140m each, on whichever node.
        tokio::time::advance(Duration::from_secs(2)).await;
        one.stats().await.unwrap();
        two.stats().await.unwrap();
        assert_eq!(load.members("rs-1"), 3);
        tokio::time::advance(Duration::from_secs(10)).await;
        let s1 = one.stats().await.unwrap();
        let s2 = two.stats().await.unwrap();
        assert!(s1.errors.is_empty() && s2.errors.is_empty(), "{s1:?}");
        let third = 100 << 20;
        assert_eq!(usage_of(&s1, "a"), Some((1_400_000_000, third)));
        assert_eq!(usage_of(&s1, "b"), Some((1_400_000_000, third)));
        assert_eq!(usage_of(&s2, "c"), Some((1_400_000_000, third)));
        assert_eq!(usage_of(&s1, "other"), Some((1_000_000_000, 10 << 20)));
        assert_eq!(usage_of(&s1, "lone"), Some((500_000_000, 0)));

        // One pod goes: the other two split the total, 210m each, and what the gone pod
        // used stays in its node's figure.
        let gone = s2.pods[0].pod.clone();
        two.kill_pod(&gone, Duration::ZERO).await.unwrap();
        assert_eq!(load.members("rs-1"), 2);
        tokio::time::advance(Duration::from_secs(10)).await;
        let s1 = one.stats().await.unwrap();
        assert_eq!(usage_of(&s1, "a"), Some((3_500_000_000, 150 << 20)));
        assert_eq!(usage_of(&s1, "b"), Some((3_500_000_000, 150 << 20)));
        let s2 = two.stats().await.unwrap();
        assert!(s2.pods.is_empty());
        assert_eq!(
            s2.node.unwrap().usage.cpu_core_nanoseconds,
            22 * NODE_BASE_CPU_MILLIS * 1_000_000 + 1_400_000_000
        );

        // A new total counts from the sync that sees it; what was used stays.
        let mut a2 = a.clone();
        a2.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(SIMULATED_CPU_TOTAL_ANNOTATION.into(), "1".into());
        let mut b2 = b.clone();
        b2.metadata.annotations = a2.metadata.annotations.clone();
        one.sync_pod(&a2, &node()).await.unwrap();
        one.sync_pod(&b2, &node()).await.unwrap();
        assert_eq!(load.members("rs-1"), 2);
        tokio::time::advance(Duration::from_secs(2)).await;
        let s1 = one.stats().await.unwrap();
        assert_eq!(usage_of(&s1, "a").unwrap().0, 4_500_000_000);
        assert_eq!(usage_of(&s1, "b").unwrap().0, 4_500_000_000);

        // A bad total is reported, not ignored.
        let bad = shared_pod("bad", Some("rs-3"), "lots", "0");
        one.sync_pod(&bad, &node()).await.unwrap();
        let errors = one.stats().await.unwrap().errors;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains(SIMULATED_CPU_TOTAL_ANNOTATION),
            "{errors:?}"
        );
    }
}
