//! Joining a machine with the command `setpoint up` prints: `setpoint agent --server …
//! --token … --ca-cert-hash …` pins the CA, asks for a node certificate with the bootstrap
//! token, and runs pods as `system:node:<name>`; `kubectl get csr` shows the request,
//! approved and issued, from `system:bootstrap:<id>`.
//!
//! `joins_over_loopback` runs everywhere. `joins_from_another_network_namespace` runs the
//! agent in its own network namespace, connected to the server's by a veth pair, as two hosts;
//! it needs root and `ip netns`, and says so and passes when they are missing.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// A process killed, with the pods it started, when the test ends however it ends.
struct Agent {
    child: Child,
    dir: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        kill_processes_under(&self.dir);
        // The agent's data dir is its node's: pods' networks and its bridge, if it has them.
        remove_pod_networks(&self.dir);
        remove_private_bridge(&self.dir);
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

/// kubeadm's documented way to compute the hash, with openssl: an independent check.
fn openssl_ca_hash(kubeconfig: &Path) -> Option<String> {
    let text = std::fs::read_to_string(kubeconfig).ok()?;
    let b64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority-data:"))?
        .trim()
        .trim_matches('"')
        .to_string();
    let script = format!(
        "echo {b64} | base64 -d | openssl x509 -pubkey -noout | openssl pkey -pubin -outform der | sha256sum"
    );
    let out = Command::new("sh").args(["-c", &script]).output().ok()?;
    let hex = String::from_utf8(out.stdout).ok()?;
    let hex = hex.split_whitespace().next()?.to_string();
    (out.status.success() && hex.len() == 64).then(|| format!("sha256:{hex}"))
}

/// Starts the agent of `words` (in the network namespace `netns`, if any) as node `node`.
fn start_agent(words: &[String], node: &str, dir: &Path, netns: Option<&str>) -> Agent {
    let exe = env!("CARGO_BIN_EXE_setpoint");
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, exe]);
            c
        }
        None => Command::new(exe),
    };
    cmd.args(words)
        .args(["--node-name", node, "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir)
        .env("SETPOINT_LOG", "warn")
        .env(support::RUNTIME_ENV, "process")
        .env(support::PROCESS_POD_NETWORK_ENV, "host")
        // Joining needs no service proxy, whose nftables table would outlive the test.
        .env(support::PROXY_MODE_ENV, "none")
        .stdout(Stdio::null());
    Agent {
        child: cmd.spawn().expect("start the agent"),
        dir: dir.to_path_buf(),
    }
}

/// Waits for `node` to be Ready, a pod bound to it to run, and checks where its certificate
/// came from.
fn check_joined(s: &Setpoint, words: &[String], node: &str, agent_dir: &Path) {
    eventually(
        &format!("node {node} Ready"),
        Duration::from_secs(90),
        || {
            let out = s.kubectl(&[
                "get",
                "node",
                node,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ]);
            (String::from_utf8_lossy(&out.stdout) == "True").then_some(())
        },
    );
    let id = flag(words, "--token")
        .split('.')
        .next()
        .unwrap()
        .to_string();
    let csrs = s.ok(&["get", "csr"]);
    let line = csrs
        .lines()
        .find(|l| l.contains(&format!("system:bootstrap:{id}")))
        .unwrap_or_else(|| panic!("no CSR from the bootstrap token:\n{csrs}"));
    assert!(
        line.contains("kubernetes.io/kube-apiserver-client-kubelet"),
        "{line}"
    );
    assert!(line.contains("Approved,Issued"), "{line}");
    // The agent's own kubeconfig is the node's identity.
    let kubeconfig = agent_dir.join("node.kubeconfig");
    let who = s.ok(&[
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "auth",
        "whoami",
    ]);
    assert!(who.contains(&format!("system:node:{node}")), "{who}");
    assert!(who.contains("system:nodes"), "{who}");
    s.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: on-{node}\nspec:\n  nodeName: {node}\n  containers:\n  - name: c\n    image: busybox\n    command: [sleep, '1000']\n"
    ));
    eventually(
        "the pod on the joined node running",
        Duration::from_secs(60),
        || {
            let out = s.kubectl(&[
                "get",
                "pod",
                &format!("on-{node}"),
                "-o",
                "jsonpath={.status.phase}",
            ]);
            (String::from_utf8_lossy(&out.stdout) == "Running").then_some(())
        },
    );
}

