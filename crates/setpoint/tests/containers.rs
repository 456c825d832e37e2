//! `setpoint up --container-runtime cri` end to end, with the real kubectl and a real
//! containerd (a private one the node starts under its data dir, unless a system containerd
//! is running): a Deployment of busybox `httpd` from the local image gets three Running pods
//! on distinct addresses of the node's pod subnet, each answering HTTP from this host; the
//! Node reports `containerd://` as its runtime, and pods' container ids are containerd's; a
//! deleted pod is replaced, and its sandbox and container are gone from containerd.
//! `setpoint agent` does the same on a `--container-runtime-endpoint` it is given, and
//! without containerd `--container-runtime cri` refuses to start, naming what to install; a
//! restart on the same data dir gets the same pod subnet and adopts the running pods.
//!
//! Skipped (saying why) unless root with containerd, runc, the CNI plugins and a static
//! busybox installed; `SETPOINT_REQUIRE_CONTAINERD=1` makes that a failure.

mod support;

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use setpoint_node::cri::CriClient;
use support::{eventually, lines, Setpoint};

/// The label CRI sandboxes and containers carry with their pod's uid (the kubelet's).
const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";

const DEADLINE: Duration = Duration::from_secs(120);

/// What `setpoint up` printed about its local node's runtime: the CRI endpoint and, for a
/// private containerd, the pod subnet's first three octets (`10.223.<x>.`).
struct Runtime {
    endpoint: String,
    subnet_prefix: Option<String>,
    bridge: Option<String>,
}

fn runtime_of(setpoint: &Setpoint) -> Runtime {
    let line = loop {
        let line = setpoint
            .output
            .recv_timeout(DEADLINE)
            .expect("setpoint up says what its local node runs pods on");
        if line.starts_with("The local node runs pods ") {
            break line;
        }
    };
    let endpoint = line
        .split_whitespace()
        .find(|w| w.starts_with("unix://"))
        .unwrap_or_else(|| panic!("no CRI endpoint in {line:?}"))
        .to_string();
    // `(pod subnet 10.223.<x>.0/24)` for a private containerd.
    let subnet = line
        .split("(pod subnet ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .map(String::from);
    let subnet_prefix = subnet.as_ref().map(|s| {
        assert!(s.starts_with("10.223.") && s.ends_with(".0/24"), "{s}");
        s.trim_end_matches("0/24").to_string()
    });
    let bridge = subnet_prefix.as_ref().map(|p| {
        let x = p.trim_end_matches('.').rsplit('.').next().unwrap();
        format!("sp-n{x}")
    });
    Runtime {
        endpoint,
        subnet_prefix,
        bridge,
    }
}

/// `(name, uid, podIP, containerID)` of the Running pods of the `web` Deployment.
fn running_pods(s: &Setpoint) -> Vec<(String, String, String, String)> {
    let out = s.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        r#"jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.name} {.metadata.uid} {.status.podIP} {.status.containerStatuses[0].containerID}{"\n"}{end}"#,
    ]);
    lines(&out)
        .into_iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4).then(|| (f[0].into(), f[1].into(), f[2].into(), f[3].into()))
        })
        .collect()
}

/// Three Running pods with three distinct addresses, once there are.
fn three_running(s: &Setpoint) -> Option<Vec<(String, String, String, String)>> {
    let pods = running_pods(s);
    let ips: HashSet<&String> = pods.iter().map(|p| &p.2).collect();
    (pods.len() == 3 && ips.len() == 3).then_some(pods)
}

/// The status line of an HTTP/1.0 GET of `/` from `ip:8080`, if the server answers.
fn http_status(ip: &str) -> Option<String> {
    let addr: SocketAddr = format!("{ip}:8080").parse().ok()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET / HTTP/1.0\r\nHost: {ip}\r\n\r\n").ok()?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out.lines().next()?.to_string();
    status.starts_with("HTTP/1.").then_some(status)
}

