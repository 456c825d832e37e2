//! Decision records: one per reconcile, saying what woke it, what it observed, what it did
//! and why, linked to the API writes it made.
//!
//! A [`Scope`] wraps one reconcile (the controller's workers open one for every key they
//! reconcile; components that are not [`crate::controller::Controller`]s, such as a
//! scheduler or a node agent, open their own). Inside it, [`observe`] and [`action`] (or
//! [`crate::controller::Context::observe`] and [`crate::controller::Context::action`]) add to
//! the record, and every write the [`crate::Client`] sends carries the decision's id in
//! [`DECISION_ID_HEADER`] and the controller's name in [`CONTROLLER_HEADER`], so the API
//! server's write trail links each write to the reconcile that made it.
//!
//! Finished records go into a bounded per-process ring ([`RING_CAPACITY`]); a publisher task
//! ([`publish`], started by every controller's `run`) pushes new ones to the API server's
//! [`DECISIONS_PATH`] every [`PUBLISH_INTERVAL`]: as JSON over HTTPS, as the records
//! themselves ([`LocalPush`]) to an API server in the same process.
//! `SETPOINT_DECISION_RECORDS=off` turns it all off ([`setpoint_api::trail::enabled`]).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

pub use setpoint_api::trail::{
    ActionRecord, DecisionRecord, LocalPush, ObjectRef, Trigger, CONTROLLER_HEADER, DECISIONS_PATH,
    DECISION_ID_HEADER,
};

use crate::client::{Client, Outgoing};

/// Finished records kept per process until published (the oldest are dropped first).
pub const RING_CAPACITY: usize = 10_000;
/// How often the publisher pushes new records.
pub const PUBLISH_INTERVAL: Duration = Duration::from_millis(500);
/// Records per push, at most.
pub const PUBLISH_BATCH: usize = 1_000;
/// Wake-ups kept per decision (coalesced events beyond these are counted, not listed).
pub const MAX_TRIGGERS: usize = 4;
/// Observations and actions kept per decision, each.
pub const MAX_NOTES: usize = 16;

/// Whether decision records are on in this process.
pub fn enabled() -> bool {
    setpoint_api::trail::enabled()
}

/// The record being built.
struct Draft {
    record: DecisionRecord,
}

tokio::task_local! {
    static CURRENT: Arc<Mutex<Draft>>;
}

