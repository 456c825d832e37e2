//! Runs the backend conformance suite against the memory and embedded backends.

use setpoint_store::conformance::{run_all, ConformanceOptions};
use setpoint_store::embedded::{EmbeddedOptions, EmbeddedStore};
use setpoint_store::memory::{MemoryOptions, MemoryStore};

/// A small value limit and watch buffer keep the size and slow-watcher checks quick.
const LIMIT: usize = 64 * 1024;
const WATCH_BUFFER: usize = 8;

fn options() -> ConformanceOptions {
    ConformanceOptions {
        max_value_size: Some(LIMIT),
        overflow_writes: Some(4 * WATCH_BUFFER),
        shared_revisions: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_conformance() {
    run_all(&options(), || {
        MemoryStore::with_options(MemoryOptions {
            max_value_size: LIMIT,
            watch_buffer: WATCH_BUFFER,
        })
    })
    .await;
}

async fn embedded_conformance_with(history_memory_bytes: usize) {
    let root = tempfile::tempdir().unwrap();
    let mut n = 0;
    run_all(&options(), || {
        n += 1;
        let opts = EmbeddedOptions {
            max_value_size: LIMIT,
            watch_buffer: WATCH_BUFFER,
            history_memory_bytes,
            ..Default::default()
        };
        EmbeddedStore::open(&root.path().join(format!("store-{n}")), opts).unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_conformance() {
    embedded_conformance_with(EmbeddedOptions::default().history_memory_bytes).await;
}

/// No value of past events kept in memory: every replay and historical read goes to disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_conformance_with_history_on_disk() {
    embedded_conformance_with(0).await;
}