/// The CRI sandboxes and containers labelled with pod `uid` (all of them when `None`).
fn cri_objects(
    rt: &tokio::runtime::Runtime,
    cri: &CriClient,
    uid: Option<&str>,
) -> (Vec<String>, Vec<String>) {
    let labels: HashMap<String, String> = uid
        .map(|u| HashMap::from([(POD_UID_LABEL.to_string(), u.to_string())]))
        .unwrap_or_default();
    rt.block_on(async {
        let sandboxes = cri.list_pod_sandbox(&labels).await.expect("list sandboxes");
        let containers = cri
            .list_containers("", &labels)
            .await
            .expect("list containers");
        (
            sandboxes.into_iter().map(|s| s.id).collect(),
            containers.into_iter().map(|c| c.id).collect(),
        )
    })
}

/// Removes every sandbox (and so every container) the test's pods left in containerd, so a
/// failed test leaves no shims, mounts or network namespaces behind; dropped before the
/// `setpoint` process (and its private containerd) stops.
struct CriCleanup {
    endpoint: String,
    uids: std::sync::Arc<std::sync::Mutex<HashSet<String>>>,
}

impl Drop for CriCleanup {
    fn drop(&mut self) {
        let endpoint = self.endpoint.clone();
        let uids: Vec<String> = self.uids.lock().unwrap().iter().cloned().collect();
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

#[test]
fn deployment_runs_in_containerd() {
    if !support::kubectl_available() || !support::containerd_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["up", "--container-runtime", "cri"], dir.path());
    let runtime = runtime_of(&s);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cri = rt
        .block_on(CriClient::connect(&runtime.endpoint))
        .expect("connect to the node's CRI endpoint");
    let cleanup = CriCleanup {
        endpoint: runtime.endpoint.clone(),
        uids: Default::default(),
    };

    // The Node names containerd as its runtime, with the version CRI reports.
    let node_runtime = s.ok(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={.items[0].status.nodeInfo.containerRuntimeVersion}",
    ]);
    assert!(node_runtime.starts_with("containerd://"), "{node_runtime}");

    // `:1` is not `:latest`: IfNotPresent is the default, and the image is the local one.
    s.ok(&[
        "create",
        "deployment",
        "web",
        "--image=setpoint.local/busybox:1",
        "--replicas=3",
        "--",
        "httpd",
        "-f",
        "-p",
        "8080",
        "-h",
        "/tmp",
    ]);
    let pods = eventually("three Running pods on distinct addresses", DEADLINE, || {
        three_running(&s)
    });
    cleanup
        .uids
        .lock()
        .unwrap()
        .extend(pods.iter().map(|p| p.1.clone()));
    for (name, _, ip, container_id) in &pods {
        if let Some(prefix) = &runtime.subnet_prefix {
            assert!(
                ip.starts_with(prefix),
                "{name}'s address {ip} not in {prefix}0/24"
            );
        }
        assert!(
            container_id.starts_with("containerd://"),
            "{name}: {container_id}"
        );
        // An empty directory answers 404: an answer is what counts.
        let status = eventually(&format!("{name} answers on {ip}:8080"), DEADLINE, || {
            http_status(ip)
        });
        assert!(status.starts_with("HTTP/1."), "{status}");
    }

    // A deleted pod is replaced, and containerd holds nothing of it any more.
    let (victim, victim_uid, _, _) = pods[0].clone();
    let (sandboxes, containers) = cri_objects(&rt, &cri, Some(&victim_uid));
    assert_eq!(
        (sandboxes.len(), containers.len()),
        (1, 1),
        "{victim} in containerd"
    );
    // httpd is its container's PID 1, which SIGTERM does not end: a short grace period
    // keeps the test from waiting out the default 30 s.
    s.ok(&["delete", "pod", &victim, "--grace-period=2"]);
    let replaced = eventually("a replacement Running", DEADLINE, || {
        three_running(&s).filter(|pods| pods.iter().all(|p| p.0 != victim))
    });
    cleanup
        .uids
        .lock()
        .unwrap()
        .extend(replaced.iter().map(|p| p.1.clone()));
    eventually(
        &format!("{victim}'s sandbox and container removed"),
        DEADLINE,
        || {
            let (sandboxes, containers) = cri_objects(&rt, &cri, Some(&victim_uid));
            (sandboxes.is_empty() && containers.is_empty()).then_some(())
        },
    );
    let events = s.ok(&["get", "events"]);
    assert!(events.contains("SuccessfulCreate"), "{events}");

