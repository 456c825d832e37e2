//! Simulated nodes joined with a bootstrap token each get an identity of their own: `setpoint
//! agent --simulate 3 --server … --token … --ca-cert-hash …` asks for one certificate per
//! node, through one CSR each, and every node then writes as `system:node:<name>` in
//! `system:nodes`, which the Node authorizer and NodeRestriction hold to its own Node, Lease
//! and pods. A Deployment's pods run on the three nodes. The second test does the same with
//! every component apart (`setpoint server`, controller manager, scheduler) and the agent
//! joined through a `--bootstrap-kubeconfig`.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// The simulated nodes' name prefix, so no other node of the cluster is mistaken for them.
const PREFIX: &str = "ident-";
const NODES: usize = 3;

/// The agent process, killed when the test ends however it ends.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The words after `setpoint` of the join command `s` printed.
fn join_command(s: &Setpoint) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = s
            .output
            .recv_timeout(left)
            .expect("setpoint up prints a join command");
        if let Some(rest) = line.trim().strip_prefix("setpoint agent ") {
            let mut words = vec!["agent".to_string()];
            words.extend(rest.split_whitespace().map(str::to_string));
            return words;
        }
    }
}

fn flag<'a>(words: &'a [String], name: &str) -> &'a str {
    let i = words.iter().position(|w| w == name).expect(name);
    &words[i + 1]
}

