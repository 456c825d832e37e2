//! Embedded durable backend (see crate docs), on [`redb`].
//!
//! # On-disk layout
//!
//! One redb file, `store.redb`, in the store's directory, with two tables:
//! - `history`: revision → the write made at that revision (a put's key, value,
//!   `create_revision` and `version`, or a delete's key). Rows are only ever appended at the end
//!   of the revision order, which is the cheapest thing a copy-on-write B-tree can do: a commit
//!   rewrites little more than the rightmost path, and each value is written once.
//! - `meta`: the current revision (so that revisions are never reused, even when the newest
//!   writes were deletes whose rows compaction later removed), the compacted revision and the
//!   format version.
//!
//! Rows above the compacted revision are the event log; the rows at or below it are, for each
//! live key, the put that set its value as of the compaction point. Compaction deletes the rows
//! that became obsolete: tombstones, and puts superseded by a later write at or below the new
//! compaction point. The latest state, and each logged event's previous value, are rebuilt by
//! scanning the table in revision order at open; reads and watches are then served from memory
//! by the shared core, except the values of older events: the core keeps only the newest
//! [`EmbeddedOptions::history_memory_bytes`] of them and reads the others back from this table
//! when a watch replays from far back or a read asks for an old revision.
//!
//! # Durability and throughput: the committer
//!
//! Callers never touch redb. A write is sent to a single committer thread over a bounded queue
//! and the caller waits for the reply. The committer repeatedly:
//! 1. takes everything queued, up to [`EmbeddedOptions::max_batch`] requests;
//! 2. checks each write's precondition in queue order against the committed state plus the
//!    batch's own earlier writes, and gives the successful ones consecutive revisions;
//! 3. writes all of them, and the new current revision, in **one** redb write transaction and
//!    commits it with [`Durability::Immediate`] (the commit returns only after fsync);
//! 4. only then applies the batch to the in-memory state, which publishes it to watchers, and
//!    replies to every caller. A write whose precondition failed gets its error without a
//!    revision.
//!
//! Durability follows from the order of steps 3 and 4: nothing is visible to readers or
//! watchers, and nothing is acknowledged, before the transaction holding it is on disk, and redb
//! commits atomically, so a crash at any moment leaves either all or none of a batch. If a
//! commit fails, every write of the batch gets [`StoreError::Backend`], nothing is applied, and
//! the store refuses further writes (whether the failed commit reached the disk is unknown, so
//! continuing could reuse its revisions); reopening recovers whatever is on disk.
//!
//! Throughput follows from step 1: an fsync costs about the same for one write as for a
//! thousand, and while one batch is being committed the next one accumulates in the queue. The
//! number of fsyncs therefore adapts to the load: a lone writer pays one fsync per write, while
//! N concurrent writers share roughly one fsync per N writes. Having a single writer also means
//! preconditions are checked without locks against a state nothing else can change mid-batch.
//!
//! ## Gathering
//!
//! Taking only what is queued has one flaw with N writers that each wait for their previous
//! write: they settle into two groups that commit alternately (one group queues while the
//! other's commit runs), so batches hold N/2 writes, and as a commit of N/2 costs nearly as much
//! as one of N, throughput halves. So before committing, the committer expects back the writers
//! it just answered plus those that queued during its last commit. If fewer are queued, it waits
//! for them, but at most [`EmbeddedOptions::max_linger`] (5 ms) and at most four times the last
//! commit's duration; the first writer to make the queue long enough wakes it. A lone writer is
//! the only one expected, so it never waits; a writer that does not come back costs the others
//! at most the linger, once, since the next expectation is what actually arrived.
//!
//! The wait pays most when the machine is busy: writers then take longer to come back, and
//! every commit's fixed cost (the fsync, and the CPU around it) is time other work needs. In
//! `setpoint bench density` at 30,000 pods, waiting up to 4 commits instead of half of one cut
//! commits from about 33,000 to 9,500 and the server's CPU time by about 7 %.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};
use tokio::sync::oneshot;
use tracing::{debug, error, info, warn};

mod queue;

