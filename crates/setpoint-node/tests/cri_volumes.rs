//! Volumes of `CriRuntime` pods against a real, private containerd per test (skipped where
//! containerd cannot run; `SETPOINT_REQUIRE_CONTAINERD=1` makes that a failure): ConfigMap,
//! Secret and downwardAPI files inside the container, a ConfigMap edit reaching the running
//! container through `..data` while a `subPath` mount keeps the old file, a missing
//! ConfigMap holding the container back with the kubelet's message, an emptyDir over its
//! `sizeLimit` evicting the pod, and the volumes of pods gone while the agent was down
//! removed when it starts.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerStatus, DownwardAPIVolumeFile,
    DownwardAPIVolumeSource, EmptyDirVolumeSource, ObjectFieldSelector, Pod, PodSpec, Secret,
    SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use parking_lot::Mutex;
use setpoint_node::containerd::{TestContainerd, BUSYBOX_IMAGE};
use setpoint_node::cri::runtime::{CriRuntime, CriRuntimeOptions};
use setpoint_node::cri::CriClient;
use setpoint_node::runtime::{
    NodeContext, ObjectSource, PodRuntime, RuntimeEvent, RuntimePod, RuntimeStatus, SourceFuture,
    Sources,
};
use tokio::sync::mpsc;

const DEADLINE: Duration = Duration::from_secs(90);

/// ConfigMaps and Secrets from maps the test edits, as the agent's API reader gives them.
#[derive(Default)]
struct Objects {
    config_maps: Mutex<BTreeMap<String, ConfigMap>>,
    secrets: Mutex<BTreeMap<String, Secret>>,
}

impl ObjectSource for Objects {
    fn secret(&self, _namespace: &str, name: &str) -> SourceFuture<Option<Secret>> {
        let found = self.secrets.lock().get(name).cloned();
        Box::pin(async move { Ok(found) })
    }

    fn config_map(&self, _namespace: &str, name: &str) -> SourceFuture<Option<ConfigMap>> {
        let found = self.config_maps.lock().get(name).cloned();
        Box::pin(async move { Ok(found) })
    }

