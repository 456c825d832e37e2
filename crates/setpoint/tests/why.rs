//! End to end: `kubectl why` (the `kubectl-why` plugin on the PATH) on `setpoint up` with
//! simulated nodes. A Deployment of 3 runs; user alice deletes one pod (`kubectl --as
//! alice`); the replacement's chain names alice's deletion, the ReplicaSet controller's
//! decision (what it observed and the rule it followed) and the scheduler's choice of node.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::path::Path;
use std::time::Duration;

mod support;

use support::{eventually, lines, Setpoint};

const DEPLOYMENT: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: setpoint.local/busybox:1
"#;

/// The names of the `app=web` pods that are Running and not being deleted.
fn running(s: &Setpoint) -> Vec<String> {
    lines(&s.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        r#"jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    ]))
    .into_iter()
    .filter(|l| !l.contains(' '))
    .collect()
}

/// `kubectl why <args>` with the plugin on the PATH.
fn why(s: &Setpoint, args: &[&str]) -> std::process::Output {
    let plugin = Path::new(env!("CARGO_BIN_EXE_kubectl-why"));
    let dir = plugin.parent().unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = s.kubectl_command(&[&["why"], args].concat());
    cmd.env("PATH", path);
    cmd.output().expect("run kubectl why")
}

#[test]
fn why_a_replacement_pod_names_the_deletion_the_replicaset_decision_and_the_scheduler() {
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
            "why-",
            "--start-delay-ms",
            "20",
            "--ready-delay-ms",
            "20",
        ],
        &data.path().join("data"),
    );
    // alice may delete pods, and nothing else.
    s.ok(&[
        "create",
        "clusterrole",
        "pod-deleter",
        "--verb=get,delete",
        "--resource=pods",
    ]);
    s.ok(&[
        "create",
        "clusterrolebinding",
        "alice-deletes-pods",
        "--clusterrole=pod-deleter",
        "--user=alice",
    ]);
    s.apply(DEPLOYMENT);
    let before = eventually("3 running pods", Duration::from_secs(30), || {
        let r = running(&s);
        (r.len() == 3).then_some(r)
    });
    let victim = before[0].clone();
    s.ok(&["delete", "pod", &victim, "--as", "alice", "--wait=false"]);
    let replacement = eventually("a running replacement", Duration::from_secs(30), || {
        running(&s).into_iter().find(|p| !before.contains(p))
    });

    // Decision records reach the server within a push interval; wait for the whole chain.
    let target = format!("pod/{replacement}");
    let text = eventually("the whole causal chain", Duration::from_secs(20), || {
        let out = why(&s, &[&target]);
        let text = support::expect_success("kubectl why", &out);
        let complete = text.contains(&format!("pod default/{victim}"))
            && text.contains("deleted by user alice")
            && text.contains("the replicaset controller")
            && text.contains("binding created by the scheduler controller")
            && text.contains("action: bind to node why-");
        complete.then_some(text)
    });
    eprintln!("kubectl why {target}:\n{text}");
    // The ReplicaSet's decision: what it saw and the rule it followed.
    assert!(text.contains("observed: 3 desired, 2 active"), "{text}");
    assert!(
        text.contains("action: create 1 pod(s) (rule: 2 active < 3 desired)"),
        "{text}"
    );
    // The scheduler's score table (or the reason it did not need one).
    assert!(text.contains("nodes evaluated"), "{text}");
    // Owner references lead on to the ReplicaSet's creation by the Deployment controller.
    assert!(text.contains("the deployment controller"), "{text}");

    // `setpoint why` prints the same chain; JSON for programs.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .args(["why", &target, "-o", "json", "--kubeconfig"])
        .arg(&s.kubeconfig)
        .output()
        .expect("run setpoint why");
    let answer: serde_json::Value =
        serde_json::from_slice(&support::expect_success("setpoint why", &out).into_bytes())
            .unwrap();
    assert_eq!(answer["object"]["name"], replacement.as_str());
    assert_eq!(answer["writes"][0]["write"]["verb"], "create");

    // An unknown type is refused by name.
    let out = why(&s, &["nosuchthing/x"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the server doesn't have a resource type \"nosuchthing\""),
        "{err}"
    );
    s.stop();
}
