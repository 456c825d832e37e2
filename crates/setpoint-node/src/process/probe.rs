//! Container probes: exec, httpGet (HTTP and HTTPS), tcpSocket and gRPC checks, and the loop that
//! applies Kubernetes' probe timing (initial delay, period, timeout, thresholds) for one run.
//!
//! A gRPC probe is the standard health check, `grpc.health.v1.Health/Check`, over plaintext
//! HTTP/2 to the pod's address; `SERVING` is success. Its two small messages are encoded here
//! by hand rather than generated, and failures are worded as the kubelet words them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{ContainerPort, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::launch::RunHandle;
use super::mounts::Joined;

/// Where and how a container's probes run.
#[derive(Clone, Debug)]
pub struct ProbeTarget {
    /// The pod's IP (the default host of httpGet and tcpSocket probes).
    pub pod_ip: String,
    /// The container's ports, to resolve named ports.
    pub ports: Vec<ContainerPort>,
    /// The container's environment (exec probes run with it, as inside the container).
    pub env: Vec<(String, String)>,
    /// The container's working directory.
    pub workdir: PathBuf,
}

/// What a runtime does for probes in its own way: run an exec probe's command inside the
/// container, and stop the container after a liveness or startup failure. Without one
/// ([`ProbeSet::actions`] `None`), exec probes run as local processes and the failure stops
/// the process runtime's run ([`ProbeSet::run`]).
pub trait ProbeActions: Send + Sync + 'static {
    /// Runs `argv` in the container; `Ok` when it exits with 0, else why not.
    fn exec(&self, argv: Vec<String>, timeout: Duration) -> BoxFuture<'static, Result<(), String>>;
    /// Stops the container, giving it `grace` before it is killed.
    fn stop(&self, grace: Duration) -> BoxFuture<'static, ()>;
}

/// The probe actions of a process container with volume mounts or a pod network: exec
/// probes run in the mount and network namespaces of its workload ([`super::mounts`],
/// [`super::netns`]), so they see its mounted files and its interfaces; a failure stops the
/// run, as for any process container.
#[derive(Clone, Debug)]
pub struct InMountNamespace {
    /// The workload's pid.
    pub pid: i32,
    /// Its start time (clock ticks since boot; 0 when unknown).
    pub start: u64,
    /// The container's environment and directory.
    pub target: ProbeTarget,
    /// The run to stop.
    pub run: RunHandle,
}

impl ProbeActions for InMountNamespace {
    fn exec(
        &self,
        argv: Vec<String>,
        _timeout: Duration,
    ) -> BoxFuture<'static, Result<(), String>> {
        // The caller bounds the check by its timeout and drops it, which kills the command.
        let this = self.clone();
        Box::pin(async move { exec_in(&argv, &this.target, Some((this.pid, this.start))).await })
    }

    fn stop(&self, grace: Duration) -> BoxFuture<'static, ()> {
        let run = self.run.clone();
        Box::pin(async move { run.terminate(grace).await })
    }
}

/// A probe's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The check passed.
    Success,
    /// The check failed, and why.
    Failure(String),
}

fn secs(value: Option<i32>, default: i32, min: i32) -> Duration {
    Duration::from_secs(value.unwrap_or(default).max(min) as u64)
}

fn resolve_port(port: &IntOrString, target: &ProbeTarget) -> Result<u16, String> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).map_err(|_| format!("port {p} is out of range")),
        IntOrString::String(name) => {
            if let Ok(p) = name.parse::<u16>() {
                return Ok(p);
            }
            target
                .ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("no container port named {name:?}"))
        }
    }
}

/// Runs one check of `probe` (bounded by its `timeoutSeconds`).
pub async fn check(probe: &Probe, target: &ProbeTarget) -> Outcome {
    check_with(probe, target, None).await
}

