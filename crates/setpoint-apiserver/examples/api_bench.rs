//! API benchmark for the Setpoint API server.
//!
//! Run with
//!
//! ```text
//! cargo run --release -p setpoint-apiserver --example api_bench -- [options]
//! ```
//!
//! # What it measures
//!
//! By default the bench starts an API server in this process: HTTPS with client certificates on
//! `127.0.0.1:<free port>`, the durable embedded store in a temporary data dir (`--store memory`
//! for the in-memory one). The server gets its own two-thread Tokio runtime and the bench client
//! another one, so both share the machine's cores the way two processes would. Every request goes
//! over TLS (rustls with the `ring` provider, the cluster CA as the only root, the admin client
//! certificate that the server wrote to `<data dir>/pki`), only ever to 127.0.0.1.
//!
//! 1. **Creates over HTTPS.** `--clients` connections (one TLS connection and one HTTP/1.1
//!    client each) POST ~1 KiB ConfigMaps into namespace `bench` until `--creates` are done (or
//!    `--duration` seconds have passed), then ~1.5 KiB Pods (`--pods`) the same way. Latency is
//!    measured per request from just before it is sent until its whole response body arrived;
//!    throughput is successful creates divided by the wall time of the phase.
//! 2. **LIST of all pods from the watch cache.** `GET /api/v1/namespaces/bench/pods` without a
//!    limit, with `resourceVersion=0` and without a resourceVersion, one untimed cold request each
//!    (it also checks the item count), then `--list-runs` sequential timed requests each, timed
//!    until the last byte of the body arrived.
//! 3. **Watch fan-out.** `--watchers` watches on the ConfigMaps of `bench` from the current
//!    resourceVersion, multiplexed as HTTP/2 streams over `--watch-conns` TLS connections (or one
//!    HTTP/1.1 TLS connection each with `--watch-transport h1`). Then `--events` ConfigMaps are
//!    created one at a time, each only after every watcher received the previous one (plus one
//!    untimed warm-up event first). For every (event, watcher) pair the delay is the time from
//!    the moment the create's HTTP response arrived at the bench client to the moment that
//!    watcher's stream delivered the line of the event. The commit happened somewhat before the
//!    response arrived, so this slightly understates the true commit-to-watcher delay; an event
//!    that reached a watcher before the response reached the writer counts as 0.
//! 4. **Ready time of `setpoint up`** (only with `--setpoint-bin PATH`, and not with
//!    `--skip-ready`): spawns `PATH up --listen 127.0.0.1:<free port> --data-dir <empty temp
//!    dir>`, waits for `<data dir>/pki/ca.crt` to appear, then polls `GET /readyz` anonymously
//!    over HTTPS with at most a fraction of a millisecond between attempts, and reports the time
//!    from spawn to the first 200 over `--ready-runs` runs. This runs first, before the in-process
//!    server starts, so nothing else competes for the cores.
//!
//! Every phase also records where the time went: CPU seconds per thread group (server runtime,
//! store committer, bench client, read from `/proc/self/task`), the server's own request and
//! store latency histograms (its Prometheus metrics), and for the embedded store the number of
//! group commits (one fsync each).
//!
//! All loops are bounded by counts and deadlines, so the bench ends by itself. The exit code is
//! 0 when the bench ran to the end, whether or not the targets were met. `--json` prints one JSON
//! document on stdout instead of the table; progress always goes to stderr.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};
use setpoint_apiserver::tls::Pki;
use setpoint_apiserver::{ApiServer, ServerConfig, StoreConfig};
use setpoint_store::embedded::{EmbeddedOptions, EmbeddedStore};
use setpoint_store::Store;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

fn fail(msg: impl Into<String>) -> BoxError {
    msg.into().into()
}

/// Longest any single request may take before the bench gives up on it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a whole create phase may run, unless `--duration` says otherwise.
const DEFAULT_PHASE_LIMIT: Duration = Duration::from_secs(120);
/// Longest the watch phase may take, opening the watches included.
const WATCH_PHASE_LIMIT: Duration = Duration::from_secs(120);
/// Longest one event may take to reach every watcher before the bench moves on.
const EVENT_LIMIT: Duration = Duration::from_secs(10);
/// Longest one `setpoint up` may take to become ready.
const READY_LIMIT: Duration = Duration::from_secs(20);
/// Pause between readiness attempts: well under a millisecond, so polling adds little.
const READY_POLL_PAUSE: Duration = Duration::from_micros(200);
const NAMESPACE: &str = "bench";
/// Stands for the object name in the JSON templates.
const NAME_PLACEHOLDER: &str = "@@NAME@@";
/// The name prefix of the watch-phase ConfigMaps; watchers find the event number after it.
const WATCH_PREFIX: &str = "wbench-";

// ----------------------------------------------------------------------------------------------
// Options

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StoreKind {
    Embedded,
    Memory,
}

#[derive(Clone, Debug)]
struct Options {
    clients: usize,
    creates: usize,
    pods: usize,
    watchers: usize,
    events: usize,
    store: StoreKind,
    skip_ready: bool,
    setpoint_bin: Option<PathBuf>,
    json: bool,
    duration: Option<Duration>,
    list_runs: usize,
    watch_conns: usize,
    watch_h1: bool,
    ready_runs: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            clients: 32,
            creates: 20_000,
            pods: 10_000,
            watchers: 1_000,
            events: 200,
            store: StoreKind::Embedded,
            skip_ready: false,
            setpoint_bin: None,
            json: false,
            duration: None,
            list_runs: 20,
            watch_conns: 10,
            watch_h1: false,
            ready_runs: 5,
        }
    }
}

const USAGE: &str = "\
api_bench: benchmark the Setpoint API server over HTTPS on 127.0.0.1

USAGE: cargo run --release -p setpoint-apiserver --example api_bench -- [OPTIONS]

OPTIONS:
  --clients N             concurrent create clients, one TLS connection each [32]
  --creates N             ConfigMaps to create [20000]
  --pods N                Pods to create (listed in the LIST phase) [10000]
  --duration SECS         stop each create phase after this long [120, a safety cap]
  --list-runs N           timed LIST requests per variant [20]
  --watchers N            concurrent watches [1000]
  --watch-conns N         HTTP/2 connections the watches share [10]
  --watch-transport T     h2 (multiplexed) or h1 (one connection per watch) [h2]
  --events N              measured watch events [200]
  --store KIND            embedded or memory [embedded]
  --setpoint-bin PATH     measure the ready time of `PATH up`
  --ready-runs N          runs of `setpoint up` [5]
  --skip-ready            skip the ready-time measurement even with --setpoint-bin
  --json                  print a JSON document instead of the table
  -h, --help              this text
";

