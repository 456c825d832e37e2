//! The store's encodings and ordering (`setpoint-store`): the LZ4 framing values are stored
//! in, the embedded store's history rows (key, revisions, value), and the memory store's key
//! order and revisions against a model.
//!
//! The first byte picks the check:
//! - 0: the rest is a value: compressed, it reads back as itself and declares its length;
//!   arbitrary bytes read as a value never panic.
//! - 1: the rest is a history row: it never panics to read, and a row that reads re-encodes to
//!   the very same bytes; a put or delete built from the input reads back as itself.
//! - 2: the rest is a sequence of store operations run on a `MemoryStore` and on a model
//!   (a `BTreeMap` per revision): every answer agrees with the model, revisions strictly
//!   increase, and ranges come in key order, also at past revisions and across pages.
#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use setpoint_store::embedded::{history_row, read_history_row, RowWrite};
use setpoint_store::memory::MemoryStore;
use setpoint_store::{compression, Event, KeyValue, Precondition, RangeRequest, Store, StoreError};

/// Reads the input a piece at a time; past the end everything is zero/empty.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn i64(&mut self) -> i64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.byte();
        }
        i64::from_le_bytes(b)
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    /// A short key over a few characters, some of them multi-byte, so that keys share
    /// prefixes and byte order is exercised.
    fn key(&mut self) -> String {
        const CHARS: [char; 8] = ['a', 'b', '/', '-', '0', 'z', '\u{e9}', '\u{10348}'];
        let n = usize::from(self.byte() % 5);
        let mut k = String::from("/r/");
        for _ in 0..n {
            k.push(CHARS[usize::from(self.byte() % 8)]);
        }
        k
    }
}

fn values(data: &[u8]) {
    let stored = compression::compress(data);
    assert_eq!(compression::plain_len(&stored), data.len());
    assert_eq!(
        compression::plain(&stored)
            .expect("a compressed value reads")
            .as_ref(),
        data
    );
    let seen = compression::with_plain(&stored, <[u8]>::to_vec).expect("reads");
    assert_eq!(seen, data);
    if !compression::is_compressed(&stored) {
        assert_eq!(stored.as_ref(), data, "a value left plain is the value");
    }
    // Anything read as a stored value: an error or some bytes, never a panic. (A header may
    // declare up to 256 MiB, which is allocated before the rest fails to decompress: fine for
    // values the server wrote, but it would spend the fuzzing time on zeroing memory.)
    let declared = data.get(1..5).map_or(0, |b| {
        u32::from_le_bytes(b.try_into().expect("four bytes")) as usize
    });
    if declared > 1 << 20 {
        return;
    }
    if let Ok(plain) = compression::plain(data) {
        if !compression::is_compressed(data) {
            assert_eq!(plain.as_ref(), data);
        }
    }
}

fn rows(data: &[u8]) {
    let mut input = Input(data);
    let revision = input.i64();
    let rest = input.0;
    if let Some(row) = read_history_row(revision, rest) {
        let event = match row {
            RowWrite::Put(kv) => {
                assert_eq!(kv.mod_revision, revision);
                Event::Put { kv, prev: None }
            }
            RowWrite::Delete(key) => Event::Delete {
                key: Arc::from(key),
                revision,
                prev: KeyValue {
                    key: Arc::from(""),
                    value: Bytes::new(),
                    create_revision: 0,
                    mod_revision: 0,
                    version: 0,
                },
            },
        };
        assert_eq!(history_row(&event), rest, "a row re-encodes to its bytes");
    }
    // A put built from the input reads back as itself.
    let mut input = Input(rest);
    let create_revision = input.i64();
    let version = input.i64();
    let key_len = usize::from(input.byte());
    let key = String::from_utf8_lossy(input.bytes(key_len)).into_owned();
    let value = Bytes::copy_from_slice(input.0);
    let kv = KeyValue {
        key: Arc::from(key.as_str()),
        value,
        create_revision,
        mod_revision: revision,
        version,
    };
    let put = Event::Put {
        kv: kv.clone(),
        prev: None,
    };
    assert_eq!(
        read_history_row(revision, &history_row(&put)),
        Some(RowWrite::Put(kv.clone()))
    );
    let delete = Event::Delete {
        key: Arc::from(key.as_str()),
        revision,
        prev: kv,
    };
    assert_eq!(
        read_history_row(revision, &history_row(&delete)),
        Some(RowWrite::Delete(key))
    );
}

/// The model: the latest state after each revision (index = revision), and the compaction
/// point.
struct Model {
    states: Vec<BTreeMap<String, KeyValue>>,
    compacted: i64,
}

impl Model {
    fn latest(&self) -> &BTreeMap<String, KeyValue> {
        self.states.last().expect("revision 0 is there")
    }
    fn revision(&self) -> i64 {
        self.states.len() as i64 - 1
    }
    fn commit(&mut self, state: BTreeMap<String, KeyValue>) -> i64 {
        self.states.push(state);
        self.revision()
    }
}

