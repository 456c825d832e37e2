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
//! is on B: real packets, routed by the host-gw routes, and not masqueraded (the server on B
//! answers with the peer address it saw, the client pod's own). Then both agents restart
//! running containers, each through a private containerd of its own in its namespace, and the
//! same holds for container pods, on the same ranges; where containerd cannot run, host A's
//! agent restarts with process pods instead and they reach across again.
//!
//! It needs root and `ip netns`, and says so and passes when they are missing; the packets
//! also need the CNI plugins and `nft`, and are skipped without them unless
//! `SETPOINT_REQUIRE_NFT` or `SETPOINT_REQUIRE_CONTAINERD` is set (containers: unless
//! `SETPOINT_REQUIRE_CONTAINERD=1`). Everything it makes lives in its namespaces (pod
//! bridges, veths, routes, nftables tables) and goes with them; containerd's processes and
//! mounts under the agents' data dirs are killed and unmounted when an agent is dropped.

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
        // A private containerd dies with its agent; its shims and containers (whose working
        // directories are under the data dir) and its mounts would stay.
        kill_processes_under(&self.dir);
        setpoint_node::containerd::testing::unmount_under(&self.dir);
    }
}

fn in_ns(ns: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_setpoint")]);
    c.env("SETPOINT_LOG", "warn")
        .env(support::RUNTIME_ENV, "process")
        // Process pods on the bridge only where `start_agent` asks for packets.
        .env(support::PROCESS_POD_NETWORK_ENV, "host")
        .env(support::PROXY_MODE_ENV, "none");
    c
}

/// What the agents run pods as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pods {
    /// Processes, each in a network namespace on the node's pod bridge.
    Processes,
    /// Containers, through a private containerd of each agent's own.
    Containers,
}

