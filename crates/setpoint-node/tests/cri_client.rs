//! `CriClient` against a real containerd, started privately for this test in a temporary
//! directory. Skipped (with the reason printed) unless running as root with `containerd` on
//! the PATH; with `SETPOINT_REQUIRE_CONTAINERD=1` a missing prerequisite fails instead.

// geteuid and kill are system calls.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use setpoint_node::cri::api::ImageSpec;
use setpoint_node::cri::client::Code;
use setpoint_node::cri::{CriClient, CriOptions};

/// Starts containerd or says why it cannot here.
fn prerequisites() -> Result<PathBuf, String> {
    if unsafe { libc::geteuid() } != 0 {
        return Err("not running as root".into());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("containerd"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| "containerd is not on the PATH".into())
}

/// A containerd of this test's own; killed and its directory removed when dropped.
struct Containerd {
    child: Child,
    socket: PathBuf,
    dir: tempfile::TempDir,
}

impl Containerd {
    fn start(binary: &Path) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("cri-")
            .tempdir()
            .expect("a temporary directory");
        let socket = dir.path().join("c.sock");
        // sun_path holds 107 bytes and a NUL.
        assert!(
            socket.as_os_str().len() < 108,
            "the temporary directory's path is too long for a unix socket: {}",
            socket.display()
        );
        let root = dir.path().join("root");
        let state = dir.path().join("state");
        let config = dir.path().join("config.toml");
        // Only what keeps this containerd apart from any other on the machine; the CRI
        // plugin must not try to lower its own OOM score adjustment, which needs
        // CAP_SYS_RESOURCE that containers running these tests may lack.
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = {root:?}\nstate = {state:?}\n\n[grpc]\n  address = {socket:?}\n\n\
                 [plugins.\"io.containerd.internal.v1.opt\"]\n  path = {opt:?}\n\n\
                 [plugins.\"io.containerd.grpc.v1.cri\"]\n  restrict_oom_score_adj = true\n",
                root = root.display().to_string(),
                state = state.display().to_string(),
                socket = socket.display().to_string(),
                opt = dir.path().join("opt").display().to_string(),
            ),
        )
        .expect("writing containerd's config");
        let log = std::fs::File::create(dir.path().join("containerd.log")).expect("a log file");
        let child = Command::new(binary)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("a log file"))
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        Containerd { child, socket, dir }
    }

    fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// Connects once containerd serves CRI (the socket appears before the CRI plugin answers).
    async fn client(&mut self) -> CriClient {
        let deadline = Instant::now() + Duration::from_secs(60);
        let options = CriOptions {
            request_timeout: Duration::from_secs(30),
            pull_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
        };
        loop {
            if let Some(status) = self.child.try_wait().expect("containerd's status") {
                panic!("containerd exited ({status}):\n{}", self.log());
            }
            let attempt = match CriClient::connect_with(&self.endpoint(), options).await {
                Ok(client) => client.version().await.map(|_| client),
                Err(e) => Err(e),
            };
            match attempt {
                Ok(client) => return client,
                Err(e) if Instant::now() > deadline => {
                    panic!(
                        "containerd did not serve CRI within 60 s: {e}\n{}",
                        self.log()
                    )
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // SIGTERM lets containerd unmount its snapshots before the directory is removed.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn image(name: &str) -> ImageSpec {
    ImageSpec {
        image: name.to_string(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_client_against_containerd() {
    let binary = match prerequisites() {
        Ok(binary) => binary,
        Err(reason) => {
            if std::env::var("SETPOINT_REQUIRE_CONTAINERD").as_deref() == Ok("1") {
                panic!("SETPOINT_REQUIRE_CONTAINERD=1 but containerd cannot run here: {reason}");
            }
            eprintln!("skipping: {reason}");
            return;
        }
    };
    let mut containerd = Containerd::start(&binary);
    let client = containerd.client().await;

    // Version: containerd speaking CRI v1.
    let version = client.version().await.unwrap();
    assert_eq!(version.runtime_name, "containerd", "{version:?}");
    assert_eq!(version.runtime_api_version, "v1", "{version:?}");
    assert!(!version.runtime_version.is_empty(), "{version:?}");

    // Status: the runtime is ready (the network is not: this containerd has no CNI config).
    let status = client.status(false).await.unwrap();
    let conditions = status.status.expect("a runtime status").conditions;
    let runtime_ready = conditions
        .iter()
        .find(|c| c.r#type == "RuntimeReady")
        .unwrap_or_else(|| panic!("no RuntimeReady condition: {conditions:?}"));
    assert!(runtime_ready.status, "{runtime_ready:?}");

    // Images: a fresh containerd has none; an absent image's status is no image, not an error.
    let images = client.list_images(None).await.unwrap();
    assert!(images.is_empty(), "{images:?}");
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
    // asks), while asking for its status or stopping an unknown sandbox is NotFound.
    client.remove_container("nope").await.unwrap();
    let error = client.container_status("nope", false).await.unwrap_err();
    assert!(error.is_not_found(), "{error}");
    let error = client.pod_sandbox_status("nope", false).await.unwrap_err();
    assert!(error.is_not_found(), "{error}");

    // Nothing runs in it.
    let sandboxes = client.list_pod_sandbox(&HashMap::new()).await.unwrap();
    assert!(sandboxes.is_empty(), "{sandboxes:?}");
    let containers = client.list_containers("", &HashMap::new()).await.unwrap();
    assert!(containers.is_empty(), "{containers:?}");
}
