//! The write trail and decision records behind `setpoint why`: what a reconcile saw and did
//! ([`DecisionRecord`]), which API write it made ([`WriteRecord`], linked by the decision id
//! the runtime's client sends in [`DECISION_ID_HEADER`]), and the pure chain builder
//! ([`explain`]) that walks from an object's writes to the decisions that made them and on to
//! the writes that woke those decisions.
//!
//! The runtime records decisions, the API server records writes and collects the decisions
//! components push to [`DECISIONS_PATH`]; [`WHY_PATH`] answers with an [`Explanation`], which
//! [`render`] prints.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// The request header a write made during a reconcile carries: the decision's id.
pub const DECISION_ID_HEADER: &str = "Setpoint-Decision-Id";
/// The request header naming the controller whose decision made the write.
pub const CONTROLLER_HEADER: &str = "Setpoint-Controller";
/// Components push their decision records here (`POST`, a JSON array of [`DecisionRecord`]).
pub const DECISIONS_PATH: &str = "/debug/setpoint/decisions";
/// `GET ?type=<kind, plural or short name>&namespace=<ns>&name=<name>` answers with an
/// [`Explanation`] of that object.
pub const WHY_PATH: &str = "/debug/setpoint/why";
/// Decision records pushed to [`DECISIONS_PATH`] by a component in the API server's own
/// process, carried as a request extension in place of the JSON body: the in-process
/// transport hands the request itself to the server, so encoding the records to JSON and
/// decoding them again would be pure cost (it was most of what records cost on the density
/// benchmark). Over HTTPS, extensions do not travel: the records go as JSON.
#[derive(Clone, Debug, Default)]
pub struct LocalPush(pub Vec<std::sync::Arc<DecisionRecord>>);

/// Set to `off` (or `0`, `false`) to turn decision records and the write trail off, in every
/// component of the process (for measuring what they cost).
pub const ENABLE_ENV: &str = "SETPOINT_DECISION_RECORDS";

/// Whether decision records and the write trail are on: [`ENABLE_ENV`], read once.
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var(ENABLE_ENV).as_deref().map(str::trim),
            Ok("off" | "0" | "false")
        )
    })
}

/// Microseconds since the Unix epoch, the trail's clock.
pub fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

/// An object named by kind, namespace (empty when cluster-scoped) and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// The kind, e.g. `Pod`.
    pub kind: String,
    /// The namespace; empty for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ObjectRef {
    /// An object reference; `namespace` may be empty.
    pub fn new(kind: &str, namespace: &str, name: &str) -> Self {
        ObjectRef {
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Whether both name the same object (kinds compared without case).
    pub fn same(&self, other: &ObjectRef) -> bool {
        self.name == other.name
            && self.namespace == other.namespace
            && self.kind.eq_ignore_ascii_case(&other.kind)
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = self.kind.to_ascii_lowercase();
        if self.namespace.is_empty() {
            write!(f, "{kind} {}", self.name)
        } else {
            write!(f, "{kind} {}/{}", self.namespace, self.name)
        }
    }
}

/// What woke a reconcile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Trigger {
    /// `ADDED`, `MODIFIED` or `DELETED` for a watch event; `resync`, `requeue` (a timed
    /// re-check the reconciler asked for), `backoff` (a retry after a failure) or `queued`
    /// (a key added from outside the controller's informers) otherwise.
    pub reason: String,
    /// The object of the watch event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<ObjectRef>,
    /// Its `resourceVersion` in the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

impl Trigger {
    /// A trigger without an object (resync, requeue, backoff).
    pub fn reason(reason: &str) -> Self {
        Trigger {
            reason: reason.into(),
            ..Trigger::default()
        }
    }

    /// A watch event (or another reason) about one version of one object.
    pub fn event(reason: &str, object: ObjectRef, resource_version: Option<String>) -> Self {
        Trigger {
            reason: reason.into(),
            object: Some(object),
            resource_version,
        }
    }
}

/// One action a reconcile took and the rule that chose it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActionRecord {
    /// What it did, e.g. `create 1 pod`.
    pub action: String,
    /// Why, e.g. `fewer active pods than desired`.
    pub rule: String,
}

