//! What `kubectl get pods` shows for pods whose containers fail under `setpoint up
//! --container-runtime cri` (a real containerd, the real kubectl): a failing init container
//! blocks its pod with `Init:CrashLoopBackOff`; an absent image with `imagePullPolicy:
//! Never` is `ErrImageNeverPull`; an absent image with no registry to pull it from is
//! `ErrImagePull`, then `ImagePullBackOff`; a container past its 16 MiB memory limit is
//! `OOMKilled` and restarted.
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
  name: init-fails
spec:
  initContainers:
  - name: setup
    image: setpoint.local/busybox:1
    command: ["sh", "-c", "exit 1"]
  containers:
  - name: app
    image: setpoint.local/busybox:1
    command: ["sleep", "1000"]
---
apiVersion: v1
kind: Pod
metadata:
  name: never-pull
spec:
  containers:
  - name: app
    image: setpoint.invalid/absent:1
    imagePullPolicy: Never
---
apiVersion: v1
kind: Pod
metadata:
  name: no-registry
spec:
  containers:
  - name: app
    image: setpoint.invalid/absent:1
    imagePullPolicy: IfNotPresent
---
apiVersion: v1
kind: Pod
metadata:
  name: hog
spec:
  containers:
  - name: app
    image: setpoint.local/busybox:1
    command: ["sh", "-c", "x=a; while :; do x=$x$x; done"]
    resources:
      limits:
        memory: 16Mi
"#;

/// The STATUS column of `kubectl get pod <name>`.
fn status_column(s: &Setpoint, name: &str) -> String {
    let out = s.ok(&["get", "pod", name, "--no-headers"]);
    out.split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .to_string()
}

#[test]
fn kubectl_shows_failing_pods_as_the_kubelet_reports_them() {
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

    eventually("init-fails in Init:CrashLoopBackOff", DEADLINE, || {
        (status_column(&s, "init-fails") == "Init:CrashLoopBackOff").then_some(())
    });
    let app = s.ok(&[
        "get",
        "pod",
        "init-fails",
        "-o",
        "jsonpath={.status.containerStatuses[0].state.waiting.reason}",
    ]);
    assert_eq!(app, "PodInitializing");

    eventually("never-pull in ErrImageNeverPull", DEADLINE, || {
        (status_column(&s, "never-pull") == "ErrImageNeverPull").then_some(())
    });
    let message = s.ok(&[
        "get",
        "pod",
        "never-pull",
        "-o",
        "jsonpath={.status.containerStatuses[0].state.waiting.message}",
    ]);
    assert_eq!(
        message,
        "Container image \"setpoint.invalid/absent:1\" is not present with pull policy of Never"
    );

    // ErrImagePull may pass between two looks; the back-off that follows lasts 10 s.
    eventually("no-registry in ImagePullBackOff", DEADLINE, || {
        (status_column(&s, "no-registry") == "ImagePullBackOff").then_some(())
    });

    eventually("hog OOMKilled and restarted", DEADLINE, || {
        let out = s.ok(&[
            "get",
            "pod",
            "hog",
            "-o",
            "jsonpath={.status.containerStatuses[0].lastState.terminated.reason} {.status.containerStatuses[0].restartCount}",
        ]);
        let mut f = out.split_whitespace();
        let (reason, restarts) = (f.next()?, f.next()?.parse::<i32>().ok()?);
        (reason == "OOMKilled" && restarts >= 1).then_some(())
    });

    // Deleting them removes their sandboxes and containers through the node.
    s.ok(&["delete", "pods", "--all", "--wait=true", "--timeout=120s"]);
    s.stop();
}
