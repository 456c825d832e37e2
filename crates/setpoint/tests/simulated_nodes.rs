//! End to end: two `setpoint agent --simulate 5` processes against one `setpoint up` with no
//! local node. Stopping one agent turns its nodes `Unknown`, taints them, and its pods are
//! recreated on the other agent's nodes; a pod too big for any node waits until a big enough
//! node joins. And `setpoint up --simulate N` hosting the nodes itself, which
//! `setpoint bench density --reuse-nodes` then uses.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod support;

use support::{eventually, Setpoint};

/// A `setpoint agent --simulate` process, killed when dropped.
struct Agent(Child);

impl Agent {
    fn start(kubeconfig: &Path, prefix: &str, nodes: usize, cpu: &str) -> Agent {
        let child = Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args([
                "agent",
                "--simulate",
                &nodes.to_string(),
                "--node-prefix",
                prefix,
            ])
            .args(["--node-cpu", cpu, "--lease-interval-seconds", "1"])
            .args(["--start-delay-ms", "50", "--ready-delay-ms", "50"])
            .args(["--listen", "127.0.0.1:0", "--kubeconfig"])
            .arg(kubeconfig)
            .env("SETPOINT_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("start setpoint agent");
        Agent(child)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// `node ready-status` per node.
fn node_states(s: &Setpoint) -> Vec<String> {
    lines(&s.ok(&[
        "get", "nodes", "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
    ]))
}

/// The nodes of the ready pods of `app=spread`.
fn ready_pod_nodes(s: &Setpoint) -> Vec<String> {
    ready_pod_nodes_of(s, "app=spread")
}

/// The nodes of the ready pods `selector` selects.
fn ready_pod_nodes_of(s: &Setpoint, selector: &str) -> Vec<String> {
    let all = lines(&s.ok(&[
        "get", "pods", "-l", selector, "-o",
        r#"jsonpath={range .items[*]}{.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
    ]));
    all.into_iter()
        .filter_map(|l| l.strip_suffix(" True").map(String::from))
        .collect()
}

#[test]
fn a_lost_agents_pods_move_to_the_other_agents_nodes() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::start(
        &[
            "up",
            "--no-node",
            "--node-monitor-grace-period-seconds",
            "3",
            "--default-toleration-seconds",
            "2",
        ],
        &data.path().join("data"),
    );
    let a = Agent::start(&s.kubeconfig, "a-", 5, "8");
    let _b = Agent::start(&s.kubeconfig, "b-", 5, "8");
    eventually("10 Ready nodes", Duration::from_secs(60), || {
        let states = node_states(&s);
        (states.len() == 10 && states.iter().all(|l| l.ends_with(" True"))).then_some(())
    });

    s.apply("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: spread\nspec:\n  replicas: 10\n  selector:\n    matchLabels: {app: spread}\n  template:\n    metadata:\n      labels: {app: spread}\n    spec:\n      containers:\n      - name: c\n        image: nginx:1.25\n        resources:\n          requests: {cpu: 100m}\n");
    let placed = eventually("10 ready pods", Duration::from_secs(60), || {
        let nodes = ready_pod_nodes(&s);
        (nodes.len() == 10).then_some(nodes)
    });
    let on_a = placed.iter().filter(|n| n.starts_with("a-")).count();
    assert!(
        on_a > 0,
        "the scheduler spreads pods over both agents: {placed:?}"
    );

    // The agent of the a- nodes dies.
    drop(a);
    eventually(
        "the a- nodes to turn Unknown and be tainted",
        Duration::from_secs(60),
        || {
            let states = node_states(&s);
            let unknown = states
                .iter()
                .filter(|l| l.starts_with("a-") && l.ends_with(" Unknown"))
                .count();
            let tainted = lines(&s.ok(&[
                "get",
                "nodes",
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.name} {.spec.taints[*].key}{"\n"}{end}"#,
            ]))
            .into_iter()
            .filter(|l| l.starts_with("a-") && l.contains("node.kubernetes.io/unreachable"))
            .count();
            (unknown == 5 && tainted == 5).then_some(())
        },
    );
    // Their pods are evicted once the 2 s toleration runs out, and recreated on b- nodes.
    let moved = eventually(
        "all 10 ready pods on b- nodes",
        Duration::from_secs(60),
        || {
            let nodes = ready_pod_nodes(&s);
            // Pods on the dead nodes stay Terminating (no agent confirms); the live ones count.
            let live: Vec<String> = lines(&s.ok(&[
                "get",
                "pods",
                "-l",
                "app=spread",
                "--no-headers",
                "-o",
                "custom-columns=NODE:.spec.nodeName,DELETING:.metadata.deletionTimestamp",
            ]))
            .into_iter()
            .filter(|l| l.ends_with("<none>"))
            .collect();
            (nodes.len() == 10
                && nodes.iter().all(|n| n.starts_with("b-"))
                && live.iter().all(|n| n.starts_with("b-")))
            .then_some(nodes)
        },
    );
    assert_eq!(moved.len(), 10);
    eventually(
        "the Deployment to report 10 available",
        Duration::from_secs(30),
        || {
            (s.ok(&[
                "get",
                "deployment",
                "spread",
                "-o",
                "jsonpath={.status.availableReplicas}",
            ]) == "10")
                .then_some(())
        },
    );

    // A pod bigger than any node waits with FailedScheduling until a big node joins.
    s.apply("apiVersion: v1\nkind: Pod\nmetadata:\n  name: huge\nspec:\n  containers:\n  - name: c\n    image: busybox\n    resources:\n      requests: {cpu: '64'}\n");
    let described = eventually("FailedScheduling", Duration::from_secs(30), || {
        let d = s.ok(&["describe", "pod", "huge"]);
        d.contains("FailedScheduling").then_some(d)
    });
    assert!(described.contains("Insufficient cpu"), "{described}");
    let _big = Agent::start(&s.kubeconfig, "big-", 1, "128");
    let node = eventually(
        "the huge pod to be scheduled",
        Duration::from_secs(60),
        || {
            let n = s.ok(&["get", "pod", "huge", "-o", "jsonpath={.spec.nodeName}"]);
            (!n.is_empty()).then_some(n)
        },
    );
    assert_eq!(node, "big-0");
    s.stop();
}

#[test]
fn up_hosts_simulated_nodes_and_the_benchmark_reuses_them() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::start(
        &[
            "up",
            "--no-node",
            "--simulate",
            "3",
            "--node-prefix",
            "inproc-",
            "--start-delay-ms",
            "50",
            "--ready-delay-ms",
            "50",
        ],
        &data.path().join("data"),
    );
    eventually("3 Ready simulated nodes", Duration::from_secs(60), || {
        let states = node_states(&s);
        let ready = states
            .iter()
            .filter(|l| l.starts_with("inproc-") && l.ends_with(" True"))
            .count();
        (states.len() == 3 && ready == 3).then_some(())
    });
    s.apply("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: inproc\nspec:\n  replicas: 4\n  selector:\n    matchLabels: {app: inproc}\n  template:\n    metadata:\n      labels: {app: inproc}\n    spec:\n      containers:\n      - name: c\n        image: nginx:1.25\n");
    let placed = eventually("4 ready pods", Duration::from_secs(60), || {
        let nodes = ready_pod_nodes_of(&s, "app=inproc");
        (nodes.len() == 4).then_some(nodes)
    });
    assert!(
        placed.iter().all(|n| n.starts_with("inproc-")),
        "{placed:?}"
    );
    // The nodes' logs endpoint runs in the same process and trusts the cluster's CA.
    let logs = s.ok(&["logs", "deployment/inproc"]);
    assert!(logs.contains("simulated"), "{logs}");

    // The benchmark hosts no nodes of its own: it waits for these and leaves them in place.
    let report = data.path().join("report.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .args(["bench", "density", "--nodes", "3", "--reuse-nodes"])
        .args(["--deployments", "2", "--replicas", "3", "--quiet"])
        .args(["--timeout-seconds", "60", "--json"])
        .arg(&report)
        .env("KUBECONFIG", &s.kubeconfig)
        .env("SETPOINT_LOG", "warn")
        .output()
        .expect("run setpoint bench");
    assert!(
        out.status.success(),
        "bench failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["nodes"], 3, "{report}");
    assert_eq!(report["simulated_nodes"], 0, "{report}");
    assert_eq!(report["pods"], 6, "{report}");
    assert_eq!(report["timed_out"], false, "{report}");
    assert_eq!(node_states(&s).len(), 3, "the reused nodes stay");
    s.stop();
}
