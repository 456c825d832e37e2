//! etcd backend: a thin adapter from the [`Store`] trait onto an etcd v3 cluster.
//!
//! The trait was modelled on etcd, so most of it maps one to one:
//! - revisions are etcd revisions (`header.revision`); `create_revision`, `mod_revision` and
//!   `version` come straight from etcd's key-values;
//! - guarded writes are single-key transactions: `NotExists` compares `create_revision == 0`,
//!   `ModRevision(r)` compares `mod_revision == r` (and `create_revision > 0`, because etcd
//!   compares a missing key as revision 0); the failure branch reads the key so a
//!   [`StoreError::Conflict`] carries the value that won;
//! - `range` is an etcd range over `[prefix, prefix_end)` (starting after `start_after`), with
//!   etcd's own `count` and `more`;
//! - `watch` is an etcd watch from `after + 1` with `prev_kv`, and `compact` is etcd's compact.
//!
//! Every key is stored as `options.prefix + key`, so several clusters can share one etcd; the
//! trait never sees the prefix.
//!
//! Two things etcd does not offer directly are built here:
//! - **The compaction point.** etcd reports "required revision has been compacted" without the
//!   number. Because a read at revision `r` fails exactly when `r` is below the compaction
//!   point, [`EtcdStore`] finds it with a few probing reads (a binary search from the last
//!   point it knew, usually one read) whenever it has to report it.
//! - **Ordered progress notifications.** etcd before 3.4.31 / 3.5.13 sends a requested
//!   progress notification out of band, so it can overtake events the watcher has not been sent
//!   yet (etcd issue 15220), most visibly on a watch that is still replaying history. On such
//!   servers a watch answers `request_progress` only once its replay has caught up, and only
//!   after a second progress round trip, reporting the revision of the first: the events that
//!   were queued when the first was answered have been flushed by the time the second comes
//!   back. "Caught up" is known for certain when an event at or after the revision the watch
//!   was created at arrives, and otherwise assumed once the replay has been quiet for
//!   300 ms (etcd replays in rounds every 100 ms); that assumption, and a watcher
//!   etcd parks because its reader fell far behind, are where old servers remain best effort.
//!   On fixed servers (the version is read when connecting) etcd's notification is exact and
//!   is forwarded as it is. Either way the notification reports a revision at or after the
//!   store's revision when `request_progress` was called.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;
use setpoint_etcd_proto as pb;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::Streaming;

use crate::{
    Event, KeyValue, Precondition, RangeRequest, RangeResponse, Result, Revision, Store,
    StoreError, WatchResponse, WatchStream,
};

/// etcd's default request size limit (`--max-request-bytes`): 1.5 MiB. A bigger value cannot
/// be written, so it is the default [`EtcdOptions::max_value_size`].
pub const DEFAULT_ETCD_MAX_VALUE_SIZE: usize = 1536 * 1024;

/// Largest response the client accepts. etcd answers a range in one message, so this bounds
/// one page; a page that would be bigger is fetched in smaller pieces (see
/// [`Store::range`] on [`EtcdStore`]).
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// How long a replaying watch must be quiet before it is taken to have caught up, on etcd
/// versions whose progress notifications are not ordered (see the module docs). etcd moves a watcher from replay to
/// live in a loop that runs every 100 ms; three rounds leave room for a busy server.
const REPLAY_SETTLE: Duration = Duration::from_millis(300);

/// Responses a watch may have ready for a slow reader before it stops reading from etcd (etcd
/// then buffers for it, server side).
const WATCH_QUEUE: usize = 64;

// etcd's error strings for the conditions the trait names (stable across 3.x).
const ERR_COMPACTED: &str = "required revision has been compacted";
const ERR_FUTURE: &str = "required revision is a future revision";
const ERR_TOO_LARGE: &str = "request is too large";
const ERR_GRPC_TOO_LARGE: &str = "received message larger than max";
const ERR_RESPONSE_TOO_LARGE: &str = "message length too large";

/// TLS material for talking to etcd, as PEM text.
#[derive(Clone)]
pub struct EtcdTls {
    /// The CA that signed etcd's serving certificates.
    pub ca_pem: Vec<u8>,
    /// Client certificate, when etcd requires client authentication (`--client-cert-auth`).
    pub cert_pem: Option<Vec<u8>>,
    /// The client certificate's private key; required with `cert_pem`.
    pub key_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the private key (configs end up in logs).
        f.debug_struct("EtcdTls")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("cert_pem", &self.cert_pem.as_ref().map(|c| c.len()))
            .field("key_pem", &self.key_pem.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Where and how to reach etcd.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// Client URLs (`http://host:2379`, or `https://…` with [`EtcdOptions::tls`]); requests
    /// are balanced across them.
    pub endpoints: Vec<String>,
    /// Prepended to every key, so several clusters can share one etcd. Keys the store hands
    /// out never include it. Setpoint's keys start with `/`, so prefixes like `/a` and `/ab`
    /// never see each other's `/registry/…` keys; still, prefer prefixes that are not prefixes
    /// of one another.
    pub prefix: String,
    /// The CA and client certificate for `https://` endpoints; `None` for plain `http://`
    /// (TLS options with an `http://` endpoint, or the reverse, are refused on connect).
    pub tls: Option<EtcdTls>,
    /// Largest value accepted ([`StoreError::TooLarge`] beyond it). etcd's own request limit
    /// also counts the key and a little framing; a write it refuses as too large is reported
    /// as [`StoreError::TooLarge`] too, never truncated.
    pub max_value_size: usize,
    /// How long connecting (and the first request) may take before [`EtcdStore::connect`]
    /// gives up.
    pub dial_timeout: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: vec!["http://127.0.0.1:2379".to_owned()],
            prefix: String::new(),
            tls: None,
            max_value_size: DEFAULT_ETCD_MAX_VALUE_SIZE,
            dial_timeout: Duration::from_secs(5),
        }
    }
}

