//! `kubectl port-forward` and `kubectl exec` over SPDY end to end, with the real kubectl
//! through the API server's proxy to the node agent:
//!
//! - a process pod (an HTTP server on its own address) serves a request through
//!   `kubectl port-forward pod/…` and `deployment/…`, with kubectl's default (SPDY tunneled
//!   over WebSocket) and with `KUBECTL_PORT_FORWARD_WEBSOCKETS=false` (plain SPDY); a forwarded
//!   port nobody listens on gives kubectl the kubelet's error (kubectl then exits, as it does
//!   against a kubelet) and the next port-forward works; the Python client's `portforward()` (WebSocket channels) reads the same
//!   page; `kubectl exec` with `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false` runs a command, passes
//!   a non-zero exit code on and pipes stdin;
//! - a CRI pod (busybox `httpd` in containerd) serves a request through both kinds of
//!   port-forward, the connection made inside the pod's network namespace, and `kubectl exec`
//!   over SPDY runs a command in its container. Skipped (saying
//!   why) without containerd unless `SETPOINT_REQUIRE_CONTAINERD=1`.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use support::{eventually, lines, Setpoint};

const DEADLINE: Duration = Duration::from_secs(120);

/// A process pod serving HTTP on its own address, port 8080.
const PROCESS_WEB: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
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
          tcpSocket: {port: 8080}
          periodSeconds: 1
"#;

/// A running `kubectl port-forward`, and the local ports it listens on, in the order of its
/// arguments.
struct Forward {
    child: Child,
    ports: Vec<u16>,
    stderr: mpsc::Receiver<String>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `kubectl port-forward <target> :<port>…` (local ports chosen by kubectl) and waits
/// for its `Forwarding from 127.0.0.1:<local> -> <port>` lines.
fn port_forward(s: &Setpoint, target: &str, ports: &[u16], websockets: bool) -> Forward {
    let specs: Vec<String> = ports.iter().map(|p| format!(":{p}")).collect();
    let mut args = vec!["port-forward", "--address", "127.0.0.1", target];
    args.extend(specs.iter().map(String::as_str));
    let mut cmd = s.kubectl_command(&args);
    if !websockets {
        cmd.env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false");
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kubectl port-forward");
    let (out_tx, out_rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = out_tx.send(line);
        }
    });
    let (err_tx, err_rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = err_tx.send(line);
        }
    });
    let mut local = vec![0u16; ports.len()];
    while local.contains(&0) {
        let line = out_rx.recv_timeout(DEADLINE).unwrap_or_else(|_| {
            let err: Vec<String> = err_rx.try_iter().collect();
            panic!("kubectl port-forward {target} printed no Forwarding line: {err:?}")
        });
        // "Forwarding from 127.0.0.1:41234 -> 8080"
        if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
            let mut parts = rest.split(" -> ");
            let l: u16 = parts.next().unwrap().parse().unwrap();
            let remote: u16 = parts.next().unwrap().trim().parse().unwrap();
            let i = ports.iter().position(|p| *p == remote).unwrap();
            local[i] = l;
        }
    }
    Forward {
        child,
        ports: local,
        stderr: err_rx,
    }
}

/// The status line and body of an HTTP/1.0 GET of `/` through `127.0.0.1:<port>`.
fn get(port: u16) -> std::io::Result<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out.lines().next().unwrap_or("").to_string();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((status, body))
}

/// Whether a GET through the forward answers 200 with a directory listing.
fn serves(port: u16) -> bool {
    matches!(get(port), Ok((status, body)) if status.ends_with("200 OK") && !body.is_empty())
}

fn ready_pod(s: &Setpoint, selector: &str) -> String {
    eventually("a ready pod", DEADLINE, || {
        support::ready_pods(s, selector, 1).map(|mut p| p.remove(0))
    })
}

