//! End to end with the real kubectl against `setpoint up`: admission webhooks served by this
//! test over HTTPS (a certificate of a CA made here, given to the server as `caBundle`) and
//! registered by `url`.
//!
//! - a validating webhook refuses a ConfigMap with a forbidden key, and kubectl prints its
//!   message; its warnings reach kubectl as `Warning:` lines;
//! - a mutating webhook adds a label, seen in `kubectl get -o yaml`;
//! - `matchConditions` and `objectSelector` skip what they should; the `skip-validation`
//!   label is honoured only for users the `authorizer` says may `skip-validation`
//!   ConfigMaps (alice, through `--as`), not for others (bob);
//! - with the webhook down, `failurePolicy: Fail` refuses with upstream's message and
//!   `Ignore` lets the write through;
//! - `--dry-run=server` calls the webhooks (all v1 webhooks declare `sideEffects` `None` or
//!   `NoneOnDryRun`) with `dryRun: true`, and stores nothing.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

mod support;

use support::{eventually, Setpoint};

const NS: &str = "hooked";

/// One call the webhook server answered: its path, the object's name and `dryRun`.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    path: String,
    name: String,
    dry_run: bool,
}

/// What the test's webhooks answer to one review on `path`.
fn answer(path: &str, request: &Value) -> Value {
    let uid = request["uid"].clone();
    let object = &request["object"];
    match path {
        "/validate" => {
            if object.pointer("/data/forbidden").is_some() {
                json!({"uid": uid, "allowed": false, "status": {
                    "code": 403, "message": "the key \"forbidden\" is not allowed here"}})
            } else {
                json!({"uid": uid, "allowed": true,
                       "warnings": ["checked by the test's validating webhook"]})
            }
        }
        "/mutate" => {
            let ops = if object.pointer("/metadata/labels").is_some() {
                json!([{"op": "add", "path": "/metadata/labels/webhook-mutated", "value": "yes"}])
            } else {
                json!([{"op": "add", "path": "/metadata/labels", "value": {"webhook-mutated": "yes"}}])
            };
            let patch = base64::engine::general_purpose::STANDARD.encode(ops.to_string());
            json!({"uid": uid, "allowed": true, "patchType": "JSONPatch", "patch": patch})
        }
        _ => json!({"uid": uid, "allowed": true}),
    }
}

/// Serves one HTTP/1.1 request over `tls` and records it.
fn serve_one(
    config: Arc<rustls::ServerConfig>,
    tcp: std::net::TcpStream,
    seen: &Mutex<Vec<Seen>>,
) -> std::io::Result<()> {
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
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
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let review: Value = serde_json::from_slice(&body).map_err(std::io::Error::other)?;
    let request = &review["request"];
    let name = request
        .pointer("/object/metadata/name")
        .or_else(|| request.pointer("/oldObject/metadata/name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    seen.lock().unwrap().push(Seen {
        path: path.clone(),
        name,
        dry_run: request["dryRun"].as_bool().unwrap_or(false),
    });
    let out = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                     "response": answer(&path, request)})
    .to_string();
    write!(
        tls,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{out}",
        out.len()
    )?;
    tls.flush()?;
    tls.conn.send_close_notify();
    let _ = tls.flush();
    Ok(())
}

/// Starts the webhook server on a free port; returns its port.
fn start_webhooks(cert: &str, key: &str, seen: Arc<Mutex<Vec<Seen>>>) -> u16 {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let (config, seen) = (config.clone(), seen.clone());
            std::thread::spawn(move || {
                if let Err(e) = serve_one(config, tcp, &seen) {
                    eprintln!("webhook server: {e}");
                }
            });
        }
    });
    port
}

/// A port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn configurations(ca: &str, port: u16, down: u16) -> String {
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    let common = "  admissionReviewVersions: [v1]\n  timeoutSeconds: 5\n  namespaceSelector:\n    matchLabels:\n      webhook-test: \"on\"\n  rules:\n  - operations: [CREATE, UPDATE]\n    apiGroups: [\"\"]\n    apiVersions: [v1]\n    resources: [configmaps]\n";
    format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: test-validating
