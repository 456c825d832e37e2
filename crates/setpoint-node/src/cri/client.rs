//! `CriClient`: typed calls of a CRI v1 runtime over its unix socket, each with a deadline.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use setpoint_cri_proto::image_service_client::ImageServiceClient;
use setpoint_cri_proto::runtime_service_client::RuntimeServiceClient;
use setpoint_cri_proto::{
    AttachRequest, AuthConfig, Container, ContainerConfig, ContainerFilter, ContainerStatusRequest,
    ContainerStatusResponse, CreateContainerRequest, ExecRequest, ExecSyncRequest, Image,
    ImageFilter, ImageFsInfoRequest, ImageFsInfoResponse, ImageSpec, ImageStatusRequest,
    LinuxContainerResources, ListContainersRequest, ListImagesRequest, ListPodSandboxRequest,
    NetworkConfig, PodSandbox, PodSandboxConfig, PodSandboxFilter, PodSandboxStatusRequest,
    PodSandboxStatusResponse, PortForwardRequest, PullImageRequest, RemoveContainerRequest,
    RemoveImageRequest, RemovePodSandboxRequest, ReopenContainerLogRequest, RunPodSandboxRequest,
    RuntimeConfig, StartContainerRequest, StatusRequest, StatusResponse, StopContainerRequest,
    StopPodSandboxRequest, UpdateContainerResourcesRequest, UpdateRuntimeConfigRequest,
    VersionRequest, VersionResponse,
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
pub use tonic::Code;

/// The runtime API version kubelet announces in `Version` requests.
pub const KUBELET_RUNTIME_API_VERSION: &str = "0.1.0";

/// kubelet's bound on CRI messages, both ways (16 MiB).
pub const MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// kubelet's default `--runtime-request-timeout`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a pull may take by default. kubelet gives pulls no deadline of its own and relies
/// on the runtime to cancel a pull that stops making progress; the client still bounds them,
/// generously, so that a wedged runtime cannot hold a pod worker forever.
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// How long connecting to the socket may take by default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Deadlines of a [`CriClient`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CriOptions {
    /// The deadline of every call but pulls (kubelet's `--runtime-request-timeout`). Calls
    /// that wait on purpose (stopping a container, a bounded `ExecSync`) get their own wait
    /// on top of it, as kubelet does.
    pub request_timeout: Duration,
    /// The deadline of `PullImage`.
    pub pull_timeout: Duration,
    /// The deadline of opening the socket and the HTTP/2 connection.
    pub connect_timeout: Duration,
}

impl Default for CriOptions {
    fn default() -> Self {
        Self {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            pull_timeout: DEFAULT_PULL_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

/// A failed CRI call, keeping what callers decide on: the gRPC code and the runtime's message.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The endpoint is not a unix socket this client can reach.
    #[error("invalid container runtime endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it is refused.
        reason: String,
    },
    /// The socket could not be connected to.
    #[error("connecting to the container runtime at {}: {message}", .socket.display())]
    Connect {
        /// The socket's path.
        socket: PathBuf,
        /// What failed.
        message: String,
    },
    /// The runtime answered with an error status.
    #[error("CRI {method} failed: {code:?}: {message}")]
    Rpc {
        /// The RPC, as the CRI names it (`RemoveContainer`).
        method: &'static str,
        /// The gRPC status code.
        code: Code,
        /// The runtime's message.
        message: String,
    },
    /// The call did not finish before its deadline (the request is cancelled).
    #[error("CRI {method} timed out after {timeout:?}")]
    Timeout {
        /// The RPC.
        method: &'static str,
        /// The deadline it had.
        timeout: Duration,
    },
}

impl CriError {
    /// The gRPC code of the failure: the runtime's, `DeadlineExceeded` for a timeout,
    /// `Unavailable` when the runtime could not be reached, `InvalidArgument` for a bad endpoint.
    pub fn code(&self) -> Code {
        match self {
            CriError::InvalidEndpoint { .. } => Code::InvalidArgument,
            CriError::Connect { .. } => Code::Unavailable,
            CriError::Rpc { code, .. } => *code,
            CriError::Timeout { .. } => Code::DeadlineExceeded,
        }
    }

    /// Whether the runtime said the object does not exist; stopping or removing something
    /// that is gone is done, as kubelet treats it.
    pub fn is_not_found(&self) -> bool {
        self.code() == Code::NotFound
    }

