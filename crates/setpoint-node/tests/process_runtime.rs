//! The process runtime driven directly: real processes, no API server.

// The tests kill processes with `kill`, a system call.
#![allow(unsafe_code)]

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use setpoint_node::process::backoff::BackoffPolicy;
use setpoint_node::process::ipam::IpRange;
use setpoint_node::process::state::{alive, PodRecord};
use setpoint_node::process::{ProcessRuntime, ProcessRuntimeOptions};
use setpoint_node::runtime::{LogOptions, NodeContext, PodRuntime, RuntimePod, RuntimeStatus};
use tokio::sync::mpsc;

const DEADLINE: Duration = Duration::from_secs(30);

/// Kills every process a test's runtimes started, even when the test panics.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Ok(dirs) = std::fs::read_dir(self.0.join("pods")) else {
            return;
        };
        for dir in dirs.flatten() {
            let Ok(record) = PodRecord::load(&dir.path().join("pod.json")) else {
                continue;
            };
            for c in record.containers.values() {
                let Some(run) = &c.run else { continue };
                let workload_alive =
                    matches!((run.pid, run.pid_start), (Some(p), Some(s)) if alive(p, s));
                if run.wrapper_pid > 0
                    && (alive(run.wrapper_pid, run.wrapper_start) || workload_alive)
                {
                    // SAFETY: plain syscall on a process group the test's runtime started.
                    unsafe {
                        libc::kill(-run.wrapper_pid, libc::SIGKILL);
                    }
                }
            }
        }
    }
}

struct Harness {
    rt: ProcessRuntime,
    rx: mpsc::UnboundedReceiver<String>,
    // Dropped before the temporary directory: fields drop in declaration order.
    _cleanup: Cleanup,
    dir: tempfile::TempDir,
}

fn options(ip_block: u8) -> ProcessRuntimeOptions {
    ProcessRuntimeOptions {
        backoff: BackoffPolicy {
            base: Duration::from_millis(200),
            max: Duration::from_millis(800),
            reset_after: Duration::from_secs(600),
        },
        // Each test its own addresses, so tests running at once never share a pod IP.
        pod_ips: Some(IpRange {
            first: Ipv4Addr::new(127, 1, ip_block, 1),
            count: 200,
        }),
        log_max_bytes: 10 * 1024 * 1024,
        poll_interval: Duration::from_millis(50),
        network: None,
        cluster_dns: Default::default(),
    }
}

impl Harness {
    fn new(ip_block: u8) -> Self {
        Self::with(options(ip_block))
    }

    fn with(options: ProcessRuntimeOptions) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let rt = ProcessRuntime::with_options(dir.path(), options).unwrap();
        let rx = rt.subscribe();
        Self {
            rt,
            rx,
            _cleanup: Cleanup(dir.path().to_path_buf()),
            dir,
        }
    }

    fn node() -> NodeContext {
        NodeContext {
            node_name: "node-1".into(),
            host_ip: "127.0.0.1".into(),
            sources: None,
        }
    }

    /// Syncs the pod (again on every notification, at least every 100 ms) until `done`.
    async fn sync_until(
        &mut self,
        pod: &Pod,
        what: &str,
        done: impl Fn(&RuntimeStatus) -> bool,
    ) -> RuntimeStatus {
        let start = Instant::now();
        loop {
            let status = self.rt.sync_pod(pod, &Self::node()).await.unwrap();
            if done(&status) {
                return status;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "timed out waiting for {what}; last status: {status:#?}"
            );
            let _ = tokio::time::timeout(Duration::from_millis(100), self.rx.recv()).await;
        }
    }

    async fn log(&self, pod: &Pod, container: &str, options: LogOptions) -> String {
        let stream = self.rt.logs(&rpod(pod), container, &options).await.unwrap();
        let chunks: Vec<_> = stream.collect().await;
        let bytes: Vec<u8> = chunks
            .into_iter()
            .flat_map(|c| c.unwrap().to_vec())
            .collect();
        String::from_utf8(bytes).unwrap()
    }

    async fn log_until(&self, pod: &Pod, container: &str, needle: &str) -> String {
        let what = format!("{needle:?} in the log of {container}");
        setpoint_testing::eventually_within(DEADLINE, &what, || async {
            let text = self.log(pod, container, LogOptions::default()).await;
            text.contains(needle).then_some(text)
        })
        .await
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn pod(name: &str, policy: &str, containers: serde_json::Value) -> Pod {
    let uid = format!(
        "uid-{}-{}-{name}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    );
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "nodeName": "node-1",
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 5,
            "containers": containers,
        }
    }))
    .unwrap()
}

fn sh(name: &str, script: &str) -> serde_json::Value {
    serde_json::json!({"name": name, "image": "busybox", "command": ["sh", "-c", script]})
}

