//! End to end with the real kubectl against `setpoint up`: a ReplicationController scaled
//! with `kubectl scale rc` and shown by `kubectl get rc`; a Job with
//! `ttlSecondsAfterFinished: 0` deleted once it finishes; the pods (and the Lease) of a
//! deleted Node garbage-collected, and simulated nodes' Leases owned by their Nodes.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::time::Duration;

mod support;

use support::{eventually, lines, Setpoint};

const WAIT: Duration = Duration::from_secs(90);

/// The names of the live (not terminating) pods matching `selector`.
fn live_pods(s: &Setpoint, selector: &str) -> Vec<String> {
    lines(&s.ok(&[
        "get",
        "pods",
        "-l",
        selector,
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    ]))
    .into_iter()
    .filter(|l| l.split_whitespace().count() == 1)
    .collect()
}

fn simulated(prefix: &str, data: &std::path::Path, extra: &[&str]) -> Setpoint {
    let mut args = vec![
        "up",
        "--no-node",
        "--simulate",
        "2",
        "--node-prefix",
        prefix,
        "--start-delay-ms",
        "50",
        "--ready-delay-ms",
        "50",
    ];
    args.extend_from_slice(extra);
    Setpoint::start(&args, &data.join("data"))
}

#[test]
fn replication_controller_scales_with_kubectl() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = simulated("rc-", data.path(), &[]);
    s.apply("apiVersion: v1\nkind: ReplicationController\nmetadata:\n  name: web\nspec:\n  replicas: 2\n  selector:\n    app: web\n  template:\n    metadata:\n      labels:\n        app: web\n    spec:\n      containers:\n      - name: c\n        image: nginx\n");
    let ready = |n: &str| {
        let want = n.to_string();
        eventually(&format!("{n} ready replicas"), WAIT, || {
            let r = s.ok(&["get", "rc", "web", "-o", "jsonpath={.status.readyReplicas}"]);
            (r == want).then_some(())
        })
    };
    ready("2");
    // The pods carry the controller's reference, in its core-group form.
    let owner = s.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.ownerReferences[0].apiVersion}/{.metadata.ownerReferences[0].kind}{"\n"}{end}"#,
    ]);
    assert_eq!(lines(&owner), ["v1/ReplicationController"; 2], "{owner}");

    let scaled = s.ok(&["scale", "rc", "web", "--replicas=4"]);
    assert!(
        scaled.contains("replicationcontroller/web scaled"),
        "{scaled}"
    );
    ready("4");
    let table = lines(&s.ok(&["get", "rc", "web"]));
    let header: Vec<&str> = table[0].split_whitespace().collect();
    assert_eq!(header, ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]);
    let row: Vec<&str> = table[1].split_whitespace().collect();
    assert_eq!(&row[..4], ["web", "4", "4", "4"], "{table:?}");

    s.ok(&["scale", "rc", "web", "--replicas=1"]);
    eventually("one pod left", WAIT, || {
        (live_pods(&s, "app=web").len() == 1).then_some(())
    });
    ready("1");

    // Deleting it takes its pods (background cascading deletion by the garbage collector).
    s.ok(&["delete", "rc", "web"]);
    eventually("the pods gone", WAIT, || {
        live_pods(&s, "app=web").is_empty().then_some(())
    });
    s.stop();
}