use self::queue::RequestQueue;
use crate::state::{
    delete_result, put_result, Core, HistoryReader, HistoryValues, HistoryView, WriteOp,
};
use crate::{
    Event, KeyValue, Precondition, RangeRequest, RangeResponse, Result, Revision, Store,
    StoreError, WatchStream, DEFAULT_MAX_VALUE_SIZE, DEFAULT_WATCH_BUFFER,
};

/// The redb page cache (see `EmbeddedStore::open`).
const REDB_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Name of the database file inside the store directory.
pub const DB_FILE_NAME: &str = "store.redb";

const HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("history");
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");
const META_FORMAT: &str = "format";
const META_CURRENT: &str = "current_revision";
const META_COMPACTED: &str = "compacted_revision";
const FORMAT_VERSION: i64 = 1;

/// The committer waits for expected writers at most this many times as long as its last
/// commit took ("Gathering" in the module docs).
const LINGER_PER_COMMIT: u32 = 4;

const ROW_PUT: u8 = 1;
const ROW_DELETE: u8 = 2;

/// Tuning for an [`EmbeddedStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbeddedOptions {
    /// Largest accepted value, in bytes.
    pub max_value_size: usize,
    /// Responses a watcher may have queued before it is dropped as lagging.
    pub watch_buffer: usize,
    /// Most write requests committed in one transaction (one fsync).
    pub max_batch: usize,
    /// Write requests that may wait for the committer before writers are made to wait to
    /// enqueue (backpressure).
    pub queue_depth: usize,
    /// Longest the committer waits for writers it expects back before committing a batch
    /// smaller than the recent number of concurrent writers ("Gathering" in the module docs). It
    /// is further capped at four times the duration of the previous commit. Zero disables
    /// waiting.
    pub max_linger: Duration,
    /// Bytes of values of recent history (older versions of objects, since the last compaction)
    /// kept in memory. Older ones are read back from disk by the rare reads that need them: a
    /// watch that starts further back, a read at an old revision. The latest state is always
    /// in memory, whatever this is.
    pub history_memory_bytes: usize,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            max_value_size: DEFAULT_MAX_VALUE_SIZE,
            watch_buffer: DEFAULT_WATCH_BUFFER,
            max_batch: 1024,
            queue_depth: 8192,
            max_linger: Duration::from_millis(5),
            history_memory_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Counters of the committer's work, for tests, benchmarks and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Durable write transactions committed for writes (each one fsync).
    pub commits: u64,
    /// Writes made durable by those commits.
    pub writes: u64,
}

#[derive(Default)]
struct StatCounters {
    commits: AtomicU64,
    writes: AtomicU64,
}

