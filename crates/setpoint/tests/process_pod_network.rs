//! End to end with the real kubectl against `setpoint up --process-pod-network bridge
//! --proxy-mode nftables`, with real packets: process pods each in a network namespace of
//! their own on the node's pod bridge. Two replicas both listen on `0.0.0.0:8080` (which
//! on loopback addresses would fail with "Address already in use"), both get distinct pod
//! IPs from the pod range, answer on them from the host and through their Service's cluster
//! IP, and `kubectl exec` runs in the pod's namespace. A client pod reaches the API server
//! through the `kubernetes` Service (`KUBERNETES_SERVICE_HOST`, its token and CA) and resolves
//! the Service's name through the node's DNS server, as its own `/etc/resolv.conf` says.
//! Deleting the pods tears their namespaces and addresses down.
//!
//! Needs root, the CNI plugins and `nft` (skipped without them, unless
//! `SETPOINT_REQUIRE_CONTAINERD` or `SETPOINT_REQUIRE_NFT` is set) and kubectl (unless
//! `SETPOINT_REQUIRE_KUBECTL` is set).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

mod support;

use support::{eventually, http_get, kubectl_available, lines, ready_pods, Setpoint};

const WAIT: Duration = Duration::from_secs(90);

/// Two servers on every address of their pod, port 8080 (`0.0.0.0`: no `--bind`).
const MANIFEST: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 2
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
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: http}
"#;

/// A client in a pod of its own: through the `kubernetes` Service's cluster IP with its
/// service-account token and the cluster CA (as in-cluster clients find them), it lists the
/// namespace's pods; through the cluster DNS its `/etc/resolv.conf` names, it resolves the
/// `web` Service's name, and gets a page through it (a pod on the node's bridge reaching pods
/// on the same bridge through a cluster IP). Each is retried until it works or a deadline passes, and the pod
/// exits with what it got on its output.
const CLIENT: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: client
spec:
  restartPolicy: Never
  containers:
  - name: client
    image: python:3
    command:
    - python3
    - -c
    - |
      import json, os, socket, ssl, time, urllib.request
      sa = "/var/run/secrets/kubernetes.io/serviceaccount"
      host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
      print("RESOLV", open("/etc/resolv.conf").read().replace("\n", "|"), flush=True)
      tls = ssl.create_default_context(cafile=sa + "/ca.crt")
      def api():
          ns = open(sa + "/namespace").read()
          request = urllib.request.Request(
              f"https://{host}:{port}/api/v1/namespaces/{ns}/pods",
              headers={"Authorization": "Bearer " + open(sa + "/token").read()})
          with urllib.request.urlopen(request, context=tls, timeout=3) as r:
              names = [p["metadata"]["name"] for p in json.load(r)["items"]]
              return f"{host}:{port} {r.status} {len(names)} pods"
      def dns():
          return socket.gethostbyname("web.default.svc.cluster.local")
      def web():
          with urllib.request.urlopen("http://web.default.svc.cluster.local/", timeout=3) as r:
              return r.status
      failed = False
      for what, call in [("API", api), ("DNS", dns), ("WEB", web)]:
          deadline, last = time.time() + 60, None
          while time.time() < deadline:
              try:
                  print(what, call(), flush=True)
                  break
              except Exception as e:
                  last = e
                  time.sleep(0.5)
          else:
              print(what, "FAILED", repr(last), flush=True)
              failed = True
      raise SystemExit(1 if failed else 0)
"#;

/// Whether pod networks can be set up here: root, the CNI plugins and nftables. Panics when
/// CI requires them.
fn prerequisites_or_skip() -> bool {
    let missing = if !setpoint_node::process::netns::permitted() {
        Some("not root (CAP_NET_ADMIN and CAP_SYS_ADMIN)")
    } else if setpoint_node::containerd::config::find_cni_bin_dir().is_none() {
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
        assert!(
            std::env::var_os(var).is_none(),
            "{var} is set but process pod networks cannot run here: {why}"
        );
    }
    eprintln!("skipping: {why}");
    false
}

/// One HTTP/1.0 GET on a new connection: the status line, or why there is none.
fn get(to: SocketAddr) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&to, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    write!(s, "GET / HTTP/1.0\r\nHost: web\r\n\r\n").map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    Ok(out.lines().next().unwrap_or("").to_string())
}

