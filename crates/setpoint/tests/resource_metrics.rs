//! End to end: the resource metrics pipeline with the real `kubectl` against `setpoint up`.
//! The node agents measure (simulated nodes their steered usage, the local process node the
//! processes it runs), the API server scrapes them every `--metric-resolution` and serves
//! `metrics.k8s.io/v1beta1`, and `kubectl top` reads it.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::time::Duration;

mod support;

use support::{eventually, lines, Setpoint};

const WAIT: Duration = Duration::from_secs(90);

/// A Deployment of `replicas` simulated pods, each container steered to `cpu` and `memory`.
fn steered(name: &str, replicas: u32, cpu: &str, memory: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
      annotations:
        setpoint.dev/simulated-cpu: {cpu}
        setpoint.dev/simulated-memory: {memory}
    spec:
      containers:
      - name: main
        image: nginx:1.25
      - name: sidecar
        image: busybox:1.36
"
    )
}

/// The rows of a `kubectl top` table, split into columns, header left out.
fn rows(text: &str) -> Vec<Vec<String>> {
    lines(text)
        .into_iter()
        .skip(1)
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

/// Millicores from kubectl's CPU column (`140m`, `2`).
fn millis(cpu: &str) -> i64 {
    match cpu.strip_suffix('m') {
        Some(m) => m.parse().unwrap(),
        None => cpu.parse::<i64>().unwrap() * 1000,
    }
}

/// Whether a CPU figure is `want` millicores, give or take the 1m a window's edges blur.
fn about(cpu: &str, want: i64) -> bool {
    (millis(cpu) - want).abs() <= 2
}

#[test]
fn kubectl_top_shows_simulated_nodes_steered_usage() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::start(
        &[
            "up",
            "--no-node",
            "--simulate",
            "2",
            "--node-prefix",
            "top-",
            "--start-delay-ms",
            "50",
            "--ready-delay-ms",
            "50",
            "--metric-resolution",
            "1s",
        ],
        &data.path().join("data"),
    );
    // kubectl finds the group through discovery.
    let groups = s.ok(&["api-versions"]);
    assert!(
        lines(&groups).contains(&"metrics.k8s.io/v1beta1".to_string()),
        "{groups}"
    );
    s.apply(&steered("web", 3, "140m", "64Mi"));
    s.apply(&steered("batch", 1, "300m", "16Mi"));

    // Each pod: two containers, 140m and 64Mi each.
    let pods = eventually("4 pods with figures", WAIT, || {
        let out = s.kubectl(&["top", "pods"]);
        if !out.status.success() {
            return None;
        }
        let rows = rows(&String::from_utf8_lossy(&out.stdout));
        (rows.len() == 4).then_some(rows)
    });
    for row in &pods {
        let (cpu, memory) = if row[0].starts_with("web-") {
            (280, "128Mi")
        } else {
            (600, "32Mi")
        };
        assert!(about(&row[1], cpu), "{row:?}");
        assert_eq!(row[2], memory, "{row:?}");
    }

    // --containers: one row a container.
    let containers = rows(&s.ok(&["top", "pods", "--containers", "-l", "app=web"]));
    assert_eq!(containers.len(), 6, "{containers:?}");
    for row in &containers {
        assert!(row[0].starts_with("web-"), "{row:?}");
        assert!(row[1] == "main" || row[1] == "sidecar", "{row:?}");
        assert!(about(&row[2], 140), "{row:?}");
        assert_eq!(row[3], "64Mi", "{row:?}");
    }

    // --sort-by=cpu puts the busiest first; -A adds the namespace column.
    let sorted = rows(&s.ok(&["top", "pods", "-A", "--sort-by=cpu"]));
    assert_eq!(sorted.len(), 4, "{sorted:?}");
    assert_eq!(sorted[0][0], "default", "{sorted:?}");
    assert!(sorted[0][1].starts_with("batch-"), "{sorted:?}");
    let by_memory = rows(&s.ok(&["top", "pods", "--sort-by=memory"]));
    assert!(by_memory[0][0].starts_with("web-"), "{by_memory:?}");
    assert!(by_memory[3][0].starts_with("batch-"), "{by_memory:?}");

    // The nodes: 100m and 256Mi of their own, plus their pods'.
    let nodes = eventually("2 nodes with figures", WAIT, || {
        let out = s.kubectl(&["top", "nodes"]);
        let rows = rows(&String::from_utf8_lossy(&out.stdout));
        (out.status.success() && rows.len() == 2).then_some(rows)
    });
    let total: i64 = nodes.iter().map(|r| millis(&r[1])).sum();
    assert!((total - (200 + 3 * 280 + 600)).abs() <= 4, "{nodes:?}");
    let memory: Vec<&str> = nodes.iter().map(|r| r[3].as_str()).collect();
    // 2 × 256Mi + 3 × 128Mi + 32Mi in all.
    let mib: i64 = memory
        .iter()
        .map(|m| m.trim_end_matches("Mi").parse::<i64>().unwrap())
        .sum();
    assert_eq!(mib, 2 * 256 + 3 * 128 + 32, "{nodes:?}");

    // Deleted pods disappear from the figures.
    s.ok(&["delete", "deployment", "batch", "--wait=false"]);
    eventually("the deleted pod's figures gone", WAIT, || {
        let rows = rows(&s.ok(&["top", "pods"]));
        rows.iter().all(|r| r[0].starts_with("web-")).then_some(())
    });
    // A pod by name; an unknown one is NotFound as metrics-server says it.
    let one = &pods.iter().find(|r| r[0].starts_with("web-")).unwrap()[0];
    let raw = s.ok(&[
        "get",
        "--raw",
        &format!("/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/{one}"),
    ]);
    let doc: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(doc["kind"], "PodMetrics", "{doc}");
    assert_eq!(doc["metadata"]["labels"]["app"], "web", "{doc}");
    assert!(doc["window"].as_str().unwrap().ends_with('s'), "{doc}");
    let missing = s.fails(&["top", "pod", "nope"]);
    assert!(missing.contains("not found"), "{missing}");
    s.stop();
}