/// A request to the committer thread.
enum Request {
    Write {
        op: WriteOp,
        reply: oneshot::Sender<Result<Event>>,
    },
    Compact {
        revision: Revision,
        reply: oneshot::Sender<Result<()>>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

/// The durable [`Store`]: redb on disk, the shared core in memory, one committer thread.
///
/// Dropping the store stops the committer and waits for it to finish the batch in progress
/// (typically well under a millisecond) and close the file; in async code prefer
/// [`EmbeddedStore::close`], which waits without blocking a runtime thread.
pub struct EmbeddedStore {
    core: Arc<Core>,
    queue: Arc<RequestQueue>,
    closing: AtomicBool,
    committer: Mutex<Option<JoinHandle<()>>>,
    max_value_size: usize,
    dir: PathBuf,
    stats: Arc<StatCounters>,
}

fn backend(context: &str, e: impl Display) -> StoreError {
    StoreError::Backend(format!("{context}: {e}"))
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store in `dir`, loads its state into memory and starts
    /// the committer. This does blocking I/O proportional to the stored history; from async code
    /// call it in `spawn_blocking` if that matters.
    pub fn open(dir: &Path, options: EmbeddedOptions) -> Result<EmbeddedStore> {
        std::fs::create_dir_all(dir).map_err(|e| backend("creating store directory", e))?;
        let path = dir.join(DB_FILE_NAME);
        let db = Database::builder()
            // Reads are served from memory (the state is rebuilt at open), so redb's page
            // cache only helps appends and compaction; its default of 1 GiB would mostly hold
            // pages nobody reads again.
            .set_cache_size(REDB_CACHE_BYTES)
            .create(&path)
            .map_err(|e| backend("opening database", e))?;
        let db = Arc::new(db);
        init_tables(&db)?;
        let history = HistoryValues {
            reader: Arc::new(RedbHistory(db.clone())),
            memory_bytes: options.history_memory_bytes,
        };
        let core = Arc::new(load(&db, options.watch_buffer, history)?);
        info!(
            dir = %dir.display(),
            current = core.current_revision()?,
            compacted = core.compacted_revision()?,
            "opened embedded store"
        );
        let queue = Arc::new(RequestQueue::new(options.queue_depth));
        let stats = Arc::new(StatCounters::default());
        let committer = Committer {
            stats: stats.clone(),
            db: Some(db),
            core: core.clone(),
            queue: queue.clone(),
            max_batch: options.max_batch.max(1),
            max_linger: options.max_linger,
            last_commit: Duration::ZERO,
            queued_during_commit: 0,
            failed: None,
            encode_buf: Vec::new(),
        };
        let handle = std::thread::Builder::new()
            .name("setpoint-store-committer".to_owned())
            .spawn(move || committer.run())
            .map_err(|e| backend("starting committer thread", e))?;
        Ok(EmbeddedStore {
            core,
            queue,
            closing: AtomicBool::new(false),
            committer: Mutex::new(Some(handle)),
            max_value_size: options.max_value_size,
            dir: dir.to_owned(),
            stats,
        })
    }

    /// The directory the store lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many commits and committed writes this store has made since it was opened. Writes
    /// divided by commits is the average group-commit batch size.
    pub fn stats(&self) -> CommitStats {
        CommitStats {
            commits: self.stats.commits.load(Ordering::Relaxed),
            writes: self.stats.writes.load(Ordering::Relaxed),
        }
    }

    /// Stops the store: writes already queued are committed (and acknowledged), later calls
    /// fail with [`StoreError::Closed`], watch streams end, and the database file is closed when
    /// this returns, so the directory can be reopened at once. Idempotent.
    pub async fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        let (reply, done) = oneshot::channel();
        // Fails only if the committer is already stopping, which is what we want anyway; the
        // reply comes once the database file is closed.
        if self.queue.push(Request::Close { reply }).await.is_ok() {
            let _ = done.await;
        }
    }

    async fn submit(&self, op: WriteOp) -> Result<Event> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(StoreError::Closed);
        }
        let (reply, outcome) = oneshot::channel();
        self.queue.push(Request::Write { op, reply }).await?;
        // A dropped reply means the committer stopped before reaching this write, so it was
        // never committed.
        outcome.await.map_err(|_| StoreError::Closed)?
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        // Closing the queue makes the committer finish what is queued and exit; waiting for it
        // guarantees the file is closed when the store is gone.
        self.queue.close();
        if let Some(handle) = self.committer.lock().take() {
            if handle.join().is_err() {
                error!("store committer thread panicked");
            }
        }
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    async fn current_revision(&self) -> Result<Revision> {
        self.core.current_revision()
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        self.core.compacted_revision()
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        self.core.get(key)
    }

    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        self.core.range(&req)
    }

    async fn put(&self, key: &str, value: Bytes, precondition: Precondition) -> Result<KeyValue> {
        if value.len() > self.max_value_size {
            return Err(StoreError::TooLarge {
                size: value.len(),
                limit: self.max_value_size,
            });
        }
        self.submit(WriteOp::Put {
            key: key.to_owned(),
            value,
            precondition,
        })
        .await
        .map(put_result)
    }

    async fn delete(&self, key: &str, precondition: Precondition) -> Result<(KeyValue, Revision)> {
        self.submit(WriteOp::Delete {
            key: key.to_owned(),
            precondition,
        })
        .await
        .map(delete_result)
    }

    async fn watch(&self, prefix: &str, after_revision: Revision) -> Result<WatchStream> {
        self.core.watch(prefix, after_revision)
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(StoreError::Closed);
        }
        let (reply, outcome) = oneshot::channel();
        self.queue
            .push(Request::Compact { revision, reply })
            .await?;
        outcome.await.map_err(|_| StoreError::Closed)?
    }

    async fn close(&self) -> Result<()> {
        EmbeddedStore::close(self).await;
        Ok(())
    }
}

