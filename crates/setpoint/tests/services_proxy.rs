//! End to end with the real kubectl against `setpoint up --proxy-mode nftables`, with real
//! packets: "services repoint". A Deployment of three web servers (process pods on their
//! loopback pod addresses) behind a ClusterIP Service, and a client on the host requesting
//! the cluster IP in a loop while pods are deleted one by one and the Deployment rolls to a
//! new version; the client sees no failed request beyond the in-flight ones of a killed pod.
//! A deleted pod's endpoint leaves the node's rules, timed; a NodePort Service answers on the
//! host's address and on 127.0.0.1; a LoadBalancer Service gets the node's address as its
//! ingress, which answers; the table is gone when the cluster is cleaned up.
//!
//! Needs root and `nft` (skipped without them, unless `SETPOINT_REQUIRE_NFT` is set) and
//! kubectl (unless `SETPOINT_REQUIRE_KUBECTL` is set).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support;

use support::{eventually, lines, ready_pods, Setpoint};

const WAIT: Duration = Duration::from_secs(90);

/// Three servers on their pod's address, port 8080, ready once they answer; each says its
/// version. On SIGTERM a server keeps serving a moment (as a web server draining should)
/// while its endpoint leaves the Service.
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
      terminationGracePeriodSeconds: 5
      containers:
      - name: web
        image: python:3
        command: ["python3", "-c", "import http.server, os, signal, sys, threading, time\nclass H(http.server.BaseHTTPRequestHandler):\n    def do_GET(self):\n        body = os.environ.get('VERSION', '1').encode()\n        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n    def log_message(self, *a): pass\ns = http.server.ThreadingHTTPServer((os.environ['POD_IP'], 8080), H)\ndef stop(*a):\n    threading.Thread(target=lambda: (time.sleep(1), s.shutdown())).start()\nsignal.signal(signal.SIGTERM, stop)\ns.serve_forever()\n"]
        ports:
        - {name: http, containerPort: 8080}
        env:
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        - {name: VERSION, value: "1"}
        readinessProbe:
          httpGet: {path: /, port: 8080}
          periodSeconds: 1
"#;

const SERVICE: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: http}
---
apiVersion: v1
kind: Service
metadata:
  name: web-np
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: http}
"#;

fn nft_or_skip() -> bool {
    let ok = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && std::env::var_os("SETPOINT_REQUIRE_NFT").is_some() {
        panic!("SETPOINT_REQUIRE_NFT is set but nftables cannot be programmed here");
    }
    if !ok {
        eprintln!("skipping: nftables cannot be programmed here (needs root and nft)");
    }
    ok
}

/// One HTTP/1.0 GET on a new connection: the body on a 200.
fn get(to: SocketAddr) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&to, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    write!(s, "GET / HTTP/1.0\r\nHost: web\r\n\r\n").map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    if !out.starts_with("HTTP/1.0 200") {
        return Err(format!("answer {:?}", out.lines().next()));
    }
    Ok(out.rsplit("\r\n\r\n").next().unwrap_or("").to_string())
}

/// The host's address on its default route.
fn host_address() -> Option<Ipv4Addr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.255:9").ok()?;
    match socket.local_addr().ok()?.ip() {
        std::net::IpAddr::V4(ip) if !ip.is_unspecified() && !ip.is_loopback() => Some(ip),
        _ => None,
    }
}

