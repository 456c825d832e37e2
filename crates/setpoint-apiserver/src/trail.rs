//! The write trail and the decision records behind `setpoint why`.
//!
//! Every successful mutating API request leaves one [`WriteRecord`] per object it wrote
//! (time, user, verb, object, uid, the resourceVersion it produced, and the decision id and
//! controller its [`DECISION_ID_HEADER`] and [`CONTROLLER_HEADER`] name): the request's
//! store writes are noted where they happen ([`note`], called by `objects`), under a
//! task-local the dispatcher opens around the request ([`Trail::record`]).
//!
//! Components push their decision records to [`DECISIONS_PATH`] (push, not pull: the API
//! server does not know where separate controller-manager, scheduler and agent processes
//! listen, while every one of them already talks to it; `setpoint up`'s in-process
//! components push through the same path). `GET` on [`DECISIONS_PATH`] lists the records
//! held after a cursor, waiting for new ones when asked to ([`DecisionsQuery`]: the live
//! view's timeline follows it). [`WHY_PATH`] answers with the causal chain of one object,
//! built by [`setpoint_api::trail::explain`]. Both rings are bounded ([`WRITES_CAPACITY`],
//! [`DECISIONS_CAPACITY`]; `docs/limits.md`).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use parking_lot::Mutex;
use serde_json::Value;
use setpoint_api::trail::{
    DecisionRecord, LocalPush, ObjectRef, WriteRecord, CONTROLLER_HEADER, DECISIONS_PATH,
    DECISION_ID_HEADER, WHY_PATH,
};
use setpoint_api::ApiError;

use crate::registry::ResourceDef;
use crate::state::ApiServer;

/// Writes kept (the oldest are dropped first).
pub const WRITES_CAPACITY: usize = 50_000;
/// Decision records kept (the oldest are dropped first).
pub const DECISIONS_CAPACITY: usize = 50_000;
/// Records one push may carry.
pub const MAX_PUSH: usize = 5_000;
/// How far back `why` walks from an object's writes (decision → trigger → write steps).
pub const WHY_DEPTH: usize = 4;
/// Text longer than this in a pushed record (an observation, an action, a result) is cut.
pub const MAX_TEXT: usize = 1_024;
/// Records one `GET` of [`DECISIONS_PATH`] answers when it names no `limit`.
pub const DEFAULT_PAGE: usize = 500;
/// Records one `GET` of [`DECISIONS_PATH`] answers, at most.
pub const MAX_PAGE: usize = 1_000;
/// The longest a `GET` of [`DECISIONS_PATH`] waits for new records (`timeoutSeconds`).
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// A store write of the request under way: the resource, the object and its new revision.
struct Noted {
    kind: String,
    group: String,
    resource: String,
    namespace: String,
    name: String,
    uid: String,
    revision: i64,
    removed: bool,
}

tokio::task_local! {
    static NOTED: RefCell<Vec<Noted>>;
}

/// Notes a store write of `res`'s object (`obj` when the caller has it) at `revision`, for
/// the request under way (nothing outside a recorded request: the server's own writes).
pub(crate) fn note(
    res: &ResourceDef,
    namespace: &str,
    name: &str,
    obj: Option<&Value>,
    revision: i64,
    removed: bool,
) {
    let _ = NOTED.try_with(|n| {
        let uid = obj
            .map(setpoint_api::meta::uid)
            .unwrap_or_default()
            .to_string();
        n.borrow_mut().push(Noted {
            kind: res.kind.clone(),
            group: res.group.clone(),
            resource: res.plural.clone(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid,
            revision,
            removed,
        });
    });
}

/// The server's trail: recent writes and the decision records components pushed.
pub struct Trail {
    on: bool,
    writes: Mutex<VecDeque<WriteRecord>>,
    decisions: Mutex<Decisions>,
    /// Woken when records arrive, for readers waiting on [`DECISIONS_PATH`].
    arrived: tokio::sync::Notify,
}

/// A decision record held, shared with the component that pushed it when that one runs in
/// this process, and who reported it.
struct Held {
    record: Arc<DecisionRecord>,
    reporter: Arc<str>,
}

impl Held {
    /// The record as answered: stamped with its reporter.
    fn record(&self) -> DecisionRecord {
        let mut d = (*self.record).clone();
        d.reporter = self.reporter.to_string();
        d
    }
}

/// The decision records held, numbered in the order they arrived.
#[derive(Default)]
struct Decisions {
    records: VecDeque<Held>,
    /// The number of `records[0]`; one more for every record dropped from the front.
    first_seq: u64,
}

impl Decisions {
    /// The number the next record will get.
    fn end(&self) -> u64 {
        self.first_seq + self.records.len() as u64
    }
}

impl Default for Trail {
    fn default() -> Self {
        Trail {
            on: setpoint_api::trail::enabled(),
            writes: Mutex::new(VecDeque::new()),
            decisions: Mutex::new(Decisions::default()),
            arrived: tokio::sync::Notify::new(),
        }
    }
}

/// A `GET` of [`DECISIONS_PATH`]: `since=<cursor>` answers the records from that cursor on,
/// oldest first (without it, the newest records); `limit` bounds the answer
/// ([`DEFAULT_PAGE`], at most [`MAX_PAGE`]); `namespace` keeps only records about objects in
/// it; `timeoutSeconds` (with `since`, at most [`MAX_WAIT`]) holds the request until a
/// record arrives or that time passes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecisionsQuery {
    /// The cursor: the `next` of the previous answer.
    pub since: Option<u64>,
    /// Records answered, at most.
    pub limit: usize,
    /// Only records about objects in this namespace (all when empty).
    pub namespace: String,
    /// How long to wait for a record when there is none yet.
    pub wait: Duration,
}

