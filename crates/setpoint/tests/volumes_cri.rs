//! End to end with the real kubectl against `setpoint up --container-runtime cri` (a real
//! containerd): a pod's volumes are CRI mounts. A ConfigMap at `/etc/app` is printed by the
//! container and changes in place after `kubectl edit`; a downwardAPI volume shows the pod's
//! labels and follows `kubectl label`; the service account's projected token volume is there;
//! a claim of the default StorageClass keeps a file across the pod's recreation and its
//! directory goes with the claim (Delete); a pod whose ConfigMap does not exist waits with
//! the kubelet's `FailedMount` message and starts once it does.
//!
//! Skipped (saying why) unless root with containerd, runc, the CNI plugins and a static
//! busybox installed; `SETPOINT_REQUIRE_CONTAINERD=1` makes that a failure.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use support::{eventually, Setpoint};

const WAIT: Duration = Duration::from_secs(120);

/// The documented bound on an edit reaching a running pod's files (the agent's 10 s resync,
/// docs/volumes.md, with room for a loaded machine).
const UPDATE_WAIT: Duration = Duration::from_secs(60);

/// `kubectl get <what> -o jsonpath=<path>`, or `None` if it fails or is empty.
fn jsonpath(s: &Setpoint, what: &[&str], path: &str) -> Option<String> {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let p = format!("jsonpath={path}");
    args.extend_from_slice(&["-o", &p]);
    let out = s.kubectl(&args);
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// `kubectl exec <pod> -- <command>`'s output, or `None` when it fails.
fn exec(s: &Setpoint, pod: &str, command: &[&str]) -> Option<String> {
    let mut args = vec!["exec", pod, "--"];
    args.extend_from_slice(command);
    let out = s.kubectl(&args);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn wait_running(s: &Setpoint, pod: &str) {
    eventually(&format!("pod {pod} Running"), WAIT, || {
        (jsonpath(s, &["pod", pod], "{.status.phase}").as_deref() == Some("Running")).then_some(())
    });
}

const CONFIG_MAP: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\ndata:\n  greeting: hello\n";

const CLAIM: &str = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n";

/// Prints the ConfigMap's file and what the claim held, then writes to the claim.
const POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: app
  labels:
    app: demo
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: setpoint.local/busybox:1
    command:
    - sh
    - -c
    - |
      echo "greeting: $(cat /etc/app/greeting)"
      echo "claim: $(cat /var/lib/app-data/written 2>/dev/null || echo empty)"
      echo kept > /var/lib/app-data/written
      exec sleep 3600
    volumeMounts:
    - name: config
      mountPath: /etc/app
    - name: podinfo
      mountPath: /etc/podinfo
    - name: data
      mountPath: /var/lib/app-data
  volumes:
  - name: config
    configMap:
      name: app-config
  - name: podinfo
    downwardAPI:
      items:
      - path: labels
        fieldRef:
          fieldPath: metadata.labels
  - name: data
    persistentVolumeClaim:
      claimName: data
"#;

/// Mounts a ConfigMap that does not exist yet.
const WAITING_POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: waits
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: setpoint.local/busybox:1
    command: ["sh", "-c", "echo \"key: $(cat /etc/later/key)\" && exec sleep 3600"]
    volumeMounts:
    - name: later
      mountPath: /etc/later
  volumes:
  - name: later
    configMap:
      name: later
"#;

#[test]
fn cri_pods_mount_config_maps_downward_api_and_claims() {
    if !support::kubectl_available() || !support::containerd_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(
        &["up", "--container-runtime", "cri"],
        &dir.path().join("data"),
    );
    eventually("the default service account", WAIT, || {
        s.kubectl(&["get", "serviceaccount", "default"])
            .status
            .success()
            .then_some(())
    });
    s.apply(CONFIG_MAP);
    s.apply(CLAIM);
    s.apply(POD);
    wait_running(&s, "app");
    let logs = eventually("the pod's output", WAIT, || {
        let logs = s.ok(&["logs", "app"]);
        logs.contains("claim:").then_some(logs)
    });
    assert_eq!(logs, "greeting: hello\nclaim: empty\n");
    assert_eq!(
        exec(&s, "app", &["readlink", "/etc/app/greeting"]).as_deref(),
        Some("..data/greeting\n")
    );

    // The service account's projected volume that admission adds: a token, the CA and the
    // namespace.
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert_eq!(
        exec(&s, "app", &["cat", &format!("{sa}/namespace")]).as_deref(),
        Some("default")
    );
    let token = exec(&s, "app", &["cat", &format!("{sa}/token")]).unwrap_or_default();
    assert_eq!(token.split('.').count(), 3, "a JWT expected: {token:?}");
    let ca = exec(&s, "app", &["cat", &format!("{sa}/ca.crt")]).unwrap_or_default();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");

    // kubectl edit of the ConfigMap reaches the running container's file.
    let editor = dir.path().join("edit.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nsed -i 's/greeting: hello/greeting: changed/' \"$1\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = s
        .kubectl_command(&["edit", "configmap", "app-config"])
        .env("KUBE_EDITOR", &editor)
        .output()
        .unwrap();
    support::expect_success("kubectl edit", &out);
    eventually("the edited ConfigMap in the pod", UPDATE_WAIT, || {
        (exec(&s, "app", &["cat", "/etc/app/greeting"]).as_deref() == Some("changed")).then_some(())
    });

    // The downwardAPI volume shows the labels and follows kubectl label.
    assert_eq!(
        exec(&s, "app", &["cat", "/etc/podinfo/labels"]).as_deref(),
        Some("app=\"demo\"")
    );
    s.ok(&["label", "pod", "app", "tier=web"]);
    eventually("the new label in the pod", UPDATE_WAIT, || {
        (exec(&s, "app", &["cat", "/etc/podinfo/labels"]).as_deref()
            == Some("app=\"demo\"\ntier=\"web\""))
        .then_some(())
    });

    // The claim keeps what the pod wrote across the pod's recreation.
    let volume = jsonpath(&s, &["pvc", "data"], "{.spec.volumeName}").unwrap();
    let path = jsonpath(&s, &["pv", &volume], "{.spec.hostPath.path}").unwrap();
    eventually("the pod's write to its claim", WAIT, || {
        (std::fs::read_to_string(Path::new(&path).join("written"))
            .ok()?
            .trim()
            == "kept")
            .then_some(())
    });
    s.ok(&["delete", "pod", "app", "--wait=true", "--timeout=60s"]);
    s.apply(POD);
    wait_running(&s, "app");
    let logs = eventually("the recreated pod's output", WAIT, || {
        let logs = s.ok(&["logs", "app"]);
        logs.contains("claim:").then_some(logs)
    });
    assert_eq!(logs, "greeting: changed\nclaim: kept\n");

    // Deleting the pod and then the claim removes the volume's directory (Delete).
    s.ok(&["delete", "pod", "app", "--wait=true", "--timeout=60s"]);
    s.ok(&["delete", "pvc", "data", "--wait=true", "--timeout=60s"]);
    eventually("the volume's directory to be removed", WAIT, || {
        (!Path::new(&path).exists()).then_some(())
    });

    // A missing ConfigMap: the container waits with the kubelet's message and a FailedMount
    // Event, and starts once the ConfigMap exists.
    s.apply(WAITING_POD);
    let expected = "MountVolume.SetUp failed for volume \"later\" : configmap \"later\" not found";
    eventually("the missing ConfigMap in the pod's status", WAIT, || {
        (jsonpath(
            &s,
            &["pod", "waits"],
            "{.status.containerStatuses[0].state.waiting.message}",
        )
        .as_deref()
            == Some(expected))
        .then_some(())
    });
    eventually("the FailedMount event", WAIT, || {
        let out = s.ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=waits,reason=FailedMount",
            "-o",
            "jsonpath={.items[*].message}",
        ]);
        out.contains(expected).then_some(())
    });
    s.apply("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: later\ndata:\n  key: here\n");
    wait_running(&s, "waits");
    let logs = eventually("the waiting pod's output", WAIT, || {
        let logs = s.ok(&["logs", "waits"]);
        (!logs.is_empty()).then_some(logs)
    });
    assert_eq!(logs, "key: here\n");

    s.ok(&["delete", "pods", "--all", "--wait=true", "--timeout=120s"]);
    s.stop();
}
