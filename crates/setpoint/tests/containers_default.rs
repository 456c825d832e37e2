//! Containers by default, end to end with the real kubectl and a real containerd (a private
//! one each node starts under its data dir, unless a system containerd is running):
//!
//! - `setpoint up --container-runtime auto` on a data dir whose node ran a pod as a process
//!   keeps that pod a process (same process, no restart, nothing of it in containerd) and runs
//!   new pods in containers. On that node, the walkthrough with real containers: a Deployment
//!   of three busybox `httpd`s Running on the pod subnet; `kubectl logs -f` shows each request
//!   as it is made; `kill -9` of a container's main process from the host makes its
//!   `restartCount` 1 as `kubectl get pod` shows it; a deleted pod is replaced, and the
//!   ReplicaSet's `SuccessfulCreate` events name the replacement.
//! - `setpoint agent` restarted while ten container pods run: afterwards each pod still has
//!   exactly one sandbox and one container in containerd, the same ones, never restarted.
//!
//! Skipped (saying why) unless root with containerd, runc, the CNI plugins and a static
//! busybox installed; `SETPOINT_REQUIRE_CONTAINERD=1` makes that a failure.

mod support;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use setpoint_node::cri::CriClient;
use support::{eventually, lines, Setpoint};

/// The label CRI sandboxes and containers carry with their pod's uid (the kubelet's).
const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

/// `runtime.v1.ContainerState.CONTAINER_RUNNING`.
const CONTAINER_RUNNING: i32 = 1;

const DEADLINE: Duration = Duration::from_secs(120);

/// The local image every container of these tests runs (built from the host's busybox).
const IMAGE: &str = "setpoint.local/busybox:1";

/// What a node printed about its runtime: the CRI endpoint and, for a private containerd,
/// its pod subnet's first three octets and bridge.
struct CriNode {
    endpoint: String,
    subnet_prefix: Option<String>,
    bridge: Option<String>,
}

impl CriNode {
    /// Parses the line `setpoint up` or `setpoint agent` prints about a CRI runtime.
    fn parse(line: &str) -> CriNode {
        let endpoint = line
            .split_whitespace()
            .find(|w| w.starts_with("unix://"))
            .unwrap_or_else(|| panic!("no CRI endpoint in {line:?}"))
            .trim_end_matches(';')
            .to_string();
        let subnet_prefix = line
            .split("(pod subnet ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .map(|s| {
                assert!(s.starts_with("10.223.") && s.ends_with(".0/24"), "{s}");
                s.trim_end_matches("0/24").to_string()
            });
        let bridge = subnet_prefix.as_ref().map(|p| {
            let x = p.trim_end_matches('.').rsplit('.').next().unwrap();
            format!("sp-n{x}")
        });
        CriNode {
            endpoint,
            subnet_prefix,
            bridge,
        }
    }

    /// Removes the bridge a private containerd's network made (it stays with the host).
    fn remove_bridge(&self) {
        if let Some(bridge) = &self.bridge {
            let _ = Command::new("ip").args(["link", "del", bridge]).status();
        }
    }
}

/// The next line `setpoint up` prints that starts with `prefix`.
fn printed(s: &Setpoint, prefix: &str) -> String {
    loop {
        let line = s
            .output
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|_| panic!("setpoint up printed no line starting {prefix:?}"));
        if line.starts_with(prefix) {
            return line;
        }
    }
}

/// The CRI sandboxes and containers `(id, state)` labelled with pod `uid`.
fn cri_objects(
    rt: &tokio::runtime::Runtime,
    cri: &CriClient,
    uid: &str,
) -> (Vec<String>, Vec<(String, i32)>) {
    let labels = HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())]);
    rt.block_on(async {
        let sandboxes = cri.list_pod_sandbox(&labels).await.expect("list sandboxes");
        let containers = cri
            .list_containers("", &labels)
            .await
            .expect("list containers");
        (
            sandboxes.into_iter().map(|s| s.id).collect(),
            containers.into_iter().map(|c| (c.id, c.state)).collect(),
        )
    })
}

/// Removes every sandbox (and so every container) of the test's pods from containerd when
/// dropped, so a failed test leaves no shims, mounts or network namespaces behind.
struct CriCleanup {
    endpoint: String,
    uids: HashSet<String>,
}

