//! End to end: pods as real processes on the local node of `setpoint up`, driven by the real
//! `kubectl` — readiness probes, pod IPs, logs, restarts, CrashLoopBackOff, graceful deletion,
//! an agent restart that adopts its pods, and scheduling failures.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::time::Duration;

mod support;

use support::{eventually, http_get, lines, ready_pods, Setpoint, WEB};

fn field(s: &Setpoint, pod: &str, path: &str) -> String {
    s.ok(&["get", "pod", pod, "-o", &format!("jsonpath={{{path}}}")])
}

#[test]
fn pods_run_as_processes_on_the_local_node() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("data");
    let s = Setpoint::up(&dir);
    let node = eventually(
        "the local node to be Ready",
        Duration::from_secs(30),
        || {
            let out = s.ok(&[
            "get", "nodes", "-o",
            r#"jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
        ]);
            lines(&out)
                .into_iter()
                .find(|l| l.ends_with(" True"))
                .map(|l| l.split(' ').next().unwrap().to_string())
        },
    );

    // Three replicas of a real server, each on an address of its own: a loopback address on
    // the node's network, or one of the pod bridge's range in a namespace of its own, as the
    // Node says.
    let network = s.ok(&[
        "get",
        "node",
        &node,
        "-o",
        r"jsonpath={.metadata.annotations.setpoint\.io/process-pod-network}",
    ]);
    let on_node_network = network.trim() == "host";
    s.apply(WEB);
    let pods = eventually("3 ready web pods", Duration::from_secs(60), || {
        ready_pods(&s, "app=web", 3)
    });
    let wide = s.ok(&["get", "pods", "-l", "app=web", "-o", "wide"]);
    assert!(
        wide.lines().next().unwrap().contains("IP") && wide.contains("NODE"),
        "{wide}"
    );
    let mut ips = Vec::new();
    for p in &pods {
        let ip = field(&s, p, ".status.podIP");
        assert_eq!(
            ip.starts_with("127."),
            on_node_network,
            "{ip} on a node whose process pod network is {network}"
        );
        assert!(wide.contains(&ip) && wide.contains(&node), "{wide}");
        assert_eq!(http_get(&ip, "/"), "HTTP/1.0 200 OK");
        ips.push(ip);
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 3, "each pod has its own address");
    let first = &pods[0];
    let ip = field(&s, first, ".status.podIP");
    http_get(&ip, "/hello-from-the-test");
    let logs = eventually(
        "the request in the pod's log",
        Duration::from_secs(10),
        || {
            let l = s.ok(&["logs", first]);
            l.contains("GET /hello-from-the-test").then_some(l)
        },
    );
    assert!(logs.contains("404"), "{logs}");
    let tail = s.ok(&["logs", first, "--tail=1"]);
    assert_eq!(lines(&tail).len(), 1, "{tail}");

    // kill -9 of the process: it restarts, restartCount 1, --previous shows the last run.
    let pid = field(&s, first, ".status.containerStatuses[0].containerID");
    let pid = pid
        .strip_prefix("process://")
        .expect("process container id")
        .to_string();
    assert!(std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .unwrap()
        .success());
    eventually("the restart", Duration::from_secs(30), || {
        (field(&s, first, ".status.containerStatuses[0].restartCount") == "1"
            && field(&s, first, ".status.containerStatuses[0].ready") == "true")
            .then_some(())
    });
    assert_eq!(
        field(
            &s,
            first,
            ".status.containerStatuses[0].lastState.terminated.exitCode"
        ),
        "137"
    );
    let previous = s.ok(&["logs", first, "--previous"]);
    assert!(previous.contains("GET /hello-from-the-test"), "{previous}");
    let current = s.ok(&["logs", first]);
    assert!(
        !current.contains("GET /hello-from-the-test"),
        "the new run has a new log"
    );

    // A container that exits 1 at once ends in CrashLoopBackOff with growing delays.
    s.apply("apiVersion: v1\nkind: Pod\nmetadata:\n  name: crasher\nspec:\n  containers:\n  - name: c\n    image: busybox\n    command: [sh, -c, 'echo run; exit 1']\n");
    let first_wait = eventually("CrashLoopBackOff", Duration::from_secs(60), || {
        let reason = field(
            &s,
            "crasher",
            ".status.containerStatuses[0].state.waiting.reason",
        );
        (reason == "CrashLoopBackOff").then(|| {
            field(
                &s,
                "crasher",
                ".status.containerStatuses[0].state.waiting.message",
            )
        })
    });
    let delay = |m: &str| -> u64 {
        m.strip_prefix("back-off ")
            .and_then(|r| r.split('s').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let d1 = delay(&first_wait);
    assert!(d1 >= 10, "{first_wait}");
    let later = eventually("a longer back-off", Duration::from_secs(90), || {
        let m = field(
            &s,
            "crasher",
            ".status.containerStatuses[0].state.waiting.message",
        );
        (delay(&m) > d1).then_some(m)
    });
    assert!(
        later.contains("restarting failed container=c pod=crasher_default"),
        "{later}"
    );
    assert!(s
        .ok(&["get", "pod", "crasher"])
        .contains("CrashLoopBackOff"));
    assert!(s.ok(&["logs", "crasher", "--previous"]).contains("run"));

    // kubectl delete pod: SIGTERM reaches the process, the pod goes, the ReplicaSet's
    // replacement runs.
    let marker = data.path().join("terminated");
    s.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: graceful\nspec:\n  terminationGracePeriodSeconds: 20\n  containers:\n  - name: c\n    image: busybox\n    command: [sh, -c, 'trap \"echo TERM > {}; exit 0\" TERM; echo up; while true; do sleep 0.1; done']\n",
        marker.display()
    ));
    eventually("the graceful pod to run", Duration::from_secs(30), || {
        s.ok(&["logs", "graceful"]).contains("up").then_some(())
    });
    s.ok(&["delete", "pod", "graceful", "--timeout=30s"]);
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "TERM");
    let victim = pods[1].clone();
    s.ok(&["delete", "pod", &victim, "--wait=false"]);
    let replaced = eventually("a replacement web pod", Duration::from_secs(30), || {
        ready_pods(&s, "app=web", 3).filter(|ps| !ps.contains(&victim))
    });
    assert_eq!(replaced.len(), 3);

    // Restart the node agent (the whole `setpoint up`) while pods run: the same processes
    // are adopted, none duplicated, none lost.
    let state = |s: &Setpoint| -> Vec<String> {
        replaced
            .iter()
            .map(|p| {
                format!(
                    "{} restarts={}",
                    field(s, p, ".status.containerStatuses[0].containerID"),
                    field(s, p, ".status.containerStatuses[0].restartCount")
                )
            })
            .collect()
    };
    let before = state(&s);
    let processes = || {
        let out = std::process::Command::new("pgrep")
            .args(["-f", "http.server 8080"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    let running = processes();
    s.stop_leaving_pods();
    let s = Setpoint::up(&dir);
    eventually(
        "the pods after the restart",
        Duration::from_secs(60),
        || ready_pods(&s, "app=web", 3),
    );
    assert_eq!(
        before,
        state(&s),
        "the same processes, adopted, not restarted"
    );
    assert_eq!(processes(), running, "no process duplicated or lost");

    // A pod no node can take: FailedScheduling, visible in describe.
    s.apply("apiVersion: v1\nkind: Pod\nmetadata:\n  name: huge\nspec:\n  containers:\n  - name: c\n    image: busybox\n    command: [sleep, '1000']\n    resources:\n      requests: {cpu: '1000'}\n");
    let described = eventually("FailedScheduling", Duration::from_secs(30), || {
        let d = s.ok(&["describe", "pod", "huge"]);
        d.contains("FailedScheduling").then_some(d)
    });
    assert!(described.contains("Insufficient cpu"), "{described}");
    assert_eq!(
        field(
            &s,
            "huge",
            r#".status.conditions[?(@.type=="PodScheduled")].reason"#
        ),
        "Unschedulable"
    );
    s.ok(&["delete", "pod", "huge", "crasher"]);
    s.ok(&["delete", "deployment", "web"]);
    eventually("the web pods to go", Duration::from_secs(60), || {
        s.ok(&["get", "pods", "-l", "app=web", "-o", "name"])
            .trim()
            .is_empty()
            .then_some(())
    });
    assert_eq!(processes(), 0, "deleted pods leave no process behind");
    s.stop();
}