#[test]
fn joins_over_loopback() {
    if !kubectl_available() {
        eprintln!("kubectl not found; skipping");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&tmp.path().join("server"));
    let words = join_command(&s);
    assert_eq!(flag(&words, "--server"), s.url);
    if Command::new("openssl").arg("version").output().is_ok() {
        let hash = openssl_ca_hash(&s.kubeconfig).expect("openssl computes the CA hash");
        assert_eq!(flag(&words, "--ca-cert-hash"), hash);
    }
    let dir = tmp.path().join("agent");
    // A wrong hash is refused before the token is ever sent.
    let mut wrong = words.clone();
    let i = wrong.iter().position(|w| w == "--ca-cert-hash").unwrap();
    wrong[i + 1] = format!("sha256:{}", "0".repeat(64));
    let out = Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .args(&wrong)
        .args(["--node-name", "wrong", "--data-dir"])
        .arg(tmp.path().join("wrong"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to trust this server"), "{err}");

    let _agent = start_agent(&words, "joined", &dir, None);
    check_joined(&s, &words, "joined", &dir);
}

/// Two network namespaces joined by a veth pair, deleted (with their links) when dropped.
struct Hosts {
    server_ns: String,
    agent_ns: String,
    server_ip: String,
}

impl Hosts {
    /// Two namespaces with addresses from a /30 of 10.251.0.0/16 chosen by this process's id,
    /// so tests running at once (and runs left behind) do not collide.
    fn create() -> Result<Hosts, String> {
        let block = std::process::id() % 16384;
        let base = block * 4;
        let (b2, b3) = (base / 256, base % 256);
        let tag = std::process::id();
        let hosts = Hosts {
            server_ns: format!("sp-join-s{tag}"),
            agent_ns: format!("sp-join-a{tag}"),
            server_ip: format!("10.251.{b2}.{}", b3 + 1),
        };
        let agent_ip = format!("10.251.{b2}.{}", b3 + 2);
        let (vs, va) = (format!("sps{tag}"), format!("spa{tag}"));
        let (s, a) = (hosts.server_ns.as_str(), hosts.agent_ns.as_str());
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", s],
            vec!["netns", "add", a],
            vec!["link", "add", &vs, "type", "veth", "peer", "name", &va],
            vec!["link", "set", &vs, "netns", s],
            vec!["link", "set", &va, "netns", a],
            vec!["-n", s, "addr", "add", "PLACEHOLDER_S", "dev", &vs],
            vec!["-n", a, "addr", "add", "PLACEHOLDER_A", "dev", &va],
            vec!["-n", s, "link", "set", &vs, "up"],
            vec!["-n", a, "link", "set", &va, "up"],
            vec!["-n", s, "link", "set", "lo", "up"],
            vec!["-n", a, "link", "set", "lo", "up"],
        ];
        let server_cidr = format!("{}/30", hosts.server_ip);
        let agent_cidr = format!("{agent_ip}/30");
        for step in steps {
            let args: Vec<&str> = step
                .iter()
                .map(|w| match *w {
                    "PLACEHOLDER_S" => server_cidr.as_str(),
                    "PLACEHOLDER_A" => agent_cidr.as_str(),
                    w => w,
                })
                .collect();
            let out = Command::new("ip")
                .args(&args)
                .output()
                .map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        Ok(hosts)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and with it its peer.
        for ns in [&self.server_ns, &self.agent_ns] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// `setpoint up` in the server's namespace, killed with its pods when dropped.
struct Server {
    child: Child,
    dir: PathBuf,
    kubeconfig: PathBuf,
    join: Vec<String>,
    home: tempfile::TempDir,
    netns: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        kill_processes_under(&self.dir);
        remove_pod_networks(&self.dir.join("node"));
        remove_private_bridge(&self.dir);
    }
}

impl Server {
    fn start(hosts: &Hosts, dir: &Path) -> Server {
        let listen = format!("{}:6443", hosts.server_ip);
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &hosts.server_ns,
                env!("CARGO_BIN_EXE_setpoint"),
            ])
            .args(["up", "--listen", &listen, "--data-dir"])
            .arg(dir)
            .env("SETPOINT_LOG", "warn")
            .env(support::RUNTIME_ENV, "process")
            .env(support::PROCESS_POD_NETWORK_ENV, "host")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start setpoint up");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let mut server = Server {
            child,
            dir: dir.to_path_buf(),
            kubeconfig: PathBuf::new(),
            join: Vec::new(),
            home: tempfile::tempdir().unwrap(),
            netns: hosts.server_ns.clone(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.join.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .expect("setpoint up prints its join command");
            if let Some(rest) = line.trim().strip_prefix("export KUBECONFIG=") {
                server.kubeconfig = PathBuf::from(rest);
            }
            if let Some(rest) = line.trim().strip_prefix("setpoint agent ") {
                server.join = std::iter::once("agent".to_string())
                    .chain(rest.split_whitespace().map(str::to_string))
                    .collect();
            }
        }
        server
    }

    /// kubectl in the server's namespace, as its admin.
    fn kubectl(&self, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.netns, "kubectl", "--kubeconfig"])
            .arg(&self.kubeconfig)
            .args(args)
            .env("HOME", self.home.path())
            .output()
            .expect("run kubectl")
    }
}