impl Drop for CriCleanup {
    fn drop(&mut self) {
        let endpoint = self.endpoint.clone();
        let uids: Vec<String> = self.uids.drain().collect();
        // A runtime of its own: this may run while a test's runtime is unwinding.
        let cleaned = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let Ok(cri) = CriClient::connect(&endpoint).await else {
                    return;
                };
                for uid in uids {
                    let labels = HashMap::from([(POD_UID_LABEL.to_string(), uid)]);
                    for s in cri.list_pod_sandbox(&labels).await.unwrap_or_default() {
                        let _ = cri.stop_pod_sandbox(&s.id).await;
                        let _ = cri.remove_pod_sandbox(&s.id).await;
                    }
                }
            });
        });
        let _ = cleaned.join();
    }
}

/// One pod as `kubectl get` reports it.
#[derive(Clone, Debug, PartialEq)]
struct PodView {
    name: String,
    uid: String,
    ip: String,
    container_id: String,
    restarts: String,
}

/// The Running pods matching `selector`.
fn running(s: &Setpoint, selector: &str) -> Vec<PodView> {
    let out = s.ok(&[
        "get",
        "pods",
        "-l",
        selector,
        "-o",
        r#"jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.name} {.metadata.uid} {.status.podIP} {.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}{"\n"}{end}"#,
    ]);
    lines(&out)
        .into_iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 5 && f[3].contains("://")).then(|| PodView {
                name: f[0].into(),
                uid: f[1].into(),
                ip: f[2].into(),
                container_id: f[3].into(),
                restarts: f[4].into(),
            })
        })
        .collect()
}

/// Exactly `n` Running pods matching `selector` on `n` distinct addresses, once there are.
fn n_running(s: &Setpoint, selector: &str, n: usize) -> Option<Vec<PodView>> {
    let pods = running(s, selector);
    let ips: HashSet<&String> = pods.iter().map(|p| &p.ip).collect();
    (pods.len() == n && ips.len() == n).then_some(pods)
}

/// The status line of an HTTP/1.0 GET of `path` from `ip:8080`, if the server answers.
fn http_status(ip: &str, path: &str) -> Option<String> {
    let addr: SocketAddr = format!("{ip}:8080").parse().ok()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").ok()?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.lines().next()?.to_string();
    status.starts_with("HTTP/1.").then_some(status)
}

/// The host pid of the task of container `id` in the containerd at `endpoint`, as `ctr`
/// lists it (`TASK PID STATUS`).
fn container_pid(endpoint: &str, id: &str) -> Option<u32> {
    let socket = endpoint.trim_start_matches("unix://");
    let out = Command::new("ctr")
        .args(["--address", socket, "--namespace", "k8s.io", "tasks", "ls"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 3 && f[0] == id && f[2] == "RUNNING")
            .then(|| f[1].parse().ok())
            .flatten()
    })
}

/// Asserts that each pod has one sandbox and one running container in containerd: the
/// container the pod's status names.
fn one_each(rt: &tokio::runtime::Runtime, cri: &CriClient, pods: &[PodView]) {
    for p in pods {
        let (sandboxes, containers) = cri_objects(rt, cri, &p.uid);
        assert_eq!(sandboxes.len(), 1, "{p:?}: sandboxes {sandboxes:?}");
        let id = p
            .container_id
            .trim_start_matches("containerd://")
            .to_string();
        assert_eq!(containers, vec![(id, CONTAINER_RUNNING)], "{p:?}");
    }
}

/// Kills a child process however the test ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` with stdout piped; its lines arrive on the receiver as they are printed.
fn spawn_with_stdout_lines(cmd: &mut Command) -> (KillOnDrop, mpsc::Receiver<String>) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the process");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    (KillOnDrop(child), rx)
}

/// Waits for a line containing `needle` on `lines`.
fn line_with(lines: &mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(_) => {}
            Err(e) => panic!("no line with {needle:?}: {e}"),
        }
    }
}

