//! The contract between the node agent and whatever runs containers.
//!
//! The agent is level-triggered: for each pod bound to its node it calls
//! [`PodRuntime::sync_pod`] with the pod as the API shows it, and writes the returned
//! [`RuntimeStatus`] into the pod's status (adding the pod conditions itself). A runtime
//! never talks to the API server; it reports "something changed for this pod" through
//! [`PodRuntime::subscribe`] so the agent syncs again (a process exited, a probe flipped, a
//! back-off expired).

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

/// What the runtime can say went wrong.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No such pod or container in this runtime.
    #[error("{0} not found")]
    NotFound(String),
    /// The request is understood but cannot be served (e.g. `previous` logs with no previous run).
    #[error("{0}")]
    BadRequest(String),
    /// Anything else (I/O, spawning processes).
    #[error("{0}")]
    Internal(String),
}

/// Facts about the node a pod runs on, for `fieldRef` environment variables and addresses.
#[derive(Clone, Debug, Default)]
pub struct NodeContext {
    /// The node's name (`spec.nodeName`).
    pub node_name: String,
    /// The node's address (`status.hostIP`).
    pub host_ip: String,
    /// How the node reads the objects its pods refer to (ConfigMaps, Secrets, claims, volumes,
    /// Services, service-account tokens); `None` where it reads none (a runtime used on its
    /// own, in tests): a pod that needs one then waits with a clear error.
    pub sources: Option<Sources>,
}

/// A future an [`ObjectSource`] answers with.
pub type SourceFuture<T> = futures::future::BoxFuture<'static, Result<T, String>>;

/// A service-account token a pod's projected volume asks for (`serviceaccounts/token`, bound
/// to the pod).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenRequestFor {
    /// The pod's namespace.
    pub namespace: String,
    /// The ServiceAccount (`spec.serviceAccountName`).
    pub service_account: String,
    /// The pod's name, the token's bound object.
    pub pod_name: String,
    /// The pod's uid.
    pub pod_uid: String,
    /// The token's audience; empty for the API server's own.
    pub audience: String,
    /// The lifetime asked for (`expirationSeconds`).
    pub expiration_seconds: i64,
}

/// A token the API issued.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedToken {
    /// The bearer token. Never logged.
    pub token: String,
    /// When it expires (`status.expirationTimestamp`).
    pub expires: k8s_openapi::jiff::Timestamp,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// Where a pod reaches the API server (`KUBERNETES_SERVICE_HOST`/`_PORT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiServerAddress {
    /// An IP address.
    pub host: String,
    /// Its port.
    pub port: u16,
}

/// Reads what a node's pods refer to. The runtime itself never talks to the API server: the
/// agent hands it this, reading through the node's own identity (the node authorizer lets a
/// node read only the objects its pods name). `Ok(None)` is "does not exist"; an error says
/// why an object could not be read, never what it holds. Every method but [`secret`] has a
/// default that answers "not available", for sources that serve only some kinds.
///
/// [`secret`]: ObjectSource::secret
pub trait ObjectSource: Send + Sync + 'static {
    /// The Secret `namespace/name`.
    fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> SourceFuture<Option<k8s_openapi::api::core::v1::Secret>>;

    /// The ConfigMap `namespace/name`.
    fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> SourceFuture<Option<k8s_openapi::api::core::v1::ConfigMap>> {
        let _ = (namespace, name);
        Box::pin(async { Err("this node reads no ConfigMaps".to_string()) })
    }

    /// The PersistentVolumeClaim `namespace/name`.
    fn claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> SourceFuture<Option<k8s_openapi::api::core::v1::PersistentVolumeClaim>> {
        let _ = (namespace, name);
        Box::pin(async { Err("this node reads no PersistentVolumeClaims".to_string()) })
    }

    /// The PersistentVolume `name`.
    fn volume(
        &self,
        name: &str,
    ) -> SourceFuture<Option<k8s_openapi::api::core::v1::PersistentVolume>> {
        let _ = name;
        Box::pin(async { Err("this node reads no PersistentVolumes".to_string()) })
    }

    /// The Services of `namespace`, for service environment variables.
    fn services(&self, namespace: &str) -> SourceFuture<Vec<k8s_openapi::api::core::v1::Service>> {
        let _ = namespace;
        Box::pin(async { Err("this node reads no Services".to_string()) })
    }

    /// A token for a pod's projected `serviceAccountToken` volume source.
    fn token(&self, request: &TokenRequestFor) -> SourceFuture<IssuedToken> {
        let _ = request;
        Box::pin(async { Err("this node requests no service-account tokens".to_string()) })
    }

    /// Where this node's pods reach the API server, if it knows.
    fn api_server(&self) -> Option<ApiServerAddress> {
        None
    }
}