#[test]
fn process_pods_forward_ports_and_run_commands_over_spdy() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::up(dir.path());
    s.apply(PROCESS_WEB);
    let pod = ready_pod(&s, "app=web");
    let target = format!("pod/{pod}");

    for websockets in [true, false] {
        let f = port_forward(&s, &target, &[8080], websockets);
        let (status, body) = get(f.ports[0]).expect("GET through the forward");
        assert!(
            status.ends_with("200 OK"),
            "websockets={websockets}: {status}"
        );
        assert!(body.contains("Directory listing"), "{body}");
        // A second connection over the same session.
        assert!(serves(f.ports[0]), "websockets={websockets}");
    }

    // A Deployment is forwarded to one of its pods.
    let f = port_forward(&s, "deployment/web", &[8080], true);
    assert!(serves(f.ports[0]));
    drop(f);

    // A port nobody listens on: kubectl reports the kubelet's error and, as kubectl 1.32
    // does on any forwarding error, drops the connection and exits ("lost connection to
    // pod"); the agent's side goes on serving the next port-forward.
    for websockets in [true, false] {
        let mut f = port_forward(&s, &target, &[9], websockets);
        let _ = get(f.ports[0]);
        let error = f
            .stderr
            .iter()
            .find(|l| l.contains("an error occurred forwarding"))
            .expect("kubectl reports the failed forward");
        assert!(
            error.contains(&format!(
                "error forwarding port 9 to pod {pod}_default, uid "
            )) && error.contains("connect: connection refused"),
            "websockets={websockets}: {error}"
        );
        let status = eventually("kubectl port-forward to exit", DEADLINE, || {
            f.child.try_wait().ok().flatten()
        });
        assert!(!status.success());
        // kubectl has exited: its stderr ends, so this reads to the end and no further.
        let rest: Vec<String> = f.stderr.iter().collect();
        assert!(
            rest.iter().any(|l| l.contains("lost connection to pod")),
            "websockets={websockets}: {rest:?}"
        );
        let f = port_forward(&s, &target, &[8080], websockets);
        assert!(
            serves(f.ports[0]),
            "websockets={websockets}: the agent goes on"
        );
    }

    // The Python client's portforward(): WebSocket channels.
    let script = r#"
import sys
from kubernetes import client, config
from kubernetes.stream import portforward
config.load_kube_config(config_file=sys.argv[1])
api = client.CoreV1Api()
pf = portforward(api.connect_get_namespaced_pod_portforward, sys.argv[2], "default", ports="8080")
sock = pf.socket(8080)
sock.setblocking(True)
sock.sendall(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
data = b""
while True:
    chunk = sock.recv(4096)
    if not chunk:
        break
    data += chunk
sock.close()
print(data.split(b"\r\n")[0].decode())
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&s.kubeconfig)
        .arg(&pod)
        .output()
        .expect("run python3");
    let text = support::expect_success("python portforward", &out);
    assert!(text.trim().ends_with("200 OK"), "{text}");

    // kubectl exec over SPDY.
    let exec = |args: &[&str], stdin: Option<&str>| {
        let mut full = vec!["exec"];
        if stdin.is_some() {
            full.push("-i");
        }
        full.push(&pod);
        full.push("--");
        full.extend_from_slice(args);
        let mut child = s
            .kubectl_command(&full)
            .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kubectl exec");
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        child.wait_with_output().expect("kubectl exec")
    };
    let out = exec(&["sh", "-c", "echo hello; echo oops >&2"], None);
    assert_eq!(
        support::expect_success("exec echo", &out),
        "hello\n",
        "stdout only"
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");
    let out = exec(&["sh", "-c", "exit 3"], None);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("command terminated with exit code 3"),
        "{out:?}"
    );
    let out = exec(&["tr", "a-z", "A-Z"], Some("piped in\n"));
    assert_eq!(
        support::expect_success("exec with stdin", &out),
        "PIPED IN\n"
    );

    assert!(lines(&s.ok(&["get", "pods", "-o", "name"])).len() == 1);
}

#[test]
fn cri_pods_forward_ports_inside_their_network_namespace() {
    if !support::kubectl_available() || !support::containerd_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["up", "--container-runtime", "cri"], dir.path());
    // httpd listens on every address of the pod, its loopback included.
    s.ok(&[
        "create",
        "deployment",
        "web",
        "--image=setpoint.local/busybox:1",
        "--",
        "httpd",
        "-f",
        "-p",
        "8080",
        "-h",
        "/etc",
    ]);
    let pod = eventually("a Running pod", DEADLINE, || {
        let out = s.ok(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            r#"jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.name}{"\n"}{end}"#,
        ]);
        lines(&out).into_iter().next()
    });
    for websockets in [true, false] {
        let f = port_forward(&s, &format!("pod/{pod}"), &[8080], websockets);
        // httpd may still be starting: the first GETs can fail.
        eventually("a GET through the forward", DEADLINE, || {
            get(f.ports[0])
                .ok()
                .filter(|(status, _)| status.starts_with("HTTP/1."))
        });
        // Nothing but the pod's httpd listens on 8080 inside its namespace.
        let (status, _) = get(f.ports[0]).unwrap();
        assert!(status.starts_with("HTTP/1."), "{status}");
    }
    // exec over SPDY into the container.
    let out = s
        .kubectl_command(&["exec", &pod, "--", "sh", "-c", "echo in-container; exit 4"])
        .env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
        .output()
        .expect("kubectl exec");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "in-container\n",
        "{out:?}"
    );
    assert_eq!(out.status.code(), Some(4), "{out:?}");

    s.ok(&["delete", "deployment", "web"]);
    eventually("the pod gone", DEADLINE, || {
        lines(&s.ok(&["get", "pods", "-o", "name"]))
            .is_empty()
            .then_some(())
    });
}
