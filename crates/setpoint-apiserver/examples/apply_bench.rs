//! Declarative-update benchmark for the Setpoint API server: server-side apply and strategic
//! merge patch.
//!
//! Run with
//!
//! ```text
//! cargo run --release -p setpoint-apiserver --example apply_bench -- [options]
//! ```
//!
//! The bench starts an API server in this process, as `examples/api_bench.rs` does: HTTPS with
//! client certificates on `127.0.0.1:<free port>`, the durable embedded store in a temporary data
//! dir, its own two-thread Tokio runtime; the bench client runs on another two-thread runtime and
//! talks HTTP/1.1 over TLS (rustls, the cluster CA as the only root, the admin client
//! certificate), only ever to 127.0.0.1.
//!
//! 1. **Apply creates.** `--deployments` (1,000) Deployments are created by server-side apply
//!    (`PATCH … application/apply-patch+yaml`, JSON bodies as kubectl sends) from `--clients`
//!    (32) concurrent connections.
//! 2. **No-op re-applies.** The same manifests are applied again, unchanged, from the same
//!    number of connections. Every response's `resourceVersion` must equal the one the create
//!    returned, and the list's resourceVersion must not move: a no-op apply writes nothing.
//! 3. **Strategic merge patch of a 100-container pod spec.** A Deployment (0 replicas) whose pod
//!    template has `--containers` (100) containers is created, then patched `--smp-patches`
//!    (2,000) times one after another, each patch changing one container's image and env with
//!    `$setElementOrder` directives, as `kubectl apply` (client-side) sends them. (A bare Pod
//!    would refuse env changes, as Kubernetes does.)
//!
//! Latency is per request, from just before it is sent until its whole response arrived.
//! Every loop is bounded by a count and a deadline, so the bench ends by itself.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};
use setpoint_apiserver::tls::Pki;
use setpoint_apiserver::{ApiServer, ServerConfig, StoreConfig};
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

fn fail(msg: impl Into<String>) -> BoxError {
    msg.into().into()
}

const NAMESPACE: &str = "bench";
const APPLY: &str = "application/apply-patch+yaml";
const SMP: &str = "application/strategic-merge-patch+json";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const PHASE_LIMIT: Duration = Duration::from_secs(300);

struct Options {
    deployments: usize,
    clients: usize,
    containers: usize,
    smp_patches: usize,
}

const USAGE: &str = "\
usage: apply_bench [--deployments N] [--clients N] [--containers N] [--smp-patches N]
  --deployments N   Deployments to create and re-apply by server-side apply (1000)
  --clients N       concurrent connections for the apply phases (32)
  --containers N    containers in the strategic-merge-patched pod (100)
  --smp-patches N   strategic merge patches of that pod (2000)";

fn parse_args() -> Res<Options> {
    let mut o = Options {
        deployments: 1000,
        clients: 32,
        containers: 100,
        smp_patches: 2000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "-h" || a == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let v: usize = args
            .next()
            .ok_or_else(|| fail(format!("{a} needs a value\n{USAGE}")))?
            .parse()
            .map_err(|e| fail(format!("{a}: {e}")))?;
        match a.as_str() {
            "--deployments" => o.deployments = v,
            "--clients" => o.clients = v.max(1),
            "--containers" => o.containers = v.max(1),
            "--smp-patches" => o.smp_patches = v,
            _ => return Err(fail(format!("unknown option {a}\n{USAGE}"))),
        }
    }
    Ok(o)
}

// ----------------------------------------------------------------------------------------------
// The in-process server, on its own runtime

