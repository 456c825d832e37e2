//! End to end: where Prometheus finds the runtime's metrics. `setpoint controller-manager`
//! serves `/metrics` on its own HTTPS port to client certificates of the cluster CA (and
//! refuses anonymous callers, who may still read `/healthz`); `setpoint up` puts its in-process
//! controllers' metrics on the API server's `/metrics`, and its local node agent serves its own
//! on the node's port, to client certificates only.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod support;

use support::{eventually, Setpoint};

/// A `setpoint controller-manager` or `setpoint scheduler` serving on a free loopback port.
struct Component {
    child: Child,
    addr: String,
}

impl Component {
    fn start(component: &str, kubeconfig: &Path) -> Component {
        let mut child = Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args([
                component,
                // `up` leads the election; this one acts regardless, so it has reconciles
                // to count.
                "--leader-elect=false",
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                "0",
                "--kubeconfig",
            ])
            .arg(kubeconfig)
            .env("SETPOINT_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the component");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let mut c = Component {
            child,
            addr: String::new(),
        };
        c.addr = eventually(
            "the component prints where it serves",
            Duration::from_secs(30),
            || {
                rx.try_iter()
                    .find_map(|l| l.strip_prefix("Serving securely on ").map(str::to_owned))
            },
        );
        c
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A kubeconfig for `https://<addr>` that skips verifying the self-signed serving
/// certificate, with the admin client certificate of `data_dir`.
fn admin_kubeconfig(dir: &Path, addr: &str, data_dir: &Path) -> std::path::PathBuf {
    let pki = data_dir.join("pki");
    let user = format!(
        "  user:\n    client-certificate: {}\n    client-key: {}\n",
        pki.join("admin.crt").display(),
        pki.join("admin.key").display()
    );
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{addr}\n    \
         insecure-skip-tls-verify: true\nusers:\n- name: u\n{user}contexts:\n- name: x\n  \
         context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
    );
    let path = dir.join("admin.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn raw(s: &Setpoint, kubeconfig: &Path, path: &str) -> std::process::Output {
    s.kubectl_command(&["get", "--raw", path])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run kubectl")
}

/// Whether the exposition has a sample (not only the `# TYPE` line) of `name`.
fn has_sample(metrics: &str, name: &str) -> bool {
    metrics
        .lines()
        .any(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
}

#[test]
fn controller_manager_and_api_server_serve_the_runtime_metrics() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let up = Setpoint::start(&["up", "--no-node"], data.path());

    // `up`'s in-process controllers, on the API server's `/metrics`.
    let api = eventually(
        "the API server's /metrics has the controllers' reconciles",
        Duration::from_secs(30),
        || {
            let m = up.ok(&["get", "--raw", "/metrics"]);
            has_sample(&m, "controller_runtime_reconcile_total").then_some(m)
        },
    );
    assert!(has_sample(&api, "workqueue_depth"), "{api}");
    assert!(
        has_sample(&api, "rest_client_request_duration_seconds_bucket"),
        "{api}"
    );
    assert!(
        api.contains("leader_election_master_status{name=\"kube-controller-manager\"} 1"),
        "{api}"
    );

    // A standalone controller manager's own endpoint.
    let cm = Component::start("controller-manager", &up.kubeconfig);
    let dir = tempfile::tempdir().unwrap();
    let admin = admin_kubeconfig(dir.path(), &cm.addr, data.path());
    let own = eventually(
        "the controller manager's /metrics has its reconciles",
        Duration::from_secs(30),
        || {
            let out = raw(&up, &admin, "/metrics");
            let m = String::from_utf8_lossy(&out.stdout).into_owned();
            (out.status.success() && has_sample(&m, "controller_runtime_reconcile_total"))
                .then_some(m)
        },
    );
    assert!(has_sample(&own, "workqueue_depth"), "{own}");

    // kubectl asks for a user name when it has no credentials, so anonymous requests are
    // made here directly.
    let (code, body) = anonymous_get(&cm.addr, "/metrics");
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains(r#"forbidden: User \"system:anonymous\" cannot get path \"/metrics\""#),
        "{body}"
    );
    for health in ["/healthz", "/livez", "/readyz"] {
        assert_eq!(anonymous_get(&cm.addr, health), (200, "ok".to_string()));
    }

    // The scheduler's endpoint, on a port of its own: its API requests, and the same rules.
    let scheduler = Component::start("scheduler", &up.kubeconfig);
    let admin = admin_kubeconfig(dir.path(), &scheduler.addr, data.path());
    eventually(
        "the scheduler's /metrics has its API requests",
        Duration::from_secs(30),
        || {
            let out = raw(&up, &admin, "/metrics");
            let m = String::from_utf8_lossy(&out.stdout).into_owned();
            (out.status.success() && has_sample(&m, "rest_client_request_duration_seconds_bucket"))
                .then_some(())
        },
    );
    assert_eq!(anonymous_get(&scheduler.addr, "/metrics").0, 403);
    assert_eq!(
        anonymous_get(&scheduler.addr, "/healthz"),
        (200, "ok".to_string())
    );
}

#[test]
fn the_local_node_agent_serves_its_metrics_on_its_port() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let up = Setpoint::start(&["up"], data.path());
    // The port the node advertises, as the API server finds it for `kubectl logs`.
    let (node, port) = eventually(
        "the local node advertises its port",
        Duration::from_secs(30),
        || {
            let out = up.ok(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[0].metadata.name} {.items[0].status.daemonEndpoints.kubeletEndpoint.Port}",
            ]);
            let (name, port) = out.split_once(' ')?;
            let port: u16 = port.trim().parse().ok().filter(|p| *p != 0)?;
            Some((name.to_string(), port))
        },
    );
    let addr = format!("127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let admin = admin_kubeconfig(dir.path(), &addr, data.path());
    let metrics = eventually(
        "the node agent's /metrics has its pod work queue",
        Duration::from_secs(30),
        || {
            let out = raw(&up, &admin, "/metrics");
            let m = String::from_utf8_lossy(&out.stdout).into_owned();
            (out.status.success()
                && m.contains(&format!("workqueue_adds_total{{name=\"pods-{node}\"}}")))
            .then_some(m)
        },
    );
    assert!(has_sample(&metrics, "kubelet_running_pods"), "{metrics}");
    assert!(
        metrics.contains("kubelet_running_containers{container_state=\"running\"}"),
        "{metrics}"
    );
    assert!(
        has_sample(&metrics, "rest_client_request_duration_seconds_bucket"),
        "{metrics}"
    );
    // Without a client certificate the handshake fails: no response at all, not even a 403.
    assert_eq!(anonymous_get(&addr, "/metrics"), (0, String::new()));
}

/// Accepts any server certificate: the endpoint's is self-signed, and what is tested here is
/// what it answers a caller without a client certificate.
#[derive(Debug)]
struct AnyServerCertificate(rustls::crypto::WebPkiSupportedAlgorithms);

impl rustls::client::danger::ServerCertVerifier for AnyServerCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// `GET https://<addr><path>` without a client certificate: the status code and the body.
fn anonymous_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(AnyServerCertificate(
            provider.signature_verification_algorithms,
        )))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    // A server that requires a client certificate may close before the request is written.
    if write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return (0, String::new());
    }
    let mut response = Vec::new();
    // The server may close without a TLS close_notify; what arrived before is the response.
    let _ = tls.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response).into_owned();
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}