/// One reconcile: what woke it, what it saw, what it did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionRecord {
    /// The decision id its writes carry.
    pub id: String,
    /// The controller (e.g. `replicaset`, `scheduler`, `node-agent`).
    pub controller: String,
    /// The object reconciled (its key, and its kind when the controller knows it).
    pub object: ObjectRef,
    /// What woke it; coalesced wake-ups are all listed (up to a few).
    #[serde(default)]
    pub triggers: Vec<Trigger>,
    /// The reconciler's summary of what it observed.
    #[serde(default)]
    pub observed: Vec<String>,
    /// What it did and why.
    #[serde(default)]
    pub actions: Vec<ActionRecord>,
    /// Start and end, microseconds since the epoch.
    pub start_micros: i64,
    /// End, microseconds since the epoch.
    pub end_micros: i64,
    /// `success`, `requeue_after`, `error: <message>`, `panic`, `timeout` or `cancelled`.
    pub result: String,
    /// The user that reported it to the API server (set by the server).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reporter: String,
}

/// One successful write to the API, as the API server saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteRecord {
    /// When the write was answered, microseconds since the epoch.
    pub time_micros: i64,
    /// The (impersonated, if any) user.
    pub user: String,
    /// `create`, `update`, `patch` or `delete`.
    pub verb: String,
    /// The object written.
    pub object: ObjectRef,
    /// The API group of its resource (empty for core).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// The resource's plural.
    pub resource: String,
    /// The subresource the request named (`status`, `binding`, ...), if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subresource: String,
    /// The object's uid, when known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The `resourceVersion` the write produced (the store revision of a removal).
    pub resource_version: String,
    /// Whether the write removed the object from storage.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
    /// The decision id of the reconcile that made it, from [`DECISION_ID_HEADER`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_id: Option<String>,
    /// The controller that made it, from [`CONTROLLER_HEADER`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<String>,
}

/// One write to an object and why it happened.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cause {
    /// The write.
    pub write: WriteRecord,
    /// The decision that made it, when the write named one and its record reached the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<DecisionRecord>,
    /// The writes that produced the decision's triggers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub because: Vec<Cause>,
    /// For a write that created the object, how the object the decision was about (its
    /// owner, usually) came to be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Box<Cause>>,
    /// An earlier write of the object explained, listed (and explained) on its own: not
    /// expanded again here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub listed: bool,
}

/// The causal chain of one object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The object explained.
    pub object: ObjectRef,
    /// Its writes still in the trail, oldest first, each with its causes.
    pub writes: Vec<Cause>,
    /// Writes to it older than the trail holds were dropped from the server's buffer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub older_dropped: bool,
}

/// At most this many writes of the object itself are explained (the newest).
pub const MAX_WRITES: usize = 20;

/// The revision a `resourceVersion` names (0 if it is not a number).
fn revision(rv: &str) -> u64 {
    rv.parse().unwrap_or(0)
}

/// The write that produced `object` at `rv`: the write of that exact version, else the
/// latest write to the object at or before it (a version the trail saw only part of).
fn write_of<'a>(writes: &'a [WriteRecord], object: &ObjectRef, rv: u64) -> Option<&'a WriteRecord> {
    let mut best: Option<&WriteRecord> = None;
    for w in writes.iter().filter(|w| w.object.same(object)) {
        let r = revision(&w.resource_version);
        if r == rv {
            return Some(w);
        }
        if r < rv && best.is_none_or(|b| revision(&b.resource_version) < r) {
            best = Some(w);
        }
    }
    best
}

/// What [`cause`] walks: the trail and the object explained.
struct Walk<'a> {
    writes: &'a [WriteRecord],
    decisions: &'a [DecisionRecord],
    target: &'a ObjectRef,
}

fn cause(walk: &Walk<'_>, write: &WriteRecord, depth: usize, top: bool) -> Cause {
    let (writes, decisions) = (walk.writes, walk.decisions);
    if !top && write.object.same(walk.target) {
        return Cause {
            write: write.clone(),
            listed: true,
            ..Cause::default()
        };
    }
    let decision = write
        .decision_id
        .as_ref()
        .and_then(|id| decisions.iter().find(|d| &d.id == id))
        .cloned();
    let mut because = Vec::new();
    let mut owner = None;
    if let (Some(d), true) = (&decision, depth > 0) {
        let this = revision(&write.resource_version);
        for t in &d.triggers {
            let (Some(obj), Some(rv)) = (&t.object, &t.resource_version) else {
                continue;
            };
            let Some(w) = write_of(writes, obj, revision(rv)) else {
                continue;
            };
            // A decision is woken by an earlier write, never by the one it made.
            if revision(&w.resource_version) >= this && this != 0 {
                continue;
            }
            if because.iter().any(|c: &Cause| c.write == *w) {
                continue;
            }
            because.push(cause(walk, w, depth - 1, false));
        }
        let created = write.verb == "create" && write.subresource.is_empty();
        if created && !d.object.same(&write.object) && !d.object.name.is_empty() {
            owner = writes
                .iter()
                .find(|w| {
                    w.object.same(&d.object) && w.verb == "create" && w.subresource.is_empty()
                })
                // Already told as a cause: not twice.
                .filter(|w| !because.iter().any(|c| c.write == **w))
                .map(|w| Box::new(cause(walk, w, depth - 1, false)));
        }
    }
    Cause {
        write: write.clone(),
        decision,
        because,
        owner,
        listed: false,
    }
}