struct ServerThread {
    addr: SocketAddr,
    pki: Pki,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn start_server(data_dir: PathBuf) -> Res<ServerThread> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Res<(SocketAddr, Pki)>>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("apiserver-main".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("apiserver")
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            rt.block_on(async move {
                let boot = async {
                    let config = ServerConfig {
                        listen: "127.0.0.1:0".parse().expect("valid address"),
                        data_dir: Some(data_dir.clone()),
                        store: StoreConfig::Embedded(data_dir.join("store")),
                        ..ServerConfig::default()
                    };
                    let store = ApiServer::open_store(&config).await?;
                    let running = ApiServer::new(config, store).await?.serve().await?;
                    // The server has written the CA and the admin certificate by now.
                    let pki = Pki::load_or_create(Some(&data_dir), running.addr)?;
                    Ok::<_, BoxError>((running, pki))
                };
                match boot.await {
                    Ok((running, pki)) => {
                        let _ = ready_tx.send(Ok((running.addr, pki)));
                        let _ = stop_rx.await;
                        let _ =
                            tokio::time::timeout(Duration::from_secs(5), running.shutdown()).await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
            rt.shutdown_timeout(Duration::from_secs(2));
        })?;
    let (addr, pki) = ready_rx
        .recv_timeout(Duration::from_secs(120))
        .map_err(|_| fail("the in-process server did not start within 120 s"))??;
    Ok(ServerThread {
        addr,
        pki,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            // The runtime shuts down with a timeout, so this join is bounded.
            let _ = t.join();
        }
    }
}

// ----------------------------------------------------------------------------------------------
// The client: HTTP/1.1 over TLS with the admin certificate

struct Tls {
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
}

impl Tls {
    fn new(addr: SocketAddr, pki: &Pki) -> Res<Tls> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pki.ca_cert.as_bytes()) {
            roots.add(cert.map_err(|e| fail(format!("CA certificate: {e}")))?)?;
        }
        let certs = CertificateDer::pem_slice_iter(pki.admin_cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| fail(format!("client certificate: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(pki.admin_key.as_bytes())
            .map_err(|e| fail(format!("client key: {e}")))?;
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            addr,
            config: Arc::new(config),
        })
    }
}

struct Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    driver: tokio::task::JoinHandle<()>,
    authority: String,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl Client {
    async fn connect(tls: &Tls) -> Res<Client> {
        let tcp = TcpStream::connect(tls.addr).await?;
        tcp.set_nodelay(true)?;
        let stream = tokio_rustls::TlsConnector::from(tls.config.clone())
            .connect(ServerName::from(tls.addr.ip()), tcp)
            .await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Client {
            sender,
            driver,
            authority: tls.addr.to_string(),
        })
    }

    async fn call(
        &mut self,
        method: Method,
        path: &str,
        content_type: &str,
        body: Bytes,
    ) -> Res<(StatusCode, Bytes)> {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.authority)
            .header(header::ACCEPT, "application/json")
            .header(header::CONTENT_TYPE, content_type)
            .body(Full::new(body))?;
        let exchange = async {
            self.sender.ready().await?;
            let resp = self.sender.send_request(req).await?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>((status, bytes))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| fail(format!("{path}: timed out")))?
    }

    /// A call that must answer `want`; returns the body as JSON.
    async fn expect(
        &mut self,
        want: &[StatusCode],
        method: Method,
        path: &str,
        content_type: &str,
        body: Bytes,
    ) -> Res<Value> {
        let (status, bytes) = self.call(method, path, content_type, body).await?;
        if !want.contains(&status) {
            let text = String::from_utf8_lossy(&bytes);
            let text: String = text.chars().take(400).collect();
            return Err(fail(format!("{path}: {status}: {text}")));
        }
        Ok(serde_json::from_slice(&bytes)?)
    }
}

// ----------------------------------------------------------------------------------------------
// Measurements

struct Stats {
    ops: usize,
    secs: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

fn stats(mut nanos: Vec<u64>, wall: Duration) -> Stats {
    nanos.sort_unstable();
    let pct = |p: f64| -> f64 {
        if nanos.is_empty() {
            return 0.0;
        }
        let rank = ((p / 100.0) * nanos.len() as f64).ceil() as usize;
        nanos[rank.clamp(1, nanos.len()) - 1] as f64 / 1e6
    };
    Stats {
        ops: nanos.len(),
        secs: wall.as_secs_f64(),
        p50_ms: pct(50.0),
        p99_ms: pct(99.0),
        max_ms: pct(100.0),
    }
}

impl Stats {
    fn print(&self, what: &str) {
        println!(
            "{what:<34} {:>6} ops in {:>7.3} s  {:>9.1} ops/s  p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms",
            self.ops,
            self.secs,
            self.ops as f64 / self.secs.max(1e-9),
            self.p50_ms,
            self.p99_ms,
            self.max_ms
        );
    }
}

// ----------------------------------------------------------------------------------------------
// The phases

fn deployment(i: usize) -> Bytes {
    let name = format!("d-{i:04}");
    let manifest = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "labels": {"app": name, "tier": "bench"}},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "web",
                    "image": "nginx:1.27",
                    "ports": [{"containerPort": 80, "protocol": "TCP"}],
                    "env": [{"name": "MODE", "value": "bench"}],
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}
                }]}
            }
        }
    });
    Bytes::from(serde_json::to_vec(&manifest).expect("serializable"))
}