    /// The runtime's message, or this error's text when the runtime gave none.
    pub fn message(&self) -> String {
        match self {
            CriError::Rpc { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }
}

/// What `ExecSync` returns: the command's exit code and its captured output (the runtime caps
/// each stream at 16 MiB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSyncOutput {
    /// The command's exit code.
    pub exit_code: i32,
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error.
    pub stderr: Vec<u8>,
}

/// The socket path an endpoint names: `unix:///path` (kubelet's
/// `--container-runtime-endpoint` form), `unix:/path`, or a plain absolute path (which
/// kubelet still accepts as a unix socket). Other transports (tcp, npipe) are refused.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let invalid = |reason: &str| CriError::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if let Some(rest) = endpoint.strip_prefix("unix:") {
        rest
    } else if endpoint.contains("://") {
        return Err(invalid(
            "only unix sockets are supported (unix:///path/to/socket)",
        ));
    } else {
        endpoint
    };
    if path.is_empty() {
        return Err(invalid("the socket path is empty"));
    }
    if !path.starts_with('/') {
        return Err(invalid("the socket path must be absolute"));
    }
    Ok(PathBuf::from(path))
}

/// A client of a CRI v1 runtime's runtime and image services over one unix socket.
///
/// Cloning is cheap and shares the connection; the connection is re-established by the
/// channel when the runtime restarts.
#[derive(Debug, Clone)]
pub struct CriClient {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    socket: PathBuf,
    options: CriOptions,
}

impl CriClient {
    /// Connects to the runtime at `endpoint` (see [`socket_path`]) with the default deadlines.
    pub async fn connect(endpoint: &str) -> Result<Self, CriError> {
        Self::connect_with(endpoint, CriOptions::default()).await
    }

