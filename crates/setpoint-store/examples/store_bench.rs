//! Durable write throughput and latency of the store backends.
//!
//! ```text
//! cargo run --release -p setpoint-store --example store_bench -- \
//!     [--writers 64] [--seconds 5] [--value-size 1024] [--dir D]
//! ```
//!
//! Runs, for the embedded store and then the memory store (for comparison), `--writers`
//! concurrent writers and then a single writer. Each writer loops doing unconditional puts of
//! `--value-size` bytes over its own 1000 keys and waits for each acknowledgement (for the
//! embedded store: durable on disk) before the next. Prints writes/s, p50/p99 latency and, for
//! the embedded store, the average number of writes per commit (fsync).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use setpoint_store::embedded::{EmbeddedOptions, EmbeddedStore};
use setpoint_store::memory::MemoryStore;
use setpoint_store::{Precondition, Store};

struct Args {
    writers: usize,
    seconds: f64,
    value_size: usize,
    dir: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        writers: 64,
        seconds: 5.0,
        value_size: 1024,
        dir: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--writers" => {
                args.writers = value()?.parse().map_err(|e| format!("--writers: {e}"))?
            }
            "--seconds" => {
                args.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?
            }
            "--value-size" => {
                args.value_size = value()?.parse().map_err(|e| format!("--value-size: {e}"))?
            }
            "--dir" => args.dir = Some(PathBuf::from(value()?)),
            "-h" | "--help" => {
                println!("store_bench [--writers N] [--seconds S] [--value-size BYTES] [--dir D]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.writers == 0 {
        return Err("--writers must be at least 1".into());
    }
    Ok(args)
}

struct Outcome {
    writes: usize,
    elapsed: Duration,
    /// Per-write latencies, sorted.
    latencies: Vec<Duration>,
}

impl Outcome {
    fn percentile(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let idx = ((self.latencies.len() as f64 * p) as usize).min(self.latencies.len() - 1);
        self.latencies[idx]
    }
}

async fn run(store: Arc<dyn Store>, writers: usize, seconds: f64, value_size: usize) -> Outcome {
    let value = Bytes::from(vec![0xabu8; value_size]);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            let value = value.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut i = 0usize;
                while Instant::now() < deadline {
                    let key = format!("/registry/bench/w{w}/k{}", i % 1000);
                    let t = Instant::now();
                    store
                        .put(&key, value.clone(), Precondition::None)
                        .await
                        .expect("put");
                    latencies.push(t.elapsed());
                    i += 1;
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await.expect("writer task"));
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    Outcome {
        writes: latencies.len(),
        elapsed,
        latencies,
    }
}

fn report(name: &str, writers: usize, o: &Outcome, extra: &str) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<9} writers={writers:<4} writes/s={:>9.0}  p50={:>7.3}ms  p99={:>7.3}ms  writes={}{extra}",
        o.writes as f64 / o.elapsed.as_secs_f64(),
        ms(o.percentile(0.50)),
        ms(o.percentile(0.99)),
        o.writes,
    );
}

async fn bench_embedded(dir: &Path, writers: usize, args: &Args) {
    let _ = std::fs::remove_dir_all(dir);
    let store = Arc::new(EmbeddedStore::open(dir, EmbeddedOptions::default()).expect("open"));
    let outcome = run(store.clone(), writers, args.seconds, args.value_size).await;
    let stats = store.stats();
    let extra = format!(
        "  commits={}  writes/commit={:.1}",
        stats.commits,
        stats.writes as f64 / stats.commits.max(1) as f64
    );
    report("embedded", writers, &outcome, &extra);
    store.close().await;
}

async fn bench_memory(writers: usize, args: &Args) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let outcome = run(store, writers, args.seconds, args.value_size).await;
    report("memory", writers, &outcome, "");
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("store_bench: {e}");
            std::process::exit(2);
        }
    };
    let temp = match &args.dir {
        Some(_) => None,
        None => Some(tempfile::tempdir().expect("temporary directory")),
    };
    let root = args
        .dir
        .clone()
        .unwrap_or_else(|| temp.as_ref().unwrap().path().to_owned());
    println!(
        "value size {} B, {} s per run, store files under {}",
        args.value_size,
        args.seconds,
        root.display()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        for writers in [args.writers, 1] {
            bench_embedded(&root.join(format!("embedded-{writers}")), writers, &args).await;
        }
        for writers in [args.writers, 1] {
            bench_memory(writers, &args).await;
        }
    });
}
