//! Behaviour specific to the durable backend: restart, compaction on disk, close, group commit.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use setpoint_store::conformance::{collect_events, DEADLINE};
use setpoint_store::embedded::{EmbeddedOptions, EmbeddedStore};
use setpoint_store::{Event, KeyValue, Precondition, RangeRequest, Revision, Store, StoreError};

fn open(dir: &Path) -> EmbeddedStore {
    EmbeddedStore::open(dir, EmbeddedOptions::default()).expect("open store")
}

async fn range_at(store: &dyn Store, revision: Option<Revision>) -> Vec<KeyValue> {
    let req = RangeRequest {
        prefix: "/".into(),
        revision,
        ..Default::default()
    };
    store.range(req).await.expect("range").kvs
}

/// Everything observable about the history: the state at every revision since compaction and
/// every event with its previous value.
async fn snapshot(store: &dyn Store) -> (Revision, Revision, Vec<Vec<KeyValue>>, Vec<Event>) {
    let current = store.current_revision().await.unwrap();
    let compacted = store.compacted_revision().await.unwrap();
    let mut states = Vec::new();
    for rev in compacted..=current {
        states.push(range_at(store, Some(rev)).await);
    }
    let mut watch = store.watch("/", compacted).await.unwrap();
    let events = collect_events(&mut watch, (current - compacted) as usize).await;
    (current, compacted, states, events)
}

