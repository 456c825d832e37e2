//! Controller-runtime benchmark: reconcile throughput, informer memory, event latency and test
//! cluster start time.
//!
//! Run with
//!
//! ```text
//! cargo run --release -p setpoint-runtime --example runtime_bench -- [options]
//! ```
//!
//! # What runs where
//!
//! - **Controller side** (informers, work queues, controllers, reconcilers, the bench's own
//!   driver code): a `new_current_thread` Tokio runtime, driven by `block_on` on the main
//!   thread. Everything on it shares one core.
//! - **API server** (for figures 1, 2 and the "server thread" and HTTPS rows of 3): a
//!   multi-thread Tokio runtime with exactly one worker thread named `bench-server`. The
//!   cluster is started there, and the bulk setup writes run there too. An in-process client
//!   normally runs the server's request pipeline inside the caller's task, so the controller
//!   side talks to it through a small bridge transport (`CrossRuntime` below): each request is
//!   spawned on the server runtime with the in-process `ServiceTransport` that
//!   `TestCluster::start` uses, and the response body is pumped back over a channel. Over HTTPS
//!   no bridge is needed: the client's connection tasks run on the controller runtime, the
//!   server's on `bench-server`.
//! - CPU time per thread group (main thread, `bench-server`, others) comes from
//!   `/proc/self/task/*/stat` (10 ms ticks) and is printed for the throughput phases.
//!
//! The bench installs a counting global allocator. It costs one relaxed atomic load per
//! allocation except inside the few windows where it counts (named below), so it does not
//! distort the timed phases.
//!
//! # Figures
//!
//! 1. **No-op reconcile throughput with `--objects` (10,000) cached ConfigMaps** (target
//!    ≥ 50,000 reconciles/s on one core). The ConfigMaps are created in namespace `bench`
//!    before anything is timed. A `SharedInformers` ConfigMap informer is started and synced
//!    first; then `Controller::for_type::<ConfigMap>` builds a controller over it (default
//!    queue: 5 ms..1000 s backoff, 10 qps / burst 100 token bucket, default metrics and options
//!    except the worker count) whose reconciler looks the key up in the informer `Store` and
//!    returns `Action::Done`. The token bucket does not apply: the queue consults it only for
//!    rate-limited adds (`add_rate_limited`, `WorkItem::retry`), and both the informer handler
//!    and this bench use plain `add`. Run with 1 worker and with `--workers` (4):
//!    - *initial drain*: time from spawning `Controller::run` until the 10,000th reconcile
//!      started (the source subscribes, receives the cached objects as `Added` events and
//!      enqueues their keys; the workers drain them);
//!    - *steady*: `--rounds` (10) times, all 10,000 keys are added again through
//!      `controller.queue()` (with the workers idle) and the bench waits until all of them
//!      were reconciled; reconciles/s = keys × rounds / wall time, enqueueing included.
//!    - one more steady round with the allocator counting gives allocations per reconcile.
//!    - Breakdown, same keys, same thread, no controller: a bare `WorkQueue` (add all keys,
//!      then `try_get` + `forget` + `done` until empty) with and without queue metrics, and
//!      `Store::get` of every key. What the full controller costs beyond these is the worker
//!      loop itself (controller.rs `Worker::run`/`Worker::process`).
//! 2. **Informer memory per cached pod**. `--pods` (10,000) pods of about 1.5–2 KiB of JSON
//!    each as stored (one container with image, two ports, env, requests and limits; labels, a
//!    controller ownerReference; status with four conditions and a container status, written
//!    through `/status`; the measured average size is printed) are created first, so the
//!    server already holds them. This runs right after figure 4 and before figure 1, so that
//!    memory freed by earlier phases cannot be reused unseen. Before the baseline, a
//!    consistent LIST waits until the server's watch cache has applied every write (it runs on
//!    the same server thread as the writes and can lag behind them). Then: RSS (`VmRSS` of
//!    `/proc/self/status`) before; a pod informer is started and synced (paged LIST, then
//!    WATCH); RSS after. Reported: (RSS after − before) / pods. Also the net change of live
//!    heap bytes over the same window from the counting allocator (requested sizes, without
//!    malloc's per-chunk overhead; it counts every thread, so the server's transient LIST
//!    buffers are counted but were freed again before the end of the window). Unlike RSS, it
//!    is not inflated by memory that malloc keeps after the LIST's transient buffers are freed.
//!    Afterwards a counted deep copy of every cached pod tells how much of that is the typed
//!    `Pod` objects themselves. Last, a second informer on the same pods packs idle objects
//!    (`InformerOptions::compact_idle`, every 100 ms); its live heap per pod once all of them
//!    are packed is reported too.
//! 3. **Event → reconcile-start latency**, p50/p99 over `--events` (1,000) writes, each a
//!    ConfigMap create issued one at a time (20 untimed warm-up writes first): a controller on
//!    ConfigMaps in namespace `lat` records `Instant::now()` as the first thing its reconcile
//!    does. Two delays per write: from just before the create was issued, and from the moment
//!    its response was decoded (negative when the reconcile started before the writer saw its
//!    response). The next write is issued only once the previous one was reconciled. Three
//!    set-ups: in-process with the whole cluster on the controller's thread (what a
//!    `#[tokio::test]` with `TestCluster::start` does), in-process with the server on
//!    `bench-server` (bridged), and HTTPS (`TestCluster::start_https`, server on
//!    `bench-server`, client on the controller thread).
//! 4. **Test cluster start time** (target ≤ 50 ms): one untimed-for-the-median cold start
//!    (first in the process: one-time initialisation), then the median of `--starts` (20)
//!    `TestCluster::start().await` each followed by `stop().await`, on the current-thread
//!    runtime (as in a `#[tokio::test]`); the same for `start_https`. A breakdown over the same
//!    number of runs repeats `start_https`'s steps one by one with the public API
//!    (`ApiServer::open_store`, `ApiServer::new` = watch cache load + bootstrap objects,
//!    `serve` = bind + certificates + TLS config, `HttpsTransport::from_kubeconfig`).
//!
//! Everything talks to 127.0.0.1 only. Every loop is bounded by a count and a deadline; the
//! whole run takes well under two minutes in release on two cores. Exit code 0 when the bench
//! ran to the end, whether or not the targets were met. `--json` prints one JSON document on
//! stdout instead of the table; progress goes to stderr.

// A counting global allocator measures informer memory; it wraps the system's.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use setpoint_apiserver::{ApiServer, ServerConfig, StoreConfig};
use setpoint_runtime::client::{
    Api, Body, BoxError, Client, ClientError, HttpsTransport, Kubeconfig, ListParams, Patch,
    PatchParams, PostParams, ServiceTransport, Transport,
};
use setpoint_runtime::controller::{
    Action, Context, Controller, ControllerOptions, ReconcileError, Reconciler,
};
use setpoint_runtime::informer::{Informer, InformerOptions, Scope, SharedInformers};
use setpoint_runtime::workqueue::{WorkQueue, WorkQueueMetrics};
use setpoint_runtime::{ObjectKey, Store};
use setpoint_testing::TestCluster;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot, Notify};

