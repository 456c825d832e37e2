//! The revisioned key-value store under Setpoint's API server.
//!
//! The model is etcd v3's, so that an etcd backend is a thin adapter:
//! - one global, monotonically increasing [`Revision`]; every successful write gets the next one;
//! - every key carries `create_revision`, `mod_revision` and `version`;
//! - writes are single-key transactions guarded by a [`Precondition`]
//!   ("create if absent", "update if `mod_revision == r`");
//! - [`Store::watch`] delivers every change after a revision, in order and without gaps,
//!   or fails with [`StoreError::Compacted`] when that history has been compacted away;
//! - [`Store::range`] reads the latest state or the state at an older revision, with a limit
//!   so that callers can page through large prefixes.
//!
//! Backends: [`memory::MemoryStore`] (tests), [`embedded::EmbeddedStore`] (durable, default)
//! and [`etcd::EtcdStore`] (an etcd cluster, shared by several API servers).
//! A shared conformance suite in [`conformance`] runs against every backend.
//! [`migrate`] copies a cluster from one store to another. [`compression`] is a framing for
//! values kept compressed, which the API server uses for objects.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;

mod chunked;
pub mod compression;
pub mod conformance;
pub mod embedded;
pub mod etcd;
pub mod memory;
pub mod migrate;
mod state;

/// The key API servers sharing a store use to agree on who compacts (`ApiServer`'s compaction
/// loop). Under `/registry/` but outside every resource's prefix, so no list or watch of a
/// resource ever shows it; [`migrate`] never exports or imports it (each store keeps its own).
pub const COMPACTION_GUARD_KEY: &str = "/registry/_compact";

/// Default largest value a backend accepts ([`StoreError::TooLarge`] beyond it): 8 MiB.
pub const DEFAULT_MAX_VALUE_SIZE: usize = 8 * 1024 * 1024;

/// Default number of responses a watcher may have queued before it is dropped with
/// [`StoreError::WatcherLagged`].
pub const DEFAULT_WATCH_BUFFER: usize = 4096;

/// A store revision. `resourceVersion` in the Kubernetes API is this number as a decimal string.
pub type Revision = i64;

/// One key and its latest (or historical) value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// Shared (`Arc`): the latest value and every logged version of a key hold one copy.
    pub key: Arc<str>,
    /// The stored bytes, exactly as written (the store does not interpret them).
    pub value: Bytes,
    /// Revision of the write that created this incarnation of the key.
    pub create_revision: Revision,
    /// Revision of the last write to the key.
    pub mod_revision: Revision,
    /// Number of writes since creation (1 after create), as in etcd.
    pub version: i64,
}

/// A change to one key, as delivered to watchers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A create or update. `prev` is the value before the write (None for a create).
    Put {
        /// The key's value after the write; its `mod_revision` is the event's revision.
        kv: KeyValue,
        /// The key's value before the write; `None` for a create.
        prev: Option<KeyValue>,
    },
    /// A delete at `revision`; `prev` is the last value the key had.
    Delete {
        /// The deleted key.
        key: Arc<str>,
        /// The revision of the delete itself (newer than `prev.mod_revision`).
        revision: Revision,
        /// The key's last value before the delete.
        prev: KeyValue,
    },
}

impl Event {
    /// The revision at which the change was committed.
    pub fn revision(&self) -> Revision {
        match self {
            Event::Put { kv, .. } => kv.mod_revision,
            Event::Delete { revision, .. } => *revision,
        }
    }

    /// The key that changed.
    pub fn key(&self) -> &str {
        match self {
            Event::Put { kv, .. } => &kv.key,
            Event::Delete { key, .. } => key,
        }
    }
}

/// The condition a write is guarded by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precondition {
    /// Unconditional.
    None,
    /// The key must not exist (create).
    NotExists,
    /// The key must exist with exactly this `mod_revision` (compare-and-swap).
    ModRevision(Revision),
}

/// A read of the keys that start with `prefix`, in key order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeRequest {
    /// Only keys starting with this prefix.
    pub prefix: String,
    /// Continue after this key (exclusive), for pagination.
    pub start_after: Option<String>,
    /// Read the state as of this revision; `None` reads the latest.
    pub revision: Option<Revision>,
    /// At most this many keys; `None` is unlimited.
    pub limit: Option<usize>,
}

/// The answer to a [`RangeRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeResponse {
    /// The matching keys' values, in key order, at most `limit` of them.
    pub kvs: Vec<KeyValue>,
    /// More keys remain after the last one returned.
    pub more: bool,
    /// How many keys matched in total after `start_after` (including those returned).
    pub count: usize,
    /// The revision the read was served at (the current revision for latest reads).
    pub revision: Revision,
}

