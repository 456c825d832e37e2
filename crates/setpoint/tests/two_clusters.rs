//! End to end: two `setpoint up` clusters on one machine, each running the same Deployment of
//! real servers. Each cluster's node takes pod addresses from its own block, so all six pods
//! bind, become Ready and answer on six distinct addresses.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

mod support;

use support::{eventually, ready_pods, Setpoint};

const WEB: &str = r#"apiVersion: apps/v1
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
        image: python:3
        command: ["python3", "-m", "http.server", "8080", "--bind", "$(POD_IP)"]
        env:
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        readinessProbe:
          httpGet: {path: /, port: 8080}
          periodSeconds: 1
"#;

/// The status line of `GET /` from `ip:8080`.
fn status_line(ip: &str) -> String {
    let mut s = TcpStream::connect((ip, 8080)).expect("connect to the pod");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET / HTTP/1.0\r\nHost: {ip}\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines().next().unwrap_or("").to_string()
}

#[test]
fn two_clusters_run_the_same_deployment_on_distinct_addresses() {
    if !support::kubectl_available() {
        return;
    }
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Setpoint::up(a_dir.path());
    let b = Setpoint::up(b_dir.path());
    a.apply(WEB);
    b.apply(WEB);
    let mut ips = HashSet::new();
    for cluster in [&a, &b] {
        let pods = eventually("3 ready web pods", Duration::from_secs(90), || {
            ready_pods(cluster, "app=web", 3)
        });
        for pod in pods {
            let ip = cluster.ok(&["get", "pod", &pod, "-o", "jsonpath={.status.podIP}"]);
            assert!(ip.starts_with("127."), "{pod}: {ip}");
            assert!(ips.insert(ip.clone()), "{ip} is used twice");
            assert!(status_line(&ip).contains(" 200 "), "{pod} at {ip}");
        }
    }
    assert_eq!(ips.len(), 6);
}