type Res<T> = Result<T, BoxError>;

fn fail(msg: impl Into<String>) -> BoxError {
    msg.into().into()
}

/// Namespace of the throughput and memory objects.
const NS: &str = "bench";
/// Namespace of the latency objects.
const LAT_NS: &str = "lat";
/// Name of the API server runtime's worker thread (also how its CPU time is found).
const SERVER_THREAD: &str = "bench-server";
/// Setup writes in flight at once.
const SETUP_CONCURRENCY: usize = 16;
/// Longest an informer may take to sync.
const SYNC_LIMIT: Duration = Duration::from_secs(60);
/// Longest the initial drain may take.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);
/// Steady rounds stop being started after this long (per worker count).
const STEADY_LIMIT: Duration = Duration::from_secs(20);
/// Longest one write may take to reach a reconcile.
const EVENT_LIMIT: Duration = Duration::from_secs(2);
/// Longest one latency set-up may run.
const LATENCY_PHASE_LIMIT: Duration = Duration::from_secs(60);
/// Untimed writes before each latency series.
const LATENCY_WARMUP: usize = 20;
/// Longest a cluster start or stop may take.
const START_LIMIT: Duration = Duration::from_secs(20);
/// Frames buffered per bridged response body.
const BRIDGE_FRAMES: usize = 64;

// ---------------------------------------------------------------------------------------------
// Counting allocator

/// Counts allocations and net live bytes, only while `COUNTING` is set.
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() && COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() && COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        if COUNTING.load(Ordering::Relaxed) {
            LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() && COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        }
        p
    }
}

/// Allocation count and net live bytes over a window (the net change is exact whatever was
/// allocated before the window: bytes allocated in it minus bytes freed in it).
struct AllocWindow {
    allocs: u64,
    live: i64,
}

impl AllocWindow {
    fn open() -> Self {
        let w = AllocWindow {
            allocs: ALLOCS.load(Ordering::SeqCst),
            live: LIVE_BYTES.load(Ordering::SeqCst),
        };
        COUNTING.store(true, Ordering::SeqCst);
        w
    }

    /// (allocations, net live bytes) since `open`.
    fn close(self) -> (u64, i64) {
        COUNTING.store(false, Ordering::SeqCst);
        (
            ALLOCS.load(Ordering::SeqCst) - self.allocs,
            LIVE_BYTES.load(Ordering::SeqCst) - self.live,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Options

#[derive(Clone, Debug)]
struct Options {
    objects: usize,
    pods: usize,
    workers: usize,
    rounds: usize,
    events: usize,
    starts: usize,
    json: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            objects: 10_000,
            pods: 10_000,
            workers: 4,
            rounds: 10,
            events: 1_000,
            starts: 20,
            json: false,
        }
    }
}

const USAGE: &str = "\
runtime_bench: Setpoint controller-runtime benchmark

Options:
  --objects N   ConfigMaps cached for the throughput figure      (default 10000)
  --pods N      pods cached for the memory figure                (default 10000)
  --workers N   the multi-worker configuration of figure 1       (default 4)
  --rounds N    steady re-enqueue rounds of all keys             (default 10)
  --events N    timed writes per latency set-up                  (default 1000)
  --starts N    timed cluster starts per kind                    (default 20)
  --json        print a JSON document instead of the table
  -h, --help    this text
";

fn parse_args() -> Res<Options> {
    let mut o = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut count = |name: &str| -> Res<usize> {
            let v = args
                .next()
                .ok_or_else(|| fail(format!("{name} needs a value")))?;
            let n: usize = v
                .parse()
                .map_err(|_| fail(format!("{name}: not a number: {v}")))?;
            if n == 0 {
                return Err(fail(format!("{name} must be at least 1")));
            }
            Ok(n)
        };
        match arg.as_str() {
            "--objects" => o.objects = count("--objects")?,
            "--pods" => o.pods = count("--pods")?,
            "--workers" => o.workers = count("--workers")?,
            "--rounds" => o.rounds = count("--rounds")?,
            "--events" => o.events = count("--events")?,
            "--starts" => o.starts = count("--starts")?,
            "--json" => o.json = true,
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(fail(format!("unknown option {other}\n\n{USAGE}"))),
        }
    }
    Ok(o)
}

// ---------------------------------------------------------------------------------------------
// Report

#[derive(Clone, Copy, Debug)]
enum Target {
    AtLeast(f64),
    AtMost(f64),
}

impl Target {
    fn met(self, v: f64) -> bool {
        match self {
            Target::AtLeast(t) => v >= t,
            Target::AtMost(t) => v <= t,
        }
    }
}

struct Row {
    id: &'static str,
    figure: String,
    /// Human-readable result.
    result: String,
    /// The number compared with the target, in `unit`.
    value: Option<f64>,
    unit: &'static str,
    target: Option<Target>,
    target_text: String,
    error: Option<String>,
}

impl Row {
    fn status(&self) -> &'static str {
        match (&self.error, self.target, self.value) {
            (Some(_), _, _) => "error",
            (None, Some(t), Some(v)) if t.met(v) => "met",
            (None, Some(_), _) => "not met",
            (None, None, _) => "-",
        }
    }
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
    /// Section → lines of detail for the table output.
    details: Vec<(String, Vec<String>)>,
    /// Section → machine-readable detail.
    json: Map<String, Value>,
}

impl Report {
    fn row(
        &mut self,
        id: &'static str,
        figure: impl Into<String>,
        result: impl Into<String>,
        value: f64,
        unit: &'static str,
        target: Option<Target>,
    ) {
        let target_text = match target {
            Some(Target::AtLeast(t)) => format!(">= {} {unit}", thousands(t)),
            Some(Target::AtMost(t)) => format!("<= {} {unit}", trim_float(t)),
            None => "(none)".into(),
        };
        self.rows.push(Row {
            id,
            figure: figure.into(),
            result: result.into(),
            value: Some(value),
            unit,
            target,
            target_text,
            error: None,
        });
    }

    fn error(&mut self, id: &'static str, figure: &str, e: &BoxError) {
        eprintln!("[{id}] failed: {e}");
        self.rows.push(Row {
            id,
            figure: figure.into(),
            result: format!("error: {e}"),
            value: None,
            unit: "",
            target: None,
            target_text: String::new(),
            error: Some(e.to_string()),
        });
    }

    fn detail(&mut self, section: &str, line: String) {
        match self.details.iter_mut().find(|(s, _)| s == section) {
            Some((_, lines)) => lines.push(line),
            None => self.details.push((section.into(), vec![line])),
        }
    }

    fn json_detail(&mut self, section: &str, value: Value) {
        self.json.insert(section.into(), value);
    }

