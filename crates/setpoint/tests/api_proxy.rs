//! The API server's proxy subresources end to end, with the real kubectl against `setpoint
//! up`: `kubectl proxy` plus plain HTTP to `services/web:80/proxy/…` gives the Service's page
//! (a GET with its query, a POST with its body, a redirect kept under the proxy path, a
//! WebSocket handshake answered 101 and a frame echoed); `pods/<pod>:8080/proxy/…` reaches the
//! pod; `nodes/<node>/proxy/metrics` reaches the node's agent; a Service without endpoints
//! answers 503 with upstream's message; `kubectl port-forward svc/web` reaches a pod the
//! Service selects.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use support::{eventually, ready_pods, Setpoint};

const WAIT: Duration = Duration::from_secs(90);

/// Two servers that answer with their pod's name and the path they were asked for, echo a
/// POST's body, redirect `/go` to `/there`, and echo the frames of a WebSocket (small
/// unfragmented ones, enough for the test) until it is closed.
const WEB: &str = r#"apiVersion: apps/v1
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
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: python:3
        command:
        - python3
        - -c
        - |
          import base64, hashlib, http.server, os
          class H(http.server.BaseHTTPRequestHandler):
              def answer(s, code, body, extra=()):
                  s.send_response(code)
                  for k, v in extra:
                      s.send_header(k, v)
                  s.send_header("Content-Length", str(len(body)))
                  s.end_headers()
                  s.wfile.write(body)
              def websocket(s):
                  key = s.headers["Sec-WebSocket-Key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
                  accept = base64.b64encode(hashlib.sha1(key.encode()).digest()).decode()
                  s.wfile.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                      "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n" % accept).encode())
                  s.close_connection = True
                  while True:
                      head = s.rfile.read(2)
                      if len(head) < 2 or head[0] & 15 == 8:
                          return
                      mask = s.rfile.read(4)
                      data = bytes(b ^ mask[i % 4] for i, b in enumerate(s.rfile.read(head[1] & 127)))
                      s.wfile.write(bytes([head[0], len(data)]) + data)
              def do_GET(s):
                  if s.headers.get("Upgrade", "").lower() == "websocket":
                      return s.websocket()
                  if s.path == "/go":
                      return s.answer(302, b"", [("Location", "/there")])
                  s.answer(200, ("hello from %s at %s" % (os.environ["POD_NAME"], s.path)).encode())
              def do_POST(s):
                  n = int(s.headers.get("Content-Length", "0"))
                  s.answer(200, b"got " + s.rfile.read(n))
          http.server.ThreadingHTTPServer((os.environ["POD_IP"], 8080), H).serve_forever()
        ports:
        - {name: http, containerPort: 8080}
        env:
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        - name: POD_NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
        readinessProbe:
          tcpSocket: {port: 8080}
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
---
apiVersion: v1
kind: Service
metadata:
  name: empty
spec:
  selector: {app: nothing}
  ports:
  - {port: 80}
"#;

/// A running kubectl child, killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts kubectl with `args` and waits for a stdout line `prefix<port>…`; returns the port.
fn start_kubectl(s: &Setpoint, args: &[&str], prefix: &str) -> (Running, u16) {
    let mut child = s
        .kubectl_command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start kubectl");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let child = Running(child);
    loop {
        let line = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("kubectl {args:?} printed no line starting {prefix:?}"));
        if let Some(rest) = line.strip_prefix(prefix) {
            let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
            return (child, port.parse().unwrap());
        }
    }
}

