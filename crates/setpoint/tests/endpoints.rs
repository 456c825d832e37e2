//! End to end with the real kubectl against `setpoint up`: a Service's EndpointSlices and
//! Endpoints. A Deployment of three servers and a Service naming their port `http` get
//! slices and Endpoints listing the ready pods' addresses on the resolved port; a pod whose
//! readiness probe fails is listed as not ready; scaling down shrinks the endpoints;
//! `kubectl describe svc` shows them; `kubectl get endpoints kubernetes` shows the API
//! server.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::time::Duration;

mod support;

use support::{eventually, lines, ready_pods, Setpoint};

const WAIT: Duration = Duration::from_secs(60);

/// Three servers on their pod's address, port 8080 named `http`, ready once they answer.
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
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: python:3
        command: ["python3", "-m", "http.server", "8080", "--bind", "$(POD_IP)"]
        ports:
        - {name: http, containerPort: 8080}
        env:
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        readinessProbe:
          httpGet: {path: /, port: 8080}
          periodSeconds: 1
"#;

/// A pod the Service selects whose readiness probe never passes (the path is missing).
const UNREADY: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: unready
  labels: {app: web}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: python:3
    command: ["python3", "-m", "http.server", "8080", "--bind", "$(POD_IP)"]
    ports:
    - {name: http, containerPort: 8080}
    env:
    - name: POD_IP
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    readinessProbe:
      httpGet: {path: /missing, port: 8080}
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
"#;

/// The sorted words of `kubectl get <what> -o jsonpath=<path>`.
fn words(s: &Setpoint, what: &[&str], path: &str) -> Vec<String> {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let p = format!("jsonpath={path}");
    args.extend_from_slice(&["-o", &p]);
    let mut out: Vec<String> = s.ok(&args).split_whitespace().map(str::to_string).collect();
    out.sort();
    out
}

/// The sorted pod IPs of the pods named.
fn ips_of(s: &Setpoint, pods: &[String]) -> Vec<String> {
    let mut ips: Vec<String> = pods
        .iter()
        .map(|p| {
            s.ok(&["get", "pod", p, "-o", "jsonpath={.status.podIP}"])
                .trim()
                .to_string()
        })
        .collect();
    ips.sort();
    ips
}

const SLICE_READY: &str =
    r#"{range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]}{"\n"}{end}"#;
const SLICE_NOT_READY: &str =
    r#"{range .items[*].endpoints[?(@.conditions.ready==false)]}{.addresses[0]}{"\n"}{end}"#;

