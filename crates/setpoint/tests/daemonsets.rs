//! End to end with the real kubectl: DaemonSets on simulated nodes (`setpoint up --simulate 3`
//! plus a `setpoint agent --simulate 1` joining later). Three nodes get three pods, a fourth
//! node joining gets one, a node tainted `NoExecute` without a toleration loses its pod, a
//! label that the required node affinity excludes removes the pod; an image change rolls out
//! (`kubectl rollout status`), `kubectl rollout history` lists the ControllerRevisions and
//! `kubectl rollout undo` goes back; with `maxSurge: 1` no node is ever without a ready pod.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod support;

use support::{eventually, lines, Setpoint};

const WAIT: Duration = Duration::from_secs(90);

/// A `setpoint agent --simulate` process, killed when dropped.
struct Agent(Child);

impl Agent {
    fn start(kubeconfig: &Path, prefix: &str, nodes: usize) -> Agent {
        let child = Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args(["agent", "--simulate", &nodes.to_string()])
            .args(["--node-prefix", prefix, "--lease-interval-seconds", "1"])
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

/// Each live pod of `selector`: (node, ready, image).
fn pods(s: &Setpoint, selector: &str) -> Vec<(String, bool, String)> {
    lines(&s.ok(&[
        "get", "pods", "-l", selector, "-o",
        r#"jsonpath={range .items[*]}{.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status} {.spec.containers[0].image} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    ]))
    .into_iter()
    .filter_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            [node, ready, image] => Some((node.to_string(), *ready == "True", image.to_string())),
            _ => None,
        }
    })
    .collect()
}

/// The nodes with a ready pod of `selector` at `image`, once each of `want` has exactly one
/// pod and no other node has any.
fn placed_exactly(s: &Setpoint, selector: &str, want: &[&str], image: &str) -> Option<()> {
    let got = pods(s, selector);
    let nodes: Vec<&str> = got.iter().map(|(n, _, _)| n.as_str()).collect();
    let mut sorted = nodes.clone();
    sorted.sort();
    let mut want: Vec<&str> = want.to_vec();
    want.sort();
    (sorted == want && got.iter().all(|(_, r, i)| *r && i == image)).then_some(())
}

fn status(s: &Setpoint, name: &str) -> String {
    s.ok(&[
        "get", "daemonset", name, "-o",
        "jsonpath={.status.desiredNumberScheduled} {.status.currentNumberScheduled} {.status.numberReady} {.status.updatedNumberScheduled} {.status.numberAvailable} {.status.numberMisscheduled}",
    ])
}

const AGENT: &str = r#"apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
spec:
  selector:
    matchLabels: {app: agent}
  template:
    metadata:
      labels: {app: agent}
    spec:
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - {key: role, operator: NotIn, values: ["off"]}
      containers:
      - name: c
        image: busybox:1
"#;

const SURGE: &str = r#"apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: surge
spec:
  selector:
    matchLabels: {app: surge}
  updateStrategy:
    type: RollingUpdate
    rollingUpdate: {maxSurge: 1, maxUnavailable: 0}
  template:
    metadata:
      labels: {app: surge}
    spec:
      containers:
      - name: c
        image: busybox:1
"#;

#[test]
fn daemon_pods_follow_nodes_and_roll_out() {
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
            "ds-",
            "--start-delay-ms",
            "50",
            "--ready-delay-ms",
            "50",
        ],
        &data.path().join("data"),
    );
    eventually("3 simulated nodes", WAIT, || {
        (lines(&s.ok(&["get", "nodes", "-o", "name"])).len() == 3).then_some(())
    });

