//! Moving a cluster's objects from one store to another (embedded ⇄ etcd, or any two
//! [`Store`]s): [`export`] writes every key under [`REGISTRY_PREFIX`] to a stream, [`import`]
//! writes such a stream into a store.
//!
//! # Format
//!
//! Line-oriented, UTF-8, one JSON document per line, so that it streams in both directions and
//! can be inspected with ordinary text tools:
//!
//! ```text
//! {"format":"setpoint-export","version":1,"revision":1234,"count":2}
//! {"key":"/registry/namespaces/demo","value":{"apiVersion":"v1",...}}
//! {"key":"/registry/core/pods/demo/web-1","value":{"apiVersion":"v1",...},"compressed":true}
//! {"key":"/registry/_allocations/serviceips/10.96.0.10","base64":"..."}
//! ```
//!
//! The header names the format, its version, the source revision the snapshot was read at and
//! the number of key lines that follow. Each key line holds the stored value: embedded as JSON
//! (`value`) when it is one compact JSON document, also when it is kept compressed (see
//! [`crate::compression`]; `"compressed":true` then, and the import compresses it again),
//! otherwise base64 (`base64`) of the stored bytes, so that the import writes back the values
//! that were exported, in the form they were stored in. Objects therefore keep
//! their uids, generations, creation timestamps and managed fields; only revisions change,
//! because the target store assigns its own.
//!
//! The compaction guard ([`COMPACTION_GUARD_KEY`]) is per-store bookkeeping and is neither
//! exported nor imported; service-IP allocations (`/registry/_allocations/…`) are, since they
//! must stay consistent with the services that hold them.

use std::borrow::Cow;

use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use crate::{compression, Precondition, RangeRequest, Revision, Store, StoreError};

/// The prefix every exported key starts with.
pub const REGISTRY_PREFIX: &str = "/registry/";

pub use crate::COMPACTION_GUARD_KEY;

/// The `format` field of the header line.
pub const FORMAT_NAME: &str = "setpoint-export";

/// The format version this module writes and reads.
pub const FORMAT_VERSION: u64 = 1;

/// Keys read per `range` call while exporting (bounds the exporter's memory).
const EXPORT_PAGE: usize = 256;

/// Writes issued concurrently while importing: enough for the embedded store to commit many
/// per fsync and to hide etcd's round trips, small enough to bound memory.
const IMPORT_BATCH: usize = 64;

/// Errors from [`export`] and [`import`].
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// Reading or writing the stream failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A store operation failed.
    #[error("store error while {context}: {source}")]
    Store {
        /// What was being done (`reading a page`, `overwriting a key`, …).
        context: &'static str,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The stream does not start with a valid header.
    #[error("not a setpoint export: {0}")]
    BadHeader(String),
    /// The header names a version this build does not read.
    #[error("unsupported export format version {0} (this build reads version {FORMAT_VERSION})")]
    UnsupportedVersion(u64),
    /// A key line is malformed.
    #[error("line {line}: {reason}")]
    BadLine {
        /// The 1-based line number in the stream, the header being line 1.
        line: usize,
        /// What is wrong with the line.
        reason: String,
    },
    /// The target store already holds objects and `force` was not given.
    #[error(
        "the target store is not empty (it holds {key:?}, among others); \
         import into an empty store, or force to overwrite existing keys"
    )]
    NotEmpty {
        /// One key the target already holds.
        key: String,
    },
    /// The stream held a different number of key lines than its header announced (it was
    /// truncated or edited). Keys read before the problem was found have been written.
    #[error("the export announced {expected} keys but held {found}; it is truncated or damaged")]
    CountMismatch {
        /// The key count the header announced.
        expected: u64,
        /// The key lines the stream actually held.
        found: u64,
    },
}

fn store_err(context: &'static str) -> impl FnOnce(StoreError) -> MigrateError {
    move |source| MigrateError::Store { context, source }
}

/// The first line of an export.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    format: String,
    version: u64,
    revision: Revision,
    count: u64,
}

/// One key line as written.
#[derive(Serialize)]
struct OutLine<'a> {
    key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    base64: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    compressed: bool,
}

/// One key line as read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InLine {
    key: String,
    // Not a plain `Option`: a stored JSON `null` must come back as `Some("null")`.
    #[serde(default, deserialize_with = "some_raw")]
    value: Option<Box<RawValue>>,
    #[serde(default)]
    base64: Option<String>,
    #[serde(default)]
    compressed: bool,
}

fn some_raw<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// What [`export`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportSummary {
    /// The source revision the snapshot was read at.
    pub revision: Revision,
    /// Keys written.
    pub count: u64,
}

/// What [`import`] wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImportSummary {
    /// The revision the export was taken at (in the source store).
    pub source_revision: Revision,
    /// Keys written.
    pub count: u64,
    /// Of those, keys that already existed and were overwritten (only with `force`).
    pub overwritten: u64,
}

