//! Lifecycle hooks under `setpoint up --container-runtime cri` (a real containerd, the real
//! kubectl): a failing `postStart` is a `FailedPostStartHook` Event about the container and
//! the container waits with `PostStartHookError` or restarts; a failing `preStop` is a
//! `FailedPreStopHook` Event when the pod is deleted, and the pod still goes.
//!
//! Skipped (saying why) unless root with containerd, runc, the CNI plugins and a static
//! busybox installed; `SETPOINT_REQUIRE_CONTAINERD=1` makes that a failure.

mod support;

use std::time::Duration;

use support::{eventually, Setpoint};

const DEADLINE: Duration = Duration::from_secs(120);

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: post-start-fails
spec:
  containers:
  - name: app
    image: setpoint.local/busybox:1
    command: ["sleep", "1000"]
    lifecycle:
      postStart:
        exec:
          command: ["sh", "-c", "exit 7"]
---
apiVersion: v1
kind: Pod
metadata:
  name: pre-stop-fails
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: app
    image: setpoint.local/busybox:1
    command: ["sleep", "1000"]
    lifecycle:
      preStop:
        exec:
          command: ["sh", "-c", "exit 3"]
"#;

/// `reason message fieldPath` of the pod's Events with that reason, one a line.
fn events(s: &Setpoint, pod: &str, reason: &str) -> String {
    s.ok(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={pod},reason={reason}"),
        "-o",
        "jsonpath={range .items[*]}{.reason} {.message} {.involvedObject.fieldPath}{\"\\n\"}{end}",
    ])
}

#[test]
fn failing_hooks_are_events_and_the_kubelets_states() {
    if !support::kubectl_available() || !support::containerd_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["up", "--container-runtime", "cri"], dir.path());
    eventually("the default service account", DEADLINE, || {
        s.kubectl(&["get", "serviceaccount", "default"])
            .status
            .success()
            .then_some(())
    });
    s.apply(PODS);

    eventually("the FailedPostStartHook event", DEADLINE, || {
        let out = events(&s, "post-start-fails", "FailedPostStartHook");
        (out.lines().next()? == "FailedPostStartHook PostStartHook failed spec.containers{app}")
            .then_some(())
    });
    eventually("post-start-fails restarted", DEADLINE, || {
        let restarts = s.ok(&[
            "get",
            "pod",
            "post-start-fails",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ]);
        (restarts.parse::<i32>().ok()? >= 1).then_some(())
    });

    eventually("pre-stop-fails running", DEADLINE, || {
        let phase = s.ok(&[
            "get",
            "pod",
            "pre-stop-fails",
            "-o",
            "jsonpath={.status.phase}",
        ]);
        (phase == "Running").then_some(())
    });
    s.ok(&[
        "delete",
        "pod",
        "pre-stop-fails",
        "--wait=true",
        "--timeout=60s",
    ]);
    eventually("the FailedPreStopHook event", DEADLINE, || {
        let out = events(&s, "pre-stop-fails", "FailedPreStopHook");
        (out.lines().next()? == "FailedPreStopHook PreStopHook failed spec.containers{app}")
            .then_some(())
    });
    s.ok(&["delete", "pods", "--all", "--wait=true", "--timeout=120s"]);
    s.stop();
}
