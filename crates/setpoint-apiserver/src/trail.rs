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
//! components push through the same path). [`WHY_PATH`] answers with the causal chain of
//! one object, built by [`setpoint_api::trail::explain`]. Both rings are bounded
//! ([`WRITES_CAPACITY`], [`DECISIONS_CAPACITY`]; `docs/limits.md`).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use parking_lot::Mutex;
use serde_json::Value;
use setpoint_api::trail::{
    DecisionRecord, ObjectRef, WriteRecord, CONTROLLER_HEADER, DECISIONS_PATH, DECISION_ID_HEADER,
    WHY_PATH,
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
    decisions: Mutex<VecDeque<DecisionRecord>>,
}

impl Default for Trail {
    fn default() -> Self {
        Trail {
            on: setpoint_api::trail::enabled(),
            writes: Mutex::new(VecDeque::new()),
            decisions: Mutex::new(VecDeque::new()),
        }
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(|v| v.chars().take(256).collect())
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
    fn push_decisions(&self, reporter: &str, records: Vec<DecisionRecord>) {
        let mut decisions = self.decisions.lock();
        for mut d in records {
            d.reporter = reporter.to_string();
            for s in d.observed.iter_mut().chain([&mut d.result]) {
                cut(s);
            }
            for a in &mut d.actions {
                cut(&mut a.action);
                cut(&mut a.rule);
            }
            if decisions.len() >= DECISIONS_CAPACITY {
                decisions.pop_front();
            }
            decisions.push_back(d);
        }
    }

    /// The causal chain of `object`.
    pub fn explain(&self, object: &ObjectRef) -> setpoint_api::trail::Explanation {
        // Copies, so that writes go on while the chain is built.
        let writes: Vec<WriteRecord> = self.writes.lock().iter().cloned().collect();
        let decisions: Vec<DecisionRecord> = self.decisions.lock().iter().cloned().collect();
        setpoint_api::trail::explain(&writes, &decisions, object, WHY_DEPTH)
    }

    /// Writes and decision records held.
    pub fn len(&self) -> (usize, usize) {
        (self.writes.lock().len(), self.decisions.lock().len())
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
        if *method != Method::POST {
            return Some(Err(ApiError::method_not_allowed()));
        }
        let records: Vec<DecisionRecord> = match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return Some(Err(ApiError::bad_request(format!("decision records: {e}")))),
        };
        if records.len() > MAX_PUSH {
            return Some(Err(ApiError::bad_request(format!(
                "decision records: {} in one request, at most {MAX_PUSH}",
                records.len()
            ))));
        }
        let n = records.len();
        if server.trail.on {
            server.trail.push_decisions(user, records);
        }
        return Some(Ok((StatusCode::OK, serde_json::json!({ "accepted": n }))));
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
            return Some(Err(ApiError::bad_request(format!(
                "why: decision records and the write trail are off ({}=off)",
                setpoint_api::trail::ENABLE_ENV
            ))));
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