/// Explains `object` from the trail: each of its writes (the newest [`MAX_WRITES`]), the
/// decision that made it, the writes that woke that decision, and for its creation the
/// creation of the object the decision was about, `depth` steps back.
pub fn explain(
    writes: &[WriteRecord],
    decisions: &[DecisionRecord],
    object: &ObjectRef,
    depth: usize,
) -> Explanation {
    let own: Vec<&WriteRecord> = writes.iter().filter(|w| w.object.same(object)).collect();
    let skip = own.len().saturating_sub(MAX_WRITES);
    // Without its creation in the trail, older writes may have been dropped.
    let older_dropped = skip > 0
        || own
            .first()
            .is_some_and(|w| !(w.verb == "create" && w.subresource.is_empty()));
    let walk = Walk {
        writes,
        decisions,
        target: object,
    };
    Explanation {
        object: object.clone(),
        writes: own[skip..]
            .iter()
            .map(|w| cause(&walk, w, depth, true))
            .collect(),
        older_dropped,
    }
}

/// The past tense of a write: `created`, `status updated`, `binding created`.
fn done(w: &WriteRecord) -> String {
    let verb = match w.verb.as_str() {
        "create" => "created",
        "update" => "updated",
        "patch" => "patched",
        "delete" if w.removed => "removed",
        "delete" => "deleted",
        other => other,
    };
    if w.subresource.is_empty() {
        verb.to_string()
    } else {
        format!("{} {verb}", w.subresource)
    }
}

/// `+3.2ms`, `-0.412s`: `t` relative to `base`.
fn relative(t: i64, base: i64) -> String {
    let d = t - base;
    let sign = if d < 0 { "-" } else { "+" };
    let a = d.unsigned_abs();
    if a < 1_000_000 {
        format!("T{sign}{:.1}ms", a as f64 / 1000.0)
    } else {
        format!("T{sign}{:.3}s", a as f64 / 1_000_000.0)
    }
}

/// `16:50:01.123456` UTC.
fn clock(t: i64) -> String {
    chrono::DateTime::from_timestamp_micros(t)
        .map(|d| d.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string())
        .unwrap_or_else(|| t.to_string())
}

fn render_cause(out: &mut String, c: &Cause, base: i64, indent: usize, subject: bool) {
    let pad = "  ".repeat(indent);
    let w = &c.write;
    let who = match (&w.controller, &c.decision) {
        (_, Some(d)) => format!("the {} controller (user {})", d.controller, w.user),
        (Some(ctl), None) => format!("the {ctl} controller (user {})", w.user),
        (None, None) => format!("user {}", w.user),
    };
    let what = if subject {
        done(w)
    } else {
        format!("{} {}", w.object, done(w))
    };
    if c.listed {
        let _ = writeln!(
            out,
            "{pad}its own write above: {} at {} (resourceVersion {})",
            done(w),
            relative(w.time_micros, base),
            w.resource_version
        );
        return;
    }
    let _ = writeln!(
        out,
        "{pad}{what} by {who} at {} (resourceVersion {})",
        relative(w.time_micros, base),
        w.resource_version
    );
    let pad2 = "  ".repeat(indent + 1);
    match (&c.decision, &w.decision_id) {
        (Some(d), _) => {
            let _ = writeln!(
                out,
                "{pad2}decision {} reconciling {} ({}, took {:.1}ms)",
                d.id,
                d.object,
                d.result,
                (d.end_micros - d.start_micros) as f64 / 1000.0
            );
            for o in &d.observed {
                let _ = writeln!(out, "{pad2}observed: {o}");
            }
            for a in &d.actions {
                let _ = writeln!(out, "{pad2}action: {} (rule: {})", a.action, a.rule);
            }
            for t in &d.triggers {
                match (&t.object, &t.resource_version) {
                    (Some(o), Some(rv)) => {
                        let _ = writeln!(
                            out,
                            "{pad2}woken by: {} {o} (resourceVersion {rv})",
                            t.reason
                        );
                    }
                    (Some(o), None) => {
                        let _ = writeln!(out, "{pad2}woken by: {} {o}", t.reason);
                    }
                    _ => {
                        let _ = writeln!(out, "{pad2}woken by: {}", t.reason);
                    }
                }
            }
        }
        (None, Some(id)) => {
            let _ = writeln!(
                out,
                "{pad2}decision {id}: its record has not reached the API server (or was dropped)"
            );
        }
        (None, None) => {}
    }
    for b in &c.because {
        let _ = write!(out, "{pad2}because: ");
        let mut inner = String::new();
        render_cause(&mut inner, b, base, indent + 1, false);
        out.push_str(inner.trim_start());
    }
    if let Some(o) = &c.owner {
        let _ = write!(out, "{pad2}owner: ");
        let mut inner = String::new();
        render_cause(&mut inner, o, base, indent + 1, false);
        out.push_str(inner.trim_start());
    }
}

