//! WATCH: the event stream of a collection, with bookmarks, and its coalescing of ready
//! events into bounded chunks.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http::StatusCode;
use serde_json::json;
use setpoint_api::{meta, ApiError};
use setpoint_store::Revision;

use crate::registry::ResourceDef;
use crate::request::{ListParams, Query, RvParam};
use crate::watchcache::{CachedObject, EventType, WatchItem, WatchStart};

use super::list::filter_for;
use super::list::wait_fresh;
use super::negotiation::table_requested;
use super::negotiation::wants_metadata;
use super::respond::to_api;
use super::{storage_def, Request};
use crate::response::json_response;

/// Formats one watch event line.
pub(super) fn event_line(kind: &str, object: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(object.len() + kind.len() + 24);
    event_line_into(&mut b, kind, |b| b.extend_from_slice(object));
    b.freeze()
}

/// Appends `{"type":<kind>,"object":<what write_object appends>}` and a newline.
pub(super) fn event_line_into(
    b: &mut BytesMut,
    kind: &str,
    write_object: impl FnOnce(&mut BytesMut),
) {
    b.extend_from_slice(b"{\"type\":\"");
    b.extend_from_slice(kind.as_bytes());
    b.extend_from_slice(b"\",\"object\":");
    write_object(b);
    b.extend_from_slice(b"}\n");
}

/// A 200 whose body is one watch ERROR event carrying `e`'s `Status`: how a watch reports a
/// problem found after its parameters were accepted (upstream: "once we have ... successfully
/// parsed a resource version, other errors must fail with a watch event of type ERROR").
pub(super) fn watch_error(e: &ApiError) -> Response {
    let line = event_line(
        "ERROR",
        &serde_json::to_vec(&e.to_status()).unwrap_or_default(),
    );
    json_response(StatusCode::OK, line)
}

/// WATCH of the collection: the initial state when asked for, then every change after the
/// revision, filtered by the selectors, with bookmarks when the client allows them.
pub(super) async fn watch(r: Request<'_>, namespace: Option<&str>) -> Result<Response, ApiError> {
    let Request {
        server,
        res,
        q,
        headers,
        ..
    } = r;
    let params = ListParams::parse(q)?;
    let filter = filter_for(server, res, namespace, q)?;
    let sres = storage_def(server, res);
    let rv = params.resource_version;
    let send_initial = params.send_initial_events;
    let bookmarks = params.allow_watch_bookmarks;
    let fresh = match (rv, send_initial) {
        // A consistent initial state: the cache catches up with the store first.
        (RvParam::Unset, Some(true)) => wait_fresh(server, None).await,
        // Any other named revision must be one the cache reaches.
        (RvParam::At(_), _) => wait_fresh(server, rv.revision()).await,
        _ => Ok(()),
    };
    if let Err(e) = fresh {
        return Ok(watch_error(&e));
    }
    // Injected expiry (tests only): the 410 a watch from a revision the cache no longer
    // reaches gets, as if the window began at the newest revision.
    if let (RvParam::At(_), Some(faults)) = (rv, &server.faults) {
        if faults.expire_watch() {
            let requested = rv.revision().unwrap_or(0);
            let e = ApiError::too_old_resource_version(requested, server.caches.revision() + 1);
            return Ok(watch_error(&e));
        }
    }
    let start = match (rv, send_initial) {
        (_, Some(true)) | (RvParam::Unset | RvParam::Any, None) => WatchStart::CurrentState,
        // No initial events: changes from the newest revision on.
        (RvParam::Unset | RvParam::Any, Some(false)) => WatchStart::After(server.caches.revision()),
        (RvParam::At(_), _) => WatchStart::After(rv.revision().unwrap_or(0)),
    };
    let initial_end_bookmark = send_initial == Some(true) && bookmarks;
    let timeout = match params.timeout_seconds {
        // Upstream's watch runs under a context whose deadline is already past: it ends at once.
        Some(t) if t < 0 => return Ok(json_response(StatusCode::OK, Bytes::new())),
        Some(t) if t > 0 => Duration::from_secs(t.unsigned_abs()),
        // Kubernetes spreads long watches over 30–60 minutes so reconnects don't bunch up.
        _ => Duration::from_secs(1800 + rand::random::<u64>() % 1800),
    };
    let cache = server.caches.get(&sres.storage_prefix());
    let table = table_requested(headers, q)?;
    let metadata_as = wants_metadata(headers).filter(|_| !table);
    let handle = match cache.watch(start, filter, bookmarks) {
        Ok(h) => h,
        // Clients expect a 200 with an ERROR event for an expired resourceVersion.
        Err(e) => return Ok(watch_error(&e)),
    };
    let res = res.clone();
    let q = q.clone();
    let state = WatchState {
        server: server.clone(),
        ended: false,
        res,
        table,
        metadata_as,
        first_table: true,
        q,
    };
    let revision = handle.revision;
    // A deadline far past any real one still fits the clock.
    let deadline =
        tokio::time::Instant::now() + timeout.min(Duration::from_secs(10 * 365 * 24 * 3600));
    let stream = futures::stream::unfold(
        (state, handle, initial_end_bookmark, revision),
        move |(mut state, mut handle, mut end_bookmark, revision)| async move {
            if state.ended {
                return None;
            }
            // Initial events are taken one at a time, as the connection asks for more, so
            // only what the connection has room for is ever serialized.
            let item = if let Some(i) = handle.next_initial() {
                Some(i)
            } else if end_bookmark {
                end_bookmark = false;
                let line = state.bookmark(revision, true);
                return Some((
                    Ok::<Bytes, Infallible>(line),
                    (state, handle, end_bookmark, revision),
                ));
            } else {
                match tokio::time::timeout_at(deadline, handle.next_live()).await {
                    Ok(Some(i)) => Some(i),
                    _ => None,
                }
            };
            let item = item?;
            let line = match item {
                WatchItem::Event(t, obj) => match state.event(t, &obj).await {
                    Ok(line) => line,
                    Err(e) => {
                        // An object the watcher's version cannot show (its conversion
                        // webhook failed) ends the watch with the error, as an ERROR event.
                        state.ended = true;
                        event_line(
                            "ERROR",
                            &serde_json::to_vec(&e.to_status()).unwrap_or_default(),
                        )
                    }
                },
                WatchItem::Bookmark(rv) => state.bookmark(rv, false),
            };
            Some((Ok(line), (state, handle, end_bookmark, revision)))
        },
    );
    let body = match &server.faults {
        // A dropped watch's response is cut off mid-stream (tests only).
        Some(faults) => Body::from_stream(faults.droppable(coalesced(stream))),
        None => Body::from_stream(coalesced(stream)),
    };
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::CACHE_CONTROL, "no-cache, private")
        .body(body)
        .expect("valid response"))
}