async fn operations(data: &[u8]) {
    let store = MemoryStore::new();
    let mut model = Model {
        states: vec![BTreeMap::new()],
        compacted: 0,
    };
    let mut input = Input(data);
    // Bounded, so that one input stays quick.
    for _ in 0..64 {
        if input.0.is_empty() {
            break;
        }
        let op = input.byte() % 6;
        let key = input.key();
        match op {
            0..=2 => {
                let len = usize::from(input.byte() % 8);
                let value = Bytes::copy_from_slice(input.bytes(len));
                let current = model.latest().get(&key).cloned();
                let precondition = match op {
                    0 => Precondition::None,
                    1 => Precondition::NotExists,
                    _ => Precondition::ModRevision(match input.byte() % 3 {
                        0 => current.as_ref().map_or(0, |kv| kv.mod_revision),
                        1 => model.revision(),
                        _ => i64::from(input.byte()),
                    }),
                };
                let allowed = match precondition {
                    Precondition::None => true,
                    Precondition::NotExists => current.is_none(),
                    Precondition::ModRevision(r) => {
                        current.as_ref().is_some_and(|kv| kv.mod_revision == r)
                    }
                };
                let got = store.put(&key, value.clone(), precondition).await;
                if !allowed {
                    match got {
                        Err(StoreError::AlreadyExists { .. } | StoreError::Conflict { .. }) => {}
                        other => panic!("{precondition:?} on {key:?} ({current:?}): {other:?}"),
                    }
                    continue;
                }
                let kv = got.unwrap_or_else(|e| panic!("put {key:?} {precondition:?}: {e}"));
                let mut next = model.latest().clone();
                let revision = model.revision() + 1;
                let expected = KeyValue {
                    key: Arc::from(key.as_str()),
                    value,
                    create_revision: current.as_ref().map_or(revision, |c| c.create_revision),
                    mod_revision: revision,
                    version: current.as_ref().map_or(1, |c| c.version + 1),
                };
                assert_eq!(kv, expected);
                next.insert(key, expected);
                model.commit(next);
            }
            3 => {
                let current = model.latest().get(&key).cloned();
                let got = store.delete(&key, Precondition::None).await;
                match (current, got) {
                    (None, Err(StoreError::NotFound { .. })) => {}
                    (Some(c), Ok((kv, revision))) => {
                        assert_eq!(kv, c);
                        let mut next = model.latest().clone();
                        next.remove(&key);
                        assert_eq!(revision, model.commit(next));
                    }
                    (c, g) => panic!("delete {key:?} ({c:?}): {g:?}"),
                }
            }
            4 => {
                let limit = match input.byte() % 4 {
                    0 => None,
                    n => Some(usize::from(n)),
                };
                let at = match input.byte() % 3 {
                    0 => None,
                    _ => Some(i64::from(input.byte()) % (model.revision() + 2)),
                };
                range(&store, &model, &key, at, limit).await;
            }
            _ => {
                let to = i64::from(input.byte()) % (model.revision() + 1);
                if to > model.compacted {
                    store
                        .compact(to)
                        .await
                        .expect("compacting to a past revision");
                    model.compacted = to;
                }
            }
        }
        assert_eq!(
            store.current_revision().await.expect("a revision"),
            model.revision()
        );
    }
}

/// Pages through `prefix` at revision `at` (latest when `None`) and compares with the model.
async fn range(
    store: &MemoryStore,
    model: &Model,
    prefix: &str,
    at: Option<i64>,
    limit: Option<usize>,
) {
    let rev = at.unwrap_or(model.revision());
    let mut req = RangeRequest {
        prefix: prefix.to_string(),
        start_after: None,
        revision: at,
        limit,
    };
    let result = store.range(req.clone()).await;
    if rev > model.revision() {
        assert!(
            matches!(result, Err(StoreError::FutureRevision { .. })),
            "{result:?}"
        );
        return;
    }
    if at.is_some() && rev < model.compacted {
        assert!(
            matches!(result, Err(StoreError::Compacted { .. })),
            "{result:?}"
        );
        return;
    }
    let want: Vec<&KeyValue> = model.states[rev as usize]
        .range(prefix.to_string()..)
        .take_while(|(k, _)| k.starts_with(prefix))
        .map(|(_, kv)| kv)
        .collect();
    let mut got = Vec::new();
    let mut page = result.unwrap_or_else(|e| panic!("range {req:?}: {e}"));
    loop {
        assert_eq!(page.revision, rev, "{req:?}");
        if let Some(l) = limit {
            assert!(page.kvs.len() <= l);
        }
        assert_eq!(
            page.count,
            want.len() - got.len(),
            "count after {:?}",
            req.start_after
        );
        got.extend(page.kvs.iter().cloned());
        if !page.more {
            break;
        }
        assert!(!page.kvs.is_empty(), "more, but an empty page");
        req.start_after = got.last().map(|kv| kv.key.to_string());
        req.revision = Some(rev);
        page = store.range(req.clone()).await.expect("the next page");
    }
    let want: Vec<KeyValue> = want.into_iter().cloned().collect();
    assert_eq!(got, want, "range {prefix:?} at {rev}");
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => values(rest),
        1 => rows(rest),
        _ => {
            static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
            RUNTIME
                .get_or_init(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .build()
                        .expect("a runtime")
                })
                .block_on(operations(rest))
        }
    }
});
