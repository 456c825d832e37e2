//! Pod ranges and host-gw routes across machines: `setpoint up --allocate-node-cidrs` in one
//! network namespace and two joined agents, each in a namespace of its own, on one bridge
//! as three hosts on a LAN. Each node gets its own `spec.podCIDR`; each agent routes the
//! other's range through the other's address, removes its routes at a clean stop, and drops
//! the route of a Node that is deleted.
//!
//! It needs root and `ip netns`, and says so and passes when they are missing. The agents
//! run pods as processes: what is checked is the routing, not a packet between containers.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// Three namespaces (a server and hosts `a` and `b`) whose veths meet on a bridge in the
/// server's, addressed from a /29 of 10.250.0.0/16 chosen by this process's id; deleted,
/// with their links and the bridge, when dropped.
struct Lan {
    server: String,
    hosts: [String; 2],
    server_ip: String,
    host_ips: [String; 2],
}

impl Lan {
    fn create() -> Result<Lan, String> {
        let tag = std::process::id();
        let base = (tag % 8192) * 8;
        let (b2, b3) = (base / 256, base % 256);
        let ip = |n: u32| format!("10.250.{b2}.{}", b3 + n);
        let lan = Lan {
            server: format!("sp-pn-s{tag}"),
            hosts: [format!("sp-pn-a{tag}"), format!("sp-pn-b{tag}")],
            server_ip: ip(1),
            host_ips: [ip(2), ip(3)],
        };
        let bridge = format!("spnb{tag}");
        let s = lan.server.as_str();
        let mut steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), s.into()],
            vec![
                "-n".into(),
                s.into(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ],
            vec![
                "-n".into(),
                s.into(),
                "link".into(),
                "add".into(),
                bridge.clone(),
                "type".into(),
                "bridge".into(),
            ],
            vec![
                "-n".into(),
                s.into(),
                "addr".into(),
                "add".into(),
                format!("{}/29", lan.server_ip),
                "dev".into(),
                bridge.clone(),
            ],
            vec![
                "-n".into(),
                s.into(),
                "link".into(),
                "set".into(),
                bridge.clone(),
                "up".into(),
            ],
        ];
        for (i, host) in lan.hosts.iter().enumerate() {
            let (outer, inner) = (format!("spn{i}s{tag}"), format!("spn{i}h{tag}"));
            let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            steps.push(w(&["netns", "add", host]));
            steps.push(w(&["-n", host, "link", "set", "lo", "up"]));
            steps.push(w(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ]));
            steps.push(w(&["link", "set", &outer, "netns", s]));
            steps.push(w(&["link", "set", &inner, "netns", host]));
            steps.push(w(&["-n", s, "link", "set", &outer, "master", &bridge]));
            steps.push(w(&["-n", s, "link", "set", &outer, "up"]));
            let cidr = format!("{}/29", lan.host_ips[i]);
            steps.push(w(&["-n", host, "addr", "add", &cidr, "dev", &inner]));
            steps.push(w(&["-n", host, "link", "set", &inner, "up"]));
        }
        for args in steps {
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
        Ok(lan)
    }

    /// `ip -o route show` in `ns`.
    fn routes(ns: &str) -> String {
        let out = Command::new("ip")
            .args(["-n", ns, "-o", "-4", "route", "show"])
            .output()
            .expect("ip route show");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        // Deleting a namespace deletes the links in it, and with them their peers.
        for ns in std::iter::once(&self.server).chain(&self.hosts) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// A process in a namespace, killed (with the pods it started) when dropped.
struct Proc {
    child: Child,
    dir: PathBuf,
}

impl Proc {
    /// Asks it to stop (SIGTERM: `ip netns exec` runs the command in its own place) and waits.
    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        eventually("the agent to stop", Duration::from_secs(30), || {
            self.child.try_wait().ok().flatten()
        });
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        kill_processes_under(&self.dir);
    }
}

fn in_ns(ns: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_setpoint")]);
    c.env("SETPOINT_LOG", "warn")
        .env(support::RUNTIME_ENV, "process")
        .env("SETPOINT_PROXY_MODE", "none");
    c
}