/// At most this many watch events go out in one body chunk.
pub(super) const EVENTS_PER_CHUNK: usize = 64;

/// A chunk stops growing past this size (an event is never split).
pub(super) const CHUNK_BYTES: usize = 256 * 1024;

/// Joins the events of `lines` that are ready together into one body chunk, never waiting for
/// more. Under load a watcher is sent one HTTP/2 frame, TLS record and write for many events
/// instead of one each: the writes were about a twentieth of the server's CPU with one
/// client watching 30,000 pods start. An idle watch sends each event alone, at once.
///
/// It takes an event from `lines` only when it has room for it in the chunk it is building,
/// so what a watcher holds serialized is at most one chunk and one event, however far its
/// client is behind: joining a fixed number of ready events instead held 64 whole objects per
/// stalled watch (64 MiB for objects of 1 MiB).
pub(super) fn coalesced(
    lines: impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> futures::stream::BoxStream<'static, Result<Bytes, Infallible>> {
    Coalesced {
        lines: lines.boxed(),
        held: None,
        done: false,
    }
    .boxed()
}

/// The stream [`coalesced`] returns.
pub(super) struct Coalesced {
    lines: futures::stream::BoxStream<'static, Result<Bytes, Infallible>>,
    /// An event taken that did not fit the last chunk: the next chunk starts with it.
    held: Option<Bytes>,
    /// `lines` has ended.
    done: bool,
}

impl futures::Stream for Coalesced {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        // The first event of the chunk, kept as it is until a second one joins it.
        let mut first: Option<Bytes> = this.held.take();
        let mut joined: Option<BytesMut> = None;
        let mut events = usize::from(first.is_some());
        loop {
            let len = joined
                .as_ref()
                .map_or_else(|| first.as_ref().map_or(0, Bytes::len), BytesMut::len);
            if this.done || events >= EVENTS_PER_CHUNK || len >= CHUNK_BYTES {
                break;
            }
            let line = match this.lines.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(line))) => line,
                Poll::Ready(None) => {
                    this.done = true;
                    break;
                }
                Poll::Pending => break,
            };
            if len > 0 && len + line.len() > CHUNK_BYTES {
                this.held = Some(line);
                break;
            }
            events += 1;
            match (&mut joined, first.take()) {
                (Some(j), _) => j.extend_from_slice(&line),
                (None, Some(f)) => {
                    let mut j = BytesMut::with_capacity((f.len() + line.len()) * 2);
                    j.extend_from_slice(&f);
                    j.extend_from_slice(&line);
                    joined = Some(j);
                }
                (None, None) => first = Some(line),
            }
        }
        match (joined, first) {
            (Some(j), _) => Poll::Ready(Some(Ok(j.freeze()))),
            (None, Some(f)) => Poll::Ready(Some(Ok(f))),
            (None, None) if this.done => Poll::Ready(None),
            (None, None) => Poll::Pending,
        }
    }
}

