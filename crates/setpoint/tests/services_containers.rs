//! "Services repoint" for container pods, end to end with the real kubectl, a real
//! containerd and real packets: `setpoint up --container-runtime cri --proxy-mode nftables`
//! runs a Deployment of three busybox `httpd` pods behind a ClusterIP Service, and a client
//! pod that requests the Service in a loop, by its cluster IP and by its name
//! `web.default.svc.cluster.local` (the node's cluster DNS), while the web pods are deleted
//! one by one and the Deployment rolls to a new version. Each web pod drains: on SIGTERM it
//! keeps serving a moment while its endpoint leaves the rules. The client sees no failed
//! request beyond the in-flight ones of a pod that went away, and the failures are counted.
//! The host reaches the container pods through the cluster IP too, and the proxy's rules
//! masquerade cluster-IP traffic from outside the node's pod subnet (`--cluster-cidr`'s
//! default).
//!
//! Skipped (saying why) unless root with containerd, runc, the CNI plugins, a static busybox
//! and `nft`, and kubectl; `SETPOINT_REQUIRE_CONTAINERD=1`, `SETPOINT_REQUIRE_NFT` and
//! `SETPOINT_REQUIRE_KUBECTL=1` make that a failure.

mod support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use support::{eventually, lines, ready_pods, Setpoint};

const WAIT: Duration = Duration::from_secs(120);

/// Three busybox web servers on port 8080, each page its `VERSION`. The shell is the
/// container's first process and traps SIGTERM: the server keeps serving one more second
/// (long enough for the endpoint to leave the rules), then stops.
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
        image: setpoint.local/busybox:1
        command:
        - sh
        - -c
        - |
          mkdir -p /tmp/www && echo "$VERSION" > /tmp/www/index.html
          httpd -f -p 8080 -h /tmp/www &
          trap 'sleep 1; kill $!; exit 0' TERM
          wait
        ports:
        - {name: http, containerPort: 8080}
        env:
        - {name: VERSION, value: "1"}
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

/// The client: one request a round to the cluster IP and one to the Service's name, each
/// logged as `ip <page>` / `dns <page>`, or `… FAIL` when it got no page. The requests are
/// busybox `nc`'s: the static busybox's `wget` crashes (SIGSEGV) before it sends anything,
/// even to a pod's own address.
fn client(cluster_ip: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: client
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: client
    image: setpoint.local/busybox:1
    env:
    - {{name: TARGET, value: "{cluster_ip}"}}
    command:
    - sh
    - -c
    - |
      get() {{
        printf 'GET / HTTP/1.0\r\nHost: web\r\n\r\n' | nc -w 3 "$1" 80 | tail -n 1
      }}
      while true; do
        b=$(get "$TARGET"); case "$b" in [0-9]*) echo "ip $b";; *) echo "ip FAIL";; esac
        b=$(get web.default.svc.cluster.local); case "$b" in [0-9]*) echo "dns $b";; *) echo "dns FAIL";; esac
        sleep 0.1
      done
"#
    )
}

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

/// The pod subnet `setpoint up` printed for its private containerd, or `None` for a system
/// containerd (whose bridge serves no cluster DNS).
fn pod_subnet(setpoint: &Setpoint) -> Option<String> {
    let line = loop {
        let line = setpoint
            .output
            .recv_timeout(WAIT)
            .expect("setpoint up says what its local node runs pods on");
        if line.starts_with("The local node runs pods ") {
            break line;
        }
    };
    let subnet = line.split("(pod subnet ").nth(1)?.split(')').next()?;
    Some(subnet.to_string())
}

