//! What a CRI container's status means for the pod: its Kubernetes `ContainerState`
//! (running since, terminated with exit code and reason — `OOMKilled` and the other
//! reasons come from the runtime, `Completed` or `Error` when it gives none — or waiting),
//! and what to do about the container next ([`plan`]). Pure functions over the CRI messages.

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use setpoint_cri_proto as cri;

use crate::process::backoff::BackoffPolicy;

/// A CRI time (nanoseconds since the epoch) as an API time; `None` for 0 (not set).
pub fn time(nanos: i64) -> Option<Time> {
    (nanos > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok())
        .flatten()
        .map(Time)
}

/// A waiting state with a reason and, if any, a message.
pub fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message: message.filter(|m| !m.is_empty()),
        }),
        ..Default::default()
    }
}

/// The terminated state of an exited CRI container, `container_id` as the status shows it.
pub fn terminated(status: &cri::ContainerStatus, container_id: &str) -> ContainerState {
    let reason = if status.reason.is_empty() {
        if status.exit_code == 0 {
            "Completed"
        } else {
            "Error"
        }
        .to_string()
    } else {
        status.reason.clone()
    };
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: status.exit_code,
            reason: Some(reason),
            message: Some(status.message.clone()).filter(|m| !m.is_empty()),
            started_at: time(status.started_at),
            finished_at: time(status.finished_at),
            container_id: Some(container_id.to_string()),
            signal: None,
        }),
        ..Default::default()
    }
}

/// The Kubernetes state of a CRI container: running, terminated, or (created, not started
/// yet) waiting with `ContainerCreating`; a state the runtime cannot tell is waiting with
/// `ContainerStatusUnknown`.
pub fn container_state(status: &cri::ContainerStatus, container_id: &str) -> ContainerState {
    match cri::ContainerState::try_from(status.state) {
        Ok(cri::ContainerState::ContainerRunning) => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: time(status.started_at),
            }),
            ..Default::default()
        },
        Ok(cri::ContainerState::ContainerExited) => terminated(status, container_id),
        Ok(cri::ContainerState::ContainerCreated) => waiting("ContainerCreating", None),
        _ => waiting(
            "ContainerStatusUnknown",
            Some("The container runtime cannot tell the container's state".to_string()),
        ),
    }
}

/// Whether `restartPolicy` restarts a container that exited with `code`.
pub fn restarts(policy: &str, code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => code != 0,
        _ => true,
    }
}

/// The policy an init container runs under: a sidecar (`restartPolicy: Always`) always
/// restarts; others restart on failure unless the pod's policy is `Never`.
pub fn init_policy(sidecar: bool, pod_policy: &str) -> &'static str {
    match (sidecar, pod_policy) {
        (true, _) => "Always",
        (false, "Never") => "Never",
        (false, _) => "OnFailure",
    }
}

/// The latest run of a container, as far as the plan needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Latest {
    /// No container of this name in the pod's sandbox.
    None,
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited with this code after running this long.
    Exited {
        /// The exit code.
        code: i32,
        /// How long the run lasted.
        ran_for: Duration,
    },
}

/// What to do about one container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Create and start a container (the first, or a restart).
    Start,
    /// Start the created container.
    StartCreated,
    /// Nothing: it runs, or it finished for good.
    Nothing,
    /// It exited and restarts after this back-off (counted from its exit).
    BackOff(Duration),
}

/// The plan for a container whose latest run is `latest`, under `policy`, given the
/// back-off delay its previous restarts left (`current`). Returns the plan and the delay to
/// remember when the plan decided a restart wait.
pub fn plan(
    latest: Latest,
    policy: &str,
    backoff: &BackoffPolicy,
    current: Option<Duration>,
) -> (Plan, Option<Duration>) {
    match latest {
        Latest::None => (Plan::Start, current),
        Latest::Created => (Plan::StartCreated, current),
        Latest::Running => (Plan::Nothing, current),
        Latest::Exited { code, ran_for } => {
            if !restarts(policy, code) {
                return (Plan::Nothing, current);
            }
            let (wait, next) = backoff.after_exit(current, ran_for);
            (Plan::BackOff(wait), Some(next))
        }
    }
}