/// Whether each host's agent can run a private containerd of its own here; panics when
/// `SETPOINT_REQUIRE_CONTAINERD=1` requires it.
fn containers_possible() -> bool {
    if !containerd_available() {
        return false;
    }
    if let Some(socket) = setpoint_node::containerd::find_system_endpoint() {
        eprintln!(
            "not running container pods across hosts: a system containerd at {} would serve both agents",
            socket.display()
        );
        return false;
    }
    let nsenter = Command::new("nsenter")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !nsenter {
        assert!(
            std::env::var(setpoint_node::containerd::testing::REQUIRE_ENV).as_deref() != Ok("1"),
            "containers across hosts need nsenter (util-linux)"
        );
        eprintln!("not running container pods across hosts: no nsenter");
    }
    nsenter
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

/// The path the web pods answer with `peer <address>`, the address the request came from.
const PEER_PATH: &str = "/cgi-bin/peer";

/// As process pods: a web server on host-b that answers every GET with the peer address it
/// saw (a few lines of Python, which the host has), and a client on host-a to curl from.
const PROCESS_PODS: &str = r#"apiVersion: v1
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
    command:
    - python3
    - -c
    - |
      import http.server
      class Peer(http.server.BaseHTTPRequestHandler):
          def do_GET(self):
              body = ("peer %s\n" % self.client_address[0]).encode()
              self.send_response(200)
              self.send_header("Content-Length", str(len(body)))
              self.end_headers()
              self.wfile.write(body)
      http.server.ThreadingHTTPServer(("", 8080), Peer).serve_forever()
    ports:
    - {name: http, containerPort: 8080}
    readinessProbe:
      httpGet: {path: /cgi-bin/peer, port: 8080}
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
"#;

/// As container pods of the local busybox image: busybox `httpd` with a CGI script that
/// answers with `REMOTE_ADDR`, and a client that requests with busybox `nc`.
const CONTAINER_PODS: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: web-b
  labels: {app: web-b}
spec:
  nodeName: host-b
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: setpoint.local/busybox:1
    command:
    - sh
    - -c
    - |
      mkdir -p /tmp/www/cgi-bin
      echo '#!/bin/sh' > /tmp/www/cgi-bin/peer
      echo 'echo "Content-Type: text/plain"; echo; echo "peer $REMOTE_ADDR"' >> /tmp/www/cgi-bin/peer
      chmod +x /tmp/www/cgi-bin/peer
      exec httpd -f -p 8080 -h /tmp/www
    ports:
    - {name: http, containerPort: 8080}
    readinessProbe:
      httpGet: {path: /cgi-bin/peer, port: 8080}
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
    image: setpoint.local/busybox:1
    command: ["sleep", "3600"]
"#;

/// The Service whose only endpoint is the web pod on host-b.
const SERVICE: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: web-b
spec:
  selector: {app: web-b}
  ports:
  - {name: http, port: 80, targetPort: http}
"#;

impl Pods {
    /// The web and client pods, and the Service.
    fn manifest(self) -> String {
        let pods = match self {
            Pods::Processes => PROCESS_PODS,
            Pods::Containers => CONTAINER_PODS,
        };
        format!("{pods}---\n{SERVICE}")
    }

    /// The command the client pod runs to GET [`PEER_PATH`] from `host:port`.
    fn request(self, host: &str, port: u16) -> Vec<String> {
        match self {
            Pods::Processes => vec![
                "curl".into(),
                "-sS".into(),
                "-m".into(),
                "2".into(),
                format!("http://{host}:{port}{PEER_PATH}"),
            ],
            // The static busybox's `wget` crashes before it sends anything; `nc` works.
            Pods::Containers => vec![
                "sh".into(),
                "-c".into(),
                format!("printf 'GET {PEER_PATH} HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {host} {port}"),
            ],
        }
    }
}

/// The address in a `peer <address>` answer, an IPv4-mapped IPv6 one (busybox `httpd`
/// listens on IPv6 and writes `[::ffff:a.b.c.d]`) as IPv4.
fn peer_of(answer: &str) -> Option<String> {
    let peer = answer
        .lines()
        .find_map(|l| l.trim().strip_prefix("peer "))?;
    let peer = peer.trim().trim_start_matches('[').trim_end_matches(']');
    Some(peer.trim_start_matches("::ffff:").to_string())
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

/// An agent in `ns`; with `packets`, its process pods get network namespaces on its pod
/// bridge and it runs the service proxy. With `Pods::Containers` it runs containers through
/// a private containerd, which it starts in `ns` (entered with `nsenter`: `ip netns exec`
/// mounts a `/sys` of its own, without the cgroup filesystems runc needs).
fn start_agent(
    ns: &str,
    join: &[String],
    node: &str,
    address: &str,
    dir: &Path,
    packets: bool,
    pods: Pods,
) -> Proc {
    let mut command = match pods {
        Pods::Processes => in_ns(ns),
        Pods::Containers => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{ns}"))
                .arg(env!("CARGO_BIN_EXE_setpoint"))
                .env("SETPOINT_LOG", "warn")
                .env(support::RUNTIME_ENV, "cri")
                .env(support::PROCESS_POD_NETWORK_ENV, "host");
            c
        }
    };
    if packets {
        command
            .env(support::PROCESS_POD_NETWORK_ENV, "bridge")
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
            Pods::Processes,
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
        pods_reach_across(&kubectl_output, tmp.path(), [&a, &b], Pods::Processes);
        // A restarted agent finds its range on its Node and puts new pods on it again: as a
        // container node (both hosts) where containerd can run, else with processes (host A).
        let (pods, restarted) = if containers_possible() {
            (Pods::Containers, 0..2)
        } else {
            (Pods::Processes, 0..1)
        };
        for i in restarted {
            // Gone, with whatever it left under its data dir, before the next one starts there.
            let mut old = agents.remove(i);
            old.stop();
            drop(old);
            let node = ["host-a", "host-b"][i];
            let dir = tmp.path().join(node);
            let again = start_agent(
                &lan.hosts[i],
                &join,
                node,
                &lan.host_ips[i],
                &dir,
                true,
                pods,
            );
            agents.insert(i, again);
        }
        pods_reach_across(&kubectl_output, tmp.path(), [&a, &b], pods);
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
/// cluster IP, and the web pod sees the client pod's own address; each pod's address is from
/// its node's range (`cidrs`: host-a's, host-b's). The pods are deleted at the end, so their
/// agents tear their networks down.
fn pods_reach_across(
    kubectl: &dyn Fn(&[&str]) -> std::process::Output,
    dir: &Path,
    cidrs: [&str; 2],
    pods: Pods,
) {
    let run = |args: &[&str]| support::expect_success(&args.join(" "), &kubectl(args));
    let manifest = dir.join("pods.yaml");
    std::fs::write(&manifest, pods.manifest()).unwrap();
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
    for (what, host, port) in [
        ("the pod IP on host-b", web.as_str(), 8080),
        ("the Service's cluster IP", cluster_ip.as_str(), 80),
    ] {
        let request = pods.request(host, port);
        let peer = eventually(
            &format!("a pod on host-a reaches {what} ({host}:{port})"),
            Duration::from_secs(30),
            || {
                let mut args = vec!["exec", "client-a", "--"];
                args.extend(request.iter().map(String::as_str));
                peer_of(&String::from_utf8_lossy(&kubectl(&args).stdout))
            },
        );
        // Not masqueraded on the way: the server saw the client pod, not node A.
        assert_eq!(
            peer, client,
            "the web pod on host-b saw {peer} as the client through {what}, not the client pod's {client}"
        );
    }
    eprintln!("{pods:?}: pod {client} on host-a reached pod {web} on host-b and its Service at {cluster_ip}, unmasqueraded");
    run(&["delete", "pod", "web-b", "client-a", "--timeout=30s"]);
}