/// A [`Store`] backed by an etcd v3 cluster.
pub struct EtcdStore {
    inner: Arc<Inner>,
}

type KvClient = pb::kv_client::KvClient<Channel>;
type WatchClient = pb::watch_client::WatchClient<Channel>;

struct Inner {
    kv: KvClient,
    watch: WatchClient,
    prefix: Vec<u8>,
    /// A key used only for revision probes: reads of it carry the header revision and fail
    /// exactly like any read at a compacted or future revision.
    probe_key: Vec<u8>,
    max_value_size: usize,
    dial_timeout: Duration,
    server_version: String,
    /// Whether etcd orders requested progress notifications after pending events.
    ordered_progress: bool,
    /// A revision the compaction point is known to be at or above (it only moves forward).
    compacted_floor: AtomicI64,
    closed_flag: AtomicBool,
    closed: watch::Sender<bool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Watch tasks hold only a weak reference; this ends their streams.
        let _ = self.closed.send(true);
    }
}

/// How an etcd failure maps onto the trait's errors.
enum Failure {
    Compacted,
    Future,
    TooLarge,
    ResponseTooLarge,
    Other(String),
}

fn classify(e: &tonic::Status) -> Failure {
    let text = e.message();
    if text.contains(ERR_COMPACTED) {
        Failure::Compacted
    } else if text.contains(ERR_FUTURE) {
        Failure::Future
    } else if text.contains(ERR_TOO_LARGE) || text.contains(ERR_GRPC_TOO_LARGE) {
        Failure::TooLarge
    } else if text.contains(ERR_RESPONSE_TOO_LARGE) {
        Failure::ResponseTooLarge
    } else {
        Failure::Other(format!("etcd: {e}"))
    }
}

fn backend(e: tonic::Status) -> StoreError {
    StoreError::Backend(format!("etcd: {e}"))
}

fn header_revision(header: Option<&pb::ResponseHeader>) -> Result<Revision> {
    header
        .map(|h| h.revision)
        .ok_or_else(|| StoreError::Backend("etcd response without a header".to_owned()))
}

/// The first key after every key that starts with `prefix` (etcd's `range_end` for a prefix).
/// `[0]` means "to the end of the keyspace" to etcd.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

use pb::compare::{CompareResult, CompareTarget, TargetUnion as Target};

/// A transaction guard on `key`.
fn compare(key: &[u8], result: CompareResult, target: Target) -> pb::Compare {
    let on = match target {
        Target::Version(_) => CompareTarget::Version,
        Target::CreateRevision(_) => CompareTarget::Create,
        Target::ModRevision(_) => CompareTarget::Mod,
        Target::Value(_) => CompareTarget::Value,
    };
    pb::Compare {
        result: result as i32,
        target: on as i32,
        key: key.to_vec(),
        target_union: Some(target),
    }
}

/// A transaction step.
fn op(request: pb::request_op::Request) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(request),
    }
}

/// A read of `key` (in a transaction's failure branch: the value that won).
fn get_op(key: &[u8]) -> pb::RequestOp {
    op(pb::request_op::Request::RequestRange(pb::RangeRequest {
        key: key.to_vec(),
        ..Default::default()
    }))
}

/// Whether an etcd version sends requested progress notifications in order with events.
/// The ordering fix (etcd PR 15237) and its follow-up for watches that receive no events
/// (PR 17557) are both in 3.4.31 and 3.5.13.
fn progress_is_ordered(version: &str) -> bool {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let (major, minor, patch) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m >= 6,
        (m, _) => m > 3,
    }
}