    s.apply(AGENT);
    eventually("a ready agent pod on each of 3 nodes", WAIT, || {
        placed_exactly(&s, "app=agent", &["ds-0", "ds-1", "ds-2"], "busybox:1")
    });
    eventually("the status counts 3 nodes", WAIT, || {
        (status(&s, "agent") == "3 3 3 3 3 0").then_some(())
    });
    // The pods carry the daemon tolerations and the node affinity naming their node.
    let pod_spec = s.ok(&[
        "get", "pods", "-l", "app=agent", "-o",
        "jsonpath={.items[0].spec.tolerations[*].key} {.items[0].spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].key}",
    ]);
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/unschedulable",
        "metadata.name",
    ] {
        assert!(pod_spec.contains(key), "{key} missing: {pod_spec}");
    }
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=agent",
        "-o",
        "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
    ]);
    assert!(
        events.contains("SuccessfulCreate: Created pod: agent-"),
        "{events}"
    );

    // A fourth node joins and gets its pod.
    let _extra = Agent::start(&s.kubeconfig, "extra-", 1);
    eventually("a pod on the joining node", WAIT, || {
        placed_exactly(
            &s,
            "app=agent",
            &["ds-0", "ds-1", "ds-2", "extra-0"],
            "busybox:1",
        )
    });

    // A NoExecute taint the pod does not tolerate takes it off; a label the affinity
    // excludes does too.
    s.ok(&["taint", "nodes", "ds-0", "dedicated=infra:NoExecute"]);
    s.ok(&["label", "nodes", "ds-1", "role=off"]);
    eventually("pods only on the 2 eligible nodes", WAIT, || {
        placed_exactly(&s, "app=agent", &["ds-2", "extra-0"], "busybox:1")
    });
    eventually("the status counts 2 nodes", WAIT, || {
        (status(&s, "agent") == "2 2 2 2 2 0").then_some(())
    });
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=agent",
        "-o",
        "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
    ]);
    assert!(
        events.contains("SuccessfulDelete: Deleted pod: agent-"),
        "{events}"
    );
    s.ok(&["label", "nodes", "ds-1", "role-"]);
    eventually("the relabelled node gets its pod back", WAIT, || {
        placed_exactly(&s, "app=agent", &["ds-1", "ds-2", "extra-0"], "busybox:1")
    });

    // An image change rolls out; history and undo.
    s.ok(&["set", "image", "daemonset/agent", "c=busybox:2"]);
    let out = s.ok(&["rollout", "status", "daemonset/agent", "--timeout=90s"]);
    assert!(
        out.contains("daemon set \"agent\" successfully rolled out"),
        "{out}"
    );
    eventually("every agent pod at busybox:2", WAIT, || {
        placed_exactly(&s, "app=agent", &["ds-1", "ds-2", "extra-0"], "busybox:2")
    });
    // The API server moved the template generation with the template, and the new pods
    // carry it, as upstream's `pod-template-generation` label.
    let generation = s.ok(&[
        "get",
        "daemonset",
        "agent",
        "-o",
        "jsonpath={.metadata.annotations.deprecated\\.daemonset\\.template\\.generation}",
    ]);
    assert_eq!(generation, "2");
    let labels = s.ok(&[
        "get",
        "pods",
        "-l",
        "app=agent",
        "-o",
        "jsonpath={.items[*].metadata.labels.pod-template-generation}",
    ]);
    assert_eq!(
        labels.split_whitespace().collect::<Vec<_>>(),
        ["2", "2", "2"]
    );
    let history = s.ok(&["rollout", "history", "daemonset/agent"]);
    let revisions: Vec<String> = lines(&history)
        .into_iter()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    assert_eq!(revisions, vec!["1", "2"], "{history}");
    let revs = s.ok(&[
        "get",
        "controllerrevisions",
        "-l",
        "app=agent",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.revision}{\"\\n\"}{end}",
    ]);
    assert_eq!(lines(&revs).len(), 2, "{revs}");
    assert!(
        lines(&revs).iter().all(|l| l.starts_with("agent-")),
        "{revs}"
    );
    s.ok(&["rollout", "undo", "daemonset/agent"]);
    let out = s.ok(&["rollout", "status", "daemonset/agent", "--timeout=90s"]);
    assert!(out.contains("successfully rolled out"), "{out}");
    eventually("every agent pod back at busybox:1", WAIT, || {
        placed_exactly(&s, "app=agent", &["ds-1", "ds-2", "extra-0"], "busybox:1")
    });
    let history = s.ok(&["rollout", "history", "daemonset/agent"]);
    let revisions: Vec<String> = lines(&history)
        .into_iter()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|w| w.parse::<u32>().is_ok())
        .collect();
    assert_eq!(
        revisions,
        vec!["2", "3"],
        "the undone revision is renumbered: {history}"
    );

    // maxSurge 1: a new pod starts beside the old one, and no node is ever without a ready pod.
    s.ok(&["taint", "nodes", "ds-0", "dedicated-"]);
    s.apply(SURGE);
    let nodes = ["ds-0", "ds-1", "ds-2", "extra-0"];
    eventually("a ready surge pod on each of 4 nodes", WAIT, || {
        placed_exactly(&s, "app=surge", &nodes, "busybox:1")
    });
    s.ok(&["set", "image", "daemonset/surge", "c=busybox:2"]);
    eventually(
        "the surge rollout done, every node covered throughout",
        WAIT,
        || {
            let got = pods(&s, "app=surge");
            let mut ready: BTreeMap<&str, usize> = BTreeMap::new();
            for (n, r, _) in &got {
                if *r {
                    *ready.entry(n.as_str()).or_default() += 1;
                }
            }
            let covered: BTreeSet<&str> = ready.keys().copied().collect();
            assert_eq!(
                covered,
                nodes.iter().copied().collect::<BTreeSet<_>>(),
                "a node without a ready pod during the rollout: {got:?}"
            );
            placed_exactly(&s, "app=surge", &nodes, "busybox:2")
        },
    );
    let out = s.ok(&["rollout", "status", "daemonset/surge", "--timeout=30s"]);
    assert!(out.contains("successfully rolled out"), "{out}");
    s.stop();
}