/// Like [`check`], with exec probes run through `actions` when given.
pub async fn check_with(
    probe: &Probe,
    target: &ProbeTarget,
    actions: Option<&dyn ProbeActions>,
) -> Outcome {
    let timeout = secs(probe.timeout_seconds, 1, 1);
    match tokio::time::timeout(timeout, check_inner(probe, target, actions, timeout)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::Failure(format!("probe timed out after {}s", timeout.as_secs())),
    }
}

async fn check_inner(
    probe: &Probe,
    target: &ProbeTarget,
    actions: Option<&dyn ProbeActions>,
    timeout: Duration,
) -> Outcome {
    let result = if let Some(exec) = &probe.exec {
        let argv = exec.command.clone().unwrap_or_default();
        match actions {
            _ if argv.is_empty() => Err("exec probe has no command".to_string()),
            Some(a) => a.exec(argv, timeout).await,
            None => exec_check(&argv, target).await,
        }
    } else if let Some(http) = &probe.http_get {
        http_check(http, target).await
    } else if let Some(tcp) = &probe.tcp_socket {
        match resolve_port(&tcp.port, target) {
            Ok(port) => {
                let host = tcp.host.clone().unwrap_or_else(|| target.pod_ip.clone());
                tokio::net::TcpStream::connect((host.as_str(), port))
                    .await
                    .map(drop)
                    .map_err(|e| format!("dial tcp {host}:{port}: {e}"))
            }
            Err(e) => Err(e),
        }
    } else if let Some(grpc) = &probe.grpc {
        grpc_check(grpc, target, timeout).await
    } else {
        Err("probe has no handler".to_string())
    };
    match result {
        Ok(()) => Outcome::Success,
        Err(e) => Outcome::Failure(e),
    }
}

async fn exec_check(argv: &[String], target: &ProbeTarget) -> Result<(), String> {
    exec_in(argv, target, None).await
}

/// Runs an exec probe's command with the container's environment and directory, in the
/// mount namespace of the process `(pid, start time)` when one is given.
async fn exec_in(
    argv: &[String],
    target: &ProbeTarget,
    namespace_of: Option<(i32, u64)>,
) -> Result<(), String> {
    let (program, args) = argv.split_first().ok_or("exec probe has no command")?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(target.env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // A timed-out check is dropped: its process must not outlive it.
        .kill_on_drop(true);
    let joined = match namespace_of {
        Some((pid, start)) => Joined::of(pid, start, &target.workdir)
            .map_err(|e| format!("entering the container's mount namespace: {e}"))?,
        None => None,
    };
    if let Some((pid, _)) = namespace_of {
        let net = super::netns::Joined::of(pid)
            .map_err(|e| format!("entering the container's network namespace: {e}"))?;
        if let Some(net) = net {
            net.install(&mut command);
        }
    }
    match joined {
        Some(joined) => Arc::new(joined).install(&mut command),
        None => {
            command.current_dir(&target.workdir);
        }
    }
    let status = command
        .status()
        .await
        .map_err(|e| format!("exec {program}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("command exited with {status}"))
    }
}

async fn http_check(
    http: &k8s_openapi::api::core::v1::HTTPGetAction,
    target: &ProbeTarget,
) -> Result<(), String> {
    let status = http_get(http, target).await?;
    if (200..400).contains(&status) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {status}"))
    }
}

/// Sends the GET an `httpGet` action describes (the pod's IP unless it names a host) and
/// returns the response's status; `Err` when no response came. Probes and lifecycle hooks
/// share it: a probe judges the status, a hook only needs an answer.
pub(crate) async fn http_get(
    http: &k8s_openapi::api::core::v1::HTTPGetAction,
    target: &ProbeTarget,
) -> Result<u16, String> {
    let https = http
        .scheme
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"));
    let port = resolve_port(&http.port, target)?;
    let host = http
        .host
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| target.pod_ip.clone());
    let path = http
        .path
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/".to_string());
    let path = if path.starts_with('/') {
        path
    } else {
        format!("/{path}")
    };
    let stream = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("dial tcp {host}:{port}: {e}"))?;
    let mut req = hyper::Request::get(&path);
    let mut has_host = false;
    for h in http.http_headers.iter().flatten() {
        has_host |= h.name.eq_ignore_ascii_case("host");
        req = req.header(h.name.as_str(), h.value.as_str());
    }
    if !has_host {
        req = req.header(hyper::header::HOST, format!("{host}:{port}"));
    }
    let req = req
        .header(hyper::header::USER_AGENT, "kube-probe/1.32")
        .header(hyper::header::ACCEPT, "*/*")
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| format!("http request: {e}"))?;
    let status = if https {
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| format!("server name {host}: {e}"))?;
        let tls = tokio_rustls::TlsConnector::from(insecure_tls()?)
            .connect(name, stream)
            .await
            .map_err(|e| format!("tls handshake with {host}:{port}: {e}"))?;
        get(tls, req).await?
    } else {
        get(stream, req).await?
    };
    Ok(status)
}