    fn services(&self, _namespace: &str) -> SourceFuture<Vec<k8s_openapi::api::core::v1::Service>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

struct Harness {
    rt: CriRuntime,
    rx: mpsc::UnboundedReceiver<String>,
    events: mpsc::UnboundedReceiver<RuntimeEvent>,
    client: CriClient,
    node: NodeContext,
}

async fn harness(ctrd: &TestContainerd, data: &std::path::Path, objects: Arc<Objects>) -> Harness {
    let endpoint = ctrd.endpoint().to_string_lossy().into_owned();
    let client = CriClient::connect(&endpoint)
        .await
        .expect("connecting to CRI");
    let mut options = CriRuntimeOptions::new(data);
    options.poll_interval = Duration::from_millis(250);
    let rt = CriRuntime::new(client.clone(), options)
        .await
        .expect("starting the CRI runtime");
    let rx = rt.subscribe();
    let events = rt.events().expect("the CRI runtime reports events");
    let node = NodeContext {
        node_name: "n1".into(),
        host_ip: "127.0.0.1".into(),
        sources: Some(Sources(objects)),
    };
    Harness {
        rt,
        rx,
        events,
        client,
        node,
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
            let status = self.rt.sync_pod(pod, &self.node).await.unwrap();
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

    /// Runs `sh -c script` in the container; its stdout, or a panic with its stderr.
    async fn run(&self, container_id: &str, script: &str) -> Result<String, String> {
        let id = container_id.trim_start_matches("containerd://");
        let argv = vec!["sh".to_string(), "-c".to_string(), script.to_string()];
        let out = self
            .client
            .exec_sync(id, argv, Some(Duration::from_secs(10)))
            .await
            .unwrap();
        if out.exit_code == 0 {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

fn running(c: &ContainerStatus) -> bool {
    c.state.as_ref().is_some_and(|s| s.running.is_some())
}

fn waiting(c: &ContainerStatus) -> Option<(&str, &str)> {
    let w = c.state.as_ref()?.waiting.as_ref()?;
    Some((
        w.reason.as_deref().unwrap_or_default(),
        w.message.as_deref().unwrap_or_default(),
    ))
}

fn unique(name: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    format!("{name}-{}-{}", std::process::id(), h.finish() % 1_000_000)
}

fn mount(volume: &str, at: &str) -> VolumeMount {
    VolumeMount {
        name: volume.into(),
        mount_path: at.into(),
        ..Default::default()
    }
}

fn pod(name: &str, volumes: Vec<Volume>, mounts: Vec<VolumeMount>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(unique(name)),
            labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some(BUSYBOX_IMAGE.into()),
                command: Some(vec!["sleep".into(), "3600".into()]),
                volume_mounts: Some(mounts),
                ..Default::default()
            }],
            volumes: Some(volumes),
            restart_policy: Some("Always".into()),
            termination_grace_period_seconds: Some(1),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn config_map(greeting: &str) -> ConfigMap {
    ConfigMap {
        data: Some(BTreeMap::from([(
            "greeting".to_string(),
            greeting.to_string(),
        )])),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_map_secret_and_downward_files_reach_the_container_and_follow_edits() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let objects = Arc::new(Objects::default());
    objects.secrets.lock().insert(
        "creds".into(),
        Secret {
            data: Some(BTreeMap::from([(
                "password".to_string(),
                ByteString(b"s3cret".to_vec()),
            )])),
            ..Default::default()
        },
    );
    let mut h = harness(&ctrd, data.path(), objects.clone()).await;
    let volumes = vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: "app-config".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "creds".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("creds".into()),
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "podinfo".into(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: "labels".into(),
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.labels".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    let mut pinned = mount("config", "/etc/greeting.txt");
    pinned.sub_path = Some("greeting".into());
    let pod = pod(
        "volumes",
        volumes,
        vec![
            mount("config", "/etc/app"),
            pinned,
            mount("creds", "/etc/creds"),
            mount("podinfo", "/etc/podinfo"),
        ],
    );
    let uid = pod.metadata.uid.clone().unwrap();

    // No ConfigMap yet: the container waits with the kubelet's message, and the runtime
    // reports FailedMount.
    let expected =
        "MountVolume.SetUp failed for volume \"config\" : configmap \"app-config\" not found";
    let status = h
        .sync_until(&pod, "the missing ConfigMap reported", |s| {
            s.container_statuses
                .first()
                .and_then(waiting)
                .is_some_and(|w| w.1 == expected)
        })
        .await;
    assert_eq!(
        waiting(&status.container_statuses[0]).unwrap().0,
        "ContainerCreating"
    );
    let event = h.events.recv().await.unwrap();
    assert_eq!(
        (event.reason.as_str(), event.message.as_str()),
        ("FailedMount", expected)
    );
    assert!(event.warning);

    // Once it exists the container starts with every file.
    objects
        .config_maps
        .lock()
        .insert("app-config".into(), config_map("hello"));
    let status = h
        .sync_until(&pod, "running with its volumes", |s| {
            s.container_statuses.first().is_some_and(running)
        })
        .await;
    let id = status.container_statuses[0].container_id.clone().unwrap();
    assert_eq!(h.run(&id, "cat /etc/app/greeting").await.unwrap(), "hello");
    assert_eq!(h.run(&id, "cat /etc/greeting.txt").await.unwrap(), "hello");
    assert_eq!(
        h.run(&id, "cat /etc/creds/password").await.unwrap(),
        "s3cret"
    );
    assert_eq!(
        h.run(&id, "stat -L -c %a /etc/creds/password")
            .await
            .unwrap()
            .trim(),
        "400"
    );
    assert_eq!(
        h.run(&id, "cat /etc/podinfo/labels").await.unwrap(),
        "app=\"web\""
    );
    assert_eq!(
        h.run(&id, "readlink /etc/app/greeting")
            .await
            .unwrap()
            .trim(),
        "..data/greeting"
    );
    // ConfigMap volumes are read-only.
    assert!(h.run(&id, "touch /etc/app/new").await.is_err());
    let first_data = h.run(&id, "readlink /etc/app/..data").await.unwrap();

    // An edit reaches the running container at the next sync, through a new `..data`; the
    // subPath mount keeps the file it was created with, as upstream's.
    objects
        .config_maps
        .lock()
        .insert("app-config".into(), config_map("bye"));
    h.rt.sync_pod(&pod, &h.node).await.unwrap();
    assert_eq!(h.run(&id, "cat /etc/app/greeting").await.unwrap(), "bye");
    assert_ne!(
        h.run(&id, "readlink /etc/app/..data").await.unwrap(),
        first_data
    );
    assert_eq!(h.run(&id, "cat /etc/greeting.txt").await.unwrap(), "hello");
    // The container was not restarted for it.
    let status = h.rt.sync_pod(&pod, &h.node).await.unwrap();
    assert_eq!(status.container_statuses[0].restart_count, 0);
    assert_eq!(
        status.container_statuses[0].container_id.as_deref(),
        Some(id.as_str())
    );

    // The pod's volumes go with it.
    let volumes = data.path().join("pods").join(&uid).join("volumes");
    assert!(volumes
        .join("kubernetes.io~configmap/config/..data")
        .exists());
    let runtime_pod = RuntimePod {
        uid: uid.clone(),
        namespace: "default".into(),
        name: "volumes".into(),
    };
    h.rt.kill_pod(&runtime_pod, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(!data.path().join("pods").join(&uid).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_of_pods_gone_while_the_agent_was_down_are_removed_at_start() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let orphan = data
        .path()
        .join("pods/gone-uid/volumes/kubernetes.io~configmap/config");
    std::fs::create_dir_all(&orphan).unwrap();
    std::fs::write(orphan.join("key"), "stale").unwrap();
    // A pod's log directory sits beside it and is not a pod's volumes.
    let logs = data.path().join("pods/default_web_gone-uid");
    std::fs::create_dir_all(&logs).unwrap();
    let _h = harness(&ctrd, data.path(), Arc::new(Objects::default())).await;
    assert!(!data.path().join("pods/gone-uid").exists());
    assert!(logs.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_dir_over_its_size_limit_evicts_the_pod() {
    let Some(ctrd) = TestContainerd::start().await else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let mut h = harness(&ctrd, data.path(), Arc::new(Objects::default())).await;
    let volumes = vec![Volume {
        name: "scratch".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity("1Mi".into())),
            ..Default::default()
        }),
        ..Default::default()
    }];
    let mut pod = pod("filler", volumes, vec![mount("scratch", "/scratch")]);
    pod.spec.as_mut().unwrap().containers[0].command = Some(vec![
        "sh".into(),
        "-c".into(),
        "dd if=/dev/zero of=/scratch/fill bs=1024 count=2048 && exec sleep 3600".into(),
    ]);
    let status = h
        .sync_until(&pod, "the eviction", |s| s.phase == "Failed")
        .await;
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        status.message.as_deref(),
        Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ")
    );
    // The container was killed and not started again.
    let c = &status.container_statuses[0];
    assert!(
        c.state.as_ref().is_some_and(|s| s.terminated.is_some()),
        "{c:#?}"
    );
    let evicted = loop {
        let e = h.events.recv().await.unwrap();
        if e.reason == "Evicted" {
            break e;
        }
    };
    assert_eq!(evicted.message, status.message.clone().unwrap());
    let labels = HashMap::from([(
        "io.kubernetes.pod.uid".to_string(),
        pod.metadata.uid.clone().unwrap(),
    )]);
    let containers = h.client.list_containers("", &labels).await.unwrap();
    assert_eq!(containers.len(), 1, "{containers:#?}");
}