    fn print_table(&self, opts: &Options) {
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!("Setpoint controller-runtime benchmark ({cores} cores)");
        println!(
            "controller side: current-thread Tokio runtime on the main thread; API server: 1-thread runtime ({SERVER_THREAD})"
        );
        println!(
            "objects {}, pods {}, workers 1 and {}, steady rounds {}, latency writes {}, starts {}",
            opts.objects, opts.pods, opts.workers, opts.rounds, opts.events, opts.starts
        );
        println!();
        let headers = ["#", "figure", "result", "target", "status"];
        let cells: Vec<[String; 5]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.id.to_string(),
                    r.figure.clone(),
                    r.result.clone(),
                    r.target_text.clone(),
                    r.status().to_string(),
                ]
            })
            .collect();
        let mut widths = headers.map(str::len);
        for row in &cells {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cols: [&str; 5]| {
            let mut s = String::new();
            for (i, (c, w)) in cols.iter().zip(widths).enumerate() {
                if i > 0 {
                    s.push_str("  ");
                }
                s.push_str(c);
                if i + 1 < cols.len() {
                    s.push_str(&" ".repeat(w.saturating_sub(c.chars().count())));
                }
            }
            println!("{s}");
        };
        line(headers);
        line(widths.map(|w| "-".repeat(w)).each_ref().map(String::as_str));
        for row in &cells {
            line(row.each_ref().map(String::as_str));
        }
        for (section, lines) in &self.details {
            println!();
            println!("{section}:");
            for l in lines {
                println!("  {l}");
            }
        }
    }

    fn to_json(&self, opts: &Options) -> Value {
        let figures: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "id": r.id,
                    "figure": r.figure,
                    "result": r.result,
                    "value": r.value,
                    "unit": r.unit,
                    "target": match r.target {
                        Some(Target::AtLeast(t)) => json!({"at_least": t}),
                        Some(Target::AtMost(t)) => json!({"at_most": t}),
                        None => Value::Null,
                    },
                    "status": r.status(),
                    "error": r.error,
                })
            })
            .collect();
        json!({
            "bench": "runtime_bench",
            "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "options": {
                "objects": opts.objects, "pods": opts.pods, "workers": opts.workers,
                "rounds": opts.rounds, "events": opts.events, "starts": opts.starts,
            },
            "figures": figures,
            "details": Value::Object(self.json.clone()),
        })
    }
}

fn thousands(v: f64) -> String {
    let n = v.max(0.0).round() as u64;
    let digits = n.to_string();
    // The leading group holds 1 to 3 digits; every later group exactly 3.
    let head = match digits.len() % 3 {
        0 => 3.min(digits.len()),
        r => r,
    };
    let mut out = digits[..head].to_string();
    for group in digits.as_bytes()[head..].chunks(3) {
        out.push(',');
        out.extend(group.iter().map(|&b| char::from(b)));
    }
    out
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank quantile of sorted values.
fn quantile<T: Copy + Default>(sorted: &[T], q: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn median_duration(v: &[Duration]) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    quantile(&s, 0.5)
}

// ---------------------------------------------------------------------------------------------
// Process measurements

/// Resident set size, from `VmRSS` in `/proc/self/status`.
fn rss_bytes() -> Res<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or_else(|| fail("no VmRSS in /proc/self/status"))?;
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| fail(format!("unreadable {line:?}")))?;
    Ok(kb * 1024)
}

/// CPU time per thread group, in clock ticks (USER_HZ, 100 per second on Linux).
#[derive(Clone, Copy, Debug, Default)]
struct CpuTicks {
    main: u64,
    server: u64,
    other: u64,
}

const TICKS_PER_SECOND: f64 = 100.0;

fn cpu_ticks() -> CpuTicks {
    let mut c = CpuTicks::default();
    let pid = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return c;
    };
    for entry in dir.flatten() {
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `tid (comm) state ppid ...`: comm may hold spaces, so split around the parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        // After the comm: state ppid pgrp session tty tpgid flags minflt cminflt majflt
        // cmajflt utime stime ...
        let ticks: u64 = [11, 12]
            .iter()
            .filter_map(|&i| fields.get(i).and_then(|v| v.parse::<u64>().ok()))
            .sum();
        if tid == pid {
            c.main += ticks;
        } else if comm.starts_with(SERVER_THREAD) {
            c.server += ticks;
        } else {
            c.other += ticks;
        }
    }
    c
}

/// Share of one core each thread group used between two samples over `wall`.
fn cpu_shares(a: CpuTicks, b: CpuTicks, wall: Duration) -> (f64, f64, f64) {
    let secs = wall.as_secs_f64().max(1e-9);
    let share = |x: u64, y: u64| y.saturating_sub(x) as f64 / TICKS_PER_SECOND / secs;
    (
        share(a.main, b.main),
        share(a.server, b.server),
        share(a.other, b.other),
    )
}

fn shares_text((main, server, other): (f64, f64, f64)) -> String {
    format!(
        "CPU: main thread {:.0}%, {SERVER_THREAD} {:.0}%, other threads {:.0}% of one core",
        main * 100.0,
        server * 100.0,
        other * 100.0
    )
}

// ---------------------------------------------------------------------------------------------
// Running things on the server runtime

/// Runs `fut` on the API server runtime and waits for it from the controller runtime.
async fn on_server<F>(server: &Handle, fut: F) -> Res<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    server
        .spawn(fut)
        .await
        .map_err(|e| fail(format!("task on the server runtime: {e}")))
}

type FrameResult = Result<Frame<Bytes>, BoxError>;

/// A transport that runs every request of `inner` on another runtime (the server's) and
/// streams the response body back over a channel, so that the in-process API server's work
/// stays off the calling thread.
struct CrossRuntime<T> {
    inner: Arc<T>,
    server: Handle,
}

#[async_trait::async_trait]
impl<T: Transport> Transport for CrossRuntime<T> {
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        let inner = self.inner.clone();
        let (head_tx, head_rx) = oneshot::channel();
        let (frame_tx, frame_rx) = mpsc::channel::<FrameResult>(BRIDGE_FRAMES);
        self.server.spawn(async move {
            let (parts, mut body) = match inner.send(req).await {
                Ok(resp) => resp.into_parts(),
                Err(e) => {
                    let _ = head_tx.send(Err(e));
                    return;
                }
            };
            if head_tx.send(Ok(parts)).is_err() {
                return;
            }
            loop {
                // A watch body never ends by itself: stop pumping once the reader is gone.
                let frame = tokio::select! {
                    f = body.frame() => f,
                    () = frame_tx.closed() => return,
                };
                let Some(frame) = frame else { return };
                if frame_tx.send(frame).await.is_err() {
                    return;
                }
            }
        });
        let parts = head_rx.await.map_err(|_| {
            ClientError::Transport("the server runtime dropped the request".into())
        })??;
        let frames = futures::stream::unfold(frame_rx, |mut rx| async move {
            rx.recv().await.map(|f| (f, rx))
        });
        Ok(http::Response::from_parts(
            parts,
            StreamBody::new(frames).boxed_unsync(),
        ))
    }
}

/// An in-process client for `cluster` whose requests run on the server runtime.
fn bridged_client(cluster: &TestCluster, server: &Handle) -> Client {
    let service = setpoint_apiserver::http::router(cluster.server().clone());
    Client::new(CrossRuntime {
        inner: Arc::new(ServiceTransport::new(service)),
        server: server.clone(),
    })
}

// ---------------------------------------------------------------------------------------------
// Objects