/// A shared [`ObjectSource`].
#[derive(Clone)]
pub struct Sources(pub std::sync::Arc<dyn ObjectSource>);

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sources")
    }
}

/// What a runtime observes about one pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimeStatus {
    /// `status.podIP`, once assigned.
    pub pod_ip: Option<String>,
    /// `Pending`, `Running`, `Succeeded` or `Failed`.
    pub phase: String,
    /// One entry per container in `spec.containers`, in spec order (state, ready,
    /// restartCount, lastState, image, imageID, containerID, started).
    pub container_statuses: Vec<ContainerStatus>,
    /// One entry per container in `spec.initContainers`, in spec order, for runtimes that
    /// report them (`status.initContainerStatuses`); empty when the runtime does not, and
    /// the agent then leaves the field as the API holds it.
    pub init_container_statuses: Vec<ContainerStatus>,
    /// When the pod's containers were first started (`status.startTime`).
    pub start_time: Option<k8s_openapi::jiff::Timestamp>,
    /// A human-readable note for the pod (e.g. that containers are simulated), if any.
    pub message: Option<String>,
    /// A one-word reason to go with `message`, if any.
    pub reason: Option<String>,
}

/// A pod the runtime holds, whether or not the API still knows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RuntimePod {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

/// Something a runtime saw happen to a pod that the kubelet reports as an Event (a lifecycle
/// hook that failed). The agent publishes it about the pod, as `kubelet` from its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeEvent {
    /// The pod it is about.
    pub pod: RuntimePod,
    /// The container it is about, as the Event's `fieldPath` (`spec.containers{name}`).
    pub field_path: Option<String>,
    /// `Warning` rather than `Normal`.
    pub warning: bool,
    /// The Event's reason, as the kubelet words it (`FailedPostStartHook`).
    pub reason: String,
    /// The Event's message.
    pub message: String,
}

/// Options of a log request (`pods/log` query parameters).
#[derive(Clone, Debug, Default)]
pub struct LogOptions {
    /// Keep the stream open and send new lines as they are written.
    pub follow: bool,
    /// The previous (terminated) run of the container instead of the current one.
    pub previous: bool,
    /// Only the last N lines.
    pub tail_lines: Option<u64>,
    /// Only lines written in the last N seconds.
    pub since_seconds: Option<u64>,
    /// Prefix each line with its RFC 3339 timestamp.
    pub timestamps: bool,
    /// Stop after this many bytes.
    pub limit_bytes: Option<u64>,
}

/// A stream of log bytes.
pub type LogStream = BoxStream<'static, Result<Bytes, RuntimeError>>;

/// A byte source for a streamed session (a client's stdin).
pub type StreamReader = Box<dyn AsyncRead + Send + Unpin>;

/// A byte sink for a streamed session (a client's stdout or stderr).
pub type StreamWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// A two-way byte stream: a forwarded port's connection.
pub trait Duplex: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Duplex for T {}

/// A terminal's size, as a TTY resize message carries it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TerminalSize {
    /// Columns.
    pub width: u16,
    /// Rows.
    pub height: u16,
}

/// The client's ends of an `exec` or `attach` session. A stream the client did not ask for
/// is `None`; with a TTY, stderr is merged into stdout and `stderr` is `None`.
#[derive(Default)]
pub struct StreamIo {
    /// What the client types; EOF when it closes its stdin.
    pub stdin: Option<StreamReader>,
    /// Where the container's stdout goes.
    pub stdout: Option<StreamWriter>,
    /// Where the container's stderr goes.
    pub stderr: Option<StreamWriter>,
    /// Terminal resizes, when the session has a TTY.
    pub resize: Option<mpsc::Receiver<TerminalSize>>,
}