    /// Connects to the runtime at `endpoint` with the given deadlines. Fails at once when the
    /// socket cannot be reached, so a wrong endpoint is reported where it is configured.
    pub async fn connect_with(endpoint: &str, options: CriOptions) -> Result<Self, CriError> {
        let socket = socket_path(endpoint)?;
        let connect_error = |message: String| CriError::Connect {
            socket: socket.clone(),
            message,
        };
        // The URI only fills the HTTP/2 `:authority`; every connection goes to the socket.
        let uri_endpoint =
            Endpoint::from_static("http://localhost").connect_timeout(options.connect_timeout);
        let path = socket.clone();
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        });
        let channel = match tokio::time::timeout(
            options.connect_timeout,
            uri_endpoint.connect_with_connector(connector),
        )
        .await
        {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => return Err(connect_error(error_chain(&e))),
            Err(_) => {
                return Err(connect_error(format!(
                    "no connection within {:?}",
                    options.connect_timeout
                )))
            }
        };
        let runtime = RuntimeServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        let images = ImageServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        Ok(Self {
            runtime,
            images,
            socket,
            options,
        })
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The deadlines this client uses.
    pub fn options(&self) -> CriOptions {
        self.options
    }

    /// The runtime's name and version and the CRI version it speaks (`v1`).
    pub async fn version(&self) -> Result<VersionResponse, CriError> {
        let mut client = self.runtime.clone();
        let request = VersionRequest {
            version: KUBELET_RUNTIME_API_VERSION.to_string(),
        };
        self.call(
            "Version",
            self.options.request_timeout,
            client.version(request),
        )
        .await
    }

    /// The runtime's conditions (`RuntimeReady`, `NetworkReady`); `verbose` asks for the
    /// runtime's extra `info` too.
    pub async fn status(&self, verbose: bool) -> Result<StatusResponse, CriError> {
        let mut client = self.runtime.clone();
        self.call(
            "Status",
            self.options.request_timeout,
            client.status(StatusRequest { verbose }),
        )
        .await
    }

    /// Tells the runtime the node's pod CIDR.
    pub async fn update_runtime_config(&self, pod_cidr: &str) -> Result<(), CriError> {
        let mut client = self.runtime.clone();
        let request = UpdateRuntimeConfigRequest {
            runtime_config: Some(RuntimeConfig {
                network_config: Some(NetworkConfig {
                    pod_cidr: pod_cidr.to_string(),
                }),
            }),
        };
        self.call(
            "UpdateRuntimeConfig",
            self.options.request_timeout,
            client.update_runtime_config(request),
        )
        .await
        .map(drop)
    }

    /// Creates and starts a pod sandbox; returns its ID. An empty `runtime_handler` selects
    /// the runtime's default.
    pub async fn run_pod_sandbox(
        &self,
        config: PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String, CriError> {
        let mut client = self.runtime.clone();
        let request = RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.to_string(),
        };
        self.call(
            "RunPodSandbox",
            self.options.request_timeout,
            client.run_pod_sandbox(request),
        )
        .await
        .map(|r| r.pod_sandbox_id)
    }

    /// Stops a sandbox's containers and releases its network.
    pub async fn stop_pod_sandbox(&self, pod_sandbox_id: &str) -> Result<(), CriError> {
        let mut client = self.runtime.clone();
        let request = StopPodSandboxRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
        };
        self.call(
            "StopPodSandbox",
            self.options.request_timeout,
            client.stop_pod_sandbox(request),
        )
        .await
        .map(drop)
    }

    /// Removes a sandbox and its containers.
    pub async fn remove_pod_sandbox(&self, pod_sandbox_id: &str) -> Result<(), CriError> {
        let mut client = self.runtime.clone();
        let request = RemovePodSandboxRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
        };
        self.call(
            "RemovePodSandbox",
            self.options.request_timeout,
            client.remove_pod_sandbox(request),
        )
        .await
        .map(drop)
    }

    /// A sandbox's status (an error, NotFound, when it does not exist).
    pub async fn pod_sandbox_status(
        &self,
        pod_sandbox_id: &str,
        verbose: bool,
    ) -> Result<PodSandboxStatusResponse, CriError> {
        let mut client = self.runtime.clone();
        let request = PodSandboxStatusRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
            verbose,
        };
        self.call(
            "PodSandboxStatus",
            self.options.request_timeout,
            client.pod_sandbox_status(request),
        )
        .await
    }

    /// The sandboxes whose labels include all of `labels` (all sandboxes when it is empty).
    pub async fn list_pod_sandbox(
        &self,
        labels: &HashMap<String, String>,
    ) -> Result<Vec<PodSandbox>, CriError> {
        self.list_pod_sandbox_filtered(PodSandboxFilter {
            label_selector: labels.clone(),
            ..Default::default()
        })
        .await
    }

    /// The sandboxes matching a full filter (ID, state, labels).
    pub async fn list_pod_sandbox_filtered(
        &self,
        filter: PodSandboxFilter,
    ) -> Result<Vec<PodSandbox>, CriError> {
        let mut client = self.runtime.clone();
        let request = ListPodSandboxRequest {
            filter: (filter != PodSandboxFilter::default()).then_some(filter),
        };
        self.call(
            "ListPodSandbox",
            self.options.request_timeout,
            client.list_pod_sandbox(request),
        )
        .await
        .map(|r| r.items)
    }

    /// Creates a container in a sandbox (whose config is passed again, as the CRI asks);
    /// returns its ID.
    pub async fn create_container(
        &self,
        pod_sandbox_id: &str,
        config: ContainerConfig,
        sandbox_config: PodSandboxConfig,
    ) -> Result<String, CriError> {
        let mut client = self.runtime.clone();
        let request = CreateContainerRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        self.call(
            "CreateContainer",
            self.options.request_timeout,
            client.create_container(request),
        )
        .await
        .map(|r| r.container_id)
    }

    /// Starts a created container.
    pub async fn start_container(&self, container_id: &str) -> Result<(), CriError> {
        let mut client = self.runtime.clone();
        let request = StartContainerRequest {
            container_id: container_id.to_string(),
        };
        self.call(
            "StartContainer",
            self.options.request_timeout,
            client.start_container(request),
        )
        .await
        .map(drop)
    }

    /// Stops a container: its stop signal, then a kill once `grace` (whole seconds, rounded
    /// up) has passed; zero kills at once. The call may take the grace period plus the
    /// request timeout, as kubelet allows.
    pub async fn stop_container(
        &self,
        container_id: &str,
        grace: Duration,
    ) -> Result<(), CriError> {
        let mut client = self.runtime.clone();
        let seconds = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
        let request = StopContainerRequest {
            container_id: container_id.to_string(),
            timeout: i64::try_from(seconds).unwrap_or(i64::MAX),
        };
        let deadline = self
            .options
            .request_timeout
            .saturating_add(Duration::from_secs(seconds));
        self.call("StopContainer", deadline, client.stop_container(request))
            .await
            .map(drop)
    }

    /// Removes a container, killing it first if it runs.
    pub async fn remove_container(&self, container_id: &str) -> Result<(), CriError> {
        let mut client = self.runtime.clone();
        let request = RemoveContainerRequest {
            container_id: container_id.to_string(),
        };
        self.call(
            "RemoveContainer",
            self.options.request_timeout,
            client.remove_container(request),
        )
        .await
        .map(drop)
    }

    /// The containers of a sandbox (all sandboxes when `pod_sandbox_id` is empty) whose
    /// labels include all of `labels`.
    pub async fn list_containers(
        &self,
        pod_sandbox_id: &str,
        labels: &HashMap<String, String>,
    ) -> Result<Vec<Container>, CriError> {
        self.list_containers_filtered(ContainerFilter {
            pod_sandbox_id: pod_sandbox_id.to_string(),
            label_selector: labels.clone(),
            ..Default::default()
        })
        .await
    }

    /// Every container's resource usage (`ListContainerStats`), with the same deadline as
    /// the other list calls.
    pub async fn list_container_stats(
        &self,
    ) -> Result<Vec<setpoint_cri_proto::ContainerStats>, CriError> {
        let mut client = self.runtime.clone();
        let request = setpoint_cri_proto::ListContainerStatsRequest { filter: None };
        self.call(
            "ListContainerStats",
            self.options.request_timeout,
            client.list_container_stats(request),
        )
        .await
        .map(|r| r.stats)
    }

    /// The containers matching a full filter (ID, state, sandbox, labels).
    pub async fn list_containers_filtered(
        &self,
        filter: ContainerFilter,
    ) -> Result<Vec<Container>, CriError> {
        let mut client = self.runtime.clone();
        let request = ListContainersRequest {
            filter: (filter != ContainerFilter::default()).then_some(filter),
        };
        self.call(
            "ListContainers",
            self.options.request_timeout,
            client.list_containers(request),
        )
        .await
        .map(|r| r.containers)
    }

    /// A container's status (an error, NotFound, when it does not exist).
    pub async fn container_status(
        &self,
        container_id: &str,
        verbose: bool,
    ) -> Result<ContainerStatusResponse, CriError> {
        let mut client = self.runtime.clone();
        let request = ContainerStatusRequest {
            container_id: container_id.to_string(),
            verbose,
        };
        self.call(
            "ContainerStatus",
            self.options.request_timeout,
            client.container_status(request),
        )
        .await
    }

    /// Sets a running container's Linux resources.
    pub async fn update_container_resources(
        &self,
        container_id: &str,
        linux: LinuxContainerResources,
    ) -> Result<(), CriError> {
        let mut client = self.runtime.clone();
        let request = UpdateContainerResourcesRequest {
            container_id: container_id.to_string(),
            linux: Some(linux),
            ..Default::default()
        };
        self.call(
            "UpdateContainerResources",
            self.options.request_timeout,
            client.update_container_resources(request),
        )
        .await
        .map(drop)
    }

    /// Asks the runtime to reopen a container's log file (after it was rotated).
    pub async fn reopen_container_log(&self, container_id: &str) -> Result<(), CriError> {
        let mut client = self.runtime.clone();
        let request = ReopenContainerLogRequest {
            container_id: container_id.to_string(),
        };
        self.call(
            "ReopenContainerLog",
            self.options.request_timeout,
            client.reopen_container_log(request),
        )
        .await
        .map(drop)
    }

    /// Runs `cmd` in a running container and waits for it. With a `timeout` (whole seconds,
    /// rounded up) the runtime stops the command then, and the call may take that plus the
    /// request timeout; without one neither the command nor the call has a deadline, as in
    /// kubelet.
    pub async fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Option<Duration>,
    ) -> Result<ExecSyncOutput, CriError> {
        let mut client = self.runtime.clone();
        let seconds = timeout.map(|t| t.as_secs() + u64::from(t.subsec_nanos() > 0));
        let request = ExecSyncRequest {
            container_id: container_id.to_string(),
            cmd,
            timeout: seconds.map_or(0, |s| i64::try_from(s).unwrap_or(i64::MAX)),
        };
        let call = client.exec_sync(request);
        let response = match seconds {
            Some(seconds) => {
                let deadline = self
                    .options
                    .request_timeout
                    .saturating_add(Duration::from_secs(seconds));
                self.call("ExecSync", deadline, call).await?
            }
            None => self.call_unbounded("ExecSync", call).await?,
        };
        Ok(ExecSyncOutput {
            exit_code: response.exit_code,
            stdout: response.stdout,
            stderr: response.stderr,
        })
    }

    /// Prepares a streaming exec; returns the runtime's streaming URL.
    pub async fn exec(&self, request: ExecRequest) -> Result<String, CriError> {
        let mut client = self.runtime.clone();
        self.call("Exec", self.options.request_timeout, client.exec(request))
            .await
            .map(|r| r.url)
    }

    /// Prepares a streaming attach; returns the runtime's streaming URL.
    pub async fn attach(&self, request: AttachRequest) -> Result<String, CriError> {
        let mut client = self.runtime.clone();
        self.call(
            "Attach",
            self.options.request_timeout,
            client.attach(request),
        )
        .await
        .map(|r| r.url)
    }

    /// Prepares a port forward into a sandbox; returns the runtime's streaming URL.
    pub async fn port_forward(
        &self,
        pod_sandbox_id: &str,
        ports: Vec<i32>,
    ) -> Result<String, CriError> {
        let mut client = self.runtime.clone();
        let request = PortForwardRequest {
            pod_sandbox_id: pod_sandbox_id.to_string(),
            port: ports,
        };
        self.call(
            "PortForward",
            self.options.request_timeout,
            client.port_forward(request),
        )
        .await
        .map(|r| r.url)
    }

    /// An image's status; `None` when it is not on the node.
    pub async fn image_status(&self, image: ImageSpec) -> Result<Option<Image>, CriError> {
        let mut client = self.images.clone();
        let request = ImageStatusRequest {
            image: Some(image),
            verbose: false,
        };
        self.call(
            "ImageStatus",
            self.options.request_timeout,
            client.image_status(request),
        )
        .await
        .map(|r| r.image)
    }

    /// Pulls an image, with registry credentials and the sandbox it is for when given;
    /// returns the image's reference on the node (its ID).
    pub async fn pull_image(
        &self,
        image: ImageSpec,
        auth: Option<AuthConfig>,
        sandbox_config: Option<PodSandboxConfig>,
    ) -> Result<String, CriError> {
        let mut client = self.images.clone();
        let request = PullImageRequest {
            image: Some(image),
            auth,
            sandbox_config,
        };
        self.call(
            "PullImage",
            self.options.pull_timeout,
            client.pull_image(request),
        )
        .await
        .map(|r| r.image_ref)
    }

    /// The images on the node; with `filter`, those matching it.
    pub async fn list_images(&self, filter: Option<ImageSpec>) -> Result<Vec<Image>, CriError> {
        let mut client = self.images.clone();
        let request = ListImagesRequest {
            filter: filter.map(|image| ImageFilter { image: Some(image) }),
        };
        self.call(
            "ListImages",
            self.options.request_timeout,
            client.list_images(request),
        )
        .await
        .map(|r| r.images)
    }

    /// Removes an image (with every tag of it).
    pub async fn remove_image(&self, image: ImageSpec) -> Result<(), CriError> {
        let mut client = self.images.clone();
        let request = RemoveImageRequest { image: Some(image) };
        self.call(
            "RemoveImage",
            self.options.request_timeout,
            client.remove_image(request),
        )
        .await
        .map(drop)
    }

    /// Usage of the filesystems images (and containers' writable layers) are kept on.
    pub async fn image_fs_info(&self) -> Result<ImageFsInfoResponse, CriError> {
        let mut client = self.images.clone();
        self.call(
            "ImageFsInfo",
            self.options.request_timeout,
            client.image_fs_info(ImageFsInfoRequest {}),
        )
        .await
    }

    /// Awaits a call with a deadline. The deadline is kept here rather than sent as
    /// `grpc-timeout`: dropping the call on expiry resets its HTTP/2 stream, which cancels
    /// the runtime's side as well, and the caller gets one unambiguous `Timeout`.
    async fn call<T>(
        &self,
        method: &'static str,
        timeout: Duration,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CriError> {
        let started = Instant::now();
        match tokio::time::timeout(timeout, call).await {
            Ok(result) => finish(method, started, result),
            Err(_) => {
                tracing::debug!(method, ?timeout, "CRI call timed out");
                Err(CriError::Timeout { method, timeout })
            }
        }
    }

    /// Awaits a call that has no deadline of its own (an `ExecSync` without a timeout).
    async fn call_unbounded<T>(
        &self,
        method: &'static str,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CriError> {
        let started = Instant::now();
        finish(method, started, call.await)
    }
}