/// Whether a key belongs in an export.
fn exported(key: &str) -> bool {
    key.starts_with(REGISTRY_PREFIX) && key != COMPACTION_GUARD_KEY
}

/// The stored bytes as JSON to embed verbatim, when they are exactly one JSON document with no
/// surrounding whitespace and no line breaks (which would split the line).
fn as_embeddable_json(value: &[u8]) -> Option<&RawValue> {
    if value.contains(&b'\n') || value.contains(&b'\r') {
        return None;
    }
    let raw: &RawValue = serde_json::from_slice(value).ok()?;
    (raw.get().as_bytes() == value).then_some(raw)
}

/// Writes every key under [`REGISTRY_PREFIX`] (except the compaction guard) with its value,
/// as one consistent snapshot: the first page fixes the revision and every later page is read
/// at it. Pages through the store and writes as it goes, so memory stays bounded whatever the
/// store's size. Fails with [`StoreError::Compacted`] (inside [`MigrateError::Store`]) if the
/// store is compacted past the snapshot while the export runs; retry then.
pub async fn export<W>(store: &dyn Store, writer: &mut W) -> Result<ExportSummary, MigrateError>
where
    W: AsyncWrite + Unpin + ?Sized,
{
    let mut req = RangeRequest {
        prefix: REGISTRY_PREFIX.to_owned(),
        start_after: None,
        revision: None,
        limit: Some(EXPORT_PAGE),
    };
    let first = store
        .range(req.clone())
        .await
        .map_err(store_err("reading the first page"))?;
    let revision = first.revision;
    req.revision = Some(revision);
    // The header carries the count, so it is computed up front from the first page's total
    // (read at the snapshot revision), less the guard key if that revision has one.
    let guard = store
        .range(RangeRequest {
            prefix: COMPACTION_GUARD_KEY.to_owned(),
            revision: Some(revision),
            ..RangeRequest::default()
        })
        .await
        .map_err(store_err("looking up the compaction guard"))?;
    let has_guard = guard.kvs.iter().any(|kv| &*kv.key == COMPACTION_GUARD_KEY);
    let count = (first.count - usize::from(has_guard)) as u64;
    let header = Header {
        format: FORMAT_NAME.to_owned(),
        version: FORMAT_VERSION,
        revision,
        count,
    };
    let mut buf = serde_json::to_vec(&header).expect("header serializes");
    buf.push(b'\n');

    let mut written = 0u64;
    let mut page = first;
    loop {
        for kv in &page.kvs {
            if !exported(&kv.key) {
                continue;
            }
            let compressed = compression::is_compressed(&kv.value);
            let plain = if compressed {
                compression::plain(&kv.value).ok()
            } else {
                Some(Cow::Borrowed(&kv.value[..]))
            };
            let raw = plain.as_deref().and_then(as_embeddable_json);
            let line = OutLine {
                key: &kv.key,
                value: raw,
                base64: raw
                    .is_none()
                    .then(|| base64::engine::general_purpose::STANDARD.encode(&kv.value)),
                compressed: compressed && raw.is_some(),
            };
            serde_json::to_writer(&mut buf, &line).expect("line serializes");
            buf.push(b'\n');
            written += 1;
        }
        // One write per page keeps syscalls few without holding more than a page in memory.
        writer.write_all(&buf).await?;
        buf.clear();
        if !page.more {
            break;
        }
        let Some(last) = page.kvs.last() else { break };
        req.start_after = Some(last.key.to_string());
        page = store
            .range(req.clone())
            .await
            .map_err(store_err("reading a page"))?;
    }
    writer.flush().await?;
    if written != count {
        // The count was read at the same revision as the pages, so this is a backend bug
        // rather than a concurrent write; the file would be refused on import anyway.
        return Err(MigrateError::CountMismatch {
            expected: count,
            found: written,
        });
    }
    Ok(ExportSummary {
        revision,
        count: written,
    })
}

/// A key of `store` that makes it "not empty" for [`import`], if any: anything under
/// [`REGISTRY_PREFIX`] except the compaction guard (which a server writes on its own).
pub async fn first_registry_key(store: &dyn Store) -> Result<Option<String>, MigrateError> {
    let found = store
        .range(RangeRequest {
            prefix: REGISTRY_PREFIX.to_owned(),
            limit: Some(2),
            ..RangeRequest::default()
        })
        .await
        .map_err(store_err("checking whether the target is empty"))?;
    Ok(found
        .kvs
        .into_iter()
        .map(|kv| kv.key.to_string())
        .find(|k| exported(k)))
}