/// Creates the tables of a new database and checks the format of an existing one.
fn init_tables(db: &Database) -> Result<()> {
    let txn = db
        .begin_write()
        .map_err(|e| backend("initializing database", e))?;
    {
        txn.open_table(HISTORY)
            .map_err(|e| backend("opening history table", e))?;
        let mut meta = txn
            .open_table(META)
            .map_err(|e| backend("opening meta table", e))?;
        let format = meta
            .get(META_FORMAT)
            .map_err(|e| backend("reading format", e))?
            .map(|v| v.value());
        match format {
            None => {
                meta.insert(META_FORMAT, FORMAT_VERSION)
                    .map_err(|e| backend("writing format", e))?;
            }
            Some(FORMAT_VERSION) => {}
            Some(other) => {
                return Err(StoreError::Backend(format!(
                    "unsupported store format {other} (expected {FORMAT_VERSION})"
                )));
            }
        }
    }
    txn.commit()
        .map_err(|e| backend("initializing database", e))
}

/// Rebuilds the in-memory state: the rows at or below the compaction point are the base state,
/// and the rows above it are replayed into the core, in order, as the events they were (each
/// with the value it replaced). The core drops older values to fit `history` as it goes, so
/// opening a store never holds its whole history in memory.
fn load(db: &Database, watch_buffer: usize, history: HistoryValues) -> Result<Core> {
    let corrupt = |what: String| StoreError::Backend(format!("corrupt store: {what}"));
    let txn = db.begin_read().map_err(|e| backend("loading store", e))?;
    let meta = txn
        .open_table(META)
        .map_err(|e| backend("opening meta table", e))?;
    let read_meta = |name: &str| -> Result<Revision> {
        Ok(meta
            .get(name)
            .map_err(|e| backend("reading meta", e))?
            .map_or(0, |v| v.value()))
    };
    let current = read_meta(META_CURRENT)?;
    let compacted = read_meta(META_COMPACTED)?;
    if compacted > current || compacted < 0 {
        return Err(corrupt(format!(
            "compacted revision {compacted} vs current {current}"
        )));
    }

    let history_table = txn
        .open_table(HISTORY)
        .map_err(|e| backend("opening history table", e))?;
    let mut base = BTreeMap::new();
    let mut history = Some(history);
    // Created at the first row above the compaction point, once the base state is complete.
    let mut core: Option<Core> = None;
    let mut last_logged = compacted;
    for row in history_table
        .iter()
        .map_err(|e| backend("reading history", e))?
    {
        let (rev, data) = row.map_err(|e| backend("reading history", e))?;
        let revision = Revision::try_from(rev.value())
            .map_err(|_| corrupt(format!("revision {} out of range", rev.value())))?;
        let write = decode_row(revision, data.value())
            .ok_or_else(|| corrupt(format!("undecodable row at revision {revision}")))?;
        if revision <= compacted {
            match write {
                RowWrite::Put(kv) => {
                    base.insert(kv.key.clone(), kv);
                }
                // Compaction removes tombstones; tolerate one anyway, it means "absent".
                RowWrite::Delete(key) => {
                    base.remove(key.as_str());
                }
            }
            continue;
        }
        // The log must be dense: revision compacted+1, compacted+2, ... with nothing missing.
        if revision != last_logged + 1 {
            return Err(corrupt(format!(
                "expected revision {}, found {revision}",
                last_logged + 1
            )));
        }
        let core = core.get_or_insert_with(|| {
            let base = std::mem::take(&mut base);
            Core::from_parts(base, compacted, watch_buffer, history.take())
        });
        let event = match write {
            RowWrite::Put(kv) => {
                let prev = core.get(&kv.key)?;
                // The versions of one key share its name, as they do when written live.
                let kv = match &prev {
                    Some(p) => KeyValue {
                        key: p.key.clone(),
                        ..kv
                    },
                    None => kv,
                };
                Event::Put { prev, kv }
            }
            RowWrite::Delete(key) => {
                let prev = core.get(&key)?.ok_or_else(|| {
                    corrupt(format!(
                        "delete of absent key {key:?} at revision {revision}"
                    ))
                })?;
                Event::Delete {
                    key: prev.key.clone(),
                    revision,
                    prev,
                }
            }
        };
        // One event at a time: the next row's previous value must see this one.
        core.apply(vec![event]);
        last_logged = revision;
    }
    if last_logged != current {
        return Err(corrupt(format!(
            "history ends at {last_logged} but current is {current}"
        )));
    }
    Ok(core.unwrap_or_else(|| Core::from_parts(base, compacted, watch_buffer, history.take())))
}