async fn write_mixed_history(store: &dyn Store, rounds: usize) {
    for i in 0..rounds {
        let key = format!("/k/{}", i % 7);
        store
            .put(&key, Bytes::from(format!("v{i}")), Precondition::None)
            .await
            .unwrap();
        if i % 5 == 4 {
            store
                .delete(&format!("/k/{}", (i + 3) % 7), Precondition::None)
                .await
                .ok();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_restores_state_history_and_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    write_mixed_history(&store, 40).await;
    // End with deletes so that the newest revisions have no live key pointing at them.
    store
        .put("/z/a", Bytes::from_static(b"1"), Precondition::None)
        .await
        .unwrap();
    store.delete("/z/a", Precondition::None).await.unwrap();
    let before = snapshot(&store).await;
    store.close().await;
    assert!(matches!(store.get("/k/1").await, Err(StoreError::Closed)));
    drop(store);

    let store = open(dir.path());
    let after = snapshot(&store).await;
    assert_eq!(
        after, before,
        "reopen must restore state, history and revisions exactly"
    );
    let kv = store
        .put("/z/a", Bytes::from_static(b"2"), Precondition::NotExists)
        .await
        .unwrap();
    assert_eq!(
        kv.mod_revision,
        before.0 + 1,
        "revisions continue after a restart"
    );
}

/// History whose values are read back from disk looks exactly like history held in memory,
/// whether the store was just reopened or kept writing and compacting since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_values_read_back_from_disk_match_memory() {
    let dir = tempfile::tempdir().unwrap();
    let open_with = |history_memory_bytes| {
        let options = EmbeddedOptions {
            history_memory_bytes,
            ..Default::default()
        };
        EmbeddedStore::open(dir.path(), options).expect("open store")
    };
    let store = open_with(usize::MAX);
    write_mixed_history(&store, 60).await;
    let all_in_memory = snapshot(&store).await;
    drop(store);
    // Nothing kept, or only the newest few events' values (each value is 2 or 3 bytes).
    for budget in [0, 16] {
        let store = open_with(budget);
        assert_eq!(snapshot(&store).await, all_in_memory, "budget {budget}");
    }

    // Values stripped while the store runs, then a compaction in the middle of them.
    let store = open_with(16);
    write_mixed_history(&store, 30).await;
    let point = store.current_revision().await.unwrap() - 20;
    store.compact(point).await.unwrap();
    write_mixed_history(&store, 10).await;
    let stripped = snapshot(&store).await;
    drop(store);
    let store = open_with(usize::MAX);
    assert_eq!(snapshot(&store).await, stripped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    write_mixed_history(&store, 60).await;
    let point = store.current_revision().await.unwrap() - 10;
    store.compact(point).await.unwrap();
    write_mixed_history(&store, 15).await;
    let mid = store.current_revision().await.unwrap() - 3;
    store.compact(mid).await.unwrap();
    let before = snapshot(&store).await;
    assert_eq!(before.1, mid);
    drop(store);

    let store = open(dir.path());
    assert_eq!(snapshot(&store).await, before);
    let old = RangeRequest {
        revision: Some(mid - 1),
        ..Default::default()
    };
    assert!(matches!(
        store.range(old).await,
        Err(StoreError::Compacted { .. })
    ));

    // Compacting everything away, including trailing deletes, still restores exactly.
    store.delete("/k/0", Precondition::None).await.ok();
    store.delete("/k/1", Precondition::None).await.ok();
    let current = store.current_revision().await.unwrap();
    store.compact(current).await.unwrap();
    let latest = range_at(&store, None).await;
    drop(store);
    let store = open(dir.path());
    assert_eq!(store.current_revision().await.unwrap(), current);
    assert_eq!(store.compacted_revision().await.unwrap(), current);
    assert_eq!(range_at(&store, None).await, latest);
    let kv = store
        .put("/k/0", Bytes::from_static(b"x"), Precondition::NotExists)
        .await
        .unwrap();
    assert_eq!(kv.mod_revision, current + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_watches_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store
        .put("/a", Bytes::from_static(b"1"), Precondition::None)
        .await
        .unwrap();
    let mut watch = store.watch("/", 0).await.unwrap();
    store.close().await;
    store.close().await; // idempotent
    assert!(matches!(
        store
            .put("/a", Bytes::from_static(b"2"), Precondition::None)
            .await,
        Err(StoreError::Closed)
    ));
    assert!(matches!(store.compact(1).await, Err(StoreError::Closed)));
    // The stream ends; it may or may not deliver the replayed event first.
    let mut items = Vec::new();
    while let Some(item) = tokio::time::timeout(DEADLINE, watch.next())
        .await
        .expect("stream end")
    {
        items.push(item);
    }
    assert!(items.len() <= 1, "{items:?}");
    // The file is closed: the directory can be opened again at once.
    let again = open(dir.path());
    assert_eq!(
        again.get("/a").await.unwrap().unwrap().value,
        Bytes::from_static(b"1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_cannot_be_opened_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    match EmbeddedStore::open(dir.path(), EmbeddedOptions::default()) {
        Err(StoreError::Backend(_)) => {}
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a second open of the same directory succeeded"),
    }
    drop(store);
    open(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_share_commits() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path()));
    let writers = 32;
    let per_writer = 20;
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..per_writer {
                    let key = format!("/gc/{w}/{i}");
                    store
                        .put(&key, Bytes::from_static(b"v"), Precondition::NotExists)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        tokio::time::timeout(DEADLINE, t)
            .await
            .expect("writers finish")
            .unwrap();
    }
    let stats = store.stats();
    let total = (writers * per_writer) as u64;
    assert_eq!(stats.writes, total);
    assert_eq!(store.current_revision().await.unwrap(), total as Revision);
    assert!(
        stats.commits < stats.writes,
        "no two of {total} concurrent writes shared a commit: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_preconditions_see_earlier_writes_of_the_batch() {
    // Many writers racing on the same keys end up in the same batches; the outcome must be as
    // if the writes had been applied one at a time.
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path()));
    let tasks: Vec<_> = (0..16)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                for round in 0..10 {
                    let key = format!("/race/{round}");
                    let created = store
                        .put(&key, Bytes::from(format!("{w}")), Precondition::NotExists)
                        .await;
                    let deleted = store.delete(&key, Precondition::None).await;
                    outcomes.push((created.is_ok(), deleted.is_ok()));
                }
                outcomes
            })
        })
        .collect();
    let mut creates = 0;
    let mut deletes = 0;
    for t in tasks {
        for (c, d) in tokio::time::timeout(DEADLINE, t).await.unwrap().unwrap() {
            creates += c as i64;
            deletes += d as i64;
        }
    }
    let current = store.current_revision().await.unwrap();
    assert_eq!(
        current,
        creates + deletes,
        "every success took exactly one revision"
    );
    let live = range_at(&*store, None).await.len() as i64;
    assert_eq!(
        creates - deletes,
        live,
        "creates and deletes must balance with what is left"
    );
    let mut watch = store.watch("/race/", 0).await.unwrap();
    let events = collect_events(&mut watch, current as usize).await;
    // Replaying the log must alternate create/delete per key, never two creates in a row.
    let mut exists = std::collections::HashMap::new();
    for e in events {
        let was = exists
            .insert(e.key().to_owned(), matches!(e, Event::Put { .. }))
            .unwrap_or(false);
        match e {
            Event::Put { prev, .. } => assert!(!was && prev.is_none(), "create over a live key"),
            Event::Delete { .. } => assert!(was, "delete of an absent key"),
        }
    }
}

/// Every logged version of a key shares one copy of its name, whether written live or read
/// back from disk at open (the log holds every revision since compaction, so per-version
/// copies were a good part of the store's memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_of_a_key_share_its_name_live_and_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let shared = |events: &[Event]| {
        let keys: Vec<&Arc<str>> = events
            .iter()
            .map(|e| match e {
                Event::Put { kv, .. } => &kv.key,
                Event::Delete { key, .. } => key,
            })
            .collect();
        keys.windows(2).all(|w| Arc::ptr_eq(w[0], w[1]))
    };
    {
        let store = open(dir.path());
        for i in 0..3 {
            store
                .put("/k/x", Bytes::from(format!("v{i}")), Precondition::None)
                .await
                .unwrap();
        }
        store.delete("/k/x", Precondition::None).await.unwrap();
        let mut watch = store.watch("/", 0).await.unwrap();
        let events = collect_events(&mut watch, 4).await;
        assert!(shared(&events), "live: {events:?}");
        store.close().await;
    }
    let store = open(dir.path());
    let mut watch = store.watch("/", 0).await.unwrap();
    let events = collect_events(&mut watch, 4).await;
    assert_eq!(events.len(), 4);
    assert!(shared(&events), "reopened: {events:?}");
}
