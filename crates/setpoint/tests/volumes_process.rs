//! End to end with the real kubectl against `setpoint up` on a process node
//! (`--container-runtime process`): a pod's volumes are mounted in its container's own mount
//! namespace. A ConfigMap at `/etc/app` and an env var from a Secret are printed by the
//! container; the file changes in place after `kubectl apply` edits the ConfigMap, while the
//! env var keeps its value when the Secret is edited (as upstream); a downwardAPI volume shows the pod's labels and follows
//! `kubectl label`; a claim of the default StorageClass keeps a file across the pod's
//! recreation and goes with the claim (Delete); `kubectl exec` sees what the container sees,
//! and the node does not see the container's mounts.
//!
//! Where the agent may not create mount namespaces (not root), the pod is refused with
//! `CreateContainerConfigError` saying why, which the test checks instead.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::path::Path;
use std::time::Duration;

mod support;

use support::{eventually, Setpoint};

const WAIT: Duration = Duration::from_secs(60);

/// The documented bound on a ConfigMap edit reaching a running pod's files (the agent's
/// sync period, with room for a loaded machine).
const UPDATE_WAIT: Duration = Duration::from_secs(90);

/// `kubectl get <what> -o jsonpath=<path>` (in `default`), or `None` if it fails or is empty.
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

/// Whether this process (and so the agent it starts) may create mount namespaces.
fn mount_namespaces_permitted() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << 21) != 0)
}

fn secret(password: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: app-secret\nstringData:\n  password: {password}\n"
    )
}

fn config_map(greeting: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\ndata:\n  greeting: {greeting}\n"
    )
}

/// The pod: prints the ConfigMap's file and what the claim held, then writes to the claim.
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
    image: busybox
    command:
    - sh
    - -c
    - |
      echo "greeting: $(cat /etc/app/greeting)"
      echo "password: $PASSWORD"
      echo "claim: $(cat /var/lib/app-data/written 2>/dev/null || echo empty)"
      echo kept > /var/lib/app-data/written
      while true; do sleep 1; done
    env:
    - name: PASSWORD
      valueFrom:
        secretKeyRef: {name: app-secret, key: password}
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

const CLAIM: &str = "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n";

fn wait_running(s: &Setpoint, pod: &str) {
    eventually(&format!("pod {pod} Running"), WAIT, || {
        (jsonpath(s, &["pod", pod], "{.status.phase}").as_deref() == Some("Running")).then_some(())
    });
}

#[test]
fn process_pods_mount_config_maps_downward_api_and_claims() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(
        &["up", "--container-runtime", "process"],
        &dir.path().join("data"),
    );
    s.apply(&config_map("hello"));
    s.apply(&secret("s3cret"));
    s.apply(CLAIM);
    let etc_app_existed = Path::new("/etc/app").exists();
    s.apply(POD);

    if !mount_namespaces_permitted() {
        let message = eventually("the container to be refused", WAIT, || {
            jsonpath(
                &s,
                &["pod", "app"],
                "{.status.containerStatuses[0].state.waiting.message}",
            )
            .filter(|m| m.contains("private mount namespace"))
        });
        assert_eq!(
            jsonpath(
                &s,
                &["pod", "app"],
                "{.status.containerStatuses[0].state.waiting.reason}"
            )
            .as_deref(),
            Some("CreateContainerConfigError"),
            "{message}"
        );
        return;
    }

    wait_running(&s, "app");
    let logs = eventually("the pod's output", WAIT, || {
        let logs = s.ok(&["logs", "app"]);
        logs.contains("claim:").then_some(logs)
    });
    assert_eq!(logs, "greeting: hello\npassword: s3cret\nclaim: empty\n");

    // kubectl exec runs in the container's mount namespace; the node has none of it.
    assert_eq!(
        exec(&s, "app", &["cat", "/etc/app/greeting"]).as_deref(),
        Some("hello")
    );
    assert!(
        !Path::new("/etc/app/greeting").exists(),
        "the container's mount is not the node's"
    );

    // An edit of the ConfigMap reaches the running pod's file; its output stays. The Secret
    // is edited first: once the file has changed the pod has been synced since, and its
    // environment still holds the value it started with, as upstream's does.
    s.apply(&secret("rotated"));
    s.apply(&config_map("changed"));
    eventually("the edited ConfigMap in the pod", UPDATE_WAIT, || {
        (exec(&s, "app", &["cat", "/etc/app/greeting"]).as_deref() == Some("changed")).then_some(())
    });
    assert_eq!(
        exec(&s, "app", &["sh", "-c", "echo $PASSWORD"])
            .as_deref()
            .map(str::trim),
        Some("s3cret")
    );

    // The downwardAPI volume shows the labels, and follows kubectl label.
    let labels = exec(&s, "app", &["cat", "/etc/podinfo/labels"]).unwrap();
    assert_eq!(labels, "app=\"demo\"");
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
    s.ok(&["delete", "pod", "app", "--wait=true"]);
    s.apply(POD);
    wait_running(&s, "app");
    let logs = eventually("the recreated pod's output", WAIT, || {
        let logs = s.ok(&["logs", "app"]);
        logs.contains("claim:").then_some(logs)
    });
    assert_eq!(logs, "greeting: changed\npassword: rotated\nclaim: kept\n");

    // Deleting the pod and the claim removes the volume's directory (Delete), and the
    // mount point made for /etc/app when the node had none.
    s.ok(&["delete", "pod", "app", "--wait=true"]);
    s.ok(&["delete", "pvc", "data", "--wait=true"]);
    eventually("the volume's directory to be removed", WAIT, || {
        (!Path::new(&path).exists()).then_some(())
    });
    if !etc_app_existed {
        eventually("the /etc/app mount point to be removed", WAIT, || {
            (!Path::new("/etc/app").exists()).then_some(())
        });
    }
}
