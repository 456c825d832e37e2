//! The history property shared by the store's property tests (included with `#[path]` by
//! `proptest_history.rs` for the memory and embedded backends and by `etcd.rs`).
//!
//! Several tokio tasks run random puts, creates, compare-and-swaps (fresh and stale) and deletes
//! on a few overlapping keys, and start watchers at various revisions and prefixes. Afterwards:
//! - successful writes have exactly the revisions after the start, strictly increasing with no
//!   gaps, and each reported key-value agrees with replaying the history in revision order;
//! - the latest state, and `range` at every past revision, equal the replayed history;
//! - every watcher saw exactly the history suffix after its start revision, under its prefix;
//! - after compacting at a random point and writing more, reads before the point fail and reads
//!   after it still match.
//!
//! A fresh memory or embedded store starts at revision 0; an etcd store under a new prefix
//! starts wherever the shared etcd revision is, so the history is kept relative to the
//! revision the store started at (`History::base`).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use proptest::prelude::*;
use setpoint_store::conformance::drain_to_progress;
use setpoint_store::{
    Event, KeyValue, Precondition, RangeRequest, Revision, Store, StoreError, WatchStream,
};

const KEYS: &[&str] = &["/a/1", "/a/2", "/ab/1", "/b/1", "/b/2"];
const PREFIXES: &[&str] = &["", "/a/", "/ab", "/b/"];