/// The CrashLoopBackOff waiting message, in the kubelet's words.
pub fn crash_loop_message(
    delay: Duration,
    container: &str,
    pod: &str,
    ns: &str,
    uid: &str,
) -> String {
    format!(
        "back-off {} restarting failed container={container} pod={pod}_{ns}({uid})",
        crate::process::backoff::format_delay(delay)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(state: cri::ContainerState, code: i32, reason: &str) -> cri::ContainerStatus {
        cri::ContainerStatus {
            id: "abc".into(),
            state: state as i32,
            started_at: 1_700_000_000_000_000_000,
            finished_at: 1_700_000_005_000_000_000,
            exit_code: code,
            reason: reason.into(),
            ..Default::default()
        }
    }

    #[test]
    fn states_map_to_kubernetes() {
        let s = container_state(
            &status(cri::ContainerState::ContainerRunning, 0, ""),
            "containerd://abc",
        );
        assert_eq!(
            s.running.unwrap().started_at.unwrap().0.as_second(),
            1_700_000_000
        );
        let t = container_state(
            &status(cri::ContainerState::ContainerExited, 3, ""),
            "containerd://abc",
        )
        .terminated
        .unwrap();
        assert_eq!((t.exit_code, t.reason.as_deref()), (3, Some("Error")));
        assert_eq!(t.container_id.as_deref(), Some("containerd://abc"));
        assert_eq!(t.finished_at.unwrap().0.as_second(), 1_700_000_005);
        let t = container_state(&status(cri::ContainerState::ContainerExited, 0, ""), "x")
            .terminated
            .unwrap();
        assert_eq!(t.reason.as_deref(), Some("Completed"));
        let t = container_state(
            &status(cri::ContainerState::ContainerExited, 137, "OOMKilled"),
            "x",
        )
        .terminated
        .unwrap();
        assert_eq!((t.exit_code, t.reason.as_deref()), (137, Some("OOMKilled")));
        let w = container_state(&status(cri::ContainerState::ContainerCreated, 0, ""), "x")
            .waiting
            .unwrap();
        assert_eq!(w.reason.as_deref(), Some("ContainerCreating"));
    }

    #[test]
    fn plans_follow_policy_and_backoff() {
        let b = BackoffPolicy::default();
        let short = Duration::from_secs(1);
        assert_eq!(plan(Latest::None, "Always", &b, None).0, Plan::Start);
        assert_eq!(
            plan(Latest::Created, "Always", &b, None).0,
            Plan::StartCreated
        );
        assert_eq!(plan(Latest::Running, "Never", &b, None).0, Plan::Nothing);
        let exited = |code| Latest::Exited {
            code,
            ran_for: short,
        };
        assert_eq!(plan(exited(3), "Never", &b, None).0, Plan::Nothing);
        assert_eq!(plan(exited(0), "OnFailure", &b, None).0, Plan::Nothing);
        // The first restart is immediate, the next waits 10 s, then 20 s.
        let (p, next) = plan(exited(3), "Always", &b, None);
        assert_eq!(p, Plan::BackOff(Duration::ZERO));
        let (p, next) = plan(exited(3), "OnFailure", &b, next);
        assert_eq!(p, Plan::BackOff(Duration::from_secs(10)));
        let (p, _) = plan(exited(0), "Always", &b, next);
        assert_eq!(p, Plan::BackOff(Duration::from_secs(20)));
    }

    #[test]
    fn init_policies_and_messages() {
        assert_eq!(init_policy(true, "Never"), "Always");
        assert_eq!(init_policy(false, "Never"), "Never");
        assert_eq!(init_policy(false, "Always"), "OnFailure");
        assert_eq!(
            crash_loop_message(Duration::from_secs(20), "c", "p", "ns", "u"),
            "back-off 20s restarting failed container=c pod=p_ns(u)"
        );
    }
}