#[test]
fn kubectl_top_and_the_summary_api_measure_a_busy_process() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::start(
        &["up", "--metric-resolution", "1s"],
        &data.path().join("data"),
    );
    s.apply(
        "apiVersion: v1
kind: Pod
metadata:
  name: burn
  labels: {app: burn}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: burn
    image: busybox
    command: [sh, -c, 'while :; do :; done']
",
    );
    let row = eventually("the busy pod's figures", WAIT, || {
        let out = s.kubectl(&["top", "pod", "burn"]);
        let rows = rows(&String::from_utf8_lossy(&out.stdout));
        // A busy loop uses most of a core; on a shared machine at least a tenth of one.
        rows.into_iter()
            .next()
            .filter(|r| out.status.success() && millis(&r[1]) >= 100)
    });
    assert_eq!(row[0], "burn");
    let nodes = rows(&s.ok(&["top", "nodes"]));
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert!(millis(&nodes[0][1]) >= 100, "{nodes:?}");

    // The agent's own endpoints, with the admin's client certificate (the cluster CA signs
    // it, which is all the agent asks).
    let node = s.ok(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"]);
    let port = s.ok(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={.items[0].status.daemonEndpoints.kubeletEndpoint.Port}",
    ]);
    let pem = |field: &str| {
        let b64 = s.ok(&[
            "config",
            "view",
            "--raw",
            "-o",
            &format!("jsonpath={{.users[0].user.{field}}}"),
        ]);
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .unwrap()
    };
    let cert = data.path().join("admin.crt");
    let key = data.path().join("admin.key");
    std::fs::write(&cert, pem("client-certificate-data")).unwrap();
    std::fs::write(&key, pem("client-key-data")).unwrap();
    let get = |path: &str| {
        let out = std::process::Command::new("curl")
            .args(["-sfk", "--cert"])
            .arg(&cert)
            .arg("--key")
            .arg(&key)
            .arg(format!("https://127.0.0.1:{}{path}", port.trim()))
            .output()
            .expect("run curl");
        assert!(out.status.success(), "curl {path}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let summary: serde_json::Value = serde_json::from_str(&get("/stats/summary")).unwrap();
    assert_eq!(summary["node"]["nodeName"], node.trim(), "{summary}");
    assert!(
        summary["node"]["cpu"]["usageCoreNanoSeconds"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(
        summary["node"]["memory"]["workingSetBytes"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(
        summary["node"]["memory"]["availableBytes"]
            .as_u64()
            .unwrap()
            > 0
    );
    let pod = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["name"] == "burn")
        .unwrap_or_else(|| panic!("no burn pod in {summary}"));
    assert_eq!(pod["podRef"]["namespace"], "default");
    let c = &pod["containers"][0];
    assert_eq!(c["name"], "burn");
    assert!(
        c["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0,
        "{c}"
    );
    assert!(c["memory"]["workingSetBytes"].as_u64().unwrap() > 0, "{c}");
    assert!(c["startTime"].as_str().unwrap().ends_with('Z'), "{c}");
    let text = get("/metrics/resource");
    for name in [
        "node_cpu_usage_seconds_total ",
        "node_memory_working_set_bytes ",
        "container_cpu_usage_seconds_total{container=\"burn\",namespace=\"default\",pod=\"burn\"} ",
        "container_memory_working_set_bytes{container=\"burn\",namespace=\"default\",pod=\"burn\"} ",
        "container_start_time_seconds{container=\"burn\",namespace=\"default\",pod=\"burn\"} ",
        "pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"burn\"} ",
        "pod_memory_working_set_bytes{namespace=\"default\",pod=\"burn\"} ",
        "scrape_error 0",
    ] {
        assert!(text.lines().any(|l| l.starts_with(name)), "{name} in\n{text}");
    }
    s.ok(&["delete", "pod", "burn", "--wait=false"]);
    s.stop();
}