async fn create_namespace(client: &Client, name: &str) -> Res<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_already_exists() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn configmap(namespace: &str, name: &str, i: usize) -> Res<ConfigMap> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "bench"}},
        "data": {"index": i.to_string(), "mode": "benchmark"}
    }))?)
}

fn pod_name(i: usize) -> String {
    format!("web-7c9d5b8f6d-{i:05}")
}

/// A pod as a Deployment's ReplicaSet would create it.
fn pod(i: usize) -> Res<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(i),
            "namespace": NS,
            "labels": {
                "app": "web",
                "tier": "frontend",
                "pod-template-hash": "7c9d5b8f6d"
            },
            "ownerReferences": [{
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "web-7c9d5b8f6d",
                "uid": "3f6c1e2a-9b4d-4c1e-8f7a-2d5e6b7c8d9e",
                "controller": true,
                "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "nodeName": format!("node-{:03}", i % 100),
            "serviceAccountName": "web",
            "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst",
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "web",
                "image": "ghcr.io/acme/web:1.27.3",
                "imagePullPolicy": "IfNotPresent",
                "ports": [
                    {"name": "http", "containerPort": 8080, "protocol": "TCP"},
                    {"name": "metrics", "containerPort": 9102, "protocol": "TCP"}
                ],
                "env": [
                    {"name": "LOG_LEVEL", "value": "info"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}
                ],
                "resources": {
                    "requests": {"cpu": "250m", "memory": "256Mi"},
                    "limits": {"cpu": "1", "memory": "512Mi"}
                },
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File"
            }]
        }
    }))?)
}

/// The status a kubelet would have written for [`pod`] `i`, as a merge patch.
fn pod_status_patch(i: usize) -> Value {
    let at = "2025-03-01T10:00:00Z";
    let condition = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": at});
    json!({"status": {
        "phase": "Running",
        "qosClass": "Burstable",
        "hostIP": format!("10.0.{}.{}", (i / 100) % 250, i % 100 + 1),
        "podIP": format!("10.244.{}.{}", (i / 250) % 250, i % 250 + 1),
        "startTime": at,
        "conditions": [
            condition("Initialized"),
            condition("Ready"),
            condition("ContainersReady"),
            condition("PodScheduled")
        ],
        "containerStatuses": [{
            "name": "web",
            "ready": true,
            "restartCount": 0,
            "image": "ghcr.io/acme/web:1.27.3",
            "containerID": format!("containerd://{:064x}", i as u128 * 0x9e37_79b9_7f4a_7c15),
            "state": {"running": {"startedAt": at}}
        }]
    }})
}

