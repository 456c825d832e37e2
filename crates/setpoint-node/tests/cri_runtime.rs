//! `CriRuntime` against a real, private containerd per test (skipped where containerd cannot
//! run; `SETPOINT_REQUIRE_CONTAINERD=1` makes that a failure): pods get a CNI address and
//! answer on it, containers restart after `kill -9`, exit codes and restart policies,
//! CrashLoopBackOff, init containers, image pull policies, OOM kills, adoption by a new
//! runtime and removal of everything a killed pod had.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use setpoint_node::containerd::{image, TestContainerd, BUSYBOX_IMAGE, PAUSE_IMAGE};
use setpoint_node::cri::runtime::{CriRuntime, CriRuntimeOptions};
use setpoint_node::cri::CriClient;
use setpoint_node::runtime::{LogOptions, NodeContext, PodRuntime, RuntimePod, RuntimeStatus};
use setpoint_testing::eventually_within;
use tokio::sync::mpsc;

const DEADLINE: Duration = Duration::from_secs(90);

struct Harness {
    rt: CriRuntime,
    rx: mpsc::UnboundedReceiver<String>,
    client: CriClient,
}

async fn harness(ctrd: &TestContainerd, data: &std::path::Path) -> Harness {
    harness_with(ctrd, data, |_| {}).await
}

async fn harness_with(
    ctrd: &TestContainerd,
    data: &std::path::Path,
    tune: impl FnOnce(&mut CriRuntimeOptions),
) -> Harness {
    let endpoint = ctrd.endpoint().to_string_lossy().into_owned();
    let client = CriClient::connect(&endpoint)
        .await
        .expect("connecting to CRI");
    let mut options = CriRuntimeOptions::new(data);
    options.poll_interval = Duration::from_millis(250);
    tune(&mut options);
    let rt = CriRuntime::new(client.clone(), options)
        .await
        .expect("starting the CRI runtime");
    let rx = rt.subscribe();
    Harness { rt, rx, client }
}

fn node() -> NodeContext {
    NodeContext {
        node_name: "n1".into(),
        host_ip: "127.0.0.1".into(),
        sources: None,
    }
}

fn container(name: &str, script: &str) -> Container {
    Container {
        name: name.into(),
        image: Some(BUSYBOX_IMAGE.into()),
        command: Some(vec!["sh".into(), "-c".into(), script.into()]),
        ..Default::default()
    }
}

fn pod(name: &str, policy: &str, containers: Vec<Container>) -> Pod {
    let uid = format!("{name}-{}-{}", std::process::id(), rand_suffix());
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers,
            restart_policy: Some(policy.into()),
            termination_grace_period_seconds: Some(2),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish() % 1_000_000
}

fn runtime_pod(pod: &Pod) -> RuntimePod {
    RuntimePod {
        uid: pod.metadata.uid.clone().unwrap(),
        namespace: pod.metadata.namespace.clone().unwrap(),
        name: pod.metadata.name.clone().unwrap(),
    }
}

impl Harness {
    /// Syncs the pod (again on every notification, at least every 250 ms) until `done`.
    async fn sync_until(
        &mut self,
        pod: &Pod,
        what: &str,
        done: impl Fn(&RuntimeStatus) -> bool,
    ) -> RuntimeStatus {
        let start = Instant::now();
        loop {
            let status = self.rt.sync_pod(pod, &node()).await.unwrap();
            if done(&status) {
                return status;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "timed out waiting for {what}; last status: {status:#?}"
            );
            let _ = tokio::time::timeout(Duration::from_millis(250), self.rx.recv()).await;
        }
    }

    /// The CRI objects (sandboxes, containers) that carry the pod's uid.
    async fn cri_objects(&self, uid: &str) -> (usize, usize) {
        let labels = HashMap::from([("io.kubernetes.pod.uid".to_string(), uid.to_string())]);
        let sandboxes = self.client.list_pod_sandbox(&labels).await.unwrap();
        let containers = self.client.list_containers("", &labels).await.unwrap();
        (sandboxes.len(), containers.len())
    }
}

fn running(c: &ContainerStatus) -> bool {
    c.state.as_ref().is_some_and(|s| s.running.is_some())
}

fn waiting_reason(c: &ContainerStatus) -> Option<&str> {
    c.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}

fn terminated(c: &ContainerStatus) -> Option<(i32, &str)> {
    let t = c.state.as_ref()?.terminated.as_ref()?;
    Some((t.exit_code, t.reason.as_deref().unwrap_or_default()))
}

fn last_terminated(c: &ContainerStatus) -> Option<(i32, &str)> {
    let t = c.last_state.as_ref()?.terminated.as_ref()?;
    Some((t.exit_code, t.reason.as_deref().unwrap_or_default()))
}

/// Asks `ip:port` for `/` over HTTP and returns the status line.
fn http_status_line(ip: &str, port: u16) -> std::io::Result<String> {
    let mut stream = std::net::TcpStream::connect_timeout(
        &format!("{ip}:{port}").parse().unwrap(),
        Duration::from_secs(2),
    )?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: pod\r\n\r\n")?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    Ok(answer.lines().next().unwrap_or_default().to_string())
}