#[derive(Clone, Debug)]
pub enum Op {
    Put(usize),
    Create(usize),
    /// Read, then compare-and-swap (or create if absent) with what was read.
    CasFresh(usize),
    /// Compare-and-swap with a revision that cannot match.
    CasStale(usize, i64),
    Delete(usize),
    /// Read, then delete guarded by what was read.
    DeleteCas(usize),
    /// Watch `PREFIXES[p]` from `back` revisions before the current one.
    Watch(usize, i64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    prop_oneof![
        3 => key.clone().prop_map(Op::Put),
        2 => key.clone().prop_map(Op::Create),
        3 => key.clone().prop_map(Op::CasFresh),
        1 => (key.clone(), 0..5i64).prop_map(|(k, b)| Op::CasStale(k, b)),
        2 => key.clone().prop_map(Op::Delete),
        2 => key.prop_map(Op::DeleteCas),
        1 => (0..PREFIXES.len(), 0..8i64).prop_map(|(p, b)| Op::Watch(p, b)),
    ]
}

pub fn tasks(max_ops: usize) -> impl Strategy<Value = Vec<Vec<Op>>> {
    prop::collection::vec(prop::collection::vec(op(), 1..max_ops), 2..5)
}

/// A successful write as reported to its caller.
#[derive(Clone, Debug)]
pub enum Done {
    Put(KeyValue),
    Delete {
        key: String,
        prev: KeyValue,
        revision: Revision,
    },
}

impl Done {
    fn revision(&self) -> Revision {
        match self {
            Done::Put(kv) => kv.mod_revision,
            Done::Delete { revision, .. } => *revision,
        }
    }
}

pub struct Watcher {
    prefix: &'static str,
    after: Revision,
    stream: WatchStream,
}

#[derive(Default)]
pub struct Record {
    done: Vec<Done>,
    /// Values reported as "current" by conflicts; each must have existed at some point.
    conflict_values: Vec<KeyValue>,
    watchers: Vec<Watcher>,
}

async fn run_task(store: Arc<dyn Store>, task: usize, ops: Vec<Op>, record: Arc<Mutex<Record>>) {
    for (i, op) in ops.into_iter().enumerate() {
        let value = Bytes::from(format!("t{task}-{i}"));
        let done = match op {
            Op::Put(k) => Some(
                store
                    .put(KEYS[k], value, Precondition::None)
                    .await
                    .map(Done::Put),
            ),
            Op::Create(k) => {
                let r = store.put(KEYS[k], value, Precondition::NotExists).await;
                if let Err(e) = &r {
                    assert!(
                        matches!(e, StoreError::AlreadyExists { .. }),
                        "create: {e:?}"
                    );
                }
                r.ok().map(|kv| Ok(Done::Put(kv)))
            }
            Op::CasFresh(k) => {
                let pre = match store.get(KEYS[k]).await.unwrap() {
                    Some(kv) => Precondition::ModRevision(kv.mod_revision),
                    None => Precondition::NotExists,
                };
                match store.put(KEYS[k], value, pre).await {
                    Ok(kv) => Some(Ok(Done::Put(kv))),
                    Err(StoreError::Conflict { current, .. }) => {
                        record.lock().conflict_values.extend(current.map(|b| *b));
                        None
                    }
                    Err(StoreError::AlreadyExists { .. }) => None,
                    Err(e) => panic!("CAS: {e:?}"),
                }
            }
            Op::CasStale(k, back) => {
                let stale = store
                    .get(KEYS[k])
                    .await
                    .unwrap()
                    .map_or(0, |kv| kv.mod_revision)
                    - 1
                    - back;
                match store
                    .put(KEYS[k], value, Precondition::ModRevision(stale))
                    .await
                {
                    Err(StoreError::Conflict { current, .. }) => {
                        record.lock().conflict_values.extend(current.map(|b| *b));
                        None
                    }
                    other => panic!("stale CAS must conflict: {other:?}"),
                }
            }
            Op::Delete(k) => match store.delete(KEYS[k], Precondition::None).await {
                Ok((prev, revision)) => Some(Ok(Done::Delete {
                    key: KEYS[k].to_owned(),
                    prev,
                    revision,
                })),
                Err(StoreError::NotFound { .. }) => None,
                Err(e) => panic!("delete: {e:?}"),
            },
            Op::DeleteCas(k) => {
                let Some(kv) = store.get(KEYS[k]).await.unwrap() else {
                    continue;
                };
                match store
                    .delete(KEYS[k], Precondition::ModRevision(kv.mod_revision))
                    .await
                {
                    Ok((prev, revision)) => {
                        assert_eq!(prev, kv, "CAS delete removed a different value");
                        Some(Ok(Done::Delete {
                            key: KEYS[k].to_owned(),
                            prev,
                            revision,
                        }))
                    }
                    Err(StoreError::Conflict { current, .. }) => {
                        record.lock().conflict_values.extend(current.map(|b| *b));
                        None
                    }
                    Err(StoreError::NotFound { .. }) => None,
                    Err(e) => panic!("CAS delete: {e:?}"),
                }
            }
            Op::Watch(p, back) => {
                let current = store.current_revision().await.unwrap();
                let compacted = store.compacted_revision().await.unwrap();
                let after = (current - back).max(compacted);
                let stream = store.watch(PREFIXES[p], after).await.unwrap();
                record.lock().watchers.push(Watcher {
                    prefix: PREFIXES[p],
                    after,
                    stream,
                });
                None
            }
        };
        if let Some(done) = done {
            let done = done.unwrap_or_else(|e| panic!("write failed: {e:?}"));
            record.lock().done.push(done);
        }
    }
}

pub async fn run_phase(store: &Arc<dyn Store>, phase: Vec<Vec<Op>>) -> Record {
    let record = Arc::new(Mutex::new(Record::default()));
    let handles: Vec<_> = phase
        .into_iter()
        .enumerate()
        .map(|(t, ops)| tokio::spawn(run_task(store.clone(), t, ops, record.clone())))
        .collect();
    for h in handles {
        h.await.expect("task panicked");
    }
    Arc::try_unwrap(record)
        .ok()
        .expect("tasks finished")
        .into_inner()
}

/// The history replayed in revision order: the events (with prev values, as watchers must see
/// them) and the state after each revision, starting from an empty store at `base`.
pub struct History {
    /// The revision the (empty) store started at.
    pub base: Revision,
    events: Vec<Event>,
    /// `states[i]` is the state at revision `base + i`.
    states: Vec<BTreeMap<String, KeyValue>>,
}

impl History {
    pub fn new(base: Revision) -> Self {
        History {
            base,
            events: Vec::new(),
            states: vec![BTreeMap::new()],
        }
    }

    pub fn current(&self) -> Revision {
        self.base + (self.states.len() - 1) as Revision
    }

