//! End to end with the real kubectl against `setpoint server`: the aggregation layer.
//!
//! An extension API server runs in this test over HTTPS (a certificate for
//! `wardle-api.wardle.svc` from a CA made here, given as the APIService's `caBundle`), behind
//! a selector-less Service whose Endpoints name it. It only answers clients with a certificate
//! of the front-proxy CA the cluster publishes in `kube-system/extension-apiserver-authentication`.
//!
//! - Setpoint's own group/versions are local APIServices, `Available` with reason `Local`;
//! - the APIService becomes `Available` (`Passed`), `kubectl get --raw /apis/<group>/<version>`
//!   and deeper paths reach the test server, which sees the caller in `X-Remote-User` and
//!   `X-Remote-Group` from the `front-proxy-client` certificate;
//! - `kubectl api-resources` lists the extension server's resources;
//! - an upgrade request is relayed: once the extension server answers 101 the connections are
//!   spliced both ways (the test server echoes), and a refusal comes back as it was;
//! - `/apis` lists the group where its `groupPriorityMinimum` puts it;
//! - an invalid APIService is refused with upstream's message;
//! - pointing `v1beta1.metrics.k8s.io` at the Service replaces the built-in metrics API;
//! - with the test server down, the APIService turns `Available=False`
//!   (`FailedDiscoveryCheck`) and its paths answer 503.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

mod support;

use support::{eventually, Setpoint};

const GROUP: &str = "wardle.example.com";
const VERSION: &str = "v1alpha1";
/// A loopback address outside `127.0.0.0/16`, which endpoints may name (the process
/// runtime's pod addresses are such); the port is the kernel's choice.
const ADDRESS: &str = "127.86.0.1";

/// What the extension server saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    user: String,
    groups: Vec<String>,
    /// The common name of the verified client certificate.
    client: String,
    /// The protocol the request asked to upgrade to.
    upgrade: String,
}

fn resource_list() -> Value {
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{VERSION}"),
        "resources": [
            {"name": "flunders", "singularName": "flunder", "namespaced": true, "kind": "Flunder",
             "verbs": ["get", "list"], "shortNames": ["fl"]},
            {"name": "flunders/status", "singularName": "", "namespaced": true, "kind": "Flunder",
             "verbs": ["get"]}]})
}

/// Serves one request over TLS (client certificates of the front-proxy CA required) and
/// records it.
fn serve_one(
    config: Arc<rustls::ServerConfig>,
    tcp: std::net::TcpStream,
    seen: &Mutex<Vec<Seen>>,
) -> std::io::Result<()> {
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    tcp.set_nonblocking(false)?;
    let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut reader = BufReader::new(&mut tls);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .split('?')
        .next()
        .unwrap_or("")
        .to_string();
    let (mut user, mut groups, mut upgrade) = (String::new(), vec![], String::new());
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("x-remote-user") {
                user = v.trim().to_string();
            }
            if k.eq_ignore_ascii_case("x-remote-group") {
                groups.push(v.trim().to_string());
            }
            if k.eq_ignore_ascii_case("upgrade") {
                upgrade = v.trim().to_string();
            }
        }
    }
    let client = reader
        .get_ref()
        .conn
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|der| {
            let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
            let cn = cert.subject().iter_common_name().next()?;
            cn.as_str().ok().map(String::from)
        })
        .unwrap_or_default();
    seen.lock().unwrap().push(Seen {
        path: path.clone(),
        user,
        groups,
        client,
        upgrade: upgrade.clone(),
    });
    let base = format!("/apis/{GROUP}/{VERSION}");
    if upgrade == ECHO_PROTOCOL && path.ends_with("/echo") {
        return echo(&mut reader);
    }
    let (status, body) = if path == base {
        ("200 OK", resource_list())
    } else if path == "/apis/metrics.k8s.io/v1beta1" {
        (
            "200 OK",
            json!({"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": "metrics.k8s.io/v1beta1", "resources": [
                {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics",
                 "verbs": ["get", "list"]}]}),
        )
    } else if path == "/apis/metrics.k8s.io/v1beta1/nodes" {
        (
            "200 OK",
            json!({"kind": "NodeMetricsList", "apiVersion": "metrics.k8s.io/v1beta1",
            "metadata": {}, "items": [{"metadata": {"name": "from-the-extension-server"},
            "timestamp": "2026-01-01T00:00:00Z", "window": "15s",
            "usage": {"cpu": "1m", "memory": "1Ki"}}]}),
        )
    } else if path == format!("{base}/namespaces/default/flunders") {
        (
            "200 OK",
            json!({"kind": "FlunderList", "apiVersion": format!("{GROUP}/{VERSION}"),
            "metadata": {}, "items": [{"kind": "Flunder", "metadata": {"name": "first", "namespace": "default"}}]}),
        )
    } else {
        (
            "404 Not Found",
            json!({"kind": "Status", "status": "Failure", "code": 404}),
        )
    };
    let out = body.to_string();
    write!(
        tls,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{out}",
        out.len()
    )?;
    tls.flush()?;
    tls.conn.send_close_notify();
    let _ = tls.flush();
    Ok(())
}