/// What a watch stream yields: a batch of events in revision order, and the revision up to
/// which this watcher has been told everything (a response with no events is a progress
/// notification).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchResponse {
    /// The changes, in revision order; empty for a progress notification.
    pub events: Vec<Event>,
    /// The revision through which this watcher has now seen every change under its prefix.
    pub revision: Revision,
}

/// Errors a store operation can return.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// `Precondition::NotExists` and the key exists.
    #[error("key {key:?} already exists")]
    AlreadyExists {
        /// The key that exists.
        key: String,
    },
    /// `Precondition::ModRevision` did not hold; `current` is the key's current value, if any.
    #[error("precondition failed for key {key:?}")]
    Conflict {
        /// The key written or deleted.
        key: String,
        /// The key's current value; `None` when the key does not exist.
        current: Option<Box<KeyValue>>,
    },
    /// Delete of a key that does not exist.
    #[error("key {key:?} not found")]
    NotFound {
        /// The missing key.
        key: String,
    },
    /// The requested revision is older than the compaction point.
    #[error("revision {requested} has been compacted (compacted through {compacted})")]
    Compacted {
        /// The revision asked for.
        requested: Revision,
        /// The compaction point: history at and before it is gone.
        compacted: Revision,
    },
    /// The requested revision is newer than the store's current revision.
    #[error("revision {requested} is in the future (current {current})")]
    FutureRevision {
        /// The revision asked for.
        requested: Revision,
        /// The store's latest committed revision when it answered.
        current: Revision,
    },
    /// The value exceeds the backend's size limit.
    #[error("value of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The value's size in bytes.
        size: usize,
        /// The largest value the backend accepts, in bytes.
        limit: usize,
    },
    /// A watcher fell too far behind and was dropped; it must resume from its last revision.
    #[error("watcher fell behind and was dropped")]
    WatcherLagged,
    /// The store is shut down.
    #[error("store is closed")]
    Closed,
    /// An I/O or engine failure. The write it refers to was not acknowledged.
    #[error("storage failure: {0}")]
    Backend(String),
}

/// Result alias for store operations.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The revisioned store every backend implements.
///
/// Writes are acknowledged only once durable (for durable backends). Revisions are assigned in
/// commit order; a watcher sees events in exactly that order.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The latest committed revision (0 for an empty, never-written store).
    async fn current_revision(&self) -> Result<Revision>;

    /// The revision through which history has been compacted (watches must start after it).
    async fn compacted_revision(&self) -> Result<Revision>;

    /// The latest value of `key`.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// Keys under a prefix, latest or at a past revision, with a limit.
    async fn range(&self, req: RangeRequest) -> Result<RangeResponse>;

    /// Writes `value` to `key` if `precondition` holds; returns the new key-value.
    async fn put(&self, key: &str, value: Bytes, precondition: Precondition) -> Result<KeyValue>;

    /// Deletes `key` if `precondition` holds (`NotExists` is not meaningful here and is an
    /// error); returns the deleted key-value and the deletion revision.
    async fn delete(&self, key: &str, precondition: Precondition) -> Result<(KeyValue, Revision)>;

    /// Every change to keys under `prefix` with a revision strictly greater than
    /// `after_revision`, in order, then live changes. Fails with [`StoreError::Compacted`] if
    /// `after_revision` is older than the compaction point.
    async fn watch(&self, prefix: &str, after_revision: Revision) -> Result<WatchStream>;

    /// Discards history at and before `revision`. Latest values are kept.
    async fn compact(&self, revision: Revision) -> Result<()>;

    /// Stops accepting writes, waits for acknowledged ones to be durable and releases the
    /// backend (files, connections). Later calls fail with [`StoreError::Closed`].
    async fn close(&self) -> Result<()> {
        Ok(())
    }
}

/// A stream of [`WatchResponse`]s. It ends (yields `None`) when the store closes; an error
/// item (for example [`StoreError::WatcherLagged`]) is the last item.
pub struct WatchStream {
    inner: Pin<Box<dyn Stream<Item = Result<WatchResponse>> + Send>>,
    progress: Option<Box<dyn Fn() + Send + Sync>>,
}

impl WatchStream {
    /// Wraps a backend's stream. `progress` asks the backend to send a progress notification
    /// (a response with no events carrying the current revision) once the watcher has caught up.
    pub fn new(
        inner: Pin<Box<dyn Stream<Item = Result<WatchResponse>> + Send>>,
        progress: Option<Box<dyn Fn() + Send + Sync>>,
    ) -> Self {
        WatchStream { inner, progress }
    }

    /// Asks for a progress notification (see [`WatchResponse`]).
    pub fn request_progress(&self) {
        if let Some(p) = &self.progress {
            p()
        }
    }
}

impl Stream for WatchStream {
    type Item = Result<WatchResponse>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}