#[test]
fn auto_keeps_process_pods_and_runs_the_walkthrough_in_containers() {
    if !support::kubectl_available() || !support::containerd_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();

    // A node that runs processes runs a pod (an image and a command: the command runs on
    // the host), then stops leaving it running.
    let s = Setpoint::start(&["up", "--container-runtime", "process"], dir.path());
    s.ok(&[
        "run",
        "legacy",
        &format!("--image={IMAGE}"),
        "--command",
        "--",
        "sleep",
        "3600",
    ]);
    let legacy = eventually("the process pod Running", DEADLINE, || {
        running(&s, "run=legacy").pop()
    });
    assert!(legacy.container_id.starts_with("process://"), "{legacy:?}");
    // How the process node networks its pods, as its Node says.
    let network = s.ok(&[
        "get",
        "nodes",
        "-o",
        r"jsonpath={.items[0].metadata.annotations.setpoint\.io/process-pod-network}",
    ]);
    s.stop_leaving_pods();

    // The same data dir with containers chosen by `auto`.
    let s = Setpoint::start(&["up", "--container-runtime", "auto"], dir.path());
    let line = printed(&s, "The local node runs pods ");
    assert!(line.contains("containerd"), "{line}");
    let node = CriNode::parse(&line);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cri = rt
        .block_on(CriClient::connect(&node.endpoint))
        .expect("connect to the node's CRI endpoint");
    let mut cleanup = CriCleanup {
        endpoint: node.endpoint.clone(),
        uids: HashSet::new(),
    };
    let version = s.ok(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={.items[0].status.nodeInfo.containerRuntimeVersion}",
    ]);
    assert!(version.starts_with("containerd://"), "{version}");

    // The process pod is adopted as it was: the same process, never restarted, and
    // containerd holds nothing of it (checked once the node has run a new pod, so it has
    // looked at every pod it had).
    let pid: i32 = legacy
        .container_id
        .trim_start_matches("process://")
        .parse()
        .unwrap();

    // The walkthrough: a Deployment of three httpd servers in containers.
    s.ok(&[
        "create",
        "deployment",
        "demo",
        &format!("--image={IMAGE}"),
        "--replicas=3",
        "--",
        "httpd",
        "-f",
        "-vv",
        "-p",
        "8080",
        "-h",
        "/tmp",
    ]);
    let pods = eventually("three demo pods Running", DEADLINE, || {
        n_running(&s, "app=demo", 3)
    });
    cleanup.uids.extend(pods.iter().map(|p| p.uid.clone()));
    for p in &pods {
        assert!(p.container_id.starts_with("containerd://"), "{p:?}");
        assert_eq!(p.restarts, "0", "{p:?}");
        if let Some(prefix) = &node.subnet_prefix {
            assert!(p.ip.starts_with(prefix), "{p:?} not in {prefix}0/24");
        }
        eventually(&format!("{} answers", p.name), DEADLINE, || {
            http_status(&p.ip, "/")
        });
    }
    assert_eq!(
        running(&s, "run=legacy"),
        vec![legacy.clone()],
        "the process pod is unchanged"
    );
    // Signal 0: the process is alive, as the same pid.
    assert!(
        Command::new("kill")
            .args(["-0", &pid.to_string()])
            .status()
            .unwrap()
            .success(),
        "process {pid} of the legacy pod is gone"
    );
    assert_eq!(
        cri_objects(&rt, &cri, &legacy.uid),
        (Vec::new(), Vec::new()),
        "the process pod also started in containerd"
    );
    // On the node's network a process pod has a loopback address; on the process bridge
    // (`--process-pod-network bridge`) one of the range the private containerd now shares.
    assert_eq!(
        legacy.ip.starts_with("127."),
        network.trim() == "host",
        "{legacy:?} on a node whose process pod network was {network}"
    );

    // `kubectl logs -f` shows each request as it is made.
    let follow = &pods[2];
    let (_kubectl, log_lines) =
        spawn_with_stdout_lines(&mut s.kubectl_command(&["logs", "-f", &follow.name]));
    for n in 1..=3 {
        let path = format!("/followed-{n}");
        http_status(&follow.ip, &path).expect("the server answers");
        let line = line_with(&log_lines, &format!("url:{path}"));
        assert!(line.contains("url:"), "{line}");
    }

    // `kill -9` of a container's main process from the host: restartCount 1, a new
    // container, and the kill recorded as the last state.
    let victim = &pods[1];
    let id = victim.container_id.trim_start_matches("containerd://");
    let main_pid = eventually("the container's task listed", DEADLINE, || {
        container_pid(&node.endpoint, id)
    });
    let killed = Command::new("kill")
        .args(["-9", &main_pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let restarted = eventually("the container restarted once", DEADLINE, || {
        running(&s, "app=demo")
            .into_iter()
            .find(|p| p.name == victim.name && p.restarts == "1")
    });
    assert_ne!(restarted.container_id, victim.container_id);
    let columns = s.ok(&["get", "pod", &victim.name, "--no-headers"]);
    let fields: Vec<&str> = columns.split_whitespace().collect();
    assert_eq!(
        (fields[1], fields[2], fields[3]),
        ("1/1", "Running", "1"),
        "{columns}"
    );
    let last = s.ok(&[
        "get",
        "pod",
        &victim.name,
        "-o",
        "jsonpath={.status.containerStatuses[0].lastState.terminated.exitCode}",
    ]);
    assert_eq!(last, "137");

    // A deleted pod is replaced; the ReplicaSet's events name the replacement.
    let gone = &pods[0];
    // httpd is its container's PID 1, which SIGTERM does not end: a short grace period
    // keeps the test from waiting out the default 30 s.
    s.ok(&["delete", "pod", &gone.name, "--grace-period=2"]);
    let after = eventually("a replacement Running", DEADLINE, || {
        n_running(&s, "app=demo", 3).filter(|pods| pods.iter().all(|p| p.name != gone.name))
    });
    cleanup.uids.extend(after.iter().map(|p| p.uid.clone()));
    let old: HashSet<&String> = pods.iter().map(|p| &p.name).collect();
    let replacement = after
        .iter()
        .find(|p| !old.contains(&p.name))
        .expect("a new pod");
    assert!(replacement.container_id.starts_with("containerd://"));
    let described = eventually("the replacement's event", DEADLINE, || {
        let out = s.ok(&["describe", "rs", "-l", "app=demo"]);
        out.contains(&format!("Created pod: {}", replacement.name))
            .then_some(out)
    });
    assert!(described.contains("SuccessfulCreate"), "{described}");
    let events = s.ok(&[
        "get",
        "events",
        "-o",
        r#"jsonpath={range .items[?(@.reason=="SuccessfulCreate")]}{.message}{"\n"}{end}"#,
    ]);
    assert_eq!(
        events.matches("Created pod: demo-").count(),
        4,
        "three pods and the replacement: {events}"
    );
    eventually("the deleted pod gone from containerd", DEADLINE, || {
        (cri_objects(&rt, &cri, &gone.uid) == (Vec::new(), Vec::new())).then_some(())
    });

    // Everything deleted: containerd holds none of the pods, and the process is gone.
    s.ok(&["delete", "deployment", "demo"]);
    s.ok(&[
        "delete",
        "pods",
        "--all",
        "--grace-period=1",
        "--ignore-not-found",
    ]);
    eventually("the pods deleted", DEADLINE, || {
        s.ok(&["get", "pods", "-o", "name"])
            .trim()
            .is_empty()
            .then_some(())
    });
    let uids: Vec<String> = cleanup.uids.iter().cloned().collect();
    eventually("containerd holds none of the pods", DEADLINE, || {
        uids.iter()
            .all(|uid| cri_objects(&rt, &cri, uid) == (Vec::new(), Vec::new()))
            .then_some(())
    });
    eventually("the legacy process stopped", DEADLINE, || {
        (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    });
    drop(cri);
    drop(cleanup);
    s.stop();
    node.remove_bridge();
}

/// Starts `setpoint agent` for node `name` on `dir` against the cluster of `kubeconfig`,
/// with containers chosen by `auto`; returns it and the line it printed about its runtime.
fn start_agent(kubeconfig: &std::path::Path, dir: &std::path::Path) -> (KillOnDrop, String) {
    let mut agent = Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .args([
            "agent",
            "--node-name",
            "restarted",
            "--address",
            "127.0.0.1",
            "--listen",
            "127.0.0.1:0",
            "--container-runtime",
            "auto",
            "--kubeconfig",
        ])
        .arg(kubeconfig)
        .arg("--data-dir")
        .arg(dir)
        .env("SETPOINT_LOG", "warn")
        .env(support::PROCESS_POD_NETWORK_ENV, "host")
        // No service proxy, whose nftables table would outlive the test.
        .env(support::PROXY_MODE_ENV, "none")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start setpoint agent");
    let stdout = agent.stdout.take().unwrap();
    let agent = KillOnDrop(agent);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(DEADLINE)
        .expect("the agent says what it runs pods on");
    (agent, line)
}

/// Stops the agent with SIGTERM, as a person would, and waits for it to exit.
fn stop_agent(mut agent: KillOnDrop) {
    let pid = agent.0.id();
    let _ = Command::new("kill").arg(pid.to_string()).status();
    eventually("the agent stopped", DEADLINE, || {
        agent.0.try_wait().expect("wait for the agent")
    });
}

#[test]
fn agent_restart_keeps_ten_container_pods() {
    if !support::kubectl_available() || !support::containerd_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["up", "--no-node"], &tmp.path().join("data"));
    let agent_dir = tmp.path().join("agent");
    let (agent, line) = start_agent(&s.kubeconfig, &agent_dir);
    assert!(
        line.starts_with("Node restarted is running pods in "),
        "{line}"
    );
    let node = CriNode::parse(&line);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut cleanup = CriCleanup {
        endpoint: node.endpoint.clone(),
        uids: HashSet::new(),
    };

    s.ok(&[
        "create",
        "deployment",
        "ten",
        &format!("--image={IMAGE}"),
        "--replicas=10",
        "--",
        "sleep",
        "3600",
    ]);
    let before = eventually("ten pods Running", DEADLINE, || {
        n_running(&s, "app=ten", 10)
    });
    cleanup.uids.extend(before.iter().map(|p| p.uid.clone()));
    let cri = rt
        .block_on(CriClient::connect(&node.endpoint))
        .expect("connect to the node's CRI endpoint");
    one_each(&rt, &cri, &before);
    for p in &before {
        assert_eq!(p.restarts, "0", "{p:?}");
    }
    drop(cri);

    // The agent stops (its private containerd with it; the containers keep running in
    // their shims) and starts again on the same directory.
    stop_agent(agent);
    let (agent, line) = start_agent(&s.kubeconfig, &agent_dir);
    let again = CriNode::parse(&line);
    assert_eq!(again.endpoint, node.endpoint, "{line}");
    let cri = rt
        .block_on(CriClient::connect(&again.endpoint))
        .expect("connect to the node's CRI endpoint again");
    // A new pod runs once the restarted agent works; by then it has synced the pods it
    // listed when it started.
    s.ok(&[
        "run",
        "after",
        &format!("--image={IMAGE}"),
        "--",
        "sleep",
        "3600",
    ]);
    let after = eventually("a new pod Running", DEADLINE, || {
        running(&s, "run=after").pop()
    });
    cleanup.uids.insert(after.uid.clone());
    let now = n_running(&s, "app=ten", 10).expect("ten pods still Running");
    let by_name = |pods: &[PodView]| {
        let mut pods = pods.to_vec();
        pods.sort_by(|a, b| a.name.cmp(&b.name));
        pods
    };
    assert_eq!(
        by_name(&now),
        by_name(&before),
        "no pod replaced or restarted"
    );
    one_each(&rt, &cri, &before);
    one_each(&rt, &cri, std::slice::from_ref(&after));
    // Nothing else in containerd: the ten and the new one, no duplicates.
    let all = rt
        .block_on(cri.list_containers("", &HashMap::new()))
        .expect("list containers");
    let ours: HashSet<&String> = cleanup.uids.iter().collect();
    let counted = all
        .iter()
        .filter(|c| {
            c.labels
                .get(POD_UID_LABEL)
                .is_some_and(|uid| ours.contains(uid))
        })
        .count();
    assert_eq!(counted, 11);

    s.ok(&["delete", "deployment", "ten"]);
    s.ok(&["delete", "pods", "--all", "--grace-period=1"]);
    let uids: Vec<String> = cleanup.uids.iter().cloned().collect();
    eventually("containerd holds none of the pods", DEADLINE, || {
        uids.iter()
            .all(|uid| cri_objects(&rt, &cri, uid) == (Vec::new(), Vec::new()))
            .then_some(())
    });
    drop(cri);
    drop(cleanup);
    stop_agent(agent);
    s.stop();
    again.remove_bridge();
}