    // Deleting the Deployment empties containerd of the test's pods before it stops.
    s.ok(&["delete", "deployment", "web"]);
    s.ok(&[
        "delete",
        "pods",
        "-l",
        "app=web",
        "--grace-period=2",
        "--ignore-not-found",
    ]);
    eventually("the pods deleted", DEADLINE, || {
        running_pods(&s).is_empty().then_some(())
    });
    let uids: Vec<String> = cleanup.uids.lock().unwrap().iter().cloned().collect();
    eventually("containerd holds none of the pods", DEADLINE, || {
        uids.iter()
            .all(|uid| cri_objects(&rt, &cri, Some(uid)) == (Vec::new(), Vec::new()))
            .then_some(())
    });
    drop(cri);
    drop(cleanup);
    s.stop();
    // The bridge the private containerd's network made stays with the host; the test
    // leaves none behind.
    if let Some(bridge) = runtime.bridge {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &bridge])
            .status();
    }
}

/// Without containerd installed (here: not on an empty `PATH`), `--container-runtime cri`
/// refuses to start and says what to install.
#[test]
fn cri_without_containerd_says_what_to_install() {
    if setpoint_node::containerd::find_system_endpoint().is_some() {
        eprintln!("skipping: a system containerd is running, which the node would use");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .args([
            "up",
            "--container-runtime",
            "cri",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .env("PATH", empty.path())
        .env("SETPOINT_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start setpoint");
    let status = eventually("setpoint up to exit", DEADLINE, || {
        child.try_wait().expect("wait for setpoint")
    });
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("--container-runtime cri") && stderr.contains("install containerd"),
        "{stderr}"
    );
}

/// `setpoint agent --container-runtime cri --container-runtime-endpoint <socket>` against
/// `setpoint up --no-node`: the agent runs a pod in the containerd given (its own network:
/// the test containerd's subnet), the Node reports `containerd://`, and a deleted pod leaves
/// nothing in containerd.
#[test]
fn agent_runs_pods_on_the_endpoint_given() {
    if !support::kubectl_available() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(ctrd) = rt.block_on(setpoint_node::containerd::TestContainerd::start()) else {
        return;
    };
    let endpoint = format!("unix://{}", ctrd.endpoint().display());
    let subnet_prefix = ctrd.subnet().trim_end_matches("0/24").to_string();
    let tmp = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["up", "--no-node"], &tmp.path().join("data"));
    let agent_dir = tmp.path().join("agent");
    let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .args([
            "agent",
            "--node-name",
            "cri-node",
            "--address",
            "127.0.0.1",
            "--listen",
            "127.0.0.1:0",
            "--container-runtime",
            "cri",
            "--container-runtime-endpoint",
            &endpoint,
            "--kubeconfig",
        ])
        .arg(&s.kubeconfig)
        .arg("--data-dir")
        .arg(&agent_dir)
        .env("SETPOINT_LOG", "warn")
        .env(support::PROCESS_POD_NETWORK_ENV, "host")
        // No service proxy, whose nftables table would outlive the test.
        .env(support::PROXY_MODE_ENV, "none")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start setpoint agent");
    // Killed however the test ends, before the containerd it uses is dropped.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut said = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(agent.stdout.take().unwrap()),
        &mut said,
    )
    .unwrap();
    let _agent = Kill(agent);
    assert!(
        said.starts_with("Node cri-node is running pods in containerd") && said.contains(&endpoint),
        "{said}"
    );
    let cri = rt
        .block_on(CriClient::connect(&endpoint))
        .expect("connect to the test containerd");

    eventually("the node registered", DEADLINE, || {
        let v = s.ok(&[
            "get",
            "node",
            "cri-node",
            "--ignore-not-found",
            "-o",
            "jsonpath={.status.nodeInfo.containerRuntimeVersion}",
        ]);
        v.starts_with("containerd://").then_some(())
    });
    s.ok(&[
        "run",
        "one",
        "--image=setpoint.local/busybox:1",
        "--",
        "sleep",
        "3600",
    ]);
    let (uid, ip) = eventually("the pod Running", DEADLINE, || {
        let out = s.ok(&[
            "get",
            "pod",
            "one",
            "-o",
            "jsonpath={.status.phase} {.metadata.uid} {.status.podIP}",
        ]);
        let f: Vec<&str> = out.split_whitespace().collect();
        (f.len() == 3 && f[0] == "Running").then(|| (f[1].to_string(), f[2].to_string()))
    });
    assert!(
        ip.starts_with(&subnet_prefix),
        "{ip} not in {}",
        ctrd.subnet()
    );
    assert_eq!(cri_objects(&rt, &cri, Some(&uid)).0.len(), 1);
    // sleep is its container's PID 1, which SIGTERM does not end.
    s.ok(&["delete", "pod", "one", "--grace-period=1"]);
    eventually("the pod's sandbox and container removed", DEADLINE, || {
        (cri_objects(&rt, &cri, Some(&uid)) == (Vec::new(), Vec::new())).then_some(())
    });
}