/// The gRPC health check's request (`grpc.health.v1.HealthCheckRequest`): field 1, the
/// service name, omitted when empty as proto3 does.
fn health_request(service: &str) -> Vec<u8> {
    let mut message = Vec::new();
    if !service.is_empty() {
        message.push(0x0a);
        put_varint(&mut message, service.len() as u64);
        message.extend_from_slice(service.as_bytes());
    }
    // The gRPC message frame: not compressed, then the length, big-endian.
    let mut frame = vec![0];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    frame
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn get_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(value);
        }
    }
    None
}

/// The `status` of a framed `grpc.health.v1.HealthCheckResponse` (0, `UNKNOWN`, when the
/// field is absent, as proto3 reads it); `None` when the bytes are not such a message.
fn health_status(frame: &[u8]) -> Option<u64> {
    if frame.len() < 5 || frame[0] != 0 {
        return None;
    }
    let len = u32::from_be_bytes(frame[1..5].try_into().ok()?) as usize;
    let message = frame.get(5..5 + len)?;
    let (mut at, mut status) = (0, 0);
    while at < message.len() {
        let key = get_varint(message, &mut at)?;
        match key & 7 {
            0 => {
                let v = get_varint(message, &mut at)?;
                if key >> 3 == 1 {
                    status = v;
                }
            }
            1 => at += 8,
            2 => at += usize::try_from(get_varint(message, &mut at)?).ok()?,
            5 => at += 4,
            _ => return None,
        }
    }
    (at == message.len()).then_some(status)
}

/// The name of a `ServingStatus`, as the kubelet's message quotes it.
fn serving_status_name(status: u64) -> String {
    match status {
        0 => "UNKNOWN".to_string(),
        1 => "SERVING".to_string(),
        2 => "NOT_SERVING".to_string(),
        3 => "SERVICE_UNKNOWN".to_string(),
        other => other.to_string(),
    }
}

/// The name of a gRPC status code, as Go's status errors print it.
fn grpc_code_name(code: u32) -> String {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    NAMES
        .get(code as usize)
        .map_or_else(|| format!("Code({code})"), |n| n.to_string())
}