impl EtcdStore {
    /// Connects to etcd and checks that it answers within `options.dial_timeout`.
    pub async fn connect(options: EtcdOptions) -> Result<EtcdStore> {
        if options.endpoints.is_empty() {
            return Err(StoreError::Backend("no etcd endpoints given".to_owned()));
        }
        let channel = channel(&options)?;
        let deadline = options.dial_timeout;
        let mut maintenance = pb::maintenance_client::MaintenanceClient::new(channel.clone());
        let status = tokio::time::timeout(deadline, maintenance.status(pb::StatusRequest {}))
            .await
            .map_err(|_| unreachable_error(&options))?
            .map_err(|e| {
                StoreError::Backend(format!(
                    "etcd at {} did not answer: {e}",
                    options.endpoints.join(",")
                ))
            })?
            .into_inner();
        let server_version = status.version;
        let ordered_progress = progress_is_ordered(&server_version);
        tracing::info!(
            endpoints = %options.endpoints.join(","),
            version = %server_version,
            ordered_progress,
            prefix = %options.prefix,
            "connected to etcd"
        );
        let prefix = options.prefix.clone().into_bytes();
        let mut probe_key = prefix.clone();
        probe_key.push(0);
        let (closed, _) = watch::channel(false);
        Ok(EtcdStore {
            inner: Arc::new(Inner {
                kv: KvClient::new(channel.clone()).max_decoding_message_size(MAX_RESPONSE_BYTES),
                watch: WatchClient::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES),
                prefix,
                probe_key,
                max_value_size: options.max_value_size,
                dial_timeout: options.dial_timeout,
                server_version,
                ordered_progress,
                compacted_floor: AtomicI64::new(0),
                closed_flag: AtomicBool::new(false),
                closed,
            }),
        })
    }

    /// The etcd server's version, as it reported it when connecting.
    pub fn server_version(&self) -> &str {
        &self.inner.server_version
    }
}

/// One gRPC channel balanced over every endpoint, with TLS when configured and HTTP/2 pings
/// that notice a dead server on idle watch streams.
fn channel(options: &EtcdOptions) -> Result<Channel> {
    let tls = match &options.tls {
        None => None,
        Some(tls) => {
            let mut config =
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            match (&tls.cert_pem, &tls.key_pem) {
                (Some(cert), Some(key)) => config = config.identity(Identity::from_pem(cert, key)),
                (None, None) => {}
                _ => {
                    return Err(StoreError::Backend(
                        "an etcd client certificate needs its key, and a key its certificate"
                            .to_owned(),
                    ))
                }
            }
            Some(config)
        }
    };
    let mut endpoints = Vec::with_capacity(options.endpoints.len());
    for url in &options.endpoints {
        let bad = |e: &dyn std::fmt::Display| {
            StoreError::Backend(format!("invalid etcd endpoint {url:?}: {e}"))
        };
        let url = if url.contains("://") {
            url.clone()
        } else if tls.is_some() {
            format!("https://{url}")
        } else {
            format!("http://{url}")
        };
        if tls.is_some() != url.starts_with("https://") {
            return Err(bad(
                &"TLS options go with https:// endpoints, and only with them",
            ));
        }
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| bad(&e))?
            .connect_timeout(options.dial_timeout)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        if let Some(tls) = &tls {
            endpoint = endpoint.tls_config(tls.clone()).map_err(|e| bad(&e))?;
        }
        endpoints.push(endpoint);
    }
    Ok(Channel::balance_list(endpoints.into_iter()))
}

fn unreachable_error(options: &EtcdOptions) -> StoreError {
    StoreError::Backend(format!(
        "etcd at {} did not answer within {:?}",
        options.endpoints.join(","),
        options.dial_timeout
    ))
}

impl Inner {
    fn check_open(&self) -> Result<()> {
        if self.closed_flag.load(Ordering::SeqCst) {
            Err(StoreError::Closed)
        } else {
            Ok(())
        }
    }

    fn kv(&self) -> KvClient {
        self.kv.clone()
    }

    /// The etcd key for a store key.
    fn etcd_key(&self, key: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(key.as_bytes());
        k
    }

    /// The store key for an etcd key (which must be under the prefix).
    fn store_key(&self, key: &[u8]) -> Result<String> {
        let rest = key.strip_prefix(self.prefix.as_slice()).ok_or_else(|| {
            StoreError::Backend(format!(
                "etcd returned key {:?} outside prefix {:?}",
                String::from_utf8_lossy(key),
                String::from_utf8_lossy(&self.prefix)
            ))
        })?;
        String::from_utf8(rest.to_vec()).map_err(|_| {
            StoreError::Backend(format!(
                "etcd key {:?} is not UTF-8",
                String::from_utf8_lossy(key)
            ))
        })
    }

    fn key_value(&self, kv: &pb::KeyValue) -> Result<KeyValue> {
        Ok(KeyValue {
            key: self.store_key(&kv.key)?.into(),
            value: Bytes::copy_from_slice(&kv.value),
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
        })
    }

    /// The etcd key range `[start, end)` holding the store keys that start with `prefix`.
    fn prefix_range(&self, prefix: &str) -> (Vec<u8>, Vec<u8>) {
        let full = self.etcd_key(prefix);
        let end = prefix_end(&full);
        // etcd has no empty key: the whole keyspace starts at "\0".
        let start = if full.is_empty() { vec![0] } else { full };
        (start, end)
    }