/// A restarted `setpoint up --container-runtime cri` on the same data dir gets its pod
/// subnet back and adopts the pod its private containerd still runs: same container, same
/// address, no restart.
#[test]
fn restart_keeps_the_subnet_and_adopts_pods() {
    if !support::kubectl_available() || !support::containerd_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let args = ["up", "--container-runtime", "cri"];
    let s = Setpoint::start(&args, dir.path());
    let first = runtime_of(&s);
    s.ok(&[
        "run",
        "one",
        "--image=setpoint.local/busybox:1",
        "--",
        "sleep",
        "3600",
    ]);
    let query = [
        "get",
        "pod",
        "one",
        "-o",
        "jsonpath={.status.phase} {.metadata.uid} {.status.podIP} {.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}",
    ];
    let running = |s: &Setpoint| {
        let out = s.ok(&query);
        let f: Vec<String> = out.split_whitespace().map(String::from).collect();
        (f.len() == 5 && f[0] == "Running").then_some(f)
    };
    let before = eventually("the pod Running", DEADLINE, || running(&s));
    s.stop_leaving_pods();

    let s = Setpoint::start(&args, dir.path());
    let second = runtime_of(&s);
    let cleanup = CriCleanup {
        endpoint: second.endpoint.clone(),
        uids: std::sync::Arc::new(std::sync::Mutex::new(HashSet::from([before[1].clone()]))),
    };
    assert_eq!(second.endpoint, first.endpoint);
    assert_eq!(second.subnet_prefix, first.subnet_prefix);
    // Running again once the new agent has looked at it: the same container, never
    // restarted.
    let after = eventually("the pod adopted", DEADLINE, || {
        running(&s).filter(|f| f[3] == before[3])
    });
    assert_eq!(after, before);

    s.ok(&["delete", "pod", "one", "--grace-period=1"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cri = rt
        .block_on(CriClient::connect(&second.endpoint))
        .expect("connect to the node's CRI endpoint");
    eventually("the pod's sandbox and container removed", DEADLINE, || {
        (cri_objects(&rt, &cri, Some(&before[1])) == (Vec::new(), Vec::new())).then_some(())
    });
    drop(cri);
    drop(cleanup);
    s.stop();
    if let Some(bridge) = second.bridge {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &bridge])
            .status();
    }
}