webhooks:
- name: keys.validate.example.com
  sideEffects: None
  clientConfig:
    url: https://127.0.0.1:{port}/validate
    caBundle: {bundle}
  matchConditions:
  - name: not-skipped
    expression: \"!has(object.metadata.labels) || !('skip-validation' in object.metadata.labels) || !authorizer.requestResource.check('skip-validation').allowed()\"
{common}- name: fail.down.example.com
  sideEffects: None
  failurePolicy: Fail
  objectSelector:
    matchLabels:
      down: fail
  clientConfig:
    url: https://127.0.0.1:{down}/validate
    caBundle: {bundle}
{common}- name: ignore.down.example.com
  sideEffects: None
  failurePolicy: Ignore
  objectSelector:
    matchLabels:
      down: ignore
  clientConfig:
    url: https://127.0.0.1:{down}/validate
    caBundle: {bundle}
{common}---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: test-mutating
webhooks:
- name: labels.mutate.example.com
  sideEffects: NoneOnDryRun
  objectSelector:
    matchExpressions:
    - key: no-mutate
      operator: DoesNotExist
  clientConfig:
    url: https://127.0.0.1:{port}/mutate
    caBundle: {bundle}
{common}"
    )
}

/// Two users who may create ConfigMaps in the test's namespace, of whom only alice may also
/// `skip-validation` them.
fn writers() -> String {
    [
        support::role(NS, "writer", &[("", "configmaps", "create")]),
        support::role(NS, "skipper", &[("", "configmaps", "skip-validation")]),
        support::role_binding(NS, "writers", "writer", &["alice", "bob"]),
        support::role_binding(NS, "skippers", "skipper", &["alice"]),
    ]
    .join("---\n")
}

fn configmap(name: &str, labels: &[(&str, &str)], data: &[(&str, &str)]) -> String {
    let mut m =
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {NS}\n");
    if !labels.is_empty() {
        m.push_str("  labels:\n");
        for (k, v) in labels {
            m.push_str(&format!("    {k}: \"{v}\"\n"));
        }
    }
    m.push_str("data:\n");
    for (k, v) in data {
        m.push_str(&format!("  {k}: \"{v}\"\n"));
    }
    m
}