/// `setpoint up --allocate-node-cidrs` in the server's namespace: its kubeconfig and the
/// words of its join command.
fn start_server(lan: &Lan, dir: &Path) -> (Proc, PathBuf, Vec<String>) {
    let listen = format!("{}:6443", lan.server_ip);
    let mut child = in_ns(&lan.server)
        .args([
            "up",
            "--allocate-node-cidrs",
            "--listen",
            &listen,
            "--data-dir",
        ])
        .arg(dir)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start setpoint up");
    let stdout = child.stdout.take().unwrap();
    let server = Proc {
        child,
        dir: dir.to_path_buf(),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let (mut kubeconfig, mut join) = (PathBuf::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    while join.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .expect("setpoint up prints its join command");
        if let Some(rest) = line.trim().strip_prefix("export KUBECONFIG=") {
            kubeconfig = PathBuf::from(rest);
        }
        if let Some(rest) = line.trim().strip_prefix("setpoint agent ") {
            join = std::iter::once("agent".to_string())
                .chain(rest.split_whitespace().map(str::to_string))
                .collect();
        }
    }
    (server, kubeconfig, join)
}

fn start_agent(ns: &str, join: &[String], node: &str, address: &str, dir: &Path) -> Proc {
    let child = in_ns(ns)
        .args(join)
        .args(["--node-name", node, "--address", address])
        .args(["--listen", &format!("{address}:0"), "--data-dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("start the agent");
    Proc {
        child,
        dir: dir.to_path_buf(),
    }
}

#[test]
fn nodes_get_pod_ranges_and_route_each_other_s() {
    if !netns_available() || !kubectl_available() {
        eprintln!("skipping: routing across network namespaces needs root, `ip netns` and kubectl");
        return;
    }
    let lan = match Lan::create() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("skipping: network namespaces cannot be set up here: {e}");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (_server, kubeconfig, join) = start_server(&lan, &tmp.path().join("server"));
    let kubectl = |args: &[&str]| {
        let out = Command::new("ip")
            .args(["netns", "exec", &lan.server, "kubectl", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(args)
            .env("HOME", home.path())
            .output()
            .expect("run kubectl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut agents = Vec::new();
    for (i, node) in ["host-a", "host-b"].iter().enumerate() {
        let dir = tmp.path().join(node);
        agents.push(start_agent(
            &lan.hosts[i],
            &join,
            node,
            &lan.host_ips[i],
            &dir,
        ));
    }
    let cidr_of = |node: &str| {
        eventually(
            &format!("{node} has a pod CIDR"),
            Duration::from_secs(90),
            || {
                let one = kubectl(&["get", "node", node, "-o", "jsonpath={.spec.podCIDR}"]);
                let all = kubectl(&["get", "node", node, "-o", "jsonpath={.spec.podCIDRs[*]}"]);
                (!one.is_empty()).then(|| {
                    assert_eq!(one, all, "podCIDRs is [podCIDR]");
                    one
                })
            },
        )
    };
    let (a, b) = (cidr_of("host-a"), cidr_of("host-b"));
    assert_ne!(a, b);
    let cluster = std::fs::read_to_string(tmp.path().join("server").join("cluster-cidr")).unwrap();
    let prefix = cluster.trim().trim_end_matches(".0.0/16");
    for c in [&a, &b] {
        assert!(
            c.starts_with(&format!("{prefix}.")) && c.ends_with("/24"),
            "{c} in {cluster}"
        );
    }
    // Each host routes the other's range through the other's address, and not its own.
    let want_a = format!("{b} via {} ", lan.host_ips[1]);
    let want_b = format!("{a} via {} ", lan.host_ips[0]);
    eventually(
        "host-a routes host-b's pods",
        Duration::from_secs(30),
        || Lan::routes(&lan.hosts[0]).contains(&want_a).then_some(()),
    );
    eventually(
        "host-b routes host-a's pods",
        Duration::from_secs(30),
        || Lan::routes(&lan.hosts[1]).contains(&want_b).then_some(()),
    );
    assert!(!Lan::routes(&lan.hosts[0]).contains(&format!("{a} via")));
    // The range set once stays.
    assert_eq!(cidr_of("host-a"), a);

    // A clean stop takes the node's routes with it.
    agents[1].stop();
    let left = Lan::routes(&lan.hosts[1]);
    assert!(
        !left.contains(&want_b),
        "host-b kept its route after stopping:\n{left}"
    );
    // A deleted Node's range is no longer routed by the others.
    kubectl(&["delete", "node", "host-b", "--wait=false"]);
    eventually(
        "host-a drops host-b's route",
        Duration::from_secs(30),
        || (!Lan::routes(&lan.hosts[0]).contains(&want_a)).then_some(()),
    );
}