/// An HTTP/1.0 request to `127.0.0.1:<port>`: the status line, the headers and the body.
fn request(port: u16, method: &str, path: &str, body: &str) -> (String, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

/// A WebSocket handshake for `path` to `127.0.0.1:<port>`, then one masked text frame: the
/// answer's head and the frame that came back.
fn websocket_echo(port: u16, path: &str, text: &str) -> (String, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Key: {WEBSOCKET_KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    if !head.starts_with("HTTP/1.1 101 ") {
        return (head, vec![]);
    }
    // A client's frames are masked (RFC 6455 §5.3).
    let mask = [0x5a, 0x17, 0xc3, 0x08];
    let mut frame = vec![0x81, 0x80 | text.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    s.write_all(&frame).unwrap();
    let mut echoed = vec![0u8; 2 + text.len()];
    s.read_exact(&mut echoed).expect("the echoed frame");
    // A close frame (masked, empty) ends the backend's loop.
    let _ = s.write_all(&[0x88, 0x80, 0, 0, 0, 0]);
    (head, echoed)
}

/// The handshake's key, and the `Sec-WebSocket-Accept` a server derives from it (RFC 6455
/// §4.2.2: base64 of the SHA-1 of the key and the protocol's GUID).
const WEBSOCKET_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fn websocket_accept(key: &str) -> String {
    use base64::Engine;
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

#[test]
fn services_pods_and_nodes_are_reached_through_the_api_server() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::up(dir.path());
    s.apply(WEB);
    let pods = eventually("two ready web pods", WAIT, || ready_pods(&s, "app=web", 2));
    let (_proxy, port) = start_kubectl(
        &s,
        &["proxy", "--port=0", "--address=127.0.0.1"],
        "Starting to serve on 127.0.0.1:",
    );

    // The Service's page, from one of its pods, once its endpoints list them.
    let base = "/api/v1/namespaces/default/services/web:80/proxy";
    let (status, _, body) = eventually("the Service's page through kubectl proxy", WAIT, || {
        let answer = request(port, "GET", &format!("{base}/hello?x=1"), "");
        answer.0.contains(" 200 ").then_some(answer)
    });
    assert!(status.contains(" 200 "), "{status}");
    assert!(
        pods.iter()
            .any(|p| body == format!("hello from {p} at /hello?x=1")),
        "{body} (pods {pods:?})"
    );
    // The port's name works as its number does; a POST's body is relayed.
    let (status, _, body) = request(
        port,
        "POST",
        "/api/v1/namespaces/default/services/web:http/proxy/",
        "ping",
    );
    assert!(status.contains(" 200 "), "{status} {body}");
    assert_eq!(body, "got ping");
    // A redirect to the backend's own path stays under the proxy path.
    let (status, headers, _) = request(port, "GET", &format!("{base}/go"), "");
    assert!(status.contains(" 302 "), "{status}");
    assert!(
        headers
            .lines()
            .any(|h| h.eq_ignore_ascii_case(&format!("location: {base}/there"))),
        "{headers}"
    );

    // A WebSocket through the Service: the API server relays the handshake and splices the
    // connections once the pod switches protocols.
    let (head, echoed) = websocket_echo(port, &format!("{base}/ws"), "hello");
    assert!(
        head.starts_with("HTTP/1.1 101 Switching Protocols"),
        "{head}"
    );
    let accept = format!("sec-websocket-accept: {}", websocket_accept(WEBSOCKET_KEY));
    assert!(
        head.lines().any(|h| h.eq_ignore_ascii_case(&accept)),
        "{head}"
    );
    assert_eq!(
        echoed,
        b"\x81\x05hello",
        "{}",
        String::from_utf8_lossy(&echoed)
    );

    // A pod by name and port.
    let pod = &pods[0];
    let (status, _, body) = request(
        port,
        "GET",
        &format!("/api/v1/namespaces/default/pods/{pod}:8080/proxy/p"),
        "",
    );
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(body, format!("hello from {pod} at /p"));

    // The node's agent, with the API server's client certificate.
    let node = s.ok(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"]);
    let metrics = s.ok(&[
        "get",
        "--raw",
        &format!("/api/v1/nodes/{node}/proxy/metrics"),
    ]);
    assert!(metrics.contains("kubelet_running_pods"), "{metrics}");

    // No endpoints: upstream's 503.
    let err = s.fails(&[
        "get",
        "--raw",
        "/api/v1/namespaces/default/services/empty:80/proxy/",
    ]);
    assert!(
        err.contains("no endpoints available for service \\\"empty\\\"")
            || err.contains("no endpoints available for service \"empty\""),
        "{err}"
    );

    // kubectl port-forward svc/web picks a pod the Service selects, on its target port.
    let (_forward, local) = start_kubectl(
        &s,
        &["port-forward", "--address", "127.0.0.1", "svc/web", ":80"],
        "Forwarding from 127.0.0.1:",
    );
    let (status, _, body) = request(local, "GET", "/pf", "");
    assert!(status.contains(" 200 "), "{status}");
    assert!(
        body.starts_with("hello from web-") && body.ends_with(" at /pf"),
        "{body}"
    );
    s.stop();
}