fn table_listing(table: &str) -> String {
    let out = Command::new("nft")
        .args(["list", "table", "ip", table])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn pod_ip(s: &Setpoint, pod: &str) -> String {
    s.ok(&["get", "pod", pod, "-o", "jsonpath={.status.podIP}"])
        .trim()
        .to_string()
}

/// A client requesting the Service in a loop on a thread: counts, and the failures' texts.
struct Client {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    seen: Arc<Mutex<std::collections::BTreeSet<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Client {
    fn start(to: SocketAddr) -> Client {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
        let thread = std::thread::spawn({
            let (stop, ok, failures, seen) =
                (stop.clone(), ok.clone(), failures.clone(), seen.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    match get(to) {
                        Ok(body) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                            seen.lock().unwrap().insert(body);
                        }
                        Err(e) => failures.lock().unwrap().push(e),
                    }
                }
            }
        });
        Client {
            stop,
            ok,
            failures,
            seen,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> (u64, Vec<String>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        let seen = self.seen.lock().unwrap().iter().cloned().collect();
        (
            self.ok.load(Ordering::Relaxed),
            self.failures.lock().unwrap().clone(),
            seen,
        )
    }
}

/// A `LoadBalancer` Service without a class, and one with a class nobody implements.
const LOAD_BALANCERS: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: web-lb
spec:
  type: LoadBalancer
  selector: {app: web}
  ports:
  - {name: http, port: 28080, targetPort: http}
---
apiVersion: v1
kind: Service
metadata:
  name: web-classy
spec:
  type: LoadBalancer
  loadBalancerClass: example.com/nobody
  selector: {app: web}
  ports:
  - {name: http, port: 28081, targetPort: http}
"#;

/// The built-in load balancer: the Service's ingress is the node's address (the local
/// node's is 127.0.0.1), `kubectl get svc` shows it as the EXTERNAL-IP, and a request to
/// it on the Service's port answers; a Service with a class is left pending; a Service
/// that stops being a LoadBalancer loses its ingress.
fn load_balancer(s: &Setpoint) {
    s.apply(LOAD_BALANCERS);
    let node_ip = s
        .ok(&[
            "get",
            "nodes",
            "-o",
            r#"jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}"#,
        ])
        .trim()
        .to_string();
    let ingress = eventually("the load balancer's ingress", WAIT, || {
        let out = s.ok(&[
            "get",
            "svc",
            "web-lb",
            "-o",
            "jsonpath={.status.loadBalancer.ingress[*].ip} {.status.loadBalancer.ingress[*].ipMode}",
        ]);
        (!out.trim().is_empty()).then(|| out.trim().to_string())
    });
    assert_eq!(ingress, format!("{node_ip} VIP"));
    let table = s.ok(&["get", "svc", "web-lb", "web-classy"]);
    let row = |name: &str| -> Vec<String> {
        lines(&table)
            .into_iter()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in {table}"))
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    // NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE
    assert_eq!(row("web-lb")[3], node_ip, "{table}");
    assert_eq!(row("web-classy")[3], "<pending>", "{table}");
    let ip: Ipv4Addr = node_ip.parse().unwrap();
    let answer = eventually("the load balancer answers", WAIT, || {
        get(SocketAddr::from((ip, 28080))).ok()
    });
    assert_eq!(answer, "1");

    s.ok(&[
        "patch",
        "svc",
        "web-lb",
        "-p",
        r#"{"spec":{"type":"ClusterIP"}}"#,
    ]);
    eventually("the ingress removed", WAIT, || {
        s.ok(&[
            "get",
            "svc",
            "web-lb",
            "-o",
            "jsonpath={.status.loadBalancer}",
        ])
        .trim()
        .trim_matches(|c| c == '{' || c == '}')
        .is_empty()
        .then_some(())
    });
    s.ok(&["delete", "svc", "web-lb", "web-classy"]);
}

#[test]
fn services_repoint_with_real_packets() {
    if !support::kubectl_available() || !nft_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = Setpoint::start(&["up", "--proxy-mode", "nftables"], &data);
    let node_dir = data.canonicalize().unwrap().join("node");
    let table = setpoint_network::proxy::table_name(&node_dir.display().to_string());

    s.apply(DEPLOYMENT);
    s.apply(SERVICE);
    eventually("three ready web pods", WAIT, || {
        ready_pods(&s, "app=web", 3)
    });
    let cluster_ip: Ipv4Addr = s
        .ok(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"])
        .trim()
        .parse()
        .unwrap();
    let service = SocketAddr::from((cluster_ip, 80));
    eventually("the cluster IP answers", WAIT, || get(service).ok());

    // NodePort: on the node's address.
    let node_port: u16 = s
        .ok(&[
            "get",
            "svc",
            "web-np",
            "-o",
            "jsonpath={.spec.ports[0].nodePort}",
        ])
        .trim()
        .parse()
        .unwrap();
    assert!((30000..=32767).contains(&node_port), "{node_port}");
    if let Some(host) = host_address() {
        let answer = eventually("the node port answers", WAIT, || {
            get(SocketAddr::from((host, node_port))).ok()
        });
        assert_eq!(answer, "1");
    }
    // And on loopback, the local node's own address (pods on a bridge included).
    let answer = eventually("the node port answers on 127.0.0.1", WAIT, || {
        get(SocketAddr::from((Ipv4Addr::LOCALHOST, node_port))).ok()
    });
    assert_eq!(answer, "1");

    load_balancer(&s);

    let client = Client::start(service);
    eventually("the client's first answers", WAIT, || {
        (client.ok.load(Ordering::Relaxed) > 10).then_some(())
    });

    // Delete the pods one by one: each endpoint leaves the rules, timed from the delete.
    let mut leave_times = Vec::new();
    for _ in 0..3 {
        let pods = eventually("three ready web pods", WAIT, || {
            ready_pods(&s, "app=web", 3)
        });
        let victim = &pods[0];
        let ip = pod_ip(&s, victim);
        let dnat = format!("dnat to {ip}:8080");
        assert!(
            table_listing(&table).contains(&dnat),
            "{victim} ({ip}) is not in the rules"
        );
        let started = Instant::now();
        s.ok(&["delete", "pod", victim, "--wait=false"]);
        eventually("the deleted pod's endpoint leaves the rules", WAIT, || {
            (!table_listing(&table).contains(&dnat)).then_some(())
        });
        leave_times.push(started.elapsed());
        eventually("the replacement is ready", WAIT, || {
            ready_pods(&s, "app=web", 3).filter(|p| !p.contains(victim))
        });
    }

    // Roll to a new version.
    s.ok(&["set", "env", "deployment/web", "VERSION=2"]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=120s"]);
    eventually("the new version answers", WAIT, || {
        get(service).ok().filter(|b| b == "2")
    });
    let before = client.ok.load(Ordering::Relaxed);
    eventually("requests after the rollout", WAIT, || {
        (client.ok.load(Ordering::Relaxed) > before + 10).then_some(())
    });
    let (ok, failures, seen) = client.finish();
    eprintln!(
        "services repoint: {ok} requests answered, {} failed {failures:?}; versions seen {seen:?}; \
         endpoint left the rules after {leave_times:?}",
        failures.len()
    );
    assert_eq!(seen, ["1", "2"]);
    // The pods drain: no request may fail.
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    for t in &leave_times {
        assert!(
            *t < Duration::from_secs(2),
            "an endpoint took {t:?} to leave"
        );
    }

    // Deleting the Services empties the rules of them; the table goes with the cluster.
    s.ok(&["delete", "svc", "web", "web-np"]);
    eventually("the Services' rules are gone", WAIT, || {
        (!table_listing(&table).contains("default/web/")).then_some(())
    });
    assert!(get(service).is_err());
    drop(s);
    assert!(
        !lines(&table_listing(&table))
            .iter()
            .any(|l| l.contains("table")),
        "the table is left behind"
    );
}
