//! End to end: the real `kubectl` against `setpoint up` on a temporary data dir.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

mod support;

use support::Setpoint;

#[test]
fn kubectl_tour() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let c = Setpoint::up(data.path());
    assert!(c.url.starts_with("https://"));

    let v = c.ok(&["version", "-o", "json"]);
    assert!(v.contains("\"minor\": \"32\""), "{v}");

    assert!(c
        .ok(&["create", "namespace", "demo"])
        .contains("namespace/demo created"));
    let out = c.ok(&[
        "-n",
        "demo",
        "create",
        "deployment",
        "demo",
        "--image=nginx:1.25",
        "--replicas=3",
    ]);
    assert!(out.contains("deployment.apps/demo created"), "{out}");

    let table = c.ok(&["-n", "demo", "get", "deploy"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]);
    assert!(table.contains("demo"), "{table}");

    let yaml = c.ok(&["-n", "demo", "get", "deploy", "demo", "-o", "yaml"]);
    for expected in [
        "maxSurge: 25%",
        "revisionHistoryLimit: 10",
        "progressDeadlineSeconds: 600",
        "restartPolicy: Always",
        "imagePullPolicy: IfNotPresent",
        "terminationGracePeriodSeconds: 30",
        "dnsPolicy: ClusterFirst",
    ] {
        assert!(yaml.contains(expected), "missing {expected:?} in\n{yaml}");
    }
    assert_eq!(
        c.ok(&[
            "-n",
            "demo",
            "get",
            "deploy",
            "demo",
            "-o",
            "jsonpath={.metadata.generation}"
        ]),
        "1"
    );

    assert!(c
        .ok(&["-n", "demo", "scale", "deployment", "demo", "--replicas=5"])
        .contains("scaled"));
    assert_eq!(
        c.ok(&[
            "-n",
            "demo",
            "get",
            "deploy",
            "demo",
            "-o",
            "jsonpath={.metadata.generation} {.spec.replicas}"
        ]),
        "2 5"
    );

    let all = c.ok(&["get", "all", "-n", "demo"]);
    assert!(all.contains("deployment.apps/demo"), "{all}");

    let resources = c.ok(&["api-resources"]);
    for (name, short) in [
        ("deployments", "deploy"),
        ("pods", "po"),
        ("namespaces", "ns"),
        ("configmaps", "cm"),
        ("replicasets", "rs"),
        ("services", "svc"),
        ("leases", ""),
    ] {
        let line = resources
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} not in api-resources:\n{resources}"));
        if !short.is_empty() {
            assert!(
                line.split_whitespace()
                    .any(|w| w.split(',').any(|s| s == short)),
                "{line}"
            );
        }
    }

    let manifests = tempfile::tempdir().unwrap();
    let bad = manifests.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Bad_Name\n  namespace: demo\ndata:\n  a: b\n").unwrap();
    let err = c.fails(&["create", "-f", bad.to_str().unwrap()]);
    assert!(
        err.contains("is invalid") && err.contains("metadata.name"),
        "{err}"
    );

    let good = manifests.path().join("cm.yaml");
    std::fs::write(&good, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: demo\ndata:\n  a: b\n").unwrap();
    assert!(c
        .ok(&["create", "-f", good.to_str().unwrap()])
        .contains("configmap/settings created"));
    let err = c.fails(&["create", "-f", good.to_str().unwrap()]);
    assert!(err.contains("AlreadyExists"), "{err}");

    // `kubectl get -w` prints later changes.
    let mut watch = c
        .kubectl_command(&[
            "-n",
            "demo",
            "get",
            "configmaps",
            "-w",
            "--output-watch-events",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut wlines = BufReader::new(watch.stdout.take().unwrap()).lines();
    // The initial listing comes first.
    let mut saw_initial = false;
    for line in wlines.by_ref() {
        if line.unwrap().contains("settings") {
            saw_initial = true;
            break;
        }
    }
    assert!(saw_initial);
    c.ok(&[
        "-n",
        "demo",
        "create",
        "configmap",
        "later",
        "--from-literal=x=y",
    ]);
    let mut saw_later = false;
    for line in wlines.by_ref() {
        let line = line.unwrap();
        if line.contains("later") {
            assert!(line.starts_with("ADDED"), "{line}");
            saw_later = true;
            break;
        }
    }
    assert!(saw_later);
    let _ = watch.kill();
    let _ = watch.wait();

    assert!(c
        .ok(&["-n", "demo", "delete", "configmap", "settings"])
        .contains("deleted"));
    let err = c.fails(&["-n", "demo", "get", "configmap", "settings"]);
    assert!(err.contains("NotFound"), "{err}");
    assert!(c
        .ok(&["-n", "demo", "delete", "deployment", "demo"])
        .contains("deleted"));

    // Restart on the same data dir: objects and resourceVersions survive.
    let rv_before: i64 = c
        .ok(&[
            "-n",
            "demo",
            "get",
            "configmap",
            "later",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
        .parse()
        .unwrap();
    c.stop();
    let c = Setpoint::up(data.path());
    assert_eq!(
        c.ok(&[
            "-n",
            "demo",
            "get",
            "configmap",
            "later",
            "-o",
            "jsonpath={.metadata.resourceVersion}"
        ])
        .parse::<i64>()
        .unwrap(),
        rv_before
    );
    c.ok(&["-n", "demo", "create", "configmap", "after-restart"]);
    let rv_after: i64 = c
        .ok(&[
            "-n",
            "demo",
            "get",
            "configmap",
            "after-restart",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
        .parse()
        .unwrap();
    assert!(rv_after > rv_before);
    c.stop();
}