#[test]
fn joins_from_another_network_namespace() {
    if !netns_available() || !kubectl_available() {
        eprintln!("skipping: joining across network namespaces needs root, `ip netns` and kubectl");
        return;
    }
    let hosts = match Hosts::create() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("skipping: network namespaces cannot be set up here: {e}");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let server = Server::start(&hosts, &tmp.path().join("server"));
    assert_eq!(
        flag(&server.join, "--server"),
        format!("https://{}:6443", hosts.server_ip)
    );
    let dir = tmp.path().join("agent");
    let _agent = start_agent(&server.join, "far-node", &dir, Some(&hosts.agent_ns));
    let ok = |args: &[&str]| {
        let out = server.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    eventually("node far-node Ready", Duration::from_secs(90), || {
        let out = server.kubectl(&[
            "get",
            "node",
            "far-node",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        (String::from_utf8_lossy(&out.stdout) == "True").then_some(())
    });
    let id = flag(&server.join, "--token")
        .split('.')
        .next()
        .unwrap()
        .to_string();
    let csrs = ok(&["get", "csr"]);
    let line = csrs
        .lines()
        .find(|l| l.contains(&format!("system:bootstrap:{id}")))
        .unwrap_or_else(|| panic!("no CSR from the bootstrap token:\n{csrs}"));
    assert!(line.contains("Approved,Issued"), "{line}");
    let manifest = tmp.path().join("pod.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: far\nspec:\n  nodeName: far-node\n  containers:\n  - name: c\n    image: busybox\n    command: [sleep, '1000']\n",
    )
    .unwrap();
    ok(&["apply", "-f", manifest.to_str().unwrap()]);
    eventually(
        "the pod on the far node running",
        Duration::from_secs(60),
        || {
            let out = server.kubectl(&["get", "pod", "far", "-o", "jsonpath={.status.phase}"]);
            (String::from_utf8_lossy(&out.stdout) == "Running").then_some(())
        },
    );
}

#[test]
fn kubectl_certificate_approve_gets_a_user_a_certificate() {
    if !kubectl_available() {
        eprintln!("kubectl not found; skipping");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&tmp.path().join("server"));
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "alice");
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    let request = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, pem);
    for name in ["alice", "mallory"] {
        s.apply(&format!(
            "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata:\n  name: {name}\nspec:\n  request: {request}\n  signerName: kubernetes.io/kube-apiserver-client\n  expirationSeconds: 86400\n  usages: [client auth]\n"
        ));
    }
    let pending = s.ok(&["get", "csr", "alice"]);
    assert!(pending.contains("Pending"), "{pending}");
    assert!(pending.contains("24h"), "{pending}");
    let approved = s.ok(&["certificate", "approve", "alice"]);
    assert!(approved.contains("approved"), "{approved}");
    s.ok(&["certificate", "deny", "mallory"]);
    eventually("alice's certificate", Duration::from_secs(30), || {
        let row = s.ok(&["get", "csr", "alice"]);
        row.contains("Approved,Issued").then_some(())
    });
    let denied = s.ok(&["get", "csr", "mallory"]);
    assert!(denied.contains("Denied"), "{denied}");
    let cert = s.ok(&[
        "get",
        "csr",
        "alice",
        "-o",
        "jsonpath={.status.certificate}",
    ]);
    assert!(!cert.is_empty());
}