fn finish<T>(
    method: &'static str,
    started: Instant,
    result: Result<tonic::Response<T>, tonic::Status>,
) -> Result<T, CriError> {
    match result {
        Ok(response) => {
            tracing::trace!(method, elapsed = ?started.elapsed(), "CRI call");
            Ok(response.into_inner())
        }
        Err(status) => {
            let error = CriError::Rpc {
                method,
                code: status.code(),
                message: status.message().to_string(),
            };
            // NotFound is an expected answer (a stop or remove of something gone).
            if status.code() != Code::NotFound {
                tracing::debug!(method, elapsed = ?started.elapsed(), %error, "CRI call failed");
            }
            Err(error)
        }
    }
}

/// An error with its causes, since tonic's transport error alone says little ("transport
/// error") and the cause (no such file, connection refused) is what an operator needs.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_name_unix_sockets() {
        for (endpoint, path) in [
            (
                "unix:///run/containerd/containerd.sock",
                "/run/containerd/containerd.sock",
            ),
            ("unix:/run/crio/crio.sock", "/run/crio/crio.sock"),
            (
                "/run/containerd/containerd.sock",
                "/run/containerd/containerd.sock",
            ),
        ] {
            assert_eq!(socket_path(endpoint).unwrap(), PathBuf::from(path));
        }
        for endpoint in [
            "tcp://127.0.0.1:1234",
            "npipe:////./pipe/containerd",
            "unix://",
            "",
            "run/containerd.sock",
        ] {
            let error = socket_path(endpoint).unwrap_err();
            assert_eq!(error.code(), Code::InvalidArgument, "{endpoint}: {error}");
        }
    }

    #[tokio::test]
    async fn a_missing_socket_is_a_connect_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("absent.sock");
        let endpoint = format!("unix://{}", socket.display());
        let error = CriClient::connect(&endpoint).await.unwrap_err();
        assert_eq!(error.code(), Code::Unavailable);
        let text = error.to_string();
        assert!(text.contains(&socket.display().to_string()), "{text}");
        assert!(text.contains("No such file or directory"), "{text}");
    }

    /// A runtime that accepts calls and never answers: a containerd cannot be made to hang
    /// on purpose, so this is an HTTP/2 server on a unix socket whose handler never returns.
    #[tokio::test]
    async fn a_call_past_its_deadline_is_a_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("hang.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let never = hyper::service::service_fn(|_request| {
                        std::future::pending::<
                            Result<hyper::Response<String>, std::convert::Infallible>,
                        >()
                    });
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(TokioIo::new(stream), never)
                    .await;
                });
            }
        });
        let options = CriOptions {
            request_timeout: Duration::from_millis(200),
            ..CriOptions::default()
        };
        let endpoint = format!("unix://{}", socket.display());
        let client = CriClient::connect_with(&endpoint, options).await.unwrap();
        let started = Instant::now();
        let error = client.version().await.unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(
            matches!(error, CriError::Timeout { method: "Version", timeout }
                if timeout == Duration::from_millis(200)),
            "{error:?}"
        );
        assert_eq!(error.code(), Code::DeadlineExceeded);
        assert_eq!(
            error.to_string(),
            "CRI Version timed out after 200ms",
            "{error}"
        );
        server.abort();
    }

    #[test]
    fn errors_keep_the_grpc_code() {
        let error = CriError::Rpc {
            method: "RemoveContainer",
            code: Code::NotFound,
            message: "container \"nope\" not found".into(),
        };
        assert!(error.is_not_found());
        assert_eq!(error.message(), "container \"nope\" not found");
        let timeout = CriError::Timeout {
            method: "Version",
            timeout: Duration::from_secs(1),
        };
        assert_eq!(timeout.code(), Code::DeadlineExceeded);
        assert!(!timeout.is_not_found());
    }
}