/// A `grpc-message` value, percent-decoded as the gRPC spec encodes it.
fn grpc_message(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The kubelet's words for a health check that ended with gRPC status `code` (not OK).
fn grpc_failure(code: u32, message: &str, timeout: Duration) -> String {
    match code {
        12 => format!(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {message}"
        ),
        4 => format!(
            "timeout: health rpc did not complete within {}s",
            timeout.as_secs()
        ),
        _ => format!(
            "error: health rpc probe failed: rpc error: code = {} desc = {message}",
            grpc_code_name(code)
        ),
    }
}

/// One `grpc.health.v1.Health/Check` against the pod's address.
async fn grpc_check(
    grpc: &k8s_openapi::api::core::v1::GRPCAction,
    target: &ProbeTarget,
    timeout: Duration,
) -> Result<(), String> {
    use http_body_util::BodyExt;
    let port =
        u16::try_from(grpc.port).map_err(|_| format!("port {} is out of range", grpc.port))?;
    let host = target.pod_ip.as_str();
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let connect_error =
        |e: &dyn std::fmt::Display| format!("error: failed to connect service at {addr:?}: {e}");
    let stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| connect_error(&e))?;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .map_err(|e| connect_error(&e))?;
    let conn = tokio::spawn(conn);
    let request = hyper::Request::post(format!("http://{addr}/grpc.health.v1.Health/Check"))
        .header(hyper::header::CONTENT_TYPE, "application/grpc")
        .header(hyper::header::TE, "trailers")
        .header(hyper::header::USER_AGENT, "kube-probe/1.32")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            health_request(grpc.service.as_deref().unwrap_or_default()),
        )))
        .map_err(|e| format!("error: health rpc probe failed: {e}"))?;
    let outcome = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("error: health rpc probe failed: {e}"))?;
        if response.status() != hyper::StatusCode::OK {
            return Err(format!(
                "error: health rpc probe failed: unexpected HTTP status code received from server: {}",
                response.status().as_u16()
            ));
        }
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("error: health rpc probe failed: {e}"))?;
        let trailers = body.trailers().cloned().unwrap_or_default();
        // A status with no message comes in the headers alone ("trailers-only").
        let field = |name: &str| {
            trailers
                .get(name)
                .or_else(|| headers.get(name))
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let code = field("grpc-status").and_then(|c| c.parse::<u32>().ok());
        match code {
            Some(0) => {}
            Some(code) => {
                let message = grpc_message(&field("grpc-message").unwrap_or_default());
                return Err(grpc_failure(code, &message, timeout));
            }
            None => {
                return Err(
                    "error: health rpc probe failed: the server sent no grpc-status".to_string(),
                )
            }
        }
        let status = health_status(&body.to_bytes()).ok_or_else(|| {
            "error: health rpc probe failed: the response is not a HealthCheckResponse".to_string()
        })?;
        if status == 1 {
            Ok(())
        } else {
            Err(format!(
                "service unhealthy (responded with {:?})",
                serving_status_name(status)
            ))
        }
    }
    .await;
    conn.abort();
    outcome
}

/// Sends one request over a fresh HTTP/1.1 connection and returns the response status.
async fn get<S>(io: S, req: hyper::Request<Empty<bytes::Bytes>>) -> Result<u16, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let path = req.uri().path().to_string();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("http handshake: {e}"))?;
    let conn = tokio::spawn(conn);
    let response = sender
        .send_request(req)
        .await
        .map_err(|e| format!("http GET {path}: {e}"));
    conn.abort();
    Ok(response?.status().as_u16())
}

/// TLS for HTTPS probes. Like the kubelet, the probe does not verify the server's
/// certificate (containers serve self-signed ones); handshake signatures are still checked.
fn insecure_tls() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>> =
        std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .dangerous()
                .with_custom_certificate_verifier(setpoint_api::tls::AnyServerCert::new(provider))
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
        .clone()
}

/// The probe-driven facts of one run.
#[derive(Debug, Default)]
pub struct ProbeStatus {
    /// The startup probe succeeded (or there is none).
    pub started: AtomicBool,
    /// The readiness probe's verdict.
    pub ready: AtomicBool,
}