/// The pods' namespace files left under the node's `netns` directory (a failed test must
/// not leave mounts behind: they are detached here).
fn netns_files(node_dir: &Path) -> Vec<String> {
    std::fs::read_dir(node_dir.join("netns"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

struct DetachNamespaces<'a>(&'a Path);

impl Drop for DetachNamespaces<'_> {
    fn drop(&mut self) {
        for name in netns_files(self.0) {
            let _ = Command::new("umount")
                .args(["-l"])
                .arg(self.0.join("netns").join(name))
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

#[test]
fn process_pods_get_a_network_of_their_own() {
    if !kubectl_available() || !prerequisites_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let node_dir = data.join("node");
    let _detach = DetachNamespaces(&node_dir);
    // On every address, so the pods reach the API server at its advertised address through
    // the `kubernetes` Service.
    let s = Setpoint::start_listening(
        &[
            "up",
            "--process-pod-network",
            "bridge",
            "--proxy-mode",
            "nftables",
        ],
        &data,
        "0.0.0.0:0",
    );
    s.apply(MANIFEST);
    let pods = eventually("two ready web pods", WAIT, || ready_pods(&s, "app=web", 2));

    // Both listen on 0.0.0.0:8080 and run: each on an address of its own from the pod range.
    let ips: Vec<Ipv4Addr> = lines(&s.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        r#"jsonpath={range .items[*]}{.status.podIP}{"\n"}{end}"#,
    ]))
    .iter()
    .map(|ip| ip.parse().expect("a pod IP"))
    .collect();
    assert_eq!(ips.len(), 2, "{ips:?}");
    assert_ne!(ips[0], ips[1], "{ips:?}");
    for ip in &ips {
        assert!(!ip.is_loopback(), "{ip} is a loopback address");
        assert_eq!(ip.octets()[..2], [10, 223], "{ip} is not in the pod range");
        assert_eq!(http_get(&ip.to_string(), "/"), "HTTP/1.0 200 OK", "{ip}");
    }
    let restarts = s.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].status.containerStatuses[0].restartCount}",
    ]);
    assert_eq!(restarts.trim(), "0 0", "a replica crashed");

    // The Node says how its process pods are networked.
    let said = s.ok(&[
        "get",
        "nodes",
        "-o",
        r"jsonpath={.items[0].metadata.annotations.setpoint\.io/process-pod-network}",
    ]);
    assert_eq!(said.trim(), "bridge");

    // Through the Service's cluster IP, as a client on the host.
    let cluster_ip: Ipv4Addr = s
        .ok(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"])
        .trim()
        .parse()
        .expect("a cluster IP");
    let service = SocketAddr::from((cluster_ip, 80));
    eventually("an answer through the cluster IP", WAIT, || {
        get(service).ok().filter(|l| l.starts_with("HTTP/1.0 200"))
    });

    // `kubectl exec` runs in the pod's network namespace: it sees the pod's address on eth0.
    let pod_ip = s
        .ok(&["get", "pod", &pods[0], "-o", "jsonpath={.status.podIP}"])
        .trim()
        .to_string();
    let addresses = s.ok(&[
        "exec", &pods[0], "--", "ip", "-4", "-o", "addr", "show", "dev", "eth0",
    ]);
    assert!(
        addresses.contains(&format!("inet {pod_ip}/")),
        "exec did not see the pod's address {pod_ip}: {addresses}"
    );

    // In-cluster clients: the API server through the `kubernetes` Service's cluster IP with
    // the pod's token, and the Service's name through the node's DNS on the pod bridge.
    let endpoint = s.ok(&[
        "get",
        "endpoints",
        "kubernetes",
        "-o",
        "jsonpath={.subsets[0].addresses[0].ip}",
    ]);
    let endpoint: Ipv4Addr = endpoint.trim().parse().expect("the API server's endpoint");
    assert!(
        !endpoint.is_loopback(),
        "the kubernetes endpoint is {endpoint}"
    );
    s.ok(&[
        "create",
        "rolebinding",
        "client-view",
        "--clusterrole=view",
        "--serviceaccount=default:default",
    ]);
    s.apply(CLIENT);
    let phase = eventually("the client pod finished", WAIT, || {
        let phase = s.ok(&["get", "pod", "client", "-o", "jsonpath={.status.phase}"]);
        ["Succeeded", "Failed"]
            .contains(&phase.trim())
            .then(|| phase.trim().to_string())
    });
    let out = s.ok(&["logs", "client"]);
    assert_eq!(phase, "Succeeded", "the client failed: {out}");
    assert!(
        out.contains("API 10.96.0.1:443 200 3 pods"),
        "the client did not list the pods through the kubernetes Service: {out}"
    );
    assert!(
        out.contains(&format!("DNS {cluster_ip}\n")),
        "web.default.svc.cluster.local did not resolve to {cluster_ip}: {out}"
    );
    assert!(
        out.contains("WEB 200\n"),
        "the client pod got no page through the web Service: {out}"
    );
    let gateway = Ipv4Addr::from(u32::from(ips[0]) & 0xffff_ff00 | 1);
    assert!(
        out.contains(&format!(
            "nameserver {gateway}|search default.svc.cluster.local "
        )),
        "the pod's resolv.conf does not name the node's DNS on {gateway}: {out}"
    );
    s.ok(&["delete", "pod", "client", "--wait=false"]);

    // Removing the pods tears their networks down: namespaces, state and addresses.
    s.ok(&["delete", "deployment", "web", "--wait=false"]);
    eventually("the pods gone", WAIT, || {
        let out = s.ok(&["get", "pods", "-l", "app=web", "-o", "name"]);
        out.trim().is_empty().then_some(())
    });
    eventually("the pods' namespaces removed", WAIT, || {
        netns_files(&node_dir).is_empty().then_some(())
    });
    for ip in &ips {
        assert!(
            TcpStream::connect_timeout(&SocketAddr::from((*ip, 8080)), Duration::from_secs(1))
                .is_err(),
            "{ip} still answers"
        );
    }
    let ipam = data.join("containerd/cni/ipam");
    let held: Vec<String> = std::fs::read_dir(&ipam)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|net| {
            std::fs::read_dir(net.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .filter(|name| name.parse::<Ipv4Addr>().is_ok())
        .collect();
    assert!(held.is_empty(), "addresses still allocated: {held:?}");
    s.stop();
}
