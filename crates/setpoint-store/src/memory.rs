//! In-memory backend (see crate docs).
//!
//! Every operation runs under the shared core's lock, so writes are linearizable and each write
//! is its own commit (one revision, one watch response). Nothing survives the process; use it in
//! tests and as the reference the conformance suite is checked against.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::state::{delete_result, put_result, Core, WriteOp};
use crate::{
    KeyValue, Precondition, RangeRequest, RangeResponse, Result, Revision, Store, StoreError,
    WatchStream, DEFAULT_MAX_VALUE_SIZE, DEFAULT_WATCH_BUFFER,
};

/// Tuning for a [`MemoryStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Largest accepted value, in bytes.
    pub max_value_size: usize,
    /// Responses a watcher may have queued before it is dropped as lagging.
    pub watch_buffer: usize,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions {
            max_value_size: DEFAULT_MAX_VALUE_SIZE,
            watch_buffer: DEFAULT_WATCH_BUFFER,
        }
    }
}

/// A non-durable [`Store`] that keeps everything in memory.
pub struct MemoryStore {
    core: Arc<Core>,
    max_value_size: usize,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store with default options.
    pub fn new() -> Self {
        Self::with_options(MemoryOptions::default())
    }

    /// An empty store with the given options.
    pub fn with_options(options: MemoryOptions) -> Self {
        MemoryStore {
            core: Arc::new(Core::new(options.watch_buffer)),
            max_value_size: options.max_value_size,
        }
    }

    /// Shuts the store down: later calls fail with [`StoreError::Closed`] and watch streams end.
    pub fn close(&self) {
        self.core.close();
    }
}

impl Drop for MemoryStore {
    fn drop(&mut self) {
        // Streams hold only a weak reference, but closing here ends them deterministically.
        self.core.close();
    }
}

#[async_trait]
impl Store for MemoryStore {
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
        let op = WriteOp::Put {
            key: key.to_owned(),
            value,
            precondition,
        };
        self.core.write_one(&op).map(put_result)
    }

    async fn delete(&self, key: &str, precondition: Precondition) -> Result<(KeyValue, Revision)> {
        let op = WriteOp::Delete {
            key: key.to_owned(),
            precondition,
        };
        self.core.write_one(&op).map(delete_result)
    }

    async fn watch(&self, prefix: &str, after_revision: Revision) -> Result<WatchStream> {
        self.core.watch(prefix, after_revision)
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.core.compact(revision).map(drop)
    }

    async fn close(&self) -> Result<()> {
        MemoryStore::close(self);
        Ok(())
    }
}
