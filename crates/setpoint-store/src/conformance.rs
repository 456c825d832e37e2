//! Backend conformance suite.
//!
//! Every check takes a fresh store (`&dyn Store`) and panics with a description when the
//! backend deviates from the [`Store`] contract. Backends call [`run_all`] from
//! their tests with a factory for empty stores; the checks are public individually too, so a
//! backend that cannot support one (say, an etcd backend without a tunable watch buffer) can run
//! the others.
//!
//! The checks wait on conditions with deadlines ([`DEADLINE`]) and never sleep for a fixed time:
//! to show that a watcher received nothing more, they ask for a progress notification and expect
//! it next.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use crate::{
    Event, KeyValue, Precondition, RangeRequest, Revision, Store, StoreError, WatchResponse,
    WatchStream,
};

/// How long a check waits for something that should happen promptly.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// What the suite needs to know about a backend's configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConformanceOptions {
    /// The backend's value size limit; `None` skips the size-limit check.
    pub max_value_size: Option<usize>,
    /// A number of sequential writes, each its own commit, that certainly overflows one unread
    /// watcher's buffer; `None` skips the slow-watcher check.
    pub overflow_writes: Option<usize>,
    /// The backend's revision counter is shared beyond the store's own keys (an etcd store
    /// under a key prefix): a fresh store starts at whatever revision and compaction point the
    /// shared counter is at, so revisions are checked relative to that start instead of from
    /// 0. Every other check is the same. Stores from `make` must still not be written by
    /// anyone else while the suite runs.
    pub shared_revisions: bool,
}

/// Runs every check, each against a fresh store from `make`.
pub async fn run_all<S: Store>(options: &ConformanceOptions, mut make: impl FnMut() -> S) {
    if options.shared_revisions {
        check_revisions_shared(&make()).await;
    } else {
        check_revisions(&make()).await;
    }
    check_create(&make()).await;
    check_compare_and_swap(&make()).await;
    check_delete(&make()).await;
    check_range_latest_and_history(&make()).await;
    check_pagination(&make()).await;
    check_watch_replay(&make()).await;
    check_watch_live(&make()).await;
    check_watch_compacted(&make()).await;
    check_prefix_isolation(&make()).await;
    check_compaction_keeps_latest(&make()).await;
    check_progress_notification(&make()).await;
    check_concurrent_writers(&make()).await;
    if let Some(limit) = options.max_value_size {
        let store = make();
        let base = if options.shared_revisions {
            store.current_revision().await.unwrap()
        } else {
            0
        };
        value_size_limit_from(&store, limit, base).await;
    }
    if let Some(writes) = options.overflow_writes {
        check_slow_watcher_lagged(&make(), writes).await;
    }
}

fn val(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(DEADLINE, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {DEADLINE:?} waiting for {what}"),
    }
}

/// The next response of a watch, which must arrive and must not be an error.
pub async fn next_response(stream: &mut WatchStream) -> WatchResponse {
    match within("a watch response", stream.next()).await {
        Some(Ok(resp)) => resp,
        Some(Err(e)) => panic!("watch failed: {e}"),
        None => panic!("watch stream ended unexpectedly"),
    }
}

/// Reads responses until exactly `n` events have arrived, checking that response revisions never
/// go backwards and cover their events.
pub async fn collect_events(stream: &mut WatchStream, n: usize) -> Vec<Event> {
    let mut events = Vec::new();
    let mut last_revision = Revision::MIN;
    while events.len() < n {
        let resp = next_response(stream).await;
        assert!(
            resp.revision >= last_revision,
            "watch response revisions went backwards"
        );
        last_revision = resp.revision;
        for e in &resp.events {
            assert!(
                e.revision() <= resp.revision,
                "event {e:?} after its response revision"
            );
        }
        events.extend(resp.events);
    }
    assert_eq!(
        events.len(),
        n,
        "watch delivered more events than expected: {events:?}"
    );
    events
}