#[test]
fn admission_webhooks_validate_mutate_and_fail_as_configured() {
    if !support::kubectl_available() {
        return;
    }
    let (ca, cert, key) = setpoint_testing::webhook::certificates("127.0.0.1");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let port = start_webhooks(&cert, &key, seen.clone());
    let down = closed_port();
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::up(dir.path());
    s.ok(&["create", "namespace", NS]);
    s.ok(&["label", "namespace", NS, "webhook-test=on"]);
    s.apply(&configurations(&ca, port, down));
    let listed = s.ok(&["get", "validatingwebhookconfigurations"]);
    assert!(
        listed.contains("WEBHOOKS") && listed.contains("test-validating"),
        "{listed}"
    );

    let mut probes = 0;
    // The configurations reach the watch cache a moment after the write: wait until a
    // ConfigMap is mutated.
    eventually(
        "the mutating webhook is called",
        Duration::from_secs(20),
        || {
            probes += 1;
            let name = format!("probe-{probes}");
            let (ok, _, _) = s.create(&configmap(&name, &[], &[("a", "b")]), &[]);
            assert!(ok, "a plain ConfigMap is created");
            let labels = s.ok(&[
                "get",
                "configmap",
                &name,
                "-n",
                NS,
                "-o",
                "jsonpath={.metadata.labels}",
            ]);
            labels.contains("webhook-mutated").then_some(())
        },
    );

    // Refused by the validating webhook, with its message.
    let (ok, _, err) = s.create(&configmap("bad", &[], &[("forbidden", "x")]), &[]);
    assert!(!ok);
    assert!(
        err.contains("admission webhook \"keys.validate.example.com\" denied the request: the key \"forbidden\" is not allowed here"),
        "{err}"
    );

    // Allowed, mutated, and the validating webhook's warning printed by kubectl.
    let (ok, _, err) = s.create(&configmap("good", &[], &[("fine", "x")]), &[]);
    assert!(ok, "{err}");
    assert!(
        err.contains("Warning: checked by the test's validating webhook"),
        "{err}"
    );
    let yaml = s.ok(&["get", "configmap", "good", "-n", NS, "-o", "yaml"]);
    assert!(yaml.contains("webhook-mutated: \"yes\""), "{yaml}");

    // matchConditions: the skip label keeps the validating webhook out of it.
    let (ok, _, err) = s.create(
        &configmap(
            "skipped",
            &[("skip-validation", "1")],
            &[("forbidden", "x")],
        ),
        &[],
    );
    assert!(ok, "matchConditions skip the webhook: {err}");
    // The label is honoured for whoever the authorizer says may skip-validation: alice, once
    // her RoleBindings are seen (until then RBAC or the webhook refuses her); bob, bound by
    // the same writers binding, is still validated.
    s.apply(&writers());
    let mut tries = 0;
    eventually(
        "alice, who may skip-validation, skips the webhook",
        Duration::from_secs(10),
        || {
            tries += 1;
            let manifest = configmap(
                &format!("alice-{tries}"),
                &[("skip-validation", "1")],
                &[("forbidden", "x")],
            );
            s.create(&manifest, &["--as=alice"]).0.then_some(())
        },
    );
    let (ok, _, err) = s.create(
        &configmap("bob", &[("skip-validation", "1")], &[("forbidden", "x")]),
        &["--as=bob"],
    );
    assert!(
        !ok && err.contains("admission webhook \"keys.validate.example.com\" denied the request"),
        "bob may not skip-validation: {err}"
    );
    // objectSelector: no mutation for objects labelled no-mutate.
    let (ok, _, err) = s.create(&configmap("unmutated", &[("no-mutate", "1")], &[]), &[]);
    assert!(ok, "{err}");
    let labels = s.ok(&[
        "get",
        "configmap",
        "unmutated",
        "-n",
        NS,
        "-o",
        "jsonpath={.metadata.labels}",
    ]);
    assert!(!labels.contains("webhook-mutated"), "{labels}");
    {
        let seen = seen.lock().unwrap();
        assert!(
            !seen
                .iter()
                .any(|c| c.name == "skipped" && c.path == "/validate"),
            "{seen:?}"
        );
        assert!(
            !seen
                .iter()
                .any(|c| c.name == "unmutated" && c.path == "/mutate"),
            "{seen:?}"
        );
    }

    // Updates go through the webhooks too.
    let out = s.kubectl(&[
        "patch",
        "configmap",
        "good",
        "-n",
        NS,
        "--type=merge",
        "-p",
        r#"{"data":{"forbidden":"y"}}"#,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("denied the request"),
        "{err}"
    );

    // The webhook down: Fail refuses with upstream's message, Ignore lets the write through.
    let (ok, _, err) = s.create(&configmap("down-fail", &[("down", "fail")], &[]), &[]);
    assert!(!ok);
    let expected = format!(
        "Internal error occurred: failed calling webhook \"fail.down.example.com\": failed to call webhook: Post \"https://127.0.0.1:{down}/validate?timeout=5s\": dial tcp 127.0.0.1:{down}: connect: connection refused"
    );
    assert!(err.contains(&expected), "{err}");
    let (ok, _, err) = s.create(&configmap("down-ignore", &[("down", "ignore")], &[]), &[]);
    assert!(ok, "failurePolicy Ignore lets it through: {err}");

    // --dry-run=server: the webhooks are asked, told it is a dry run, and nothing is stored.
    let before = seen.lock().unwrap().len();
    let (ok, out, err) = s.create(
        &configmap("dry", &[], &[("a", "b")]),
        &["--dry-run=server", "-o", "yaml"],
    );
    assert!(ok, "{err}");
    assert!(out.contains("webhook-mutated: \"yes\""), "{out}");
    let calls: Vec<Seen> = seen.lock().unwrap()[before..].to_vec();
    assert!(
        calls
            .iter()
            .any(|c| c.name == "dry" && c.path == "/mutate" && c.dry_run),
        "{calls:?}"
    );
    assert!(
        calls
            .iter()
            .any(|c| c.name == "dry" && c.path == "/validate" && c.dry_run),
        "{calls:?}"
    );
    let gone = s.kubectl(&["get", "configmap", "dry", "-n", NS]);
    assert!(!gone.status.success(), "a dry run stores nothing");
    let (ok, _, err) = s.create(
        &configmap("dry-bad", &[], &[("forbidden", "x")]),
        &["--dry-run=server"],
    );
    assert!(!ok && err.contains("denied the request"), "{err}");

    // Deleting the configurations turns the webhooks off.
    s.ok(&[
        "delete",
        "validatingwebhookconfiguration",
        "test-validating",
    ]);
    eventually(
        "the validating webhook is gone",
        Duration::from_secs(20),
        || {
            probes += 1;
            let name = format!("after-{probes}");
            let (ok, _, _) = s.create(&configmap(&name, &[], &[("forbidden", "x")]), &[]);
            ok.then_some(())
        },
    );
    s.stop();
}