/// The pid of a container's main process, from containerd's verbose status.
async fn main_pid(client: &CriClient, container_id: &str) -> i32 {
    let id = container_id.trim_start_matches("containerd://");
    let status = client.container_status(id, true).await.unwrap();
    let info: serde_json::Value =
        serde_json::from_str(status.info.get("info").expect("verbose info")).unwrap();
    info["pid"].as_i64().expect("pid in the verbose info") as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_pod_runs_restarts_after_kill_is_adopted_and_removed() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(&ctrd, data.path()).await;
    let pod = pod(
        "web",
        "Always",
        vec![container("httpd", "exec httpd -f -p 8080")],
    );
    let status = h
        .sync_until(&pod, "httpd running", |s| {
            s.phase == "Running" && s.container_statuses.first().is_some_and(running)
        })
        .await;
    let ip = status.pod_ip.clone().expect("a pod IP");
    assert!(ip.starts_with("10.222."), "CNI address expected, got {ip}");
    let c = &status.container_statuses[0];
    let id = c.container_id.clone().unwrap();
    assert!(id.starts_with("containerd://"), "{id}");
    assert!(c.image_id.starts_with("sha256:"), "{}", c.image_id);
    assert_eq!(c.restart_count, 0);
    assert_eq!(c.started, Some(true));

    // The server answers on the pod's address.
    let start = Instant::now();
    loop {
        match http_status_line(&ip, 8080) {
            Ok(line) if line.starts_with("HTTP/") => break,
            other => assert!(
                start.elapsed() < DEADLINE,
                "no HTTP answer from {ip}:8080: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // kill -9 of the main process from the host: the container restarts once.
    let pid = main_pid(&h.client, &id).await;
    // A BestEffort pod's containers are under its QoS class's cgroup.
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    assert!(
        cgroups.contains(&format!("/kubepods/besteffort/pod{uid}/")),
        "{cgroups}"
    );
    // SAFETY: a plain signal to a process of the test's own container.
    #[allow(unsafe_code)]
    let killed = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(killed, 0, "kill -9 {pid}");
    let status = h
        .sync_until(&pod, "a restart after kill -9", |s| {
            let c = &s.container_statuses[0];
            c.restart_count == 1 && running(c)
        })
        .await;
    let c = &status.container_statuses[0];
    assert_eq!(last_terminated(c).map(|t| t.0), Some(137));
    let restarted_id = c.container_id.clone().unwrap();
    assert_ne!(restarted_id, id);

    // A new runtime over the same containerd adopts the pod and starts nothing again.
    drop(h.rt);
    let mut h = harness(&ctrd, data.path()).await;
    let pods = h.rt.pods().await;
    assert!(pods.contains(&runtime_pod(&pod)), "{pods:?}");
    let status = h
        .sync_until(&pod, "adopted", |s| s.phase == "Running")
        .await;
    let c = &status.container_statuses[0];
    assert_eq!(c.restart_count, 1);
    assert_eq!(c.container_id.as_deref(), Some(restarted_id.as_str()));
    assert_eq!(status.pod_ip.as_deref(), Some(ip.as_str()));

    // kill_pod removes the sandbox and every container.
    let uid = pod.metadata.uid.clone().unwrap();
    assert_ne!(h.cri_objects(&uid).await, (0, 0));
    h.rt.kill_pod(&runtime_pod(&pod), Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(h.cri_objects(&uid).await, (0, 0));
    assert!(!h.rt.pods().await.contains(&runtime_pod(&pod)));
    // Killing it again is not an error.
    h.rt.kill_pod(&runtime_pod(&pod), Duration::from_secs(2))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_restart_policies_init_containers_and_images() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(&ctrd, data.path()).await;

    // Never: the exit stays, with its code and reason.
    let never = pod(
        "never",
        "Never",
        vec![container("c", "echo one; echo two; exit 3")],
    );
    let status = h
        .sync_until(&never, "exit 3 under Never", |s| s.phase == "Failed")
        .await;
    assert_eq!(
        terminated(&status.container_statuses[0]),
        Some((3, "Error"))
    );
    assert_eq!(status.container_statuses[0].restart_count, 0);
    // Its output, from the CRI log file.
    let logs = |options: LogOptions| {
        let rt = &h.rt;
        let never = &never;
        async move {
            let stream = rt.logs(&runtime_pod(never), "c", &options).await.unwrap();
            let chunks: Vec<_> = stream.collect().await;
            let bytes: Vec<u8> = chunks
                .into_iter()
                .flat_map(|c| c.unwrap().to_vec())
                .collect();
            String::from_utf8(bytes).unwrap()
        }
    };
    assert_eq!(logs(LogOptions::default()).await, "one\ntwo\n");
    assert_eq!(
        logs(LogOptions {
            tail_lines: Some(1),
            ..Default::default()
        })
        .await,
        "two\n"
    );

    // Following a running container's log: lines as they come, the end when it exits.
    let talker = pod(
        "talker",
        "Never",
        vec![container("c", "echo a; sleep 2; echo b")],
    );
    h.sync_until(&talker, "the talker running", |s| {
        s.container_statuses.first().is_some_and(running)
    })
    .await;
    let follow = LogOptions {
        follow: true,
        ..Default::default()
    };
    let stream =
        h.rt.logs(&runtime_pod(&talker), "c", &follow)
            .await
            .unwrap();
    let chunks: Vec<_> = tokio::time::timeout(DEADLINE, stream.collect())
        .await
        .expect("the followed log ends when the container exits");
    let followed: Vec<u8> = chunks
        .into_iter()
        .flat_map(|c| c.unwrap().to_vec())
        .collect();
    assert_eq!(String::from_utf8(followed).unwrap(), "a\nb\n");

    // Always: restarted at once, then CrashLoopBackOff after the second exit.
    let always = pod("always", "Always", vec![container("c", "exit 3")]);
    let status = h
        .sync_until(&always, "CrashLoopBackOff", |s| {
            waiting_reason(&s.container_statuses[0]) == Some("CrashLoopBackOff")
        })
        .await;
    let c = &status.container_statuses[0];
    assert_eq!(c.restart_count, 1);
    assert_eq!(last_terminated(c), Some((3, "Error")));
    let message = c
        .state
        .as_ref()
        .unwrap()
        .waiting
        .as_ref()
        .unwrap()
        .message
        .clone();
    assert!(
        message.as_deref().is_some_and(
            |m| m.starts_with("back-off 10s restarting failed container=c pod=always_default(")
        ),
        "{message:?}"
    );

    // A failing init container blocks the pod.
    let mut init = pod("init", "Always", vec![container("app", "sleep 100")]);
    init.spec.as_mut().unwrap().init_containers = Some(vec![container("setup", "exit 1")]);
    let status = h
        .sync_until(&init, "the init container crash-looping", |s| {
            s.init_container_statuses.first().and_then(waiting_reason) == Some("CrashLoopBackOff")
        })
        .await;
    assert_eq!(status.phase, "Pending");
    assert_eq!(
        last_terminated(&status.init_container_statuses[0]),
        Some((1, "Error"))
    );
    assert_eq!(
        waiting_reason(&status.container_statuses[0]),
        Some("PodInitializing")
    );

    // An absent image that may not be pulled.
    let mut absent = container("c", "true");
    absent.image = Some("setpoint.invalid/absent:1".into());
    absent.image_pull_policy = Some("Never".into());
    let never_pull = pod("neverpull", "Always", vec![absent.clone()]);
    let status = h
        .sync_until(&never_pull, "ErrImageNeverPull", |s| {
            waiting_reason(&s.container_statuses[0]) == Some("ErrImageNeverPull")
        })
        .await;
    let w = status.container_statuses[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(
        w.message.as_deref(),
        Some("Container image \"setpoint.invalid/absent:1\" is not present with pull policy of Never")
    );

    // An absent image with no registry to pull it from: ErrImagePull, then the back-off.
    absent.image_pull_policy = Some("IfNotPresent".into());
    let pull = pod("pull", "Always", vec![absent]);
    let status = h
        .sync_until(&pull, "ErrImagePull", |s| {
            waiting_reason(&s.container_statuses[0]) == Some("ErrImagePull")
        })
        .await;
    let w = status.container_statuses[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert!(
        w.message
            .as_deref()
            .is_some_and(|m| m.starts_with("Failed to pull image \"setpoint.invalid/absent:1\": ")),
        "{w:?}"
    );
    let status = h.rt.sync_pod(&pull, &node()).await.unwrap();
    assert_eq!(
        waiting_reason(&status.container_statuses[0]),
        Some("ImagePullBackOff")
    );

    // Environment from a ConfigMap this node cannot read: the container says so and waits.
    let mut wants_config = container("c", "true");
    wants_config.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
        name: "X".into(),
        value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
            config_map_key_ref: Some(k8s_openapi::api::core::v1::ConfigMapKeySelector {
                name: "cm".into(),
                key: "k".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    let configured = pod("configured", "Always", vec![wants_config]);
    let status = h.rt.sync_pod(&configured, &node()).await.unwrap();
    let w = status.container_statuses[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(w.reason.as_deref(), Some("CreateContainerConfigError"));
    assert_eq!(w.message.as_deref(), Some("this node reads no ConfigMaps"));
    assert_eq!(status.phase, "Pending");

    // runAsNonRoot with an image that runs as root: refused with the kubelet's message.
    let mut rooted = container("c", "true");
    rooted.security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
        run_as_non_root: Some(true),
        ..Default::default()
    });
    let non_root = pod("nonroot", "Always", vec![rooted]);
    let status = h.rt.sync_pod(&non_root, &node()).await.unwrap();
    let w = status.container_statuses[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(w.reason.as_deref(), Some("CreateContainerConfigError"));
    let uid = non_root.metadata.uid.clone().unwrap();
    assert_eq!(
        w.message,
        Some(format!(
            "container has runAsNonRoot and image will run as root (pod: \"nonroot_default({uid})\", container: c)"
        ))
    );

    // The runtime's default seccomp profile and a non-root user: it runs as that user.
    let mut confined = container("c", "id -u; exit 0");
    confined.security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(1234),
        seccomp_profile: Some(k8s_openapi::api::core::v1::SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    });
    let confined = pod("confined", "Never", vec![confined]);
    let status = h
        .sync_until(&confined, "the confined container done", |s| {
            s.phase == "Succeeded"
        })
        .await;
    assert_eq!(
        terminated(&status.container_statuses[0]),
        Some((0, "Completed"))
    );
    let stream =
        h.rt.logs(&runtime_pod(&confined), "c", &LogOptions::default())
            .await
            .unwrap();
    let out: Vec<u8> = stream
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .flat_map(|c| c.unwrap().to_vec())
        .collect();
    assert_eq!(String::from_utf8(out).unwrap(), "1234\n");

    for p in [
        &never,
        &talker,
        &always,
        &init,
        &never_pull,
        &pull,
        &configured,
        &non_root,
        &confined,
    ] {
        h.rt.kill_pod(&runtime_pod(p), Duration::from_secs(1))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_limit_is_enforced_with_oom_kills() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(&ctrd, data.path()).await;
    // The string doubles until it is past the 16 MiB limit.
    let mut hog = container("hog", "x=a; while :; do x=$x$x; done");
    hog.resources = Some(ResourceRequirements {
        limits: Some([("memory".to_string(), Quantity("16Mi".into()))].into()),
        ..Default::default()
    });
    let pod = pod("hog", "Always", vec![hog]);
    let status = h
        .sync_until(&pod, "an OOM kill", |s| {
            let c = &s.container_statuses[0];
            last_terminated(c).is_some_and(|t| t.1 == "OOMKilled")
                || terminated(c).is_some_and(|t| t.1 == "OOMKilled")
        })
        .await;
    let c = &status.container_statuses[0];
    assert!(c.restart_count >= 1 || terminated(c).is_some(), "{c:?}");
    let status = h
        .sync_until(&pod, "a restart after the OOM kill", |s| {
            s.container_statuses[0].restart_count >= 1
        })
        .await;
    assert!(status.container_statuses[0].restart_count >= 1);
    h.rt.kill_pod(&runtime_pod(&pod), Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_container_is_measured_from_its_cgroup() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(&ctrd, data.path()).await;
    let pod = pod(
        "busy",
        "Always",
        vec![container("burn", "while :; do :; done")],
    );
    h.sync_until(&pod, "the container running", |s| {
        running(&s.container_statuses[0])
    })
    .await;
    let uid = pod.metadata.uid.clone().unwrap();
    let rt = &h.rt;
    let measured = eventually_within(DEADLINE, "the busy container's CPU", || {
        let uid = uid.clone();
        async move {
            let stats = rt.stats().await.ok()?;
            stats
                .pods
                .into_iter()
                .find(|p| p.pod.uid == uid)
                .filter(|p| {
                    p.containers
                        .iter()
                        .any(|c| c.usage.cpu_core_nanoseconds > 0)
                })
        }
    })
    .await;
    assert_eq!(measured.pod.name, "busy");
    assert_eq!(measured.pod.namespace, "default");
    assert_eq!(measured.containers.len(), 1, "{measured:?}");
    let c = &measured.containers[0];
    assert_eq!(c.name, "burn");
    assert!(c.usage.memory_working_set_bytes > 0, "{c:?}");
    h.rt.kill_pod(&runtime_pod(&pod), Duration::from_secs(1))
        .await
        .unwrap();
}

/// The CFS quota and period of the cgroup `pid` is in: cgroup v1's `cpu` controller
/// (`cpu.cfs_quota_us`, `cpu.cfs_period_us`) or cgroup v2's `cpu.max`.
fn cpu_quota_and_period(pid: i32) -> (String, String) {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        let (Some(controllers), Some(path)) = (controllers, path) else {
            continue;
        };
        if controllers.is_empty() {
            let max = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/cpu.max")).unwrap();
            let mut words = max.split_whitespace().map(str::to_string);
            return (words.next().unwrap(), words.next().unwrap());
        }
        if controllers.split(',').any(|c| c == "cpu") {
            let dir = format!("/sys/fs/cgroup/{controllers}{path}");
            let read = |f: &str| {
                std::fs::read_to_string(format!("{dir}/{f}"))
                    .unwrap()
                    .trim()
                    .to_string()
            };
            return (read("cpu.cfs_quota_us"), read("cpu.cfs_period_us"));
        }
    }
    panic!("no cpu cgroup for {pid}: {cgroups}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_limit_is_the_container_cgroups_quota() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(&ctrd, data.path()).await;
    let mut app = container("app", "exec sleep 3600");
    let cpu: std::collections::BTreeMap<String, Quantity> = [
        ("cpu".to_string(), Quantity("250m".into())),
        ("memory".to_string(), Quantity("32Mi".into())),
    ]
    .into();
    app.resources = Some(ResourceRequirements {
        limits: Some(cpu.clone()),
        requests: Some(cpu),
        ..Default::default()
    });
    let pod = pod("cpu", "Always", vec![app]);
    let status = h
        .sync_until(&pod, "the limited container running", |s| {
            s.container_statuses.first().is_some_and(running)
        })
        .await;
    let id = status.container_statuses[0].container_id.clone().unwrap();
    let pid = main_pid(&h.client, &id).await;
    // 250m of a 100 ms period is 25 ms, as the kubelet computes the quota.
    assert_eq!(
        cpu_quota_and_period(pid),
        ("25000".to_string(), "100000".to_string())
    );
    // Requests equal to limits make the pod Guaranteed: its cgroup is right under kubepods.
    let uid = pod.metadata.uid.clone().unwrap();
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        cgroups.contains(&format!("/kubepods/pod{uid}/")),
        "{cgroups}"
    );
    h.rt.kill_pod(&runtime_pod(&pod), Duration::from_secs(1))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_sandbox_is_replaced_and_its_containers_start_again() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(&ctrd, data.path()).await;
    let mut pod = pod(
        "phoenix",
        "Always",
        vec![container("app", "trap '' TERM; sleep 1000")],
    );
    let mut proxy = container("proxy", "sleep 1000");
    proxy.restart_policy = Some("Always".into());
    pod.spec.as_mut().unwrap().init_containers = Some(vec![container("setup", "true"), proxy]);
    let status = h
        .sync_until(&pod, "running", |s| {
            s.container_statuses.first().is_some_and(running)
        })
        .await;
    assert_eq!(
        terminated(&status.init_container_statuses[0]),
        Some((0, "Completed"))
    );
    let first_id = status.container_statuses[0].container_id.clone();
    // The sidecar keeps running beside the app.
    let sidecar = &status.init_container_statuses[1];
    assert!(running(sidecar), "{sidecar:?}");
    assert_eq!(sidecar.started, Some(true));

    // The sandbox stops under the pod (its network and processes go).
    let uid = pod.metadata.uid.clone().unwrap();
    let labels = HashMap::from([("io.kubernetes.pod.uid".to_string(), uid.clone())]);
    let sandboxes = h.client.list_pod_sandbox(&labels).await.unwrap();
    assert_eq!(sandboxes.len(), 1);
    h.client.stop_pod_sandbox(&sandboxes[0].id).await.unwrap();

    // A new sandbox attempt, the init container again, then the app as its next attempt.
    let status = h
        .sync_until(&pod, "the pod running in a new sandbox", |s| {
            let c = &s.container_statuses[0];
            running(c) && c.container_id != first_id
        })
        .await;
    let c = &status.container_statuses[0];
    assert_eq!(c.restart_count, 1);
    assert!(status
        .pod_ip
        .as_deref()
        .is_some_and(|ip| ip.starts_with("10.222.")));
    let sandboxes = h.client.list_pod_sandbox(&labels).await.unwrap();
    let ready: Vec<_> = sandboxes.iter().filter(|s| s.state == 0).collect();
    assert_eq!(ready.len(), 1, "{sandboxes:?}");
    assert_eq!(ready[0].metadata.as_ref().unwrap().attempt, 1);

    // The image changed in the pod: the app is stopped and started again with it.
    let second_id = c.container_id.clone();
    let mut updated = pod.clone();
    updated.spec.as_mut().unwrap().containers[0].image = Some(PAUSE_IMAGE.into());
    let status = h
        .sync_until(&updated, "the app restarted with the new image", |s| {
            let c = &s.container_statuses[0];
            running(c) && c.container_id != second_id
        })
        .await;
    let c = &status.container_statuses[0];
    assert_eq!(c.restart_count, 2);
    assert_eq!(c.image, PAUSE_IMAGE);
    assert!(last_terminated(c).is_some(), "{c:?}");
    let pod = updated;

    // The app ignores SIGTERM: it is killed once the grace period is over.
    let start = Instant::now();
    h.rt.kill_pod(&runtime_pod(&pod), Duration::from_secs(2))
        .await
        .unwrap();
    let took = start.elapsed();
    assert!(took >= Duration::from_secs(2), "stopped after {took:?}");
    assert_eq!(h.cri_objects(&uid).await, (0, 0));
}

fn exec_probe(script: &str) -> k8s_openapi::api::core::v1::Probe {
    k8s_openapi::api::core::v1::Probe {
        exec: Some(k8s_openapi::api::core::v1::ExecAction {
            command: Some(vec!["sh".into(), "-c".into(), script.into()]),
        }),
        period_seconds: Some(1),
        failure_threshold: Some(1),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_run_in_the_container() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(&ctrd, data.path()).await;
    // Ready once the file exists, which the container writes after a while.
    let mut late = container("late", "sleep 2; echo > /tmp/ready; exec sleep 1000");
    late.readiness_probe = Some(exec_probe("test -f /tmp/ready"));
    // Its liveness check fails: stopped and restarted.
    let mut doomed = container("doomed", "exec sleep 1000");
    doomed.liveness_probe = Some(exec_probe("test -f /tmp/never"));
    let pod = pod("probed", "Always", vec![late, doomed]);
    let status = h
        .sync_until(&pod, "late running, not ready yet", |s| {
            running(&s.container_statuses[0])
        })
        .await;
    assert!(!status.container_statuses[0].ready);
    h.sync_until(&pod, "late ready", |s| s.container_statuses[0].ready)
        .await;
    h.sync_until(&pod, "doomed restarted after failing liveness", |s| {
        s.container_statuses[1].restart_count >= 1
    })
    .await;
    h.rt.kill_pod(&runtime_pod(&pod), Duration::from_secs(1))
        .await
        .unwrap();
}

/// A TCP port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `ip:port` answers HTTP.
async fn wait_http(ip: &str, port: u16) {
    let start = Instant::now();
    loop {
        match http_status_line(ip, port) {
            Ok(line) if line.starts_with("HTTP/") => return,
            other => assert!(
                start.elapsed() < DEADLINE,
                "no HTTP answer from {ip}:{port}: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_network_and_host_ports() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(&ctrd, data.path()).await;

    // hostNetwork: the node's address, and the server listens on the node itself.
    let port = free_port();
    let mut host = pod(
        "hostnet",
        "Always",
        vec![container(
            "httpd",
            &format!("exec httpd -f -p 127.0.0.1:{port}"),
        )],
    );
    host.spec.as_mut().unwrap().host_network = Some(true);
    let status = h
        .sync_until(&host, "the host-network server running", |s| {
            s.container_statuses.first().is_some_and(running)
        })
        .await;
    assert_eq!(status.pod_ip.as_deref(), Some("127.0.0.1"));
    wait_http("127.0.0.1", port).await;

    // hostPort: the node's port leads to the pod's.
    let host_port = free_port();
    let mut web = container("httpd", "exec httpd -f -p 8080");
    web.ports = Some(vec![k8s_openapi::api::core::v1::ContainerPort {
        container_port: 8080,
        host_port: Some(i32::from(host_port)),
        ..Default::default()
    }]);
    let mapped = pod("mapped", "Always", vec![web]);
    let status = h
        .sync_until(&mapped, "the mapped server running", |s| {
            s.container_statuses.first().is_some_and(running)
        })
        .await;
    let gateway = ctrd.subnet().trim_end_matches(".0/24").to_string() + ".1";
    wait_http(status.pod_ip.as_deref().unwrap(), 8080).await;
    wait_http(&gateway, host_port).await;

    for p in [&host, &mapped] {
        h.rt.kill_pod(&runtime_pod(p), Duration::from_secs(1))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_logs_are_rotated_keeping_a_number_of_files() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut h = harness_with(&ctrd, data.path(), |o| {
        o.log_max_bytes = 2048;
        o.log_max_files = 2;
        o.log_check_interval = Duration::from_millis(200);
    })
    .await;
    let chatty = pod(
        "chatty",
        "Always",
        vec![container(
            "c",
            "i=0; while :; do j=0; while [ $j -lt 20 ]; do echo line-$i-$j-................................; j=$((j+1)); done; i=$((i+1)); sleep 1; done",
        )],
    );
    h.sync_until(&chatty, "running", |s| {
        s.container_statuses.first().is_some_and(running)
    })
    .await;
    let (ns, name, uid) = ("default", "chatty", chatty.metadata.uid.clone().unwrap());
    let dir = data
        .path()
        .join("pods")
        .join(format!("{ns}_{name}_{uid}"))
        .join("c");
    let rotated = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("0.log."))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    // Following goes on across rotations.
    let follow = LogOptions {
        follow: true,
        ..Default::default()
    };
    let mut stream =
        h.rt.logs(&runtime_pod(&chatty), "c", &follow)
            .await
            .unwrap();
    let mut seen = String::new();
    let followed = tokio::time::timeout(DEADLINE, async {
        while let Some(chunk) = stream.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if seen.contains("line-6-") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(followed, Ok(true), "followed: {seen}");
    drop(stream);

    // A first rotation, then a later one that removed it: one rotated file is kept.
    let start = Instant::now();
    let first = loop {
        if let Some(n) = rotated().first() {
            break n.clone();
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no rotation in {}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    loop {
        let now = rotated();
        if now.len() == 1 && now[0] != first {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "rotated files: {now:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The live file is still the container's log.
    let stream =
        h.rt.logs(&runtime_pod(&chatty), "c", &LogOptions::default())
            .await
            .unwrap();
    let chunks: Vec<_> = stream.collect().await;
    let text: Vec<u8> = chunks
        .into_iter()
        .flat_map(|c| c.unwrap().to_vec())
        .collect();
    let text = String::from_utf8(text).unwrap();
    assert!(text.lines().all(|l| l.starts_with("line-")), "{text}");
    h.rt.kill_pod(&runtime_pod(&chatty), Duration::from_secs(1))
        .await
        .unwrap();
}

fn exec_hook(script: &str) -> k8s_openapi::api::core::v1::LifecycleHandler {
    k8s_openapi::api::core::v1::LifecycleHandler {
        exec: Some(k8s_openapi::api::core::v1::ExecAction {
            command: Some(vec!["sh".into(), "-c".into(), script.into()]),
        }),
        ..Default::default()
    }
}

/// The next Event the runtime reports, within the deadline.
async fn next_event(
    events: &mut mpsc::UnboundedReceiver<setpoint_node::runtime::RuntimeEvent>,
) -> setpoint_node::runtime::RuntimeEvent {
    tokio::time::timeout(DEADLINE, events.recv())
        .await
        .expect("an event within the deadline")
        .expect("the runtime's event channel is open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_hooks_run_in_the_container_and_around_the_stop() {
    use k8s_openapi::api::core::v1::{HTTPGetAction, Lifecycle};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(&ctrd, data.path()).await;
    let mut events = h.rt.events().expect("the CRI runtime reports events");

    // postStart writes a file in the container; preStop calls a server on the host.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (got_tx, mut got) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = vec![0; 2048];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let _ = got_tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await;
        }
    });
    let mut hooked = container("hooked", "exec sleep 1000");
    hooked.lifecycle = Some(Lifecycle {
        post_start: Some(exec_hook("echo from-post-start > /tmp/hook")),
        pre_stop: Some(k8s_openapi::api::core::v1::LifecycleHandler {
            http_get: Some(HTTPGetAction {
                host: Some("127.0.0.1".into()),
                path: Some("/bye".into()),
                port: IntOrString::Int(i32::from(port)),
                ..Default::default()
            }),
            ..Default::default()
        }),
    });
    let good = pod("hooked", "Always", vec![hooked]);
    let status = h
        .sync_until(&good, "hooked running", |s| {
            running(&s.container_statuses[0])
        })
        .await;
    let id = status.container_statuses[0]
        .container_id
        .clone()
        .unwrap()
        .rsplit("://")
        .next()
        .unwrap()
        .to_string();
    let out = h
        .client
        .exec_sync(&id, vec!["cat".into(), "/tmp/hook".into()], None)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from-post-start\n");
    h.rt.kill_pod(&runtime_pod(&good), Duration::from_secs(5))
        .await
        .unwrap();
    let request = tokio::time::timeout(DEADLINE, got.recv())
        .await
        .expect("the preStop request within the deadline")
        .unwrap();
    assert!(request.starts_with("GET /bye HTTP/1.1"), "{request}");

    // A failing postStart kills the run: the container waits with the hook's message, an
    // Event says so, and the container restarts.
    let mut failing = container("failing", "exec sleep 1000");
    failing.lifecycle = Some(Lifecycle {
        post_start: Some(exec_hook("echo no-good >&2; exit 3")),
        pre_stop: Some(exec_hook("exit 1")),
    });
    let bad = pod("hookfail", "Always", vec![failing]);
    let (uid, name) = (
        bad.metadata.uid.clone().unwrap(),
        bad.metadata.name.clone().unwrap(),
    );
    let status = h
        .sync_until(&bad, "the postStart failure reported", |s| {
            waiting_reason(&s.container_statuses[0]) == Some("PostStartHookError")
        })
        .await;
    let message = status.container_statuses[0]
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.message.clone())
        .unwrap();
    assert!(
        message.starts_with(&format!(
            "Exec lifecycle hook ([sh -c echo no-good >&2; exit 3]) for Container \"failing\" in Pod \"{name}_default({uid})\" failed - error: command 'sh -c echo no-good >&2; exit 3' exited with 3: no-good"
        )),
        "{message}"
    );
    // The run was stopped with its preStop hook, which failed too.
    let mut reasons = Vec::new();
    while reasons.len() < 3 {
        let e = next_event(&mut events).await;
        assert_eq!(e.pod.uid, uid);
        assert_eq!(e.field_path.as_deref(), Some("spec.containers{failing}"));
        reasons.push((e.reason, e.message, e.warning));
    }
    let expected = |r: &str, m: &str, w: bool| (r.to_string(), m.to_string(), w);
    assert!(reasons.contains(&expected(
        "FailedPostStartHook",
        "PostStartHook failed",
        true
    )));
    assert!(reasons.contains(&expected("Killing", "FailedPostStartHook", false)));
    assert!(reasons.contains(&expected("FailedPreStopHook", "PreStopHook failed", true)));
    h.sync_until(&bad, "restarted after the hook failure", |s| {
        s.container_statuses[0].restart_count >= 1
    })
    .await;
    h.rt.kill_pod(&runtime_pod(&bad), Duration::from_secs(1))
        .await
        .unwrap();
}

/// Secrets from a fixed set, as the agent's API reader would give them.
struct FixedSecrets(Vec<k8s_openapi::api::core::v1::Secret>);

impl setpoint_node::runtime::ObjectSource for FixedSecrets {
    fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> setpoint_node::runtime::SourceFuture<Option<k8s_openapi::api::core::v1::Secret>> {
        let found = self
            .0
            .iter()
            .find(|s| {
                s.metadata.namespace.as_deref() == Some(namespace)
                    && s.metadata.name.as_deref() == Some(name)
            })
            .cloned();
        Box::pin(async move { Ok(found) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_pull_secrets_reach_the_registry() {
    use base64::Engine;
    use k8s_openapi::api::core::v1::{LocalObjectReference, Secret};
    use k8s_openapi::ByteString;
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(&ctrd, data.path()).await;

    // A registry that asks for basic credentials and records the ones it gets, then says
    // the image is not there.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen_tx, mut seen) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = listener.accept().await {
            let seen_tx = seen_tx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                let auth = request
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("Authorization: ")
                            .or_else(|| l.strip_prefix("authorization: "))
                    })
                    .map(str::to_string);
                let reply = match auth {
                    Some(a) => {
                        let _ = seen_tx.send(a);
                        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    }
                    None => "HTTP/1.1 401 Unauthorized\r\nwww-authenticate: Basic realm=\"test\"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                };
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    let registry = format!("127.0.0.1:{port}");
    let password = "s3cret-pa55word";
    let config = serde_json::json!({
        "auths": {
            format!("http://{registry}"): {"username": "puller", "password": password}
        }
    });
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("regcred".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some(
            [(
                ".dockerconfigjson".to_string(),
                ByteString(config.to_string().into_bytes()),
            )]
            .into(),
        ),
        ..Default::default()
    };
    let node = NodeContext {
        sources: Some(setpoint_node::runtime::Sources(std::sync::Arc::new(
            FixedSecrets(vec![secret]),
        ))),
        ..node()
    };
    let mut c = container("private", "true");
    c.image = Some(format!("{registry}/team/private:1"));
    let mut private = pod("private", "Always", vec![c]);
    private.spec.as_mut().unwrap().image_pull_secrets = Some(vec![LocalObjectReference {
        name: "regcred".into(),
    }]);
    let start = Instant::now();
    let status = loop {
        let status = h.rt.sync_pod(&private, &node).await.unwrap();
        if waiting_reason(&status.container_statuses[0]) == Some("ErrImagePull") {
            break status;
        }
        assert!(start.elapsed() < DEADLINE, "no ErrImagePull: {status:#?}");
        let _ = tokio::time::timeout(Duration::from_millis(250), h.rx.recv()).await;
    };
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("puller:{password}"))
    );
    let got = tokio::time::timeout(DEADLINE, seen.recv())
        .await
        .expect("the registry saw credentials")
        .unwrap();
    assert_eq!(got, expected);
    let message = status.container_statuses[0]
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.message.clone())
        .unwrap();
    assert!(
        message.starts_with(&format!(
            "Failed to pull image \"{registry}/team/private:1\": "
        )),
        "{message}"
    );
    assert!(!message.contains(password), "{message}");
    assert!(!message.contains("not used"), "{message}");
    h.rt.kill_pod(&runtime_pod(&private), Duration::from_secs(1))
        .await
        .unwrap();
}

/// An image the image-collection test imports and nothing uses.
const UNUSED_IMAGE: &str = "setpoint.local/unused:1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_images_are_collected_over_the_threshold() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    // The pod starts first, on a runtime that collects nothing yet: busybox is unused
    // until then.
    let mut h = harness(&ctrd, data.path()).await;
    let user = pod("user", "Always", vec![container("c", "exec sleep 1000")]);
    h.sync_until(&user, "running", |s| running(&s.container_statuses[0]))
        .await;
    // The node's images for status.images: both local images, named, largest first.
    let images = h.rt.images().await.expect("a CRI node has images");
    let named = |name: &str| {
        images
            .iter()
            .any(|i| i.names.iter().flatten().any(|n| n == name))
    };
    assert!(named(BUSYBOX_IMAGE) && named(PAUSE_IMAGE), "{images:?}");
    assert!(images.iter().all(|i| i.size_bytes.unwrap_or(0) > 0));
    assert!(images
        .windows(2)
        .all(|w| w[0].size_bytes >= w[1].size_bytes));
    drop(h);
    // An image nothing uses (busybox's root with a config of its own, so an id of its own):
    // its removal shows a collection round has run.
    let (busybox, applets) = image::host_busybox().unwrap();
    let archive = image::oci_archive(&image::ImageSpec {
        name: UNUSED_IMAGE.into(),
        config: image::RunConfig {
            cmd: vec!["true".into()],
            ..Default::default()
        },
        entries: image::busybox_rootfs(&busybox, &applets),
    })
    .unwrap();
    let archive_path = data.path().join("unused.tar");
    std::fs::write(&archive_path, &archive.bytes).unwrap();
    image::import_archive(ctrd.endpoint(), &archive_path)
        .await
        .unwrap();
    // A new runtime adopts it, with thresholds of 0 %: the filesystem is always "full", so
    // every unused image goes.
    let mut h = harness_with(&ctrd, data.path(), |o| {
        o.image_gc_high_threshold = 0;
        o.image_gc_low_threshold = 0;
        o.image_minimum_age = Duration::ZERO;
        o.image_gc_interval = Duration::from_millis(250);
    })
    .await;
    let present = |client: CriClient, image: &'static str| async move {
        client
            .image_status(setpoint_node::cri::api::ImageSpec {
                image: image.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .is_some()
    };
    h.sync_until(&user, "adopted", |s| running(&s.container_statuses[0]))
        .await;
    // Once a round has collected the unused image, the image in use and the sandbox image
    // are still there.
    let client = h.client.clone();
    eventually_within(DEADLINE, "the unused image collected", || {
        let client = client.clone();
        async move { (!present(client, UNUSED_IMAGE).await).then_some(()) }
    })
    .await;
    assert!(present(h.client.clone(), BUSYBOX_IMAGE).await);
    assert!(present(h.client.clone(), PAUSE_IMAGE).await);
    h.rt.kill_pod(&runtime_pod(&user), Duration::from_secs(1))
        .await
        .unwrap();
    eventually_within(DEADLINE, "busybox collected once unused", || {
        let client = client.clone();
        async move { (!present(client, BUSYBOX_IMAGE).await).then_some(()) }
    })
    .await;
    assert!(present(h.client.clone(), PAUSE_IMAGE).await);
}