/// Asks for a progress notification and reads up to it, returning the events that came first.
/// Proves the watcher has been sent nothing else up to the store's current revision.
pub async fn drain_to_progress(store: &dyn Store, stream: &mut WatchStream) -> Vec<Event> {
    let current = store.current_revision().await.expect("current_revision");
    stream.request_progress();
    let mut events = Vec::new();
    loop {
        let resp = next_response(stream).await;
        if resp.events.is_empty() {
            assert!(
                resp.revision >= current,
                "progress revision {} < {current}",
                resp.revision
            );
            return events;
        }
        events.extend(resp.events);
    }
}

async fn put(store: &dyn Store, key: &str, value: &str) -> KeyValue {
    store
        .put(key, val(value), Precondition::None)
        .await
        .unwrap_or_else(|e| panic!("put {key}: {e}"))
}

/// Keys under `prefix` at `revision` (latest if `None`), as (key, value) pairs.
async fn range_kvs(store: &dyn Store, prefix: &str, revision: Option<Revision>) -> Vec<KeyValue> {
    let req = RangeRequest {
        prefix: prefix.to_owned(),
        revision,
        ..Default::default()
    };
    let resp = store
        .range(req)
        .await
        .unwrap_or_else(|e| panic!("range {prefix}: {e}"));
    assert_eq!(resp.count, resp.kvs.len());
    assert!(!resp.more);
    resp.kvs
}

/// A new store starts at revision 0; every successful write takes the next revision and failed
/// writes take none; create/mod revisions and versions follow etcd.
pub async fn check_revisions(store: &dyn Store) {
    assert_eq!(
        store.current_revision().await.unwrap(),
        0,
        "new store revision"
    );
    assert_eq!(
        store.compacted_revision().await.unwrap(),
        0,
        "new store compacted revision"
    );
    revisions_from(store, 0).await;
}

/// [`check_revisions`] for a store whose revision counter is shared (see
/// [`ConformanceOptions::shared_revisions`]): the same checks, counted from the revision the
/// fresh store starts at.
pub async fn check_revisions_shared(store: &dyn Store) {
    let base = store.current_revision().await.unwrap();
    let compacted = store.compacted_revision().await.unwrap();
    assert!(
        (0..=base).contains(&compacted),
        "compacted revision {compacted} outside 0..={base}"
    );
    assert!(
        range_kvs(store, "", None).await.is_empty(),
        "a fresh store has no keys"
    );
    revisions_from(store, base).await;
}

/// The body of [`check_revisions`], for a fresh store at revision `base`.
async fn revisions_from(store: &dyn Store, base: Revision) {
    let a1 = put(store, "/r/a", "1").await;
    assert_eq!(
        (a1.create_revision, a1.mod_revision, a1.version),
        (base + 1, base + 1, 1)
    );
    assert_eq!(a1.value, val("1"));
    let b1 = put(store, "/r/b", "1").await;
    assert_eq!(
        (b1.create_revision, b1.mod_revision, b1.version),
        (base + 2, base + 2, 1)
    );
    let a2 = put(store, "/r/a", "2").await;
    assert_eq!(
        (a2.create_revision, a2.mod_revision, a2.version),
        (base + 1, base + 3, 2)
    );

    let err = store
        .put("/r/a", val("x"), Precondition::NotExists)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err:?}");
    assert_eq!(
        store.current_revision().await.unwrap(),
        base + 3,
        "failed write took a revision"
    );

    let (prev, rev) = store.delete("/r/a", Precondition::None).await.unwrap();
    assert_eq!(rev, base + 4);
    assert_eq!(prev, a2);
    assert_eq!(store.current_revision().await.unwrap(), base + 4);

    let a3 = store
        .put("/r/a", val("3"), Precondition::NotExists)
        .await
        .unwrap();
    assert_eq!(
        (a3.create_revision, a3.mod_revision, a3.version),
        (base + 5, base + 5, 1)
    );
    assert_eq!(store.get("/r/a").await.unwrap(), Some(a3));
    assert_eq!(store.get("/r/b").await.unwrap(), Some(b1));
    assert_eq!(store.get("/r/none").await.unwrap(), None);
    assert_eq!(store.current_revision().await.unwrap(), base + 5);
}

