//! `CriClient` against a real containerd: a private one per test (`TestContainerd`, with the
//! local busybox and pause images imported and a CNI bridge network). Skipped, with the reason
//! printed, where containerd cannot run (not root, containerd, runc, the CNI plugins or a
//! static busybox missing); with `SETPOINT_REQUIRE_CONTAINERD=1` that fails instead.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use setpoint_node::containerd::{TestContainerd, BUSYBOX_IMAGE, PAUSE_IMAGE};
use setpoint_node::cri::api::{
    ContainerConfig, ContainerMetadata, ContainerState, ExecRequest, ImageSpec,
    LinuxPodSandboxConfig, PodSandboxConfig, PodSandboxMetadata, PodSandboxState,
};
use setpoint_node::cri::client::Code;
use setpoint_node::cri::{CriClient, CriError, CriOptions};

const OPTIONS: CriOptions = CriOptions {
    request_timeout: Duration::from_secs(60),
    pull_timeout: Duration::from_secs(60),
    connect_timeout: Duration::from_secs(5),
};

fn image(name: &str) -> ImageSpec {
    ImageSpec {
        image: name.to_string(),
        ..Default::default()
    }
}

/// Connects once containerd's CRI plugin answers.
async fn connect(containerd: &TestContainerd) -> CriClient {
    let endpoint = format!("unix://{}", containerd.endpoint().display());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let attempt = match CriClient::connect_with(&endpoint, OPTIONS).await {
            Ok(client) => client.version().await.map(|_| client),
            Err(e) => Err(e),
        };
        match attempt {
            Ok(client) => return client,
            Err(e) if Instant::now() > deadline => panic!("containerd does not serve CRI: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Waits until the container is in `state`.
async fn wait_for_state(client: &CriClient, id: &str, state: ContainerState) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = client
            .container_status(id, false)
            .await
            .unwrap()
            .status
            .expect("a container status");
        if status.state == state as i32 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "container {id} is not {state:?} after 60 s: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_and_image_services() {
    let Some(containerd) = TestContainerd::start().await else {
        return;
    };
    let client = connect(&containerd).await;

    // Version: containerd, speaking CRI v1.
    let version = client.version().await.unwrap();
    assert_eq!(version.runtime_name, "containerd", "{version:?}");
    assert_eq!(version.runtime_api_version, "v1", "{version:?}");
    assert!(!version.runtime_version.is_empty(), "{version:?}");

    // Status: the runtime is ready.
    let status = client.status(false).await.unwrap();
    let conditions = status.status.expect("a runtime status").conditions;
    let runtime_ready = conditions
        .iter()
        .find(|c| c.r#type == "RuntimeReady")
        .unwrap_or_else(|| panic!("no RuntimeReady condition: {conditions:?}"));
    assert!(runtime_ready.status, "{runtime_ready:?}");

    // Images: the two local ones are listed and have a status; an absent one has none.
    let images = client.list_images(None).await.unwrap();
    for name in [BUSYBOX_IMAGE, PAUSE_IMAGE] {
        assert!(
            images.iter().any(|i| i.repo_tags.iter().any(|t| t == name)),
            "{name} not in {images:?}"
        );
    }
    let busybox = client.image_status(image(BUSYBOX_IMAGE)).await.unwrap();
    let busybox = busybox.expect("busybox's status");
    assert!(busybox.id.starts_with("sha256:"), "{busybox:?}");
    let absent = client
        .image_status(image("setpoint.invalid/absent:1"))
        .await
        .unwrap();
    assert!(absent.is_none(), "{absent:?}");
    let fs = client.image_fs_info().await.unwrap();
    assert!(!fs.image_filesystems.is_empty(), "{fs:?}");

    // A pull from a registry that cannot be reached fails, saying so.
    let error = client
        .pull_image(image("setpoint.invalid/busybox:1"), None, None)
        .await
        .unwrap_err();
    assert_eq!(error.code(), Code::Unknown, "{error}");
    let message = error.message();
    assert!(
        message.contains("failed to pull and unpack image")
            && message.contains("setpoint.invalid/busybox:1")
            && message.contains("failed to resolve reference"),
        "{message}"
    );

    // containerd 1.6 makes removing an unknown container a no-op (idempotent, as the CRI
    // asks), while the status of an unknown container or sandbox is NotFound.
    client.remove_container("nope").await.unwrap();
    let error = client.container_status("nope", false).await.unwrap_err();
    assert!(error.is_not_found(), "{error}");
    let error = client.pod_sandbox_status("nope", false).await.unwrap_err();
    assert!(error.is_not_found(), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_and_containers() {
    let Some(containerd) = TestContainerd::start().await else {
        return;
    };
    let client = connect(&containerd).await;
    let logs = tempfile::tempdir().unwrap();
    let labels: HashMap<String, String> =
        [("setpoint.test/case".to_string(), "cri-client".to_string())].into();

    let sandbox_config = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "cri-client".into(),
            uid: format!("cri-client-{}", std::process::id()),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "cri-client".into(),
        log_directory: logs.path().display().to_string(),
        labels: labels.clone(),
        linux: Some(LinuxPodSandboxConfig::default()),
        ..Default::default()
    };
    let sandbox = client
        .run_pod_sandbox(sandbox_config.clone(), "")
        .await
        .unwrap();

    let listed = client.list_pod_sandbox(&labels).await.unwrap();
    assert_eq!(
        listed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        [sandbox.as_str()]
    );
    let status = client
        .pod_sandbox_status(&sandbox, false)
        .await
        .unwrap()
        .status
        .expect("a sandbox status");
    assert_eq!(
        status.state,
        PodSandboxState::SandboxReady as i32,
        "{status:?}"
    );
    let ip = status
        .network
        .as_ref()
        .map(|n| n.ip.clone())
        .unwrap_or_default();
    let prefix = containerd.subnet().trim_end_matches("0/24");
    assert!(
        ip.starts_with(prefix),
        "{ip} not in {}",
        containerd.subnet()
    );

    let container = |name: &str, script: &str| ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(image(BUSYBOX_IMAGE)),
        command: vec!["sh".into(), "-c".into(), script.into()],
        log_path: format!("{name}/0.log"),
        labels: labels.clone(),
        ..Default::default()
    };

    // A container that prints and exits 0.
    let echo = client
        .create_container(
            &sandbox,
            container("echo", "echo hi"),
            sandbox_config.clone(),
        )
        .await
        .unwrap();
    client.start_container(&echo).await.unwrap();
    wait_for_state(&client, &echo, ContainerState::ContainerExited).await;
    let status = client
        .container_status(&echo, false)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.exit_code, 0, "{status:?}");
    assert!(status.finished_at > 0, "{status:?}");
    // The CRI log format: `<time> stdout F hi`.
    let log = std::fs::read_to_string(logs.path().join("echo/0.log")).unwrap();
    assert!(log.trim_end().ends_with(" stdout F hi"), "{log:?}");

    // A running container to exec in.
    let sleeper = client
        .create_container(
            &sandbox,
            container("sleeper", "sleep 1000"),
            sandbox_config.clone(),
        )
        .await
        .unwrap();
    client.start_container(&sleeper).await.unwrap();
    wait_for_state(&client, &sleeper, ContainerState::ContainerRunning).await;
    let output = client
        .exec_sync(
            &sleeper,
            vec![
                "sh".into(),
                "-c".into(),
                "echo out; echo err >&2; exit 3".into(),
            ],
            Some(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert_eq!(output.exit_code, 3, "{output:?}");
    assert_eq!(output.stdout, b"out\n", "{output:?}");
    assert_eq!(output.stderr, b"err\n", "{output:?}");

    // Streaming calls answer with the runtime's streaming server's URL.
    let url = client
        .exec(ExecRequest {
            container_id: sleeper.clone(),
            cmd: vec!["sh".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(url.starts_with("http://"), "{url}");
    let url = client.port_forward(&sandbox, vec![80]).await.unwrap();
    assert!(url.starts_with("http://"), "{url}");

    let mut listed: Vec<String> = client
        .list_containers(&sandbox, &labels)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    listed.sort();
    let mut expected = vec![echo.clone(), sleeper.clone()];
    expected.sort();
    assert_eq!(listed, expected);

    // Stop (kill at once: no grace), remove, and the same for the sandbox.
    client
        .stop_container(&sleeper, Duration::ZERO)
        .await
        .unwrap();
    wait_for_state(&client, &sleeper, ContainerState::ContainerExited).await;
    for id in [&echo, &sleeper] {
        client.remove_container(id).await.unwrap();
        let error: CriError = client.container_status(id, false).await.unwrap_err();
        assert!(error.is_not_found(), "{error}");
    }
    assert!(client
        .list_containers(&sandbox, &HashMap::new())
        .await
        .unwrap()
        .is_empty());
    client.stop_pod_sandbox(&sandbox).await.unwrap();
    let status = client
        .pod_sandbox_status(&sandbox, false)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(
        status.state,
        PodSandboxState::SandboxNotready as i32,
        "{status:?}"
    );
    client.remove_pod_sandbox(&sandbox).await.unwrap();
    let error = client
        .pod_sandbox_status(&sandbox, false)
        .await
        .unwrap_err();
    assert!(error.is_not_found(), "{error}");
    // Removing it again is done already (idempotent).
    client.remove_pod_sandbox(&sandbox).await.unwrap();
    assert!(client.list_pod_sandbox(&labels).await.unwrap().is_empty());
}