impl DecisionsQuery {
    /// Parses the query string, refusing what is not a number or out of range.
    pub fn parse(query: Option<&str>) -> Result<DecisionsQuery, ApiError> {
        let mut q = DecisionsQuery {
            limit: DEFAULT_PAGE,
            ..DecisionsQuery::default()
        };
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let number = |what: &str| {
                v.parse::<u64>().map_err(|_| {
                    ApiError::bad_request(format!(
                        "decision records: {what} must be a non-negative integer, got {v:?}"
                    ))
                })
            };
            match &*k {
                "since" => q.since = Some(number("since")?),
                "limit" => {
                    let n = number("limit")?;
                    if n == 0 || n > MAX_PAGE as u64 {
                        return Err(ApiError::bad_request(format!(
                            "decision records: limit must be between 1 and {MAX_PAGE}, got {n}"
                        )));
                    }
                    q.limit = n as usize;
                }
                "timeoutSeconds" => {
                    q.wait = Duration::from_secs(number("timeoutSeconds")?).min(MAX_WAIT)
                }
                "namespace" => q.namespace = v.into_owned(),
                _ => {}
            }
        }
        Ok(q)
    }
}

/// An answer to a `GET` of [`DECISIONS_PATH`].
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionsPage {
    /// The records, oldest first.
    pub records: Vec<DecisionRecord>,
    /// The cursor to ask `since` next: the number after the last record looked at.
    pub next: u64,
    /// Records after the asked cursor that were dropped from the server's ring before this
    /// read (the reader fell further behind than [`DECISIONS_CAPACITY`]).
    #[serde(skip_serializing_if = "is_zero")]
    pub skipped: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Decisions {
    /// The page `q` asks for, from what is held now (waiting is the caller's).
    fn page(&self, q: &DecisionsQuery) -> DecisionsPage {
        let matches = |d: &Held| q.namespace.is_empty() || d.record.object.namespace == q.namespace;
        let Some(since) = q.since else {
            // The newest `limit` records, in order.
            let mut records: Vec<DecisionRecord> = self
                .records
                .iter()
                .rev()
                .filter(|d| matches(d))
                .take(q.limit)
                .map(Held::record)
                .collect();
            records.reverse();
            return DecisionsPage {
                records,
                next: self.end(),
                skipped: 0,
            };
        };
        let skipped = self.first_seq.saturating_sub(since);
        // A cursor beyond the end (from before a restart, say) reads from the end.
        let start = since.clamp(self.first_seq, self.end());
        let mut records = Vec::new();
        let mut next = start;
        for d in self.records.iter().skip((start - self.first_seq) as usize) {
            if records.len() == q.limit {
                break;
            }
            next += 1;
            if matches(d) {
                records.push(d.record());
            }
        }
        DecisionsPage {
            records,
            next,
            skipped,
        }
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        // `to_str` accepts visible ASCII only, so any byte is a character boundary.
        .map(|v| v[..v.len().min(256)].to_string())
}

fn cut(s: &mut String) {
    if s.len() > MAX_TEXT {
        let mut end = MAX_TEXT;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// Whether a text of `d` is longer than [`MAX_TEXT`].
fn too_long(d: &DecisionRecord) -> bool {
    let long = |s: &String| s.len() > MAX_TEXT;
    d.observed.iter().chain([&d.result]).any(long)
        || d.actions.iter().any(|a| long(&a.action) || long(&a.rule))
}

impl Trail {
    /// Runs the request `fut` (a write by `user` with `method`, naming `subresource`) and
    /// keeps a record of each store write it made.
    pub(crate) async fn record<F: Future>(
        &self,
        user: &str,
        method: &Method,
        subresource: Option<&str>,
        headers: &HeaderMap,
        fut: F,
    ) -> F::Output {
        if !self.on {
            return fut.await;
        }
        let verb = match *method {
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => return fut.await,
        };
        let (out, noted) = NOTED
            .scope(RefCell::new(Vec::new()), async {
                let out = fut.await;
                (out, NOTED.with(|n| n.take()))
            })
            .await;
        if noted.is_empty() {
            return out;
        }
        let time_micros = setpoint_api::trail::now_micros();
        let decision_id = header(headers, DECISION_ID_HEADER);
        let controller = header(headers, CONTROLLER_HEADER);
        let mut writes = self.writes.lock();
        for n in noted {
            if writes.len() >= WRITES_CAPACITY {
                writes.pop_front();
            }
            writes.push_back(WriteRecord {
                time_micros,
                user: user.to_string(),
                verb: verb.into(),
                object: ObjectRef::new(&n.kind, &n.namespace, &n.name),
                group: n.group,
                resource: n.resource,
                subresource: subresource.unwrap_or_default().to_string(),
                uid: n.uid,
                resource_version: n.revision.to_string(),
                removed: n.removed,
                decision_id: decision_id.clone(),
                controller: controller.clone(),
            });
        }
        out
    }

    /// Keeps pushed decision records, stamped with the user that reported them.
    fn push_decisions(&self, reporter: &str, records: Vec<Arc<DecisionRecord>>) {
        self.keep_decisions(reporter, records);
        self.arrived.notify_waiters();
    }

    fn keep_decisions(&self, reporter: &str, records: Vec<Arc<DecisionRecord>>) {
        let reporter: Arc<str> = reporter.into();
        let mut decisions = self.decisions.lock();
        for mut d in records {
            // Copied only to be cut: most records are kept as pushed.
            if too_long(&d) {
                let d = Arc::make_mut(&mut d);
                for s in d.observed.iter_mut().chain([&mut d.result]) {
                    cut(s);
                }
                for a in &mut d.actions {
                    cut(&mut a.action);
                    cut(&mut a.rule);
                }
            }
            let d = Held {
                record: d,
                reporter: reporter.clone(),
            };
            if decisions.records.len() >= DECISIONS_CAPACITY {
                decisions.records.pop_front();
                decisions.first_seq += 1;
            }
            decisions.records.push_back(d);
        }
    }

    /// The decision records `q` asks for; with a cursor and a wait, held until one arrives
    /// or the wait is over.
    pub async fn decisions(&self, q: &DecisionsQuery) -> DecisionsPage {
        let deadline = tokio::time::Instant::now() + q.wait;
        let mut q = q.clone();
        let mut skipped = 0;
        loop {
            // Registered before looking, so a push between the look and the wait wakes it.
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let mut page = self.decisions.lock().page(&q);
            skipped += page.skipped;
            page.skipped = skipped;
            let waiting = q.since.is_some() && tokio::time::Instant::now() < deadline;
            if !page.records.is_empty() || !waiting {
                return page;
            }
            // Records of other namespaces moved the cursor on.
            q.since = Some(page.next);
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                let mut page = self.decisions.lock().page(&q);
                page.skipped += skipped;
                return page;
            }
        }
    }

    /// The causal chain of `object`.
    pub fn explain(&self, object: &ObjectRef) -> setpoint_api::trail::Explanation {
        // Copies, so that writes go on while the chain is built.
        let writes: Vec<WriteRecord> = self.writes.lock().iter().cloned().collect();
        let decisions: Vec<DecisionRecord> = self
            .decisions
            .lock()
            .records
            .iter()
            .map(Held::record)
            .collect();
        setpoint_api::trail::explain(&writes, &decisions, object, WHY_DEPTH)
    }

    /// Writes and decision records held.
    pub fn len(&self) -> (usize, usize) {
        (
            self.writes.lock().len(),
            self.decisions.lock().records.len(),
        )
    }

    /// Whether the trail holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }
}

/// The kind a `why` request's `type` names: a kind, plural, singular or short name of a
/// served resource (`pod`, `pods`, `po`, `Pod`, `deploy`, a custom resource's names), and
/// whether it is namespaced.
fn kind_of(server: &ApiServer, t: &str) -> Option<(String, bool)> {
    let t = t.to_ascii_lowercase();
    // `deployment.apps`: the group narrows the choice.
    let (name, group) = t.split_once('.').unwrap_or((&t, ""));
    let registry = server.registry();
    registry
        .all()
        .iter()
        .filter(|r| group.is_empty() || r.group == group)
        .find(|r| {
            r.kind.eq_ignore_ascii_case(name)
                || r.plural == name
                || r.singular == name
                || r.short_names.iter().any(|s| s == name)
        })
        .map(|r| (r.kind.clone(), r.namespaced))
}

/// Keeps the records `user` pushed, if not too many.
fn accept(
    server: &ApiServer,
    user: &str,
    records: Vec<Arc<DecisionRecord>>,
) -> Result<(StatusCode, Value), ApiError> {
    if records.len() > MAX_PUSH {
        return Err(ApiError::bad_request(format!(
            "decision records: {} in one request, at most {MAX_PUSH}",
            records.len()
        )));
    }
    let n = records.len();
    if server.trail.on {
        server.trail.push_decisions(user, records);
    }
    Ok((StatusCode::OK, serde_json::json!({ "accepted": n })))
}

/// Serves a push of [`DECISIONS_PATH`] (already authorized) from a component in this
/// process, whose records came as they are ([`LocalPush`]) instead of a JSON body.
pub(crate) fn push_local(
    server: &ApiServer,
    method: &Method,
    user: &str,
    local: LocalPush,
) -> Result<(StatusCode, Value), ApiError> {
    if *method != Method::POST {
        return Err(ApiError::method_not_allowed());
    }
    accept(server, user, local.0)
}

/// The answer to a read while records are off.
fn off(what: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{what}: decision records and the write trail are off ({}=off)",
        setpoint_api::trail::ENABLE_ENV
    ))
}

/// Serves [`DECISIONS_PATH`] and [`WHY_PATH`] (already authorized as non-resource URLs);
/// `None` for other paths.
pub(crate) async fn serve(
    server: &ApiServer,
    method: &Method,
    path: &str,
    query: Option<&str>,
    user: &str,
    body: Bytes,
) -> Option<Result<(StatusCode, Value), ApiError>> {
    if path == DECISIONS_PATH {
        if *method == Method::GET {
            if !server.trail.on {
                return Some(Err(off("decision records")));
            }
            let q = match DecisionsQuery::parse(query) {
                Ok(q) => q,
                Err(e) => return Some(Err(e)),
            };
            let page = server.trail.decisions(&q).await;
            return Some(
                serde_json::to_value(page)
                    .map(|v| (StatusCode::OK, v))
                    .map_err(|e| ApiError::internal(e.to_string())),
            );
        }
        if *method != Method::POST {
            return Some(Err(ApiError::method_not_allowed()));
        }
        let records = match serde_json::from_slice::<Vec<DecisionRecord>>(&body) {
            Ok(r) => r.into_iter().map(Arc::new).collect(),
            Err(e) => return Some(Err(ApiError::bad_request(format!("decision records: {e}")))),
        };
        return Some(accept(server, user, records));
    }
    if path == WHY_PATH {
        if *method != Method::GET {
            return Some(Err(ApiError::method_not_allowed()));
        }
        let q: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .into_owned()
            .collect();
        let get = |k: &str| {
            q.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
                .unwrap_or("")
        };
        let (t, name) = (get("type"), get("name"));
        if t.is_empty() || name.is_empty() {
            return Some(Err(ApiError::bad_request(
                "why: the type and name parameters are required",
            )));
        }
        let Some((kind, namespaced)) = kind_of(server, t) else {
            return Some(Err(ApiError::bad_request(format!(
                "why: the server doesn't have a resource type \"{t}\""
            ))));
        };
        if !server.trail.on {
            return Some(Err(off("why")));
        }
        let namespace = if namespaced { get("namespace") } else { "" };
        let object = ObjectRef::new(&kind, namespace, name);
        let e = server.trail.explain(&object);
        return Some(
            serde_json::to_value(e)
                .map(|v| (StatusCode::OK, v))
                .map_err(|e| ApiError::internal(e.to_string())),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, namespace: &str) -> Arc<DecisionRecord> {
        Arc::new(DecisionRecord {
            id: id.into(),
            object: ObjectRef::new("Pod", namespace, id),
            ..DecisionRecord::default()
        })
    }

    fn ids(page: &DecisionsPage) -> Vec<&str> {
        page.records.iter().map(|r| r.id.as_str()).collect()
    }

    fn query(q: &str) -> DecisionsQuery {
        DecisionsQuery::parse(Some(q)).unwrap()
    }

    #[test]
    fn pages_follow_the_cursor_and_filter_by_namespace() {
        let trail = Trail::default();
        trail.keep_decisions(
            "u",
            vec![record("a", "x"), record("b", "y"), record("c", "x")],
        );
        let d = trail.decisions.lock();
        let newest = d.page(&query("limit=2"));
        assert_eq!((ids(&newest), newest.next), (vec!["b", "c"], 3));
        let first = d.page(&query("since=0&limit=2"));
        assert_eq!((ids(&first), first.next), (vec!["a", "b"], 2));
        let rest = d.page(&query(&format!("since={}", first.next)));
        assert_eq!((ids(&rest), rest.next), (vec!["c"], 3));
        assert_eq!(rest.records[0].reporter, "u");
        let x = d.page(&query("since=0&namespace=x"));
        assert_eq!((ids(&x), x.next), (vec!["a", "c"], 3));
        // A cursor from the future reads from the end.
        assert_eq!(d.page(&query("since=99")).next, 3);
    }

    #[test]
    fn long_texts_are_cut_and_short_records_kept_as_pushed() {
        let trail = Trail::default();
        let short = record("short", "x");
        let mut long = (*record("long", "x")).clone();
        long.observed.push("é".repeat(MAX_TEXT));
        trail.keep_decisions("u", vec![short.clone(), Arc::new(long)]);
        let d = trail.decisions.lock();
        assert!(Arc::ptr_eq(&d.records[0].record, &short));
        let cut = d.records[1].record();
        assert!(cut.observed[0].len() <= MAX_TEXT && cut.observed[0].starts_with('é'));
    }

    #[test]
    fn a_reader_left_behind_is_told_what_it_missed() {
        let trail = Trail::default();
        let many: Vec<_> = (0..DECISIONS_CAPACITY + 3)
            .map(|i| record(&i.to_string(), "x"))
            .collect();
        trail.keep_decisions("u", many);
        let d = trail.decisions.lock();
        let page = d.page(&query("since=1&limit=1"));
        assert_eq!(page.skipped, 2);
        assert_eq!(ids(&page), vec!["3"]);
        assert_eq!(page.next, 4);
    }

    #[test]
    fn bad_parameters_are_refused() {
        for q in ["since=-1", "limit=0", "limit=1001", "timeoutSeconds=soon"] {
            let e = DecisionsQuery::parse(Some(q)).unwrap_err();
            assert_eq!(e.code, 400, "{q}");
        }
        assert_eq!(query("timeoutSeconds=999").wait, MAX_WAIT);
    }

    #[tokio::test]
    async fn a_waiting_reader_gets_the_next_record_of_its_namespace() {
        let trail = std::sync::Arc::new(Trail::default());
        trail.keep_decisions("u", vec![record("old", "x")]);
        let reader = {
            let trail = trail.clone();
            tokio::spawn(async move {
                trail
                    .decisions(&query("since=1&namespace=x&timeoutSeconds=20"))
                    .await
            })
        };
        // Another namespace's record does not end the wait; this namespace's does.
        tokio::task::yield_now().await;
        trail.push_decisions("u", vec![record("other", "y")]);
        tokio::task::yield_now().await;
        trail.push_decisions("u", vec![record("new", "x")]);
        let page = tokio::time::timeout(Duration::from_secs(10), reader)
            .await
            .expect("answered once the record arrived")
            .unwrap();
        assert_eq!((ids(&page), page.next), (vec!["new"], 3));
    }
}
