//! The reflector: LIST, then WATCH from the list's resourceVersion, forever, feeding a sink.
//!
//! Recovery rules:
//! - the watch ends, cleanly (server timeout, or the server dropped a slow watcher) or cut off
//!   mid-stream (a connection reset, the server going away): watch again from the last
//!   resourceVersion seen, which loses nothing (the server replays from there or answers 410),
//!   as client-go's reflector does; relisting every object instead costs the server and every
//!   informer a full LIST for nothing;
//! - a watch request to a server whose host refuses the connection, or resets it while it is
//!   made (an API server restarting): watch again from the same resourceVersion once it
//!   answers, as client-go does for a refused one, rather than relist;
//! - 410 Gone (HTTP status or ERROR event), any other error event, or a watch request that
//!   fails otherwise: relist and let the sink apply the differences;
//! - every failed attempt waits the [`Backoff`](super::Backoff) delay first; a successful list,
//!   or a watch that delivered something, resets it. A connection the server's host refused
//!   (nothing listens: an API server restarting) is retried after the first delay without
//!   doubling it: such an attempt costs the server nothing, and a doubled delay would keep an
//!   informer waiting seconds after the server is back;
//! - an object that does not decode as the informer's type (a LIST item or a watch event's
//!   object) is handed to the sink as [`Undecodable`] and the rest keeps flowing: one malformed
//!   stored object must not stop every controller of its type. The sink treats it as absent,
//!   exactly as the next relist would (its LIST leaves it out).

use std::pin::pin;
use std::time::Duration;

use futures::StreamExt;
use tracing::Instrument;

use super::backoff::{refused, Backoff, BackoffState};
use crate::client::{Api, ClientError, ListParams, Undecodable, WatchEvent, WatchParams};
use crate::object::Object;

/// Where the reflector puts what it learns. Implemented by the informer, which applies each
/// call to its cache and dispatches the resulting events atomically.
pub(crate) trait Sink<K>: Send + Sync {
    /// A complete LIST: replace the cache, emitting the differences, and mark it synced.
    /// `skipped` are the items that did not decode (left out of `items`).
    fn relisted(&self, items: Vec<K>, skipped: Vec<Undecodable>);
    /// An ADDED or MODIFIED watch event.
    fn upserted(&self, object: K);
    /// A DELETED watch event.
    fn deleted(&self, object: K);
    /// A watch event whose object did not decode; `deleted` for a DELETED event.
    fn undecodable(&self, object: Undecodable, deleted: bool);
}

/// What the reflector needs besides the API handle.
#[derive(Clone, Debug)]
pub(crate) struct ReflectorConfig {
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub page_size: Option<u32>,
    pub watch_timeout: Duration,
    pub backoff: Backoff,
    pub strip_managed_fields: bool,
}

/// A watch that ran without receiving anything for less than this is treated as a failure
/// for backoff purposes, so a server that closes watches at once is not hammered.
const SHORT_WATCH: Duration = Duration::from_secs(1);

/// How a watch ended.
enum WatchEnd {
    /// The stream ended, cleanly or cut off: resume from `last`. `received`: it delivered
    /// something (the watch worked); `quiet_and_short`: it delivered nothing and ended at once.
    Ended {
        last: String,
        received: bool,
        quiet_and_short: bool,
    },
    /// 410: the resourceVersion is too old; relist.
    Gone(String),
    /// The watch request's connection was refused: watch from `rv` again.
    Refused { rv: String, error: ClientError },
    /// Anything else went wrong; relist.
    Failed(ClientError),
}

