//! Property test: concurrent random writes against the memory and embedded backends, checked
//! against the history the writes themselves report (see `support/history.rs`); the embedded
//! backend must also restore all of it after a reopen, whatever part of its history it keeps
//! in memory. `etcd.rs` runs the same property against a real etcd.

use std::sync::Arc;

use proptest::prelude::*;
use setpoint_store::embedded::{EmbeddedOptions, EmbeddedStore};
use setpoint_store::memory::MemoryStore;
use setpoint_store::Store;

#[path = "support/history.rs"]
mod history;

use history::{check_reads, run_history, tasks, Op};

#[derive(Clone, Copy, Debug)]
enum Backend {
    Memory,
    /// With this many bytes of history values kept in memory.
    Embedded(usize),
}

async fn run_case(backend: Backend, phase1: Vec<Vec<Op>>, phase2: Vec<Vec<Op>>, cut: f64) {
    let dir = tempfile::tempdir().unwrap();
    let open = || -> Arc<dyn Store> {
        match backend {
            Backend::Memory => Arc::new(MemoryStore::new()),
            Backend::Embedded(history_memory_bytes) => {
                let options = EmbeddedOptions {
                    history_memory_bytes,
                    ..Default::default()
                };
                Arc::new(EmbeddedStore::open(dir.path(), options).unwrap())
            }
        }
    };
    let store = open();
    assert_eq!(store.current_revision().await.unwrap(), 0, "a new store");
    let (history, compacted) = run_history(&store, phase1, phase2, cut).await;

    if let Backend::Embedded(_) = backend {
        drop(store);
        let store = open();
        check_reads(&*store, &history, compacted).await;
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, max_shrink_iters: 64, ..ProptestConfig::default() })]

    #[test]
    fn memory_history_is_consistent(phase1 in tasks(30), phase2 in tasks(10), cut in 0.0..=1.0f64) {
        runtime().block_on(run_case(Backend::Memory, phase1, phase2, cut));
    }

    #[test]
    fn embedded_history_is_consistent(
        phase1 in tasks(30),
        phase2 in tasks(10),
        cut in 0.0..=1.0f64,
        // None, some or all of the history's values on disk only.
        history_memory_bytes in prop_oneof![Just(0usize), 0..400usize, Just(usize::MAX)],
    ) {
        let backend = Backend::Embedded(history_memory_bytes);
        runtime().block_on(run_case(backend, phase1, phase2, cut));
    }
}