/// Reads values of older events back from the history table.
struct RedbHistory(Arc<Database>);

impl HistoryReader for RedbHistory {
    fn view(&self) -> Result<Box<dyn HistoryView + '_>> {
        let txn = self
            .0
            .begin_read()
            .map_err(|e| backend("reading history", e))?;
        let table = txn
            .open_table(HISTORY)
            .map_err(|e| backend("opening history table", e))?;
        Ok(Box::new(RedbHistoryView(table)))
    }
}

struct RedbHistoryView(redb::ReadOnlyTable<u64, &'static [u8]>);

impl HistoryView for RedbHistoryView {
    fn value(&self, mod_revision: Revision) -> Result<Bytes> {
        let corrupt = || {
            StoreError::Backend(format!(
                "corrupt store: no put at revision {mod_revision} in history"
            ))
        };
        let row = self
            .0
            .get(mod_revision as u64)
            .map_err(|e| backend("reading history", e))?
            .ok_or_else(corrupt)?;
        match decode_row(mod_revision, row.value()) {
            Some(RowWrite::Put(kv)) => Ok(kv.value),
            _ => Err(corrupt()),
        }
    }
}

/// What a history row records.
#[derive(Debug, PartialEq, Eq)]
pub enum RowWrite {
    /// A put: the key's value after it (its `mod_revision` is the row's revision).
    Put(KeyValue),
    /// A delete of this key.
    Delete(String),
}

/// The history row the store writes for `event` (the row's key is the event's revision).
/// Public so that the row format can be checked from outside (the fuzz targets): a row reads
/// back, with [`read_history_row`], as what was written.
pub fn history_row(event: &Event) -> Vec<u8> {
    let mut buf = Vec::new();
    encode_row(event, &mut buf);
    buf
}

/// What the history row `data`, stored at `revision`, records; `None` when it is not a row
/// this store writes.
pub fn read_history_row(revision: Revision, data: &[u8]) -> Option<RowWrite> {
    decode_row(revision, data)
}

/// Row encoding. Put: `[1][create_revision i64 BE][version i64 BE][key length u32 BE][key]
/// [value]`. Delete: `[2][key]`. The mod revision is the row's key.
fn encode_row(event: &Event, buf: &mut Vec<u8>) {
    buf.clear();
    match event {
        Event::Put { kv, .. } => {
            buf.reserve(21 + kv.key.len() + kv.value.len());
            buf.push(ROW_PUT);
            buf.extend_from_slice(&kv.create_revision.to_be_bytes());
            buf.extend_from_slice(&kv.version.to_be_bytes());
            // Keys are far below 4 GiB; values are bounded by `max_value_size` well below that.
            buf.extend_from_slice(&(kv.key.len() as u32).to_be_bytes());
            buf.extend_from_slice(kv.key.as_bytes());
            buf.extend_from_slice(&kv.value);
        }
        Event::Delete { key, .. } => {
            buf.push(ROW_DELETE);
            buf.extend_from_slice(key.as_bytes());
        }
    }
}

fn decode_row(revision: Revision, data: &[u8]) -> Option<RowWrite> {
    let (&tag, rest) = data.split_first()?;
    match tag {
        ROW_PUT => {
            let create_revision = i64::from_be_bytes(rest.get(0..8)?.try_into().ok()?);
            let version = i64::from_be_bytes(rest.get(8..16)?.try_into().ok()?);
            let key_len = u32::from_be_bytes(rest.get(16..20)?.try_into().ok()?) as usize;
            let key = Arc::from(std::str::from_utf8(rest.get(20..20 + key_len)?).ok()?);
            let value = Bytes::copy_from_slice(&rest[20 + key_len..]);
            Some(RowWrite::Put(KeyValue {
                key,
                value,
                create_revision,
                mod_revision: revision,
                version,
            }))
        }
        ROW_DELETE => Some(RowWrite::Delete(std::str::from_utf8(rest).ok()?.to_owned())),
        _ => None,
    }
}

/// The single writer of the database. See the module docs.
struct Committer {
    /// Dropped before a `Close` request is answered; the core drops its reference when it is
    /// closed just before, so that closes the file.
    db: Option<Arc<Database>>,
    core: Arc<Core>,
    queue: Arc<RequestQueue>,
    max_batch: usize,
    max_linger: Duration,
    /// How long the previous write commit took.
    last_commit: Duration,
    /// Requests that arrived while the previous batch was being committed.
    queued_during_commit: usize,
    /// Set when a commit failed: its outcome on disk is unknown, so no later write may proceed.
    failed: Option<String>,
    encode_buf: Vec<u8>,
    stats: Arc<StatCounters>,
}

type PendingWrite = (WriteOp, oneshot::Sender<Result<Event>>);

impl Committer {
    fn run(mut self) {
        // Whatever way this thread ends (including a panic), readers and watchers must learn
        // that the store is closed, and queued writers must get an answer, rather than wait on
        // a committer that is gone.
        let _guard = StopGuard {
            core: self.core.clone(),
            queue: self.queue.clone(),
        };
        let mut requests = Vec::with_capacity(self.max_batch);
        let mut writes: Vec<PendingWrite> = Vec::with_capacity(self.max_batch);
        // Writers answered by the previous batch.
        let mut released = 0;
        loop {
            requests.clear();
            // Under steady load, the writers just answered are about to write again, and those
            // that queued during the last commit are waiting already: together they are the
            // batch worth waiting briefly for (see "Gathering" in the module docs).
            let expected = released + self.queued_during_commit;
            let linger = self.max_linger.min(self.last_commit * LINGER_PER_COMMIT);
            if !self
                .queue
                .next_batch(&mut requests, self.max_batch, expected, linger)
            {
                debug!("store handle dropped; committer exiting");
                break;
            }
            self.queued_during_commit = 0;
            released = requests
                .iter()
                .filter(|r| matches!(r, Request::Write { .. }))
                .count();
            let mut close = None;
            for request in requests.drain(..) {
                match request {
                    Request::Write { op, reply } => writes.push((op, reply)),
                    Request::Compact { revision, reply } => {
                        // Keep queue order: writes queued before the compaction commit first.
                        self.commit_writes(&mut writes);
                        let _ = reply.send(self.compact(revision));
                    }
                    Request::Close { reply } => {
                        close = Some(reply);
                        // Requests queued after the close are dropped, so they see `Closed`.
                        break;
                    }
                }
            }
            self.commit_writes(&mut writes);
            if let Some(reply) = close {
                self.shutdown();
                let _ = reply.send(());
                return;
            }
        }
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.core.close();
        self.queue.close_and_discard();
        self.db = None;
        info!(
            commits = self.stats.commits.load(Ordering::Relaxed),
            writes = self.stats.writes.load(Ordering::Relaxed),
            "embedded store closed"
        );
    }

    /// Commits one batch of writes (see the module docs) and answers every caller.
    fn commit_writes(&mut self, writes: &mut Vec<PendingWrite>) {
        if writes.is_empty() {
            return;
        }
        if let Some(reason) = &self.failed {
            for (_, reply) in writes.drain(..) {
                let _ = reply.send(Err(StoreError::Backend(reason.clone())));
            }
            return;
        }
        let outcomes = match self.core.prepare(writes.iter().map(|(op, _)| op)) {
            Ok(outcomes) => outcomes,
            Err(e) => {
                for (_, reply) in writes.drain(..) {
                    let _ = reply.send(Err(e.clone()));
                }
                return;
            }
        };
        let events: Vec<Event> = outcomes
            .iter()
            .filter_map(|o| o.as_ref().ok())
            .cloned()
            .collect();
        if !events.is_empty() {
            let started = Instant::now();
            let persisted = self.persist(&events);
            self.last_commit = started.elapsed();
            self.queued_during_commit = self.queue.len();
            if let Err(e) = persisted {
                warn!(error = %e, writes = events.len(), "store commit failed");
                for ((_, reply), outcome) in writes.drain(..).zip(outcomes) {
                    let _ = reply.send(match outcome {
                        Ok(_) => Err(e.clone()),
                        Err(precondition_failure) => Err(precondition_failure),
                    });
                }
                return;
            }
            debug!(
                batch = writes.len(),
                committed = events.len(),
                "committed batch"
            );
            self.stats.commits.fetch_add(1, Ordering::Relaxed);
            self.stats
                .writes
                .fetch_add(events.len() as u64, Ordering::Relaxed);
            // Durable now: make it visible (and publish to watchers) before acknowledging, so a
            // caller can read its own write as soon as it has the reply.
            self.core.apply(events);
        }
        for ((_, reply), outcome) in writes.drain(..).zip(outcomes) {
            let _ = reply.send(outcome);
        }
    }

    fn begin(&self) -> Result<WriteTransaction> {
        let db = self.db.as_ref().ok_or(StoreError::Closed)?;
        let mut txn = db
            .begin_write()
            .map_err(|e| backend("beginning transaction", e))?;
        // The default, stated because acknowledging writes depends on it.
        txn.set_durability(Durability::Immediate)
            .map_err(|e| backend("setting durability", e))?;
        Ok(txn)
    }

    /// Writes `events` and the new current revision in one durable transaction.
    fn persist(&mut self, events: &[Event]) -> Result<()> {
        let txn = self.begin()?;
        {
            let mut history = txn
                .open_table(HISTORY)
                .map_err(|e| backend("opening history table", e))?;
            for event in events {
                encode_row(event, &mut self.encode_buf);
                history
                    .insert(event.revision() as u64, self.encode_buf.as_slice())
                    .map_err(|e| backend("writing history", e))?;
            }
            let mut meta = txn
                .open_table(META)
                .map_err(|e| backend("opening meta table", e))?;
            let last = events.last().map(Event::revision).unwrap_or_default();
            meta.insert(META_CURRENT, last)
                .map_err(|e| backend("writing meta", e))?;
        }
        self.commit(txn)
    }

    fn commit(&mut self, txn: WriteTransaction) -> Result<()> {
        txn.commit().map_err(|e| {
            let reason = format!("commit failed, store must be reopened: {e}");
            error!(error = %e, "store commit failed; refusing further writes");
            self.failed = Some(reason.clone());
            StoreError::Backend(reason)
        })
    }

    /// Compacts in memory, then durably: drops the rows only history needed, which are every
    /// tombstone at or below `revision` and every put superseded by a write at or below it.
    /// The core moves its compaction point first so that no read still relies on those rows when
    /// they go (see the core's module docs). If writing them fails, the store refuses writes
    /// (the rows left behind are no longer in the core's plan) and a reopen finds the older
    /// compaction point, which is harmless.
    fn compact(&mut self, revision: Revision) -> Result<()> {
        if let Some(reason) = &self.failed {
            return Err(StoreError::Backend(reason.clone()));
        }
        let Some(obsolete) = self.core.compact(revision)? else {
            return Ok(());
        };
        self.remove_rows(revision, obsolete).inspect_err(|e| {
            if self.failed.is_none() {
                error!(error = %e, "store compaction failed; refusing further writes");
                self.failed = Some(format!("compaction failed, store must be reopened: {e}"));
            }
        })
    }

    fn remove_rows(&mut self, revision: Revision, obsolete: Vec<Revision>) -> Result<()> {
        let txn = self.begin()?;
        {
            let mut history = txn
                .open_table(HISTORY)
                .map_err(|e| backend("opening history table", e))?;
            for row in obsolete {
                history
                    .remove(row as u64)
                    .map_err(|e| backend("compacting history", e))?;
            }
            let mut meta = txn
                .open_table(META)
                .map_err(|e| backend("opening meta table", e))?;
            meta.insert(META_COMPACTED, revision)
                .map_err(|e| backend("writing meta", e))?;
        }
        self.commit(txn)
    }
}

/// Stops the store when the committer thread ends, however it ends.
struct StopGuard {
    core: Arc<Core>,
    queue: Arc<RequestQueue>,
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        self.core.close();
        self.queue.close_and_discard();
    }
}