/// `Precondition::NotExists` creates once, then fails with `AlreadyExists` until the key is
/// deleted.
pub async fn check_create(store: &dyn Store) {
    let kv = store
        .put("/c/x", val("1"), Precondition::NotExists)
        .await
        .unwrap();
    assert_eq!(kv.version, 1);
    let rev = store.current_revision().await.unwrap();
    match store.put("/c/x", val("2"), Precondition::NotExists).await {
        Err(StoreError::AlreadyExists { key }) => assert_eq!(key, "/c/x"),
        other => panic!("second create: {other:?}"),
    }
    assert_eq!(
        store.get("/c/x").await.unwrap(),
        Some(kv),
        "failed create changed the value"
    );
    assert_eq!(store.current_revision().await.unwrap(), rev);
    store.delete("/c/x", Precondition::None).await.unwrap();
    let again = store
        .put("/c/x", val("3"), Precondition::NotExists)
        .await
        .unwrap();
    assert_eq!(again.version, 1);
    assert_eq!(again.create_revision, again.mod_revision);
}

/// `Precondition::ModRevision` succeeds only on an exact match; a mismatch or a missing key
/// fails with `Conflict` carrying the current value.
pub async fn check_compare_and_swap(store: &dyn Store) {
    let v1 = put(store, "/cas/k", "1").await;
    let v2 = store
        .put(
            "/cas/k",
            val("2"),
            Precondition::ModRevision(v1.mod_revision),
        )
        .await;
    let v2 = v2.expect("CAS with the current mod_revision");
    assert_eq!(v2.version, 2);
    assert_eq!(v2.create_revision, v1.create_revision);
    let rev = store.current_revision().await.unwrap();

    match store
        .put(
            "/cas/k",
            val("3"),
            Precondition::ModRevision(v1.mod_revision),
        )
        .await
    {
        Err(StoreError::Conflict { key, current }) => {
            assert_eq!(key, "/cas/k");
            assert_eq!(current.as_deref(), Some(&v2));
        }
        other => panic!("stale CAS: {other:?}"),
    }
    match store
        .put(
            "/cas/missing",
            val("1"),
            Precondition::ModRevision(v1.mod_revision),
        )
        .await
    {
        Err(StoreError::Conflict { current, .. }) => assert_eq!(current, None),
        other => panic!("CAS on a missing key: {other:?}"),
    }
    assert_eq!(
        store.current_revision().await.unwrap(),
        rev,
        "failed CAS took a revision"
    );
    assert_eq!(store.get("/cas/k").await.unwrap(), Some(v2));
    assert_eq!(store.get("/cas/missing").await.unwrap(), None);
}

/// Deletes: `NotFound` for a missing key (whatever the precondition), `Conflict` on a stale
/// CAS, an error for `NotExists`, and the deleted value plus revision on success.
pub async fn check_delete(store: &dyn Store) {
    for pre in [Precondition::None, Precondition::ModRevision(1)] {
        match store.delete("/d/missing", pre).await {
            Err(StoreError::NotFound { key }) => assert_eq!(key, "/d/missing"),
            other => panic!("delete of a missing key with {pre:?}: {other:?}"),
        }
    }
    let kv = put(store, "/d/k", "1").await;
    match store
        .delete("/d/k", Precondition::ModRevision(kv.mod_revision + 100))
        .await
    {
        Err(StoreError::Conflict { current, .. }) => assert_eq!(current.as_deref(), Some(&kv)),
        other => panic!("stale CAS delete: {other:?}"),
    }
    let not_exists = store.delete("/d/k", Precondition::NotExists).await;
    assert!(
        not_exists.is_err(),
        "delete guarded by NotExists must fail: {not_exists:?}"
    );
    assert_eq!(
        store.get("/d/k").await.unwrap(),
        Some(kv.clone()),
        "failed delete removed it"
    );
    assert_eq!(store.current_revision().await.unwrap(), kv.mod_revision);

    let (prev, rev) = store
        .delete("/d/k", Precondition::ModRevision(kv.mod_revision))
        .await
        .unwrap();
    assert_eq!(prev, kv);
    assert_eq!(rev, kv.mod_revision + 1);
    assert_eq!(store.current_revision().await.unwrap(), rev);
    assert_eq!(store.get("/d/k").await.unwrap(), None);
    assert!(matches!(
        store.delete("/d/k", Precondition::None).await,
        Err(StoreError::NotFound { .. })
    ));
}