    /// A read of the probe key at `revision` (0 = latest); returns the header revision.
    async fn probe(&self, revision: Revision) -> Result<Revision, tonic::Status> {
        let resp = self
            .kv()
            .range(pb::RangeRequest {
                key: self.probe_key.clone(),
                revision: revision.max(0),
                count_only: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok(resp.header.map(|h| h.revision).unwrap_or(0))
    }

    async fn current_revision(&self) -> Result<Revision> {
        self.check_open()?;
        self.probe(0).await.map_err(backend)
    }

    /// Whether a read at `revision` is refused as compacted.
    async fn is_compacted(&self, revision: Revision) -> Result<bool> {
        match self.probe(revision).await {
            Ok(_) => Ok(false),
            Err(e) => match classify(&e) {
                Failure::Compacted => Ok(true),
                _ => Err(backend(e)),
            },
        }
    }

    /// The compaction point: the smallest revision that can still be read. etcd does not
    /// report it, so this searches between the last known point and the current revision.
    async fn compacted_revision(&self) -> Result<Revision> {
        self.check_open()?;
        let floor = self.compacted_floor.load(Ordering::SeqCst);
        // Revision 0 means "latest" to etcd; revision 1 is a fresh cluster's empty state, so
        // a point of 0 or 1 both read as "nothing compacted yet".
        let mut lo = floor.max(1);
        if !self.is_compacted(lo).await? {
            return Ok(floor);
        }
        // Invariant: reads at `lo` fail, reads at `hi` work (the current revision always can).
        let mut hi = self.current_revision().await?;
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.is_compacted(mid).await? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        self.compacted_floor.fetch_max(hi, Ordering::SeqCst);
        Ok(hi)
    }

    /// Maps a failed read at `requested` (None = latest) onto the trait's errors.
    async fn read_error(&self, e: tonic::Status, requested: Option<Revision>) -> StoreError {
        let requested = requested.unwrap_or(0);
        match classify(&e) {
            Failure::Compacted => match self.compacted_revision().await {
                Ok(compacted) => StoreError::Compacted {
                    requested,
                    compacted,
                },
                Err(e) => e,
            },
            Failure::Future => match self.current_revision().await {
                Ok(current) => StoreError::FutureRevision { requested, current },
                Err(e) => e,
            },
            Failure::Other(msg) => StoreError::Backend(msg),
            _ => backend(e),
        }
    }

    /// Maps a failed write of a `size`-byte value onto the trait's errors.
    fn write_error(&self, e: tonic::Status, size: usize) -> StoreError {
        match classify(&e) {
            // etcd's request limit also counts the key and framing, so it can refuse a value
            // that passed `max_value_size`; the limit reported is then "less than this value".
            Failure::TooLarge => StoreError::TooLarge {
                size,
                limit: self.max_value_size.min(size.saturating_sub(1)),
            },
            Failure::Other(msg) => StoreError::Backend(msg),
            _ => backend(e),
        }
    }

    /// The key-value a successful put at `revision` produced, from the value it replaced.
    fn written(
        &self,
        key: &str,
        value: Bytes,
        revision: Revision,
        prev: Option<&pb::KeyValue>,
    ) -> KeyValue {
        // etcd's rule: a put keeps the create revision and bumps the version; a put to an
        // absent key starts a new incarnation at version 1.
        let (create_revision, version) =
            prev.map_or((revision, 1), |p| (p.create_revision, p.version + 1));
        KeyValue {
            key: key.into(),
            value,
            create_revision,
            mod_revision: revision,
            version,
        }
    }

    /// The current value read in a failed transaction's `else` branch.
    fn failed_txn_current(&self, resp: &pb::TxnResponse) -> Result<Option<KeyValue>> {
        for op in &resp.responses {
            if let Some(pb::response_op::Response::ResponseRange(get)) = &op.response {
                return get.kvs.first().map(|kv| self.key_value(kv)).transpose();
            }
        }
        Ok(None)
    }

    /// The guard "the key exists with exactly this `mod_revision`". etcd compares a missing
    /// key as revision 0, so existence is checked too.
    fn exists_at(key: &[u8], revision: Revision) -> Vec<pb::Compare> {
        vec![
            compare(key, CompareResult::Equal, Target::ModRevision(revision)),
            compare(key, CompareResult::Greater, Target::CreateRevision(0)),
        ]
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn current_revision(&self) -> Result<Revision> {
        self.inner.current_revision().await
    }

    async fn compacted_revision(&self) -> Result<Revision> {
        self.inner.compacted_revision().await
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let inner = &self.inner;
        inner.check_open()?;
        let resp = inner
            .kv()
            .range(pb::RangeRequest {
                key: inner.etcd_key(key),
                ..Default::default()
            })
            .await
            .map_err(backend)?
            .into_inner();
        resp.kvs.first().map(|kv| inner.key_value(kv)).transpose()
    }

    /// Reads one page. A page whose response would exceed the client's message limit is
    /// fetched with a smaller limit instead: fewer keys with `more` set, never an error.
    async fn range(&self, req: RangeRequest) -> Result<RangeResponse> {
        let inner = &self.inner;
        inner.check_open()?;
        let (mut start, end) = inner.prefix_range(&req.prefix);
        if let Some(after) = &req.start_after {
            // The smallest key after `after` is `after + "\0"`.
            let mut next = inner.etcd_key(after);
            next.push(0);
            start = start.max(next);
        }
        // A past revision before the cluster's first write reads etcd's revision 1, the empty
        // initial state (etcd reads revision 0 as "latest").
        let etcd_revision = req.revision.map(|r| r.max(1));
        if end != [0] && start >= end {
            // Nothing can match, but the revision must still be valid.
            return match inner.probe(etcd_revision.unwrap_or(0)).await {
                Ok(current) => Ok(RangeResponse {
                    kvs: Vec::new(),
                    more: false,
                    count: 0,
                    revision: req.revision.unwrap_or(current),
                }),
                Err(e) => Err(inner.read_error(e, req.revision).await),
            };
        }
        let mut limit = req.limit;
        loop {
            let request = pb::RangeRequest {
                key: start.clone(),
                range_end: end.clone(),
                revision: etcd_revision.unwrap_or(0),
                // etcd reads limit 0 as "unlimited".
                count_only: limit == Some(0),
                limit: match limit {
                    Some(n) if n > 0 => n as i64,
                    _ => 0,
                },
            };
            match inner
                .kv()
                .range(request)
                .await
                .map(tonic::Response::into_inner)
            {
                Ok(resp) => {
                    let kvs = resp
                        .kvs
                        .iter()
                        .map(|kv| inner.key_value(kv))
                        .collect::<Result<Vec<_>>>()?;
                    let count = resp.count.max(0) as usize;
                    let more = if limit == Some(0) {
                        count > 0
                    } else {
                        resp.more
                    };
                    let revision = match req.revision {
                        Some(r) => r,
                        None => header_revision(resp.header.as_ref())?,
                    };
                    return Ok(RangeResponse {
                        kvs,
                        more,
                        count,
                        revision,
                    });
                }
                Err(e) => match classify(&e) {
                    Failure::ResponseTooLarge if limit.is_none_or(|n| n > 1) => {
                        limit = Some(limit.map_or(1024, |n| n / 2).max(1));
                    }
                    _ => return Err(inner.read_error(e, req.revision).await),
                },
            }
        }
    }

    async fn put(&self, key: &str, value: Bytes, precondition: Precondition) -> Result<KeyValue> {
        let inner = &self.inner;
        inner.check_open()?;
        let size = value.len();
        if size > inner.max_value_size {
            return Err(StoreError::TooLarge {
                size,
                limit: inner.max_value_size,
            });
        }
        let ekey = inner.etcd_key(key);
        let put = || pb::PutRequest {
            key: ekey.clone(),
            value: value.to_vec(),
            prev_kv: true,
            ..Default::default()
        };
        let txn = |guard: Vec<pb::Compare>, failure: Vec<pb::RequestOp>| pb::TxnRequest {
            compare: guard,
            success: vec![op(pb::request_op::Request::RequestPut(put()))],
            failure,
        };
        match precondition {
            Precondition::None => {
                let resp = inner
                    .kv()
                    .put(put())
                    .await
                    .map_err(|e| inner.write_error(e, size))?
                    .into_inner();
                let revision = header_revision(resp.header.as_ref())?;
                Ok(inner.written(key, value, revision, resp.prev_kv.as_ref()))
            }
            Precondition::NotExists => {
                let guard = vec![compare(
                    &ekey,
                    CompareResult::Equal,
                    Target::CreateRevision(0),
                )];
                let resp = inner
                    .kv()
                    .txn(txn(guard, vec![]))
                    .await
                    .map_err(|e| inner.write_error(e, size))?
                    .into_inner();
                if !resp.succeeded {
                    return Err(StoreError::AlreadyExists {
                        key: key.to_owned(),
                    });
                }
                let revision = header_revision(resp.header.as_ref())?;
                Ok(inner.written(key, value, revision, None))
            }
            Precondition::ModRevision(r) => {
                let resp = inner
                    .kv()
                    .txn(txn(Inner::exists_at(&ekey, r), vec![get_op(&ekey)]))
                    .await
                    .map_err(|e| inner.write_error(e, size))?
                    .into_inner();
                if !resp.succeeded {
                    return Err(StoreError::Conflict {
                        key: key.to_owned(),
                        current: inner.failed_txn_current(&resp)?.map(Box::new),
                    });
                }
                let revision = header_revision(resp.header.as_ref())?;
                let prev = resp.responses.iter().find_map(|op| match &op.response {
                    Some(pb::response_op::Response::ResponsePut(p)) => p.prev_kv.as_ref(),
                    _ => None,
                });
                Ok(inner.written(key, value, revision, prev))
            }
        }
    }

    async fn delete(&self, key: &str, precondition: Precondition) -> Result<(KeyValue, Revision)> {
        let inner = &self.inner;
        inner.check_open()?;
        let ekey = inner.etcd_key(key);
        let not_found = || StoreError::NotFound {
            key: key.to_owned(),
        };
        let delete = || pb::DeleteRangeRequest {
            key: ekey.clone(),
            prev_kv: true,
            ..Default::default()
        };
        match precondition {
            Precondition::None => {
                let resp = inner
                    .kv()
                    .delete_range(delete())
                    .await
                    .map_err(backend)?
                    .into_inner();
                let prev = resp.prev_kvs.first().ok_or_else(not_found)?;
                Ok((
                    inner.key_value(prev)?,
                    header_revision(resp.header.as_ref())?,
                ))
            }
            Precondition::ModRevision(r) => {
                let txn = pb::TxnRequest {
                    compare: Inner::exists_at(&ekey, r),
                    success: vec![op(pb::request_op::Request::RequestDeleteRange(delete()))],
                    failure: vec![get_op(&ekey)],
                };
                let resp = inner.kv().txn(txn).await.map_err(backend)?.into_inner();
                if !resp.succeeded {
                    return match inner.failed_txn_current(&resp)? {
                        None => Err(not_found()),
                        Some(cur) => Err(StoreError::Conflict {
                            key: key.to_owned(),
                            current: Some(Box::new(cur)),
                        }),
                    };
                }
                let prev = resp
                    .responses
                    .iter()
                    .find_map(|op| match &op.response {
                        Some(pb::response_op::Response::ResponseDeleteRange(d)) => {
                            d.prev_kvs.first()
                        }
                        _ => None,
                    })
                    .ok_or_else(not_found)?;
                Ok((
                    inner.key_value(prev)?,
                    header_revision(resp.header.as_ref())?,
                ))
            }
            Precondition::NotExists => match self.get(key).await? {
                None => Err(not_found()),
                Some(_) => Err(StoreError::Backend(
                    "invalid precondition: NotExists cannot guard a delete".to_owned(),
                )),
            },
        }
    }

    async fn watch(&self, prefix: &str, after_revision: Revision) -> Result<WatchStream> {
        let inner = &self.inner;
        inner.check_open()?;
        // etcd would accept a start one revision before its compaction point and tells about
        // older ones only asynchronously; the trait wants the refusal here, for exactly the
        // revisions a read would refuse.
        let current = inner.current_revision().await?;
        if after_revision < current && inner.is_compacted(after_revision.max(1)).await? {
            return Err(StoreError::Compacted {
                requested: after_revision,
                compacted: inner.compacted_revision().await?,
            });
        }
        let (start, end) = inner.prefix_range(prefix);
        let create = pb::WatchCreateRequest {
            key: start,
            range_end: end,
            start_revision: after_revision + 1,
            prev_kv: true,
            progress_notify: true,
            fragment: true,
            ..Default::default()
        };
        // One watch per gRPC stream: requests go in through a channel (the create request
        // first, then progress requests), responses come out of the stream.
        let (requests, outgoing) = mpsc::channel(4);
        requests
            .try_send(pb::WatchRequest {
                request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
            })
            .expect("a new channel has room");
        let mut responses = inner
            .watch
            .clone()
            .watch(tokio_stream::wrappers::ReceiverStream::new(outgoing))
            .await
            .map_err(backend)?
            .into_inner();
        // The first response confirms the watcher and tells the revision it was created at.
        let created = tokio::time::timeout(inner.dial_timeout, responses.message())
            .await
            .map_err(|_| StoreError::Backend("etcd did not confirm the watch".to_owned()))?
            .map_err(backend)?
            .ok_or_else(|| StoreError::Backend("etcd closed the watch at once".to_owned()))?;
        if created.canceled {
            return Err(if created.compact_revision > 0 {
                StoreError::Compacted {
                    requested: after_revision,
                    compacted: created.compact_revision,
                }
            } else {
                StoreError::Backend(format!("etcd refused the watch: {}", created.cancel_reason))
            });
        }
        let created_revision = header_revision(created.header.as_ref())?;
        let (out, mut rx) = mpsc::channel(WATCH_QUEUE);
        let (progress_tx, progress_rx) = mpsc::unbounded_channel();
        let task = WatchTask {
            inner: Arc::downgrade(inner),
            ordered_progress: inner.ordered_progress,
            responses,
            requests,
            out,
            progress_rx,
            closed: inner.closed.subscribe(),
            after: after_revision,
            watch_id: created.watch_id,
            created_revision,
            last_sent: after_revision,
            synced: after_revision >= created_revision,
            settle_at: Instant::now() + REPLAY_SETTLE,
            wanted: false,
            again: false,
            round: Round::Idle,
        };
        tokio::spawn(task.run());
        let stream: Pin<Box<dyn Stream<Item = Result<WatchResponse>> + Send>> =
            Box::pin(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)));
        Ok(WatchStream::new(
            stream,
            Some(Box::new(move || {
                let _ = progress_tx.send(());
            })),
        ))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let inner = &self.inner;
        inner.check_open()?;
        if revision <= 0 {
            return Ok(());
        }
        let request = pb::CompactionRequest {
            revision,
            physical: false,
        };
        match inner.kv().compact(request).await {
            Ok(_) => {
                inner.compacted_floor.fetch_max(revision, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => match classify(&e) {
                // Already compacted at or past it: compacting backwards is a no-op.
                Failure::Compacted => {
                    inner.compacted_floor.fetch_max(revision, Ordering::SeqCst);
                    Ok(())
                }
                Failure::Future => Err(StoreError::FutureRevision {
                    requested: revision,
                    current: inner.current_revision().await?,
                }),
                Failure::Other(msg) => Err(StoreError::Backend(msg)),
                _ => Err(backend(e)),
            },
        }
    }

    /// Refuses further calls and ends every watch stream. etcd itself needs no flushing: every
    /// acknowledged write is already committed there.
    async fn close(&self) -> Result<()> {
        self.inner.closed_flag.store(true, Ordering::SeqCst);
        let _ = self.inner.closed.send(true);
        Ok(())
    }
}

/// Where a progress request stands (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    Idle,
    /// The first etcd progress request is out.
    First,
    /// The second is out; the first was answered at this revision.
    Second(Revision),
}

/// Forwards one etcd watch to a [`WatchStream`], and answers progress requests.
struct WatchTask {
    inner: Weak<Inner>,
    ordered_progress: bool,
    responses: Streaming<pb::WatchResponse>,
    /// Requests to etcd on this watch's stream (progress requests, after the create).
    requests: mpsc::Sender<pb::WatchRequest>,
    out: mpsc::Sender<Result<WatchResponse>>,
    progress_rx: mpsc::UnboundedReceiver<()>,
    closed: watch::Receiver<bool>,
    after: Revision,
    watch_id: i64,
    /// The revision etcd was at when it created the watcher: replay covers up to here.
    created_revision: Revision,
    /// The revision of the last response sent (events or progress).
    last_sent: Revision,
    /// Whether etcd has (as far as can be told) finished replaying history to this watcher.
    synced: bool,
    /// When a still-replaying watcher counts as caught up if nothing more arrives.
    settle_at: Instant,
    /// A progress request is waiting for a round to start.
    wanted: bool,
    /// A progress request arrived during a round, so another round must follow.
    again: bool,
    round: Round,
}

enum Flow {
    Continue,
    Stop,
}

/// Resolves once the store is closed (or dropped).
async fn wait_closed(closed: &mut watch::Receiver<bool>) {
    let _ = closed.wait_for(|c| *c).await;
}

impl WatchTask {
    async fn run(mut self) {
        loop {
            if self.wanted && self.round == Round::Idle && (self.ordered_progress || self.synced) {
                self.wanted = false;
                self.round = Round::First;
                if self.request_progress().await.is_err() {
                    self.fail(StoreError::Backend("etcd watch stream closed".to_owned()))
                        .await;
                    return;
                }
            }
            let settling = self.wanted && !self.synced && !self.ordered_progress;
            let settle_at = self.settle_at;
            tokio::select! {
                _ = wait_closed(&mut self.closed) => return,
                _ = self.out.closed() => return,
                msg = self.responses.message() => {
                    let flow = match msg {
                        Ok(Some(resp)) => self.on_response(resp).await,
                        Ok(None) => {
                            self.fail(StoreError::Backend("etcd ended the watch stream".to_owned())).await;
                            Flow::Stop
                        }
                        Err(e) => {
                            if *self.closed.borrow() {
                                return;
                            }
                            self.fail(StoreError::Backend(format!("etcd watch failed: {e}"))).await;
                            Flow::Stop
                        }
                    };
                    if let Flow::Stop = flow {
                        return;
                    }
                }
                Some(()) = self.progress_rx.recv() => {
                    if self.round == Round::Idle {
                        self.wanted = true;
                    } else {
                        self.again = true;
                    }
                }
                _ = tokio::time::sleep_until(settle_at), if settling => {
                    self.synced = true;
                }
            }
        }
    }

    /// Asks etcd for a progress notification on this watch's stream.
    async fn request_progress(&self) -> Result<(), mpsc::error::SendError<pb::WatchRequest>> {
        let progress =
            pb::watch_request::RequestUnion::ProgressRequest(pb::WatchProgressRequest {});
        self.requests
            .send(pb::WatchRequest {
                request_union: Some(progress),
            })
            .await
    }

    /// Sends one item to the reader, unless the store closes first.
    async fn send(&mut self, item: Result<WatchResponse>) -> Flow {
        tokio::select! {
            sent = self.out.send(item) => if sent.is_ok() { Flow::Continue } else { Flow::Stop },
            _ = wait_closed(&mut self.closed) => Flow::Stop,
        }
    }

    /// Sends a final error; the stream ends after it.
    async fn fail(&mut self, e: StoreError) {
        let _ = self.send(Err(e)).await;
    }

    async fn progress(&mut self, revision: Revision) -> Flow {
        self.last_sent = self.last_sent.max(revision);
        let resp = WatchResponse {
            events: Vec::new(),
            revision: self.last_sent,
        };
        self.send(Ok(resp)).await
    }

    /// Ends a progress round with a notification at `revision`.
    async fn finish_round(&mut self, revision: Revision) -> Flow {
        self.round = Round::Idle;
        if self.again {
            self.again = false;
            self.wanted = true;
        }
        self.progress(revision).await
    }

    async fn on_response(&mut self, resp: pb::WatchResponse) -> Flow {
        if resp.canceled {
            let e = if resp.compact_revision > 0 {
                StoreError::Compacted {
                    requested: self.last_sent.max(self.after),
                    compacted: resp.compact_revision,
                }
            } else {
                StoreError::Backend(format!("etcd canceled the watch: {}", resp.cancel_reason))
            };
            self.fail(e).await;
            return Flow::Stop;
        }
        if resp.created {
            return Flow::Continue;
        }
        let header = resp.header.as_ref().map(|h| h.revision).unwrap_or(0);
        if resp.events.is_empty() {
            if resp.watch_id == self.watch_id {
                // etcd's periodic notification for this watcher: sent through the same queue
                // as its events and only once it is live, so it is always in order.
                self.synced = true;
                return self.progress(header).await;
            }
            return match self.round {
                Round::Idle => Flow::Continue,
                Round::First if self.ordered_progress => self.finish_round(header).await,
                Round::First => {
                    self.round = Round::Second(header);
                    if self.request_progress().await.is_err() {
                        self.fail(StoreError::Backend("etcd watch stream closed".to_owned()))
                            .await;
                        return Flow::Stop;
                    }
                    Flow::Continue
                }
                Round::Second(first) => self.finish_round(first).await,
            };
        }
        let mut events = Vec::with_capacity(resp.events.len());
        for ev in &resp.events {
            match self.event(ev) {
                Ok(Some(e)) => events.push(e),
                Ok(None) => {
                    let revision = ev.kv.as_ref().map(|kv| kv.mod_revision).unwrap_or(0);
                    let e = self.lost_previous_value(revision).await;
                    self.fail(e).await;
                    return Flow::Stop;
                }
                Err(e) => {
                    self.fail(e).await;
                    return Flow::Stop;
                }
            }
        }
        let last = events.last().map(Event::revision).unwrap_or(self.last_sent);
        if last >= self.created_revision {
            self.synced = true;
        } else if !self.synced {
            self.settle_at = Instant::now() + REPLAY_SETTLE;
        }
        // Fragments of one etcd response (and etcd's batched replay) carry the header of the
        // whole batch; the last event's revision is what this reader has really been told.
        self.last_sent = self.last_sent.max(last);
        let resp = WatchResponse {
            events,
            revision: self.last_sent,
        };
        self.send(Ok(resp)).await
    }

    /// Maps one etcd event; `None` when etcd could not attach the previous value.
    fn event(&self, ev: &pb::Event) -> Result<Option<Event>> {
        let inner = self.inner.upgrade().ok_or(StoreError::Closed)?;
        let kv = ev
            .kv
            .as_ref()
            .ok_or_else(|| StoreError::Backend("etcd watch event without a key".to_owned()))?;
        let prev = ev
            .prev_kv
            .as_ref()
            .map(|p| inner.key_value(p))
            .transpose()?;
        let kind = pb::event::EventType::try_from(ev.r#type).map_err(|_| {
            StoreError::Backend(format!("etcd watch event of unknown type {}", ev.r#type))
        })?;
        Ok(match kind {
            pb::event::EventType::Put => {
                // A create (version 1) has no previous value; an update must have one, or the
                // reader would take it for a create.
                if kv.version > 1 && prev.is_none() {
                    return Ok(None);
                }
                Some(Event::Put {
                    kv: inner.key_value(kv)?,
                    prev,
                })
            }
            pb::event::EventType::Delete => match prev {
                Some(prev) => Some(Event::Delete {
                    key: inner.store_key(&kv.key)?.into(),
                    revision: kv.mod_revision,
                    prev,
                }),
                None => None,
            },
        })
    }

    /// The error for an event whose previous value etcd had already compacted away (it
    /// happens when compaction overtakes a watcher that is catching up). The reader must
    /// resume, and will be told its start is compacted and relist.
    async fn lost_previous_value(&self, revision: Revision) -> StoreError {
        let compacted = match self.inner.upgrade() {
            Some(inner) => inner.compacted_revision().await.unwrap_or(revision),
            None => return StoreError::Closed,
        };
        StoreError::Compacted {
            requested: revision - 1,
            compacted: compacted.max(revision),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b""), vec![0]);
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn ordered_progress_versions() {
        assert!(!progress_is_ordered("3.4.23"));
        assert!(progress_is_ordered("3.4.31"));
        assert!(!progress_is_ordered("3.5.12"));
        assert!(progress_is_ordered("3.5.13"));
        assert!(progress_is_ordered("3.6.0"));
        assert!(progress_is_ordered("4.0.0"));
        assert!(!progress_is_ordered("garbage"));
    }
}
