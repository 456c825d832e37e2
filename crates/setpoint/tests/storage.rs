//! End to end with the real kubectl against `setpoint up`: persistent storage in the control
//! plane. The default `local-path` StorageClass; a claim used by a pod is provisioned on the
//! pod's node (a directory under the node's data dir, node affinity to the node) and bound,
//! and deleting the pod and the claim removes the volume and its directory; a pod whose claim
//! does not exist stays Pending with the scheduler's message; a static volume binds to a
//! matching claim and is `Released` (Retain) once the claim is deleted.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::path::Path;
use std::time::Duration;

mod support;

use support::{eventually, Setpoint};

const WAIT: Duration = Duration::from_secs(30);

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

fn pod_using(name: &str, claim: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: busybox\n    command: [sleep, '300']\n    volumeMounts:\n    - name: data\n      mountPath: /data\n  volumes:\n  - name: data\n    persistentVolumeClaim:\n      claimName: {claim}\n"
    )
}

#[test]
fn local_path_provisioning_static_binding_and_missing_claims() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&dir.path().join("data"));

    // The default class, marked as such in the table.
    let classes = s.ok(&["get", "sc"]);
    let row = classes
        .lines()
        .find(|l| l.starts_with("local-path"))
        .unwrap_or_else(|| panic!("no local-path class in\n{classes}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells[..6],
        [
            "local-path",
            "(default)",
            "setpoint.io/local-path",
            "Delete",
            "WaitForFirstConsumer",
            "false"
        ],
        "{classes}"
    );

    // A claim naming no class gets the default and waits for its first consumer.
    s.apply(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n",
    );
    assert_eq!(
        jsonpath(&s, &["pvc", "data"], "{.spec.storageClassName}").as_deref(),
        Some("local-path")
    );
    assert_eq!(
        jsonpath(&s, &["pvc", "data"], "{.metadata.finalizers[0]}").as_deref(),
        Some("kubernetes.io/pvc-protection")
    );
    eventually("the WaitForFirstConsumer event", WAIT, || {
        let events = s.ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=data",
        ]);
        events
            .contains("waiting for first consumer to be created before binding")
            .then_some(())
    });
    assert_eq!(
        jsonpath(&s, &["pvc", "data"], "{.status.phase}").as_deref(),
        Some("Pending")
    );

    // A pod using it: the scheduler picks a node, the volume is provisioned there and bound.
    s.apply(&pod_using("app", "data"));
    let volume = eventually("the claim to be bound", WAIT, || {
        (jsonpath(&s, &["pvc", "data"], "{.status.phase}").as_deref() == Some("Bound"))
            .then(|| jsonpath(&s, &["pvc", "data"], "{.spec.volumeName}"))
            .flatten()
    });
    let node = eventually("the pod to be scheduled", WAIT, || {
        jsonpath(&s, &["pod", "app"], "{.spec.nodeName}")
    });
    let affinity = jsonpath(
        &s,
        &["pv", &volume],
        "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}",
    );
    assert_eq!(affinity.as_deref(), Some(node.as_str()));
    let path = jsonpath(&s, &["pv", &volume], "{.spec.hostPath.path}").unwrap();
    let storage_root = s
        .data_dir
        .join("node")
        .join("storage")
        .canonicalize()
        .unwrap();
    assert!(
        Path::new(&path).starts_with(&storage_root),
        "{path} is not under {}",
        storage_root.display()
    );
    eventually("the volume's directory on the node", WAIT, || {
        Path::new(&path).is_dir().then_some(())
    });
    let tables = s.ok(&["get", "pv,pvc"]);
    let pv_row = tables
        .lines()
        .find(|l| l.starts_with(&format!("persistentvolume/{volume}")))
        .unwrap_or_else(|| panic!("no row for the volume in\n{tables}"));
    let pv_cells: Vec<&str> = pv_row.split_whitespace().collect();
    assert_eq!(
        pv_cells[1..7],
        [
            "1Gi",
            "RWO",
            "Delete",
            "Bound",
            "default/data",
            "local-path"
        ],
        "{tables}"
    );
    let pvc_row = tables
        .lines()
        .find(|l| l.starts_with("persistentvolumeclaim/data"))
        .unwrap_or_else(|| panic!("no row for the claim in\n{tables}"));
    let pvc_cells: Vec<&str> = pvc_row.split_whitespace().collect();
    assert_eq!(
        pvc_cells[1..6],
        ["Bound", volume.as_str(), "1Gi", "RWO", "local-path"],
        "{tables}"
    );
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=data",
    ]);
    assert!(
        events.contains(&format!("Successfully provisioned volume {volume}")),
        "{events}"
    );

    // Deleting the pod and the claim: the volume (Delete) and its directory go.
    s.ok(&["delete", "pod", "app", "--wait=true"]);
    s.ok(&["delete", "pvc", "data", "--wait=true"]);
    eventually("the volume to be deleted", WAIT, || {
        let out = s.kubectl(&["get", "pv", &volume]);
        (!out.status.success()).then_some(())
    });
    assert!(!Path::new(&path).exists(), "{path} is still there");
    // The node's local-path controller recorded why: its decision is in the volume's chain.
    let chain = eventually(
        "the local-path decision in the volume's why chain",
        WAIT,
        || {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_setpoint"))
                .args(["why", &format!("persistentvolume/{volume}"), "--kubeconfig"])
                .arg(&s.kubeconfig)
                .output()
                .expect("run setpoint why");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.contains("rule: Released (its claim is gone) with reclaim policy Delete")
                .then_some(text)
        },
    );
    assert!(
        chain.contains(&format!(
            "remove directory {path}, then delete volume {volume}"
        )),
        "{chain}"
    );

    // A pod whose claim does not exist stays Pending with the scheduler's message.
    s.apply(&pod_using("orphan", "missing"));
    let message = eventually("the pod to be marked unschedulable", WAIT, || {
        jsonpath(
            &s,
            &["pod", "orphan"],
            r#"{.status.conditions[?(@.type=="PodScheduled")].message}"#,
        )
    });
    assert_eq!(
        message,
        "0/1 nodes are available: persistentvolumeclaim \"missing\" not found."
    );
    assert_eq!(
        jsonpath(
            &s,
            &["pod", "orphan"],
            r#"{.status.conditions[?(@.type=="PodScheduled")].reason}"#
        )
        .as_deref(),
        Some("Unschedulable")
    );
    assert_eq!(
        jsonpath(&s, &["pod", "orphan"], "{.status.phase}").as_deref(),
        Some("Pending")
    );

    // A static volume binds to a matching claim (the smaller of two that fit) and is
    // Released, not deleted, once the claim goes (Retain, the default for static volumes).
    let static_dir = dir.path().join("static");
    std::fs::create_dir_all(&static_dir).unwrap();
    for (name, size) in [("static-big", "5Gi"), ("static-small", "2Gi")] {
        s.apply(&format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: {name}\nspec:\n  capacity:\n    storage: {size}\n  accessModes: [ReadWriteOnce]\n  storageClassName: manual\n  hostPath:\n    path: {}\n",
            static_dir.display()
        ));
    }
    assert_eq!(
        jsonpath(
            &s,
            &["pv", "static-small"],
            "{.spec.persistentVolumeReclaimPolicy}"
        )
        .as_deref(),
        Some("Retain")
    );
    eventually("the static volumes to be Available", WAIT, || {
        (jsonpath(&s, &["pv", "static-small"], "{.status.phase}").as_deref() == Some("Available"))
            .then_some(())
    });
    s.apply(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: static-claim\nspec:\n  storageClassName: manual\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n",
    );
    eventually("the static claim to be bound", WAIT, || {
        (jsonpath(&s, &["pvc", "static-claim"], "{.status.phase}").as_deref() == Some("Bound"))
            .then_some(())
    });
    assert_eq!(
        jsonpath(&s, &["pvc", "static-claim"], "{.spec.volumeName}").as_deref(),
        Some("static-small")
    );
    assert_eq!(
        jsonpath(&s, &["pv", "static-small"], "{.spec.claimRef.name}").as_deref(),
        Some("static-claim")
    );
    assert_eq!(
        jsonpath(
            &s,
            &["pvc", "static-claim"],
            r"{.metadata.annotations.pv\.kubernetes\.io/bind-completed}"
        )
        .as_deref(),
        Some("yes")
    );
    s.ok(&["delete", "pvc", "static-claim", "--wait=true"]);
    eventually("the static volume to be Released", WAIT, || {
        (jsonpath(&s, &["pv", "static-small"], "{.status.phase}").as_deref() == Some("Released"))
            .then_some(())
    });
    assert!(static_dir.is_dir());
    assert_eq!(
        jsonpath(&s, &["pv", "static-big"], "{.status.phase}").as_deref(),
        Some("Available")
    );
    s.stop();
}
