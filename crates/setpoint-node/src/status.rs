//! Pure decisions about one pod: the status the agent writes (from what the runtime observed
//! and what the API already holds), the QoS class, and the grace period of a kill.
//!
//! No I/O here, so every rule is unit-tested; [`crate::podworker`] does the reading and
//! writing around these functions.

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::runtime::RuntimeStatus;

/// The grace period of a pod with none set anywhere (Kubernetes' default).
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);

/// The conditions the agent owns; any other condition in the status (readiness gates,
/// `DisruptionTarget`, …) belongs to someone else and is kept as it is.
const OWNED_CONDITIONS: [&str; 5] = [
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
];

/// Whole seconds: API times are serialized with second precision, so anything finer would
/// make a freshly composed status differ from the stored one forever.
pub fn truncate(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// The wall clock, to the microsecond.
pub fn wall_now() -> Timestamp {
    Timestamp::from_microsecond(chrono::Utc::now().timestamp_micros())
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// `now`, truncated to whole seconds.
pub fn now() -> Timestamp {
    truncate(wall_now())
}

/// How long to give a pod's containers to stop: `metadata.deletionGracePeriodSeconds` (what
/// the DELETE asked for), else `spec.terminationGracePeriodSeconds`, else 30 s.
pub fn grace_period(pod: &Pod) -> Duration {
    let secs = pod.metadata.deletion_grace_period_seconds.or_else(|| {
        pod.spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
    });
    match secs {
        Some(s) => Duration::from_secs(s.max(0) as u64),
        None => DEFAULT_GRACE_PERIOD,
    }
}

/// Whether the pod has finished for good (`Succeeded` or `Failed`): its containers are never
/// started again.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The pod's QoS class ([`setpoint_api::qos`]).
pub fn qos_class(pod: &Pod) -> &'static str {
    let Some(spec) = &pod.spec else {
        return "BestEffort";
    };
    fn pairs(m: Option<&std::collections::BTreeMap<String, Quantity>>) -> Vec<(&str, &str)> {
        m.into_iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.0.as_str()))
            .collect()
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| {
            let res = c.resources.as_ref();
            setpoint_api::qos::Resources {
                requests: pairs(res.and_then(|r| r.requests.as_ref())),
                limits: pairs(res.and_then(|r| r.limits.as_ref())),
            }
        });
    setpoint_api::qos::class(containers)
}

fn truncate_state(state: &mut Option<ContainerState>) {
    let Some(s) = state else { return };
    let fix = |t: &mut Option<Time>| {
        if let Some(t) = t {
            t.0 = truncate(t.0);
        }
    };
    if let Some(r) = &mut s.running {
        fix(&mut r.started_at);
    }
    if let Some(t) = &mut s.terminated {
        fix(&mut t.started_at);
        fix(&mut t.finished_at);
    }
}

fn normalize_container(mut c: ContainerStatus) -> ContainerStatus {
    truncate_state(&mut c.state);
    truncate_state(&mut c.last_state);
    c
}

/// A condition with `lastTransitionTime` kept from `old` when its status did not change.
fn condition(
    old: &[PodCondition],
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    now: Timestamp,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let previous = old.iter().find(|c| c.type_ == type_);
    let since = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => None,
    };
    PodCondition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.map(String::from),
        message,
        last_probe_time: None,
        last_transition_time: Some(since.unwrap_or(Time(now))),
    }
}