/// Runs until the future is dropped (the informer's stop signal).
pub(crate) async fn run<K: Object>(api: Api<K>, config: ReflectorConfig, sink: &dyn Sink<K>) {
    // Watch events then never build what would be dropped (LIST pages are stripped after
    // decoding: relists are rare).
    let api = if config.strip_managed_fields {
        api.skipping_managed_fields()
    } else {
        api
    };
    let mut backoff = BackoffState::new(config.backoff);
    // None: the next step is a LIST.
    let mut resume_from: Option<String> = None;
    loop {
        let rv = match resume_from.take() {
            Some(rv) => rv,
            None => match list(&api, &config, sink).await {
                Ok(rv) => {
                    backoff.reset();
                    rv
                }
                Err(e) => {
                    tracing::warn!(resource = %api.resource().plural, namespace = ?api.namespace(), error = %e, "list failed; retrying");
                    tokio::time::sleep(backoff.delay_after(&e)).await;
                    continue;
                }
            },
        };
        match watch(&api, &config, rv, sink).await {
            WatchEnd::Ended {
                last,
                received,
                quiet_and_short,
            } => {
                if received {
                    backoff.reset();
                } else if quiet_and_short {
                    tracing::debug!(resource = %api.resource().plural, "watch closed at once; backing off before watching again");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                resume_from = Some(last);
            }
            WatchEnd::Refused { rv, error } => {
                tracing::debug!(resource = %api.resource().plural, error = %error, "watch refused; watching again");
                tokio::time::sleep(backoff.delay_after(&error)).await;
                resume_from = Some(rv);
            }
            WatchEnd::Gone(message) => {
                tracing::warn!(resource = %api.resource().plural, namespace = ?api.namespace(), reason = "410 Gone", detail = %message, "relisting");
                tokio::time::sleep(backoff.next_delay()).await;
            }
            WatchEnd::Failed(e) => {
                tracing::warn!(resource = %api.resource().plural, namespace = ?api.namespace(), reason = %e, "watch failed; relisting");
                tokio::time::sleep(backoff.delay_after(&e)).await;
            }
        }
    }
}

/// A consistent LIST (resourceVersion unset: the latest state, not a cache answer), every
/// page, handed to the sink as one replacement. Returns the list's resourceVersion.
async fn list<K: Object>(
    api: &Api<K>,
    config: &ReflectorConfig,
    sink: &dyn Sink<K>,
) -> Result<String, ClientError> {
    let params = ListParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        limit: config.page_size,
        ..ListParams::default()
    };
    let span = tracing::info_span!("list", resource = %api.resource().plural, namespace = ?api.namespace());
    async {
        let lenient = api.list_all_lenient(&params).await?;
        let mut list = lenient.list;
        tracing::debug!(items = list.items.len(), skipped = lenient.skipped.len(), resource_version = %list.resource_version, "listed");
        if config.strip_managed_fields {
            list.items.iter_mut().for_each(Object::strip_managed_fields);
        }
        sink.relisted(list.items, lenient.skipped);
        Ok(list.resource_version)
    }
    .instrument(span)
    .await
}

/// One WATCH from `rv`, applied to the sink until it ends.
async fn watch<K: Object>(
    api: &Api<K>,
    config: &ReflectorConfig,
    rv: String,
    sink: &dyn Sink<K>,
) -> WatchEnd {
    let params = WatchParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        timeout_seconds: Some(config.watch_timeout.as_secs().clamp(1, u32::MAX as u64) as u32),
        bookmarks: true,
        send_initial_events: false,
    };
    let span = tracing::info_span!("watch", resource = %api.resource().plural, namespace = ?api.namespace(), resource_version = %rv);
    async move {
        let started = tokio::time::Instant::now();
        let stream = match api.watch_lenient(&params, &rv).await {
            Ok(s) => s,
            Err(e) if e.is_gone() => return WatchEnd::Gone(e.to_string()),
            Err(e) if refused(&e) => return WatchEnd::Refused { rv, error: e },
            Err(e) => return WatchEnd::Failed(e),
        };
        let mut stream = pin!(stream);
        let mut last = rv;
        let mut received = false;
        while let Some(item) = stream.next().await {
            received = true;
            match item {
                // With `strip_managed_fields`, `api` already decodes events without them.
                Ok(WatchEvent::Added(Ok(o))) | Ok(WatchEvent::Modified(Ok(o))) => {
                    advance(&mut last, o.resource_version());
                    sink.upserted(o);
                }
                Ok(WatchEvent::Deleted(Ok(o))) => {
                    advance(&mut last, o.resource_version());
                    sink.deleted(o);
                }
                // The event still happened: resume after it, whatever its object holds.
                Ok(WatchEvent::Added(Err(u))) | Ok(WatchEvent::Modified(Err(u))) => {
                    advance(&mut last, u.resource_version.clone());
                    sink.undecodable(u, false);
                }
                Ok(WatchEvent::Deleted(Err(u))) => {
                    advance(&mut last, u.resource_version.clone());
                    sink.undecodable(u, true);
                }
                Ok(WatchEvent::Bookmark {
                    resource_version, ..
                }) => advance(&mut last, Some(resource_version)),
                Ok(WatchEvent::Error(e)) if e.code == 410 => return WatchEnd::Gone(e.to_string()),
                Ok(WatchEvent::Error(e)) => return WatchEnd::Failed(ClientError::Api(e)),
                // Cut off (connection reset, server gone): what arrived is applied, and the
                // server replays what follows `last` to the next watch, or answers 410.
                Err(ClientError::Transport(e)) => {
                    tracing::debug!(resource_version = %last, error = %e, "watch cut off");
                    break;
                }
                Err(e) => return WatchEnd::Failed(e),
            }
        }
        tracing::debug!(resource_version = %last, "watch ended");
        WatchEnd::Ended {
            last,
            received,
            quiet_and_short: !received && started.elapsed() < SHORT_WATCH,
        }
    }
    .instrument(span)
    .await
}

/// Moves the resume point forward. An empty resourceVersion would mean "from now" and skip
/// changes, so it is ignored.
fn advance(last: &mut String, rv: Option<String>) {
    if let Some(rv) = rv.filter(|r| !r.is_empty()) {
        *last = rv;
    }
}