#[test]
fn a_job_with_ttl_zero_disappears_after_it_finishes() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&data.path().join("data"));
    let job = |name: &str, ttl: Option<u32>| {
        let ttl = ttl
            .map(|t| format!("  ttlSecondsAfterFinished: {t}\n"))
            .unwrap_or_default();
        format!("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\nspec:\n{ttl}  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: work\n        image: busybox\n        command: [sh, -c, 'echo done']\n")
    };
    s.apply(&job("kept", None));
    s.apply(&job("hour", Some(3600)));
    s.apply(&job("gone", Some(0)));
    for name in ["kept", "hour"] {
        let waited = s.ok(&[
            "wait",
            "--for=condition=Complete",
            &format!("job/{name}"),
            "--timeout=120s",
        ]);
        assert!(waited.contains("condition met"), "{waited}");
    }
    eventually("the Job with a zero TTL and its pods gone", WAIT, || {
        let jobs = lines(&s.ok(&["get", "jobs", "-o", "name"]));
        let pods = live_pods(&s, "job-name=gone");
        (!jobs.iter().any(|j| j == "job.batch/gone") && pods.is_empty()).then_some(())
    });
    // The others finished as well, and stay: no TTL, or one not yet run out.
    let jobs = lines(&s.ok(&["get", "jobs", "-o", "name"]));
    assert!(jobs.contains(&"job.batch/kept".to_string()), "{jobs:?}");
    assert!(jobs.contains(&"job.batch/hour".to_string()), "{jobs:?}");
    s.stop();
}

#[test]
fn pods_and_lease_of_a_deleted_node_are_garbage_collected() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = simulated("gc-", data.path(), &["--pod-gc-quarantine-seconds", "1"]);

    // A simulated node's Lease is owned by its Node.
    let (uid, owner) = eventually("gc-0's Lease owned by its Node", WAIT, || {
        let uid = s.ok(&["get", "node", "gc-0", "-o", "jsonpath={.metadata.uid}"]);
        let owner = s.ok(&[
            "get",
            "lease",
            "-n",
            "kube-node-lease",
            "gc-0",
            "-o",
            "jsonpath={.metadata.ownerReferences[0].apiVersion} {.metadata.ownerReferences[0].kind} {.metadata.ownerReferences[0].name} {.metadata.ownerReferences[0].uid}",
        ]);
        (!uid.is_empty() && owner.ends_with(&uid)).then_some((uid, owner))
    });
    assert_eq!(owner, format!("v1 Node gc-0 {uid}"));

    // A Node no agent runs, with a Lease it owns and pods bound to it; one pod held by a
    // finalizer, so what the collector did to it can be seen.
    s.apply("apiVersion: v1\nkind: Node\nmetadata:\n  name: ghost\n");
    let ghost = s.ok(&["get", "node", "ghost", "-o", "jsonpath={.metadata.uid}"]);
    s.apply(&format!("apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: ghost\n  namespace: kube-node-lease\n  ownerReferences:\n  - apiVersion: v1\n    kind: Node\n    name: ghost\n    uid: {ghost}\nspec:\n  holderIdentity: ghost\n"));
    for (name, finalizer) in [
        ("p1", ""),
        ("p2", "  finalizers: [setpoint.dev/test-hold]\n"),
    ] {
        s.apply(&format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    host: ghost\n{finalizer}spec:\n  nodeName: ghost\n  containers:\n  - name: c\n    image: nginx\n"));
    }
    // A pod bound to a live node stays.
    s.apply("apiVersion: v1\nkind: Pod\nmetadata:\n  name: alive\n  labels:\n    host: gc-0\nspec:\n  nodeName: gc-0\n  containers:\n  - name: c\n    image: nginx\n");

    s.ok(&["delete", "node", "ghost"]);
    eventually("the ghost's pods deleted and its Lease gone", WAIT, || {
        let pods = live_pods(&s, "host=ghost");
        let lease = lines(&s.ok(&["get", "lease", "-n", "kube-node-lease", "-o", "name"]));
        (pods.is_empty() && !lease.iter().any(|l| l.ends_with("/ghost"))).then_some(())
    });
    let p2 = s.ok(&[
        "get",
        "pod",
        "p2",
        "-o",
        r#"jsonpath={.status.phase} {.status.conditions[?(@.type=="DisruptionTarget")].reason} {.status.conditions[?(@.type=="DisruptionTarget")].message}"#,
    ]);
    assert_eq!(p2, "Failed DeletionByPodGC PodGC: node no longer exists");
    assert!(s.fails(&["get", "pod", "p1"]).contains("NotFound"));
    s.ok(&[
        "patch",
        "pod",
        "p2",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    assert_eq!(live_pods(&s, "host=gc-0"), ["alive"]);
    s.stop();
}