/// Reads an export written by [`export`] into `store`.
///
/// Refuses a target that already holds keys under [`REGISTRY_PREFIX`] (other than the
/// compaction guard) unless `force` is set. Every key is created with
/// [`Precondition::NotExists`], so a writer racing with the import is never silently
/// overwritten; with `force`, a key that exists is overwritten instead. Lines are read and
/// written a batch at a time, so memory stays bounded. The header's count is checked at the
/// end: on a mismatch the keys read so far have been written and [`MigrateError::CountMismatch`]
/// is returned.
pub async fn import<R>(
    store: &dyn Store,
    reader: &mut R,
    force: bool,
) -> Result<ImportSummary, MigrateError>
where
    R: AsyncBufRead + Unpin + ?Sized,
{
    let mut line = Vec::new();
    if reader.read_until(b'\n', &mut line).await? == 0 {
        return Err(MigrateError::BadHeader("the input is empty".to_owned()));
    }
    let header: Header = serde_json::from_slice(&line)
        .map_err(|e| MigrateError::BadHeader(format!("first line: {e}")))?;
    if header.format != FORMAT_NAME {
        return Err(MigrateError::BadHeader(format!(
            "format is {:?}, expected {FORMAT_NAME:?}",
            header.format
        )));
    }
    if header.version != FORMAT_VERSION {
        return Err(MigrateError::UnsupportedVersion(header.version));
    }
    if !force {
        if let Some(key) = first_registry_key(store).await? {
            return Err(MigrateError::NotEmpty { key });
        }
    }

    let mut summary = ImportSummary {
        source_revision: header.revision,
        count: 0,
        overwritten: 0,
    };
    let mut batch: Vec<(String, Bytes)> = Vec::with_capacity(IMPORT_BATCH);
    let mut line_no = 1usize;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).await?;
        if n > 0 {
            line_no += 1;
            if line.iter().all(u8::is_ascii_whitespace) {
                // A trailing blank line (an editor's final newline) is harmless.
                continue;
            }
            batch.push(parse_line(&line, line_no)?);
        }
        if batch.len() >= IMPORT_BATCH || (n == 0 && !batch.is_empty()) {
            summary.overwritten += write_batch(store, &batch, force).await?;
            summary.count += batch.len() as u64;
            batch.clear();
        }
        if n == 0 {
            break;
        }
    }
    if summary.count != header.count {
        return Err(MigrateError::CountMismatch {
            expected: header.count,
            found: summary.count,
        });
    }
    Ok(summary)
}

fn parse_line(line: &[u8], line_no: usize) -> Result<(String, Bytes), MigrateError> {
    let bad = |reason: String| MigrateError::BadLine {
        line: line_no,
        reason,
    };
    let parsed: InLine = serde_json::from_slice(line).map_err(|e| bad(e.to_string()))?;
    if !exported(&parsed.key) {
        return Err(bad(format!(
            "key {:?} is not one an export holds (outside {REGISTRY_PREFIX} or the compaction guard)",
            parsed.key
        )));
    }
    let value = match (parsed.value, parsed.base64) {
        (Some(raw), None) if parsed.compressed => compression::compress(raw.get().as_bytes()),
        (Some(raw), None) => Bytes::from(raw.get().to_owned().into_bytes()),
        (None, Some(_)) if parsed.compressed => {
            return Err(bad(
                "\"compressed\" goes with \"value\", not \"base64\"".to_owned()
            ))
        }
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map(Bytes::from)
            .map_err(|e| bad(format!("bad base64 value: {e}")))?,
        _ => {
            return Err(bad(
                "expected exactly one of \"value\" and \"base64\"".to_owned()
            ))
        }
    };
    Ok((parsed.key, value))
}

/// Writes one batch concurrently; returns how many keys were overwritten.
async fn write_batch(
    store: &dyn Store,
    batch: &[(String, Bytes)],
    force: bool,
) -> Result<u64, MigrateError> {
    let writes = batch.iter().map(|(key, value)| async move {
        match store.put(key, value.clone(), Precondition::NotExists).await {
            Ok(_) => Ok(false),
            Err(StoreError::AlreadyExists { .. }) if force => store
                .put(key, value.clone(), Precondition::None)
                .await
                .map(|_| true)
                .map_err(store_err("overwriting a key")),
            Err(e) => Err(MigrateError::Store {
                context: match e {
                    StoreError::AlreadyExists { .. } => "creating a key another writer created",
                    _ => "writing a key",
                },
                source: e,
            }),
        }
    });
    let results = futures::future::join_all(writes).await;
    let mut overwritten = 0;
    for r in results {
        overwritten += u64::from(r?);
    }
    Ok(overwritten)
}

/// A human-readable name for how a value is carried in the export (for messages and tests).
pub fn value_encoding(value: &[u8]) -> &'static str {
    if compression::is_compressed(value) {
        match compression::plain(value) {
            Ok(plain) if as_embeddable_json(&plain).is_some() => "compressed json",
            _ => "base64",
        }
    } else if as_embeddable_json(value).is_some() {
        "json"
    } else {
        "base64"
    }
}