    /// Appends successful writes, checking they fill the next revisions exactly and agree with
    /// the replayed state.
    pub fn extend(&mut self, mut done: Vec<Done>) {
        done.sort_by_key(Done::revision);
        for d in done {
            let revision = self.current() + 1;
            assert_eq!(
                d.revision(),
                revision,
                "successful writes must have gap-free revisions"
            );
            let mut state = self.states.last().unwrap().clone();
            let event = match d {
                Done::Put(kv) => {
                    let prev = state.get(&*kv.key).cloned();
                    let (create, version) = prev
                        .as_ref()
                        .map_or((revision, 1), |p| (p.create_revision, p.version + 1));
                    assert_eq!(
                        (kv.create_revision, kv.version),
                        (create, version),
                        "{kv:?}"
                    );
                    state.insert(kv.key.to_string(), kv.clone());
                    Event::Put { kv, prev }
                }
                Done::Delete {
                    key,
                    prev,
                    revision,
                } => {
                    assert_eq!(
                        state.remove(&key).as_ref(),
                        Some(&prev),
                        "delete's prev value"
                    );
                    Event::Delete {
                        key: key.into(),
                        revision,
                        prev,
                    }
                }
            };
            self.events.push(event);
            self.states.push(state);
        }
    }

    pub fn state_at(&self, revision: Revision) -> Vec<KeyValue> {
        self.states[(revision - self.base) as usize]
            .values()
            .cloned()
            .collect()
    }

    /// Whether some state of the history had exactly this key-value.
    pub fn ever_had(&self, kv: &KeyValue) -> bool {
        self.states.iter().any(|s| s.get(&*kv.key) == Some(kv))
    }

    pub fn suffix(&self, prefix: &str, after: Revision) -> Vec<Event> {
        self.events
            .iter()
            .filter(|e| e.revision() > after && e.key().starts_with(prefix))
            .cloned()
            .collect()
    }
}

pub async fn check_reads(store: &dyn Store, history: &History, compacted: Revision) {
    let current = store.current_revision().await.unwrap();
    assert_eq!(current, history.current());
    assert_eq!(store.compacted_revision().await.unwrap(), compacted);
    let latest = store.range(RangeRequest::default()).await.unwrap();
    assert_eq!(latest.kvs, history.state_at(current), "latest state");
    for rev in history.base..=current {
        let req = RangeRequest {
            revision: Some(rev),
            ..Default::default()
        };
        match store.range(req).await {
            Ok(resp) if rev >= compacted => {
                assert_eq!(resp.kvs, history.state_at(rev), "state at revision {rev}")
            }
            Err(StoreError::Compacted { .. }) if rev < compacted => {}
            other => panic!("range at {rev} (compacted {compacted}): {other:?}"),
        }
    }
    // A watch from the compaction point replays exactly the retained history.
    let mut watch = store.watch("", compacted).await.unwrap();
    assert_eq!(
        drain_to_progress(store, &mut watch).await,
        history.suffix("", compacted)
    );
}

pub async fn check_watchers(store: &dyn Store, history: &History, watchers: Vec<Watcher>) {
    for mut w in watchers {
        let seen = drain_to_progress(store, &mut w.stream).await;
        assert_eq!(
            seen,
            history.suffix(w.prefix, w.after),
            "watcher {:?} after {}",
            w.prefix,
            w.after
        );
    }
}

/// Runs both phases of one case against `store`, which must be empty and written by no one
/// else meanwhile. Returns the history and the compaction point, so a durable backend can
/// check that a reopened store still agrees (`check_reads`).
pub async fn run_history(
    store: &Arc<dyn Store>,
    phase1: Vec<Vec<Op>>,
    phase2: Vec<Vec<Op>>,
    cut: f64,
) -> (History, Revision) {
    let base = store.current_revision().await.unwrap();
    let initially_compacted = store.compacted_revision().await.unwrap();
    let mut history = History::new(base);

    let record = run_phase(store, phase1).await;
    history.extend(record.done);
    for kv in &record.conflict_values {
        assert!(
            history.ever_had(kv),
            "a conflict reported a value that never existed: {kv:?}"
        );
    }
    check_reads(&**store, &history, initially_compacted).await;
    check_watchers(&**store, &history, record.watchers).await;

    let compacted = base + ((history.current() - base) as f64 * cut) as Revision;
    store.compact(compacted).await.unwrap();
    let compacted = compacted.max(initially_compacted);
    let record = run_phase(store, phase2).await;
    history.extend(record.done);
    check_reads(&**store, &history, compacted).await;
    check_watchers(&**store, &history, record.watchers).await;
    (history, compacted)
}