/// One HTTP/1.0 GET from this host: the body on a 200.
fn get(to: SocketAddr) -> Result<String, String> {
    let mut s =
        TcpStream::connect_timeout(&to, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    write!(s, "GET / HTTP/1.0\r\nHost: web\r\n\r\n").map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    // busybox httpd answers HTTP/1.1.
    if out.split_whitespace().nth(1) != Some("200") {
        return Err(format!("answer {:?}", out.lines().next()));
    }
    Ok(out
        .rsplit("\r\n\r\n")
        .next()
        .unwrap_or("")
        .trim()
        .to_string())
}

/// What the client logged so far: per target (`ip`, `dns`), the pages it got in order, with
/// `FAIL` for a request that got none.
struct Log {
    ip: Vec<String>,
    dns: Vec<String>,
}

impl Log {
    fn read(s: &Setpoint) -> Log {
        let out = s.kubectl(&["logs", "client"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let mut log = Log {
            ip: Vec::new(),
            dns: Vec::new(),
        };
        for line in lines(&text) {
            match line.split_once(' ') {
                Some(("ip", page)) => log.ip.push(page.to_string()),
                Some(("dns", page)) => log.dns.push(page.to_string()),
                _ => {}
            }
        }
        log
    }

    fn answered(list: &[String], page: &str) -> usize {
        list.iter().filter(|p| *p == page).count()
    }

    fn failed(list: &[String]) -> usize {
        Log::answered(list, "FAIL")
    }
}

#[test]
fn container_pods_reach_a_service_that_repoints() {
    if !support::kubectl_available() || !support::containerd_available() || !nft_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = Setpoint::start(
        &[
            "up",
            "--container-runtime",
            "cri",
            "--proxy-mode",
            "nftables",
        ],
        &data,
    );
    let Some(subnet) = pod_subnet(&s) else {
        eprintln!("skipping: a system containerd runs the pods; the node serves no DNS on it");
        s.stop();
        return;
    };
    let node_dir = data.canonicalize().unwrap().join("node");
    let table = setpoint_network::proxy::table_name(&node_dir.display().to_string());

    s.apply(DEPLOYMENT);
    eventually("three ready web pods", WAIT, || {
        ready_pods(&s, "app=web", 3)
    });
    let cluster_ip: Ipv4Addr = s
        .ok(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"])
        .trim()
        .parse()
        .unwrap();
    let service = SocketAddr::from((cluster_ip, 80));

    // From this host, through the cluster IP, to the container pods.
    let page = eventually("the cluster IP answers the host", WAIT, || {
        get(service).ok()
    });
    assert_eq!(page, "1");
    // Cluster-IP traffic from outside the pod subnet is masqueraded (kube-proxy's rule with
    // a cluster CIDR, here the node's pod subnet).
    let listing = String::from_utf8_lossy(
        &Command::new("nft")
            .args(["list", "table", "ip", &table])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(
        listing.contains(&format!("ip saddr != {subnet} jump mark-for-masquerade")),
        "{listing}"
    );

    // The client pod, looping on the cluster IP and on the name.
    s.apply(&client(&cluster_ip.to_string()));
    eventually("the client's first answers", WAIT, || {
        let log = Log::read(&s);
        (Log::answered(&log.ip, "1") >= 5 && Log::answered(&log.dns, "1") >= 5).then_some(())
    });
    let start = Log::read(&s);
    assert_eq!(
        (Log::failed(&start.ip), Log::failed(&start.dns)),
        (0, 0),
        "requests failed before any pod went away"
    );

    // Delete the web pods one by one, each time waiting for its replacement.
    let began = Instant::now();
    for _ in 0..3 {
        let pods = eventually("three ready web pods", WAIT, || {
            ready_pods(&s, "app=web", 3)
        });
        let victim = &pods[0];
        s.ok(&["delete", "pod", victim, "--wait=false"]);
        eventually("the replacement is ready", WAIT, || {
            ready_pods(&s, "app=web", 3).filter(|p| !p.contains(victim))
        });
    }

    // Roll to a new version.
    s.ok(&["set", "env", "deployment/web", "VERSION=2"]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=120s"]);
    let before = Log::read(&s);
    let log = eventually("the client's answers from the new version", WAIT, || {
        let log = Log::read(&s);
        (Log::answered(&log.ip, "2") >= 5
            && Log::answered(&log.dns, "2") >= 5
            && log.ip.len() > before.ip.len() + 5)
            .then_some(log)
    });
    let (ip_failed, dns_failed) = (Log::failed(&log.ip), Log::failed(&log.dns));
    eprintln!(
        "services repoint (container pods): {} requests to the cluster IP, {ip_failed} failed; \
         {} to web.default.svc.cluster.local, {dns_failed} failed; 3 pods deleted and 3 rolled \
         in {:?}",
        log.ip.len(),
        log.dns.len(),
        began.elapsed()
    );
    // Both versions answered, and the last answers are all the new one's.
    for list in [&log.ip, &log.dns] {
        assert!(Log::answered(list, "1") > 0 && Log::answered(list, "2") > 0);
        assert_eq!(list.last().map(String::as_str), Some("2"), "{list:?}");
    }
    // Six pods went away, each draining: at most one request in flight on each may fail.
    assert!(
        ip_failed + dns_failed <= 6,
        "{ip_failed} requests to the cluster IP and {dns_failed} by name failed"
    );

    s.ok(&["delete", "pod", "client"]);
    s.ok(&["delete", "deployment", "web"]);
    s.ok(&["delete", "svc", "web"]);
    eventually("the pods gone", WAIT, || {
        s.ok(&["get", "pods", "-o", "name"])
            .trim()
            .is_empty()
            .then_some(())
    });
    // Stopping removes the proxy's table, the pods' processes and the bridge.
    s.stop();
}