/// Prints an explanation: times are relative to the object's first write in the trail (T).
pub fn render(e: &Explanation) -> String {
    let mut out = String::new();
    let Some(first) = e.writes.first() else {
        let _ = writeln!(
            out,
            "{}: no writes in the API server's trail (it keeps the most recent writes only; see docs/why.md)",
            e.object
        );
        return out;
    };
    let base = first.write.time_micros;
    let _ = writeln!(out, "{} (T = {})", e.object, clock(base));
    if e.older_dropped {
        let _ = writeln!(out, "  (older writes are no longer in the trail)");
    }
    for c in &e.writes {
        render_cause(&mut out, c, base, 1, true);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> ObjectRef {
        ObjectRef::new("Pod", "default", name)
    }

    fn write(t: i64, user: &str, verb: &str, obj: ObjectRef, rv: u64) -> WriteRecord {
        WriteRecord {
            time_micros: t,
            user: user.into(),
            verb: verb.into(),
            object: obj,
            resource: "pods".into(),
            resource_version: rv.to_string(),
            ..WriteRecord::default()
        }
    }

    fn by(mut w: WriteRecord, id: &str, controller: &str) -> WriteRecord {
        w.decision_id = Some(id.into());
        w.controller = Some(controller.into());
        w
    }

    fn decision(
        id: &str,
        controller: &str,
        obj: ObjectRef,
        triggers: Vec<Trigger>,
    ) -> DecisionRecord {
        DecisionRecord {
            id: id.into(),
            controller: controller.into(),
            object: obj,
            triggers,
            result: "success".into(),
            ..DecisionRecord::default()
        }
    }

    /// The acceptance story: alice deletes a pod, the ReplicaSet controller replaces it, the
    /// scheduler binds the replacement.
    fn story() -> (Vec<WriteRecord>, Vec<DecisionRecord>) {
        let rs = ObjectRef::new("ReplicaSet", "default", "web-7d9");
        let deploy = ObjectRef::new("Deployment", "default", "web");
        let writes = vec![
            write(1_000, "admin", "create", deploy.clone(), 10),
            by(
                write(
                    2_000,
                    "system:kube-controller-manager",
                    "create",
                    rs.clone(),
                    11,
                ),
                "d1",
                "deployment",
            ),
            by(
                write(
                    3_000,
                    "system:kube-controller-manager",
                    "create",
                    pod("web-7d9-x"),
                    12,
                ),
                "r1",
                "replicaset",
            ),
            write(500_000, "alice", "delete", pod("web-7d9-x"), 20),
            by(
                write(
                    900_000,
                    "system:kube-controller-manager",
                    "create",
                    pod("web-7d9-y"),
                    21,
                ),
                "r2",
                "replicaset",
            ),
            WriteRecord {
                subresource: "binding".into(),
                ..by(
                    write(
                        903_000,
                        "system:kube-scheduler",
                        "create",
                        pod("web-7d9-y"),
                        22,
                    ),
                    "s1",
                    "scheduler",
                )
            },
        ];
        let decisions = vec![
            decision(
                "d1",
                "deployment",
                deploy.clone(),
                vec![Trigger::event("ADDED", deploy.clone(), Some("10".into()))],
            ),
            decision(
                "r1",
                "replicaset",
                rs.clone(),
                vec![Trigger::event("ADDED", rs.clone(), Some("11".into()))],
            ),
            DecisionRecord {
                observed: vec!["3 desired, 2 active, 1 terminating".into()],
                actions: vec![ActionRecord {
                    action: "create 1 pod".into(),
                    rule: "fewer active pods than desired".into(),
                }],
                ..decision(
                    "r2",
                    "replicaset",
                    rs.clone(),
                    vec![Trigger::event(
                        "MODIFIED",
                        pod("web-7d9-x"),
                        Some("20".into()),
                    )],
                )
            },
            DecisionRecord {
                actions: vec![ActionRecord {
                    action: "bind to node n2".into(),
                    rule: "highest score among feasible nodes".into(),
                }],
                ..decision(
                    "s1",
                    "scheduler",
                    pod("web-7d9-y"),
                    vec![Trigger::event(
                        "queued",
                        pod("web-7d9-y"),
                        Some("21".into()),
                    )],
                )
            },
        ];
        (writes, decisions)
    }

    #[test]
    fn a_replacement_pod_leads_back_to_the_deletion_that_caused_it() {
        let (writes, decisions) = story();
        let e = explain(&writes, &decisions, &pod("web-7d9-y"), 4);
        assert_eq!(e.writes.len(), 2);
        assert!(!e.older_dropped);
        let created = &e.writes[0];
        assert_eq!(created.decision.as_ref().unwrap().id, "r2");
        assert_eq!(created.because.len(), 1);
        assert_eq!(created.because[0].write.user, "alice");
        assert_eq!(created.because[0].write.verb, "delete");
        // The owner: the ReplicaSet, created by the deployment controller for Deployment web.
        let owner = created.owner.as_ref().unwrap();
        assert_eq!(owner.write.object.kind, "ReplicaSet");
        assert_eq!(owner.decision.as_ref().unwrap().controller, "deployment");
        assert_eq!(owner.because[0].write.user, "admin");
        // The binding: the scheduler's decision, woken by the pod's creation, which is not
        // repeated as its own cause (it is the object's own earlier write).
        let bound = &e.writes[1];
        assert_eq!(bound.decision.as_ref().unwrap().controller, "scheduler");
        assert_eq!(bound.because[0].write.decision_id.as_deref(), Some("r2"));
        assert!(bound.because[0].listed);
        assert!(bound.because[0].decision.is_none());

        let text = render(&e);
        assert!(
            text.contains("deleted by user alice at T-400.0ms"),
            "{text}"
        );
        assert!(
            text.contains("observed: 3 desired, 2 active, 1 terminating"),
            "{text}"
        );
        assert!(
            text.contains("binding created by the scheduler controller"),
            "{text}"
        );
        assert!(text.contains("action: bind to node n2"), "{text}");
        assert!(
            text.contains("because: its own write above: created at T+0.0ms"),
            "{text}"
        );
    }

    #[test]
    fn depth_bounds_the_walk() {
        let (writes, decisions) = story();
        let e = explain(&writes, &decisions, &pod("web-7d9-y"), 0);
        assert!(e.writes[0].decision.is_some());
        assert!(e.writes[0].because.is_empty());
        assert!(e.writes[0].owner.is_none());
    }

    #[test]
    fn a_trigger_between_recorded_versions_finds_the_write_before_it() {
        let (writes, _) = story();
        let w = write_of(&writes, &pod("web-7d9-x"), 15).unwrap();
        assert_eq!(w.resource_version, "12");
        assert!(write_of(&writes, &pod("web-7d9-x"), 5).is_none());
    }

    #[test]
    fn missing_records_are_said_to_be_missing() {
        let (writes, _) = story();
        let e = explain(&writes, &[], &pod("web-7d9-y"), 3);
        let text = render(&e);
        assert!(
            text.contains("decision r2: its record has not reached the API server"),
            "{text}"
        );
        let none = explain(&writes, &[], &pod("other"), 3);
        assert!(render(&none).contains("no writes in the API server's trail"));
        let partial = explain(&writes[3..], &[], &pod("web-7d9-x"), 3);
        assert!(partial.older_dropped);
    }

    #[test]
    fn records_round_trip_as_camel_case_json() {
        let (writes, decisions) = story();
        let v = serde_json::to_value(&writes[5]).unwrap();
        assert_eq!(v["decisionId"], "s1");
        assert_eq!(v["subresource"], "binding");
        let back: Vec<DecisionRecord> =
            serde_json::from_value(serde_json::to_value(&decisions).unwrap()).unwrap();
        assert_eq!(back, decisions);
    }
}