fn parse_args() -> Res<Options> {
    let mut o = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Res<String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => args
                    .next()
                    .ok_or_else(|| fail(format!("{name} needs a value"))),
            }
        };
        let number = |name: &str, v: String| -> Res<usize> {
            v.replace('_', "")
                .parse::<usize>()
                .map_err(|_| fail(format!("{name}: not a number: {v:?}")))
        };
        match flag.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            "--clients" => o.clients = number(&flag, value(&flag)?)?.max(1),
            "--creates" => o.creates = number(&flag, value(&flag)?)?,
            "--pods" => o.pods = number(&flag, value(&flag)?)?,
            "--watchers" => o.watchers = number(&flag, value(&flag)?)?,
            "--events" => o.events = number(&flag, value(&flag)?)?,
            "--list-runs" => o.list_runs = number(&flag, value(&flag)?)?.max(1),
            "--watch-conns" => o.watch_conns = number(&flag, value(&flag)?)?.max(1),
            "--ready-runs" => o.ready_runs = number(&flag, value(&flag)?)?.max(1),
            "--duration" => {
                o.duration = Some(Duration::from_secs(
                    number(&flag, value(&flag)?)?.max(1) as u64
                ))
            }
            "--watch-transport" => {
                o.watch_h1 = match value(&flag)?.as_str() {
                    "h2" => false,
                    "h1" => true,
                    other => {
                        return Err(fail(format!(
                            "--watch-transport: expected h2 or h1, got {other:?}"
                        )))
                    }
                }
            }
            "--store" => {
                o.store = match value(&flag)?.as_str() {
                    "embedded" => StoreKind::Embedded,
                    "memory" => StoreKind::Memory,
                    other => {
                        return Err(fail(format!(
                            "--store: expected embedded or memory, got {other:?}"
                        )))
                    }
                }
            }
            "--setpoint-bin" => o.setpoint_bin = Some(PathBuf::from(value(&flag)?)),
            "--skip-ready" => o.skip_ready = true,
            "--json" => o.json = true,
            other => return Err(fail(format!("unknown argument {other:?}\n\n{USAGE}"))),
        }
    }
    Ok(o)
}

// ----------------------------------------------------------------------------------------------
// Statistics

/// Latency figures in milliseconds.
#[derive(Clone, Copy, Debug, Default)]
struct Summary {
    n: usize,
    mean: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarizes durations given in nanoseconds.
fn summarize(mut nanos: Vec<u64>) -> Summary {
    if nanos.is_empty() {
        return Summary::default();
    }
    nanos.sort_unstable();
    let ms = |v: u64| v as f64 / 1e6;
    let total: u128 = nanos.iter().map(|&v| v as u128).sum();
    Summary {
        n: nanos.len(),
        mean: total as f64 / nanos.len() as f64 / 1e6,
        p50: ms(percentile(&nanos, 50.0)),
        p90: ms(percentile(&nanos, 90.0)),
        p99: ms(percentile(&nanos, 99.0)),
        max: ms(*nanos.last().expect("not empty")),
    }
}

impl Summary {
    fn to_json(self) -> Value {
        json!({"n": self.n, "mean_ms": r3(self.mean), "p50_ms": r3(self.p50), "p90_ms": r3(self.p90),
               "p99_ms": r3(self.p99), "max_ms": r3(self.max)})
    }
}

fn r3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

// ----------------------------------------------------------------------------------------------
// Where the time goes: per-thread CPU, the server's metrics, the store's group commits

/// CPU seconds used so far by this process's threads, grouped by thread name.
fn thread_cpu() -> BTreeMap<&'static str, f64> {
    // Linux reports utime/stime in clock ticks; USER_HZ is 100 on every mainstream build.
    const TICKS_PER_SECOND: f64 = 100.0;
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the command name: state is field 3 of the line, utime 14 and stime 15.
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let group = thread_group(comm.trim());
        *out.entry(group).or_insert(0.0) += (ticks(11) + ticks(12)) / TICKS_PER_SECOND;
    }
    out
}

fn thread_group(comm: &str) -> &'static str {
    if comm.starts_with("apiserver") {
        "server"
    } else if comm.starts_with("setpoint-store") {
        "store committer"
    } else if comm.starts_with("bench-client") || comm == "api_bench" {
        // The main thread drives the bench's top-level future.
        "bench client"
    } else {
        "other"
    }
}

/// One Prometheus histogram (cumulative buckets), or the difference of two snapshots.
#[derive(Clone, Debug, Default)]
struct Hist {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

fn label_value<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
    let len = labels[start..].find('"')?;
    Some(&labels[start..start + len])
}

/// Reads a histogram from the Prometheus text exposition, matching all `labels`.
fn parse_hist(text: &str, name: &str, labels: &[(&str, &str)]) -> Hist {
    let mut h = Hist::default();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let line = line.split(" # ").next().unwrap_or(line);
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let (metric, lbl) = match series.find('{') {
            Some(i) => (&series[..i], &series[i..]),
            None => (series, ""),
        };
        if !labels.iter().all(|(k, v)| label_value(lbl, k) == Some(*v)) {
            continue;
        }
        match metric.strip_prefix(name) {
            Some("_sum") => h.sum = value,
            Some("_count") => h.count = value,
            Some("_bucket") => {
                let le = match label_value(lbl, "le") {
                    Some("+Inf") => f64::INFINITY,
                    Some(v) => v.parse().unwrap_or(f64::INFINITY),
                    None => continue,
                };
                h.buckets.push((le, value));
            }
            _ => {}
        }
    }
    h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    h
}

