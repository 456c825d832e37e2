//! End to end: `setpoint server` writes a kubeconfig per component, and the controller
//! manager (with `--use-service-account-credentials`), the scheduler and a node agent each run
//! on their own, holding only what their roles grant: a Deployment's pods get created,
//! scheduled and run. The node's credentials read a Secret its pods use, and get upstream's
//! 403 for one they do not.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod support;

use support::{eventually, expect_failure, expect_success, Setpoint};

/// A background `setpoint` component, killed when dropped (with the pods an agent started
/// under `dir`).
struct Component {
    child: Child,
    dir: Option<PathBuf>,
}

impl Component {
    fn start(args: &[&str], kubeconfig: &Path, dir: Option<&Path>) -> Component {
        let child = Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args(args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env("SETPOINT_LOG", "warn")
            .env(support::RUNTIME_ENV, "process")
            .env(support::PROCESS_POD_NETWORK_ENV, "host")
            // No service proxy, whose nftables table would outlive the test.
            .env(support::PROXY_MODE_ENV, "none")
            .stdout(Stdio::null())
            .spawn()
            .expect("start a setpoint component");
        Component {
            child,
            dir: dir.map(Path::to_path_buf),
        }
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(d) = &self.dir {
            support::kill_processes_under(d);
            // An agent's data dir is its node's: its pods' networks and bridge, if any.
            support::remove_pod_networks(d);
            support::remove_private_bridge(d);
        }
    }
}

/// The node kubeconfig the server wrote (`node-<name>.kubeconfig`) and the node's name.
fn node_kubeconfig(data: &Path) -> (PathBuf, String) {
    std::fs::read_dir(data)
        .unwrap()
        .flatten()
        .find_map(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            let name = file.strip_prefix("node-")?.strip_suffix(".kubeconfig")?;
            Some((e.path(), name.to_string()))
        })
        .expect("a node kubeconfig in the data dir")
}

/// `kubectl` as the user of another kubeconfig.
fn kubectl_as(s: &Setpoint, kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    s.kubectl_command(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run kubectl")
}

const DEPLOYMENT: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: sleepers
spec:
  replicas: 3
  selector:
    matchLabels: {app: sleepers}
  template:
    metadata:
      labels: {app: sleepers}
    spec:
      imagePullSecrets:
      - name: pull
      containers:
      - name: c
        image: busybox
        command: [sleep, '3600']
"#;

#[test]
fn components_run_on_their_own_identities() {
    if !support::kubectl_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let s = Setpoint::start(&["server"], &data);
    let data = data.canonicalize().unwrap();
    let cm_kubeconfig = data.join("controller-manager.kubeconfig");
    let scheduler_kubeconfig = data.join("scheduler.kubeconfig");
    let (node_kubeconfig, node) = node_kubeconfig(&data);
    assert!(cm_kubeconfig.exists() && scheduler_kubeconfig.exists());

    let agent_dir = tmp.path().join("agent");
    let _agent = Component::start(
        &[
            "agent",
            "--node-name",
            &node,
            "--data-dir",
            agent_dir.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        &node_kubeconfig,
        Some(&agent_dir),
    );
    let _scheduler = Component::start(
        &["scheduler", "--leader-elect=false", "--secure-port", "0"],
        &scheduler_kubeconfig,
        None,
    );
    let _cm = Component::start(
        &[
            "controller-manager",
            "--leader-elect=false",
            "--secure-port",
            "0",
            "--use-service-account-credentials",
        ],
        &cm_kubeconfig,
        None,
    );

    s.ok(&["create", "secret", "generic", "pull", "--from-literal=a=b"]);
    s.ok(&[
        "create",
        "secret",
        "generic",
        "unrelated",
        "--from-literal=a=b",
    ]);
    s.apply(DEPLOYMENT);
    eventually(
        "three pods of the Deployment running on the node",
        Duration::from_secs(120),
        || {
            let out = s.ok(&[
                "get",
                "pods",
                "-l",
                "app=sleepers",
                "-o",
                r#"jsonpath={range .items[?(@.status.phase=="Running")]}{.spec.nodeName}{"\n"}{end}"#,
            ]);
            let nodes = support::lines(&out);
            (nodes.len() == 3 && nodes.iter().all(|n| *n == node)).then_some(())
        },
    );
    // The controllers' status writes went through with only their roles' verbs.
    eventually(
        "the Deployment and its ReplicaSet reporting three ready replicas",
        Duration::from_secs(60),
        || {
            let d = s.ok(&[
                "get",
                "deployment",
                "sleepers",
                "-o",
                "jsonpath={.status.readyReplicas}/{.metadata.annotations.deployment\\.kubernetes\\.io/revision}",
            ]);
            let rs = s.ok(&[
                "get",
                "replicasets",
                "-l",
                "app=sleepers",
                "-o",
                "jsonpath={.items[0].status.readyReplicas}",
            ]);
            (d.trim() == "3/1" && rs.trim() == "3").then_some(())
        },
    );
    // The controllers wrote as their own ServiceAccounts, which the manager made.
    for account in ["deployment-controller", "replicaset-controller"] {
        s.ok(&["-n", "kube-system", "get", "serviceaccount", account]);
    }

    // The node reads the Secret its pods use, and no other.
    let got = expect_success(
        "the node reads its pods' Secret",
        &kubectl_as(
            &s,
            &node_kubeconfig,
            &["get", "secret", "pull", "-o", "name"],
        ),
    );
    assert_eq!(got.trim(), "secret/pull");
    let refused = expect_failure(
        "the node reads an unrelated Secret",
        &kubectl_as(&s, &node_kubeconfig, &["get", "secret", "unrelated"]),
    );
    assert!(
        refused.contains(&format!(
            "Error from server (Forbidden): secrets \"unrelated\" is forbidden: User \"system:node:{node}\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\": no relationship found between node '{node}' and this object"
        )),
        "{refused}"
    );
    let refused = expect_failure(
        "the node lists Secrets",
        &kubectl_as(&s, &node_kubeconfig, &["get", "secrets"]),
    );
    assert!(
        refused.contains(&format!(
            "secrets is forbidden: User \"system:node:{node}\" cannot list resource \"secrets\" in API group \"\" in the namespace \"default\": No Object name found"
        )),
        "{refused}"
    );
    // The scheduler's role has no Secrets at all.
    let refused = expect_failure(
        "the scheduler reads a Secret",
        &kubectl_as(&s, &scheduler_kubeconfig, &["get", "secret", "pull"]),
    );
    assert!(
        refused.contains(
            "secrets \"pull\" is forbidden: User \"system:kube-scheduler\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\""
        ),
        "{refused}"
    );
}