async fn create_configmaps(client: Client, n: usize) -> Res<()> {
    create_namespace(&client, NS).await?;
    let api: Api<ConfigMap> = Api::namespaced(client, NS);
    let api = &api;
    futures::stream::iter(0..n)
        .map(|i| async move {
            let cm = configmap(NS, &format!("cm-{i:05}"), i)?;
            api.create(&PostParams::default(), &cm).await?;
            Ok::<(), BoxError>(())
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_for_each(|()| async { Ok(()) })
        .await
}

/// Creates `n` pods and writes their status. The first pod goes alone: if its status write
/// is refused, the rest are created without status and the error is returned for the report.
async fn create_pods(client: Client, n: usize) -> Res<Option<String>> {
    create_namespace(&client, NS).await?;
    let api: Api<Pod> = Api::namespaced(client, NS);
    let write_status = |i: usize| {
        let api = api.clone();
        async move {
            api.patch_status(
                &pod_name(i),
                &PatchParams::default(),
                &Patch::Merge(pod_status_patch(i)),
            )
            .await
        }
    };
    api.create(&PostParams::default(), &pod(0)?).await?;
    let status_error = write_status(0).await.err().map(|e| e.to_string());
    let with_status = status_error.is_none();
    let api = &api;
    let write_status = &write_status;
    futures::stream::iter(1..n)
        .map(|i| async move {
            api.create(&PostParams::default(), &pod(i)?).await?;
            if with_status {
                write_status(i).await?;
            }
            Ok::<(), BoxError>(())
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .try_for_each(|()| async { Ok(()) })
        .await?;
    Ok(status_error)
}

// ---------------------------------------------------------------------------------------------
// Figure 4: test cluster start time

async fn timed<T>(fut: impl Future<Output = T>) -> Res<(T, Duration)> {
    let t = Instant::now();
    let out = tokio::time::timeout(START_LIMIT, fut)
        .await
        .map_err(|_| fail(format!("did not finish within {START_LIMIT:?}")))?;
    Ok((out, t.elapsed()))
}

struct StartTimes {
    cold: Duration,
    starts: Vec<Duration>,
    stops: Vec<Duration>,
}

async fn start_times(https: bool, runs: usize) -> Res<StartTimes> {
    let start = || async move {
        if https {
            TestCluster::start_https().await
        } else {
            TestCluster::start().await
        }
    };
    let (cluster, cold) = timed(start()).await?;
    timed(cluster.stop()).await?;
    let mut starts = Vec::with_capacity(runs);
    let mut stops = Vec::with_capacity(runs);
    for _ in 0..runs {
        let (cluster, d) = timed(start()).await?;
        starts.push(d);
        let ((), d) = timed(cluster.stop()).await?;
        stops.push(d);
    }
    Ok(StartTimes {
        cold,
        starts,
        stops,
    })
}

/// `start_https`'s steps one at a time: (open store, server new, serve, client).
async fn start_breakdown(runs: usize) -> Res<[Duration; 4]> {
    let mut parts: [Vec<Duration>; 4] = Default::default();
    for _ in 0..runs {
        let config = ServerConfig {
            listen: "127.0.0.1:0".parse()?,
            store: StoreConfig::Memory,
            ..ServerConfig::default()
        };
        let (store, d0) = timed(ApiServer::open_store(&config)).await?;
        let (server, d1) = timed(ApiServer::new(config, store?)).await?;
        let server = server?;
        let (running, d2) = timed(server.serve()).await?;
        let running = running?;
        let t = Instant::now();
        let pki = running
            .pki
            .clone()
            .ok_or_else(|| fail("HTTPS without certificates"))?;
        let kc = Kubeconfig {
            server: running.url.clone(),
            ca_pem: Some(pki.ca_cert.clone()),
            client_cert_pem: Some(pki.admin_cert.clone()),
            client_key_pem: Some(pki.admin_key.clone()),
            ..Kubeconfig::default()
        };
        let client = HttpsTransport::from_kubeconfig(&kc)?;
        let d3 = t.elapsed();
        drop(client);
        timed(running.shutdown()).await?;
        for (v, d) in parts.iter_mut().zip([d0, d1, d2, d3]) {
            v.push(d);
        }
    }
    Ok(parts.map(|v| median_duration(&v)))
}

async fn figure4(opts: &Options, rep: &mut Report) -> Res<()> {
    const TARGET_MS: f64 = 50.0;
    let mut json = Map::new();
    for (https, label) in [
        (false, "TestCluster::start"),
        (true, "TestCluster::start_https"),
    ] {
        eprintln!("[4] {label}: 1 cold + {} timed starts", opts.starts);
        let t = start_times(https, opts.starts).await?;
        let median = median_duration(&t.starts);
        let mut sorted = t.starts.clone();
        sorted.sort();
        rep.row(
            "4",
            format!("{label}().await, median of {}", opts.starts),
            format!("{:.2} ms", ms(median)),
            ms(median),
            "ms",
            Some(Target::AtMost(TARGET_MS)),
        );
        rep.detail(
            "4 test cluster start",
            format!(
                "{label}: cold first start {:.2} ms; warm min {:.2} / median {:.2} / max {:.2} ms; stop median {:.2} ms",
                ms(t.cold),
                ms(sorted[0]),
                ms(median),
                ms(sorted[sorted.len() - 1]),
                ms(median_duration(&t.stops))
            ),
        );
        json.insert(
            if https { "start_https" } else { "start" }.into(),
            json!({
                "cold_ms": ms(t.cold),
                "median_ms": ms(median),
                "min_ms": ms(sorted[0]),
                "max_ms": ms(sorted[sorted.len() - 1]),
                "stop_median_ms": ms(median_duration(&t.stops)),
                "runs_ms": t.starts.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            }),
        );
    }
    eprintln!("[4] start_https step breakdown ({} runs)", opts.starts);
    let [open, new, serve, client] = start_breakdown(opts.starts).await?;
    rep.detail(
        "4 test cluster start",
        format!(
            "start_https steps (medians): open_store {:.3} ms, ApiServer::new (watch cache load + bootstrap objects) {:.2} ms, serve (bind + certificates + TLS config) {:.2} ms, HTTPS client {:.2} ms",
            ms(open),
            ms(new),
            ms(serve),
            ms(client)
        ),
    );
    json.insert(
        "https_steps_median_ms".into(),
        json!({"open_store": ms(open), "apiserver_new": ms(new), "serve": ms(serve), "https_client": ms(client)}),
    );
    rep.json_detail("start", Value::Object(json));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Figure 1: no-op reconcile throughput

/// Looks the key up in the cache and is done. Counts reconciles and wakes the bench when a
/// target count is reached.
struct Noop {
    store: Store<ConfigMap>,
    count: AtomicU64,
    missing: AtomicU64,
    target: AtomicU64,
    reached: Notify,
}

#[async_trait::async_trait]
impl Reconciler for Noop {
    async fn reconcile(&self, _ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let object = self.store.get(key);
        if object.is_none() {
            self.missing.fetch_add(1, Ordering::Relaxed);
        }
        black_box(object);
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        if n == self.target.load(Ordering::Relaxed) {
            self.reached.notify_one();
        }
        Ok(Action::Done)
    }
}

impl Noop {
    /// Waits until `target` reconciles have started in total (set the target first).
    async fn wait_for(&self, target: u64, limit: Duration) -> Res<()> {
        let r = tokio::time::timeout(limit, async {
            loop {
                let mut notified = pin!(self.reached.notified());
                notified.as_mut().enable();
                if self.count.load(Ordering::Relaxed) >= target {
                    return;
                }
                notified.await;
            }
        })
        .await;
        r.map_err(|_| {
            fail(format!(
                "only {} of {target} reconciles within {limit:?}",
                self.count.load(Ordering::Relaxed)
            ))
        })
    }
}

struct NoopRun {
    initial: Duration,
    steady: Duration,
    steady_reconciles: u64,
    steady_cpu: (f64, f64, f64),
    allocs_per_reconcile: Option<f64>,
    missing: u64,
}

async fn run_noop_controller(
    informers: &SharedInformers,
    store: &Store<ConfigMap>,
    keys: &[ObjectKey],
    workers: usize,
    rounds: usize,
    count_allocs: bool,
) -> Res<NoopRun> {
    let n = keys.len() as u64;
    let rec = Arc::new(Noop {
        store: store.clone(),
        count: AtomicU64::new(0),
        missing: AtomicU64::new(0),
        target: AtomicU64::new(n),
        reached: Notify::new(),
    });
    let controller = Controller::for_type::<ConfigMap>(
        &format!("noop-{workers}"),
        informers,
        Some(Scope::namespace(NS)),
    )
    .options(ControllerOptions {
        workers,
        ..ControllerOptions::default()
    })
    .build(rec.clone());
    let queue = controller.queue().clone();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let started = Instant::now();
    let run = tokio::spawn(controller.run(async move {
        let _ = stop_rx.await;
    }));
    let measured = async {
        rec.wait_for(n, DRAIN_LIMIT).await?;
        let initial = started.elapsed();

        let cpu0 = cpu_ticks();
        let t = Instant::now();
        let mut done = n;
        for _ in 0..rounds {
            if t.elapsed() > STEADY_LIMIT {
                break;
            }
            done += n;
            rec.target.store(done, Ordering::Relaxed);
            for k in keys {
                queue.add(k.clone());
            }
            rec.wait_for(done, STEADY_LIMIT + DRAIN_LIMIT).await?;
        }
        let steady = t.elapsed();
        let steady_cpu = cpu_shares(cpu0, cpu_ticks(), steady);
        let steady_reconciles = done - n;

        let allocs_per_reconcile = if count_allocs {
            done += n;
            rec.target.store(done, Ordering::Relaxed);
            let window = AllocWindow::open();
            for k in keys {
                queue.add(k.clone());
            }
            let waited = rec.wait_for(done, DRAIN_LIMIT).await;
            let (allocs, _) = window.close();
            waited?;
            Some(allocs as f64 / n as f64)
        } else {
            None
        };
        Ok::<_, BoxError>(NoopRun {
            initial,
            steady,
            steady_reconciles,
            steady_cpu,
            allocs_per_reconcile,
            missing: rec.missing.load(Ordering::Relaxed),
        })
    }
    .await;
    let _ = stop_tx.send(());
    match tokio::time::timeout(Duration::from_secs(10), run).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(fail(format!("controller task: {e}"))),
        Err(_) => return Err(fail("the controller did not stop within 10 s")),
    }
    measured
}

/// A bare work queue: add every key, then take and release until empty, `rounds` times.
/// Returns (items per second, allocations per item of one more counted round).
fn bare_queue(keys: &[ObjectKey], rounds: usize, metrics: bool) -> (f64, f64) {
    let mut builder = WorkQueue::<ObjectKey>::builder("bench-bare");
    let registry_metrics = WorkQueueMetrics::new();
    if metrics {
        builder = builder.metrics(&registry_metrics);
    }
    let queue = builder.build();
    let pass = |queue: &WorkQueue<ObjectKey>| {
        for k in keys {
            queue.add(k.clone());
        }
        while let Some(item) = queue.try_get() {
            black_box(item.key());
            item.forget();
            item.done();
        }
    };
    pass(&queue);
    let t = Instant::now();
    for _ in 0..rounds {
        pass(&queue);
    }
    let rate = (keys.len() * rounds) as f64 / t.elapsed().as_secs_f64();
    let window = AllocWindow::open();
    pass(&queue);
    let (allocs, _) = window.close();
    (rate, allocs as f64 / keys.len() as f64)
}

/// `Store::get` of every key, `rounds` times: lookups per second.
fn store_gets(store: &Store<ConfigMap>, keys: &[ObjectKey], rounds: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..rounds {
        for k in keys {
            black_box(store.get(k));
        }
    }
    (keys.len() * rounds) as f64 / t.elapsed().as_secs_f64()
}

async fn figure1(opts: &Options, server: &Handle, rep: &mut Report) -> Res<()> {
    const TARGET: f64 = 50_000.0;
    let n = opts.objects;
    eprintln!("[1] cluster on {SERVER_THREAD}; creating {n} ConfigMaps");
    let cluster = on_server(server, TestCluster::start()).await?;
    let t = Instant::now();
    on_server(server, create_configmaps(cluster.client(), n)).await??;
    eprintln!("[1] created in {:.1} s", t.elapsed().as_secs_f64());

    let informers = SharedInformers::new(bridged_client(&cluster, server));
    let informer = informers.typed::<ConfigMap>(Scope::namespace(NS));
    let t = Instant::now();
    tokio::time::timeout(SYNC_LIMIT, informer.wait_synced())
        .await
        .map_err(|_| fail("the ConfigMap informer did not sync"))??;
    let sync = t.elapsed();
    let store = informer.store();
    if store.len() != n {
        return Err(fail(format!(
            "the cache holds {} of {n} ConfigMaps",
            store.len()
        )));
    }
    let keys = store.keys();
    rep.detail(
        "1 reconcile throughput",
        format!(
            "ConfigMap informer synced {n} objects in {:.0} ms (before timing)",
            ms(sync)
        ),
    );

    let mut worker_counts = vec![1];
    if opts.workers != 1 {
        worker_counts.push(opts.workers);
    }
    let mut json_runs = Vec::new();
    let mut one_worker_ns = None;
    for workers in worker_counts {
        eprintln!(
            "[1] controller with {workers} worker(s): initial drain + {} steady rounds",
            opts.rounds
        );
        let r = run_noop_controller(
            &informers,
            &store,
            &keys,
            workers,
            opts.rounds,
            workers == 1,
        )
        .await?;
        if r.missing > 0 {
            return Err(fail(format!(
                "{} reconciles did not find their object",
                r.missing
            )));
        }
        let initial_rate = n as f64 / r.initial.as_secs_f64();
        let steady_rate = r.steady_reconciles as f64 / r.steady.as_secs_f64();
        let plural = if workers == 1 { "" } else { "s" };
        rep.row(
            "1",
            format!("no-op reconcile, initial drain of {n} keys, {workers} worker{plural}"),
            format!("{} /s ({:.0} ms)", thousands(initial_rate), ms(r.initial)),
            initial_rate,
            "reconciles/s",
            Some(Target::AtLeast(TARGET)),
        );
        rep.row(
            "1",
            format!(
                "no-op reconcile, steady re-enqueue ({} x {n} keys), {workers} worker{plural}",
                r.steady_reconciles / n as u64
            ),
            format!(
                "{} /s ({:.2} us each)",
                thousands(steady_rate),
                1e6 / steady_rate
            ),
            steady_rate,
            "reconciles/s",
            Some(Target::AtLeast(TARGET)),
        );
        let mut line = format!(
            "{workers} worker{plural}, steady phase {}",
            shares_text(r.steady_cpu)
        );
        if let Some(a) = r.allocs_per_reconcile {
            line.push_str(&format!(
                "; {a:.1} allocations per reconcile (enqueue included)"
            ));
        }
        rep.detail("1 reconcile throughput", line);
        if workers == 1 {
            one_worker_ns = Some(1e9 / steady_rate);
        }
        json_runs.push(json!({
            "workers": workers,
            "initial_drain_ms": ms(r.initial),
            "initial_reconciles_per_s": initial_rate,
            "steady_reconciles": r.steady_reconciles,
            "steady_ms": ms(r.steady),
            "steady_reconciles_per_s": steady_rate,
            "steady_cpu_share": {"main": r.steady_cpu.0, "server": r.steady_cpu.1, "other": r.steady_cpu.2},
            "allocations_per_reconcile": r.allocs_per_reconcile,
        }));
    }

    eprintln!("[1] breakdown: bare work queue and Store::get");
    let (bare_rate, bare_allocs) = bare_queue(&keys, opts.rounds, false);
    let (metered_rate, metered_allocs) = bare_queue(&keys, opts.rounds, true);
    let get_rate = store_gets(&store, &keys, opts.rounds);
    let ns = |rate: f64| 1e9 / rate;
    rep.detail(
        "1 reconcile throughput",
        format!(
            "breakdown per key (same thread, no controller): WorkQueue add+try_get+forget+done {:.0} ns ({:.1} allocs) without metrics, {:.0} ns ({:.1} allocs) with queue metrics; Store::get {:.0} ns",
            ns(bare_rate),
            bare_allocs,
            ns(metered_rate),
            metered_allocs,
            ns(get_rate)
        ),
    );
    if let Some(total) = one_worker_ns {
        rep.detail(
            "1 reconcile throughput",
            format!(
                "1 worker: {total:.0} ns per reconcile = queue with metrics {:.0} + store get {:.0} + controller worker loop and reconcile call {:.0} ns",
                ns(metered_rate),
                ns(get_rate),
                total - ns(metered_rate) - ns(get_rate)
            ),
        );
    }
    rep.json_detail(
        "reconcile_throughput",
        json!({
            "objects": n,
            "informer_sync_ms": ms(sync),
            "runs": json_runs,
            "breakdown_ns_per_key": {
                "queue_without_metrics": ns(bare_rate),
                "queue_with_metrics": ns(metered_rate),
                "store_get": ns(get_rate),
                "queue_without_metrics_allocs": bare_allocs,
                "queue_with_metrics_allocs": metered_allocs,
            },
        }),
    );

    informers.shutdown().await;
    on_server(server, cluster.stop()).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Figure 2: informer memory per cached pod

async fn figure2(opts: &Options, server: &Handle, rep: &mut Report) -> Res<()> {
    let n = opts.pods;
    eprintln!("[2] cluster on {SERVER_THREAD}; creating {n} pods (+ status)");
    let cluster = on_server(server, TestCluster::start()).await?;
    let t = Instant::now();
    let status_error = on_server(server, create_pods(cluster.client(), n)).await??;
    eprintln!("[2] created in {:.1} s", t.elapsed().as_secs_f64());
    if let Some(e) = &status_error {
        eprintln!("[2] status writes refused ({e}); pods are cached without status");
        rep.detail(
            "2 informer memory",
            format!("status writes were refused ({e}): the pods carry no status"),
        );
    }
    let client = bridged_client(&cluster, server);
    // The server's watch cache applies the writes on the same thread that served them, so it
    // may still be catching up (building its objects) after the last response. A consistent
    // LIST (no resourceVersion) waits until it has caught up, so that work cannot land in the
    // measured window.
    let settle_client = cluster.client();
    let t = Instant::now();
    on_server(server, async move {
        let api: Api<Pod> = Api::namespaced(settle_client, NS);
        let params = ListParams {
            limit: Some(1),
            ..ListParams::default()
        };
        api.list(&params).await.map(|_| ())
    })
    .await??;
    let catch_up = t.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let rss_before = rss_bytes()?;
    let window = AllocWindow::open();
    let t = Instant::now();
    let informers = SharedInformers::new(client);
    let informer = informers.typed::<Pod>(Scope::namespace(NS));
    let synced = tokio::time::timeout(SYNC_LIMIT, informer.wait_synced()).await;
    let sync = t.elapsed();
    // The watch opens right after the list; give it a moment so its buffers count too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_after = rss_bytes()?;
    let (_, heap_delta) = window.close();
    synced
        .map_err(|_| fail("the pod informer did not sync"))?
        .map_err(|e| fail(format!("pod informer: {e}")))?;
    let store = informer.store();
    let cached = store.len();
    if cached != n {
        return Err(fail(format!("the cache holds {cached} of {n} pods")));
    }
    let pods = store.list();
    let json_bytes: usize = pods
        .iter()
        .map(|p| serde_json::to_vec(p.as_ref()).map_or(0, |v| v.len()))
        .sum();
    // What the typed objects alone take: a deep copy of each cached pod, counted.
    let window = AllocWindow::open();
    let copies: Vec<Pod> = pods.iter().map(|p| p.as_ref().clone()).collect();
    let (_, typed_bytes) = window.close();
    drop(copies);
    drop(pods);
    let typed_per_pod = typed_bytes as f64 / n as f64;
    let json_avg = json_bytes as f64 / n as f64;
    let rss_delta = rss_after as f64 - rss_before as f64;
    let rss_per_pod = rss_delta / n as f64;
    let heap_per_pod = heap_delta as f64 / n as f64;
    rep.row(
        "2",
        format!("informer RSS per cached pod ({n} pods, ~{json_avg:.0} B JSON each)"),
        format!(
            "{} B/pod (RSS +{:.1} MiB)",
            thousands(rss_per_pod),
            rss_delta / 1048576.0
        ),
        rss_per_pod,
        "bytes/pod",
        None,
    );
    rep.row(
        "2",
        "informer live heap per cached pod (counting allocator)",
        format!(
            "{} B/pod (heap +{:.1} MiB)",
            thousands(heap_per_pod),
            heap_delta as f64 / 1048576.0
        ),
        heap_per_pod,
        "bytes/pod",
        None,
    );
    rep.detail(
        "2 informer memory",
        format!(
            "RSS {:.1} -> {:.1} MiB; informer start to synced {:.0} ms (paged LIST of {n} pods, decoded to typed Pods, 4 indexes); average pod JSON {json_avg:.0} B, so the cache costs {:.1}x the JSON size in live heap",
            rss_before as f64 / 1048576.0,
            rss_after as f64 / 1048576.0,
            ms(sync),
            heap_per_pod / json_avg
        ),
    );
    rep.detail(
        "2 informer memory",
        format!(
            "of the live heap per pod: {typed_per_pod:.0} B is the typed Pod itself (deep copy counted; {} B of it inline, size_of::<Pod>()), the remaining {:.0} B is the Arc, the store entry, the 4 indexes and anything else kept",
            std::mem::size_of::<Pod>(),
            heap_per_pod - typed_per_pod
        ),
    );
    rep.detail(
        "2 informer memory",
        format!(
            "before the baseline, the server's watch cache needed {:.0} ms after the last write to catch up (consistent LIST)",
            ms(catch_up)
        ),
    );
    rep.json_detail(
        "informer_memory",
        json!({
            "pods": n,
            "rss_before_bytes": rss_before,
            "rss_after_bytes": rss_after,
            "rss_bytes_per_pod": rss_per_pod,
            "heap_delta_bytes": heap_delta,
            "heap_bytes_per_pod": heap_per_pod,
            "pod_json_bytes_avg": json_avg,
            "typed_pod_heap_bytes": typed_per_pod,
            "pod_inline_bytes": std::mem::size_of::<Pod>(),
            "sync_ms": ms(sync),
            "watch_cache_catch_up_ms": ms(catch_up),
        }),
    );

    // The same pods in a cache that packs idle objects (`InformerOptions::compact_idle`, as
    // Setpoint's components run theirs): live heap per pod once every one is packed.
    let window = AllocWindow::open();
    let packing = Informer::new(
        Api::<Pod>::namespaced(informers.client().clone(), NS),
        InformerOptions {
            compact_idle: Some(Duration::from_millis(100)),
            ..InformerOptions::default()
        },
    );
    packing.start();
    let packed = packing.store();
    let t = Instant::now();
    while !(packed.has_synced() && packed.packed_len() == n) {
        if t.elapsed() > SYNC_LIMIT {
            return Err(fail(format!(
                "{} of {n} pods packed after {SYNC_LIMIT:?}",
                packed.packed_len()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, packed_delta) = window.close();
    let packed_per_pod = packed_delta as f64 / n as f64;
    rep.row(
        "2",
        "informer live heap per cached pod, idle pods packed",
        format!(
            "{} B/pod (heap +{:.1} MiB)",
            thousands(packed_per_pod),
            packed_delta as f64 / 1048576.0
        ),
        packed_per_pod,
        "bytes/pod",
        None,
    );
    rep.json_detail(
        "informer_memory_packed",
        json!({
            "pods": n,
            "heap_delta_bytes": packed_delta,
            "heap_bytes_per_pod": packed_per_pod,
        }),
    );
    packing.shutdown().await;
    informers.shutdown().await;
    on_server(server, cluster.stop()).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Figure 3: event -> reconcile start latency

/// Records when each key's reconcile first started.
struct Stamp {
    store: Store<ConfigMap>,
    started: Mutex<HashMap<String, Instant>>,
    changed: Notify,
}

#[async_trait::async_trait]
impl Reconciler for Stamp {
    async fn reconcile(&self, _ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let now = Instant::now();
        black_box(self.store.get(key));
        self.started.lock().entry(key.name.clone()).or_insert(now);
        self.changed.notify_waiters();
        Ok(Action::Done)
    }
}

impl Stamp {
    async fn wait_for(&self, name: &str, limit: Duration) -> Option<Instant> {
        tokio::time::timeout(limit, async {
            loop {
                let mut notified = pin!(self.changed.notified());
                notified.as_mut().enable();
                if let Some(t) = self.started.lock().get(name) {
                    return *t;
                }
                notified.await;
            }
        })
        .await
        .ok()
    }
}

struct Latencies {
    /// Write issued → reconcile start, ns.
    from_write: Vec<i64>,
    /// Response decoded → reconcile start, ns (negative: reconcile first).
    from_response: Vec<i64>,
    timeouts: usize,
    /// The phase deadline passed before every write was made.
    cut_short: bool,
}

fn signed_ns(later: Instant, earlier: Instant) -> i64 {
    match later.checked_duration_since(earlier) {
        Some(d) => d.as_nanos() as i64,
        None => -(earlier.duration_since(later).as_nanos() as i64),
    }
}

async fn measure_latency(client: Client, writes: usize) -> Res<Latencies> {
    create_namespace(&client, LAT_NS).await?;
    let informers = SharedInformers::new(client.clone());
    let informer = informers.typed::<ConfigMap>(Scope::namespace(LAT_NS));
    let rec = Arc::new(Stamp {
        store: informer.store(),
        started: Mutex::new(HashMap::new()),
        changed: Notify::new(),
    });
    let controller =
        Controller::for_type::<ConfigMap>("latency", &informers, Some(Scope::namespace(LAT_NS)))
            .build(rec.clone());
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(async move {
        let _ = stop_rx.await;
    }));
    let measured = async {
        tokio::time::timeout(SYNC_LIMIT, informers.wait_synced())
            .await
            .map_err(|_| fail("the latency informer did not sync"))??;
        let api: Api<ConfigMap> = Api::namespaced(client, LAT_NS);
        let deadline = Instant::now() + LATENCY_PHASE_LIMIT;
        let mut out = Latencies {
            from_write: Vec::with_capacity(writes),
            from_response: Vec::with_capacity(writes),
            timeouts: 0,
            cut_short: false,
        };
        for i in 0..LATENCY_WARMUP + writes {
            if Instant::now() > deadline {
                out.cut_short = true;
                break;
            }
            let name = format!("lat-{i:05}");
            let cm = configmap(LAT_NS, &name, i)?;
            let issued = Instant::now();
            api.create(&PostParams::default(), &cm).await?;
            let answered = Instant::now();
            match rec.wait_for(&name, EVENT_LIMIT).await {
                Some(started) if i >= LATENCY_WARMUP => {
                    out.from_write.push(signed_ns(started, issued));
                    out.from_response.push(signed_ns(started, answered));
                }
                Some(_) => {}
                None => {
                    out.timeouts += 1;
                    if out.timeouts > 5 {
                        return Err(fail("more than 5 writes never reached a reconcile"));
                    }
                }
            }
        }
        Ok::<_, BoxError>(out)
    }
    .await;
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
    informers.shutdown().await;
    measured
}

fn latency_rows(rep: &mut Report, label: &str, mut l: Latencies) -> Value {
    l.from_write.sort_unstable();
    l.from_response.sort_unstable();
    let us = |v: i64| v as f64 / 1e3;
    let w50 = us(quantile(&l.from_write, 0.5));
    let w99 = us(quantile(&l.from_write, 0.99));
    let r50 = us(quantile(&l.from_response, 0.5));
    let r99 = us(quantile(&l.from_response, 0.99));
    let max = us(l.from_write.last().copied().unwrap_or(0));
    let early = l.from_response.iter().filter(|v| **v < 0).count();
    let n = l.from_write.len();
    rep.row(
        "3",
        format!("write -> reconcile start, {label}, p50 / p99 (n={n})"),
        format!("{w50:.0} / {w99:.0} us"),
        w99,
        "us",
        None,
    );
    rep.row(
        "3",
        format!("response -> reconcile start, {label}, p50 / p99"),
        format!("{r50:.0} / {r99:.0} us"),
        r99,
        "us",
        None,
    );
    rep.detail(
        "3 event latency",
        format!(
            "{label}: write->reconcile max {max:.0} us; {early} of {n} reconciles started before the writer had its response; {} writes timed out{}",
            l.timeouts,
            if l.cut_short {
                format!("; stopped at the {LATENCY_PHASE_LIMIT:?} phase limit")
            } else {
                String::new()
            }
        ),
    );
    json!({
        "writes": n,
        "from_write_us": {"p50": w50, "p99": w99, "max": max},
        "from_response_us": {"p50": r50, "p99": r99},
        "reconcile_before_response": early,
        "timeouts": l.timeouts,
        "cut_short": l.cut_short,
    })
}

async fn figure3(opts: &Options, server: &Handle, rep: &mut Report) -> Res<()> {
    let mut json = Map::new();

    let label = "in-process, all on one thread";
    eprintln!("[3] {label}: {} writes", opts.events);
    let cluster = tokio::time::timeout(START_LIMIT, TestCluster::start())
        .await
        .map_err(|_| fail("cluster start timed out"))?;
    let l = measure_latency(cluster.client(), opts.events).await;
    cluster.stop().await;
    match l {
        Ok(l) => {
            json.insert("in_process_one_thread".into(), latency_rows(rep, label, l));
        }
        Err(e) => rep.error("3", label, &e),
    }

    let label = "in-process, server on its own thread";
    eprintln!("[3] {label}: {} writes", opts.events);
    let cluster = on_server(server, TestCluster::start()).await?;
    let l = measure_latency(bridged_client(&cluster, server), opts.events).await;
    on_server(server, cluster.stop()).await?;
    match l {
        Ok(l) => {
            json.insert(
                "in_process_server_thread".into(),
                latency_rows(rep, label, l),
            );
        }
        Err(e) => rep.error("3", label, &e),
    }

    let label = "HTTPS on 127.0.0.1";
    eprintln!("[3] {label}: {} writes", opts.events);
    let cluster = on_server(server, TestCluster::start_https()).await?;
    let l = measure_latency(cluster.client(), opts.events).await;
    on_server(server, cluster.stop()).await?;
    match l {
        Ok(l) => {
            json.insert("https".into(), latency_rows(rep, label, l));
        }
        Err(e) => rep.error("3", label, &e),
    }

    rep.json_detail("event_latency", Value::Object(json));
    Ok(())
}

// ---------------------------------------------------------------------------------------------

async fn run_all(opts: &Options, server: Handle) -> Report {
    let mut rep = Report::default();
    let started = Instant::now();
    // Start time first: the cold start is then really the process's first.
    if let Err(e) = figure4(opts, &mut rep).await {
        rep.error("4", "test cluster start time", &e);
    }
    // Memory before throughput: memory the throughput phase frees stays with the allocator
    // and would be reused by the informer unseen by RSS.
    if let Err(e) = figure2(opts, &server, &mut rep).await {
        rep.error("2", "informer memory per cached pod", &e);
    }
    if let Err(e) = figure1(opts, &server, &mut rep).await {
        rep.error("1", "no-op reconcile throughput", &e);
    }
    if let Err(e) = figure3(opts, &server, &mut rep).await {
        rep.error("3", "event -> reconcile start latency", &e);
    }
    // Table order: figures 1..4 (stable, so each figure's rows keep their order).
    rep.rows.sort_by_key(|r| r.id);
    rep.details.sort_by(|a, b| a.0.cmp(&b.0));
    let total = started.elapsed();
    eprintln!("done in {:.1} s", total.as_secs_f64());
    rep.detail(
        "run",
        format!("total bench time {:.1} s", total.as_secs_f64()),
    );
    rep.json_detail("total_seconds", json!(total.as_secs_f64()));
    rep
}

fn main() {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(SERVER_THREAD)
        .enable_all()
        .build()
        .expect("server runtime");
    let controller_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("controller runtime");
    let report = controller_rt.block_on(run_all(&opts, server_rt.handle().clone()));
    drop(controller_rt);
    server_rt.shutdown_timeout(Duration::from_secs(2));
    if opts.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.to_json(&opts)).expect("JSON")
        );
    } else {
        report.print_table(&opts);
    }
}