pub(super) struct WatchState {
    server: Arc<crate::state::ApiServer>,
    /// An error event went out: the watch ends.
    ended: bool,
    res: Arc<ResourceDef>,
    table: bool,
    /// Objects go out as `PartialObjectMetadata` of this `meta.k8s.io` version.
    metadata_as: Option<&'static str>,
    first_table: bool,
    q: Query,
}

impl WatchState {
    async fn event(&mut self, t: EventType, obj: &Arc<CachedObject>) -> Result<Bytes, ApiError> {
        if self.table {
            let o = Arc::new(to_api(&self.server, &self.res, obj.object()).await?);
            let rv = meta::resource_version(&o).to_string();
            let tbl = crate::table::table(&self.res, &[o], &rv, None, &self.q, self.first_table);
            self.first_table = false;
            return Ok(event_line(
                t.as_str(),
                &serde_json::to_vec(&tbl).unwrap_or_default(),
            ));
        }
        if let Some(v) = self.metadata_as {
            // What `partial_metadata` serializes to, without parsing the object.
            let mut b = BytesMut::with_capacity(obj.json_len().min(4096) + 96);
            event_line_into(&mut b, t.as_str(), |b| {
                b.extend_from_slice(b"{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":");
                let _ = serde_json::to_writer(bytes::BufMut::writer(&mut *b), v);
                b.extend_from_slice(b",\"metadata\":");
                obj.write_metadata_json(b);
                b.extend_from_slice(b"}");
            });
            return Ok(b.freeze());
        }
        if self.res.transformed_on_read() {
            let o = to_api(&self.server, &self.res, obj.object()).await?;
            return Ok(event_line(
                t.as_str(),
                &serde_json::to_vec(&o).unwrap_or_default(),
            ));
        }
        let kind = t.as_str();
        let mut b = BytesMut::with_capacity(obj.json_len() + kind.len() + 24);
        event_line_into(&mut b, kind, |b| obj.write_json(b));
        Ok(b.freeze())
    }

    fn bookmark(&self, rv: Revision, initial_end: bool) -> Bytes {
        let mut m = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            m["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let (kind, api_version) = if self.table {
            ("Table".to_string(), "meta.k8s.io/v1".to_string())
        } else if let Some(v) = self.metadata_as {
            ("PartialObjectMetadata".to_string(), v.to_string())
        } else {
            (self.res.kind.clone(), self.res.api_version())
        };
        let o = json!({"kind": kind, "apiVersion": api_version, "metadata": m});
        event_line("BOOKMARK", &serde_json::to_vec(&o).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize, size: usize) -> Vec<Bytes> {
        (0..n)
            .map(|i| {
                let mut l = vec![b'a' + (i % 26) as u8; size - 1];
                l.push(b'\n');
                Bytes::from(l)
            })
            .collect()
    }

    fn chunks_of(input: Vec<Bytes>) -> Vec<Bytes> {
        let stream = futures::stream::iter(input.into_iter().map(Ok::<_, Infallible>));
        futures::executor::block_on(coalesced(stream).map(|r| r.unwrap()).collect())
    }

    #[test]
    fn ready_events_go_out_together_within_bounds() {
        for (n, size) in [(1, 10), (3, 10), (200, 100), (10, 100_000), (3, 300_000)] {
            let input = lines(n, size);
            let chunks = chunks_of(input.clone());
            assert_eq!(chunks.concat(), input.concat(), "{n} x {size}");
            for c in &chunks {
                let events = c.iter().filter(|b| **b == b'\n').count();
                assert!(events <= EVENTS_PER_CHUNK, "{n} x {size}");
                // Only an event bigger than the bound makes a bigger chunk, and goes alone.
                assert!(c.len() <= CHUNK_BYTES || events == 1, "{n} x {size}");
                assert!(c.ends_with(b"\n"), "events are never split");
            }
            assert!(chunks.len() >= n.div_ceil(EVENTS_PER_CHUNK));
        }
        assert_eq!(chunks_of(lines(200, 100)).len(), 4);
    }

    /// The coalescer takes an event only when it can send it with the chunk it builds (or
    /// next): a stalled watcher holds one chunk and one event serialized, not a batch.
    #[test]
    fn events_are_taken_only_as_chunks_go_out() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let taken = Arc::new(AtomicUsize::new(0));
        let counted = taken.clone();
        let input = lines(1000, 100_000);
        let stream = futures::stream::iter(input).map(move |l| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Infallible>(l)
        });
        let mut chunks = coalesced(stream);
        let mut sent = 0;
        for _ in 0..5 {
            let chunk = futures::executor::block_on(chunks.next()).unwrap().unwrap();
            assert!(chunk.len() <= CHUNK_BYTES);
            sent += chunk.iter().filter(|b| **b == b'\n').count();
            assert!(taken.load(Ordering::SeqCst) <= sent + 1, "{sent}");
        }
    }
}