#[test]
fn endpoints_follow_the_ready_pods_a_service_selects() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&dir.path().join("data"));

    // The API server is the kubernetes Service's endpoint.
    let port = s.url.rsplit(':').next().unwrap().to_string();
    eventually("the kubernetes endpoints", WAIT, || {
        let out = s.kubectl(&["get", "endpoints", "kubernetes"]);
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("127.0.0.1:{port}"))
            .then_some(())
    });
    let table = s.ok(&["get", "endpoints", "kubernetes"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert_eq!(
        lines(&table)[0].split_whitespace().collect::<Vec<_>>(),
        ["NAME", "ENDPOINTS", "AGE"]
    );
    assert_eq!(
        words(
            &s,
            &["endpointslice", "kubernetes"],
            "{.endpoints[*].addresses[*]}"
        ),
        ["127.0.0.1"]
    );

    s.apply(DEPLOYMENT);
    s.apply(SERVICE);
    s.apply(UNREADY);
    let ready = eventually("three ready web pods", WAIT, || {
        ready_pods(&s, "app=web", 3)
    });
    let ready_ips = ips_of(&s, &ready);
    let unready_ip = eventually("the unready pod's address", WAIT, || {
        let ip = s.ok(&["get", "pod", "unready", "-o", "jsonpath={.status.podIP}"]);
        (!ip.trim().is_empty()).then(|| ip.trim().to_string())
    });

    let selector = "kubernetes.io/service-name=web";
    eventually("slices of the ready pods", WAIT, || {
        let ready = words(&s, &["endpointslices", "-l", selector], SLICE_READY);
        let not_ready = words(&s, &["endpointslices", "-l", selector], SLICE_NOT_READY);
        (ready == ready_ips && not_ready == [unready_ip.clone()]).then_some(())
    });
    let table = s.ok(&["get", "endpointslices", "-l", selector]);
    let rows = lines(&table);
    assert_eq!(
        rows[0].split_whitespace().collect::<Vec<_>>(),
        ["NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"],
        "{table}"
    );
    let cells: Vec<&str> = rows[1].split_whitespace().collect();
    assert!(cells[0].starts_with("web-"), "{table}");
    assert_eq!(cells[1..3], ["IPv4", "8080"], "{table}");
    assert_eq!(
        words(
            &s,
            &["endpointslices", "-l", selector],
            "{.items[*].metadata.labels.endpointslice\\.kubernetes\\.io/managed-by}"
        ),
        ["endpointslice-controller.k8s.io"]
    );

    // The Endpoints: ready pods under addresses, the other under notReadyAddresses.
    eventually("the Endpoints of the ready pods", WAIT, || {
        let ready = words(&s, &["endpoints", "web"], "{.subsets[*].addresses[*].ip}");
        let not_ready = words(
            &s,
            &["endpoints", "web"],
            "{.subsets[*].notReadyAddresses[*].ip}",
        );
        (ready == ready_ips && not_ready == [unready_ip.clone()]).then_some(())
    });
    let ports = words(&s, &["endpoints", "web"], "{.subsets[*].ports[*].port}");
    assert_eq!(ports, ["8080"]);
    let described = s.ok(&["describe", "svc", "web"]);
    let line = described
        .lines()
        .find(|l| l.starts_with("Endpoints:"))
        .unwrap_or_else(|| panic!("no Endpoints line in\n{described}"));
    assert!(
        line.contains(&format!("{}:8080", ready_ips[0])),
        "{described}"
    );

    // Scaled down to one: one ready endpoint left.
    s.ok(&["scale", "deployment", "web", "--replicas=1"]);
    let one = eventually("one ready web pod", WAIT, || {
        let pods = ready_pods(&s, "app=web", 1)?;
        // The other two are gone, not just terminating.
        let all = s.ok(&["get", "pods", "-l", "app=web", "-o", "name"]);
        (lines(&all).len() == 2).then_some(pods)
    });
    let one_ip = ips_of(&s, &one);
    eventually("the endpoints shrunk to one", WAIT, || {
        let slices = words(&s, &["endpointslices", "-l", selector], SLICE_READY);
        let endpoints = words(&s, &["endpoints", "web"], "{.subsets[*].addresses[*].ip}");
        (slices == one_ip && endpoints == one_ip).then_some(())
    });

    s.stop();
}

/// Starts one `setpoint server` process on the etcd at `etcd_url`.
fn server_on(etcd_url: &str, data_dir: &std::path::Path) -> Setpoint {
    Setpoint::start(
        &["server", "--store", "etcd", "--etcd-endpoints", etcd_url],
        data_dir,
    )
}

/// The `kubernetes` Endpoints' `ip:port`s as kubectl shows them through `via`.
fn kubernetes_endpoints(via: &Setpoint) -> Vec<String> {
    let out = via.kubectl(&[
        "get",
        "endpoints",
        "kubernetes",
        "-o",
        r#"jsonpath={range .subsets[*]}{range .addresses[*]}{.ip}{"\n"}{end}{.ports[0].port}{"\n"}{end}"#,
    ]);
    if !out.status.success() {
        return Vec::new();
    }
    // Each subset: its addresses, then its port.
    let mut result = Vec::new();
    let mut pending = Vec::new();
    for word in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if word.contains('.') {
            pending.push(word.to_string());
        } else {
            result.extend(pending.drain(..).map(|ip| format!("{ip}:{word}")));
        }
    }
    result.sort();
    result
}

#[test]
fn several_api_servers_on_etcd_list_each_other_while_they_run() {
    if !support::kubectl_available() {
        return;
    }
    let Some(etcd) = support::Etcd::start() else {
        return;
    };
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let a = server_on(&etcd.url, dir_a.path());
    support::share_pki(dir_a.path(), dir_b.path());
    let b = server_on(&etcd.url, dir_b.path());
    let address = |s: &Setpoint| s.url.trim_start_matches("https://").to_string();
    let mut both = vec![address(&a), address(&b)];
    both.sort();
    eventually("both servers in the kubernetes endpoints", WAIT, || {
        (kubernetes_endpoints(&a) == both).then_some(())
    });

    // A stopped server drops out once its record expires.
    b.stop();
    eventually("the stopped server gone from the endpoints", WAIT, || {
        (kubernetes_endpoints(&a) == [address(&a)]).then_some(())
    });
    a.stop();
}