/// The probes of one run and what to do when their verdicts change.
pub struct ProbeSet {
    /// `startupProbe`.
    pub startup: Option<Probe>,
    /// `livenessProbe`.
    pub liveness: Option<Probe>,
    /// `readinessProbe`.
    pub readiness: Option<Probe>,
    /// Where they run.
    pub target: ProbeTarget,
    /// The shared verdicts.
    pub status: Arc<ProbeStatus>,
    /// Called whenever a verdict changes (the runtime notifies its subscriber).
    pub on_change: Arc<dyn Fn() + Send + Sync>,
    /// The run, for a liveness (or startup) failure to stop it (process runtime).
    pub run: Option<RunHandle>,
    /// How exec probes run and a failure stops the container, for runtimes that do it their
    /// own way (`None`: the process runtime's way).
    pub actions: Option<Arc<dyn ProbeActions>>,
    /// How long a probe-failure kill waits before SIGKILL (the pod's grace period unless
    /// the probe sets its own).
    pub grace: Duration,
    /// When the run started, which initial delays count from.
    pub started_at: tokio::time::Instant,
}

/// Consecutive results of one probe against its thresholds.
#[derive(Debug, Default)]
struct Counter {
    successes: i32,
    failures: i32,
}

impl Counter {
    fn record(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Success => {
                self.successes += 1;
                self.failures = 0;
            }
            Outcome::Failure(_) => {
                self.failures += 1;
                self.successes = 0;
            }
        }
    }
}

fn thresholds(probe: &Probe) -> (i32, i32) {
    (
        probe.success_threshold.unwrap_or(1).max(1),
        probe.failure_threshold.unwrap_or(3).max(1),
    )
}

impl ProbeSet {
    fn grace_for(&self, probe: &Probe) -> Duration {
        probe
            .termination_grace_period_seconds
            .map(|s| Duration::from_secs(s.max(1) as u64))
            .unwrap_or(self.grace)
    }

    async fn kill(&self, probe: &Probe, why: &str, detail: &str) {
        tracing::info!(why, detail, "probe failed; stopping the container");
        self.status.ready.store(false, Ordering::SeqCst);
        (self.on_change)();
        let grace = self.grace_for(probe);
        if let Some(actions) = &self.actions {
            actions.stop(grace).await;
        } else if let Some(run) = &self.run {
            run.terminate(grace).await;
        }
    }