/// Starts the extension server on [`ADDRESS`]; returns its port. It stops listening once
/// `stop` turns true.
fn start_extension_server(
    cert: &str,
    key: &str,
    front_proxy_ca: &str,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
) -> u16 {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(front_proxy_ca.as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind((ADDRESS, 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        // Polls so that the listener is closed (connections refused) once stopped.
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((tcp, _)) => {
                    let (config, seen) = (config.clone(), seen.clone());
                    std::thread::spawn(move || {
                        if let Err(e) = serve_one(config, tcp, &seen) {
                            eprintln!("extension server: {e}");
                        }
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    });
    port
}

fn manifests(ca: &str, port: u16) -> String {
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    format!(
        "apiVersion: v1
kind: Namespace
metadata:
  name: wardle
---
apiVersion: v1
kind: Service
metadata:
  name: wardle-api
  namespace: wardle
spec:
  ports:
  - name: https
    port: 443
    targetPort: {port}
---
apiVersion: v1
kind: Endpoints
metadata:
  name: wardle-api
  namespace: wardle
subsets:
- addresses:
  - ip: {ADDRESS}
  ports:
  - name: https
    port: {port}
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: {VERSION}.{GROUP}
spec:
  group: {GROUP}
  version: {VERSION}
  groupPriorityMinimum: 1000
  versionPriority: 15
  caBundle: {bundle}
  service:
    namespace: wardle
    name: wardle-api
    port: 443
"
    )
}

/// The most bytes the test server echoes on an upgraded connection.
const MAX_ECHO: usize = 64 * 1024;
/// The protocol the test server switches to.
const ECHO_PROTOCOL: &str = "setpoint-echo";

/// Answers an upgrade to [`ECHO_PROTOCOL`] with 101 and echoes what comes until the client
/// closes (at most [`MAX_ECHO`] bytes).
fn echo<S: Read + Write>(reader: &mut BufReader<S>) -> std::io::Result<()> {
    write!(
        reader.get_mut(),
        "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: {ECHO_PROTOCOL}\r\n\r\n"
    )?;
    reader.get_mut().flush()?;
    let (mut buf, mut total) = ([0u8; 1024], 0);
    while total < MAX_ECHO {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n;
        reader.get_mut().write_all(&buf[..n])?;
        reader.get_mut().flush()?;
    }
    Ok(())
}

/// Sends `GET path` asking to upgrade to [`ECHO_PROTOCOL`] to the cluster as its admin (the
/// kubeconfig's client certificate), and once switched, `payload`: the response head, and what
/// came back of the payload.
fn upgrade(s: &Setpoint, path: &str, payload: &[u8]) -> (String, Vec<u8>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let pem = |field: &str| {
        let b64 = s.ok(&[
            "config",
            "view",
            "--raw",
            "-o",
            &format!("jsonpath={{{field}}}"),
        ]);
        base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .unwrap()
    };
    let ca = pem(".clusters[0].cluster.certificate-authority-data");
    let cert = pem(".users[0].user.client-certificate-data");
    let key = pem(".users[0].user.client-key-data");
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca) {
        roots.add(c.unwrap()).unwrap();
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert)
        .map(Result::unwrap)
        .collect();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, PrivateKeyDer::from_pem_slice(&key).unwrap())
        .unwrap();
    let address = s.url.trim_start_matches("https://").to_string();
    let (host, _) = address.rsplit_once(':').unwrap();
    let name = ServerName::try_from(host.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = std::net::TcpStream::connect(&address).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: Upgrade\r\nUpgrade: {ECHO_PROTOCOL}\r\n\r\n"
    )
    .unwrap();
    tls.flush().unwrap();
    // The head, byte by byte so that nothing after it is consumed.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        tls.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut echoed = vec![0u8; payload.len()];
    if head.starts_with("HTTP/1.1 101") && !payload.is_empty() {
        tls.write_all(payload).unwrap();
        tls.flush().unwrap();
        tls.read_exact(&mut echoed).unwrap();
    }
    tls.conn.send_close_notify();
    let _ = tls.flush();
    (head, echoed)
}

/// The `Available` condition's status and reason.
fn available(s: &Setpoint, name: &str) -> (String, String) {
    let out = s.ok(&[
        "get",
        "apiservice",
        name,
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Available")].status} {.status.conditions[?(@.type=="Available")].reason}"#,
    ]);
    let mut words = out.split_whitespace().map(String::from);
    (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    )
}

#[test]
fn an_api_service_proxies_its_group_to_an_extension_server() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["server"], dir.path());
    let within = Duration::from_secs(20);

    // Setpoint's own groups are local APIServices.
    let local = eventually("the local APIServices are available", within, || {
        let out = s.ok(&["get", "apiservices"]);
        let ok = ["v1.", "v1.apps", "v1beta1.metrics.k8s.io"]
            .iter()
            .all(|n| {
                out.lines().any(|l| {
                    l.starts_with(&format!("{n} ")) && l.contains("Local") && l.contains("True")
                })
            });
        ok.then_some(out)
    });
    let header: Vec<&str> = local.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "SERVICE", "AVAILABLE", "AGE"]);
    assert_eq!(available(&s, "v1.apps"), ("True".into(), "Local".into()));

    // The front-proxy CA and the request-header settings are published.
    let cm: Value = serde_json::from_str(&s.ok(&[
        "get",
        "configmap",
        "-n",
        "kube-system",
        "extension-apiserver-authentication",
        "-o",
        "json",
    ]))
    .unwrap();
    let data = &cm["data"];
    assert_eq!(
        data["requestheader-allowed-names"],
        "[\"front-proxy-client\"]"
    );
    assert_eq!(
        data["requestheader-username-headers"],
        "[\"X-Remote-User\"]"
    );
    assert!(data["client-ca-file"]
        .as_str()
        .unwrap()
        .contains("BEGIN CERTIFICATE"));
    let front_proxy_ca = data["requestheader-client-ca-file"].as_str().unwrap();

    let (ca, cert, key) = setpoint_testing::webhook::certificates("wardle-api.wardle.svc");
    let seen = Arc::new(Mutex::new(vec![]));
    let stop = Arc::new(AtomicBool::new(false));
    let port = start_extension_server(&cert, &key, front_proxy_ca, seen.clone(), stop.clone());
    s.apply(&manifests(&ca, port));
    let name = format!("{VERSION}.{GROUP}");
    eventually("the APIService is available", within, || {
        (available(&s, &name) == ("True".into(), "Passed".into())).then_some(())
    });
    let row = s.ok(&["get", "apiservice", &name, "--no-headers"]);
    assert!(
        row.contains("wardle/wardle-api") && row.contains("True"),
        "{row}"
    );

    // Its group/version and what lies under it are relayed, with the caller's identity.
    let list: Value =
        serde_json::from_str(&s.ok(&["get", "--raw", &format!("/apis/{GROUP}/{VERSION}")]))
            .unwrap();
    assert_eq!(list["resources"][0]["name"], "flunders");
    let flunders = s.ok(&[
        "get",
        "--raw",
        &format!("/apis/{GROUP}/{VERSION}/namespaces/default/flunders"),
    ]);
    assert!(flunders.contains("\"first\""), "{flunders}");
    let relayed = seen
        .lock()
        .unwrap()
        .iter()
        .find(|r| r.path.ends_with("/flunders"))
        .cloned()
        .expect("the extension server saw the list");
    assert_eq!(relayed.user, "admin");
    assert!(
        relayed.groups.contains(&"system:masters".to_string()),
        "{relayed:?}"
    );
    assert_eq!(relayed.client, "front-proxy-client");
    // The availability checks ask as the aggregator.
    assert!(seen.lock().unwrap().iter().any(
        |r| r.user == "system:kube-aggregator" && r.path == format!("/apis/{GROUP}/{VERSION}")
    ));

    // Discovery lists the group and its resources.
    let groups = s.ok(&["get", "--raw", "/apis"]);
    assert!(
        groups.contains(&format!("\"{GROUP}/{VERSION}\"")),
        "{groups}"
    );
    let resources = s.ok(&["api-resources", "--api-group", GROUP]);
    let row = resources
        .lines()
        .find(|l| l.starts_with("flunders"))
        .unwrap_or_else(|| panic!("api-resources lists no flunders:\n{resources}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        [
            "flunders",
            "fl",
            &format!("{GROUP}/{VERSION}"),
            "true",
            "Flunder"
        ]
    );

    // An upgrade is relayed with the caller's identity, and once the extension server
    // switches protocols, bytes flow both ways through the API server.
    let echo_path = format!("/apis/{GROUP}/{VERSION}/namespaces/default/flunders/first/echo");
    let (head, echoed) = upgrade(&s, &echo_path, b"ping through the aggregator");
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains(&format!("upgrade: {ECHO_PROTOCOL}")),
        "{head}"
    );
    assert_eq!(echoed, b"ping through the aggregator");
    let relayed = seen
        .lock()
        .unwrap()
        .iter()
        .find(|r| r.path == echo_path)
        .cloned()
        .expect("the extension server saw the upgrade");
    assert_eq!(
        (relayed.upgrade.as_str(), relayed.user.as_str()),
        (ECHO_PROTOCOL, "admin")
    );
    // An extension server that does not switch is answered as it answered.
    let (head, _) = upgrade(&s, &format!("/apis/{GROUP}/{VERSION}/nowhere"), b"");
    assert!(head.starts_with("HTTP/1.1 404 "), "{head}");

    // /apis lists the group by its groupPriorityMinimum (1000): after the built-in groups
    // (16200 and up), before metrics.k8s.io (100).
    let names: Vec<String> = serde_json::from_str::<Value>(&groups).unwrap()["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap().to_string())
        .collect();
    let at = |name: &str| names.iter().position(|n| n == name).unwrap();
    assert_eq!(names[0], "apiregistration.k8s.io", "{names:?}");
    assert!(
        at("discovery.k8s.io") < at(GROUP) && at(GROUP) < at("metrics.k8s.io"),
        "{names:?}"
    );

    // Validation speaks upstream's words.
    let bad = "apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1.wrong.example.com
spec:
  group: example.com
  version: v1
  groupPriorityMinimum: 100
  versionPriority: 0
";
    let file = s.home().join("bad-apiservice.yaml");
    std::fs::write(&file, bad).unwrap();
    let err = s.fails(&["create", "-f", file.to_str().unwrap()]);
    assert!(
        err.contains("metadata.name: Invalid value: \"v1.wrong.example.com\": must be `spec.version+\".\"+spec.group`: \"v1.example.com\"")
            && err.contains("spec.versionPriority: Invalid value: 0: must be positive and less than 1000"),
        "{err}"
    );

    // Pointing the built-in metrics API's APIService at a Service replaces it, as installing
    // metrics-server does.
    let bundle = base64::engine::general_purpose::STANDARD.encode(&ca);
    s.apply(&format!(
        "apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1beta1.metrics.k8s.io
spec:
  group: metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  caBundle: {bundle}
  service:
    namespace: wardle
    name: wardle-api
"
    ));
    eventually(
        "the metrics API is served by the extension server",
        within,
        || {
            let nodes = s.ok(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes"]);
            nodes.contains("from-the-extension-server").then_some(())
        },
    );
    assert_eq!(
        available(&s, "v1beta1.metrics.k8s.io"),
        ("True".into(), "Passed".into())
    );

    // With the server down, the APIService is unavailable and its paths answer 503.
    stop.store(true, Ordering::SeqCst);
    eventually("the APIService turns unavailable", within, || {
        (available(&s, &name) == ("False".into(), "FailedDiscoveryCheck".into())).then_some(())
    });
    let message = s.ok(&[
        "get",
        "apiservice",
        &name,
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Available")].message}"#,
    ]);
    assert!(
        message.starts_with(&format!(
            "failing or missing response from https://{ADDRESS}:{port}/apis/{GROUP}/{VERSION}"
        )) && message.contains("connection refused"),
        "{message}"
    );
    let err = s.fails(&["get", "--raw", &format!("/apis/{GROUP}/{VERSION}")]);
    assert!(err.contains("(ServiceUnavailable)"), "{err}");
    s.stop();
}