/// `range` at the latest revision and at every past revision since the start returns exactly
/// the state at that revision, in key order; future revisions are refused.
pub async fn check_range_latest_and_history(store: &dyn Store) {
    let base = store.current_revision().await.unwrap();
    put(store, "/other", "x").await;
    let mut model: BTreeMap<String, KeyValue> = BTreeMap::new();
    let mut snapshots = vec![(store.current_revision().await.unwrap(), model.clone())];
    let script: &[(&str, Option<&str>)] = &[
        ("/h/b", Some("1")),
        ("/h/a", Some("1")),
        ("/h/c", Some("1")),
        ("/h/a", Some("2")),
        ("/h/b", None),
        ("/hx", Some("outside")),
        ("/h/d", Some("1")),
        ("/h/b", Some("again")),
        ("/h/c", None),
    ];
    for (key, value) in script {
        match value {
            Some(v) => {
                let kv = put(store, key, v).await;
                if key.starts_with("/h/") {
                    model.insert(kv.key.to_string(), kv);
                }
            }
            None => {
                store.delete(key, Precondition::None).await.unwrap();
                model.remove(*key);
            }
        }
        snapshots.push((store.current_revision().await.unwrap(), model.clone()));
    }
    let current = store.current_revision().await.unwrap();

    let latest = store
        .range(RangeRequest {
            prefix: "/h/".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        latest.revision, current,
        "latest reads report the current revision"
    );
    assert_eq!(latest.kvs, model.values().cloned().collect::<Vec<_>>());

    for (rev, snapshot) in &snapshots {
        let req = RangeRequest {
            prefix: "/h/".into(),
            revision: Some(*rev),
            ..Default::default()
        };
        let resp = store.range(req).await.unwrap();
        assert_eq!(resp.revision, *rev);
        assert_eq!(
            resp.kvs,
            snapshot.values().cloned().collect::<Vec<_>>(),
            "at revision {rev}"
        );
        assert_eq!(resp.count, snapshot.len());
    }
    // Before anything under the prefix was written.
    assert!(range_kvs(store, "/h/", Some(base)).await.is_empty());

    let future = RangeRequest {
        revision: Some(current + 1),
        ..Default::default()
    };
    match store.range(future).await {
        Err(StoreError::FutureRevision {
            requested,
            current: c,
        }) => {
            assert_eq!((requested, c), (current + 1, current));
        }
        other => panic!("range at a future revision: {other:?}"),
    }
}

/// Paging with `start_after` and `limit` at a pinned revision returns every key exactly once,
/// in order, with correct `count` and `more`, even while writes continue.
pub async fn check_pagination(store: &dyn Store) {
    let keys: Vec<String> = (0..30).map(|i| format!("/p/k{i:03}")).collect();
    put(store, "/o", "before").await;
    for k in &keys {
        put(store, k, k).await;
    }
    put(store, "/p0", "after the prefix").await;
    put(store, "/pz", "after the prefix").await;

    let limit = 7;
    let mut seen = Vec::new();
    let mut start_after: Option<String> = None;
    let mut pinned: Option<Revision> = None;
    loop {
        let req = RangeRequest {
            prefix: "/p/".into(),
            start_after: start_after.clone(),
            revision: pinned,
            limit: Some(limit),
        };
        let resp = store.range(req).await.unwrap();
        let remaining = keys.len() - seen.len();
        assert_eq!(resp.count, remaining, "count after {start_after:?}");
        assert_eq!(resp.kvs.len(), remaining.min(limit));
        assert_eq!(resp.more, remaining > limit);
        if let Some(p) = pinned {
            assert_eq!(resp.revision, p);
        }
        pinned = Some(resp.revision);
        seen.extend(resp.kvs.iter().map(|kv| kv.key.to_string()));
        if !resp.more {
            break;
        }
        start_after = resp.kvs.last().map(|kv| kv.key.to_string());
        // Writes between pages must not disturb a read pinned to the first page's revision.
        put(store, &format!("/p/k{:03}", 100 + seen.len()), "new").await;
        store.delete(&keys[0], Precondition::None).await.unwrap();
        put(store, &keys[0], "recreated").await;
    }
    assert_eq!(seen, keys, "pages must cover every key once, in order");

    // A `start_after` before the prefix starts at the prefix; one after it yields nothing.
    let req = RangeRequest {
        prefix: "/p/".into(),
        start_after: Some("/a".into()),
        revision: pinned,
        limit: Some(1),
    };
    let resp = store.range(req).await.unwrap();
    assert_eq!(&*resp.kvs[0].key, keys[0]);
    assert_eq!(resp.count, keys.len());
    let req = RangeRequest {
        prefix: "/p/".into(),
        start_after: Some("/q".into()),
        ..Default::default()
    };
    let resp = store.range(req).await.unwrap();
    assert!(resp.kvs.is_empty() && resp.count == 0 && !resp.more);
}

/// Writes a small history under `/w/` (interleaved with other keys) and returns the events a
/// watcher of `/w/` must see, built from the write results.
async fn write_watch_history(store: &dyn Store) -> Vec<Event> {
    let mut latest: BTreeMap<String, KeyValue> = BTreeMap::new();
    let mut events = Vec::new();
    let script: &[(&str, Option<&str>)] = &[
        ("/w/a", Some("1")),
        ("/x/a", Some("1")),
        ("/w/b", Some("1")),
        ("/w/a", Some("2")),
        ("/w/a", None),
        ("/x/a", None),
        ("/w/c", Some("1")),
        ("/w/b", Some("2")),
    ];
    for (key, value) in script {
        let event = match value {
            Some(v) => {
                let kv = put(store, key, v).await;
                let prev = latest.insert(kv.key.to_string(), kv.clone());
                Event::Put { kv, prev }
            }
            None => {
                let (prev, revision) = store.delete(key, Precondition::None).await.unwrap();
                assert_eq!(latest.remove(*key).as_ref(), Some(&prev));
                Event::Delete {
                    key: std::sync::Arc::from(*key),
                    revision,
                    prev,
                }
            }
        };
        if key.starts_with("/w/") {
            events.push(event);
        }
    }
    events
}

/// A watch from a past revision replays exactly the later events under its prefix, with their
/// previous values, in order, then continues with live events.
pub async fn check_watch_replay(store: &dyn Store) {
    let base = store.current_revision().await.unwrap();
    let history = write_watch_history(store).await;

    let mut from_start = store.watch("/w/", base).await.unwrap();
    assert_eq!(
        collect_events(&mut from_start, history.len()).await,
        history
    );

    let mid = history[2].revision();
    let mut from_mid = store.watch("/w/", mid).await.unwrap();
    let tail: Vec<Event> = history
        .iter()
        .filter(|e| e.revision() > mid)
        .cloned()
        .collect();
    assert_eq!(collect_events(&mut from_mid, tail.len()).await, tail);

    let kv = put(store, "/w/live", "1").await;
    let expected = vec![Event::Put { kv, prev: None }];
    assert_eq!(collect_events(&mut from_start, 1).await, expected);
    assert_eq!(collect_events(&mut from_mid, 1).await, expected);
    assert!(drain_to_progress(store, &mut from_start).await.is_empty());
}

/// A watch from the current revision sees later puts and deletes as they happen.
pub async fn check_watch_live(store: &dyn Store) {
    put(store, "/l/a", "0").await;
    let start = store.current_revision().await.unwrap();
    let mut watch = store.watch("/l/", start).await.unwrap();
    assert!(
        drain_to_progress(store, &mut watch).await.is_empty(),
        "nothing happened yet"
    );

    let prev = store.get("/l/a").await.unwrap();
    let kv = put(store, "/l/a", "1").await;
    let resp = next_response(&mut watch).await;
    assert_eq!(
        resp.events,
        vec![Event::Put {
            kv: kv.clone(),
            prev
        }]
    );
    assert!(resp.revision >= kv.mod_revision);

    let (deleted, revision) = store.delete("/l/a", Precondition::None).await.unwrap();
    let events = collect_events(&mut watch, 1).await;
    assert_eq!(
        events,
        vec![Event::Delete {
            key: "/l/a".into(),
            revision,
            prev: deleted
        }]
    );
    assert!(drain_to_progress(store, &mut watch).await.is_empty());
}

/// After `compact(r)`, watches and reads before `r` fail with `Compacted`, those at `r` work,
/// compacting backwards is a no-op and compacting the future is refused.
pub async fn check_watch_compacted(store: &dyn Store) {
    let base = store.current_revision().await.unwrap();
    let mut kvs = Vec::new();
    for i in 0..5 {
        kvs.push(put(store, &format!("/cp/{i}"), "v").await);
    }
    let point = base + 3;
    store.compact(point).await.unwrap();
    assert_eq!(store.compacted_revision().await.unwrap(), point);

    match store.watch("/cp/", point - 1).await {
        Err(StoreError::Compacted {
            requested,
            compacted,
        }) => {
            assert_eq!((requested, compacted), (point - 1, point));
        }
        Err(e) => panic!("watch before the compaction point: {e}"),
        Ok(_) => panic!("watch before the compaction point succeeded"),
    }
    let mut watch = store.watch("/cp/", point).await.unwrap();
    let events = collect_events(&mut watch, 2).await;
    let revisions: Vec<Revision> = events.iter().map(Event::revision).collect();
    assert_eq!(revisions, vec![point + 1, point + 2]);

    let old = RangeRequest {
        prefix: "/cp/".into(),
        revision: Some(point - 1),
        ..Default::default()
    };
    assert!(matches!(
        store.range(old).await,
        Err(StoreError::Compacted { .. })
    ));
    let at = range_kvs(store, "/cp/", Some(point)).await;
    assert_eq!(at, kvs[..3].to_vec());

    store
        .compact(point - 2)
        .await
        .expect("compacting backwards is a no-op");
    assert_eq!(store.compacted_revision().await.unwrap(), point);
    let current = store.current_revision().await.unwrap();
    assert!(matches!(
        store.compact(current + 1).await,
        Err(StoreError::FutureRevision { .. })
    ));
    assert_eq!(store.compacted_revision().await.unwrap(), point);
}

/// Prefixes are plain string prefixes: `/iso/a/` sees nothing of `/iso/ab/` or `/iso/b/`.
pub async fn check_prefix_isolation(store: &dyn Store) {
    let start = store.current_revision().await.unwrap();
    let mut wa = store.watch("/iso/a/", start).await.unwrap();
    let mut wab = store.watch("/iso/ab/", start).await.unwrap();
    let a = put(store, "/iso/a/x", "1").await;
    let ab = put(store, "/iso/ab/y", "1").await;
    put(store, "/iso/b/z", "1").await;
    put(store, "/iso/a", "no trailing slash").await;

    assert_eq!(
        drain_to_progress(store, &mut wa).await,
        vec![Event::Put {
            kv: a.clone(),
            prev: None
        }]
    );
    assert_eq!(
        drain_to_progress(store, &mut wab).await,
        vec![Event::Put {
            kv: ab.clone(),
            prev: None
        }]
    );
    assert_eq!(range_kvs(store, "/iso/a/", None).await, vec![a]);
    assert_eq!(range_kvs(store, "/iso/ab/", None).await, vec![ab]);
    assert_eq!(range_kvs(store, "/iso/", None).await.len(), 4);
}

/// Compacting to the current revision keeps every latest value (and keeps deleted keys gone);
/// revisions continue from where they were.
pub async fn check_compaction_keeps_latest(store: &dyn Store) {
    for i in 0..10 {
        put(store, &format!("/k/{i}"), "1").await;
    }
    for i in 0..10 {
        if i % 3 == 0 {
            store
                .delete(&format!("/k/{i}"), Precondition::None)
                .await
                .unwrap();
        } else if i % 3 == 1 {
            put(store, &format!("/k/{i}"), "2").await;
        }
    }
    let before = range_kvs(store, "/k/", None).await;
    let current = store.current_revision().await.unwrap();
    store.compact(current).await.unwrap();
    assert_eq!(store.compacted_revision().await.unwrap(), current);
    assert_eq!(range_kvs(store, "/k/", None).await, before);
    assert_eq!(range_kvs(store, "/k/", Some(current)).await, before);
    for kv in &before {
        assert_eq!(store.get(&kv.key).await.unwrap().as_ref(), Some(kv));
    }
    assert_eq!(store.get("/k/0").await.unwrap(), None);

    let mut watch = store.watch("/k/", current).await.unwrap();
    let next = put(store, "/k/1", "3").await;
    assert_eq!(
        next.mod_revision,
        current + 1,
        "revisions continue after compaction"
    );
    assert_eq!(next.version, 3, "versions survive compaction");
    let events = collect_events(&mut watch, 1).await;
    assert_eq!(events[0].revision(), current + 1);
}

/// `request_progress` yields an empty response at the current revision, after any pending
/// events, even when the writes since were all outside the watcher's prefix.
pub async fn check_progress_notification(store: &dyn Store) {
    let start = store.current_revision().await.unwrap();
    let mut watch = store.watch("/prog/", start).await.unwrap();
    put(store, "/elsewhere", "1").await;
    let current = store.current_revision().await.unwrap();
    watch.request_progress();
    let resp = next_response(&mut watch).await;
    assert_eq!(
        resp,
        crate::WatchResponse {
            events: vec![],
            revision: current
        }
    );

    let kv = put(store, "/prog/a", "1").await;
    put(store, "/elsewhere", "2").await;
    let current = store.current_revision().await.unwrap();
    watch.request_progress();
    let first = next_response(&mut watch).await;
    assert_eq!(first.events, vec![Event::Put { kv, prev: None }]);
    let progress = next_response(&mut watch).await;
    assert_eq!(
        progress,
        crate::WatchResponse {
            events: vec![],
            revision: current
        }
    );
}

/// Concurrent read-modify-write loops on one key, guarded by CAS, lose no increment; concurrent
/// creates of one key let exactly one through; every success has a distinct revision.
pub async fn check_concurrent_writers(store: &dyn Store) {
    let tasks = 8;
    let increments = 10;
    store
        .put("/cc/counter", val("0"), Precondition::NotExists)
        .await
        .unwrap();
    let worker = |_: usize| async move {
        let mut revisions = Vec::new();
        for _ in 0..increments {
            loop {
                let cur = store
                    .get("/cc/counter")
                    .await
                    .unwrap()
                    .expect("counter exists");
                let n: u64 = std::str::from_utf8(&cur.value).unwrap().parse().unwrap();
                let next = val(&(n + 1).to_string());
                match store
                    .put(
                        "/cc/counter",
                        next,
                        Precondition::ModRevision(cur.mod_revision),
                    )
                    .await
                {
                    Ok(kv) => {
                        revisions.push(kv.mod_revision);
                        break;
                    }
                    Err(StoreError::Conflict { .. }) => continue,
                    Err(e) => panic!("counter CAS: {e}"),
                }
            }
        }
        revisions
    };
    let results = within(
        "concurrent CAS loops",
        futures::future::join_all((0..tasks).map(worker)),
    )
    .await;
    let mut revisions: Vec<Revision> = results.into_iter().flatten().collect();
    let final_kv = store.get("/cc/counter").await.unwrap().unwrap();
    assert_eq!(
        final_kv.value,
        val(&(tasks * increments).to_string()),
        "lost an increment"
    );
    assert_eq!(final_kv.version, (tasks * increments) as i64 + 1);
    revisions.sort_unstable();
    revisions.dedup();
    assert_eq!(
        revisions.len(),
        tasks * increments,
        "two writes shared a revision"
    );

    let creates =
        (0..tasks).map(|i| store.put("/cc/once", val(&i.to_string()), Precondition::NotExists));
    let outcomes = within("concurrent creates", futures::future::join_all(creates)).await;
    let winners = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(
        winners, 1,
        "exactly one concurrent create may win: {outcomes:?}"
    );
    for o in outcomes.iter().filter(|o| o.is_err()) {
        assert!(matches!(o, Err(StoreError::AlreadyExists { .. })), "{o:?}");
    }
}

/// Values above the limit fail with `TooLarge`; a value of exactly the limit is accepted.
pub async fn check_value_size_limit(store: &dyn Store, limit: usize) {
    value_size_limit_from(store, limit, 0).await;
}

/// [`check_value_size_limit`] for a fresh store at revision `base`.
async fn value_size_limit_from(store: &dyn Store, limit: usize, base: Revision) {
    let big = Bytes::from(vec![b'x'; limit + 1]);
    match store.put("/big", big, Precondition::None).await {
        Err(StoreError::TooLarge { size, limit: l }) => assert_eq!((size, l), (limit + 1, limit)),
        other => panic!("oversized put: {other:?}"),
    }
    assert_eq!(store.current_revision().await.unwrap(), base);
    let exact = Bytes::from(vec![b'y'; limit]);
    let kv = store
        .put("/big", exact.clone(), Precondition::None)
        .await
        .unwrap();
    assert_eq!(
        store.get("/big").await.unwrap().map(|kv| kv.value),
        Some(exact)
    );
    assert_eq!(kv.mod_revision, base + 1);
}

/// A watcher that does not read while `writes` commits happen is dropped: it receives, in
/// order, what fit in its buffer, then `WatcherLagged` as its last item. The store is
/// unaffected, and a new watch resumes exactly where the lagged one stopped.
pub async fn check_slow_watcher_lagged(store: &dyn Store, writes: usize) {
    let start = store.current_revision().await.unwrap();
    let mut slow = store.watch("/slow/", start).await.unwrap();
    for i in 0..writes {
        put(store, "/slow/k", &i.to_string()).await;
    }
    let mut last = start;
    let mut lagged = false;
    while let Some(item) = within("the slow watcher's backlog", slow.next()).await {
        match item {
            Ok(resp) => {
                for e in &resp.events {
                    assert_eq!(e.revision(), last + 1, "slow watcher saw a gap");
                    last = e.revision();
                }
            }
            Err(StoreError::WatcherLagged) => {
                lagged = true;
                break;
            }
            Err(e) => panic!("unexpected watch error: {e}"),
        }
    }
    assert!(
        lagged,
        "a watcher that never read {writes} commits was not dropped"
    );
    assert!(
        within("the end of the lagged stream", slow.next())
            .await
            .is_none(),
        "WatcherLagged must be the last item"
    );
    let current = store.current_revision().await.unwrap();
    assert!(
        last < current,
        "the lagged watcher cannot have received everything"
    );
    assert_eq!(
        current,
        start + writes as Revision,
        "a slow watcher must not affect writes"
    );

    let mut resumed = store.watch("/slow/", last).await.unwrap();
    let rest = collect_events(&mut resumed, (current - last) as usize).await;
    assert_eq!(rest.first().map(Event::revision), Some(last + 1));
    assert_eq!(rest.last().map(Event::revision), Some(current));
}