fn apply_path(i: usize) -> String {
    format!("/apis/apps/v1/namespaces/{NAMESPACE}/deployments/d-{i:04}?fieldManager=apply-bench")
}

/// Applies every manifest from `clients` connections; returns the latencies and, per
/// Deployment, the resourceVersion the apply answered with.
async fn apply_phase(
    tls: &Arc<Tls>,
    manifests: &Arc<Vec<Bytes>>,
    clients: usize,
) -> Res<(Stats, Vec<String>)> {
    let next = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + PHASE_LIMIT;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (tls, manifests, next) = (tls.clone(), manifests.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(&tls).await?;
            let mut out: Vec<(usize, u64, String)> = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= manifests.len() || Instant::now() > deadline {
                    break;
                }
                let t = Instant::now();
                let v = client
                    .expect(
                        &[StatusCode::OK, StatusCode::CREATED],
                        Method::PATCH,
                        &apply_path(i),
                        APPLY,
                        manifests[i].clone(),
                    )
                    .await?;
                let nanos = t.elapsed().as_nanos() as u64;
                let rv = v["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                out.push((i, nanos, rv));
            }
            Ok::<_, BoxError>(out)
        }));
    }
    let mut nanos = Vec::new();
    let mut rvs = vec![String::new(); manifests.len()];
    for t in tasks {
        for (i, n, rv) in t.await?? {
            nanos.push(n);
            rvs[i] = rv;
        }
    }
    let wall = start.elapsed();
    if nanos.len() != manifests.len() {
        return Err(fail(format!(
            "only {} of {} applies finished within {} s",
            nanos.len(),
            manifests.len(),
            PHASE_LIMIT.as_secs()
        )));
    }
    Ok((stats(nanos, wall), rvs))
}

async fn list_resource_version(client: &mut Client) -> Res<(String, Vec<(String, String)>)> {
    let v = client
        .expect(
            &[StatusCode::OK],
            Method::GET,
            &format!("/apis/apps/v1/namespaces/{NAMESPACE}/deployments"),
            "application/json",
            Bytes::new(),
        )
        .await?;
    let items = v["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|d| {
                    let m = &d["metadata"];
                    let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
                    (s("name"), s("resourceVersion"))
                })
                .collect()
        })
        .unwrap_or_default();
    let rv = v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok((rv, items))
}

/// A Deployment whose pod template has `containers` containers. (A Pod itself would refuse the
/// env changes: pod updates may change only images and a few other fields.)
fn wide_deployment(containers: usize) -> Value {
    let containers: Vec<Value> = (0..containers)
        .map(|i| {
            json!({"name": format!("c{i:03}"), "image": "busybox:1.36",
                   "command": ["sleep", "infinity"],
                   "env": [{"name": "INDEX", "value": i.to_string()}]})
        })
        .collect();
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "wide", "namespace": NAMESPACE},
           "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "wide"}},
                    "template": {"metadata": {"labels": {"app": "wide"}},
                                 "spec": {"containers": containers}}}})
}

/// A strategic merge patch changing container `target`'s image and env, with the
/// `$setElementOrder` lists kubectl sends along.
fn smp_patch(containers: usize, target: usize, round: usize) -> Bytes {
    let order: Vec<Value> = (0..containers)
        .map(|i| json!({"name": format!("c{i:03}")}))
        .collect();
    let patch = json!({"spec": {"template": {"spec": {
        "$setElementOrder/containers": order,
        "containers": [{
            "name": format!("c{target:03}"),
            "image": format!("busybox:1.{}", round % 1000),
            "$setElementOrder/env": [{"name": "INDEX"}, {"name": "ROUND"}],
            "env": [{"name": "ROUND", "value": round.to_string()}]
        }]
    }}}});
    Bytes::from(serde_json::to_vec(&patch).expect("serializable"))
}

