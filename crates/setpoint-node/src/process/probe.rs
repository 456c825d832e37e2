//! Container probes: exec, httpGet (HTTP and HTTPS) and tcpSocket checks, and the loop that applies
//! Kubernetes' probe timing (initial delay, period, timeout, thresholds) for one run.

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
    } else if probe.grpc.is_some() {
        Err("grpc probes are not supported yet".to_string())
    } else {
        Err("probe has no handler".to_string())
    };
    match result {
        Ok(()) => Outcome::Success,
        Err(e) => Outcome::Failure(e),
    }
}

async fn exec_check(argv: &[String], target: &ProbeTarget) -> Result<(), String> {
    let (program, args) = argv.split_first().ok_or("exec probe has no command")?;
    let status = tokio::process::Command::new(program)
        .args(args)
        .env_clear()
        .envs(target.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&target.workdir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        // A timed-out check is dropped: its process must not outlive it.
        .kill_on_drop(true)
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