/// A command to run in a container (`pods/exec`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecRequest {
    /// The container's name.
    pub container: String,
    /// The command and its arguments; never empty.
    pub command: Vec<String>,
    /// Run it on a terminal.
    pub tty: bool,
}

/// Something that runs pods' containers on one node.
#[async_trait]
pub trait PodRuntime: Send + Sync + 'static {
    /// Brings the pod's containers to what its spec asks — starts those not started, restarts
    /// exited ones as `restartPolicy` and back-off allow — and reports what it sees.
    /// Idempotent: calling it again with the same pod changes nothing that is already right.
    async fn sync_pod(&self, pod: &Pod, node: &NodeContext) -> Result<RuntimeStatus, RuntimeError>;

    /// Stops every container of the pod (SIGTERM, then SIGKILL after `grace`) and forgets it,
    /// returning when all have exited. Stopping a pod the runtime does not hold is not an error.
    async fn kill_pod(&self, pod: &RuntimePod, grace: Duration) -> Result<(), RuntimeError>;

    /// Every pod the runtime holds, including those it found again after the agent restarted.
    async fn pods(&self) -> Vec<RuntimePod>;

    /// The pods the runtime holds under one namespace and name (more than one while a pod
    /// that was replaced under its name is still being stopped). A pod's sync asks this;
    /// runtimes that can should answer without copying every pod they hold.
    async fn pods_named(&self, namespace: &str, name: &str) -> Vec<RuntimePod> {
        let mut pods = self.pods().await;
        pods.retain(|p| p.namespace == namespace && p.name == name);
        pods
    }

    /// A channel that receives a pod's uid whenever its observed status may have changed.
    /// Called once by the agent.
    fn subscribe(&self) -> mpsc::UnboundedReceiver<String>;

    /// The node's images for `status.images` (largest first, at most 50), or `None` for a
    /// runtime without images, whose node leaves the field as it is.
    async fn images(&self) -> Option<Vec<k8s_openapi::api::core::v1::ContainerImage>> {
        None
    }

    /// The CPU and memory the runtime's running containers use now, for the kubelet's
    /// `/stats/summary` and `/metrics/resource`. Runtimes that cannot measure say so.
    async fn stats(&self) -> Result<crate::stats::RuntimeStats, RuntimeError> {
        Err(RuntimeError::BadRequest(
            "this node's container runtime does not measure resource usage".into(),
        ))
    }

    /// A channel of the Events the runtime reports ([`RuntimeEvent`]); `None` for runtimes
    /// that report none. Called once by the agent.
    fn events(&self) -> Option<mpsc::UnboundedReceiver<RuntimeEvent>> {
        None
    }

    /// The log of one container of a pod.
    async fn logs(
        &self,
        pod: &RuntimePod,
        container: &str,
        options: &LogOptions,
    ) -> Result<LogStream, RuntimeError>;

    /// Runs a command in a running container of the pod, wired to `io`, and returns its exit
    /// code when it ends (`pods/exec`). Runtimes that cannot run commands say so.
    async fn exec(
        &self,
        pod: &RuntimePod,
        request: ExecRequest,
        io: StreamIo,
    ) -> Result<i32, RuntimeError> {
        let _ = (pod, request, io);
        Err(RuntimeError::BadRequest(
            "this node's container runtime does not run commands in containers".into(),
        ))
    }

    /// Connects `io` to the main process of a running container until the client leaves or
    /// the process exits (`pods/attach`).
    async fn attach(
        &self,
        pod: &RuntimePod,
        container: &str,
        tty: bool,
        io: StreamIo,
    ) -> Result<(), RuntimeError> {
        let _ = (pod, container, tty, io);
        Err(RuntimeError::BadRequest(
            "this node's container runtime does not attach to containers".into(),
        ))
    }

    /// Opens a TCP connection to `port` inside the pod's network namespace
    /// (`pods/portforward`).
    async fn port_forward(
        &self,
        pod: &RuntimePod,
        port: u16,
    ) -> Result<Box<dyn Duplex>, RuntimeError> {
        let _ = (pod, port);
        Err(RuntimeError::BadRequest(
            "this node's container runtime does not forward ports".into(),
        ))
    }
}