async fn smp_phase(tls: &Tls, containers: usize, patches: usize) -> Res<Stats> {
    let mut client = Client::connect(tls).await?;
    let body = Bytes::from(serde_json::to_vec(&wide_deployment(containers))?);
    client
        .expect(
            &[StatusCode::CREATED],
            Method::POST,
            &format!("/apis/apps/v1/namespaces/{NAMESPACE}/deployments"),
            "application/json",
            body,
        )
        .await?;
    let path = format!("/apis/apps/v1/namespaces/{NAMESPACE}/deployments/wide");
    let deadline = Instant::now() + PHASE_LIMIT;
    let mut nanos = Vec::with_capacity(patches);
    let start = Instant::now();
    let mut last = Value::Null;
    for round in 0..patches {
        if Instant::now() > deadline {
            break;
        }
        let target = (round * 37) % containers;
        let body = smp_patch(containers, target, round);
        let t = Instant::now();
        last = client
            .expect(&[StatusCode::OK], Method::PATCH, &path, SMP, body)
            .await?;
        nanos.push(t.elapsed().as_nanos() as u64);
    }
    let wall = start.elapsed();
    // The last patch took effect where it should and kept the order and the other containers.
    if patches > 0 {
        let round = patches - 1;
        let target = (round * 37) % containers;
        let cs = last["spec"]["template"]["spec"]["containers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let c = &cs[target];
        let ok = cs.len() == containers
            && c["name"] == format!("c{target:03}")
            && c["image"] == format!("busybox:1.{}", round % 1000)
            && c["env"]
                == json!([{"name": "INDEX", "value": target.to_string()},
                                  {"name": "ROUND", "value": round.to_string()}]);
        if !ok {
            return Err(fail(format!(
                "the last patch did not give the expected container: {c}"
            )));
        }
    }
    Ok(stats(nanos, wall))
}

async fn run(tls: Arc<Tls>, o: &Options) -> Res<()> {
    let mut admin = Client::connect(&tls).await?;
    admin
        .expect(
            &[StatusCode::CREATED],
            Method::POST,
            "/api/v1/namespaces",
            "application/json",
            Bytes::from(serde_json::to_vec(
                &json!({"metadata": {"name": NAMESPACE}}),
            )?),
        )
        .await?;
    let manifests: Arc<Vec<Bytes>> = Arc::new((0..o.deployments).map(deployment).collect());

    eprintln!("apply-creating {} Deployments…", o.deployments);
    let (created, created_rvs) = apply_phase(&tls, &manifests, o.clients).await?;
    let (list_rv_before, items_before) = list_resource_version(&mut admin).await?;

    eprintln!("re-applying them unchanged…");
    let (noop, noop_rvs) = apply_phase(&tls, &manifests, o.clients).await?;
    let (list_rv_after, items_after) = list_resource_version(&mut admin).await?;

    let changed_in_responses = created_rvs
        .iter()
        .zip(&noop_rvs)
        .filter(|(a, b)| a != b)
        .count();
    let changed_in_list = items_before
        .iter()
        .zip(&items_after)
        .filter(|(a, b)| a != b)
        .count()
        + items_before.len().abs_diff(items_after.len());

    eprintln!(
        "strategic merge patches of a {}-container pod template…",
        o.containers
    );
    let smp = smp_phase(&tls, o.containers, o.smp_patches).await?;

    println!();
    println!(
        "server-side apply, {} Deployments, {} clients (HTTPS, embedded store):",
        o.deployments, o.clients
    );
    created.print("  apply (create)");
    noop.print("  apply (no-op re-apply)");
    println!(
        "  no-op check: {} of {} resourceVersions changed in apply responses, {} in the list; \
         list resourceVersion {} before, {} after -> {}",
        changed_in_responses,
        o.deployments,
        changed_in_list,
        list_rv_before,
        list_rv_after,
        if changed_in_responses == 0 && changed_in_list == 0 && list_rv_before == list_rv_after {
            "no writes"
        } else {
            "WROTE"
        }
    );
    println!(
        "strategic merge patch, one {}-container pod template, 1 client (image + env, $setElementOrder):",
        o.containers
    );
    smp.print("  SMP patch");
    if changed_in_responses != 0 || changed_in_list != 0 || list_rv_before != list_rv_after {
        return Err(fail("no-op applies wrote"));
    }
    Ok(())
}

fn main() -> Res<()> {
    let opts = parse_args()?;
    let dir = tempfile::tempdir()?;
    let server = start_server(dir.path().to_path_buf())?;
    let tls = Arc::new(Tls::new(server.addr, &server.pki)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-client")
        .enable_all()
        .build()?;
    let result = rt.block_on(run(tls, &opts));
    drop(rt);
    drop(server);
    result
}