/// The status to write for `pod`, composed from what the runtime `observed`, the node's
/// address and the pod's current status (whose `startTime`, transition times and foreign
/// conditions are kept). `now` stamps conditions that change.
pub fn compose(pod: &Pod, observed: &RuntimeStatus, host_ip: &str, now: Timestamp) -> PodStatus {
    let old = pod.status.clone().unwrap_or_default();
    let old_conditions = old.conditions.clone().unwrap_or_default();
    let spec_containers: Vec<&str> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.as_str()).collect())
        .unwrap_or_default();
    let has_init = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|i| !i.is_empty());
    let statuses: Vec<ContainerStatus> = observed
        .container_statuses
        .iter()
        .cloned()
        .map(normalize_container)
        .collect();
    let phase = observed.phase.as_str();
    // A host-network pod shares the node's address, whatever the runtime assigned.
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let pod_ip = if host_network && !host_ip.is_empty() {
        Some(host_ip.to_string())
    } else {
        observed.pod_ip.clone()
    };

    let unready: Vec<&str> = spec_containers
        .iter()
        .copied()
        .filter(|name| !statuses.iter().any(|s| s.name == *name && s.ready))
        .collect();
    let completed = phase == "Succeeded";
    let containers_ready = unready.is_empty() && !completed && phase != "Failed";
    let (cr_reason, cr_message) = if containers_ready {
        (None, None)
    } else if completed {
        (Some("PodCompleted"), None)
    } else {
        (
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    // Readiness gates: Ready also needs each named condition to be True (set by others).
    let gates_unready: Vec<String> = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .into_iter()
        .flatten()
        .map(|g| g.condition_type.clone())
        .filter(|t| {
            !old_conditions
                .iter()
                .any(|c| &c.type_ == t && c.status == "True")
        })
        .collect();
    let (ready, r_reason, r_message) = if !containers_ready {
        (false, cr_reason, cr_message.clone())
    } else if !gates_unready.is_empty() {
        (
            false,
            Some("ReadinessGatesNotReady"),
            Some(format!(
                "corresponding condition of pod readiness gate \"{}\" does not exist or is not True",
                gates_unready.join("\", \"")
            )),
        )
    } else {
        (true, None, None)
    };
    let init_statuses: Vec<ContainerStatus> = observed
        .init_container_statuses
        .iter()
        .cloned()
        .map(normalize_container)
        .collect();
    // A runtime that reports init containers decides by them, as the kubelet does; one that
    // does not counts the pod as initialized once its containers run (or always, when it
    // has no init containers).
    let (initialized, init_message) = if init_statuses.is_empty() {
        (!has_init || phase != "Pending", None)
    } else {
        let message = init_incomplete(pod, &init_statuses, &statuses, phase);
        (message.is_none(), message)
    };

    let mut conditions: Vec<PodCondition> = vec![
        condition(
            &old_conditions,
            "PodReadyToStartContainers",
            observed.pod_ip.is_some() || host_network,
            None,
            None,
            now,
        ),
        condition(
            &old_conditions,
            "Initialized",
            initialized,
            (!initialized).then_some("ContainersNotInitialized"),
            init_message,
            now,
        ),
        condition(&old_conditions, "Ready", ready, r_reason, r_message, now),
        condition(
            &old_conditions,
            "ContainersReady",
            containers_ready,
            cr_reason,
            cr_message,
            now,
        ),
        condition(&old_conditions, "PodScheduled", true, None, None, now),
    ];
    for c in &old_conditions {
        if !OWNED_CONDITIONS.contains(&c.type_.as_str()) {
            conditions.push(c.clone());
        }
    }

    let start_time = old
        .start_time
        .clone()
        .or_else(|| observed.start_time.map(|t| Time(truncate(t))));
    PodStatus {
        phase: Some(observed.phase.clone()),
        conditions: Some(conditions),
        host_ip: Some(host_ip.to_string()).filter(|s| !s.is_empty()),
        host_ips: Some(vec![HostIP {
            ip: host_ip.to_string(),
        }])
        .filter(|_| !host_ip.is_empty()),
        pod_ips: pod_ip.as_ref().map(|ip| vec![PodIP { ip: ip.clone() }]),
        pod_ip,
        start_time,
        container_statuses: Some(statuses),
        qos_class: Some(qos_class(pod).to_string()),
        message: observed.message.clone(),
        reason: observed.reason.clone(),
        // Kept: written by others (scheduler, resize, claims) or not modelled by the runtime.
        nominated_node_name: old.nominated_node_name,
        init_container_statuses: if init_statuses.is_empty() {
            old.init_container_statuses
        } else {
            Some(init_statuses)
        },
        ephemeral_container_statuses: old.ephemeral_container_statuses,
        resize: old.resize,
        resource_claim_statuses: old.resource_claim_statuses,
    }
}

/// Why the pod is not initialized yet, as the kubelet words the `Initialized` condition's
/// message (`containers with incomplete status: [init]`), or `None` when it is: every init
/// container completed with exit code 0 and every sidecar (an init container with
/// `restartPolicy: Always`) started, or an app container has started already (a sidecar
/// restarting later does not un-initialize the pod).
fn init_incomplete(
    pod: &Pod,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    phase: &str,
) -> Option<String> {
    let inits = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let mut unknown = Vec::new();
    let mut incomplete = Vec::new();
    for init in inits {
        let Some(status) = init_statuses.iter().find(|s| s.name == init.name) else {
            unknown.push(init.name.as_str());
            continue;
        };
        let done = if init.restart_policy.as_deref() == Some("Always") {
            status.started == Some(true)
        } else {
            status
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        };
        if !done {
            incomplete.push(init.name.as_str());
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        return None;
    }
    let app_started = statuses.iter().any(|s| {
        s.started == Some(true)
            || s.state
                .as_ref()
                .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
            || s.last_state
                .as_ref()
                .is_some_and(|st| st.terminated.is_some())
    });
    if app_started {
        return None;
    }
    let mut messages = Vec::new();
    if !unknown.is_empty() {
        messages.push(format!(
            "containers with unknown status: [{}]",
            unknown.join(" ")
        ));
    }
    if !incomplete.is_empty() {
        messages.push(format!(
            "containers with incomplete status: [{}]",
            incomplete.join(" ")
        ));
    }
    (!messages.is_empty()).then(|| messages.join(", "))
}

/// An Event the agent records about a pod, from a change of its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEvent {
    /// `Warning` rather than `Normal`.
    pub warning: bool,
    /// The one-word reason (`Started`, `BackOff`).
    pub reason: &'static str,
    /// What happened, for `kubectl describe`.
    pub message: String,
}

fn running_since(c: &ContainerStatus) -> Option<&Time> {
    c.state.as_ref()?.running.as_ref()?.started_at.as_ref()
}

fn waiting_reason(c: &ContainerStatus) -> Option<&str> {
    c.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}

/// The Events that going from `old` to `new` calls for: a container started (again), or a
/// container entered CrashLoopBackOff. Nothing when nothing changed, so re-syncs are silent.
pub fn container_events(pod_name: &str, old: Option<&PodStatus>, new: &PodStatus) -> Vec<PodEvent> {
    let before: &[ContainerStatus] = old
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    let mut events = Vec::new();
    for c in new.container_statuses.iter().flatten() {
        let prev = before.iter().find(|p| p.name == c.name);
        if let Some(since) = running_since(c) {
            if prev.and_then(running_since) != Some(since) {
                events.push(PodEvent {
                    warning: false,
                    reason: "Started",
                    message: format!("Started container {}", c.name),
                });
            }
        }
        if waiting_reason(c) == Some("CrashLoopBackOff")
            && prev.and_then(waiting_reason) != Some("CrashLoopBackOff")
        {
            events.push(PodEvent {
                warning: true,
                reason: "BackOff",
                message: format!(
                    "Back-off restarting failed container {} in pod {pod_name}",
                    c.name
                ),
            });
        }
    }
    events
}

/// What a container means for its pod's phase; both runtimes report one per app container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Not started yet (waiting for an image, its init containers, a config).
    NotStarted,
    /// Running, or going to run again.
    Active,
    /// Finished for good with this exit code.
    Done(i32),
}