    /// Runs until the container is started and then until it ends (the caller aborts the
    /// task when the run is over) or a liveness failure stopped it.
    pub async fn run(self) {
        if let Some(probe) = &self.startup {
            let period = secs(probe.period_seconds, 10, 1);
            let (_, failure) = thresholds(probe);
            tokio::time::sleep_until(self.started_at + secs(probe.initial_delay_seconds, 0, 0))
                .await;
            let mut counter = Counter::default();
            loop {
                let outcome = check_with(probe, &self.target, self.actions.as_deref()).await;
                counter.record(&outcome);
                if outcome == Outcome::Success {
                    self.status.started.store(true, Ordering::SeqCst);
                    (self.on_change)();
                    break;
                }
                if counter.failures >= failure {
                    if let Outcome::Failure(detail) = &outcome {
                        self.kill(probe, "startup", detail).await;
                    }
                    return;
                }
                tokio::time::sleep(period).await;
            }
        }
        let readiness = async {
            let Some(probe) = &self.readiness else {
                return std::future::pending().await;
            };
            let period = secs(probe.period_seconds, 10, 1);
            let (success, failure) = thresholds(probe);
            tokio::time::sleep_until(self.started_at + secs(probe.initial_delay_seconds, 0, 0))
                .await;
            let mut counter = Counter::default();
            loop {
                let outcome = check_with(probe, &self.target, self.actions.as_deref()).await;
                counter.record(&outcome);
                let ready = self.status.ready.load(Ordering::SeqCst);
                if !ready && counter.successes >= success {
                    self.status.ready.store(true, Ordering::SeqCst);
                    (self.on_change)();
                } else if ready && counter.failures >= failure {
                    tracing::debug!(?outcome, "readiness probe failed");
                    self.status.ready.store(false, Ordering::SeqCst);
                    (self.on_change)();
                }
                tokio::time::sleep(period).await;
            }
        };
        let liveness = async {
            let Some(probe) = &self.liveness else {
                return std::future::pending().await;
            };
            let period = secs(probe.period_seconds, 10, 1);
            let (_, failure) = thresholds(probe);
            tokio::time::sleep_until(self.started_at + secs(probe.initial_delay_seconds, 0, 0))
                .await;
            let mut counter = Counter::default();
            loop {
                let outcome = check_with(probe, &self.target, self.actions.as_deref()).await;
                counter.record(&outcome);
                if counter.failures >= failure {
                    if let Outcome::Failure(detail) = &outcome {
                        self.kill(probe, "liveness", detail).await;
                    }
                    return;
                }
                tokio::time::sleep(period).await;
            }
        };
        tokio::select! {
            () = readiness => {}
            () = liveness => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ExecAction, TCPSocketAction};

    fn target() -> ProbeTarget {
        ProbeTarget {
            pod_ip: "127.0.0.1".into(),
            ports: vec![ContainerPort {
                name: Some("web".into()),
                container_port: 8080,
                ..Default::default()
            }],
            env: vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())],
            workdir: std::env::temp_dir(),
        }
    }

    #[test]
    fn named_ports_resolve_through_container_ports() {
        let t = target();
        assert_eq!(
            resolve_port(&IntOrString::String("web".into()), &t),
            Ok(8080)
        );
        assert_eq!(resolve_port(&IntOrString::Int(81), &t), Ok(81));
        assert!(resolve_port(&IntOrString::String("nope".into()), &t).is_err());
    }

    #[tokio::test]
    async fn exec_and_tcp_checks() {
        let exec = |cmd: &str| Probe {
            exec: Some(ExecAction {
                command: Some(vec!["sh".into(), "-c".into(), cmd.into()]),
            }),
            ..Default::default()
        };
        assert_eq!(check(&exec("exit 0"), &target()).await, Outcome::Success);
        assert!(matches!(
            check(&exec("exit 3"), &target()).await,
            Outcome::Failure(_)
        ));
        let slow = Probe {
            timeout_seconds: Some(1),
            ..exec("sleep 5")
        };
        assert!(
            matches!(check(&slow, &target()).await, Outcome::Failure(m) if m.contains("timed out"))
        );

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let tcp = |port: i32| Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(port),
                host: None,
            }),
            ..Default::default()
        };
        assert_eq!(
            check(&tcp(i32::from(port)), &target()).await,
            Outcome::Success
        );
        drop(listener);
        assert!(matches!(
            check(&tcp(i32::from(port)), &target()).await,
            Outcome::Failure(_)
        ));
    }

    #[test]
    fn health_messages_encode_and_decode() {
        assert_eq!(health_request(""), vec![0, 0, 0, 0, 0]);
        assert_eq!(
            health_request("db"),
            vec![0, 0, 0, 0, 4, 0x0a, 2, b'd', b'b']
        );
        assert_eq!(health_status(&[0, 0, 0, 0, 2, 0x08, 1]), Some(1));
        assert_eq!(health_status(&[0, 0, 0, 0, 2, 0x08, 2]), Some(2));
        // An empty message is UNKNOWN; an unknown field is skipped.
        assert_eq!(health_status(&[0, 0, 0, 0, 0]), Some(0));
        assert_eq!(
            health_status(&[0, 0, 0, 0, 5, 0x12, 1, b'x', 0x08, 1]),
            Some(1)
        );
        assert_eq!(health_status(&[1, 0, 0, 0, 0]), None);
        assert_eq!(health_status(&[0, 0, 0, 0, 9, 0x08]), None);
        assert_eq!(grpc_message("not%20here%3A x"), "not here: x");
        assert_eq!(grpc_message("100%"), "100%");
        assert_eq!(
            grpc_failure(12, "unknown service", Duration::from_secs(1)),
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): unknown service"
        );
        assert_eq!(
            grpc_failure(5, "unknown service db", Duration::from_secs(1)),
            "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service db"
        );
    }

    /// Serves `grpc.health.v1.Health/Check` over plaintext HTTP/2: `""` and `"up"` are
    /// SERVING, `"down"` NOT_SERVING, anything else NotFound (a trailers-only answer);
    /// another path is Unimplemented.
    async fn health_server() -> u16 {
        use http_body_util::{BodyExt, StreamBody};
        use hyper::body::Frame;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let service = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let service =
                            String::from_utf8_lossy(body.get(7..).unwrap_or_default()).into_owned();
                        let respond = |frames: Vec<Frame<bytes::Bytes>>, status: Option<&str>| {
                            let mut builder = hyper::Response::builder()
                                .header("content-type", "application/grpc");
                            if let Some(code) = status {
                                builder = builder
                                    .header("grpc-status", code)
                                    .header("grpc-message", "unknown%20service");
                            }
                            let stream = futures::stream::iter(
                                frames.into_iter().map(Ok::<_, std::convert::Infallible>),
                            );
                            Ok::<_, std::convert::Infallible>(
                                builder.body(StreamBody::new(stream)).unwrap(),
                            )
                        };
                        if path != "/grpc.health.v1.Health/Check" {
                            return respond(Vec::new(), Some("12"));
                        }
                        let status = match service.as_str() {
                            "" | "up" => 1u8,
                            "down" => 2,
                            _ => return respond(Vec::new(), Some("5")),
                        };
                        let mut trailers = hyper::HeaderMap::new();
                        trailers.insert("grpc-status", "0".parse().unwrap());
                        respond(
                            vec![
                                Frame::data(bytes::Bytes::from(vec![0, 0, 0, 0, 2, 0x08, status])),
                                Frame::trailers(trailers),
                            ],
                            None,
                        )
                    },
                );
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), service),
                );
            }
        });
        port
    }

    #[tokio::test]
    async fn grpc_checks_ask_the_health_service() {
        let port = health_server().await;
        let probe = |service: Option<&str>, port: u16| Probe {
            grpc: Some(k8s_openapi::api::core::v1::GRPCAction {
                port: i32::from(port),
                service: service.map(str::to_string),
            }),
            ..Default::default()
        };
        assert_eq!(check(&probe(None, port), &target()).await, Outcome::Success);
        assert_eq!(
            check(&probe(Some("up"), port), &target()).await,
            Outcome::Success
        );
        assert_eq!(
            check(&probe(Some("down"), port), &target()).await,
            Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        assert_eq!(
            check(&probe(Some("gone"), port), &target()).await,
            Outcome::Failure(
                "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service"
                    .into()
            )
        );
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let outcome = check(&probe(None, closed), &target()).await;
        assert!(
            matches!(&outcome, Outcome::Failure(m) if m.starts_with(&format!("error: failed to connect service at \"127.0.0.1:{closed}\": "))),
            "{outcome:?}"
        );
    }

    /// Serves HTTPS with a self-signed certificate, answering `status` to every request.
    async fn https_server(status: u16) -> u16 {
        let generated = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let cert = generated.cert.der().clone();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(
            rustls::pki_types::PrivatePkcs8KeyDer::from(generated.signing_key.serialize_der()),
        );
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = vec![0; 4096];
                    let _ = tls.read(&mut buf).await;
                    let reply = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    let _ = tls.write_all(reply.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn https_checks_accept_self_signed_certificates() {
        let probe = |port: u16| Probe {
            http_get: Some(k8s_openapi::api::core::v1::HTTPGetAction {
                port: IntOrString::Int(i32::from(port)),
                scheme: Some("HTTPS".into()),
                path: Some("/healthz".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ok = https_server(204).await;
        assert_eq!(check(&probe(ok), &target()).await, Outcome::Success);
        let bad = https_server(500).await;
        let outcome = check(&probe(bad), &target()).await;
        assert!(
            matches!(&outcome, Outcome::Failure(m) if m.contains("500")),
            "{outcome:?}"
        );
    }
}