/// A process-unique prefix (random) and counter make ids unique across processes.
fn next_id() -> String {
    static PREFIX: OnceLock<u32> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(1);
    let p = PREFIX.get_or_init(rand::random::<u32>);
    format!("{p:08x}-{:x}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// One reconcile's decision record under construction; a no-op when records are off.
pub struct Scope {
    draft: Option<Arc<Mutex<Draft>>>,
}

impl Scope {
    /// Opens a decision of `controller` about `object`, woken by `triggers`.
    pub fn begin(controller: &str, object: ObjectRef, triggers: Vec<Trigger>) -> Scope {
        if !enabled() {
            return Scope { draft: None };
        }
        let record = DecisionRecord {
            id: next_id(),
            controller: controller.into(),
            object,
            triggers,
            start_micros: setpoint_api::trail::now_micros(),
            ..DecisionRecord::default()
        };
        Scope {
            draft: Some(Arc::new(Mutex::new(Draft { record }))),
        }
    }

    /// The decision's id (`None` when records are off).
    pub fn id(&self) -> Option<String> {
        self.draft.as_ref().map(|d| d.lock().record.id.clone())
    }

    /// Runs `fut` inside the decision: its observations, actions and client writes belong
    /// to it. (Tasks it spawns do not inherit the decision.)
    pub async fn enter<F: Future>(&self, fut: F) -> F::Output {
        match &self.draft {
            Some(d) => CURRENT.scope(d.clone(), fut).await,
            None => fut.await,
        }
    }

    /// Adds an observation from outside [`Scope::enter`].
    pub fn observe(&self, text: impl Into<String>) {
        if let Some(d) = &self.draft {
            push_note(&mut d.lock().record.observed, text.into());
        }
    }

    /// Adds an action from outside [`Scope::enter`].
    pub fn action(&self, what: impl Into<String>, rule: impl Into<String>) {
        if let Some(d) = &self.draft {
            push_action(&mut d.lock().record, what.into(), rule.into());
        }
    }

    /// Whether an action was recorded (a component that syncs often may keep only the
    /// decisions that acted, and drop the others unfinished).
    pub fn acted(&self) -> bool {
        self.draft
            .as_ref()
            .is_some_and(|d| !d.lock().record.actions.is_empty())
    }

    /// Closes the decision with its result and keeps the record.
    pub fn finish(self, result: impl Into<String>) {
        let Some(d) = self.draft else { return };
        let mut record = std::mem::take(&mut d.lock().record);
        record.result = result.into();
        record.end_micros = setpoint_api::trail::now_micros();
        ring().push(record);
    }
}

fn push_note(list: &mut Vec<String>, text: String) {
    if list.len() < MAX_NOTES {
        list.push(text);
    }
}

fn push_action(record: &mut DecisionRecord, action: String, rule: String) {
    if record.actions.len() < MAX_NOTES {
        record.actions.push(ActionRecord { action, rule });
    }
}

/// Adds a summary of observed state to the current decision (nothing outside one). The
/// closure form ([`observe_with`]) avoids building the text when records are off.
pub fn observe(text: impl Into<String>) {
    let _ = CURRENT.try_with(|d| push_note(&mut d.lock().record.observed, text.into()));
}

/// [`observe`] with the text built only inside a decision.
pub fn observe_with(text: impl FnOnce() -> String) {
    let _ = CURRENT.try_with(|d| push_note(&mut d.lock().record.observed, text()));
}

/// Records an action of the current decision and the rule that chose it.
pub fn action(what: impl Into<String>, rule: impl Into<String>) {
    let _ = CURRENT.try_with(|d| push_action(&mut d.lock().record, what.into(), rule.into()));
}

/// The current decision's id and controller, for the write headers.
pub(crate) fn current_headers() -> Option<(String, String)> {
    CURRENT
        .try_with(|d| {
            let d = d.lock();
            (d.record.id.clone(), d.record.controller.clone())
        })
        .ok()
}

/// Whether this task is inside a decision (so that summaries worth computing only for a
/// record are computed only then).
pub fn recording() -> bool {
    CURRENT.try_with(|_| ()).is_ok()
}

/// The current decision's id, if a reconcile is under way in this task.
pub fn current_id() -> Option<String> {
    CURRENT.try_with(|d| d.lock().record.id.clone()).ok()
}

/// The per-process ring of finished records.
pub struct Ring {
    inner: Mutex<RingInner>,
}

struct RingInner {
    records: VecDeque<Arc<DecisionRecord>>,
    /// Sequence number of `records[0]`.
    first_seq: u64,
    dropped: u64,
}

impl Ring {
    fn push(&self, record: DecisionRecord) {
        let mut r = self.inner.lock();
        if r.records.len() >= RING_CAPACITY {
            r.records.pop_front();
            r.first_seq += 1;
            r.dropped += 1;
        }
        r.records.push_back(Arc::new(record));
    }

    /// Records from sequence number `from` on (at most `max`), and the sequence number
    /// after them.
    pub fn since(&self, from: u64, max: usize) -> (Vec<Arc<DecisionRecord>>, u64) {
        let r = self.inner.lock();
        let start = from.max(r.first_seq);
        let skip = (start - r.first_seq) as usize;
        let out: Vec<_> = r.records.iter().skip(skip).take(max).cloned().collect();
        let next = start + out.len() as u64;
        (out, next)
    }

    /// The newest records (at most `n`), oldest first.
    pub fn recent(&self, n: usize) -> Vec<Arc<DecisionRecord>> {
        let r = self.inner.lock();
        let skip = r.records.len().saturating_sub(n);
        r.records.iter().skip(skip).cloned().collect()
    }

    /// The records of `controller` about objects named `name` (in any namespace) the ring
    /// still holds, oldest first: what a test, or someone debugging one controller, asks.
    pub fn about(&self, controller: &str, name: &str) -> Vec<Arc<DecisionRecord>> {
        let r = self.inner.lock();
        r.records
            .iter()
            .filter(|d| d.controller == controller && d.object.name == name)
            .cloned()
            .collect()
    }

    /// Records dropped because the ring was full.
    pub fn dropped(&self) -> u64 {
        self.inner.lock().dropped
    }
}

/// This process's ring of finished decision records.
pub fn ring() -> &'static Ring {
    static RING: OnceLock<Ring> = OnceLock::new();
    RING.get_or_init(|| Ring {
        inner: Mutex::new(RingInner {
            records: VecDeque::new(),
            first_seq: 0,
            dropped: 0,
        }),
    })
}

/// Starts (once per process) the task that pushes new records to the API server `client`
/// talks to. A server that does not serve [`DECISIONS_PATH`] (404) or refuses it (403) is
/// asked again only every minute, and said so once in the log.
pub fn publish(client: &Client) {
    static STARTED: OnceLock<()> = OnceLock::new();
    if !enabled() || tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let mut first = false;
    STARTED.get_or_init(|| first = true);
    if !first {
        return;
    }
    let client = client.clone();
    tokio::spawn(async move {
        let mut next = 0u64;
        let mut warned = false;
        loop {
            let (batch, after) = ring().since(next, PUBLISH_BATCH);
            if batch.is_empty() {
                tokio::time::sleep(PUBLISH_INTERVAL).await;
                continue;
            }
            let mut extensions = http::Extensions::new();
            let body = if client.in_process() {
                // The server in this process takes the records as they are (no JSON).
                extensions.insert(LocalPush(batch.clone()));
                Bytes::new()
            } else {
                match serde_json::to_vec(&batch) {
                    Ok(b) => Bytes::from(b),
                    Err(e) => {
                        tracing::warn!(error = %e, "decision records: encoding failed");
                        next = after;
                        continue;
                    }
                }
            };
            let sent = client
                .request_bytes(Outgoing {
                    method: http::Method::POST,
                    path: DECISIONS_PATH,
                    accept: "application/json",
                    content_type: Some("application/json"),
                    body,
                    extensions,
                })
                .await;
            match sent {
                Ok(_) => {
                    next = after;
                    if batch.len() < PUBLISH_BATCH {
                        tokio::time::sleep(PUBLISH_INTERVAL).await;
                    }
                }
                Err(e) if matches!(e.code(), Some(403 | 404)) => {
                    if !warned {
                        tracing::info!(error = %e, "the API server takes no decision records; they stay in this process only");
                        warned = true;
                    }
                    next = after;
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                // Refused as it is (too large, say): sending it again cannot help.
                Err(e) if e.code().is_some_and(|c| (400..500).contains(&c)) => {
                    tracing::warn!(error = %e, records = batch.len(), "the API server refused decision records; dropped");
                    next = after;
                }
                Err(e) => {
                    // Kept for the next try; the ring bounds what waits.
                    tracing::debug!(error = %e, "decision records: push failed");
                    tokio::time::sleep(PUBLISH_INTERVAL).await;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scope_collects_notes_and_lands_in_the_ring() {
        let scope = Scope::begin(
            "unit",
            ObjectRef::new("ConfigMap", "ns", "a"),
            vec![Trigger::reason("resync")],
        );
        let id = scope.id().unwrap();
        let seen = scope
            .enter(async {
                observe("2 of 3");
                action("create 1", "below desired");
                (current_id(), current_headers())
            })
            .await;
        assert_eq!(seen.0.as_deref(), Some(id.as_str()));
        assert_eq!(seen.1.unwrap().1, "unit");
        assert!(current_id().is_none());
        // Outside a decision these do nothing.
        observe("lost");
        scope.finish("success");
        let r = ring()
            .recent(RING_CAPACITY)
            .into_iter()
            .find(|r| r.id == id)
            .unwrap();
        assert_eq!(r.observed, vec!["2 of 3"]);
        assert_eq!(r.actions[0].rule, "below desired");
        assert_eq!(r.result, "success");
        assert!(r.end_micros >= r.start_micros);
    }

    #[test]
    fn ids_are_unique() {
        assert_ne!(next_id(), next_id());
    }

    #[test]
    fn since_pages_through_the_ring() {
        let ring = Ring {
            inner: Mutex::new(RingInner {
                records: VecDeque::new(),
                first_seq: 0,
                dropped: 0,
            }),
        };
        for i in 0..5 {
            ring.push(DecisionRecord {
                id: i.to_string(),
                ..DecisionRecord::default()
            });
        }
        let (a, next) = ring.since(0, 3);
        assert_eq!(a.len(), 3);
        let (b, next) = ring.since(next, 3);
        assert_eq!(
            b.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["3", "4"]
        );
        assert!(ring.since(next, 3).0.is_empty());
    }
}