fn rpod(pod: &Pod) -> RuntimePod {
    RuntimePod {
        uid: pod.metadata.uid.clone().unwrap(),
        namespace: pod.metadata.namespace.clone().unwrap(),
        name: pod.metadata.name.clone().unwrap(),
    }
}

fn first(status: &RuntimeStatus) -> &ContainerStatus {
    &status.container_statuses[0]
}

fn running(status: &RuntimeStatus) -> bool {
    first(status)
        .state
        .as_ref()
        .is_some_and(|s| s.running.is_some())
}

fn pid(status: &ContainerStatus) -> i32 {
    let id = status.container_id.as_deref().expect("container id");
    id.strip_prefix("process://")
        .expect("process:// id")
        .parse()
        .unwrap()
}

fn process_exists(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z'))
}

fn kill9(pid: i32) {
    // SAFETY: plain syscall on the workload process this test started.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

fn terminated(state: Option<&k8s_openapi::api::core::v1::ContainerState>) -> (i32, String) {
    let t = state
        .and_then(|s| s.terminated.as_ref())
        .expect("terminated state");
    (t.exit_code, t.reason.clone().unwrap_or_default())
}

#[tokio::test]
async fn a_shell_container_runs_logs_and_is_killed() {
    let mut h = Harness::new(10);
    let pod = pod(
        "hello",
        "Always",
        serde_json::json!([{
            "name": "main",
            "image": "busybox",
            "command": ["sh", "-c", "echo hello; echo \"ip=$(MY_IP) name=$NAME\"; grep SigIgn /proc/self/status; sleep 1000"],
            "env": [
                {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
            ]
        }]),
    );
    let status = h
        .sync_until(&pod, "running and ready", |s| running(s) && first(s).ready)
        .await;
    assert_eq!(status.phase, "Running");
    let ip = status.pod_ip.clone().unwrap();
    assert_eq!(ip, "127.1.10.1");
    assert!(status.start_time.is_some());
    assert_eq!(first(&status).started, Some(true));
    let pid = pid(first(&status));
    assert!(process_exists(pid));
    let text = h.log_until(&pod, "main", "name=").await;
    assert!(text.starts_with("hello\n"), "{text:?}");
    assert!(text.contains(&format!("ip={ip} name=hello")), "{text:?}");
    // No standard signal is ignored: the workload can be interrupted and terminated. (Signals
    // 32 and 33 are reserved by the C library, which will not reset them; whether they are
    // ignored depends on what started the test.)
    let text = h.log_until(&pod, "main", "SigIgn").await;
    let mask = text
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .unwrap()
        .trim();
    let mask = u64::from_str_radix(mask, 16).unwrap();
    assert_eq!(mask & 0x7fff_ffff, 0, "ignored signals: {mask:#x}");

    // Idempotent: syncing again changes nothing.
    let again = h.rt.sync_pod(&pod, &Harness::node()).await.unwrap();
    assert_eq!(again, status);
    assert_eq!(h.rt.pods().await, vec![rpod(&pod)]);

    h.rt.kill_pod(&rpod(&pod), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!process_exists(pid), "the workload survived kill_pod");
    assert!(h.rt.pods().await.is_empty());
    assert!(!h.dir.path().join("pods").join(rpod(&pod).uid).exists());
    // Killing a pod the runtime does not hold is fine.
    h.rt.kill_pod(&rpod(&pod), Duration::from_secs(1))
        .await
        .unwrap();
}

async fn http_get(ip: &str, port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect((ip, port)).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn replicas_listen_on_the_same_port_of_their_own_pod_ip() {
    let mut h = Harness::new(11);
    let server = |name: &str| {
        pod(
            name,
            "Always",
            serde_json::json!([{
                "name": "web",
                "image": "python:3",
                "command": ["python3", "-m", "http.server", "8080", "--bind", "$(POD_IP)"],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "ports": [{"name": "http", "containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
            }]),
        )
    };
    let (a, b) = (server("web-a"), server("web-b"));
    let mut ips = Vec::new();
    for p in [&a, &b] {
        let status = h.rt.sync_pod(p, &Harness::node()).await.unwrap();
        assert!(!first(&status).ready, "ready before the probe ran");
        ips.push(status.pod_ip.unwrap());
    }
    for p in [&a, &b] {
        h.sync_until(p, "readiness probe success", |s| first(s).ready)
            .await;
    }
    assert_ne!(ips[0], ips[1]);
    for ip in &ips {
        let response = http_get(ip, 8080).await;
        assert!(response.starts_with("HTTP/1.0 200"), "{ip}: {response}");
    }
    // The probe flips back when the server is gone; the container is then restarted.
    let status = h.rt.sync_pod(&a, &Harness::node()).await.unwrap();
    kill9(pid(first(&status)));
    h.sync_until(&a, "restart after kill", |s| {
        first(s).restart_count == 1 && running(s)
    })
    .await;
    for p in [&a, &b] {
        h.rt.kill_pod(&rpod(p), Duration::from_secs(5))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_killed_process_is_a_container_exit_and_restarts() {
    let mut h = Harness::new(12);
    let pod = pod(
        "victim",
        "Always",
        serde_json::json!([sh("main", "echo up; sleep 1000")]),
    );
    let status = h.sync_until(&pod, "running", running).await;
    let old = pid(first(&status));
    kill9(old);
    let status = h
        .sync_until(&pod, "restart", |s| {
            first(s).restart_count == 1 && running(s)
        })
        .await;
    let c = first(&status);
    assert_eq!(
        terminated(c.last_state.as_ref()),
        (137, "Error".to_string())
    );
    let last = c.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(
        last.container_id.as_deref(),
        Some(format!("process://{old}").as_str())
    );
    assert!(last.finished_at.as_ref().unwrap().0 >= last.started_at.as_ref().unwrap().0);
    assert_ne!(pid(c), old);
    assert!(process_exists(pid(c)));
    h.rt.kill_pod(&rpod(&pod), Duration::from_secs(5))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_crashing_container_backs_off_with_growing_delays() {
    // Delays long enough that a loaded machine still sees each back-off (0, 0.5 s, 1 s, 2 s).
    let mut opts = options(13);
    opts.backoff.base = Duration::from_millis(500);
    opts.backoff.max = Duration::from_secs(2);
    let mut h = Harness::with(opts);
    // Each run prints its number (counted in the container's scratch directory) and fails.
    let pod = pod(
        "crash",
        "Always",
        serde_json::json!([sh(
            "c",
            "n=$(cat n 2>/dev/null || echo 0); n=$((n+1)); echo $n > n; echo run $n; exit 1"
        )]),
    );
    let uid = rpod(&pod).uid;
    let mut messages = Vec::new();
    let start = Instant::now();
    loop {
        let status = h.rt.sync_pod(&pod, &Harness::node()).await.unwrap();
        let c = first(&status);
        assert_eq!(status.phase, "Running");
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            assert_eq!(w.reason.as_deref(), Some("CrashLoopBackOff"));
            let m = w.message.clone().unwrap();
            assert_eq!(terminated(c.last_state.as_ref()), (1, "Error".to_string()));
            if messages.last() != Some(&m) {
                messages.push(m);
            }
        }
        if c.restart_count >= 4 {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "too slow: {messages:?}");
        let _ = tokio::time::timeout(Duration::from_millis(100), h.rx.recv()).await;
    }
    let expect =
        |d: &str| format!("back-off {d} restarting failed container=c pod=crash_default({uid})");
    assert!(messages.contains(&expect("1s")), "{messages:?}");
    assert!(messages.contains(&expect("2s")), "{messages:?}");
    assert!(
        !messages.iter().any(|m| m.contains("back-off 0s")),
        "{messages:?}"
    );

    let status = h.rt.sync_pod(&pod, &Harness::node()).await.unwrap();
    let runs = first(&status).restart_count + 1;
    let current = h.log_until(&pod, "c", "run").await;
    let previous = h
        .log(
            &pod,
            "c",
            LogOptions {
                previous: true,
                ..Default::default()
            },
        )
        .await;
    assert_eq!(current, format!("run {runs}\n"));
    assert_eq!(previous, format!("run {}\n", runs - 1));
    h.rt.kill_pod(&rpod(&pod), Duration::from_secs(5))
        .await
        .unwrap();
}

#[tokio::test]
async fn never_policy_ends_in_succeeded_or_failed() {
    let mut h = Harness::new(14);
    let ok = pod(
        "ok",
        "Never",
        serde_json::json!([sh("a", "exit 0"), sh("b", "sleep 0.2")]),
    );
    let status = h
        .sync_until(&ok, "Succeeded", |s| s.phase == "Succeeded")
        .await;
    for c in &status.container_statuses {
        assert_eq!(terminated(c.state.as_ref()), (0, "Completed".to_string()));
        assert_eq!(c.restart_count, 0);
        assert!(!c.ready);
    }
    let bad = pod("bad", "Never", serde_json::json!([sh("a", "exit 3")]));
    let status = h.sync_until(&bad, "Failed", |s| s.phase == "Failed").await;
    assert_eq!(
        terminated(first(&status).state.as_ref()),
        (3, "Error".to_string())
    );
    // OnFailure restarts a failure but not a success.
    let once = pod(
        "once",
        "OnFailure",
        serde_json::json!([sh("a", "test -f done && exit 0; touch done; exit 1")]),
    );
    let status = h
        .sync_until(&once, "Succeeded", |s| s.phase == "Succeeded")
        .await;
    assert_eq!(first(&status).restart_count, 1);
    for p in [&ok, &bad, &once] {
        h.rt.kill_pod(&rpod(p), Duration::from_secs(1))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn kill_pod_sends_sigterm_then_sigkill_after_the_grace_period() {
    let mut h = Harness::new(15);
    let marker = h.dir.path().join("terminated");
    let polite = pod(
        "polite",
        "Always",
        serde_json::json!([sh(
            "main",
            &format!(
                "trap 'echo term > {}; exit 0' TERM; echo trapped; while :; do sleep 0.05; done",
                marker.display()
            )
        )]),
    );
    let status = h.sync_until(&polite, "running", running).await;
    // Signal only once the trap is set.
    h.log_until(&polite, "main", "trapped").await;
    let pid1 = pid(first(&status));
    let started = Instant::now();
    h.rt.kill_pod(&rpod(&polite), Duration::from_secs(20))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited for the grace period"
    );
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "term\n");
    assert!(!process_exists(pid1));

    let stubborn = pod(
        "stubborn",
        "Always",
        serde_json::json!([sh(
            "main",
            "trap '' TERM; echo trapped; while :; do sleep 0.05; done"
        )]),
    );
    let status = h.sync_until(&stubborn, "running", running).await;
    h.log_until(&stubborn, "main", "trapped").await;
    let pid2 = pid(first(&status));
    let started = Instant::now();
    h.rt.kill_pod(&rpod(&stubborn), Duration::from_secs(1))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "did not wait for the grace period: {took:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(!process_exists(pid2));
}

#[tokio::test]
async fn a_new_runtime_adopts_running_processes_and_notices_deaths() {
    let mut h = Harness::new(16);
    let starts = h.dir.path().join("starts");
    let script = format!("echo started >> {}; echo up; sleep 1000", starts.display());
    let a = pod(
        "adopted",
        "Always",
        serde_json::json!([sh("main", &script)]),
    );
    let b = pod(
        "died",
        "Always",
        serde_json::json!([sh("main", "sleep 1000")]),
    );
    // Exits with 3 when told to, which will happen while no runtime watches.
    let c = pod(
        "exits",
        "OnFailure",
        serde_json::json!([sh(
            "main",
            "while [ ! -f stop ]; do sleep 0.05; done; echo bye; exit 3"
        )]),
    );
    let sa = h.sync_until(&a, "a running", running).await;
    let sb = h.sync_until(&b, "b running", running).await;
    let sc = h.sync_until(&c, "c running", running).await;
    h.log_until(&a, "main", "up").await;
    let (pid_a, pid_b, pid_c) = (pid(first(&sa)), pid(first(&sb)), pid(first(&sc)));

    // The agent goes away; one container dies meanwhile; a new agent comes.
    let old = std::mem::replace(
        &mut h.rt,
        ProcessRuntime::with_options(h.dir.path().join("unused"), options(17)).unwrap(),
    );
    drop(old);
    kill9(pid_b);
    let c_dir = h.dir.path().join("pods").join(rpod(&c).uid);
    std::fs::write(c_dir.join("work/main/stop"), b"").unwrap();
    setpoint_testing::eventually_within(DEADLINE, "b and c to exit", || async {
        (!process_exists(pid_b) && !process_exists(pid_c)).then_some(())
    })
    .await;
    let back_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let back = k8s_openapi::jiff::Timestamp::from_millisecond(back_ms as i64).unwrap();
    h.rt = ProcessRuntime::with_options(h.dir.path(), options(16)).unwrap();
    h.rx = h.rt.subscribe();

    // Only one runtime may own a state directory.
    assert!(ProcessRuntime::with_options(h.dir.path(), options(16)).is_err());

    let mut held = h.rt.pods().await;
    held.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(held, vec![rpod(&a), rpod(&b), rpod(&c)]);

    let sa2 = h.rt.sync_pod(&a, &Harness::node()).await.unwrap();
    assert!(running(&sa2));
    assert_eq!(pid(first(&sa2)), pid_a, "not the same process");
    assert_eq!(first(&sa2).restart_count, 0);
    assert_eq!(sa2.pod_ip, sa.pod_ip);
    assert_eq!(h.log(&a, "main", LogOptions::default()).await, "up\n");

    let sb2 = h
        .sync_until(&b, "b restarted", |s| {
            first(s).restart_count == 1 && running(s)
        })
        .await;
    assert_eq!(
        terminated(first(&sb2).last_state.as_ref()),
        (137, "Error".to_string())
    );
    assert_eq!(sb2.pod_ip, sb.pod_ip);

    // The exit status written while no runtime ran is the process's own, at its own time.
    let sc2 = h
        .sync_until(&c, "c restarted", |s| first(s).restart_count >= 1)
        .await;
    let last = first(&sc2).last_state.clone();
    assert_eq!(terminated(last.as_ref()), (3, "Error".to_string()));
    let finished = last.unwrap().terminated.unwrap().finished_at.unwrap().0;
    assert!(finished <= back, "{finished} after {back}");
    let previous = LogOptions {
        previous: true,
        ..Default::default()
    };
    assert_eq!(h.log(&c, "main", previous).await, "bye\n");

    // Later syncs start nothing more.
    for _ in 0..3 {
        h.rt.sync_pod(&a, &Harness::node()).await.unwrap();
    }
    assert_eq!(std::fs::read_to_string(&starts).unwrap(), "started\n");
    for p in [&a, &b, &c] {
        h.rt.kill_pod(&rpod(p), Duration::from_secs(5))
            .await
            .unwrap();
    }
    assert!(!process_exists(pid_a));
}

#[tokio::test]
async fn an_image_only_container_is_simulated_and_says_so() {
    let mut h = Harness::new(18);
    let pod = pod(
        "nginx",
        "Always",
        serde_json::json!([{"name": "web", "image": "nginx:1.25"}]),
    );
    let status = h.sync_until(&pod, "running", running).await;
    let c = first(&status);
    assert!(c.ready);
    assert_eq!(c.image, "nginx:1.25");
    assert_eq!(c.image_id, "simulated://nginx:1.25");
    assert_eq!(status.phase, "Running");
    assert_eq!(status.reason.as_deref(), Some("SimulatedContainer"));
    assert_eq!(
        status.message.as_deref(),
        Some("container web has no command; image nginx:1.25 is not pulled or run, the container is simulated")
    );
    assert!(status.pod_ip.is_some());
    h.rt.kill_pod(&rpod(&pod), Duration::from_secs(1))
        .await
        .unwrap();

    // A hostNetwork pod has the node's address.
    let mut host = pod.clone();
    host.metadata.uid = Some(format!("{}-host", rpod(&pod).uid));
    host.spec.as_mut().unwrap().host_network = Some(true);
    let status = h.sync_until(&host, "running", running).await;
    assert_eq!(status.pod_ip.as_deref(), Some("127.0.0.1"));
    h.rt.kill_pod(&rpod(&host), Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test]
async fn liveness_failure_restarts_and_startup_gates_readiness() {
    let mut h = Harness::new(19);
    let pod = pod(
        "probed",
        "Always",
        serde_json::json!([{
            "name": "main",
            "image": "busybox",
            "command": ["sh", "-c", "sleep 0.5; touch started healthy; while :; do sleep 0.05; done"],
            "startupProbe": {"exec": {"command": ["test", "-f", "started"]}, "periodSeconds": 1, "failureThreshold": 30},
            "readinessProbe": {"exec": {"command": ["test", "-f", "healthy"]}, "periodSeconds": 1},
            "livenessProbe": {"exec": {"command": ["test", "-f", "healthy"]}, "periodSeconds": 1, "failureThreshold": 1}
        }]),
    );
    let status = h.rt.sync_pod(&pod, &Harness::node()).await.unwrap();
    assert_eq!(first(&status).started, Some(false));
    assert!(!first(&status).ready);
    let status = h
        .sync_until(&pod, "started and ready", |s| first(s).ready)
        .await;
    assert_eq!(first(&status).started, Some(true));
    // Make the container unhealthy: liveness stops it (SIGTERM, exit 143) and it restarts.
    let workdir = h
        .dir
        .path()
        .join("pods")
        .join(rpod(&pod).uid)
        .join("work/main");
    std::fs::remove_file(workdir.join("healthy")).unwrap();
    std::fs::remove_file(workdir.join("started")).unwrap();
    let status = h
        .sync_until(&pod, "liveness restart", |s| first(s).restart_count == 1)
        .await;
    assert_eq!(
        terminated(first(&status).last_state.as_ref()),
        (143, "Error".to_string())
    );
    h.rt.kill_pod(&rpod(&pod), Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test]
async fn logs_follow_tail_limit_and_timestamps() {
    let mut h = Harness::new(20);
    let pod = pod(
        "chatty",
        "Never",
        serde_json::json!([sh(
            "main",
            "for i in 1 2 3; do echo line $i; sleep 0.3; done; exit 0"
        )]),
    );
    h.sync_until(&pod, "running", running).await;
    let options = LogOptions {
        follow: true,
        ..Default::default()
    };
    let follow = h.rt.logs(&rpod(&pod), "main", &options).await.unwrap();
    let followed = tokio::time::timeout(DEADLINE, async {
        let chunks: Vec<_> = follow.collect().await;
        chunks
            .into_iter()
            .flat_map(|c| c.unwrap().to_vec())
            .collect::<Vec<u8>>()
    })
    .await
    .expect("follow did not end with the container");
    assert_eq!(
        String::from_utf8(followed).unwrap(),
        "line 1\nline 2\nline 3\n"
    );
    h.sync_until(&pod, "Succeeded", |s| s.phase == "Succeeded")
        .await;

    let tail = h
        .log(
            &pod,
            "main",
            LogOptions {
                tail_lines: Some(1),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(tail, "line 3\n");
    let limited = h
        .log(
            &pod,
            "main",
            LogOptions {
                limit_bytes: Some(8),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(limited, "line 1\nl");
    let stamped = h
        .log(
            &pod,
            "main",
            LogOptions {
                timestamps: true,
                ..Default::default()
            },
        )
        .await;
    let times: Vec<k8s_openapi::jiff::Timestamp> = stamped
        .lines()
        .map(|l| l.split_once(' ').unwrap().0.parse().unwrap())
        .collect();
    assert_eq!(times.len(), 3);
    assert!(times[0] < times[2], "{stamped}");
    let recent = h
        .log(
            &pod,
            "main",
            LogOptions {
                since_seconds: Some(600),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(recent, "line 1\nline 2\nline 3\n");
    let err =
        h.rt.logs(
            &rpod(&pod),
            "main",
            &LogOptions {
                previous: true,
                ..Default::default()
            },
        )
        .await;
    assert!(err.is_err());
    h.rt.kill_pod(&rpod(&pod), Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test]
async fn init_containers_run_in_order_before_the_app() {
    let mut h = Harness::new(21);
    let seed = h.dir.path().join("seed");
    let seed = seed.display();
    let mut good = pod(
        "init-ok",
        "Always",
        serde_json::json!([sh("app", &format!("cat {seed}; sleep 1000"))]),
    );
    good.spec.as_mut().unwrap().init_containers = serde_json::from_value(serde_json::json!([
        sh("first", &format!("sleep 0.3; echo one >> {seed}")),
        // Fails once, then succeeds: restarted as OnFailure.
        sh("second", &format!("test -f retried || {{ touch retried; exit 1; }}; echo two >> {seed}")),
        {"name": "image-only", "image": "busybox"},
    ]))
    .unwrap();
    let status = h.rt.sync_pod(&good, &Harness::node()).await.unwrap();
    assert_eq!(status.phase, "Pending");
    assert_eq!(status.reason.as_deref(), Some("PodInitializing"));
    assert!(
        status
            .message
            .as_deref()
            .unwrap()
            .starts_with("init container first (1/3) is running"),
        "{status:?}"
    );
    let app = first(&status)
        .state
        .as_ref()
        .unwrap()
        .waiting
        .as_ref()
        .unwrap();
    assert_eq!(app.reason.as_deref(), Some("PodInitializing"));

    let status = h.sync_until(&good, "app running", running).await;
    assert_eq!(status.phase, "Running");
    assert_eq!(status.reason.as_deref(), Some("SimulatedContainer"));
    assert_eq!(
        status.message.as_deref(),
        Some("init container image-only has no command; image busybox is not pulled or run, it is simulated as completed")
    );
    assert_eq!(h.log_until(&good, "app", "two").await, "one\ntwo\n");
    let previous = LogOptions {
        previous: true,
        ..Default::default()
    };
    assert_eq!(h.log(&good, "second", LogOptions::default()).await, "");
    assert!(h.rt.logs(&rpod(&good), "second", &previous).await.is_ok());
    // Completed init containers are not run again.
    h.rt.sync_pod(&good, &Harness::node()).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(h.dir.path().join("seed")).unwrap(),
        "one\ntwo\n"
    );

    let mut bad = pod(
        "init-bad",
        "Never",
        serde_json::json!([sh("app", "sleep 1000")]),
    );
    bad.spec.as_mut().unwrap().init_containers =
        Some(vec![serde_json::from_value(sh("setup", "exit 4")).unwrap()]);
    let status = h.sync_until(&bad, "Failed", |s| s.phase == "Failed").await;
    assert_eq!(status.reason.as_deref(), Some("InitContainerFailed"));
    assert_eq!(
        status.message.as_deref(),
        Some("init container setup (1/1) failed with exit code 4")
    );
    let app = first(&status)
        .state
        .as_ref()
        .unwrap()
        .waiting
        .as_ref()
        .unwrap();
    assert_eq!(app.reason.as_deref(), Some("PodInitializing"));
    for p in [&good, &bad] {
        h.rt.kill_pod(&rpod(p), Duration::from_secs(1))
            .await
            .unwrap();
    }
}

/// Runs `command` in the pod's container through the runtime's exec; returns its output.
async fn exec_output(h: &Harness, pod: &Pod, command: &[&str]) -> (i32, String) {
    use tokio::io::AsyncReadExt;
    let (writer, mut reader) = tokio::io::duplex(64 * 1024);
    let io = setpoint_node::runtime::StreamIo {
        stdout: Some(Box::new(writer)),
        ..Default::default()
    };
    let request = setpoint_node::runtime::ExecRequest {
        container: "main".into(),
        command: command.iter().map(|s| s.to_string()).collect(),
        tty: false,
    };
    let code = h.rt.exec(&rpod(pod), request, io).await.unwrap();
    let mut out = String::new();
    reader.read_to_string(&mut out).await.unwrap();
    (code, out)
}

#[tokio::test]
async fn volumes_are_mounted_in_the_containers_own_mount_namespace() {
    let mut h = Harness::new(61);
    let node_dir = h.dir.path().join("node-data");
    std::fs::create_dir_all(node_dir.join("sub")).unwrap();
    std::fs::write(node_dir.join("config.txt"), "from the node\n").unwrap();
    std::fs::write(node_dir.join("sub/item"), "one item\n").unwrap();
    // Mount points outside the runtime's state, which no mount may hide; made for the
    // container on the node and removed with the pod.
    let base = format!(
        "/run/setpoint-mounts-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    );
    let script = format!(
        "cat {base}/config/config.txt {base}/item; echo scratch > {base}/scratch/f && cat {base}/scratch/f; \
         touch {base}/config/x 2>/dev/null && echo writable || echo read-only; echo done; sleep 300"
    );
    let mut container = sh("main", &script);
    container["volumeMounts"] = serde_json::json!([
        {"name": "config", "mountPath": format!("{base}/config"), "readOnly": true},
        {"name": "config", "mountPath": format!("{base}/item"), "subPath": "sub/item"},
        {"name": "scratch", "mountPath": format!("{base}/scratch")},
    ]);
    container["readinessProbe"] = serde_json::json!({
        "exec": {"command": ["cat", format!("{base}/config/config.txt")]},
        "periodSeconds": 1,
    });
    let mut pod = pod("mounts", "Always", serde_json::json!([container]));
    pod.spec.as_mut().unwrap().volumes = Some(
        serde_json::from_value(serde_json::json!([
            {"name": "config", "hostPath": {"path": node_dir, "type": "Directory"}},
            {"name": "scratch", "emptyDir": {}},
        ]))
        .unwrap(),
    );
    if !setpoint_node::process::mounts::namespaces_permitted() {
        // Without the privilege the container is refused, never run without its files.
        let status = h
            .sync_until(&pod, "the refusal", |s| {
                first(s)
                    .state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .is_some_and(|w| w.reason.as_deref() == Some("CreateContainerConfigError"))
            })
            .await;
        let waiting = first(&status).state.clone().unwrap().waiting.unwrap();
        assert_eq!(
            waiting.message.as_deref(),
            Some(setpoint_node::process::mounts::NOT_PERMITTED)
        );
        return;
    }
    h.sync_until(&pod, "running", running).await;
    let log = h.log_until(&pod, "main", "done").await;
    assert_eq!(
        log, "from the node\none item\nscratch\nread-only\ndone\n",
        "the container's view"
    );
    // The node does not see the container's mounts: its mount points are empty there.
    let config = std::path::Path::new(&base).join("config");
    assert!(config.is_dir());
    assert_eq!(std::fs::read_dir(&config).unwrap().count(), 0);
    assert!(
        !node_dir.join("x").exists(),
        "the read-only mount was not written"
    );
    // exec and exec probes run in the container's namespace.
    let (code, out) = exec_output(&h, &pod, &["cat", &format!("{base}/config/config.txt")]).await;
    assert_eq!((code, out.as_str()), (0, "from the node\n"));
    let (code, _) = exec_output(&h, &pod, &["touch", &format!("{base}/config/y")]).await;
    assert_ne!(code, 0, "a read-only mount refuses writes from exec too");
    h.sync_until(&pod, "ready by its exec probe", |s| first(s).ready)
        .await;
    // The pod's end removes its volumes and the mount points made for it.
    h.rt.kill_pod(&rpod(&pod), Duration::from_secs(2))
        .await
        .unwrap();
    assert!(!std::path::Path::new(&base).exists(), "{base} removed");
    assert!(node_dir.join("config.txt").exists(), "a hostPath stays");
}

/// A unique directory for a test's mount points, outside the runtime's state (which no
/// mount may hide).
fn mount_base() -> String {
    format!(
        "/run/setpoint-mounts-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

/// A pod whose container `main` runs `script` with an emptyDir `scratch` (of `source`)
/// mounted at `<base>/scratch`.
fn pod_with_scratch(name: &str, base: &str, source: serde_json::Value, script: &str) -> Pod {
    let mut container = sh("main", script);
    container["volumeMounts"] =
        serde_json::json!([{"name": "scratch", "mountPath": format!("{base}/scratch")}]);
    let mut pod = pod(name, "Always", serde_json::json!([container]));
    pod.spec.as_mut().unwrap().volumes = Some(
        serde_json::from_value(serde_json::json!([{"name": "scratch", "emptyDir": source}]))
            .unwrap(),
    );
    pod
}

#[tokio::test]
async fn an_empty_dir_over_its_size_limit_evicts_the_pod() {
    if !setpoint_node::process::mounts::namespaces_permitted() {
        eprintln!("skipped: this process may not create mount namespaces");
        return;
    }
    let mut h = Harness::new(62);
    let base = mount_base();
    let pod = pod_with_scratch(
        "evicted",
        &base,
        serde_json::json!({"sizeLimit": "4Ki"}),
        &format!("head -c 65536 /dev/zero > {base}/scratch/big; echo written; sleep 300"),
    );
    h.sync_until(&pod, "running", running).await;
    h.log_until(&pod, "main", "written").await;
    let status = h
        .sync_until(&pod, "the eviction", |s| s.phase == "Failed")
        .await;
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    assert!(
        status.message.as_deref().is_some_and(
            |m| m.starts_with("Usage of EmptyDir volume \"scratch\" exceeds the limit")
        ),
        "{status:#?}"
    );
    let state = first(&status).state.as_ref().unwrap();
    assert!(
        state.terminated.is_some(),
        "killed, not restarted: {state:?}"
    );
    // And it stays so: nothing starts again.
    let again = h.rt.sync_pod(&pod, &Harness::node()).await.unwrap();
    assert_eq!(again.phase, "Failed");
    assert_eq!(first(&again).restart_count, 0);
    h.rt.kill_pod(&rpod(&pod), Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test]
async fn an_adopted_container_keeps_its_mounts_and_memory_volumes_are_not_mounted_twice() {
    if !setpoint_node::process::mounts::namespaces_permitted() {
        eprintln!("skipped: this process may not create mount namespaces");
        return;
    }
    let mut h = Harness::new(63);
    let base = mount_base();
    let pod = pod_with_scratch(
        "adopted",
        &base,
        serde_json::json!({"medium": "Memory"}),
        &format!("echo kept > {base}/scratch/f; echo written; sleep 300"),
    );
    h.sync_until(&pod, "running", running).await;
    h.log_until(&pod, "main", "written").await;
    let tmpfs_mounts = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&rpod(&pod).uid) && l.contains(" - tmpfs "))
            .count()
    };
    assert_eq!(tmpfs_mounts(), 1, "the volume's tmpfs, on the node");

    // The agent goes away and comes back over the same directory.
    let old = std::mem::replace(
        &mut h.rt,
        ProcessRuntime::with_options(h.dir.path().join("unused"), options(64)).unwrap(),
    );
    drop(old);
    h.rt = ProcessRuntime::with_options(h.dir.path(), options(63)).unwrap();
    h.rx = h.rt.subscribe();
    let status = h.sync_until(&pod, "adopted and running", running).await;
    assert_eq!(first(&status).restart_count, 0);
    h.rt.sync_pod(&pod, &Harness::node()).await.unwrap();
    assert_eq!(tmpfs_mounts(), 1, "set up again without a second tmpfs");
    let (code, out) = exec_output(&h, &pod, &["cat", &format!("{base}/scratch/f")]).await;
    assert_eq!((code, out.as_str()), (0, "kept\n"));
    h.rt.kill_pod(&rpod(&pod), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(tmpfs_mounts(), 0, "the tmpfs goes with the pod");
    assert!(!std::path::Path::new(&base).exists(), "{base} removed");
}

#[tokio::test]
async fn a_volume_that_cannot_be_set_up_keeps_the_container_creating() {
    let mut h = Harness::new(65);
    let mut events = h.rt.events().expect("the process runtime reports Events");
    let missing = h.dir.path().join("no-such-dir");
    let mut container = sh("main", "echo started; sleep 300");
    container["volumeMounts"] = serde_json::json!([{"name": "data", "mountPath": "/srv/data"}]);
    let mut pod = pod("unmounted", "Always", serde_json::json!([container]));
    pod.spec.as_mut().unwrap().volumes = Some(
        serde_json::from_value(serde_json::json!([
            {"name": "data", "hostPath": {"path": missing, "type": "Directory"}},
        ]))
        .unwrap(),
    );
    let status = h
        .sync_until(&pod, "the container waiting on its volume", |s| {
            first(s)
                .state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .is_some_and(|w| w.message.is_some())
        })
        .await;
    let waiting = first(&status).state.clone().unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
    let message = waiting.message.unwrap();
    assert!(
        message.starts_with("MountVolume.SetUp failed for volume \"data\" : "),
        "{message}"
    );
    let event = events.recv().await.unwrap();
    assert_eq!(
        (event.reason.as_str(), event.warning, &event.message),
        ("FailedMount", true, &message)
    );
    // Once the directory exists, the container starts.
    std::fs::create_dir_all(&missing).unwrap();
    if setpoint_node::process::mounts::namespaces_permitted() {
        h.sync_until(&pod, "running", running).await;
    }
    h.rt.kill_pod(&rpod(&pod), Duration::from_secs(1))
        .await
        .unwrap();
}
