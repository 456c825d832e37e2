//! Pod ranges, host-gw routes and real packets across machines: `setpoint up
//! --allocate-node-cidrs` in one network namespace and two joined agents, each in a
//! namespace of its own, on one bridge as three hosts on a LAN. Each node gets its own
//! `spec.podCIDR`; each agent routes the other's range through the other's address, removes
//! its routes at a clean stop, and drops the route of a Node that is deleted.
//!
//! The agents run process pods with `--process-pod-network bridge` (a network namespace, a
//! veth and an address per pod on the node's pod bridge, which is on the node's
//! `spec.podCIDR`) and the service proxy in nftables mode. A pod on host A reaches, over HTTP,
//! a pod on host B by its pod IP and through the cluster IP of a Service whose only endpoint
//! is on B: real packets, routed by the host-gw routes. After host A's agent restarts, its new
//! pods are on the same range and reach across again. Container pods through a private
//! containerd per host are not part of this test.
//!
//! It needs root and `ip netns`, and says so and passes when they are missing; the packets
//! also need the CNI plugins and `nft`, and are skipped without them unless
//! `SETPOINT_REQUIRE_NFT` or `SETPOINT_REQUIRE_CONTAINERD` is set. Everything it makes lives
//! in its namespaces (pod bridges, veths, routes, nftables tables) and goes with them.

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
        .env(support::PROXY_MODE_ENV, "none");
    c
}

/// Whether pods can get networks of their own and Services be proxied here (the CNI plugins
/// and nftables; root is already known); panics when CI requires them.
fn packets_possible() -> bool {
    let missing = if setpoint_node::containerd::config::find_cni_bin_dir().is_none() {
        Some("no CNI plugins")
    } else if !Command::new("nft")
        .args(["list", "tables"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        Some("nftables cannot be programmed")
    } else {
        None
    };
    let Some(why) = missing else {
        return true;
    };
    for var in ["SETPOINT_REQUIRE_CONTAINERD", "SETPOINT_REQUIRE_NFT"] {
        assert!(std::env::var_os(var).is_none(), "{var} is set but {why}");
    }
    eprintln!("not sending packets between pods: {why}");
    false
}

/// A web server pod on host-b behind a Service, and a client pod on host-a to curl from.
const PODS: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: web-b
  labels: {app: web-b}
spec:
  nodeName: host-b
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: python:3
    command: ["python3", "-m", "http.server", "8080"]
    ports:
    - {name: http, containerPort: 8080}
    readinessProbe:
      httpGet: {path: /, port: 8080}
      periodSeconds: 1
---
apiVersion: v1
kind: Pod
metadata:
  name: client-a
spec:
  nodeName: host-a
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: busybox
    command: ["sleep", "3600"]
---
apiVersion: v1
kind: Service
metadata:
  name: web-b
spec:
  selector: {app: web-b}
  ports:
  - {name: http, port: 80, targetPort: http}
"#;

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

/// An agent in `ns`; with `packets`, its process pods get network namespaces on its pod
/// bridge and it runs the service proxy.
fn start_agent(
    ns: &str,
    join: &[String],
    node: &str,
    address: &str,
    dir: &Path,
    packets: bool,
) -> Proc {
    let mut command = in_ns(ns);
    if packets {
        command
            .env("SETPOINT_PROCESS_POD_NETWORK", "bridge")
            .env(support::PROXY_MODE_ENV, "nftables");
    }
    let child = command
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
fn nodes_get_pod_ranges_route_each_other_s_and_pods_reach_across() {
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
    let packets = packets_possible();
    let tmp = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (_server, kubeconfig, join) = start_server(&lan, &tmp.path().join("server"));
    let kubectl_output = |args: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", &lan.server, "kubectl", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(args)
            .env("HOME", home.path())
            .output()
            .expect("run kubectl")
    };
    let kubectl =
        |args: &[&str]| String::from_utf8_lossy(&kubectl_output(args).stdout).into_owned();
    let mut agents = Vec::new();
    for (i, node) in ["host-a", "host-b"].iter().enumerate() {
        let dir = tmp.path().join(node);
        agents.push(start_agent(
            &lan.hosts[i],
            &join,
            node,
            &lan.host_ips[i],
            &dir,
            packets,
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

    if packets {
        pods_reach_across(&kubectl_output, tmp.path(), [&a, &b]);
        // A restarted agent finds its range on its Node and puts new pods on it again.
        let mut old = agents.remove(0);
        old.stop();
        drop(old);
        let dir = tmp.path().join("host-a");
        let again = start_agent(&lan.hosts[0], &join, "host-a", &lan.host_ips[0], &dir, true);
        agents.insert(0, again);
        pods_reach_across(&kubectl_output, tmp.path(), [&a, &b]);
    }

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

/// A pod on host-a reaches the web pod on host-b by its pod IP and through its Service's
/// cluster IP; each pod's address is from its node's range (`cidrs`: host-a's, host-b's).
/// The pods are deleted at the end, so their agents tear their networks down.
fn pods_reach_across(
    kubectl: &dyn Fn(&[&str]) -> std::process::Output,
    dir: &Path,
    cidrs: [&str; 2],
) {
    let run = |args: &[&str]| support::expect_success(&args.join(" "), &kubectl(args));
    let manifest = dir.join("pods.yaml");
    std::fs::write(&manifest, PODS).unwrap();
    run(&["apply", "-f", manifest.to_str().unwrap()]);
    let ip_of = |pod: &str, condition: &str| {
        eventually(
            &format!("{pod} {condition} with an IP"),
            Duration::from_secs(60),
            || {
                let out = kubectl(&[
                    "get",
                    "pod",
                    pod,
                    "-o",
                    &format!("jsonpath={{.status.podIP}} {{.status.conditions[?(@.type==\"{condition}\")].status}}"),
                ]);
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let (ip, status) = text.split_once(' ')?;
                (!ip.is_empty() && status == "True").then(|| ip.to_string())
            },
        )
    };
    let web = ip_of("web-b", "Ready");
    let client = ip_of("client-a", "Ready");
    for (ip, cidr) in [(&client, cidrs[0]), (&web, cidrs[1])] {
        let range: setpoint_api::cidr::Cidr = cidr.parse().unwrap();
        assert!(
            range.contains(&ip.parse().unwrap()),
            "pod IP {ip} is not in its node's podCIDR {cidr}"
        );
    }
    let cluster_ip = run(&["get", "svc", "web-b", "-o", "jsonpath={.spec.clusterIP}"]);
    for (what, url) in [
        ("the pod IP on host-b", format!("http://{web}:8080/")),
        (
            "the Service's cluster IP",
            format!("http://{cluster_ip}:80/"),
        ),
    ] {
        eventually(
            &format!("a pod on host-a reaches {what} ({url})"),
            Duration::from_secs(30),
            || {
                let out = kubectl(&["exec", "client-a", "--", "curl", "-sS", "-m", "2", &url]);
                String::from_utf8_lossy(&out.stdout)
                    .contains("Directory listing")
                    .then_some(())
            },
        );
    }
    eprintln!("pod {client} on host-a reached pod {web} on host-b and its Service at {cluster_ip}");
    run(&["delete", "pod", "web-b", "client-a", "--timeout=30s"]);
}