fn node_kubeconfig(agent_dir: &Path, node: &str) -> PathBuf {
    agent_dir.join("nodes").join(node).join("node.kubeconfig")
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
  name: spread
spec:
  replicas: 6
  selector:
    matchLabels: {app: spread}
  template:
    metadata:
      labels: {app: spread}
    spec:
      nodeSelector: {setpoint.dev/simulated: "true"}
      containers:
      - name: c
        image: busybox
        command: [sleep, '3600']
"#;

#[test]
fn simulated_nodes_joined_with_a_token_each_have_their_own_identity() {
    if !kubectl_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // No local node: every pod of the Deployment must land on the simulated nodes.
    let s = Setpoint::start(&["up", "--no-node"], &tmp.path().join("server"));
    let words = join_command(&s);
    let agent_dir = tmp.path().join("agent");
    let _agent = Agent(
        Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args(&words)
            .args(["--simulate", &NODES.to_string(), "--node-prefix", PREFIX])
            .args(["--start-delay-ms", "0", "--ready-delay-ms", "0"])
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&agent_dir)
            .env("SETPOINT_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("start the simulating agent"),
    );
    let names: Vec<String> = (0..NODES).map(|i| format!("{PREFIX}{i}")).collect();

    let ready = eventually(
        "three simulated nodes Ready",
        Duration::from_secs(120),
        || {
            let out = s.ok(&[
                "get",
                "nodes",
                "-l",
                "setpoint.dev/simulated=true",
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
            ]);
            let mut ready: Vec<String> = lines(&out)
                .iter()
                .filter_map(|l| l.strip_suffix("=True").map(str::to_string))
                .collect();
            ready.sort();
            (ready.len() == NODES).then_some(ready)
        },
    );
    assert_eq!(ready, names);

    // One CSR per node, each made with the bootstrap token and approved and signed.
    let id = flag(&words, "--token").split('.').next().unwrap();
    let csrs = s.ok(&["get", "csr"]);
    let from_token: Vec<&str> = csrs
        .lines()
        .filter(|l| l.contains(&format!("system:bootstrap:{id}")))
        .collect();
    assert_eq!(from_token.len(), NODES, "{csrs}");
    for line in &from_token {
        assert!(
            line.contains("kubernetes.io/kube-apiserver-client-kubelet"),
            "{line}"
        );
        assert!(line.contains("Approved,Issued"), "{line}");
    }

    // Each node's kubeconfig is its own identity.
    for node in &names {
        let who = expect_success(
            "kubectl auth whoami as a node",
            &kubectl_as(&s, &node_kubeconfig(&agent_dir, node), &["auth", "whoami"]),
        );
        assert!(who.contains(&format!("system:node:{node}")), "{who}");
        assert!(who.contains("system:nodes"), "{who}");
    }
    // And it holds no more than a node's rights: NodeRestriction keeps one node off another's
    // Node object.
    let first = node_kubeconfig(&agent_dir, &names[0]);
    let refused = expect_failure(
        "a node labels another node",
        &kubectl_as(&s, &first, &["label", "node", &names[1], "stolen=true"]),
    );
    assert!(refused.contains("Forbidden"), "{refused}");
    assert!(
        refused.contains(&format!(
            "node \"{}\" is not allowed to modify node \"{}\"",
            names[0], names[1]
        )),
        "{refused}"
    );

    s.apply(DEPLOYMENT);
    let placed = eventually(
        "six pods of the Deployment Running on the simulated nodes",
        Duration::from_secs(120),
        || {
            let out = s.ok(&[
                "get",
                "pods",
                "-l",
                "app=spread",
                "-o",
                r#"jsonpath={range .items[?(@.status.phase=="Running")]}{.spec.nodeName}{"\n"}{end}"#,
            ]);
            let nodes = lines(&out);
            (nodes.len() == 6).then_some(nodes)
        },
    );
    assert!(
        placed.iter().all(|n| names.contains(n)),
        "pods ran off the simulated nodes: {placed:?}"
    );
    // The pods' status was written by their own nodes: a node may write only its pods'.
    let conditions = s.ok(&[
        "get",
        "pods",
        "-l",
        "app=spread",
        "-o",
        r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
    ]);
    assert_eq!(lines(&conditions), vec!["True"; 6], "{conditions}");
}

/// A background `setpoint` component, killed when dropped.
struct Component(Child);

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn component(args: &[&str]) -> Component {
    Component(
        Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args(args)
            .env("SETPOINT_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("start a setpoint component"),
    )
}

/// Every component apart, each on its own identity: `setpoint server`, the controller
/// manager on its kubeconfig with service-account credentials (and the cluster CA to sign
/// with), the scheduler on its kubeconfig, and two simulated nodes joined with a bootstrap
/// kubeconfig naming a token made with kubectl, as an operator would without `setpoint up`.
#[test]
fn separate_components_and_a_bootstrap_kubeconfig() {
    if !kubectl_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["server"], &tmp.path().join("data"));
    let data = s.data_dir.canonicalize().unwrap();
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let _cm = component(&[
        "controller-manager",
        "--kubeconfig",
        &path(&data.join("controller-manager.kubeconfig")),
        "--use-service-account-credentials",
        "--leader-elect=false",
        "--secure-port",
        "0",
        "--cluster-signing-cert-file",
        &path(&data.join("pki/ca.crt")),
        "--cluster-signing-key-file",
        &path(&data.join("pki/ca.key")),
    ]);
    let _scheduler = component(&[
        "scheduler",
        "--kubeconfig",
        &path(&data.join("scheduler.kubeconfig")),
        "--leader-elect=false",
        "--secure-port",
        "0",
    ]);
    let (id, secret) = ("abc123", "0123456789abcdef");
    s.ok(&[
        "-n",
        "kube-system",
        "create",
        "secret",
        "generic",
        &format!("bootstrap-token-{id}"),
        "--type",
        "bootstrap.kubernetes.io/token",
        &format!("--from-literal=token-id={id}"),
        &format!("--from-literal=token-secret={secret}"),
        "--from-literal=usage-bootstrap-authentication=true",
    ]);
    let boot = path(&tmp.path().join("bootstrap.kubeconfig"));
    for args in [
        vec![
            "set-cluster".to_string(),
            "c".into(),
            "--server".into(),
            s.url.clone(),
            "--certificate-authority".into(),
            path(&data.join("pki/ca.crt")),
            "--embed-certs".into(),
        ],
        vec![
            "set-credentials".into(),
            "bootstrap".into(),
            "--token".into(),
            format!("{id}.{secret}"),
        ],
        vec![
            "set-context".into(),
            "c".into(),
            "--cluster".into(),
            "c".into(),
            "--user".into(),
            "bootstrap".into(),
        ],
        vec!["use-context".into(), "c".into()],
    ] {
        let mut all = vec!["config", "--kubeconfig", &boot];
        all.extend(args.iter().map(String::as_str));
        s.ok(&all);
    }
    let agent_dir = tmp.path().join("agent");
    let _agent = component(&[
        "agent",
        "--bootstrap-kubeconfig",
        &boot,
        "--simulate",
        "2",
        "--node-prefix",
        "apart-",
        "--start-delay-ms",
        "0",
        "--ready-delay-ms",
        "0",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &path(&agent_dir),
    ]);
    eventually(
        "two CSRs from the token approved and issued",
        Duration::from_secs(120),
        || {
            let csrs = s.ok(&["get", "csr"]);
            let issued = csrs
                .lines()
                .filter(|l| l.contains(&format!("system:bootstrap:{id}")))
                .filter(|l| l.contains("Approved,Issued"))
                .count();
            (issued == 2).then_some(())
        },
    );
    // The agent writes each node's kubeconfig once it has read the issued certificate.
    for node in ["apart-0", "apart-1"] {
        let who = eventually("the node's own kubeconfig", Duration::from_secs(60), || {
            let out = kubectl_as(&s, &node_kubeconfig(&agent_dir, node), &["auth", "whoami"]);
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        });
        assert!(who.contains(&format!("system:node:{node}")), "{who}");
    }
    s.apply(&DEPLOYMENT.replace("replicas: 6", "replicas: 4"));
    let placed = eventually(
        "four pods Running on the two simulated nodes",
        Duration::from_secs(120),
        || {
            let out = s.ok(&[
                "get",
                "pods",
                "-l",
                "app=spread",
                "-o",
                r#"jsonpath={range .items[?(@.status.phase=="Running")]}{.spec.nodeName}{"\n"}{end}"#,
            ]);
            let nodes = lines(&out);
            (nodes.len() == 4).then_some(nodes)
        },
    );
    assert!(placed.iter().all(|n| n.starts_with("apart-")), "{placed:?}");
}
