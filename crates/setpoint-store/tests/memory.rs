//! Behaviour specific to the memory backend: closing and dropping end watch streams.

use bytes::Bytes;
use futures::StreamExt;
use setpoint_store::conformance::DEADLINE;
use setpoint_store::memory::MemoryStore;
use setpoint_store::{Precondition, Store, StoreError, WatchStream};

async fn assert_ends(mut watch: WatchStream) {
    let next = tokio::time::timeout(DEADLINE, watch.next())
        .await
        .expect("stream ends");
    assert!(
        next.is_none(),
        "expected the end of the stream, got {next:?}"
    );
}

#[tokio::test]
async fn close_ends_watches_and_refuses_calls() {
    let store = MemoryStore::new();
    store
        .put("/a", Bytes::from_static(b"1"), Precondition::None)
        .await
        .unwrap();
    let watch = store.watch("/", 1).await.unwrap();
    store.close();
    assert_ends(watch).await;
    assert!(matches!(store.get("/a").await, Err(StoreError::Closed)));
    assert!(matches!(
        store
            .put("/a", Bytes::from_static(b"2"), Precondition::None)
            .await,
        Err(StoreError::Closed)
    ));
    assert!(matches!(store.watch("/", 1).await, Err(StoreError::Closed)));
}

#[tokio::test]
async fn dropping_the_store_ends_watches() {
    let store = MemoryStore::new();
    let watch = store.watch("/", 0).await.unwrap();
    drop(store);
    assert_ends(watch).await;
}

#[tokio::test]
async fn watch_from_a_future_revision_skips_until_then() {
    let store = MemoryStore::new();
    let mut watch = store.watch("/", 2).await.unwrap();
    for v in ["1", "2", "3"] {
        store
            .put("/k", Bytes::from(v), Precondition::None)
            .await
            .unwrap();
    }
    let resp = tokio::time::timeout(DEADLINE, watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let revisions: Vec<i64> = resp.events.iter().map(|e| e.revision()).collect();
    assert_eq!(revisions, vec![3]);
}