/// The pod's phase from its app containers: `Pending` while one has not started,
/// `Succeeded` when all finished with 0, `Failed` when all finished and one did not,
/// `Running` otherwise.
pub fn pod_phase(dispositions: &[Disposition]) -> &'static str {
    if dispositions.is_empty() || dispositions.contains(&Disposition::NotStarted) {
        "Pending"
    } else if dispositions
        .iter()
        .all(|d| matches!(d, Disposition::Done(_)))
    {
        if dispositions.iter().all(|d| *d == Disposition::Done(0)) {
            "Succeeded"
        } else {
            "Failed"
        }
    } else {
        "Running"
    }
}

/// The pod's `restartPolicy` (`Always` when unset, as the API defaults it).
pub fn restart_policy(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".to_string())
}

/// An init container with `restartPolicy: Always` is a sidecar: it keeps running beside
/// the app containers.
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// Whether an init container lets the next one start: a sidecar once it has started, any
/// other once it exited with 0.
pub fn init_container_done(sidecar: bool, status: &ContainerStatus) -> bool {
    if sidecar {
        status.started == Some(true)
    } else {
        status
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_follows_the_containers() {
        use Disposition::*;
        assert_eq!(pod_phase(&[NotStarted, Active]), "Pending");
        assert_eq!(pod_phase(&[Active, Done(0)]), "Running");
        assert_eq!(pod_phase(&[Done(0), Done(0)]), "Succeeded");
        assert_eq!(pod_phase(&[Done(0), Done(2)]), "Failed");
        assert_eq!(pod_phase(&[]), "Pending");
    }

    #[test]
    fn init_containers_are_done_by_kind() {
        use k8s_openapi::api::core::v1::ContainerStateTerminated;
        let exited = |code: i32| ContainerStatus {
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(init_container_done(false, &exited(0)));
        assert!(!init_container_done(false, &exited(1)));
        let started = ContainerStatus {
            started: Some(true),
            ..Default::default()
        };
        assert!(init_container_done(true, &started));
        assert!(!init_container_done(true, &exited(0)));
        assert!(is_sidecar(&Container {
            restart_policy: Some("Always".into()),
            ..Default::default()
        }));
        assert_eq!(restart_policy(&Pod::default()), "Always");
    }
    use k8s_openapi::api::core::v1::{
        Container, ContainerStateRunning, PodReadinessGate, PodSpec, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(containers: &[&str]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                containers: containers
                    .iter()
                    .map(|n| Container {
                        name: n.to_string(),
                        image: Some("busybox".into()),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn cs(name: &str, ready: bool) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            ready,
            image: "busybox".into(),
            image_id: "simulated://busybox".into(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(Timestamp::from_millisecond(1_500_250).unwrap())),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn running(ready: &[(&str, bool)]) -> RuntimeStatus {
        RuntimeStatus {
            pod_ip: Some("10.244.0.5".into()),
            phase: "Running".into(),
            container_statuses: ready.iter().map(|(n, r)| cs(n, *r)).collect(),
            start_time: Some(Timestamp::from_millisecond(1_000_700).unwrap()),
            init_container_statuses: Vec::new(),
            message: None,
            reason: None,
        }
    }

    fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("no {t} condition"))
    }

    #[test]
    fn ready_pod_has_all_conditions_true_and_addresses() {
        let p = pod(&["a", "b"]);
        let s = compose(
            &p,
            &running(&[("a", true), ("b", true)]),
            "10.0.0.1",
            ts(2000),
        );
        for t in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
            assert_eq!(cond(&s, t).status, "True", "{t}");
            assert_eq!(cond(&s, t).last_transition_time, Some(Time(ts(2000))));
        }
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.host_ip.as_deref(), Some("10.0.0.1"));
        assert_eq!(s.pod_ips.as_ref().unwrap()[0].ip, "10.244.0.5");
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        // Times are whole seconds, as the API stores them.
        assert_eq!(s.start_time, Some(Time(ts(1000))));
        let started = s.container_statuses.as_ref().unwrap()[0]
            .state
            .as_ref()
            .unwrap()
            .running
            .as_ref()
            .unwrap()
            .started_at
            .clone();
        assert_eq!(started, Some(Time(ts(1500))));
    }

    #[test]
    fn unready_container_is_named_and_transition_time_kept_when_unchanged() {
        let mut p = pod(&["a", "b"]);
        let first = compose(&p, &running(&[("a", true), ("b", false)]), "h", ts(100));
        let ready = cond(&first, "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [b]")
        );
        p.status = Some(first.clone());
        // Same observation later: nothing changes, so nothing needs writing.
        let again = compose(&p, &running(&[("a", true), ("b", false)]), "h", ts(200));
        assert_eq!(again, first);
        // b turns ready: Ready flips and gets the new time; PodScheduled keeps its old one.
        let later = compose(&p, &running(&[("a", true), ("b", true)]), "h", ts(300));
        assert_eq!(cond(&later, "Ready").status, "True");
        assert_eq!(
            cond(&later, "Ready").last_transition_time,
            Some(Time(ts(300)))
        );
        assert_eq!(
            cond(&later, "PodScheduled").last_transition_time,
            Some(Time(ts(100)))
        );
    }

    #[test]
    fn missing_container_status_counts_as_unready() {
        let p = pod(&["a", "b"]);
        let s = compose(&p, &running(&[("a", true)]), "h", ts(1));
        assert_eq!(cond(&s, "ContainersReady").status, "False");
    }

    #[test]
    fn start_time_is_kept_and_foreign_conditions_survive() {
        let mut p = pod(&["a"]);
        p.status = Some(PodStatus {
            start_time: Some(Time(ts(5))),
            nominated_node_name: Some("x".into()),
            conditions: Some(vec![PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let s = compose(&p, &running(&[("a", true)]), "h", ts(50));
        assert_eq!(s.start_time, Some(Time(ts(5))));
        assert_eq!(s.nominated_node_name.as_deref(), Some("x"));
        assert_eq!(cond(&s, "DisruptionTarget").status, "True");
    }

    #[test]
    fn readiness_gates_hold_ready_back() {
        let mut p = pod(&["a"]);
        p.spec.as_mut().unwrap().readiness_gates = Some(vec![PodReadinessGate {
            condition_type: "example.com/lb".into(),
        }]);
        let s = compose(&p, &running(&[("a", true)]), "h", ts(1));
        assert_eq!(cond(&s, "ContainersReady").status, "True");
        assert_eq!(cond(&s, "Ready").status, "False");
        assert_eq!(
            cond(&s, "Ready").reason.as_deref(),
            Some("ReadinessGatesNotReady")
        );
        p.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "example.com/lb".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let s = compose(&p, &running(&[("a", true)]), "h", ts(2));
        assert_eq!(cond(&s, "Ready").status, "True");
    }

    #[test]
    fn host_network_pod_has_the_node_address() {
        let mut p = pod(&["a"]);
        p.spec.as_mut().unwrap().host_network = Some(true);
        let s = compose(&p, &running(&[("a", true)]), "10.0.0.1", ts(1));
        assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.1"));
        assert_eq!(s.pod_ips.unwrap()[0].ip, "10.0.0.1");
    }

    #[test]
    fn finished_pod_is_not_ready() {
        let p = pod(&["a"]);
        let mut rs = running(&[("a", false)]);
        rs.phase = "Succeeded".into();
        let s = compose(&p, &rs, "h", ts(1));
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
        rs.phase = "Failed".into();
        let s = compose(&p, &rs, "h", ts(1));
        assert_eq!(cond(&s, "Ready").status, "False");
    }

    #[test]
    fn pending_pod_with_init_containers_is_not_initialized() {
        let mut p = pod(&["a"]);
        p.spec.as_mut().unwrap().init_containers = Some(vec![Container {
            name: "init".into(),
            ..Default::default()
        }]);
        let rs = RuntimeStatus {
            phase: "Pending".into(),
            ..Default::default()
        };
        let s = compose(&p, &rs, "h", ts(1));
        assert_eq!(cond(&s, "Initialized").status, "False");
        assert_eq!(cond(&s, "PodReadyToStartContainers").status, "False");
        assert!(s.pod_ip.is_none());
    }

    fn waiting_status(name: &str, reason: &str) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            image: "busybox".into(),
            state: Some(ContainerState {
                waiting: Some(k8s_openapi::api::core::v1::ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn exited(name: &str, code: i32) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            image: "busybox".into(),
            state: Some(ContainerState {
                terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated {
                    exit_code: code,
                    reason: Some(if code == 0 { "Completed" } else { "Error" }.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn reported_init_statuses_are_written_and_decide_initialized() {
        let mut p = pod(&["a"]);
        p.spec.as_mut().unwrap().init_containers = Some(vec![
            Container {
                name: "setup".into(),
                ..Default::default()
            },
            Container {
                name: "proxy".into(),
                restart_policy: Some("Always".into()),
                ..Default::default()
            },
        ]);
        // The first init container crash-loops: not initialized, both named as incomplete.
        let rs = RuntimeStatus {
            phase: "Pending".into(),
            pod_ip: Some("10.222.0.4".into()),
            container_statuses: vec![waiting_status("a", "PodInitializing")],
            init_container_statuses: vec![
                waiting_status("setup", "CrashLoopBackOff"),
                waiting_status("proxy", "PodInitializing"),
            ],
            ..Default::default()
        };
        let s = compose(&p, &rs, "h", ts(1));
        let init = cond(&s, "Initialized");
        assert_eq!(init.status, "False");
        assert_eq!(init.reason.as_deref(), Some("ContainersNotInitialized"));
        assert_eq!(
            init.message.as_deref(),
            Some("containers with incomplete status: [setup proxy]")
        );
        let written = s.init_container_statuses.as_ref().unwrap();
        assert_eq!(written.len(), 2);
        assert_eq!(written[0].name, "setup");

        // setup completed and the sidecar started: initialized.
        let mut proxy = cs("proxy", true);
        proxy.started = Some(true);
        let rs = RuntimeStatus {
            phase: "Pending".into(),
            container_statuses: vec![waiting_status("a", "ContainerCreating")],
            init_container_statuses: vec![exited("setup", 0), proxy.clone()],
            ..Default::default()
        };
        let s = compose(&p, &rs, "h", ts(2));
        assert_eq!(cond(&s, "Initialized").status, "True");
        assert_eq!(cond(&s, "Initialized").message, None);

        // A sidecar restarting after the app started does not un-initialize the pod.
        proxy.started = Some(false);
        let mut app = cs("a", true);
        app.started = Some(true);
        let rs = RuntimeStatus {
            phase: "Running".into(),
            container_statuses: vec![app],
            init_container_statuses: vec![exited("setup", 0), proxy],
            ..Default::default()
        };
        let s = compose(&p, &rs, "h", ts(3));
        assert_eq!(cond(&s, "Initialized").status, "True");
    }

    #[test]
    fn init_statuses_the_runtime_does_not_report_are_kept() {
        let mut p = pod(&["a"]);
        p.status = Some(PodStatus {
            init_container_statuses: Some(vec![exited("old", 0)]),
            ..Default::default()
        });
        let s = compose(&p, &running(&[("a", true)]), "h", ts(1));
        assert_eq!(s.init_container_statuses.unwrap()[0].name, "old");
    }

    #[test]
    fn grace_period_prefers_deletion_then_spec_then_default() {
        let mut p = pod(&["a"]);
        assert_eq!(grace_period(&p), Duration::from_secs(30));
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(7);
        assert_eq!(grace_period(&p), Duration::from_secs(7));
        p.metadata.deletion_grace_period_seconds = Some(2);
        assert_eq!(grace_period(&p), Duration::from_secs(2));
        p.metadata.deletion_grace_period_seconds = Some(0);
        assert_eq!(grace_period(&p), Duration::ZERO);
    }

    #[test]
    fn terminal_phases() {
        let mut p = pod(&["a"]);
        assert!(!is_terminal(&p));
        for (phase, terminal) in [("Running", false), ("Succeeded", true), ("Failed", true)] {
            p.status = Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            });
            assert_eq!(is_terminal(&p), terminal, "{phase}");
        }
    }

    fn resources(req: &[(&str, &str)], lim: &[(&str, &str)]) -> Option<ResourceRequirements> {
        let m = |v: &[(&str, &str)]| {
            Some(
                v.iter()
                    .map(|(k, q)| (k.to_string(), Quantity(q.to_string())))
                    .collect(),
            )
            .filter(|m: &std::collections::BTreeMap<_, _>| !m.is_empty())
        };
        Some(ResourceRequirements {
            requests: m(req),
            limits: m(lim),
            ..Default::default()
        })
    }

    #[test]
    fn qos_classes() {
        let mut p = pod(&["a", "b"]);
        assert_eq!(qos_class(&p), "BestEffort");
        let cs = &mut p.spec.as_mut().unwrap().containers;
        cs[0].resources = resources(&[], &[("cpu", "1"), ("memory", "1Gi")]);
        cs[1].resources = resources(
            &[("cpu", "1"), ("memory", "1Gi")],
            &[("cpu", "1"), ("memory", "1Gi")],
        );
        assert_eq!(qos_class(&p), "Guaranteed");
        let cs = &mut p.spec.as_mut().unwrap().containers;
        cs[1].resources = resources(&[("cpu", "500m")], &[("cpu", "1"), ("memory", "1Gi")]);
        assert_eq!(qos_class(&p), "Burstable");
        let cs = &mut p.spec.as_mut().unwrap().containers;
        cs[0].resources = None;
        cs[1].resources = resources(&[("memory", "1Gi")], &[]);
        assert_eq!(qos_class(&p), "Burstable");
        // Only CPU and memory count, as when the API server set the class at create.
        let cs = &mut p.spec.as_mut().unwrap().containers;
        cs[0].resources = resources(&[("ephemeral-storage", "1Gi")], &[]);
        cs[1].resources = None;
        assert_eq!(qos_class(&p), "BestEffort");
    }

    #[test]
    fn events_for_starts_and_back_offs_only_on_change() {
        let p = pod(&["a"]);
        let first = compose(&p, &running(&[("a", false)]), "h", ts(1));
        let ev = container_events("p", None, &first);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].reason, "Started");
        assert_eq!(ev[0].message, "Started container a");
        assert!(container_events("p", Some(&first), &first).is_empty());

        let mut crashed = first.clone();
        crashed.container_statuses.as_mut().unwrap()[0].state = Some(ContainerState {
            waiting: Some(k8s_openapi::api::core::v1::ContainerStateWaiting {
                reason: Some("CrashLoopBackOff".into()),
                message: None,
            }),
            ..Default::default()
        });
        let ev = container_events("p", Some(&first), &crashed);
        assert_eq!(ev.len(), 1);
        assert!(ev[0].warning);
        assert_eq!(
            ev[0].message,
            "Back-off restarting failed container a in pod p"
        );
        assert!(container_events("p", Some(&crashed), &crashed).is_empty());
        // Running again: started again.
        let ev = container_events("p", Some(&crashed), &first);
        assert_eq!(ev[0].reason, "Started");
    }
}