/// Sums of all series of a counter or gauge whose labels match.
fn parse_scalar(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut total = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (metric, lbl) = match series.find('{') {
            Some(i) => (&series[..i], &series[i..]),
            None => (series, ""),
        };
        if metric == name && labels.iter().all(|(k, v)| label_value(lbl, k) == Some(*v)) {
            total += value.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    total
}

impl Hist {
    fn minus(&self, before: &Hist) -> Hist {
        let buckets = self
            .buckets
            .iter()
            .map(|(le, n)| {
                let b = before
                    .buckets
                    .iter()
                    .find(|(l, _)| l == le)
                    .map(|(_, n)| *n)
                    .unwrap_or(0.0);
                (*le, n - b)
            })
            .collect();
        Hist {
            buckets,
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    fn mean_ms(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count * 1000.0)
    }

    /// The upper bound of the bucket holding the `q` quantile, in ms (a coarse upper bound:
    /// the server's buckets double in width).
    fn quantile_bound_ms(&self, q: f64) -> Option<f64> {
        if self.count <= 0.0 {
            return None;
        }
        let want = q * self.count;
        self.buckets
            .iter()
            .find(|(_, n)| *n >= want)
            .map(|(le, _)| le * 1000.0)
    }
}

/// A snapshot at the start of a phase.
struct Probe {
    at: Instant,
    cpu: BTreeMap<&'static str, f64>,
    metrics: String,
    commits: Option<(u64, u64)>,
}

/// What a phase cost, as seen from inside the process.
#[derive(Debug, Default)]
struct Diag {
    wall_s: f64,
    cpu_s: BTreeMap<&'static str, f64>,
    /// (label, histogram difference over the phase).
    hists: Vec<(String, Hist)>,
    /// (commits, writes) of the embedded store over the phase.
    commits: Option<(u64, u64)>,
    watchers_dropped: f64,
}

/// Histograms a phase reports: (label, metric, labels).
type Series<'a> = &'a [(&'a str, &'a str, &'a [(&'a str, &'a str)])];

const REQ_HIST: &str = "apiserver_request_duration_seconds";
const STORE_HIST: &str = "setpoint_store_request_duration_seconds";

fn commit_stats(srv: &ServerInfo) -> Option<(u64, u64)> {
    srv.embedded.as_ref().map(|s| {
        let st = s.stats();
        (st.commits, st.writes)
    })
}

fn probe(srv: &ServerInfo) -> Probe {
    Probe {
        at: Instant::now(),
        cpu: thread_cpu(),
        metrics: srv.server.metrics().render(),
        commits: commit_stats(srv),
    }
}

fn dropped_watchers(text: &str) -> f64 {
    parse_scalar(text, "apiserver_watchers_dropped_total", &[])
        + parse_scalar(text, "apiserver_watchers_dropped", &[])
}

impl Probe {
    fn finish(&self, srv: &ServerInfo, series: Series<'_>) -> Diag {
        let wall_s = self.at.elapsed().as_secs_f64();
        let now_cpu = thread_cpu();
        let cpu_s = now_cpu
            .iter()
            .map(|(k, v)| (*k, (v - self.cpu.get(k).copied().unwrap_or(0.0)).max(0.0)))
            .collect();
        let metrics = srv.server.metrics().render();
        let hists = series
            .iter()
            .map(|(label, name, labels)| {
                let after = parse_hist(&metrics, name, labels);
                let before = parse_hist(&self.metrics, name, labels);
                (label.to_string(), after.minus(&before))
            })
            .collect();
        let commits = match (self.commits, commit_stats(srv)) {
            (Some((c0, w0)), Some((c1, w1))) => Some((c1 - c0, w1 - w0)),
            _ => None,
        };
        let watchers_dropped = dropped_watchers(&metrics) - dropped_watchers(&self.metrics);
        Diag {
            wall_s,
            cpu_s,
            hists,
            commits,
            watchers_dropped,
        }
    }
}

impl Diag {
    fn to_json(&self) -> Value {
        let hists: serde_json::Map<String, Value> = self
            .hists
            .iter()
            .map(|(label, h)| {
                (
                    label.clone(),
                    json!({"count": h.count, "mean_ms": h.mean_ms().map(r3),
                           "p50_bucket_le_ms": h.quantile_bound_ms(0.5).map(r3),
                           "p99_bucket_le_ms": h.quantile_bound_ms(0.99).map(r3)}),
                )
            })
            .collect();
        json!({
            "wall_s": r3(self.wall_s),
            "cpu_s": self.cpu_s.iter().map(|(k, v)| (k.to_string(), json!(r3(*v)))).collect::<serde_json::Map<_, _>>(),
            "server_histograms": hists,
            "store_commits": self.commits.map(|(c, w)| json!({"commits": c, "writes": w})),
            "watchers_dropped": self.watchers_dropped,
        })
    }

    fn render(&self, out: &mut String) {
        let cpu: Vec<String> = self
            .cpu_s
            .iter()
            .filter(|(_, v)| **v >= 0.005)
            .map(|(k, v)| format!("{k} {v:.2} s ({:.2} cores)", v / self.wall_s.max(1e-9)))
            .collect();
        let _ = writeln!(
            out,
            "    wall {:.2} s; CPU: {}",
            self.wall_s,
            if cpu.is_empty() {
                "-".into()
            } else {
                cpu.join(", ")
            }
        );
        for (label, h) in &self.hists {
            if let Some(mean) = h.mean_ms() {
                let _ = writeln!(
                    out,
                    "    server {label}: {} requests, mean {mean:.2} ms, p50 <= {:.2} ms, p99 <= {:.2} ms (bucket bounds)",
                    h.count,
                    h.quantile_bound_ms(0.5).unwrap_or(0.0),
                    h.quantile_bound_ms(0.99).unwrap_or(0.0)
                );
            }
        }
        if let Some((c, w)) = self.commits {
            if c > 0 {
                let _ = writeln!(
                    out,
                    "    store: {w} writes in {c} fsync'd commits ({:.1} writes/commit, {:.0} commits/s)",
                    w as f64 / c as f64,
                    c as f64 / self.wall_s.max(1e-9)
                );
            }
        }
        if self.watchers_dropped > 0.0 {
            let _ = writeln!(
                out,
                "    server dropped {} slow watchers",
                self.watchers_dropped
            );
        }
    }
}

// ----------------------------------------------------------------------------------------------
// The in-process server

struct ServerInfo {
    addr: SocketAddr,
    server: Arc<ApiServer>,
    /// The embedded store, kept to read its group-commit counters.
    embedded: Option<Arc<EmbeddedStore>>,
    pki: Pki,
}

struct ServerThread {
    info: ServerInfo,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Opens the store and starts the server, as `setpoint server` would.
async fn boot(
    kind: StoreKind,
    data_dir: PathBuf,
) -> Res<(setpoint_apiserver::server::Running, ServerInfo)> {
    let store_dir = data_dir.join("store");
    let config = ServerConfig {
        listen: "127.0.0.1:0".parse().expect("valid address"),
        data_dir: Some(data_dir.clone()),
        store: match kind {
            StoreKind::Memory => StoreConfig::Memory,
            StoreKind::Embedded => StoreConfig::Embedded(store_dir.clone()),
        },
        ..ServerConfig::default()
    };
    let (store, embedded): (Arc<dyn Store>, Option<Arc<EmbeddedStore>>) = match kind {
        StoreKind::Memory => (ApiServer::open_store(&config).await?, None),
        StoreKind::Embedded => {
            // What `open_store` does for `StoreConfig::Embedded`, keeping the concrete type so
            // the bench can read how many writes shared each fsync.
            std::fs::create_dir_all(&store_dir)?;
            let s = Arc::new(EmbeddedStore::open(&store_dir, EmbeddedOptions::default())?);
            let dynamic: Arc<dyn Store> = s.clone();
            (dynamic, Some(s))
        }
    };
    let server = ApiServer::new(config, store).await?;
    let running = server.serve().await?;
    // The server has written the CA and the admin certificate into the data dir by now.
    let pki = Pki::load_or_create(Some(&data_dir), running.addr)?;
    let info = ServerInfo {
        addr: running.addr,
        server: running.server.clone(),
        embedded,
        pki,
    };
    Ok((running, info))
}

fn start_server(kind: StoreKind, data_dir: &Path) -> Res<ServerThread> {
    let data_dir = data_dir.to_path_buf();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Res<ServerInfo>>();
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
                match boot(kind, data_dir).await {
                    Ok((running, info)) => {
                        let _ = ready_tx.send(Ok(info));
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
    let info = ready_rx
        .recv_timeout(Duration::from_secs(120))
        .map_err(|_| fail("the in-process server did not start within 120 s"))??;
    Ok(ServerThread {
        info,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

impl ServerThread {
    fn stop(&mut self) {
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
// Clients: TLS, HTTP/1.1 and HTTP/2

/// How to reach the server: address and TLS settings for HTTP/1.1 and HTTP/2.
#[derive(Clone)]
struct Tls {
    addr: SocketAddr,
    authority: String,
    h1: Arc<rustls::ClientConfig>,
    h2: Arc<rustls::ClientConfig>,
}

impl Tls {
    /// Trusts only `ca_pem`; presents `client` (certificate and key PEM) if given.
    fn new(addr: SocketAddr, ca_pem: &str, client: Option<(&str, &str)>) -> Res<Tls> {
        let make = |alpn: &[u8]| -> Res<Arc<rustls::ClientConfig>> {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
                roots.add(cert.map_err(|e| fail(format!("CA certificate: {e}")))?)?;
            }
            if roots.is_empty() {
                return Err(fail("no certificate in the CA PEM"));
            }
            let builder = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots);
            let mut cfg = match client {
                Some((cert, key)) => {
                    let certs = CertificateDer::pem_slice_iter(cert.as_bytes())
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| fail(format!("client certificate: {e}")))?;
                    let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
                        .map_err(|e| fail(format!("client key: {e}")))?;
                    builder.with_client_auth_cert(certs, key)?
                }
                None => builder.with_no_client_auth(),
            };
            cfg.alpn_protocols = vec![alpn.to_vec()];
            Ok(Arc::new(cfg))
        };
        Ok(Tls {
            addr,
            authority: addr.to_string(),
            h1: make(b"http/1.1")?,
            h2: make(b"h2")?,
        })
    }

    async fn connect(&self, h2: bool) -> Res<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let cfg = if h2 { self.h2.clone() } else { self.h1.clone() };
        let name = ServerName::from(self.addr.ip());
        Ok(tokio_rustls::TlsConnector::from(cfg)
            .connect(name, tcp)
            .await?)
    }
}

/// One HTTP/1.1 client over its own TLS connection.
struct H1 {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    driver: JoinHandle<()>,
    authority: String,
}

impl Drop for H1 {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl H1 {
    async fn connect(tls: &Tls) -> Res<H1> {
        let io = TokioIo::new(tls.connect(false).await?);
        let (sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(H1 {
            sender,
            driver,
            authority: tls.authority.clone(),
        })
    }

    /// Sends a request and returns once the response head arrived.
    async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Res<hyper::Response<Incoming>> {
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.authority)
            .header(header::ACCEPT, "application/json");
        let body = match body {
            Some(bytes) => {
                b = b.header(header::CONTENT_TYPE, "application/json");
                Full::new(bytes)
            }
            None => Full::new(Bytes::new()),
        };
        let req = b.body(body)?;
        self.sender.ready().await?;
        Ok(self.sender.send_request(req).await?)
    }

    /// A whole request and response.
    async fn call(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Res<(StatusCode, Bytes)> {
        let exchange = async {
            let resp = self.send(method, path, body).await?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>((status, bytes))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| fail(format!("{path}: timed out")))?
    }

    /// A GET whose body is read frame by frame and only counted (no copy into one buffer).
    async fn get_counting(&mut self, path: &str) -> Res<(StatusCode, usize)> {
        let exchange = async {
            let resp = self.send(Method::GET, path, None).await?;
            let status = resp.status();
            let mut body = resp.into_body();
            let mut n = 0;
            while let Some(frame) = body.frame().await {
                if let Some(data) = frame?.data_ref() {
                    n += data.len();
                }
            }
            Ok::<_, BoxError>((status, n))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| fail(format!("{path}: timed out")))?
    }

    fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

/// One HTTP/2 connection over TLS; watches share it as streams.
struct H2 {
    sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    driver: JoinHandle<()>,
}

impl Drop for H2 {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

impl H2 {
    async fn connect(tls: &Tls) -> Res<H2> {
        let io = TokioIo::new(tls.connect(true).await?);
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(H2 { sender, driver })
    }
}

fn short(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(body);
    if s.len() > 300 {
        let mut end = 300;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    } else {
        s.into_owned()
    }
}

// ----------------------------------------------------------------------------------------------
// Objects

/// A JSON object with its name cut out, so a body is two copies and a number.
struct Template {
    head: String,
    tail: String,
    prefix: &'static str,
}

impl Template {
    fn new(obj: Value, prefix: &'static str) -> Template {
        let text = serde_json::to_string(&obj).expect("serializable");
        let (head, tail) = text
            .split_once(NAME_PLACEHOLDER)
            .expect("the template holds the placeholder");
        Template {
            head: head.to_string(),
            tail: tail.to_string(),
            prefix,
        }
    }

    fn name(&self, i: usize) -> String {
        format!("{}{i:06}", self.prefix)
    }

    fn render(&self, i: usize) -> Bytes {
        let mut s = String::with_capacity(self.head.len() + self.tail.len() + 32);
        s.push_str(&self.head);
        s.push_str(&self.name(i));
        s.push_str(&self.tail);
        Bytes::from(s)
    }

    fn size(&self) -> usize {
        self.render(0).len()
    }
}

/// A ConfigMap with about 1 KiB of data, like a small application config.
fn configmap_template(prefix: &'static str) -> Template {
    let properties = (0..12)
        .map(|i| format!("setting.{i:02}=value-{i:02}-abcdefghijklmnopqrstuvwxyz\n"))
        .collect::<String>();
    Template::new(
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": NAME_PLACEHOLDER,
                "namespace": NAMESPACE,
                "labels": {"app": "bench", "component": "config", "tier": "backend"},
            },
            "data": {
                "application.properties": properties,
                "log-level": "info",
                "feature-flags": "alpha=false,beta=true,gamma=false,delta=true,epsilon=false",
                "upstreams": "http://backend-0.backend.bench.svc:8080,http://backend-1.backend.bench.svc:8080,http://backend-2.backend.bench.svc:8080",
                "motd": "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.",
            }
        }),
        prefix,
    )
}

/// A realistic Pod (~1.5 KiB): one container with ports, env, resources, probes and a volume.
fn pod_template() -> Template {
    Template::new(
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": NAME_PLACEHOLDER,
                "namespace": NAMESPACE,
                "labels": {
                    "app": "web", "tier": "frontend", "pod-template-hash": "5d8f7c9b4d",
                    "app.kubernetes.io/name": "web", "app.kubernetes.io/version": "1.25.3"
                },
                "annotations": {"kubectl.kubernetes.io/default-container": "web", "prometheus.io/scrape": "true"}
            },
            "spec": {
                "containers": [{
                    "name": "web",
                    "image": "registry.example.com/team/web:1.25.3",
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["--port=8080", "--metrics-port=9090", "--log-format=json"],
                    "ports": [
                        {"name": "http", "containerPort": 8080, "protocol": "TCP"},
                        {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}
                    ],
                    "env": [
                        {"name": "LOG_LEVEL", "value": "info"},
                        {"name": "CACHE_SIZE", "value": "256"},
                        {"name": "UPSTREAM_URL", "value": "http://backend.bench.svc.cluster.local:8080"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                    ],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "128Mi"},
                        "limits": {"cpu": "500m", "memory": "256Mi"}
                    },
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 10},
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "initialDelaySeconds": 5, "periodSeconds": 20},
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/web", "readOnly": true}]
                }],
                "volumes": [{"name": "config", "configMap": {"name": "web-config"}}],
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 30,
                "serviceAccountName": "default",
                "nodeSelector": {"kubernetes.io/os": "linux"}
            }
        }),
        "pod-",
    )
}

// ----------------------------------------------------------------------------------------------
// Phase 1: creates

struct CreateRun {
    kind: &'static str,
    requested: usize,
    ok: usize,
    errors: usize,
    first_error: Option<String>,
    elapsed: Duration,
    lat: Summary,
    body_bytes: usize,
    diag: Diag,
}

impl CreateRun {
    fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn to_json(&self) -> Value {
        json!({
            "kind": self.kind, "requested": self.requested, "ok": self.ok, "errors": self.errors,
            "first_error": self.first_error, "elapsed_s": r3(self.elapsed.as_secs_f64()),
            "creates_per_s": r3(self.rate()), "latency": self.lat.to_json(), "body_bytes": self.body_bytes,
            "diagnostics": self.diag.to_json(),
        })
    }
}

struct CreateJob {
    kind: &'static str,
    plural: &'static str,
    total: usize,
    template: Arc<Template>,
}

async fn create_phase(
    srv: &ServerInfo,
    tls: &Tls,
    clients: usize,
    limit: Duration,
    job: CreateJob,
) -> Res<CreateRun> {
    let conns =
        futures::future::try_join_all((0..clients.min(job.total.max(1))).map(|_| H1::connect(tls)))
            .await?;
    let path: Arc<str> = format!("/api/v1/namespaces/{NAMESPACE}/{}", job.plural).into();
    let next = Arc::new(AtomicUsize::new(0));
    let before = probe(srv);
    let start = Instant::now();
    let deadline = start + limit;
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            let next = next.clone();
            let path = path.clone();
            let template = job.template.clone();
            let total = job.total;
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = 0usize;
                let mut first_error = None;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total || Instant::now() >= deadline {
                        break;
                    }
                    let body = template.render(i);
                    let t = Instant::now();
                    match c.call(Method::POST, &path, Some(body)).await {
                        Ok((StatusCode::CREATED, _)) => lat.push(nanos(t.elapsed())),
                        Ok((status, body)) => {
                            errors += 1;
                            first_error
                                .get_or_insert_with(|| format!("{status}: {}", short(&body)));
                        }
                        Err(e) => {
                            errors += 1;
                            first_error.get_or_insert_with(|| e.to_string());
                            if c.is_closed() {
                                break;
                            }
                        }
                    }
                }
                (lat, errors, first_error)
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(job.total);
    let mut errors = 0;
    let mut first_error = None;
    for t in tasks {
        let (l, e, f) = t.await?;
        lat.extend(l);
        errors += e;
        if first_error.is_none() {
            first_error = f;
        }
    }
    let elapsed = start.elapsed();
    let labels: &[(&str, &str)] = &[("verb", "POST"), ("resource", job.plural)];
    let diag = before.finish(
        srv,
        &[
            (&format!("handler POST {}", job.plural), REQ_HIST, labels),
            ("store create", STORE_HIST, &[("operation", "create")]),
        ],
    );
    Ok(CreateRun {
        kind: job.kind,
        requested: job.total,
        ok: lat.len(),
        errors,
        first_error,
        elapsed,
        lat: summarize(lat),
        body_bytes: job.template.size(),
        diag,
    })
}

// ----------------------------------------------------------------------------------------------
// Phase 2: LIST

struct ListRun {
    label: &'static str,
    cold_ms: f64,
    items: usize,
    bytes: usize,
    lat: Summary,
}

impl ListRun {
    fn to_json(&self) -> Value {
        json!({"variant": self.label, "cold_ms": r3(self.cold_ms), "items": self.items, "bytes": self.bytes,
               "latency": self.lat.to_json()})
    }
}

async fn list_phase(srv: &ServerInfo, tls: &Tls, runs: usize) -> Res<(Vec<ListRun>, Diag)> {
    let mut c = H1::connect(tls).await?;
    let before = probe(srv);
    let mut out = Vec::new();
    for (label, query) in [
        ("resourceVersion=0", "?resourceVersion=0"),
        ("resourceVersion unset", ""),
    ] {
        let path = format!("/api/v1/namespaces/{NAMESPACE}/pods{query}");
        // One cold request that is also checked.
        let t = Instant::now();
        let (status, body) = c.call(Method::GET, &path, None).await?;
        let cold_ms = t.elapsed().as_secs_f64() * 1000.0;
        if status != StatusCode::OK {
            return Err(fail(format!("LIST {path}: {status}: {}", short(&body))));
        }
        let doc: Value = serde_json::from_slice(&body)?;
        let items = doc
            .get("items")
            .and_then(Value::as_array)
            .map(Vec::len)
            .unwrap_or(0);
        let mut lat = Vec::with_capacity(runs);
        let mut bytes = body.len();
        for _ in 0..runs {
            let t = Instant::now();
            let (status, n) = c.get_counting(&path).await?;
            lat.push(nanos(t.elapsed()));
            if status != StatusCode::OK {
                return Err(fail(format!("LIST {path}: {status}")));
            }
            bytes = n;
        }
        out.push(ListRun {
            label,
            cold_ms,
            items,
            bytes,
            lat: summarize(lat),
        });
    }
    let diag = before.finish(
        srv,
        &[(
            "handler LIST pods",
            REQ_HIST,
            &[("verb", "LIST"), ("resource", "pods")],
        )],
    );
    Ok((out, diag))
}

// ----------------------------------------------------------------------------------------------
// Phase 3: watch fan-out

/// What the watchers record, shared with the writer.
struct WatchShared {
    base: Instant,
    /// Events including the warm-up one (index 0).
    events: usize,
    watchers: usize,
    /// `[watcher * events + event]`: nanoseconds since `base` + 1 when the watcher got the event
    /// (0: not yet).
    seen: Vec<AtomicU64>,
    /// Per event, how many watchers got it.
    counts: Vec<AtomicUsize>,
    notify: Notify,
    /// Watch streams that ended (they should not, during the phase).
    ended: AtomicUsize,
}

impl WatchShared {
    fn record(&self, watcher: usize, event: usize, at: u64) {
        if event >= self.events {
            return;
        }
        let slot = &self.seen[watcher * self.events + event];
        if slot
            .compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && self.counts[event].fetch_add(1, Ordering::AcqRel) + 1 == self.watchers
        {
            self.notify.notify_one();
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The event number of an ADDED line for one of the bench's watch ConfigMaps.
fn event_index(line: &[u8]) -> Option<usize> {
    const MARK: &[u8] = b"\"name\":\"wbench-";
    if !line.starts_with(b"{\"type\":\"ADDED\"") {
        return None;
    }
    let at = find(line, MARK)? + MARK.len();
    let digits = line[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&line[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

/// Reads one watch stream until it ends, recording when each event line arrived.
async fn read_watch(watcher: usize, mut body: Incoming, shared: Arc<WatchShared>) {
    let mut carry: Vec<u8> = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let at = nanos(shared.base.elapsed()) + 1;
        let mut start = 0;
        for (i, _) in data.iter().enumerate().filter(|(_, b)| **b == b'\n') {
            let line = &data[start..i];
            let event = if carry.is_empty() {
                event_index(line)
            } else {
                carry.extend_from_slice(line);
                let e = event_index(&carry);
                carry.clear();
                e
            };
            if let Some(e) = event {
                shared.record(watcher, e, at);
            }
            start = i + 1;
        }
        carry.extend_from_slice(&data[start..]);
    }
    shared.ended.fetch_add(1, Ordering::Relaxed);
}

struct WatchRun {
    transport: &'static str,
    connections: usize,
    watchers: usize,
    open_s: f64,
    events_done: usize,
    /// Delay from the write's response to each watcher, over all pairs.
    from_response: Summary,
    /// Delay from sending the write to each watcher, over all pairs.
    from_request: Summary,
    /// Per event, the delay until the last watcher had it.
    fanout_complete: Summary,
    /// Create round trip of the writer.
    write_rtt: Summary,
    missing: usize,
    before_response: usize,
    ended: usize,
    diag: Diag,
}

impl WatchRun {
    fn to_json(&self) -> Value {
        json!({
            "transport": self.transport, "connections": self.connections, "watchers": self.watchers,
            "open_s": r3(self.open_s), "events": self.events_done,
            "delay_from_write_response": self.from_response.to_json(),
            "delay_from_write_request": self.from_request.to_json(),
            "per_event_last_watcher_delay": self.fanout_complete.to_json(),
            "write_round_trip": self.write_rtt.to_json(),
            "missing_pairs": self.missing, "pairs_before_response": self.before_response,
            "streams_ended_early": self.ended,
            "diagnostics": self.diag.to_json(),
        })
    }
}

async fn open_watches(
    tls: &Tls,
    opts: &Options,
    path: &str,
    shared: &Arc<WatchShared>,
) -> Res<(Vec<H2>, Vec<JoinHandle<()>>)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let h2s = if opts.watch_h1 {
        Vec::new()
    } else {
        futures::future::try_join_all(
            (0..opts.watch_conns.min(opts.watchers).max(1)).map(|_| H2::connect(tls)),
        )
        .await?
    };
    let senders: Vec<_> = h2s.iter().map(|c| c.sender.clone()).collect();
    let uri = format!("https://{}{path}", tls.authority);
    let opened = futures::stream::iter(0..opts.watchers)
        .map(|w| {
            let shared = shared.clone();
            let sender = senders.get(w % senders.len().max(1)).cloned();
            let uri = uri.clone();
            async move {
                let open = async {
                    let (resp, h1) = match sender {
                        Some(mut s) => {
                            let req = Request::get(&uri)
                                .header(header::ACCEPT, "application/json")
                                .body(Full::new(Bytes::new()))?;
                            s.ready().await?;
                            (s.send_request(req).await?, None)
                        }
                        None => {
                            let mut c = H1::connect(tls).await?;
                            (c.send(Method::GET, path, None).await?, Some(c))
                        }
                    };
                    if resp.status() != StatusCode::OK {
                        let status = resp.status();
                        let body = resp
                            .into_body()
                            .collect()
                            .await
                            .map(|c| c.to_bytes())
                            .unwrap_or_default();
                        return Err(fail(format!("watch: {status}: {}", short(&body))));
                    }
                    let body = resp.into_body();
                    Ok::<_, BoxError>(tokio::spawn(async move {
                        // The HTTP/1.1 connection lives as long as its reader.
                        let _conn = h1;
                        read_watch(w, body, shared).await;
                    }))
                };
                tokio::time::timeout_at(deadline, open)
                    .await
                    .map_err(|_| fail("opening the watches timed out"))?
            }
        })
        .buffer_unordered(if opts.watch_h1 { 64 } else { 256 })
        .collect::<Vec<_>>()
        .await;
    let mut readers = Vec::with_capacity(opts.watchers);
    let mut first_error = None;
    for r in opened {
        match r {
            Ok(h) => readers.push(h),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        for r in &readers {
            r.abort();
        }
        return Err(e);
    }
    Ok((h2s, readers))
}

async fn watch_phase(srv: &ServerInfo, tls: &Tls, opts: &Options) -> Res<WatchRun> {
    let phase_deadline = Instant::now() + WATCH_PHASE_LIMIT;
    let mut writer = H1::connect(tls).await?;
    let cm_path = format!("/api/v1/namespaces/{NAMESPACE}/configmaps");
    let (status, body) = writer
        .call(Method::GET, &format!("{cm_path}?limit=1"), None)
        .await?;
    if status != StatusCode::OK {
        return Err(fail(format!(
            "getting the current resourceVersion: {status}: {}",
            short(&body)
        )));
    }
    let doc: Value = serde_json::from_slice(&body)?;
    let rv = doc
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("0")
        .to_string();
    let events = opts.events + 1;
    let shared = Arc::new(WatchShared {
        base: Instant::now(),
        events,
        watchers: opts.watchers,
        seen: (0..opts.watchers * events)
            .map(|_| AtomicU64::new(0))
            .collect(),
        counts: (0..events).map(|_| AtomicUsize::new(0)).collect(),
        notify: Notify::new(),
        ended: AtomicUsize::new(0),
    });
    let watch_path = format!("{cm_path}?watch=true&resourceVersion={rv}&timeoutSeconds=600");
    let t_open = Instant::now();
    let (h2s, readers) = open_watches(tls, opts, &watch_path, &shared).await?;
    let open_s = t_open.elapsed().as_secs_f64();
    eprintln!("  {} watches open in {open_s:.2} s", readers.len());

    let template = configmap_template(WATCH_PREFIX);
    let before = probe(srv);
    let mut sent_at = vec![0u64; events];
    let mut resp_at = vec![0u64; events];
    let mut rtt = Vec::with_capacity(events);
    let mut done = 0;
    let mut result = Ok(());
    for i in 0..events {
        if Instant::now() >= phase_deadline {
            eprintln!("  watch phase deadline reached after {} events", done);
            break;
        }
        sent_at[i] = nanos(shared.base.elapsed());
        let (status, body) = match writer
            .call(Method::POST, &cm_path, Some(template.render(i)))
            .await
        {
            Ok(r) => r,
            Err(e) => {
                result = Err(e);
                break;
            }
        };
        resp_at[i] = nanos(shared.base.elapsed());
        if status != StatusCode::CREATED {
            result = Err(fail(format!(
                "watch event write: {status}: {}",
                short(&body)
            )));
            break;
        }
        if i > 0 {
            rtt.push(resp_at[i] - sent_at[i]);
        }
        // Wait until every watcher has it (bounded).
        let until = tokio::time::Instant::now() + EVENT_LIMIT;
        loop {
            let notified = shared.notify.notified();
            if shared.counts[i].load(Ordering::Acquire) >= opts.watchers {
                break;
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                eprintln!(
                    "  event {i}: only {} of {} watchers got it within {:?}",
                    shared.counts[i].load(Ordering::Acquire),
                    opts.watchers,
                    EVENT_LIMIT
                );
                break;
            }
        }
        done = i + 1;
    }
    let diag = before.finish(
        srv,
        &[(
            "handler POST configmaps",
            REQ_HIST,
            &[("verb", "POST"), ("resource", "configmaps")],
        )],
    );
    let ended = shared.ended.load(Ordering::Relaxed);
    for r in &readers {
        r.abort();
    }
    drop(h2s);
    result?;

    // Every (event, watcher) pair of the measured events (1..done).
    let mut from_response = Vec::with_capacity(opts.watchers * done);
    let mut from_request = Vec::with_capacity(opts.watchers * done);
    let mut last = Vec::with_capacity(done);
    let mut missing = 0;
    let mut before_response = 0;
    for e in 1..done {
        let mut latest = 0u64;
        for w in 0..opts.watchers {
            let seen = shared.seen[w * events + e].load(Ordering::Relaxed);
            if seen == 0 {
                missing += 1;
                continue;
            }
            let at = seen - 1;
            if at < resp_at[e] {
                before_response += 1;
            }
            let d = at.saturating_sub(resp_at[e]);
            latest = latest.max(d);
            from_response.push(d);
            from_request.push(at.saturating_sub(sent_at[e]));
        }
        last.push(latest);
    }
    Ok(WatchRun {
        transport: if opts.watch_h1 {
            "HTTP/1.1, one TLS connection per watch"
        } else {
            "HTTP/2 streams"
        },
        connections: if opts.watch_h1 {
            opts.watchers
        } else {
            opts.watch_conns.min(opts.watchers).max(1)
        },
        watchers: opts.watchers,
        open_s,
        events_done: done.saturating_sub(1),
        from_response: summarize(from_response),
        from_request: summarize(from_request),
        fanout_complete: summarize(last),
        write_rtt: summarize(rtt),
        missing,
        before_response,
        ended,
        diag,
    })
}

// ----------------------------------------------------------------------------------------------
// Phase 4: ready time of `setpoint up`

struct ReadyRun {
    runs_ms: Vec<f64>,
    ca_ms: Vec<f64>,
}

impl ReadyRun {
    fn median(v: &[f64]) -> f64 {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        if s.is_empty() {
            0.0
        } else if s.len() % 2 == 1 {
            s[s.len() / 2]
        } else {
            (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
        }
    }
}

fn free_port() -> Res<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// One `GET /readyz`, anonymous, over a new TLS connection.
async fn readyz_once(tls: &Tls) -> Res<StatusCode> {
    let attempt = async {
        let mut c = H1::connect(tls).await?;
        let (status, _) = c.call(Method::GET, "/readyz", None).await?;
        Ok::<_, BoxError>(status)
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .map_err(|_| fail("/readyz timed out"))?
}

/// Spawns `bin up` on a free port with an empty data dir; returns (ms to the first 200 from
/// /readyz, ms until the CA certificate could be read).
async fn ready_once(bin: &Path) -> Res<(f64, f64)> {
    let data = tempfile::tempdir()?;
    let logs = tempfile::tempdir()?;
    let log_path = logs.path().join("setpoint.log");
    let log = std::fs::File::create(&log_path)?;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let ca_path = data.path().join("pki").join("ca.crt");
    let start = Instant::now();
    let mut child = tokio::process::Command::new(bin)
        .arg("up")
        // The ready time measured is the control plane's and a process node's, as before
        // containers became the default where containerd is installed.
        .args(["--container-runtime", "process"])
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--data-dir")
        .arg(data.path())
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| fail(format!("spawning {}: {e}", bin.display())))?;
    let mut tls: Option<Tls> = None;
    let mut ca_ms = 0.0;
    let mut last_error = String::from("no attempt yet");
    let outcome = loop {
        if start.elapsed() > READY_LIMIT {
            break Err(fail(format!(
                "not ready after {READY_LIMIT:?} (last: {last_error})"
            )));
        }
        if let Some(status) = child.try_wait()? {
            break Err(fail(format!("exited early with {status}")));
        }
        if tls.is_none() {
            // The file may be half-written; a PEM without its END line does not parse.
            if let Ok(pem) = std::fs::read_to_string(&ca_path) {
                if let Ok(t) = Tls::new(addr, &pem, None) {
                    ca_ms = start.elapsed().as_secs_f64() * 1000.0;
                    tls = Some(t);
                    continue;
                }
            }
        } else if let Some(t) = &tls {
            match readyz_once(t).await {
                Ok(StatusCode::OK) => break Ok(start.elapsed().as_secs_f64() * 1000.0),
                Ok(status) => last_error = status.to_string(),
                Err(e) => last_error = e.to_string(),
            }
        }
        // A blocking pause is fine: this runtime has nothing else to do.
        std::thread::sleep(READY_POLL_PAUSE);
    };
    let _ = child.start_kill();
    let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
    match outcome {
        Ok(ms) => Ok((ms, ca_ms)),
        Err(e) => {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = log
                .lines()
                .rev()
                .take(10)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            Err(fail(format!(
                "`{} up`: {e}\n{}",
                bin.display(),
                tail.join("\n")
            )))
        }
    }
}

fn ready_phase(bin: &Path, runs: usize) -> Res<ReadyRun> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut out = ReadyRun {
            runs_ms: Vec::new(),
            ca_ms: Vec::new(),
        };
        for i in 0..runs {
            let (ms, ca) = ready_once(bin).await?;
            eprintln!(
                "  run {}: ready after {ms:.1} ms (CA readable after {ca:.1} ms)",
                i + 1
            );
            out.runs_ms.push(ms);
            out.ca_ms.push(ca);
        }
        Ok(out)
    })
}

// ----------------------------------------------------------------------------------------------
// Driving it all

#[derive(Default)]
struct Report {
    options: Value,
    ready: Option<Result<ReadyRun, String>>,
    creates: Vec<CreateRun>,
    lists: Vec<ListRun>,
    list_diag: Option<Diag>,
    watch: Option<WatchRun>,
    errors: Vec<String>,
}

async fn bench(srv: &ServerInfo, opts: &Options, report: &mut Report) -> Res<()> {
    let pki = &srv.pki;
    let tls = Tls::new(
        srv.addr,
        &pki.ca_cert,
        Some((&pki.admin_cert, &pki.admin_key)),
    )?;
    let limit = opts.duration.unwrap_or(DEFAULT_PHASE_LIMIT);

    let mut admin = H1::connect(&tls).await?;
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    let (status, body) = admin
        .call(
            Method::POST,
            "/api/v1/namespaces",
            Some(Bytes::from(ns.to_string())),
        )
        .await?;
    if status != StatusCode::CREATED && status != StatusCode::CONFLICT {
        return Err(fail(format!(
            "creating namespace {NAMESPACE}: {status}: {}",
            short(&body)
        )));
    }
    drop(admin);

    for job in [
        CreateJob {
            kind: "ConfigMap",
            plural: "configmaps",
            total: opts.creates,
            template: Arc::new(configmap_template("cm-")),
        },
        CreateJob {
            kind: "Pod",
            plural: "pods",
            total: opts.pods,
            template: Arc::new(pod_template()),
        },
    ] {
        if job.total == 0 {
            continue;
        }
        eprintln!(
            "phase 1: {} {} creates ({} B each) with {} clients…",
            job.total,
            job.kind,
            job.template.size(),
            opts.clients
        );
        let run = create_phase(srv, &tls, opts.clients, limit, job).await?;
        eprintln!(
            "  {} ok, {} errors in {:.2} s: {:.0}/s, p50 {:.2} ms, p99 {:.2} ms",
            run.ok,
            run.errors,
            run.elapsed.as_secs_f64(),
            run.rate(),
            run.lat.p50,
            run.lat.p99
        );
        if let Some(e) = &run.first_error {
            eprintln!("  first error: {e}");
        }
        report.creates.push(run);
    }

    eprintln!(
        "phase 2: LIST pods, {} timed runs per variant…",
        opts.list_runs
    );
    match list_phase(srv, &tls, opts.list_runs).await {
        Ok((lists, diag)) => {
            for l in &lists {
                eprintln!(
                    "  {}: {} items, {} bytes, cold {:.1} ms, p50 {:.1} ms, p99 {:.1} ms",
                    l.label, l.items, l.bytes, l.cold_ms, l.lat.p50, l.lat.p99
                );
            }
            report.lists = lists;
            report.list_diag = Some(diag);
        }
        Err(e) => report.errors.push(format!("LIST phase: {e}")),
    }

    if opts.watchers > 0 && opts.events > 0 {
        eprintln!(
            "phase 3: {} watchers, {} events…",
            opts.watchers, opts.events
        );
        match watch_phase(srv, &tls, opts).await {
            Ok(w) => {
                eprintln!(
                    "  delay from write response: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                    w.from_response.p50, w.from_response.p99, w.from_response.max
                );
                report.watch = Some(w);
            }
            Err(e) => report.errors.push(format!("watch phase: {e}")),
        }
    }
    Ok(())
}

struct Row {
    what: String,
    value: String,
    target: String,
    met: Option<bool>,
}

fn row(
    what: impl Into<String>,
    value: impl Into<String>,
    target: impl Into<String>,
    met: Option<bool>,
) -> Row {
    Row {
        what: what.into(),
        value: value.into(),
        target: target.into(),
        met,
    }
}

fn rows(report: &Report, opts: &Options) -> Vec<Row> {
    let mut out = Vec::new();
    for c in &report.creates {
        let who = format!("{} creates, {} clients", c.kind, opts.clients);
        out.push(row(
            format!("{who}: throughput"),
            format!("{:.0} /s", c.rate()),
            ">= 5000 /s",
            Some(c.rate() >= 5000.0),
        ));
        out.push(row(
            format!("{who}: p99 latency"),
            format!("{:.2} ms", c.lat.p99),
            "<= 20 ms",
            Some(c.lat.p99 <= 20.0),
        ));
        out.push(row(
            format!("{who}: p50 / p90 / max"),
            format!("{:.2} / {:.2} / {:.2} ms", c.lat.p50, c.lat.p90, c.lat.max),
            "",
            None,
        ));
        if c.errors > 0 {
            out.push(row(
                format!("{who}: errors"),
                c.errors.to_string(),
                "0",
                Some(false),
            ));
        }
    }
    for l in &report.lists {
        let who = format!(
            "LIST {} pods ({:.1} MB), {}",
            l.items,
            l.bytes as f64 / 1e6,
            l.label
        );
        out.push(row(
            format!("{who}: p50"),
            format!("{:.1} ms", l.lat.p50),
            "<= 50 ms",
            Some(l.lat.p50 <= 50.0),
        ));
        out.push(row(
            format!("{who}: p99"),
            format!("{:.1} ms", l.lat.p99),
            "<= 50 ms",
            Some(l.lat.p99 <= 50.0),
        ));
    }
    if let Some(w) = &report.watch {
        let who = format!(
            "Watch fan-out, {} watchers x {} events",
            w.watchers, w.events_done
        );
        out.push(row(
            format!("{who}: p99 delay"),
            format!("{:.2} ms", w.from_response.p99),
            "<= 10 ms",
            Some(w.from_response.p99 <= 10.0),
        ));
        out.push(row(
            format!("{who}: p50 / max delay"),
            format!("{:.2} / {:.2} ms", w.from_response.p50, w.from_response.max),
            "",
            None,
        ));
        if w.missing > 0 {
            out.push(row(
                format!("{who}: events not delivered"),
                w.missing.to_string(),
                "0",
                Some(false),
            ));
        }
    }
    match &report.ready {
        Some(Ok(r)) => {
            let med = ReadyRun::median(&r.runs_ms);
            out.push(row(
                format!("`setpoint up` ready time, median of {}", r.runs_ms.len()),
                format!("{med:.1} ms"),
                "<= 200 ms",
                Some(med <= 200.0),
            ));
        }
        Some(Err(e)) => out.push(row(
            "`setpoint up` ready time",
            format!("failed: {}", e.lines().next().unwrap_or("")),
            "<= 200 ms",
            Some(false),
        )),
        None => out.push(row(
            "`setpoint up` ready time",
            "not measured (needs --setpoint-bin)",
            "<= 200 ms",
            None,
        )),
    }
    out
}

fn render_text(report: &Report, opts: &Options) -> String {
    let mut s = String::new();
    let rows = rows(report, opts);
    let w0 = rows
        .iter()
        .map(|r| r.what.chars().count())
        .max()
        .unwrap_or(0)
        .max(11);
    let w1 = rows
        .iter()
        .map(|r| r.value.chars().count())
        .max()
        .unwrap_or(0)
        .max(6);
    let w2 = rows
        .iter()
        .map(|r| r.target.chars().count())
        .max()
        .unwrap_or(0)
        .max(6);
    let _ = writeln!(
        s,
        "\nSetpoint API benchmark ({} store, HTTPS on 127.0.0.1)\n",
        if opts.store == StoreKind::Memory {
            "memory"
        } else {
            "embedded"
        }
    );
    let _ = writeln!(
        s,
        "{:<w0$}  {:>w1$}  {:<w2$}  met",
        "Measurement", "Result", "Target"
    );
    let _ = writeln!(s, "{}", "-".repeat(w0 + w1 + w2 + 9));
    for r in &rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "",
        };
        let _ = writeln!(
            s,
            "{:<w0$}  {:>w1$}  {:<w2$}  {met}",
            r.what, r.value, r.target
        );
    }
    let _ = writeln!(s, "\nNotes");
    let _ = writeln!(
        s,
        "  The server and the bench client run in one process on two runtimes of 2 threads each; they share the machine's cores."
    );
    let _ = writeln!(
        s,
        "  Watch delays run from the moment the write's HTTP response arrived at the client (not the commit) to the line arriving on each watch."
    );
    let _ = writeln!(s, "\nWhere the time went");
    for c in &report.creates {
        let _ = writeln!(s, "  {} creates ({} B bodies):", c.kind, c.body_bytes);
        c.diag.render(&mut s);
    }
    if let Some(d) = &report.list_diag {
        let _ = writeln!(s, "  LIST pods:");
        for l in &report.lists {
            let _ = writeln!(
                s,
                "    {}: cold (first) request {:.1} ms, mean {:.1} ms",
                l.label, l.cold_ms, l.lat.mean
            );
        }
        d.render(&mut s);
    }
    if let Some(w) = &report.watch {
        let _ = writeln!(
            s,
            "  Watch fan-out ({} over {} connections, opened in {:.2} s):",
            w.transport, w.connections, w.open_s
        );
        let _ = writeln!(
            s,
            "    delay from write request: p50 {:.2} ms, p99 {:.2} ms; last watcher per event: p50 {:.2} ms, p99 {:.2} ms; write round trip p50 {:.2} ms",
            w.from_request.p50, w.from_request.p99, w.fanout_complete.p50, w.fanout_complete.p99, w.write_rtt.p50
        );
        let _ = writeln!(
            s,
            "    pairs that arrived before the write's response: {}; missing pairs: {}; streams that ended early: {}",
            w.before_response, w.missing, w.ended
        );
        w.diag.render(&mut s);
    }
    if let Some(Ok(r)) = &report.ready {
        let runs: Vec<String> = r.runs_ms.iter().map(|v| format!("{v:.1}")).collect();
        let _ = writeln!(
            s,
            "  `setpoint up`: ready after {} ms; CA readable after median {:.1} ms",
            runs.join(", "),
            ReadyRun::median(&r.ca_ms)
        );
    }
    for e in &report.errors {
        let _ = writeln!(s, "\nERROR: {e}");
    }
    s
}

fn render_json(report: &Report, opts: &Options) -> Value {
    let table: Vec<Value> = rows(report, opts)
        .into_iter()
        .map(
            |r| json!({"measurement": r.what, "result": r.value, "target": r.target, "met": r.met}),
        )
        .collect();
    json!({
        "options": report.options,
        "summary": table,
        "creates": report.creates.iter().map(CreateRun::to_json).collect::<Vec<_>>(),
        "list": {
            "runs": report.lists.iter().map(ListRun::to_json).collect::<Vec<_>>(),
            "diagnostics": report.list_diag.as_ref().map(Diag::to_json),
        },
        "watch": report.watch.as_ref().map(WatchRun::to_json),
        "ready": match &report.ready {
            Some(Ok(r)) => json!({"runs_ms": r.runs_ms, "median_ms": r3(ReadyRun::median(&r.runs_ms)),
                                  "ca_readable_ms": r.ca_ms}),
            Some(Err(e)) => json!({"error": e}),
            None => Value::Null,
        },
        "errors": report.errors,
    })
}

fn run() -> Res<()> {
    let opts = parse_args()?;
    let mut report = Report {
        options: json!({
            "clients": opts.clients, "creates": opts.creates, "pods": opts.pods, "watchers": opts.watchers,
            "events": opts.events, "store": if opts.store == StoreKind::Memory { "memory" } else { "embedded" },
            "list_runs": opts.list_runs, "watch_conns": opts.watch_conns,
            "watch_transport": if opts.watch_h1 { "h1" } else { "h2" },
            "duration_s": opts.duration.map(|d| d.as_secs()),
        }),
        ..Report::default()
    };

    if let (Some(bin), false) = (&opts.setpoint_bin, opts.skip_ready) {
        eprintln!(
            "phase 4 (first, on an idle machine): `{} up` ready time, {} runs…",
            bin.display(),
            opts.ready_runs
        );
        report.ready = Some(ready_phase(bin, opts.ready_runs).map_err(|e| e.to_string()));
        if let Some(Err(e)) = &report.ready {
            eprintln!("  failed: {e}");
        }
    }

    let data = tempfile::tempdir()?;
    eprintln!("starting the in-process server…");
    let mut server = start_server(opts.store, data.path())?;
    eprintln!("  serving on https://{}", server.info.addr);
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench-client")
        .enable_all()
        .build()?;
    let outcome = client.block_on(bench(&server.info, &opts, &mut report));
    client.shutdown_timeout(Duration::from_secs(2));
    server.stop();
    if let Err(e) = outcome {
        report.errors.push(e.to_string());
    }

    if opts.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&render_json(&report, &opts))?
        );
    } else {
        print!("{}", render_text(&report, &opts));
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("api_bench: {e}");
        std::process::exit(1);
    }
    // Leftover threads (the server's store, blocking pools) must not keep the process alive.
    std::process::exit(0);
}
